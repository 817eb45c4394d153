"""The course's figures, every notebook's: each function draws one kind of picture and returns the matplotlib figure
(the notebook shows it; ``results.save`` writes it as PNG).

Each draws from a ``measure`` table or a notebook's results. A figure says in its title where it ran; a graph that
ran eagerly (no GPU) is labelled so, and no speedup is drawn for it. ``shown`` puts the recorded GPU run's figure in
place of a CPU-only one; ``show_figure`` shows a figure inline as a PNG whatever the backend.

Example::

    from cudagraph_kit.course.measuring import figures
    fig = figures.size_sweep(sweep, crossover, "GELU eager vs CUDA graph on NVIDIA H100")
"""
from __future__ import annotations

from .claims import WITHIN
from .measure import ran_eagerly
from .verdicts import strategy

__all__ = ["show_figure", "size_sweep", "calls_per_graph", "loss_curves", "step_times", "plot_times",
           "plot_inference", "plot_training", "plot_parity", "plot_memory", "plot_advise", "plot_tradeoff",
           "plot_decode", "speedups"]


def show_figure(fig):
    """Show a matplotlib figure inline as a PNG, whatever the backend, and close it (it can still be saved)."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buffer.getvalue()))


# notebook 01
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


# notebook 02
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


# notebook 03
COLORS = {"cuda graph": "tab:green", "eager": "tab:blue"}


def plot_times(df, title: str):
    """One panel per case of ``df`` (columns case, variant, executed_as, median_us, median_pi_lo/hi, floor_us):
    bars coloured by how the variant ran, the 90% prediction interval of its time as a whisker, the GPU-busy floor
    as a tick. Returns the figure.

    Example::

        fig = plot_times(df, "Time per call on an H100")
    """
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(df["case"]))
    sizes = df.groupby("case", sort=False).size()
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 0.36 * sizes.sum() + 1.2 * len(cases) + 0.8),
                             gridspec_kw={"height_ratios": [sizes[c] for c in cases]}, squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        d = df[df["case"] == case].iloc[::-1]
        y = list(range(len(d)))
        ax.barh(y, d["median_us"], color=[COLORS.get(e, "tab:gray") for e in d["executed_as"]], height=0.7)
        if {"median_pi_lo", "median_pi_hi"} <= set(d.columns) and d["median_pi_lo"].notna().any():
            ax.errorbar(d["median_us"], y, fmt="none", ecolor="black", elinewidth=0.8, capsize=2,
                        xerr=[(d["median_us"] - d["median_pi_lo"]).clip(lower=0).fillna(0),
                              (d["median_pi_hi"] - d["median_us"]).clip(lower=0).fillna(0)])
        if "floor_us" in d and d["floor_us"].notna().any():
            ax.scatter(d["floor_us"], y, marker="|", s=250, color="black", zorder=3)
        ax.set_yticks(y, [v.replace(" (eager fallback)", "") for v in d["variant"]], fontsize=8)
        top = d["median_pi_hi"].max() if "median_pi_hi" in d else float("nan")
        top = max(d["median_us"].max(), top) if top == top else d["median_us"].max()
        ax.set_xlim(0, top * 1.25)  # room for the value labels inside the axes
        for yi, v in zip(y, d["median_us"]):
            ax.text(v + top * 0.01, yi + 0.25, f"{v:.1f}", va="center", fontsize=7)
        shape = f" ({d['shape'].iloc[0]})" if "shape" in d else ""
        ax.set(xlabel="time per call (µs)")
        ax.set_title(f"{case}{shape}", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()] + [
        plt.Line2D([], [], marker="|", color="black", ls="", markersize=12)]
    fig.legend(handles, ["ran as a CUDA graph", "eager launches", "GPU-busy floor"], loc="upper right", fontsize=8,
               ncol=3, bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return fig


# notebook 04
def plot_inference(curve: dict, batches, pays: float, title: str, cuda: bool):
    """Time per batch (eager with its interval band, graph, floor, kernels x host time) and the speedup with its
    interval band, per dtype of ``curve`` ({dtype: {"eager", "graph", "host_us", "stop"}})."""
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (dname, c) in enumerate(curve.items()):
        e, g, col = c["eager"], c["graph"], f"C{i}"
        ax_t.plot(e.index, e.median_us / 1e3, "o-", color=col, label=f"{dname} eager")
        ax_t.fill_between(e.index, e.median_pi_lo / 1e3, e.median_pi_hi / 1e3, color=col, alpha=0.15)
        ax_t.plot(g.index, g.median_us / 1e3, "s-", color=col, alpha=0.6,
                  label=f"{dname} {'graph' if cuda else 'kit, eager fallback'}")
        if cuda:
            ax_t.plot(g.index, g.floor_us / 1e3, ":", color=col, label=f"{dname} floor (GPU busy)")
            if c.get("host_us") == c.get("host_us"):
                ax_t.plot(e.index, e.kernels_per_call * c["host_us"] / 1e3, "--", color=col, lw=1,
                          label=f"{dname} kernels x {c['host_us']:.1f} µs eager host time")
        ax_s.plot(g.index, g.speedup, "o-", color=col, label=f"{dname} (band: 90% prediction interval)")
        ax_s.fill_between(g.index, g.speedup_lo, g.speedup_hi, color=col, alpha=0.2)
        if c.get("stop") is not None:
            ax_s.axvline(c["stop"], color=col, ls=":", lw=1)
    ax_t.set(xscale="log", yscale="log", xlabel="batch size", ylabel="time per batch (ms)",
             title="time per batch (band: eager 90% prediction interval)")
    ax_s.axhline(pays, color="grey", lw=1, ls="--", label=f"{pays:.2f}x: the graph pays above")
    ax_s.axhline(1.0, color="black", lw=0.8)
    ax_s.set(xscale="log", yscale="log", xlabel="batch size", ylabel="speedup of the graph over eager (x)",
             title="speedup vs batch size (dotted: where the graph stops paying)")
    for ax in (ax_t, ax_s):
        ax.set_xticks(list(batches), [str(b) for b in batches])
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_training(training, graph_variant: str, title: str, footnote: str = ""):
    """Training throughput per case, eager and graph, with the graph's speedup and interval."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.45 * len(training) + 1.8))
    for i, r in enumerate(training.itertuples()):
        is_graph = r.variant.startswith(graph_variant)
        ax.barh(i, r.images_per_s, color="C1" if is_graph else "C0")
        span = f" ({r.speedup:.2f}x, {r.speedup_lo:.2f}-{r.speedup_hi:.2f}x)" if is_graph and r.speedup_lo == \
            r.speedup_lo else ""
        ax.text(r.images_per_s, i, f" {r.images_per_s:,.0f} img/s, {r.median_us / 1e3:.1f} ms{span}", va="center",
                fontsize=8)
    ax.set_yticks(range(len(training)), [f"{r.case} · {r.variant}" for r in training.itertuples()], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="training throughput (images/s)", title=title)
    ax.set_xlim(0, training.images_per_s.max() * 1.45)
    if footnote:
        fig.text(0.01, 0.005, footnote, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot_parity(losses: dict, accs: dict, title: str):
    """Loss per step and validation accuracy per epoch of the parity runs ({label: values}; the first is eager)."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(12, 4))
    for i, label in enumerate(losses):
        style = dict(lw=2.5, alpha=0.5) if i == 0 else dict(lw=1, ls="--")
        ax_l.plot(losses[label], label=label, **style)
        ax_a.plot(range(1, len(accs[label]) + 1), accs[label], "o-" if i == 0 else "s--", label=label,
                  **({"lw": 2.5, "alpha": 0.5} if i == 0 else {}))
    ax_l.set(yscale="log", xlabel="step", ylabel="training loss (cross-entropy)", title="loss per step")
    ax_a.set(xlabel="epoch", ylabel="validation accuracy", title="validation accuracy per epoch")
    for ax in (ax_l, ax_a):
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# notebook 05
def plot_memory(rows, title):
    """A bar per row of ``memory_reading``: the memory each way of pooling reserved. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar([r["variant"] for r in rows], [r["reserved_mib"] for r in rows], color=["C3", "C2"])
    ax.set(ylabel="memory reserved (MiB)", title=title)
    return fig


def plot_advise(honest, fitted, gpu_name, within=WITHIN):
    """advise's predicted speedup against the measured one: this run's predictions made before capture (with the
    measured 90% interval) and the rows fitted after the fact (hollow). None when there is nothing to plot."""
    import matplotlib.pyplot as plt

    values = [v for frame in (honest, fitted) for col in ("predicted_speedup", "measured_speedup", "measured_lo",
                                                          "measured_hi") if col in frame for v in frame[col]
              if v == v and v > 0]
    if not values:
        return None
    fig, ax = plt.subplots(figsize=(5.8, 5))
    lo, hi = min(values) * 0.8, max(values) * 1.25
    ax.fill_between([lo, hi], [lo / within, hi / within], [lo * within, hi * within], color="C2", alpha=0.15,
                    label=f"within {within:g}x")
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    for i, (source, grp) in enumerate(fitted.groupby("source", sort=False) if len(fitted) else []):
        ax.scatter(grp.measured_speedup, grp.predicted_speedup, facecolors="none", edgecolors=f"C{i + 1}",
                   label=f"{source} (recorded): fitted after the fact", zorder=3)
    if len(honest):
        ax.errorbar(honest.measured_speedup, honest.predicted_speedup,
                    xerr=[(honest.measured_speedup - honest.measured_lo).clip(lower=0),
                          (honest.measured_hi - honest.measured_speedup).clip(lower=0)],
                    fmt="o", color="C0", ecolor="C0", capsize=3, zorder=4,
                    label="this run: predicted before capture (measured: 90% interval)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured speedup (eager / graph)",
           ylabel="advise: predicted best speedup", title=f"advise vs measured on {gpu_name}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# notebook 06
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


# notebook 08
def plot_decode(step_df, gen_df, serve_df, title: str):
    """Three panels: time per decode step against the batch (with the floor), tokens per second of whole
    generations, and the serving loop's time per step per strategy."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8), layout="constrained")   # the size nbval compares
    ax = axes[0]
    for v, d in step_df.groupby("variant", sort=False):
        ran = str(d.executed_as.iloc[0])
        ax.plot(d.batch, d.us_per_step, "o-", label=v if ran in v else f"{v} (ran as {ran})")
    f = step_df.drop_duplicates("batch")
    if f.floor_step_us.notna().any():
        ax.plot(f.batch, f.floor_step_us, "k--", label="floor (GPU busy, kit graph)")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per decode step (= per token of a sequence)",
           title="decode step")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)   # below: never over a line
    ax = axes[1]
    for v, d in gen_df.groupby("variant", sort=False):
        ax.plot(d.batch, d.tokens_per_s, "o-", label=v)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens / s (whole generation)",
           title="whole generations")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax = axes[2]
    y = np.arange(len(serve_df))
    ax.barh(y, serve_df.us_per_step, color="C0")
    ax.set_yticks(y, [f"{v} ({int(g)} graphs)" for v, g in zip(serve_df.variant, serve_df.graphs.fillna(0))],
                  fontsize=7)
    for yi, (t, s) in enumerate(zip(serve_df.us_per_step, serve_df.speedup)):
        ax.text(t, yi, f" {t:.0f} µs, {s:.2f}x", va="center", fontsize=7)
    ax.set_xlim(0, 1.3 * serve_df.us_per_step.max())   # room for the labels beside the longest bar
    ax.set(xlabel="µs per decode step (median pass / steps)", title="serving loop, batch size changing every step")
    fig.suptitle(title, fontsize=11)
    return fig


# every experiment's table: the speedups with their intervals
def speedups(table, title: str, cuda: bool | None = None):
    """Each variant's speedup over its case's baseline (the case's first row, eager) with its 90% prediction
    interval, one panel per case, a line at 1x: a point with a whisker per variant, green where it ran as a CUDA
    graph, blue where it ran eagerly. ``table``: a ``measure`` table or a recorded ``results.csv`` (columns case,
    variant, speedup, speedup_pi_lo/hi or speedup_lo/hi; executed_as where known). A graph that ran eagerly (its
    label or ``executed_as`` says so; without CUDA every graph: ``cuda``, as in ``ran_eagerly``) gets no point, only
    the words "ran eagerly": its speedup would compare eager with eager. Put where the table was measured (GPU,
    date) in ``title``. Returns the figure.

    Example::

        fig = speedups(recorded.df, "Recorded on NVIDIA H100, 2026-11-27: speedup over eager")
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lo_col, hi_col = (("speedup_pi_lo", "speedup_pi_hi") if "speedup_pi_lo" in table else ("speedup_lo", "speedup_hi"))
    eager = ran_eagerly(table, cuda)
    ran_as = table["executed_as"] if "executed_as" in table else ["eager"] * len(table)
    rows = [dict(case=str(c), variant=str(v).replace(" (eager fallback)", ""), s=s, lo=lo, hi=hi, fallback=e,
                 graph=(r == "cuda graph"))
            for (c, v, s, lo, hi, r, e), first in zip(
                zip(table["case"], table["variant"], table["speedup"], table[lo_col], table[hi_col], ran_as, eager),
                ~table["case"].duplicated())
            if not first]   # each case's first row is its baseline: 1x by definition
    cases = list(dict.fromkeys(r["case"] for r in rows))
    if not cases:
        raise ValueError("speedups needs a table with at least one variant besides each case's baseline.")
    sizes = [sum(r["case"] == c for r in rows) for c in cases]
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 0.32 * sum(sizes) + 0.75 * len(cases) + 0.9),
                             gridspec_kw={"height_ratios": sizes}, squeeze=False, sharex=True)
    drawn = [r for r in rows if not r["fallback"] and r["s"] == r["s"]]
    values = [v for r in drawn for v in (r["s"], r["lo"], r["hi"]) if v == v and v > 0] + [1.0]
    left, right = min(values) / 1.5, max(values) * 3.0   # room for the value labels right of the whiskers
    for ax, case in zip(axes[:, 0], cases):
        mine = [r for r in rows if r["case"] == case][::-1]
        for y, r in enumerate(mine):
            if r["fallback"] or r["s"] != r["s"]:
                ax.text(1.0, y, "  ran eagerly: no graph result", va="center", fontsize=7, color="dimgray")
                continue
            color = "tab:green" if r["graph"] else "tab:blue"
            has_interval = r["lo"] == r["lo"] and r["hi"] == r["hi"]
            if has_interval:
                ax.errorbar(r["s"], y, xerr=[[max(r["s"] - r["lo"], 0)], [max(r["hi"] - r["s"], 0)]], fmt="o",
                            color=color, ecolor=color, elinewidth=1.2, capsize=3, markersize=5)
            else:
                ax.plot(r["s"], y, "o", color=color, markersize=5)
            text = f"{r['s']:.2f}x" + (f" ({r['lo']:.2f}-{r['hi']:.2f})" if has_interval else "")
            ax.text(max(r["hi"] if has_interval else r["s"], r["s"]) * 1.06, y, text, va="center", fontsize=7)
        ax.axvline(1.0, color="black", lw=1, ls="--")
        ax.set_yticks(range(len(mine)), [r["variant"] for r in mine], fontsize=8)
        ax.set_ylim(-0.7, len(mine) - 0.3)
        ax.set_xscale("log")
        ax.set_xlim(left, right)
        ax.set_xticks([t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if left <= t <= right])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(case, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[-1, 0].set_xlabel("speedup over the case's baseline (log scale; dashed line: 1x, as fast as the baseline)")
    handles = [plt.Line2D([], [], marker="o", color=c, ls="") for c in ("tab:green", "tab:blue")]
    fig.legend(handles, ["ran as a CUDA graph", "ran eagerly"], loc="upper right", fontsize=8, ncol=2,
               bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{title}\nwhisker: 90% prediction interval over the timing windows", fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
