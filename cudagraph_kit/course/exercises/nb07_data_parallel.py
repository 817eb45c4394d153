"""Checks for notebook 07's exercises (data parallel); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb07_data_parallel import check_rank_spread
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo, table_rows)

__all__ = ['check_rank_spread', 'check_item_per_step']


def _rank_spread(steps) -> dict:
    """{variant: (rank_median_spread_us, step_rank_diff_p99_us)} from per-step, per-rank times, as the script
    computes them (``cudagraph_kit.ddp.jitter_summary``)."""
    from ...ddp import jitter_summary

    table = jitter_summary(steps)
    return {v: (r, p) for v, r, p in zip(table["variant"], table["rank_median_spread_us"],
                                          table["step_rank_diff_p99_us"])}


@exercise("07_data_parallel", 1, "the spread across ranks, from the raw step times", "cpu")
@check("07.1")
def check_rank_spread(report, rank_spread, local_steps):
    """``rank_spread``: ``{variant: (slowest minus fastest rank's median µs, p99 over steps of the slowest minus
    the fastest rank's step µs)}`` computed from ``local_steps`` (section 4: case, variant, rank, step, step_us)."""
    import numpy as np

    if is_todo(rank_spread):
        report.todo("rank_spread: {variant: (median spread, per-step p99 spread)} from local_steps")
        return
    want = _rank_spread(local_steps)
    if not isinstance(rank_spread, dict) or set(rank_spread) != set(want):
        report.off(f"rank_spread needs one entry per variant of local_steps, {sorted(want)}; got "
                   f"{sorted(rank_spread) if isinstance(rank_spread, dict) else type(rank_spread).__name__}",
                   "group local_steps by variant.")
        return
    ok = True
    for variant, (med, p99) in want.items():
        got = rank_spread[variant]
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            report.off(f"rank_spread[{variant!r}] must be a pair (median spread, per-step p99 spread)")
            return
        if not np.isclose(float(got[0]), med, rtol=1e-6, atol=1e-6):
            ok = False
            report.off(f"{variant}: the spread of the ranks' medians is {med:.1f} µs, you have {float(got[0]):.1f}",
                       "the median step time of each rank (groupby('rank').step_us.median()), then max - min.")
        if not np.isclose(float(got[1]), p99, rtol=1e-6, atol=1e-6):
            ok = False
            report.off(f"{variant}: the p99 over steps of (slowest - fastest rank) is {p99:.1f} µs, you have "
                       f"{float(got[1]):.1f}", "pivot to one column per rank (pivot_table(index='step', "
                       "columns='rank', values='step_us')), max - min per row, then its 0.99 quantile "
                       "(linear interpolation, the pandas default).")
    if local_steps["rank"].nunique() < 2:
        report.note("this local run had one rank (one GPU here), so every spread is 0 µs: for spreads worth reading, "
                    "run the notebook on a CPU (two gloo processes) or on a machine with two GPUs")
    if ok:
        parts = [f"{v}: medians {m:.0f} µs apart, per step up to {p:.0f} µs at the p99" for v, (m, p) in want.items()]
        report.right("your numbers are the script's: " + "; ".join(parts))
        if len(want) > 1 and "eager" in want:
            graph = next((v for v in want if v != "eager"), None)
            report.note(f"eager to {graph}: the per-step spread went from {want['eager'][1]:.0f} to "
                        f"{want[graph][1]:.0f} µs at the p99; every step of DDP waits for its slowest rank")


@exercise("07_data_parallel", 2, "what a loss.item() per step costs a graphed DDP step", "cpu+gpu")
@check("07.2")
def check_item_per_step(report, item_table, item_cost_us, keeps_lead):
    """``item_table``: ``compare`` of rows "eager", "whole-step graph" and "whole-step graph + loss.item()" (one
    process, a DDP model); ``item_cost_us``: the last two medians' difference; ``keeps_lead``: whether the graph
    with a ``loss.item()`` per step is still faster than eager (its speedup > 1)."""
    rows = table_rows(report, item_table, ["whole-step graph", "whole-step graph + loss.item()"],
                      todo="item_table = compare({'eager': ..., 'whole-step graph': step, "
                           "'whole-step graph + loss.item()': ...}, x, y, ...)",
                      missing="the table needs rows 'whole-step graph' and 'whole-step graph + loss.item()'",
                      hint="one compare() with eager first.")
    if rows is None:
        return
    graph, synced = rows
    diff = synced["median_us"] - graph["median_us"]
    if is_todo(item_cost_us):
        report.todo("item_cost_us: the '+ loss.item()' row's median_us minus the 'whole-step graph' row's")
    elif abs(float(item_cost_us) - diff) > max(0.05, 0.02 * abs(diff)):
        report.off(f"item_cost_us = {float(item_cost_us):.1f}, but the table says {diff:.1f} µs")
    else:
        report.right(f"item_cost_us agrees with the table: {diff:.1f} µs")
    if not cuda():
        report.needs_gpu("on a CPU every row is eager DDP (gloo); the graph and what a synchronize costs it need "
                         "an NVIDIA GPU")
        return
    if graph["executed_as"] != "cuda graph" or synced["executed_as"] != "cuda graph":
        report.off("a 'whole-step graph' row did not run as a CUDA graph",
                   "time the step from capture_train_step on a DDP model built with ddp_for_graphs, on the GPU.")
        return
    lead = bool(synced["speedup"] > 1)
    if is_todo(keeps_lead):
        report.todo("keeps_lead: is the '+ loss.item()' row still faster than eager (speedup > 1)?")
    elif bool(keeps_lead) != lead:
        report.off(f"keeps_lead = {keeps_lead}, but that row's speedup is {synced['speedup']:.2f}")
    else:
        report.right(f"with a loss.item() per step the graph runs at {synced['speedup']:.2f}x eager, against "
                     f"{graph['speedup']:.2f}x without: the synchronize costs {diff:.1f} µs a step, because the CPU "
                     "can no longer queue the next replay while the GPU runs this one")
