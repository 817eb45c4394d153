"""Notebook 06's parts that are not the lesson: the trade-off figure, reading the pool of reduce-overhead's CUDA graph
trees, and the label helpers.

Example::

    from cudagraph_kit.course.nb06_parts import plot_tradeoff, strategy
    strategy("steps of 8 (default) (eager fallback)")   # 'steps of 8 (default)'
    phrase("steps of 8 (default)")                      # 'the default ladder (steps of 8)'
"""
from __future__ import annotations

__all__ = ["plot_tradeoff", "graph_trees_pool_bytes", "strategy", "phrase", "window_medians"]


def strategy(label: str) -> str:
    """A variant's strategy: its label without the "(eager fallback)" a CPU run adds."""
    return str(label).replace(" (eager fallback)", "")


_PHRASES = {"exact sizes": "one graph per size", "single bucket": "a single bucket", "default ladder": "the default ladder",
            "planned": "the planned bucket set", "planned at the best ladder's limits": "the planned bucket set",
            "reduce-overhead, dynamic=True": "reduce-overhead with dynamic=True"}


def phrase(label: str) -> str:
    """A strategy's label as a singular noun phrase for a claim's sentence ("X is 2x faster than Y"): the table's
    short labels ("steps of 8 (default)", "reduce-overhead, dynamic=True") read as plurals or lists there."""
    s = strategy(label)
    base = s.removesuffix(" (default)")
    if base == "pow2" or base.startswith("steps of "):   # a fixed ladder; the kit's default says so
        spacing = "powers of two" if base == "pow2" else base
        return f"the default ladder ({spacing})" if s != base else f"the ladder in {spacing}"
    return _PHRASES.get(s, s)


def window_medians(frames, case, variant) -> str:
    """One variant's median time in each window, ";"-joined (what ``ratio_across_windows`` compares)."""
    return ";".join(f"{float(f[(f.case == case) & (f.variant == variant)].median_us.iloc[0]):.10g}" for f in frames)


def graph_trees_pool_bytes():
    """Bytes reserved by the pool of reduce-overhead's CUDA graph trees on this GPU, or None where not readable.

    One pool per GPU and thread, created by the graph trees' manager and shared by every function compiled with
    mode="reduce-overhead" in the thread (torch/_inductor/cudagraph_trees.py: CUDAGraphTreeManager)."""
    import torch

    from ..memory import pool_usage

    try:
        from torch._inductor import cudagraph_trees  # private API: it may move between PyTorch versions
        manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        pool = tuple(manager.cuda_graphs_thread_pool)
    except Exception:
        return None
    return pool_usage().get(pool, {}).get("reserved")


