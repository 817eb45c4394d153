"""Partial capture: ``torch.cuda.make_graphed_callables`` with its known traps turned into clear errors.

Graph the parts of a network that are capturable (static shapes, no CPU sync) and leave the rest, the
optimizer step included, eager. Forward and backward of each part become one graph each.

Traps handled:
- autocast: capturing under ``torch.autocast`` needs ``cache_enabled=False`` (checked), and a graph captured
  with autocast on (or off) must be called the same way (checked at each call);
- sample args: nested tuples, lists and dicts of tensors are accepted as ``make_graphed_callables`` accepts
  them; real inputs must have the sample's structure, shapes and dtypes (checked at each call: the plain API
  would silently broadcast a smaller tensor into the static input). A real input may skip a gradient its
  sample asked for, but one that requires grad where its sample did not is refused: the captured backward
  computes no gradient for it (a data batch: False; an activation from an earlier layer: True);
- DDP: a module wrapped in DistributedDataParallel needs 11 warm-up iterations (raised automatically);
- several modules graphed in one call share one memory pool (pass a tuple).

Streams: ``make_graphed_callables`` chooses its own warm-up and capture streams (which ones depends on the PyTorch
release), so the kit's stream rule (``graphed.capture_stream``) cannot reach it. Share a pool among modules by
graphing them in one call, not with the graphs of ``capture`` or ``capture_buckets``.

Example::

    from cudagraph_kit.partial import graph_modules
    x = torch.randn(32, 128, device="cuda")                       # data: requires_grad False
    h = torch.randn(32, 256, device="cuda", requires_grad=True)   # activation: True
    block1, block2 = graph_modules((block1, block2), ((x,), (h,)))
    loss = loss_fn(block2(block1(x)), y); loss.backward(); optimizer.step()   # optimizer stays eager
"""
from __future__ import annotations

import importlib.util
import inspect
import os

import torch


if __package__:
    from . import graphed as _graphed  # errors and the recovery after a failed capture
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed as _graphed  # type: ignore[import-not-found, no-redef]
CaptureError = _graphed.CaptureError
NoCudaError = _graphed.NoCudaError
recover_from_failed_capture = _graphed.recover_from_failed_capture
reseed_error = _graphed.reseed_error
reseeding_calls = _graphed.reseeding_calls
no_cuda_message = _graphed.no_cuda_message

__all__ = ["graph_modules"]

NO_CUDA_MESSAGE = no_cuda_message("run on a machine (or Colab runtime) with a CUDA GPU; without one, call the "
                                  "modules themselves (eagerly).")


def _autocast_enabled() -> bool:
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:  # older PyTorch
        return torch.is_autocast_enabled()


def _spec(t):
    return (tuple(t.shape), t.dtype, t.device, t.requires_grad)


def _flat(args) -> tuple:
    """(tensor leaves, structure) of a call's arguments, flattened as make_graphed_callables flattens them."""
    from torch.utils._pytree import tree_flatten
    return tree_flatten(tuple(args))


def _checked(call, sample, autocast_at_capture, name, module=None, guard=None):
    training_at_capture = module.training if module is not None else None
    sample_leaves, sample_structure = _flat(sample)
    specs = tuple(_spec(t) for t in sample_leaves)

    def checked_call(*args, **kwargs):
        # a module in another train/eval state than at capture runs its original forward: nothing to check
        if module is None or module.training == training_at_capture:
            if guard is not None:  # before anything runs: a stale graph touches nothing
                guard.check()
            if len(args) != len(sample):
                raise TypeError(f"{name} was graphed with {len(sample)} input(s), got {len(args)}.")
            leaves, structure = _flat(args)
            if structure != sample_structure:
                raise ValueError(
                    f"{name}: the inputs are nested differently from the sample args (containers, keys or their "
                    f"order differ: {structure} vs {sample_structure}); the graph copies tensors into its static "
                    "inputs in flattened order, so they would land in the wrong places. Nothing was replayed. Fix: "
                    "pass the same structure as the sample args (same dict keys, in the same order).")
            for i, (a, s) in enumerate(zip(leaves, specs)):
                got = _spec(a) if isinstance(a, torch.Tensor) else type(a).__name__
                if not isinstance(a, torch.Tensor) or got[:3] != s[:3]:
                    raise ValueError(
                        f"{name}: input {i} is {got[:3] if isinstance(got, tuple) else got}, but the graph was "
                        f"captured for (shape, dtype, device) = {s[:3]}. Nothing was replayed. Fix: pass inputs like "
                        "the sample args, or graph again with matching sample args.")
                if a.requires_grad and not s[3] and torch.is_grad_enabled():
                    # the other way round is fine: the graph computes a gradient that autograd then drops
                    raise ValueError(
                        f"{name}: input {i} requires grad, but its sample arg did not, so the captured backward "
                        "computes no gradient for it: the layers before it would silently get none. Nothing was "
                        "replayed. Fix: graph with a sample arg that has requires_grad=True (an activation from an "
                        "earlier trainable layer), or pass the input detached if it needs no gradient.")
            if _autocast_enabled() != autocast_at_capture:
                raise RuntimeError(
                    f"{name} was graphed with autocast {'on' if autocast_at_capture else 'off'} but is called "
                    f"with autocast {'on' if not autocast_at_capture else 'off'}; the graph would replay the "
                    "captured precision silently. Fix: call it under the same autocast state as at capture.")
        return call(*args, **kwargs)
    return checked_call


