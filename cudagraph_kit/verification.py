"""After capture, prove that a CUDA graph replays what eager does: :func:`verify`.

It replays a graph against eager on fresh (and poisoned) inputs for a few steps and reports the first divergence:
the silent failures (a static input rebound instead of copied into, a frozen Python number, an output kept across
replays). It first runs eager twice on identical inputs: outputs that differ there depend on state the graph
freezes, and the report says so rather than calling it a mismatch. During those two calls it sets its own
``sys.settrace`` tracer (a debugger's breakpoints inside them are skipped) and puts the tensor state and RNG it
touched back afterwards.

Example::

    import torch
    from cudagraph_kit.graphed import capture
    from cudagraph_kit.verification import verify

    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    g = capture(model, x)
    print(verify(g, model, x, steps=3))     # "verify: the graph matches eager on all 3 steps ..."

It needs ``torch`` and the kit's ``state_watch.py`` beside it.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import sys
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves


if __package__:
    from . import state_watch as sw  # the Python-state watch, shared with check.py
else:  # this file copied beside state_watch.py, outside the package: that state_watch.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("state_watch")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's state_watch.py from its own folder {_here}, "
                          f"but `import state_watch` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/state_watch.py beside it, that folder first on sys.path.")
    import state_watch as sw  # type: ignore[import-not-found, no-redef]
sw.KIT_FILES.add(os.path.abspath(__file__))

__all__ = ["verify", "VerifyReport"]

# ------------------------------------------------------------------------------------------------- verify
try:  # torch.testing.assert_close's default (rtol, atol) for a dtype, read from PyTorch (there since 1.10)
    from torch.testing._comparison import default_tolerances as _default_tolerances
except ImportError:  # a private name: should PyTorch move it, assert_close's documented defaults
    def _default_tolerances(dtype):
        return {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float64: (1e-7, 1e-7),
                torch.complex32: (1e-3, 1e-5), torch.complex128: (1e-7, 1e-7)}.get(dtype, (1.3e-6, 1e-5))


def _tolerances(dtype) -> tuple:
    """(rtol, atol) for comparing floating outputs of ``dtype``: assert_close's defaults; float32's for a floating
    dtype that has none there (float8: assert_close would demand equality)."""
    r, t = _default_tolerances(dtype)
    return (r, t) if (r, t) != (0.0, 0.0) else _default_tolerances(torch.float32)


def _compare(a, b, rtol=None, atol=None) -> tuple:
    """(equal?, max |a-b|, mismatched elements, what differs) for two tensors."""
    if a.shape != b.shape:
        return False, float("inf"), a.numel(), f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if not (a.is_floating_point() or a.is_complex()):
        bad = int((a != b.to(a.device)).sum())
        diff = float((a.double() - b.to(a.device).double()).abs().max()) if a.numel() else 0.0
        return bad == 0, diff, bad, ""
    r, t = _tolerances(a.dtype)
    r, t = (rtol if rtol is not None else r), (atol if atol is not None else t)
    x, y = a.detach().double(), b.detach().to(a.device).double()
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    nan_bad = nan_x != nan_y
    diff = (x - y).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    same_inf = torch.isinf(x) & torch.isinf(y) & (x == y)
    bad = ((diff > t + r * y.abs().nan_to_num(nan=0.0)) & ~same_inf) | nan_bad
    n_bad = int(bad.sum())
    max_diff = float(diff.masked_fill(same_inf, 0).max()) if a.numel() else 0.0
    if int(nan_bad.sum()):
        max_diff = float("nan")
    return n_bad == 0, max_diff, n_bad, ""


def _tree(out) -> list:
    """(path, leaf) pairs of a nested output."""
    from torch.utils._pytree import tree_flatten_with_path, keystr
    try:
        leaves, _ = tree_flatten_with_path(out)
        return [(keystr(p) or "output", v) for p, v in leaves]
    except Exception:
        return [(f"output[{i}]", v) for i, v in enumerate(tree_leaves(out))]


def _clone_tree(out):
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else copy.copy(t), out)


def _compare_outputs(got, want, rtol, atol):
    """None if equal, else dict(path, max_abs_diff, mismatched, detail)."""
    g, w = _tree(got), _tree(want)
    if len(g) != len(w):
        return {"path": "output", "max_abs_diff": float("inf"), "mismatched": None,
                "detail": f"{len(g)} output leaves vs {len(w)}"}
    for (path, a), (_, b) in zip(g, w):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            ok, diff, bad, detail = _compare(a, b, rtol, atol)
            if not ok:
                return {"path": path, "max_abs_diff": diff, "mismatched": bad, "numel": a.numel(), "detail": detail}
        elif not sw.same(a, b):
            return {"path": path, "max_abs_diff": None, "mismatched": 1, "detail": f"{a!r} vs {b!r}"}
    return None


def _state_tensors(obj) -> list:
    """(name, tensor) pairs of a module (parameters, buffers), an optimizer (state) or a tensor."""
    if isinstance(obj, torch.Tensor):
        return [("tensor", obj)]
    if isinstance(obj, torch.nn.Module):
        return list(obj.named_parameters()) + list(obj.named_buffers())
    if isinstance(obj, torch.optim.Optimizer):
        out = []
        params = [p for g in obj.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            for k, v in sorted(obj.state.get(p, {}).items()):
                if isinstance(v, torch.Tensor):
                    out.append((f"state[{i}]['{k}']", v))
        for i, g in enumerate(obj.param_groups):
            for k, v in g.items():
                if k != "params" and isinstance(v, torch.Tensor):
                    out.append((f"param_groups[{i}]['{k}']", v))
        return out
    raise TypeError(f"state pairs hold modules, optimizers or tensors, got {type(obj).__name__}.")


def _sync_state(src, dst):
    """Make ``dst`` (the eager reference) start from ``src``'s (the graph's) current state."""
    with torch.no_grad():
        if isinstance(src, torch.optim.Optimizer):
            dst.load_state_dict(copy.deepcopy(src.state_dict()))
            return
        for (n, a), (_, b) in zip(_state_tensors(src), _state_tensors(dst)):
            b.copy_(a)


def _fresh_like(t, step: int, gen, poison: bool):
    if not isinstance(t, torch.Tensor):
        return t
    if poison and (t.is_floating_point() or t.is_complex()):
        return torch.full_like(t, float("nan"))
    if t.dtype == torch.bool:
        new = torch.randint(0, 2, t.shape, generator=gen).bool()
    elif t.is_floating_point() or t.is_complex():
        new = torch.randn(t.shape, generator=gen, dtype=torch.float32)
    else:
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
        new = torch.randint(lo, hi + 1, t.shape, generator=gen, dtype=torch.int64)
    return new.to(device=t.device, dtype=t.dtype)


def _rng_state(devices):
    return torch.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in devices}


def _set_rng_state(state):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    for d, s in cuda.items():
        torch.cuda.set_rng_state(s, d)


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` found: ``ok``, the ``first`` divergence (step, where, sizes, likely cause), whether
    the graph returns the same output memory every call (``outputs_reused``), one row per step, and notes."""
    ok: bool
    steps: int
    first: dict | None
    outputs_reused: bool
    rows: list
    notes: list
    frozen_state: dict | None = None  # from the behavioural check: eager itself differs on identical inputs

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)

    def __str__(self):
        if self.ok:
            lines = [f"verify: the graph matches eager on all {self.steps} steps (fresh, poisoned and random inputs)."]
        elif self.first is self.frozen_state:
            f = self.first
            diff = f.get("max_abs_diff")
            lines = [f"verify: {f['what']}: two eager calls on identical inputs (RNG fixed, tensor state put back) "
                     f"give different outputs ({f['path']}"
                     + (f", max difference {diff:.3g}" if isinstance(diff, float) else "") + "), so comparing the "
                     "graph with eager would only show a mismatch.",
                     f"cause: {f['cause']}", f"fix: {sw.PYTHON_STATE_FIX}"]
        else:
            f = self.first
            diff = f.get("max_abs_diff")
            lines = [f"verify: DIVERGES at step {f['step']} ({f['inputs']} inputs): {f['what']} differs"
                     + (f", max |graph - eager| = {diff:.3g}" if isinstance(diff, float) else "")
                     + (f", {f['mismatched']} element(s)" if f.get("mismatched") else "")
                     + (f" ({f['detail']})" if f.get("detail") else "") + ".",
                     f"likely cause: {f['hint']}"]
        if self.outputs_reused:
            lines.append("outputs: every call returns the same output memory, so an output you keep is "
                         "overwritten by the next call; clone what you keep (capture(..., clone_outputs=True)).")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _static_buffers(graphed, static_inputs):
    if static_inputs is not None:
        return [t for t in tree_leaves(static_inputs) if isinstance(t, torch.Tensor)]
    for attr in ("static_inputs", "static_batch"):
        found = getattr(graphed, attr, None)
        if found is not None:
            return [t for t in tree_leaves(found) if isinstance(t, torch.Tensor)]
    return []


