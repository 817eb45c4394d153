"""cudagraph_kit: learn, measure and apply CUDA Graphs in PyTorch.

One module per idea; a helper can be copied into a project (only torch needed), with the files it names beside it
(docs/ARCHITECTURE.md has the copy rule): ``env`` (what machine is this), ``capture`` (capture once, call with new
inputs; the kit's errors, ``explain`` and the stream rule), ``train_step`` (whole training step as one graph),
``partial`` (make_graphed_callables made safe), ``check`` (find what breaks a graph before capture), ``verify`` (a
graph against eager), ``advise`` (will a graph help?), ``timing`` (medians, spread, GPU-busy floor), ``intervals``
(where a rerun will land: prediction intervals over timing windows, and the verdict they support),
``bucket_graphs`` (variable shapes: one graph per bucket), ``bucket_plan`` (choose the buckets), ``memory`` (a
memory ledger per graph and pool), ``ddp`` (DistributedDataParallel under graphs, per-rank step timing), ``show``
(pictures: eager vs graph on one timeline, a graph's nodes; needs matplotlib; import it as
``from cudagraph_kit import show``). ``diagnose`` and ``buckets`` keep the old names of those tools for code that
imports them.

The course (notebook results, ``reproduce``, exercises) lives apart, in ``cudagraph_kit.course``; nothing here
imports it.
"""
from . import buckets, diagnose  # noqa: F401  (the old module names stay attributes of the package)
from .advise import advise
from .bucket_graphs import BucketedGraphs, capture_buckets, ladder
from .bucket_plan import BucketPlan, evaluate_buckets, plan_buckets
from .capture import (CaptureError, GraphedCallable, NoCudaError, StaleGraphError, capture, capture_stream, explain,
                      graph_features, register_generators, shared_pool)
from .check import check_capturable
from .env import bf16_supported, describe, env_table, has_cuda
from .intervals import combine_windows, prediction_interval, ratio_across_windows, verdict
from .memory import MemoryLedger, pool_usage
from .partial import graph_modules
from .timing import compare, gpu_time, timeit
from .train_step import GraphedTrainStep, capture_train_step
from .verify import verify

__all__ = [
    "capture", "GraphedCallable", "shared_pool", "capture_stream", "NoCudaError", "CaptureError", "StaleGraphError",
    "graph_features", "register_generators",
    "has_cuda", "bf16_supported", "describe", "env_table",
    "graph_modules", "timeit", "gpu_time", "compare", "prediction_interval", "verdict", "combine_windows", "ratio_across_windows",
    "check_capturable", "verify", "advise", "explain",
    "capture_buckets", "BucketedGraphs", "ladder", "plan_buckets", "BucketPlan", "evaluate_buckets",
    "MemoryLedger", "pool_usage",
    "capture_train_step", "GraphedTrainStep",
]
try:  # needs torch.distributed (absent from a few PyTorch builds)
    from .ddp import StepTimer, ddp_for_graphs, jitter_summary, setup_distributed_for_graphs  # noqa: F401
    __all__ += ["setup_distributed_for_graphs", "ddp_for_graphs", "StepTimer", "jitter_summary"]
except ImportError:  # pragma: no cover
    pass

__version__ = "0.2.0"
