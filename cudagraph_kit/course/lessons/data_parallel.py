"""What notebook 07 reads from its data-parallel runs: the recorded two-GPU sweep put in a few sentences per model
(throughput, the CPU's time to issue a step, the spread of step times), its takeaways, and, for a learner without
a GPU, what the recorded GPU run saw in each cell that needs one.

The numbers come from the saved results (``results.load``) and from ``issue_times`` of ``scripts/ddp_train.py``
(passed in: the course does not import the scripts).

Example::

    from cudagraph_kit.course.lessons.data_parallel import recorded_outcome, sweep_pairs, sweep_sentences
    print(recorded_outcome(results.load("07_data_parallel"), "demo"))
    pairs = sweep_pairs(rec.df, ddp_train.issue_times(pd.read_csv(rec.dir / "steps.csv.gz")))
    print(sweep_sentences(pairs, rec.df))
"""
from __future__ import annotations

import textwrap

__all__ = ["recorded_outcome", "sweep_pairs", "sweep_sentences", "sweep_takeaways"]


def _label(rec) -> str:
    ranks = rec.env.get("world_size")
    gpus = f"{ranks} x {rec.env.get('gpu')}" if ranks and ranks > 1 else rec.env.get("gpu")
    return f"Recorded on {gpus or 'a GPU'}, {str(rec.env.get('date'))[:10]}"


def recorded_outcome(rec, cell: str) -> str:
    """What the recorded GPU run of notebook 07 (``rec``: ``results.load("07_data_parallel")``, None if absent) saw
    in ``cell``: ``"demo"`` (graphed DDP against eager DDP in one process), ``"rule 1"`` (the kit's refusal of a
    process group made with NCCL's async error handling on) or ``"local"`` (the local torchrun run), in a few lines
    labelled with its GPU and date."""
    if rec is None or rec.env.get("executed_as") != "cuda":
        return "Needs an NVIDIA GPU, and no recorded GPU run of this notebook was found."
    head = f"Needs an NVIDIA GPU. {_label(rec)}:"
    if cell == "demo":
        diff, mode = rec.env.get("demo_max_param_diff"), rec.env.get("demo_mode")
        return (f"{head} the kit's step ran as a {'CUDA graph' if mode == 'graph' else mode}; max |param diff| "
                f"against eager DDP = {diff:.3g}" if diff is not None else f"{head} the check was not recorded.")
    if cell == "rule 1":
        said = rec.env.get("rule1_error")
        return (f"{head} the kit refused with: {textwrap.shorten(said, 400)}" if said else
                f"{head} this run kept no copy of the kit's message (runs from now on save it).")
    if cell == "local":
        lines = [f"{r.variant}: median step {r.median_us:,.0f} µs, p99 {r.p99_us:,.0f} µs, {r.images_per_s:,.0f} "
                 f"samples/s over {r.ranks} rank(s), executed as {r.executed_as}" for r in rec.df.itertuples()]
        return "\n".join([head, *lines])
    raise ValueError(f"unknown cell {cell!r}: 'demo', 'rule 1' or 'local'")


def sweep_pairs(df, issue) -> dict:
    """{model label: (eager row, graph row, eager issue row, graph issue row)} of the recorded sweep (``df``, its
    results), without the runs that synchronize each step; ``issue``: ``ddp_train.issue_times`` of its steps."""
    issue = issue.set_index(["case", "variant"])
    pairs = {}
    for model_name, label in (("mlp", "MLP"), ("resnet50", "ResNet-50")):
        sub = df[(df.model == model_name) & ~df.variant.str.contains("sync")]
        eager, graph = sub[sub.variant == "eager"], sub[sub.variant.str.startswith("whole-step graph")]
        if not eager.empty and not graph.empty:
            e, g = eager.iloc[0], graph.iloc[0]
            pairs[label] = (e, g, issue.loc[(e.case, e.variant)], issue.loc[(g.case, g.variant)])
    return pairs


def _unit(label: str) -> str:
    """What one sample of the model is: an image for ResNet-50, a row of features for the MLP."""
    return "images/s" if label == "ResNet-50" else "samples/s"


