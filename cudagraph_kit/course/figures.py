"""The course's figures: each function draws one kind of picture from a ``measure`` table and returns the
matplotlib figure (the notebook shows it; ``results.save`` writes it as PNG). A figure says in its title where
it ran; a graph that ran eagerly (no GPU) is labelled so, and no speedup is drawn for it.

Example::

    from cudagraph_kit.course import figures
    fig = figures.size_sweep(sweep, crossover, "GELU eager vs CUDA graph on NVIDIA H100")
"""
from __future__ import annotations

from .measure import ran_eagerly

__all__ = ["size_sweep", "calls_per_graph"]


def size_sweep(sweep, crossover, title: str, threshold: float = 1.10):
    """Time per call of eager and graph against tensor size, with the floor, and the graph's speedup with its
    interval; ``crossover`` (a size, or None) is marked. ``sweep``: a table with a ``numel`` column
    (``verdicts.sweep_points``)."""
    import matplotlib.pyplot as plt

    eager = sweep[sweep.variant == "eager"].set_index("numel")
    graph = sweep[sweep.variant != "eager"].set_index("numel")
    graphs_ran = not any(ran_eagerly(graph))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    ax1.loglog(eager.index, eager.median_us, "o-", label="eager")
    ax1.loglog(graph.index, graph.median_us, "s-",
               label="CUDA graph replay" if graphs_ran else "graph (eager fallback: no GPU)")
    if graph.floor_us.notna().any():
        ax1.loglog(graph.index, graph.floor_us, "k--", lw=1, label="floor (GPU busy, graph rows)")
    ax1.set(xlabel="elements", ylabel="time per call (µs)", title="GELU time per call")
    if graphs_ran:   # without a GPU both sides ran eagerly: no speedup to draw
        ax2.semilogx(graph.index, graph.speedup, "o-", color="C2")
        ax2.fill_between(graph.index, graph.speedup_lo, graph.speedup_hi, color="C2", alpha=0.2,
                         label="90% prediction interval (windows)")
        ax2.legend(loc="upper right")
    else:
        ax2.text(0.5, 0.5, "no graph ran (no GPU)", ha="center", transform=ax2.transAxes)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(xlabel="elements", ylabel="eager / graph", title="speedup of the graph")
    if crossover:
        for ax in (ax1, ax2):
            ax.axvline(crossover, color="C3", ls=":", lw=1.5)
        ax2.annotate(f"crossover: {crossover:,}\n(≤ {threshold - 1:.0%} gain from here)",
                     (crossover, graph.speedup.max() * 0.8), color="C3", ha="right", xytext=(-8, 0),
                     textcoords="offset points")
    ax1.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def calls_per_graph(table, title: str, factor: float = 1.3):
    """Time per call against the number of calls captured per graph (graph rows have a ``calls_per_graph``
    column), with the floor and ``factor`` x the floor where the profiler measured one."""
    import matplotlib.pyplot as plt

    graphed = table[table.calls_per_graph.notna()]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar([str(int(k)) for k in graphed.calls_per_graph], graphed.median_us, color="C1", label="time per call")
    if graphed.floor_us.notna().any():
        ax.axhline(graphed.floor_us.median(), color="k", ls="--", lw=1, label="floor (GPU busy)")
        ax.axhline(factor * graphed.floor_us.median(), color="grey", ls=":", lw=1, label=f"{factor:g} × floor")
    ax.set(xlabel="GELU calls captured per graph", ylabel="µs per call", title=title)
    ax.legend()
    fig.tight_layout()
    return fig
