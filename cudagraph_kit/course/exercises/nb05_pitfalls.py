"""Checks for notebook 05's exercises (pitfalls); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb05_pitfalls import check_step_counter
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo, max_abs_diff)

__all__ = ['check_step_counter', 'check_clip_without_sync']


def _first_finding(report) -> str:
    """``kind at where: code`` of a ``check_capturable`` report's first finding."""
    f = report.findings[0]
    return f"{f.kind} at {f.where}" + (f" ({f.code.strip()[:80]})" if f.code else "")


def _check_learners_verify(report, verified, what, hint):
    """The learner's own ``verify`` report: a ``VerifyReport`` that passed."""
    from ...verification import VerifyReport

    if is_todo(verified):
        report.todo(f"{what}: run verify(...) on your graph and keep its report")
    elif not isinstance(verified, VerifyReport):
        report.off(f"{what} is a {type(verified).__name__}, not the report verify() returns")
    elif not verified.ok:
        first = str(verified).splitlines()[0]
        report.off(f"your verify() finds a divergence: {first[:200]}", hint)
    else:
        report.right(f"your verify() passes: {str(verified).splitlines()[0]}")


@exercise("05_pitfalls", 1, "a step counter that a graph replays", "cpu+gpu")
@check("05.1")
def check_step_counter(report, ScaledByStepFixed, counter_verify):  # noqa: N803 - the notebook's class name
    """``ScaledByStepFixed``: section 5's ``ScaledByStep`` (``self.lin = Linear(16, 16)``; call k returns
    ``lin(x) / k``) with its counter in a tensor updated in place; ``counter_verify``: ``verify`` of a captured
    instance against an eager copy of it (GPU)."""
    import copy

    import torch

    from ...graphed import capture
    from ...check import check_capturable
    from ...verification import verify

    cls, device, done = ScaledByStepFixed, "cuda" if cuda() else "cpu", False
    if is_todo(cls):
        report.todo("write the class ScaledByStepFixed")
    elif not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        report.off(f"ScaledByStepFixed is a {type(cls).__name__}; pass the class, a torch.nn.Module subclass")
    elif cls.forward is torch.nn.Module.forward:
        report.todo("ScaledByStepFixed has no forward yet: its body is still the placeholder")
    else:
        done = _check_counter_class(report, cls, device, check_capturable)
    if not cuda():
        report.needs_gpu("capturing it, and verify() against eager, need an NVIDIA GPU")
        return
    same_copy_hint = ("the eager reference must be a copy of its own: every call, graph or eager, advances the "
                      "counter. reference = copy.deepcopy(model) before the capture, then verify(g, reference, x, "
                      "state=[(model, reference)]) starts both from the same count and compares them after each step.")
    _check_learners_verify(report, counter_verify, "counter_verify", same_copy_hint)
    if not done:
        return
    torch.manual_seed(0)
    model = cls().to(device)
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16, device=device)
    g = capture(model, x)
    mine = verify(g, reference, x, steps=3, state=[(model, reference)])
    if mine.ok:
        report.right("captured, each replay divides by the current count: verify() against an eager copy passes "
                     "on 3 steps")
    else:
        report.off(f"a graph of a fresh ScaledByStepFixed diverges from eager: {str(mine).splitlines()[0][:200]}",
                   "the counter must live in GPU memory (a buffer, moved by .to(DEVICE)) and change in place.")