def _bound(i) -> str:
    return "CPU-bound" if i.cpu_bound else "the CPU gets ahead"


def sweep_sentences(pairs, df) -> str:
    """The recorded sweep in a few sentences per model (``pairs`` from ``sweep_pairs``): throughput, the slowest
    rank's CPU time to issue a step against the step (CPU-bound at 80% or more), how long the eager GPU waited for
    a CPU where the graphed step is not CPU-bound, and the spread of step times across steps and ranks; then the
    runs that synchronize each step."""
    out = []
    for label, (e, g, ie, ig) in pairs.items():
        waited = (f" The eager GPU waited for a CPU about {1 - g.median_us / e.median_us:.0%} of the eager step."
                  if not ig.cpu_bound and g.median_us < e.median_us else "")
        out.append(textwrap.fill(
            f"{label}: {e.images_per_s:,.0f} -> {g.images_per_s:,.0f} {_unit(label)} ({g.throughput_speedup:.2f}x). "
            f"Issuing a step took the slowest rank's CPU {ie.issue_us:,.0f} µs eager ({ie.issue_share:.0%} of the "
            f"step: {_bound(ie)}) and {ig.issue_us:,.0f} µs graphed ({ig.issue_share:.0%}: {_bound(ig)}).{waited} "
            f"Step time, eager -> graph: median {e.median_us:,.0f} -> {g.median_us:,.0f} µs, p99 {e.p99_us:,.0f} -> "
            f"{g.p99_us:,.0f} µs; per step the slowest rank trailed the fastest by {e.step_rank_diff_p99_us:,.0f} -> "
            f"{g.step_rank_diff_p99_us:,.0f} µs at the p99.", 110))
    synced = df[df.variant.str.contains("sync")]
    if len(synced):
        out.append("MLP with a synchronize per step: " + ", ".join(
            f"{r.variant.split(',')[0]} {r.throughput_speedup:.2f}x" for r in synced.itertuples())
            + " of the throughput of eager without one.")
    return "\n\n".join(out)


def sweep_takeaways(pairs, df) -> list[str]:
    """Notebook 07's takeaways from the recorded sweep, each a lesson with the numbers that show it."""
    lines = []
    if pairs:
        lines.append("Throughput with a whole-step graph, eager -> graph: " + "; ".join(
            f"{label} {e.images_per_s:,.0f} -> {g.images_per_s:,.0f} {_unit(label)} ({g.throughput_speedup:.2f}x), "
            f"while issuing a step took the CPU {ie.issue_share:.0%} of the step eagerly and {ig.issue_share:.0%} "
            "graphed" for label, (e, g, ie, ig) in pairs.items()) + ".")
        lines.append("A data-parallel step waits for its slowest rank, so jitter costs every rank. Per step, the slowest "
                     "rank trailed the fastest at the p99 by: " + "; ".join(
                         f"{label} {e.step_rank_diff_p99_us:,.0f} µs eager, {g.step_rank_diff_p99_us:,.0f} µs graphed"
                         for label, (e, g, ie, ig) in pairs.items()) + ".")
    synced = df[df.variant.str.contains("sync")]
    graph = df[(df.model == "mlp") & (df.variant == "whole-step graph")]
    if len(synced) and len(graph):
        rates = ", ".join(f"{r.variant.split(',')[0]} {r.throughput_speedup:.2f}x" for r in synced.itertuples())
        lines.append("Time each rank with CUDA events, not a synchronize per step, which keeps the CPU from queueing "
                     f"ahead: on the MLP, with a synchronize per step, {rates} of the eager throughput without one "
                     f"(the graph without one: {graph.throughput_speedup.iloc[0]:.2f}x).")
    graphed = df[df.variant.str.startswith("whole-step graph")]
    if len(graphed):
        lines.append(f"Correct before fast: {int(graphed.parity_ok.sum())} of {len(graphed)} graphed runs trained "
                     "like eager DDP in their check before timing.")
    return lines
