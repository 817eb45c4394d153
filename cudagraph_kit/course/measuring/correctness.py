"""Does a graphed run compute what the eager run does?

The parameter and loss differences of two training runs from one start (notebook 02's parity row, ``param_diff``),
the loss check of a graphed training step against the eager one and the final-parameter comparison (notebook 04),
and the accuracy-parity rows of notebook 04's results.

Example::

    from cudagraph_kit.course.measuring.correctness import param_diff, parity_row
    row = parity_row("parity MLP ...", ref, test, base, ref_losses, losses, step, dropout=False)
    param_diff(ref, test)          # 0.0: the graphed run moved the weights exactly as eager did
"""
from __future__ import annotations

import torch

__all__ = ["param_diff", "parity_row", "PARITY_COLUMNS", "check_losses", "compare_params", "parity_rows"]


def param_diff(a, b) -> float:
    """The largest absolute difference between the parameters of two copies of a network."""
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


PARITY_COLUMNS = {"case": "case", "max_abs_param_diff": "largest parameter difference",   # parity_row's columns as
                  "params_bitwise_equal": "bitwise equal", "steps_with_different_loss": "steps with another loss",
                  "mean_loss_last_quarter_eager": "last-quarter loss, eager",             # a table shows them
                  "mean_loss_last_quarter_variant": "last-quarter loss, graph"}


def parity_row(case, ref, test, base, ref_losses, losses, step, dropout, variant="whole-step graph") -> dict:
    """One results row for a training run through ``capture_train_step`` (``test``, ``step``) against the eager
    loop (``ref``) from the same start (``base``): parameter and loss differences, the loss statistics, how far
    the run moved from its start. No timing columns (NaN)."""
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


def check_losses(eager, step, x, y, steps: int):
    """Run ``steps`` eager steps and ``steps`` graphed steps from the same weights on the same batch; return the
    losses (eager, graphed) and their largest relative difference. The first step must match (same weights); later
    steps may drift for AdamW, which is the default implementation eagerly and ``capturable=True`` in the graph (two
    orderings of one update, rounded differently; 6% after 6 steps on one repeated batch, seen on an H200). A wrong
    graph (stale input, frozen LR, missing step) is off by far more than the 10% allowed."""
    le = torch.stack([eager(x, y) for _ in range(steps)]).float().cpu()
    lg = torch.stack([step(x, y) for _ in range(steps)]).float().cpu()
    rel = ((lg - le).abs() / le.abs()).max().item()
    assert abs(lg[0] - le[0]) <= 1e-3 * abs(le[0]), f"first step differs: eager {le[0]:.5f}, graph {lg[0]:.5f}"
    assert rel < 0.1, f"graphed training diverged from eager: {le.tolist()} vs {lg.tolist()}"
    return le, lg, rel


def compare_params(a, b):
    """(largest |difference| between the two models' parameters, whether they are bitwise equal)."""
    return param_diff(a, b), all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def parity_rows(runs: dict, labels: dict, steps_per_epoch: int, finals: dict):
    """The accuracy-parity rows of results.csv: validation accuracy and mean training loss per epoch of every run
    (``runs[name] = {"losses", "accs", "graphed"}``, shown as ``labels[name]``), then the final-parameter
    comparisons (``finals[name] = dict of columns``)."""
    import pandas as pd

    nan = float("nan")
    rows = []
    for name, run in runs.items():
        for epoch, acc in enumerate(run["accs"], 1):
            q = run["losses"][(epoch - 1) * steps_per_epoch: epoch * steps_per_epoch]
            rows.append({"case": f"parity digits CNN epoch {epoch}", "variant": labels[name],
                         "executed_as": run["executed_as"], "median_us": nan, "speedup": nan, "floor_us": nan,
                         "section": "accuracy parity", "epoch": epoch, "val_acc": acc, "train_loss": q.mean().item()})
    for name, cols in finals.items():
        rows.append({"case": f"parity digits CNN final parameters, {name}", "median_us": nan, "speedup": nan,
                     "floor_us": nan, "section": "accuracy parity", **cols})
    return pd.DataFrame(rows)