def verify(graphed: Callable, reference: Callable, *sample_args, steps: int = 3, state=None,
           before_step: Callable[[int], Any] | None = None, static_inputs=None, poison: bool = True,
           rtol: float | None = None, atol: float | None = None, seed: int = 0) -> VerifyReport:
    """Call ``graphed`` and its eager ``reference`` on the same fresh inputs for ``steps`` steps; compare.

    Inputs are new tensors like ``sample_args`` at every step (random, and for a stateless function one step
    of NaN: a graph that reads stale memory then disagrees). Before each call the graph's static input
    buffers (``graphed.static_inputs`` / ``.static_batch``, or ``static_inputs=``) are filled with NaN, so a
    graph whose inputs are not copied in is caught. The RNG state is the same for both calls.

    First, a behavioural check: ``reference`` runs eagerly on identical inputs (after one warm-up call) twice,
    with the RNG fixed and the tensor state it reaches (parameters, gradients, buffers, optimizer state) put back
    before each call. If even those outputs differ, the function depends on state that the graph freezes (a
    Python value that changes from call to call): the report says so, with the values seen changing and the
    line, instead of calling it a mismatch (``report.frozen_state``).

    - ``state``: pairs ``[(graph_side, reference_side), ...]`` of modules, optimizers or tensors to compare
      after each step (a training step: the model and the optimizer). The reference side is first set to
      the graph side's current state.
    - ``before_step(i)``: called before step ``i`` (e.g. to step LR schedulers on both sides).

    Returns a :class:`VerifyReport`; ``print`` it. The first divergence names the step, the output or state
    entry, the size of the difference and the likely cause.

    Example::

        g = capture(model, x)
        print(verify(g, lambda x: model(x), x, steps=3))
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    pairs = list(state or [])
    for g_side, r_side in pairs:
        _sync_state(g_side, r_side)
    devices = sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                      for t in tree_leaves(sample_args) if isinstance(t, torch.Tensor) and t.is_cuda})
    statics = _static_buffers(graphed, static_inputs)
    frozen = _repeat_eagerly(reference, sample_args, devices, [r for _, r in pairs], rtol, atol, seed)
    gen = torch.Generator().manual_seed(seed)
    rows, kept, kept_clones, ref_outputs, notes = [], [], [], [], []
    if frozen is not None and "note" in frozen:
        notes.append(frozen["note"])
        frozen = None
    first = frozen
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        poison_args = poison and not pairs and steps >= 2 and step == 1
        inputs = tuple(_fresh_like(a, step, gen, poison_args) for a in sample_args)
        kind = "NaN" if poison_args else "random"
        if poison:
            with torch.no_grad():
                for s in statics:
                    if s.is_floating_point():
                        s.fill_(float("nan"))
        rng = _rng_state(devices)
        out_g = graphed(*inputs)
        out_g_clone = _clone_tree(out_g)
        _set_rng_state(rng)
        out_r = reference(*inputs)
        out_r = _clone_tree(out_r)
        if devices:
            torch.cuda.synchronize()
        kept.append(out_g)
        kept_clones.append(out_g_clone)
        row = {"step": step, "inputs": kind, "outputs_equal": True, "max_abs_diff": 0.0, "state_equal": True}
        bad = _compare_outputs(out_g_clone, out_r, rtol, atol)
        if bad is not None:
            row.update(outputs_equal=False, max_abs_diff=bad["max_abs_diff"])
            if first is None:
                first = dict(bad, step=step, inputs=kind,
                             what="the output" if bad["path"] == "output" else f"output {bad['path']}",
                             hint=_output_hint(out_g_clone, ref_outputs, statics and poison, rtol, atol))
        for g_side, r_side in pairs:
            for (name, a), (_, b) in zip(_state_tensors(g_side), _state_tensors(r_side)):
                ok, diff, n_bad, detail = _compare(a, b, rtol, atol)
                if not ok:
                    row["state_equal"] = False
                    if first is None:
                        label = type(g_side).__name__
                        first = {"step": step, "inputs": kind, "what": f"{label} {name}", "max_abs_diff": diff,
                                 "mismatched": n_bad, "detail": detail, "hint": _STATE_HINT}
                    break
        ref_outputs.append(out_r)
        rows.append(row)
    reused = _outputs_reused(kept, kept_clones)
    if reused and steps < 2:
        notes.append("one step only: whether outputs are reused across calls was not checked")
    return VerifyReport(first is None, steps, first, reused, rows, notes, frozen)


def _repeat_eagerly(reference, sample_args, devices, extra, rtol, atol, seed) -> dict | None:
    """The behavioural check of :func:`verify`: a warm-up call of ``reference``, then two calls on identical
    inputs with the RNG fixed and the tensor state it reaches put back before each. Outputs that still differ
    come from state that changes from one call to the next and is not a tensor updated in place: a Python value,
    which a graph freezes at capture. Returns None, or what differs and the cause (the values seen changing and
    the line that changed them). Everything it can put back (tensor state, RNG) is put back afterwards."""
    watch = sw.watch_for(reference, sample_args)
    gen = torch.Generator().manual_seed(seed + 7919)
    inputs = tuple(_fresh_like(a, 0, gen, False) for a in sample_args)

    def call():
        args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in inputs)
        return _clone_tree(reference(*args))

    start = sw.TensorState(watch, extra)
    rng = _rng_state(devices)
    tracer = sw.ChangeTracer(watch)
    previous_trace = sys.gettrace()
    outs = []
    try:
        call()  # a warm-up, as before a capture: lazy initialisation happens here, not in the compared calls
        warm = sw.TensorState(watch, extra)
        before = tracer.last = watch.snapshot()
        for _ in range(2):
            warm.restore()
            _set_rng_state(rng)
            sys.settrace(tracer.global_trace)
            try:
                outs.append(call())
            finally:
                sys.settrace(previous_trace)
        after = watch.snapshot()
    finally:
        start.restore()
        _set_rng_state(rng)
    if devices:
        torch.cuda.synchronize()
    bad = _compare_outputs(outs[1], outs[0], rtol, atol)
    if bad is None:
        return None
    changed = [k for k in after if not sw.same(after[k], before.get(k))]
    if changed:
        items = []
        for k in changed[:3]:
            loc, code = tracer.where.get(k, ("?", ""))
            items.append(f"{k} ({before.get(k)!r} -> {after[k]!r}), changed at {loc}" + (f": {code}" if code else ""))
        more = f"; and {len(changed) - 3} more" if len(changed) > 3 else ""
        cause = ("a Python value it reads changes on every call: " + "; ".join(items) + more + ". A replay keeps "
                 "the value read at capture")
        what = "depends on state that the graph freezes"
    elif _compare_outputs(outs[1], outs[0], 1e-3, 1e-4) is None:
        # no value seen changing and only a rounding-sized difference: nondeterministic kernels (atomics), not
        # frozen state; the comparison with the graph below uses the usual tolerances
        return {"note": f"two eager calls on identical inputs differ slightly ({bad['path']}, max "
                        f"{bad['max_abs_diff']:.3g}) though no Python value it reaches changed: nondeterministic "
                        "kernels, most likely"}
    else:
        cause = ("something it reads changes from one call to the next, and it is neither a tensor the check "
                 "could put back nor a Python value it could reach (a module-level value in a library, a file, "
                 "the clock): a graph replays what it read at capture. check_capturable(fn, *args) lists what it "
                 "can see")
        what = "depends on state that the graph freezes (not found)"
    return {"step": "before", "inputs": "identical", "what": what, "cause": cause, "hint": cause,
            "path": bad["path"], "max_abs_diff": bad["max_abs_diff"], "mismatched": bad.get("mismatched"),
            "detail": bad.get("detail", ""), "changed": changed}


_STATE_HINT = ("the graph's training state drifts from eager: a Python number frozen at capture (a learning "
               "rate changed by a scheduler, a step counter), gradients the graph no longer sees (zero_grad "
               "with set_to_none=True after capture, .grad replaced), or an optimizer with capturable=False")


def _output_hint(got, ref_outputs, poisoned, rtol, atol) -> str:
    for j in range(len(ref_outputs) - 1, -1, -1):
        if _compare_outputs(got, ref_outputs[j], rtol, atol) is None:
            return (f"the graph computed on step {j}'s inputs: new inputs are not reaching the graph's static "
                    "inputs. Copy them in (static.copy_(new)); rebinding a name (static = new) does not change "
                    "the memory the graph reads")
    leaves = [t for _, t in _tree(got) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if poisoned and any(bool(torch.isnan(t).any()) for t in leaves):
        return ("the graph read its static input buffers, which were poisoned with NaN before the call: new "
                "inputs are not copied into them")
    return ("the graph replays what it recorded at capture: a Python number, flag or CPU tensor read then is "
            "frozen (check_capturable(fn, *args) lists them), or the output was overwritten by another call")


def _outputs_reused(kept, clones) -> bool:
    if len(kept) < 2:
        return False
    ptrs = [[t.data_ptr() for t in tree_leaves(k) if isinstance(t, torch.Tensor)] for k in kept]
    same_memory = any(p and p == ptrs[-1] for p in ptrs[:-1])
    changed = any(_compare_outputs(k, c, 0.0, 0.0) is not None for k, c in zip(kept[:-1], clones[:-1]))
    return same_memory or changed
