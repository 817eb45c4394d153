"""Notebook 02's helpers that are bookkeeping, not the lesson: the parity row a training run records, and the
appendix study of where an eager step's time goes (its parts, timed with ``measure``, and the breakdown).

Example::

    from cudagraph_kit.course.nb02_train import parity_row, step_parts, breakdown
    row = parity_row("parity MLP ...", ref, test, base, ref_losses, losses, step, dropout=False)
    parts = step_parts(model, lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn, x, y)   # {part: fn(x, y)}
"""
from __future__ import annotations

import copy

__all__ = ["param_diff", "parity_row", "PARTS", "FB", "step_parts", "breakdown", "part_claims"]

FB = "zero_grad + forward + loss + backward"
PARTS = ("whole eager step", "zero_grad", "forward + loss", FB, "optimizer.step() alone")


def param_diff(a, b) -> float:
    """The largest absolute difference between the parameters of two copies of a network."""
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def parity_row(case, ref, test, base, ref_losses, losses, step, dropout, variant="whole-step graph") -> dict:
    """One results row for a training run through ``capture_train_step`` (``test``, ``step``) against the eager
    loop (``ref``) from the same start (``base``): parameter and loss differences, the loss statistics, how far
    the run moved from its start. No timing columns (NaN)."""
    import torch

    graph = step.mode == "graph"
    q = max(1, len(losses) // 4)
    return {
        "case": case, "variant": variant if graph else f"{variant} (eager fallback)",
        "executed_as": "cuda graph" if graph else "eager",
        "median_us": float("nan"), "speedup": float("nan"), "floor_us": float("nan"),
        "steps": len(losses), "eager_steps": step.eager_steps, "dropout": dropout,
        "max_abs_param_diff": param_diff(ref, test),
        "params_bitwise_equal": all(torch.equal(p, q) for p, q in zip(ref.parameters(), test.parameters())),
        "max_abs_loss_diff": (losses - ref_losses).abs().max().item(),
        "steps_with_different_loss": int((losses != ref_losses).sum()),
        "mean_loss_last_quarter_eager": ref_losses[-q:].mean().item(),
        "mean_loss_last_quarter_variant": losses[-q:].mean().item(),
        "moved_from_init": param_diff(ref, base),
    }


def step_parts(base, make_opt, loss_fn, x, y) -> dict:
    """One callable ``fn(x, y)`` per part of an eager training step (``PARTS``), each on its own copy of ``base``
    with its own optimizer (``make_opt(params)``), gradients and optimizer state already there."""
    parts = {}
    for name in PARTS:
        m = copy.deepcopy(base)
        o = make_opt(m.parameters())
        loss_fn(m(x), y).backward()
        o.step()
        if name == "whole eager step":
            def fn(x, y, m=m, o=o):
                o.zero_grad(set_to_none=True)
                loss_fn(m(x), y).backward()
                o.step()
        elif name == "zero_grad":
            def fn(x, y, o=o):
                o.zero_grad(set_to_none=True)
        elif name == "forward + loss":
            def fn(x, y, m=m):
                return loss_fn(m(x), y)
        elif name == FB:
            def fn(x, y, m=m, o=o):
                o.zero_grad(set_to_none=True)
                loss_fn(m(x), y).backward()
        else:
            def fn(x, y, o=o):
                o.step()
        parts[name] = fn
    return parts


def _by_window(m, case, plus, minus=()):
    """Median over the windows of ``m`` (a ``Measured``) of: the ``plus`` parts' medians minus the ``minus``
    parts', window by window (a difference of two noisy medians: it can come out negative)."""
    import statistics

    values = []
    for f in m.windows:
        us = f[f.case == case].set_index("variant").median_us
        values.append(sum(us[v] for v in plus) - sum(us[v] for v in minus))
    return float(statistics.median(values))


def breakdown(m, case):
    """The parts of ``case``'s eager step: µs (median over windows), kernels (from the profiler, GPU only), µs per
    kernel and share of the whole step; backward and optimizer.step() by difference."""
    import pandas as pd

    kern = m.table[m.table.case == case].set_index("variant").get("kernels_per_call")
    k = (lambda v: float(kern[v])) if kern is not None else (lambda v: float("nan"))  # noqa: E731
    rows = {
        "zero_grad": (["zero_grad"], [], k("zero_grad")),
        "forward + loss": (["forward + loss"], [], k("forward + loss")),
        "backward (by difference)": ([FB], ["forward + loss", "zero_grad"], k(FB) - k("forward + loss")),
        "optimizer.step() (by difference)": (["whole eager step"], [FB], k("whole eager step") - k(FB)),
        "optimizer.step() (timed alone)": (["optimizer.step() alone"], [], k("optimizer.step() alone")),
        "whole eager step": (["whole eager step"], [], k("whole eager step")),
    }
    whole = _by_window(m, case, ["whole eager step"])
    out = []
    for part, (plus, minus, kernels) in rows.items():
        us = _by_window(m, case, plus, minus)
        out.append({"part": part, "µs": us, "kernels": kernels,
                    "µs per kernel": us / kernels if kernels == kernels and kernels > 0 else float("nan"),
                    "share of the step": us / whole})
    return pd.DataFrame(out)


def part_claims(m, case, key, label):
    """Two claims on ``case``'s parts, window by window: the step without optimizer.step() is faster than the
    whole step (``optimizer_step_adds_time_<key>``), forward + loss alone is faster than it with backward
    (``backward_adds_time_<key>``)."""
    from .claims import versus

    return [versus(m, f"optimizer_step_adds_time_{key}", (case, FB), (case, "whole eager step"),
                   subject=f"eager {label}: the step without optimizer.step()", than="the whole step"),
            versus(m, f"backward_adds_time_{key}", (case, "forward + loss"), (case, FB),
                   subject=f"eager {label}: forward + loss alone", than="forward + loss with zero_grad and backward")]