def _check_counter_class(report, cls, device, check_capturable) -> bool:
    """Everything a CPU can check of the class; True when all of it is right."""
    import torch

    torch.manual_seed(0)
    m = cls().to(device)
    lin = getattr(m, "lin", None)
    if not isinstance(lin, torch.nn.Linear) or (lin.in_features, lin.out_features) != (16, 16):
        report.off("ScaledByStepFixed has no self.lin = torch.nn.Linear(16, 16)", "keep ScaledByStep's layer.")
        return False
    buffers = dict(m.named_buffers())
    before = {n: (b.data_ptr(), b.detach().clone()) for n, b in buffers.items()}
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        outs = [m(x) for _ in range(3)]
        base = m.lin(x)
    if not all(isinstance(o, torch.Tensor) and o.shape == base.shape for o in outs):
        report.off(f"ScaledByStepFixed()(x) returned {type(outs[0]).__name__}, not a tensor of shape "
                   f"{tuple(base.shape)}", "return self.lin(x) / the counter.")
        return False
    err = max(max_abs_diff(o, base / k) for k, o in enumerate(outs, 1))
    if not err <= 1e-5:
        got = [round(float((base / o).flatten()[0]), 3) for o in outs]
        report.off(f"calls 1, 2, 3 divide lin(x) by {got}, not by 1, 2, 3 as ScaledByStep does eagerly",
                   "start the counter at 0 and add 1 before dividing, as ScaledByStep does.")
        return False
    report.right("eagerly it does what ScaledByStep does: call k returns lin(x) / k")
    found = check_capturable(cls().to(device), torch.randn(4, 16, device=device))
    if not found.ok:
        report.off(f"check_capturable still finds {len(found.findings)} problem(s): {_first_finding(found)}",
                   "a Python number is frozen at capture; keep the counter in a tensor: "
                   "self.register_buffer('step', torch.zeros(())) and self.step.add_(1).")
        return False
    now = dict(m.named_buffers())
    moved = [n for n, (ptr, _) in before.items() if n in now and now[n].data_ptr() != ptr]
    changed = [n for n, (_, v) in before.items() if n in now and not torch.equal(now[n].detach(), v)]
    loose = [k for k, v in vars(m).items() if isinstance(v, torch.Tensor)]
    if moved:
        report.off(f"the buffer {moved[0]!r} is a new tensor after each call: a graph keeps reading the memory it "
                   "captured, so its count would never move", f"update it in place: self.{moved[0]}.add_(1), "
                   f"not self.{moved[0]} = self.{moved[0]} + 1.")
    elif not changed:
        report.off("no buffer of the module changes when it is called" + (
            f"; the counter {loose[0]!r} is a plain tensor attribute" if loose else ""),
            "register the counter as a buffer, self.register_buffer('step', torch.zeros(())): .to(DEVICE) then "
            "moves it to the GPU with the model, and it is saved in state_dict().")
    else:
        report.right(f"check_capturable finds nothing, and the count lives in the buffer {changed[0]!r}, updated "
                     "in place")
        return True
    return False


def _clip_reference(x, max_norm=1.0):
    """The section-1-style clip with a host read, in float64: the values a fixed version must give."""
    xd = x.double()
    norm = xd.norm().item()
    return (xd * (max_norm / norm) if norm > max_norm else xd).to(x.dtype)


@exercise("05_pitfalls", 2, "clipping without reading the norm on the CPU", "cpu+gpu")
@check("05.2")
def check_clip_without_sync(report, clip_to_norm_fixed, clip_verify):
    """``clip_to_norm_fixed(x, max_norm=1.0)``: ``clip_to_norm`` (scale ``x`` down to norm ``max_norm`` when it
    is larger) without a host read; ``clip_verify``: ``verify`` of its graph against it (GPU)."""
    import torch

    from ...graphed import capture
    from ...check import check_capturable

    fn, device = clip_to_norm_fixed, "cuda" if cuda() else "cpu"
    torch.manual_seed(0)
    big = torch.randn(256, device=device) + 2.0            # norm about 36: scaled down
    small = big * (0.5 / big.norm())                       # norm 0.5: left as it is
    cases = {"an input of norm above max_norm": big, "an input of norm below max_norm": small}
    done = not is_todo(fn)
    if not done:
        report.todo("write clip_to_norm_fixed(x, max_norm=1.0)")
    else:
        outs = {name: fn(x) for name, x in cases.items()}
        if any(not isinstance(o, torch.Tensor) for o in outs.values()):
            report.todo("clip_to_norm_fixed(x) returned no tensor: its body is still the placeholder")
            done = False
        else:
            for name, x in cases.items():
                want, got = _clip_reference(x), outs[name]
                if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
                    report.off(f"on {name} it differs from clip_to_norm (max |diff| {max_abs_diff(got, want):.2g})",
                               "scale by min(1, max_norm / norm): x * torch.clamp(max_norm / (x.norm() + 1e-6), "
                               "max=1.0) gives both cases without an if.")
                    done = False
                    break
            if done:
                report.right("it gives clip_to_norm's values above and below max_norm")
                found = check_capturable(fn, big)
                if not found.ok:
                    report.off(f"check_capturable finds {len(found.findings)} problem(s): {_first_finding(found)}",
                               "no .item(), float(), or if on a tensor: the GPU must decide, with torch.clamp or "
                               "torch.where.")
                    done = False
                else:
                    report.right("check_capturable finds nothing to stop a capture")
    if not cuda():
        report.needs_gpu("capturing it, and verify() against eager, need an NVIDIA GPU")
        return
    _check_learners_verify(report, clip_verify, "clip_verify",
                           "g = capture(clip_to_norm_fixed, X); clip_verify = verify(g, clip_to_norm_fixed, X).")
    if not done:
        return
    g = capture(fn, big)
    errs = {name: max_abs_diff(g(x), _clip_reference(x)) for name, x in cases.items()}
    bad = [name for name, e in errs.items() if not e <= 1e-4 * max(1.0, float(cases[name].abs().max()))]
    if bad:
        report.off(f"one graph, captured on a large input, is wrong on {bad[0]} (max |diff| {errs[bad[0]]:.2g})",
                   "the decision must be made on the GPU at every replay, not in Python at capture.")
    else:
        report.right("one graph, captured on a large input, clips large inputs and leaves small ones alone: "
                     "the decision runs on the GPU at every replay")