def plot_tradeoff(df, info, curve, trees_pool_mib, models, order, cuda):
    """Time, padding and memory of every strategy of each model, one row of three panels per model: time per
    request against graphs captured (with the prediction interval of the median pass), padded rows with the
    planner's curve, memory held and setup time (``order``: the bucketed strategies, in the legend's order)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import torch

    names = list(models)
    style = {s: (f"C{i}", "osD^v<>P*X"[i % 10]) for i, s in enumerate(order)}   # the same in every panel
    line_style = [("k", "-"), ("C8", "--"), ("C9", ":")]
    fig, axes = plt.subplots(len(names), 3, figsize=(21, 6.4 * len(names)), squeeze=False, layout="constrained",
                             gridspec_kw={"width_ratios": [1.15, 0.95, 1.35]})
    for row, name in enumerate(names):
        d = df[df.case == name].copy()
        d["strategy"] = d.variant.map(strategy)
        buckets = d[d.strategy.isin(order)].copy()
        # strategies with the same number of graphs are drawn a little apart (x 1.06 per neighbour), not on top
        same = buckets.groupby("graphs")
        buckets["x"] = buckets.graphs * 1.06 ** (same.cumcount() - (same.graphs.transform("size") - 1) / 2)
        ax = axes[row][0]
        for r in buckets.itertuples():
            color, marker = style[r.strategy]
            lo, hi = getattr(r, "us_per_request_lo", float("nan")), getattr(r, "us_per_request_hi", float("nan"))
            yerr = ([[max(r.us_per_request - lo, 0)], [max(hi - r.us_per_request, 0)]] if lo == lo and hi == hi
                    else None)
            ax.errorbar([r.x], [r.us_per_request], yerr=yerr, fmt=marker, color=color, ms=7, capsize=3,
                        label=f"{r.strategy} ({r.graphs:.0f} graphs)")
        for (color, ls), r in zip(line_style, d[~d.strategy.isin(order)].itertuples()):
            ax.axhline(r.us_per_request, color=color, ls=ls, lw=1.3, label=f"{r.strategy} ({r.executed_as})")
            lo, hi = getattr(r, "us_per_request_lo", float("nan")), getattr(r, "us_per_request_hi", float("nan"))
            if lo == lo and hi == hi:
                ax.axhspan(lo, hi, color=color, alpha=0.10, lw=0)
        ax.set_xscale("log")
        ax.set(xlabel="graphs captured", ylabel="µs per request (median pass / requests)", title=f"{name}: time")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)

        ax = axes[row][1]
        for r in buckets.itertuples():
            color, marker = style[r.strategy]
            ax.plot([r.x], [100 * r.pad_fraction], marker, color=color, ms=7)
        ax.plot([], [], "o", color="0.5", label="a strategy, on the stream (markers as in the time panel)")
        ax.plot([k for k, _ in curve], [100 * p.pad_fraction for _, p in curve], "-", color="C3", lw=1,
                label="planner's least padding, on the history")
        ax.set_xscale("log")
        ax.set(xlabel="graphs captured", ylabel="padded rows, % of computed rows", title=f"{name}: padding")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)

        ax = axes[row][2]
        mem = pd.DataFrame([{"strategy": k, **v} for k, v in info[name].items()])
        bars = [(k, g, m, s_) for k, g, m, s_ in zip(mem.strategy, mem.graphs, mem.held_mib, mem.setup_s)]
        if trees_pool_mib == trees_pool_mib:   # one pool for every compiled variant of both models
            bars.append(("reduce-overhead: graph trees' pool", float("nan"), trees_pool_mib, float("nan")))
        top = max([m for _, _, m, _ in bars if m == m] or [1.0])
        for yi, (k, g, m, s_) in enumerate(bars):
            shared_trees = k.startswith("reduce-overhead: graph trees")
            color = "C3" if "one pool per graph" in k else "C8" if shared_trees else "C0"
            ax.barh(yi, m if m == m else 0, color=color, hatch="//" if shared_trees else None)
            if shared_trees:
                text = f"{m:.0f} MiB, all compiled variants of both models together"
            elif m == m:
                text = f"{m:.0f} MiB, setup {s_:.2f} s"
            elif cuda:
                text = f"not measurable here (one shared pool), setup {s_:.2f} s"
            else:
                text = f"no GPU memory (CPU run), setup {s_:.2f} s"
            ax.text((m if m == m else 0) + 0.02 * top, yi, text, va="center", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        ax.set_yticks(range(len(bars)), [k if g != g else f"{k}, {g:.0f} graphs" for k, g, _, _ in bars], fontsize=8)
        ax.set_xlim(0, 2.3 * top)
        ax.invert_yaxis()
        ax.set(xlabel="memory held, MiB (pools + static buffers)", title=f"{name}: memory and setup time")
    where = df["device"].iloc[0]
    note = "" if cuda else " (CPU, eager only: not a GPU result)"
    fig.suptitle(f"Variable batch sizes: buckets, planner, reduce-overhead. {where}, PyTorch {torch.__version__}{note}",
                 fontsize=12)  # the constrained layout keeps the legends below the axes inside the figure
    return fig
