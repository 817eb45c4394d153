"""cudagraph_kit: learn, measure and apply CUDA Graphs in PyTorch.

One module per idea; a helper can be copied into a project (only torch needed), with ``capture.py`` beside it
when it imports that (``train_step``, ``partial``, ``buckets``, ``ddp``; docs/ARCHITECTURE.md has the rules):
``env`` (what machine is this), ``capture`` (capture once, call with new inputs), ``train_step`` (whole
training step as one graph), ``partial`` (make_graphed_callables made safe), ``diagnose`` (find what breaks a
graph before capture, verify a graph against eager, will a graph help?), ``timing`` (medians, spread, GPU-busy
floor), ``intervals`` (where a rerun will land: prediction intervals over timing windows, and the verdict
they support), ``buckets`` (variable shapes: bucketed graphs, a planner, a memory ledger), ``ddp``
(DistributedDataParallel under graphs, per-rank step timing), ``show`` (pictures: eager vs graph on one timeline,
a graph's nodes; needs matplotlib; import it as ``from cudagraph_kit import show``).

The course (notebook results, ``reproduce``, exercises) lives apart, in ``cudagraph_kit.course``; nothing here
imports it.
"""
from .buckets import (BucketedGraphs, BucketPlan, MemoryLedger, capture_buckets, evaluate_buckets, ladder,
                      plan_buckets, pool_usage)
from .capture import (CaptureError, GraphedCallable, NoCudaError, capture, capture_stream, graph_features,
                      register_generators, shared_pool)
from .diagnose import advise, check_capturable, explain, verify
from .env import bf16_supported, describe, env_table, has_cuda
from .intervals import combine_windows, prediction_interval, ratio_across_windows, verdict
from .partial import graph_modules
from .timing import compare, gpu_time, timeit
from .train_step import GraphedTrainStep, capture_train_step

__all__ = [
    "capture", "GraphedCallable", "shared_pool", "capture_stream", "NoCudaError", "CaptureError",
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
