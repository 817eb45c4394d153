"""cudagraph_kit: learn, measure and apply CUDA Graphs in PyTorch.

One module per idea; a helper can be copied into a project (only torch needed), with the files it names beside it
(docs/ARCHITECTURE.md has the copy rule): ``env`` (what machine is this), ``graphed`` (capture once, call with new
inputs; the kit's errors, ``explain`` and the stream rule), ``guard`` (what a graph read, checked before each replay),
``train_step`` (whole training step as one graph), ``partial`` (make_graphed_callables made safe), ``check`` (find
what breaks a graph before capture), ``verification`` (a graph against eager), ``advice`` (will a graph help?),
``timing`` (medians, spread, GPU-busy floor), ``intervals`` (where a rerun will land: prediction intervals over
timing windows, and the verdict they support), ``bucket_graphs`` (variable shapes: one graph per bucket),
``bucket_plan`` (choose the buckets), ``memory`` (a memory ledger per graph and pool), ``ddp``
(DistributedDataParallel under graphs, per-rank step timing), ``show`` (pictures: eager vs graph on one timeline, a
graph's nodes; needs matplotlib).

The package's names load on first use, so ``import cudagraph_kit`` imports neither torch nor any module of the kit
(``python -m cudagraph_kit --version`` answers at once). No module shares a name with a function, so the names you
type give the functions, and each module is importable under its own name::

    import cudagraph_kit as cgk
    g = cgk.capture(model, x)                                     # the function
    from cudagraph_kit import capture, verify, advise, capture_train_step, graph_modules, capture_buckets
    import cudagraph_kit.graphed as graphed                       # the module that holds capture

The course (notebook results, ``reproduce``, exercises) lives apart, in ``cudagraph_kit.course``; nothing here
imports it.
"""
import importlib
import importlib.util
import os

# public name -> the module that defines it, imported on first use (PEP 562)
_EXPORTS = {
    "capture": "graphed", "verify": "verification", "advise": "advice",
    "GraphedCallable": "graphed", "shared_pool": "graphed", "capture_stream": "graphed", "explain": "graphed",
    "NoCudaError": "graphed", "CaptureError": "graphed", "StaleGraphError": "guard", "weights_fixed": "guard",
    "graph_features": "graphed", "register_generators": "graphed",
    "has_cuda": "env", "bf16_supported": "env", "usable_gpu_memory": "env", "describe": "env", "env_table": "env",
    "graph_modules": "partial", "timeit": "timing", "gpu_time": "timing", "compare": "timing",
    "prediction_interval": "intervals", "verdict": "intervals", "combine_windows": "intervals",
    "ratio_across_windows": "intervals", "check_capturable": "check",
    "capture_buckets": "bucket_graphs", "BucketedGraphs": "bucket_graphs", "ladder": "bucket_graphs",
    "plan_buckets": "bucket_plan", "BucketPlan": "bucket_plan", "evaluate_buckets": "bucket_plan",
    "MemoryLedger": "memory", "pool_usage": "memory",
    "capture_train_step": "train_step", "GraphedTrainStep": "train_step",
    # these need torch.distributed (absent from a few PyTorch builds: there, using one raises its ImportError)
    "setup_distributed_for_graphs": "ddp", "ddp_for_graphs": "ddp", "StepTimer": "ddp", "jitter_summary": "ddp",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    """A public name, a module of the kit or ``__version__``, loaded when first asked for (then cached)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name == "__version__":
        value = _version()
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a module: cudagraph_kit.graphed, cudagraph_kit.show
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    import pkgutil
    modules = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return sorted(set(globals()) | set(__all__) | modules | {"__version__"})


def _version() -> str:
    """This code's version: in a source checkout, pyproject.toml's (an editable install's metadata keeps the version
    it was installed at); otherwise the installed package's metadata. ``"0+unknown"`` when neither is there.

    Example: ``_version()`` -> ``"0.4.0.dev0"``."""
    pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    if os.path.isfile(pyproject):
        project = _toml_project(pyproject)
        if project.get("name") == "cudagraph-kit" and project.get("version"):
            return project["version"]
    from importlib import metadata
    try:
        return metadata.version("cudagraph-kit")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _toml_project(path: str) -> dict:
    """The ``[project]`` table of a pyproject.toml, read with tomllib (Python 3.11+) or tomli (the kit's dependency
    before 3.11); {} where neither can be imported (a kit installed without its dependencies), so ``_version``
    falls back to the installed metadata."""
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {}
    with open(path, "rb") as f:
        return tomllib.load(f).get("project", {})
