"""cudagraph_kit: learn, measure and apply CUDA Graphs in PyTorch.

One module per idea; each stands alone so a single file can be copied into a project:
``env`` (what machine is this), ``capture`` (capture once, call with new inputs), ``train_step`` (whole
training step as one graph), ``partial`` (make_graphed_callables made safe), ``timing`` (medians, spread,
GPU-busy floor), ``results`` (save/load a notebook's results and figures), ``exercises`` (the checks of
the notebooks' exercises).
"""
from .capture import CaptureError, GraphedCallable, NoCudaError, capture, shared_pool
from .env import bf16_supported, describe, env_table, has_cuda
from .partial import graph_modules
from .timing import compare, gpu_time, timeit
from . import exercises, results

__all__ = [
    "capture", "GraphedCallable", "shared_pool", "NoCudaError", "CaptureError",
    "has_cuda", "bf16_supported", "describe", "env_table",
    "graph_modules", "timeit", "gpu_time", "compare", "results", "exercises",
]
try:  # written alongside; re-exported when present
    from .train_step import GraphedTrainStep, capture_train_step  # noqa: F401
    __all__ += ["capture_train_step", "GraphedTrainStep"]
except ImportError:  # pragma: no cover
    pass

__version__ = "0.1.0"
