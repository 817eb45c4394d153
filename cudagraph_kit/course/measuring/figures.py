"""The course's figures: each function draws one kind of picture from a ``measure`` table and returns the
matplotlib figure (the notebook shows it; ``results.save`` writes it as PNG). A figure says in its title where
it ran; a graph that ran eagerly (no GPU) is labelled so, and no speedup is drawn for it.

Example::

    from cudagraph_kit.course import figures
    fig = figures.size_sweep(sweep, crossover, "GELU eager vs CUDA graph on NVIDIA H100")
"""
from __future__ import annotations

from .measure import ran_eagerly

__all__ = ["shown", "size_sweep", "calls_per_graph", "loss_curves", "step_times"]


def shown(fig, stem: str, name: str):
    """Return ``fig`` to be shown where a graph ran. Where none ran (no GPU) this run's figure only shows CPU times,
    which say nothing about graphs: it is closed (``results.save`` still writes it) and the recorded GPU run's
    figure ``name`` of ``stem`` is shown instead, under a caption naming that run.

    Example::

        fig_sweep = shown(size_sweep(sweep, crossover, "GELU"), "01_gelu", "size_sweep")
    """
    import torch

    if torch.cuda.is_available():
        return fig
    import matplotlib.pyplot as plt

    from .results import show_figure

    plt.close(fig)
    show_figure(stem, name)
    return fig


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


def loss_curves(curves: dict, title: str):
    """One panel per training run: the eager loss and the graphed (or eager-fallback) loss per step, log scale.
    ``curves``: ``{case: (eager_losses, losses, mode)}``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), sharey=True, squeeze=False)
    for ax, (case, (ref_l, l, mode)) in zip(axes[0], curves.items()):
        ax.plot(ref_l.numpy(), lw=2.5, alpha=0.5, label="eager")
        ax.plot(l.numpy(), lw=1, ls="--", label="whole-step graph" if mode == "graph" else "kit, eager fallback")
        ax.set(title=case.replace("parity ", "").replace(", ", "\n", 1), xlabel="step", yscale="log")
        ax.legend()
    axes[0][0].set_ylabel("training loss (MSE)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def step_times(timing, title: str, colors: dict | None = None):
    """One bar per case and variant: time per step (log scale) with its 90% prediction interval (grey line) and
    the floor (black tick) where the profiler measured one; each graph row names its speedup."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, max(4, 0.32 * len(timing))))
    for i, r in timing.reset_index(drop=True).iterrows():
        ax.barh(i, r.median_us, color=(colors or {}).get(r.variant.replace(" (eager fallback)", ""), "grey"))
        ax.plot([r.median_pi_lo, r.median_pi_hi], [i, i], color="0.3", lw=1)  # where one more window should land
        if r.get("floor_us") == r.get("floor_us"):
            ax.plot([r.floor_us, r.floor_us], [i - 0.4, i + 0.4], "k-", lw=2)
        ax.text(r.median_us, i, f" {r.median_us:.0f} µs" + ("" if r.variant == "eager" else f" ({r.speedup:.2f}×)"),
                va="center", fontsize=8)
    ax.set_yticks(range(len(timing)), [f"{r.case} · {r.variant}" for r in timing.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set(xlabel="time per training step (µs, log scale); grey line = 90% prediction interval of the median; "
                  "black tick = floor (GPU busy)", title=title)
    fig.tight_layout()
    return fig
