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


def _label(env: dict) -> str:
    """"Recorded on <ranks> x <GPU>, <date>" from a recorded run's ``env``."""
    ranks = env.get("world_size")
    gpus = f"{ranks} x {env.get('gpu')}" if ranks and ranks > 1 else env.get("gpu")
    return f"Recorded on {gpus or 'a GPU'}, {str(env.get('date'))[:10]}"


def recorded_outcome(rec, cell: str) -> str:
    """What the recorded GPU run of notebook 07 (``rec``: ``results.load("07_data_parallel")``, None if absent) saw
    in ``cell``: ``"demo"`` (graphed DDP against eager DDP in one process), ``"rule 1"`` (the kit's refusal of a
    process group made with NCCL's async error handling on) or ``"local"`` (the local torchrun run), in a few lines
    labelled with its GPU and date."""
    recorded = rec is not None and rec.env.get("executed_as") == "cuda"
    if cell == "rule 1":  # the kit's message, recorded on a GPU or else from its check (no GPU needed)
        said = rec.env.get("rule1_error") if recorded else None
        head = "Rule 1 is about NCCL, which needs an NVIDIA GPU (gloo, on the CPU, has no such setting). "
        if not said:
            return textwrap.fill(head + "No recorded GPU run of this cell was found: on a GPU it prints the kit's "
                                 "refusal.", 110)
        return textwrap.fill(head + f"{_label(rec.env)}, the kit refused with:", 110) + "\n" + textwrap.fill(said, 110)
    if not recorded:
        return "Needs an NVIDIA GPU, and no recorded GPU run of this notebook was found."
    head = f"Needs an NVIDIA GPU. {_label(rec.env)}:"
    if cell == "demo":
        diff, mode = rec.env.get("demo_max_param_diff"), rec.env.get("demo_mode")
        return (f"{head} the kit's step ran as a {'CUDA graph' if mode == 'graph' else mode}; max |param diff| "
                f"against eager DDP = {diff:.3g}" if diff is not None else f"{head} the check was not recorded.")
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


def _synced_rates(synced) -> str:
    """"eager ran at 0.85x and the graph at 7.46x" for the runs that synchronize each step."""
    return " and ".join(f"{'eager ran' if r.variant.startswith('eager') else 'the graph'} at "
                        f"{r.throughput_speedup:.2f}x" for r in synced.itertuples())


def _bound(i) -> str:
    return "CPU-bound" if i.cpu_bound else "the CPU gets ahead"


def sweep_sentences(pairs, df, env: dict | None = None) -> str:
    """The recorded sweep in a few sentences per model (``pairs`` from ``sweep_pairs``): throughput, the slowest
    rank's CPU time to issue a step against the step (CPU-bound at 80% or more), how long the eager GPU waited for
    a CPU where the graphed step is not CPU-bound, and the spread of step times across ranks (the table gives it
    across steps); then the runs that synchronize each step. ``env``: the recorded run's, to name its GPUs and date first."""
    out = []
    for label, (e, g, ie, ig) in pairs.items():
        waited = (f" The eager GPU waited for a CPU about {1 - g.median_us / e.median_us:.0%} of the eager step."
                  if not ig.cpu_bound and g.median_us < e.median_us else "")
        out.append(textwrap.fill(
            f"{label}: {e.images_per_s:,.0f} -> {g.images_per_s:,.0f} {_unit(label)} ({g.throughput_speedup:.2f}x). "
            f"Issuing a step took the slowest rank's CPU {ie.issue_us:,.0f} µs eager ({ie.issue_share:.0%} of the "
            f"step: {_bound(ie)}) and {ig.issue_us:,.0f} µs graphed ({ig.issue_share:.0%}: {_bound(ig)}).{waited} "
            f"Across ranks, eager -> graph: in 99% of the steps the slowest rank trailed the fastest by at most "
            f"{e.step_rank_diff_p99_us:,.0f} -> {g.step_rank_diff_p99_us:,.0f} µs.", 110))
    synced = df[df.variant.str.contains("sync")]
    if len(synced):
        out.append(f"MLP with a synchronize per step: {_synced_rates(synced)} the throughput of eager without one.")
    return (f"{_label(env)}:\n" if env is not None else "") + "\n\n".join(out)


def sweep_takeaways(pairs, df) -> list[str]:
    """Notebook 07's takeaways from the recorded sweep, each a lesson with the numbers that show it."""
    lines = []
    if pairs:
        models = pairs.values()
        lines.append("A whole-step graph multiplied the throughput by " + " and ".join(
            f"{g.throughput_speedup:.2f}x ({label}, {g.images_per_s:,.0f} {_unit(label)})"
            for label, (e, g, ie, ig) in pairs.items()) + ". Issuing a step took the CPU "
            + " and ".join(f"{ie.issue_share:.0%}" for e, g, ie, ig in models) + " of the step eagerly, "
            + " and ".join(f"{ig.issue_share:.0%}" for e, g, ie, ig in models) + " graphed.")
        lines.append("A data-parallel step waits for its slowest rank, so jitter costs every rank. In 99% of the "
                     "steps, the slowest rank trailed the fastest by at most: " + "; ".join(
                         f"{label} {e.step_rank_diff_p99_us:,.0f} µs eager, {g.step_rank_diff_p99_us:,.0f} µs graphed"
                         for label, (e, g, ie, ig) in pairs.items()) + ".")
    synced = df[df.variant.str.contains("sync")]
    graph = df[(df.model == "mlp") & (df.variant == "whole-step graph")]
    if len(synced) and len(graph):
        lines.append("Time each rank with CUDA events, not a synchronize per step: a synchronize keeps the CPU from "
                     f"queueing ahead. On the MLP with a synchronize per step, {_synced_rates(synced)} the throughput "
                     f"of eager without one (the graph without one: {graph.throughput_speedup.iloc[0]:.2f}x).")
    graphed = df[df.variant.str.startswith("whole-step graph")]
    if len(graphed):
        lines.append(f"Correct before fast: {int(graphed.parity_ok.sum())} of {len(graphed)} graphed runs trained "
                     "like eager DDP in their check before timing.")
    return lines
