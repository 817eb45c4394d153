"""What the compilers do, probed.

TorchScript's fuser read from its optimized graph, a scripted function or the reason there is none, and what reading
a ``torch.compile(mode="reduce-overhead")`` output after the next call does on this PyTorch (notebook 03); the
memory reduce-overhead's CUDA graph trees reserve in their one pool (06); how many graphs Dynamo has compiled so far
(08).

Example::

    from cudagraph_kit.course.lessons.compilers import read_after_next_call, script_or_none
    scripted, warned = script_or_none(gelu, [x], warmup=20)
    what, message = read_after_next_call(torch.compile(f, mode="reduce-overhead"), x1, x2, reference=f)
"""
from __future__ import annotations

import types
import warnings

import torch

__all__ = ["fresh", "script_or_none", "torchscript_fuser", "read_after_next_call", "keeping_outputs", "with_mark_step",
           "graph_trees_pool_bytes", "compiles_so_far"]


def fresh(fn):
    """A copy of ``fn`` with its own code object. Dynamo keeps one compile cache per code object, so giving each
    compiled variant its own copy keeps their caches (and guards) apart."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def script_or_none(fn, inputs, warmup: int):
    """``torch.jit.script(fn)``, called ``warmup`` times on each of ``inputs`` (its profiling runs, after which its
    fuser fuses), and the deprecation warnings PyTorch gave; ``(None, warnings)`` where TorchScript is gone or fails
    on this PyTorch, with the reason printed."""
    scripted = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scripted = torch.jit.script(fn)
            for x in inputs:
                for _ in range(warmup):
                    scripted(x)
        except Exception as exc:  # noqa: BLE001 - gone or broken on this version: no TorchScript rows, say why
            scripted = None
            print(f"torch.jit.script is not usable on PyTorch {torch.__version__}: {type(exc).__name__}: {exc}")
    said = sorted({f"{w.category.__name__}: {w.message}" for w in caught
                   if issubclass(w.category, (DeprecationWarning, FutureWarning))})
    return scripted, said


def torchscript_fuser(scripted, x) -> tuple[str, list]:
    """Which fuser TorchScript used for ``scripted`` (after its profiling runs), read from its optimized graph for
    ``x`` (``prim::TensorExprGroup``: NNC; ``prim::CudaFusionGroup``: nvFuser), and the operations its fusion group
    runs as one kernel: ``("NNC (prim::TensorExprGroup)", ["mul", "div", ...])``."""
    import re

    try:
        optimized = str(scripted.graph_for(x))
    except Exception as exc:  # noqa: BLE001 - only a printout
        return f"unknown (graph_for unavailable: {exc})", []
    fuser = next((name for key, name in [("TensorExprGroup", "NNC (prim::TensorExprGroup)"),
                                         ("CudaFusionGroup", "nvFuser (prim::CudaFusionGroup)"),
                                         ("FusionGroup", "legacy fuser (prim::FusionGroup)")] if key in optimized),
                 "none (no fusion group)")
    return fuser, re.findall(r"aten::(\w+)\(", optimized.partition("with prim::")[2])   # the fusion group's body


def read_after_next_call(f, x1, x2, reference):
    """``y1 = f(x1); y2 = f(x2)``; then read ``y1`` and compare it with ``reference(x1)``. Returns what happened,
    ``("kept (y1 still holds f(x1))" | "silently overwritten" | "raises RuntimeError", message)``."""
    y1 = f(x1)
    y2 = f(x2)                                    # a new generation: it may reuse y1's memory
    try:
        same_as_f_x1 = torch.allclose(y1, reference(x1), atol=1e-5)   # reads y1
    except RuntimeError as exc:
        return "raises RuntimeError", str(exc).split(" Stack trace")[0]
    finally:
        del y2
    return ("kept (y1 still holds f(x1))" if same_as_f_x1 else "silently overwritten"), ""


def keeping_outputs(fn):
    """``fn`` called as the usual loop body ``y = f(x)``: its last output stays alive while the next call runs."""
    kept = {}

    def call(x):
        kept["y"] = fn(x)
        return kept["y"]
    return call


def with_mark_step(fn):
    """``fn`` with ``torch.compiler.cudagraph_mark_step_begin()`` before each call: each call starts an iteration."""
    def call(x):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(x)
    return call


def graph_trees_pool_bytes():
    """Bytes reserved by the pool of reduce-overhead's CUDA graph trees on this GPU, or None where not readable.

    One pool per GPU and thread, created by the graph trees' manager and shared by every function compiled with
    mode="reduce-overhead" in the thread (torch/_inductor/cudagraph_trees.py: CUDAGraphTreeManager)."""
    from ...memory import pool_usage

    try:
        from torch._inductor import cudagraph_trees  # private API: it may move between PyTorch versions
        manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        pool = tuple(manager.cuda_graphs_thread_pool)
    except Exception:
        return None
    return pool_usage().get(pool, {}).get("reserved")


def compiles_so_far() -> int:
    """How many graphs Dynamo has compiled in this process (``torch._dynamo``'s own counter); 0 if unreadable."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a counter PyTorch may rename: then no count
        return 0