def _as_arg_tuple(args, what: str) -> tuple:
    if isinstance(args, torch.Tensor):
        raise TypeError(
            f"{what} is a bare tensor of shape {tuple(args.shape)}; it would be split into its rows. "
            "Fix: wrap it in a tuple, e.g. sample_args=(x,) for one module, or ((x,), (h,)) for several.")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"{what} must be a tuple of tensors, got {type(args).__name__}. Fix: e.g. (x,).")
    return tuple(args)


def graph_modules(modules, sample_args, *, warmup: int = 3, pool=None, allow_unused_input: bool = False):
    """Graph one module/function or a tuple of them with ``torch.cuda.make_graphed_callables``.

    ``sample_args`` is a tuple of arguments for one callable, or a tuple of such tuples for several (a bare
    tensor is refused: it would be split into rows); an argument is a tensor or a tuple, list or dict of them. Returns what ``make_graphed_callables`` returns (modules
    keep their type; their graphed ``forward`` checks its inputs first). Capture under
    ``torch.autocast("cuda", dtype, cache_enabled=False)`` for AMP. A failed capture raises ``CaptureError``
    (cause, fix, original error), like ``capture``.

    ``make_graphed_callables`` "assumes module params didn't change since capture" (its docstring): here its own
    warm-up and capture are watched (``guard.watch_reads``), and each graphed call first checks that what they read
    is still held and laid out as then (``guard.Guard``: ``m.half()``, ``m.weight = ...`` raise
    ``StaleGraphError``; in-place updates such as optimizer steps pass). The guard is ``graphed.guard``.
    """
    single = not isinstance(modules, tuple)
    mods = (modules,) if single else modules
    if single:
        args = (_as_arg_tuple(sample_args, "sample_args"),)
    else:
        outer = _as_arg_tuple(sample_args, "sample_args")
        args = tuple(_as_arg_tuple(a, f"sample_args[{i}]") for i, a in enumerate(outer))
    if len(mods) != len(args):
        raise ValueError(f"got {len(mods)} callables but {len(args)} sample-arg tuples; give one tuple each.")
    if not torch.cuda.is_available():
        raise NoCudaError(NO_CUDA_MESSAGE)
    for m, a in zip(mods, args):
        name = type(m).__name__
        for i, t in enumerate(_flat(a)[0]):  # sample args may nest tensors in tuples, lists and dicts
            if not isinstance(t, torch.Tensor) or not t.is_cuda:
                raise ValueError(f"{name}: sample arg {i} (flattened) must be a CUDA tensor, got "
                                 f"{getattr(t, 'device', type(t).__name__)}. Fix: move it with .cuda(); bind "
                                 "non-tensor arguments into the callable (functools.partial).")
    autocast_on = _autocast_enabled()
    if autocast_on and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables under autocast needs the autocast cache off, or the graph would keep "
            "casts of the weights from capture time. Fix: torch.autocast('cuda', dtype=..., cache_enabled=False).")
    if any(isinstance(m, torch.nn.parallel.DistributedDataParallel) for m in mods):
        warmup = max(warmup, 11)  # the documented requirement for DDP (NCCL async error handling)
    kwargs = {"num_warmup_iters": warmup, "allow_unused_input": allow_unused_input}
    if pool is not None:
        if "pool" not in inspect.signature(torch.cuda.make_graphed_callables).parameters:
            raise TypeError("this PyTorch's make_graphed_callables has no pool argument; upgrade PyTorch "
                            "or graph the modules together in one call (they then share a pool).")
        kwargs["pool"] = pool
    # A graph cannot replay a reseed. The kit reads the generator's seed and offset around the whole call (it patches
    # nothing): a reseed in the warm-up shows there; one in the capture PyTorch refuses itself (from_exception says so).
    reseeds = []
    try:
        # the collector paused, as in every capture of the kit (graphed.graph_capture says why: a graph freed by
        # the collector in the middle of this capture invalidates it; seen in this module's GPU test on an H100)
        # its own warm-up and capture are watched: what the modules really read (parameters, buffers, constants)
        with _graphed.gc_paused(), reseeding_calls() as reseeds, \
                _graphed.guard.watch_reads(skip=_flat(args)[0], force_eager=False) as reads:
            graphed = torch.cuda.make_graphed_callables(mods, args, **kwargs)
        _graphed.after_capture()  # its capture stream is its own: the whole GPU (graphed.after_capture says why)
    except Exception as exc:
        recover_from_failed_capture()
        if reseeds:
            raise reseed_error(reseeds, "make_graphed_callables' warm-up and capture") from exc
        raise CaptureError.from_exception(exc) from exc
    if reseeds:
        raise reseed_error(reseeds, "make_graphed_callables' warm-up and capture")
    # train/eval mode: make_graphed_callables runs a module in the other mode eagerly, so the guard leaves mode alone
    checked = _graphed.guard.Guard(mods, reads.tensors, check_mode=False) or None
    out = []
    for m, a, g in zip(mods, args, graphed):
        if isinstance(g, torch.nn.Module):
            g.forward = _checked(g.forward, a, autocast_on, type(m).__name__, module=g, guard=checked)
            g.guard = checked
            out.append(g)
        else:
            call = _checked(g, a, autocast_on, getattr(m, "__name__", "callable"), guard=checked)
            call.guard = checked
            out.append(call)
    return out[0] if single else tuple(out)
