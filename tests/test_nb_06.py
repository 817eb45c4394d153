"""Notebook 06 (variable shapes) executed by papermill, small; assertions on what it recorded."""
import json
import statistics

import pandas as pd
import pytest
import torch

from cudagraph_kit.intervals import prediction_interval

pytestmark = pytest.mark.notebook
HAS_CUDA = torch.cuda.is_available()
MODELS = ["MLP", "transformer block"]


def test_variable_shapes_notebook_records_correct_and_honest_results(run_notebook):
    folder = run_notebook("06_variable_shapes", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    max_rows, requests = env["max_rows"], env["requests"]
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us", "us_per_request", "p50_us",
            "p99_us", "graphs", "setup_s", "held_mib", "pad_fraction", "eager_overflows", "max_rel_err",
            "bucket_sizes", "graph_launches_per_request"} <= set(df.columns)
    strategy = df.variant.str.replace(" (eager fallback)", "", regex=False)

    for model in MODELS:
        main = df[df.case == model].assign(strategy=strategy)
        by = main.set_index("strategy")
        # eager is the baseline of the interleaved comparison
        assert main.variant.iloc[0] == "eager" and main.speedup.iloc[0] == 1.0
        assert {"exact sizes", "single bucket", "planned"} <= set(main.strategy)
        assert main.strategy.str.contains(r"\(default\)|default ladder").sum() == 1
        assert (main.median_us > 0).all() and (main.p99_us >= main.p50_us).all()
        # correct before fast: every variant agreed with eager on the whole stream
        assert (main.max_rel_err < 1e-3).all(), main[["variant", "max_rel_err"]]
        # what the buckets did on one pass over the stream
        buckets = main[main.bucket_sizes.notna()]
        assert len(buckets) >= 5
        assert by.loc["exact sizes", "graphs"] == max_rows and by.loc["exact sizes", "pad_fraction"] == 0
        assert by.loc["single bucket", "graphs"] == 1
        assert by.loc["single bucket", "pad_fraction"] >= by.loc["planned", "pad_fraction"] >= 0
        assert by.loc["single bucket", "pad_fraction"] > by.loc["exact sizes", "pad_fraction"]
        assert (buckets.pad_fraction < 1).all()
        assert (buckets.eager_overflows >= 1).all() and by.loc["eager", "eager_overflows"] == 0
        for sizes in buckets.bucket_sizes:
            sizes = [int(s) for s in str(sizes).split()]
            assert sizes == sorted(sizes) and sizes[-1] == max_rows
        # planned vs the best fixed ladder, in one comparison each, with the same number of graphs or fewer
        h2h = df[df.case == f"{model}: planned vs best fixed ladder"]
        assert len(h2h) == 2 and h2h.speedup.iloc[0] == 1.0 and h2h.graphs.iloc[1] <= h2h.graphs.iloc[0]
        # the ledger's rows
        assert "default ladder, one pool per graph" in set(df[df.case == f"{model}: memory"].variant)
    # the planner's curve: more graphs allowed never means more padding; 1 graph is the single bucket
    curve = df[df.case == "planner curve"].sort_values("graphs")
    assert len(curve) >= 3 and curve.pad_fraction.is_monotonic_decreasing
    assert curve.bucket_sizes.iloc[0] == str(max_rows) and curve.pad_fraction.iloc[0] > curve.pad_fraction.iloc[-1]

    if HAS_CUDA:
        assert env["executed_as"] == "cuda" and env["gpu"]
        main = df[df.case.isin(MODELS)].assign(strategy=strategy)
        graphed = main[main.bucket_sizes.notna()]
        assert (graphed.executed_as == "cuda graph").all() and (main[main.variant == "eager"].executed_as == "eager").all()
        # one graph launch per request, except the requests above the largest bucket
        expected = (requests - graphed.eager_overflows) / requests
        assert ((graphed.graph_launches_per_request - expected).abs() < 1e-6).all()
        assert (graphed.held_mib > 0).all() and (graphed.setup_s > 0).all()
        assert env["evidence"] and env["planned_vs_best"]
        ro = main[main.variant.str.startswith("reduce-overhead")]
        assert len(ro) == 4 and (ro.executed_as == "cuda graph").all()
    else:
        # honest labels: nothing that ran on the CPU is called a graph, and no GPU memory is made up
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
        assert (df[df.median_us.notna()].executed_as == "eager").all()
        bucketed = df[df.bucket_sizes.notna() & df.median_us.notna()]
        assert bucketed.variant.str.endswith("(eager fallback)").all()
        assert df.held_mib.isna().all() and df.graph_launches_per_request.isna().all()
        assert not df.variant.str.startswith("reduce-overhead").any()
    assert (folder / "tradeoff.png").stat().st_size > 10_000

    # every time is the median of timing windows with a prediction interval (smoke run: 2 windows each), the
    # head-to-head included
    timed = df[df.median_us.notna()]
    assert len(timed) == len(df[df.case.isin(MODELS)]) + 4
    assert (timed.windows == 2).all() and (timed.window_speedups.str.count(";") == 1).all()
    assert (timed.speedup_lo <= timed.speedup).all() and (timed.speedup <= timed.speedup_hi).all()
    assert (timed.median_pi_lo <= timed.median_us).all() and (timed.median_us <= timed.median_pi_hi).all()
    assert ((timed.speedup_lo < timed.speedup_hi) | (timed.speedup == 1.0)).all()  # an interval, not a point

    def medians(r):  # one variant's median time in each window
        return [float(v) for v in str(r.window_medians_us).split(";")]

    for r in timed.itertuples():
        assert len(medians(r)) == 2 and r.median_us == pytest.approx(statistics.median(medians(r)))
        assert (r.median_pi_lo, r.median_pi_hi) == pytest.approx(prediction_interval(medians(r)))

    # the comparative sentences are claims computed from those intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv")
    pairs = {"default_ladder_beats_single_bucket": ("default", "single bucket"),
             "planned_beats_default_ladder": ("planned", "default")}
    vs_eager = {"default_ladder_beats_eager": "default", "single_bucket_beats_eager": "single bucket"}
    if HAS_CUDA:
        vs_eager.update({"reduce_overhead_beats_eager": "reduce-overhead",
                         "reduce_overhead_dynamic_beats_eager": "reduce-overhead, dynamic=True"})
        pairs.update({"default_ladder_beats_reduce_overhead": ("default", "reduce-overhead"),
                      "default_ladder_beats_reduce_overhead_dynamic": ("default", "reduce-overhead, dynamic=True")})
    expected = {f"{m}_{c}" for m in ("mlp", "block") for c in [*vs_eager, *pairs, "planned_beats_best_ladder"]}
    if HAS_CUDA and hasattr(torch.cuda.memory, "_set_allocator_settings"):
        expected.add("block_expandable_segments_saves_memory")
    assert set(claims.claim) == expected and len(claims) == len(expected)
    assert list(claims.columns) == ["claim", "statement", "verdict", "lo", "hi", "above"]
    for c in claims.itertuples():  # the verdict is the one its interval implies, and the sentence says so
        measured = c.lo == c.lo and c.hi == c.hi
        assert not measured or c.lo <= c.hi
        verdict = ("unclear" if not measured else "holds" if c.lo > c.above else "fails" if c.hi <= c.above
                   else "unclear")
        if not HAS_CUDA:  # the buckets ran eagerly: no verdict about a graph
            assert c.verdict == "eager fallback" and "ran eagerly" in c.statement, c
            continue
        assert c.verdict == verdict, c
        assert not any(w in c.statement.split() for w in ("holds", "fails", "nan")), c.statement  # plain words
    claim = claims.set_index("claim")
    # each strategy is named in the sentences as a singular noun phrase (verdicts.phrase), never a bare label
    # such as "steps of 8 (default)" before "is"
    for m, model in (("mlp", "MLP"), ("block", "transformer block")):
        assert claim.loc[f"{m}_default_ladder_beats_eager", "statement"].startswith(f"{model}: the default ladder")
        assert claim.loc[f"{m}_single_bucket_beats_eager", "statement"].startswith(f"{model}: a single bucket")
        assert claim.loc[f"{m}_planned_beats_best_ladder", "statement"].startswith(f"{model}: the planned bucket set")

    def row(model, which):  # a variant of the stream comparison, "default" meaning that run's default ladder
        main = df[df.case == model]
        s = main.variant.str.replace(" (eager fallback)", "", regex=False)
        picked = main[s.str.contains(r"\(default\)|^default ladder$") if which == "default" else s == which]
        assert len(picked) == 1, (model, which)
        return picked.iloc[0]

    for model, m in (("MLP", "mlp"), ("transformer block", "block")):
        for c, which in vs_eager.items():  # a variant against eager: the speedup's interval
            r = row(model, which)
            assert tuple(claim.loc[f"{m}_{c}", ["lo", "hi"]]) == pytest.approx((r.speedup_lo, r.speedup_hi))
        for c, (fast, slow) in pairs.items():  # two variants: slow / fast median time, window by window
            values = [a / b for a, b in zip(medians(row(model, slow)), medians(row(model, fast)))]
            assert tuple(claim.loc[f"{m}_{c}", ["lo", "hi"]]) == pytest.approx(prediction_interval(values))
        h2h = df[df.case == f"{model}: planned vs best fixed ladder"]  # the head-to-head: ladder / planned time
        assert tuple(claim.loc[f"{m}_planned_beats_best_ladder", ["lo", "hi"]]) == pytest.approx(
            (h2h.speedup_lo.iloc[1], h2h.speedup_hi.iloc[1]))
    checks = {c["model"]: c for c in env["planned_vs_best"]}
    assert {checks[model]["verdict"] for model in MODELS} <= (
        {"holds", "fails", "unclear"} if HAS_CUDA else {"eager fallback"})
    assert checks["MLP"]["statement"] == claim.loc["mlp_planned_beats_best_ladder", "statement"]

    # memory: reduce-overhead's graphs live in the graph trees' one pool, shared by every compiled variant, so no
    # variant is given a number of its own (never a 0.0 that only reflects the order of the cells)
    if HAS_CUDA:
        ro = df[df.case.isin(MODELS) & df.variant.str.startswith("reduce-overhead")]
        assert ro.held_mib.isna().all() and ro.memory_note.str.contains("not measurable here").all()
        trees = df[df.case == "reduce-overhead: memory"]
        assert len(trees) == 1 and trees.pool_mib.iloc[0] > 0 and env["graph_trees_pool_mib"] > 0


@pytest.mark.parametrize("label, expected", [
    ("steps of 8 (default)", "the default ladder (steps of 8)"), ("steps of 4", "the ladder in steps of 4"),
    ("steps of 16 (eager fallback)", "the ladder in steps of 16"), ("default ladder", "the default ladder"),
    ("pow2", "the ladder in powers of two"), ("pow2 (default)", "the default ladder (powers of two)"), ("single bucket", "a single bucket"), ("exact sizes", "one graph per size"),
    ("planned", "the planned bucket set"), ("planned at the best ladder's limits", "the planned bucket set"),
    ("reduce-overhead, dynamic=True", "reduce-overhead with dynamic=True"), ("reduce-overhead", "reduce-overhead")])
def test_phrase_names_a_strategy_as_a_singular_noun_phrase(label, expected):
    from cudagraph_kit.course.measuring.verdicts import phrase

    assert phrase(label) == expected


def test_the_stream_verdicts_cover_the_stream_comparison_and_nothing_else():
    """Without a GPU, results.show picks the recorded run's rows and verdicts by stream_verdicts' cases and claims:
    the two models' stream rows and their 16 claims, not the appendix's head-to-head, memory or curve rows."""
    from pathlib import Path

    from cudagraph_kit.course.measuring.verdicts import stream_verdicts

    cases = ["MLP", "transformer block", "MLP: planned vs best fixed ladder", "MLP: memory", "planner curve"]
    assert [bool(stream_verdicts.cases.search(c)) for c in cases] == [True, True, False, False, False]
    recorded = Path(__file__).resolve().parent.parent / "figures" / "06_variable_shapes" / "claims.csv"
    ids = pd.read_csv(recorded).claim
    ours = {c for c in ids if stream_verdicts.claims.search(c)}
    assert len(ours) == 16 and not {c for c in ours if "best_ladder" in c or "expandable" in c}


@pytest.mark.parametrize("max_rows, spacings, default", [(64, [4, 8, 16], "steps of 8 (default)"),
                                                         (16, [4], "pow2 (default)"), (64, [4], "default ladder")])
def test_fixed_ladders_name_the_kits_default_once(max_rows, spacings, default):
    from cudagraph_kit import ladder
    from cudagraph_kit.course.lessons.buckets import fixed_ladders

    fixed, label = fixed_ladders(max_rows, spacings)
    assert label == default and sum("default" in k for k in fixed) == 1 and fixed["single bucket"] is None
    assert ladder(max_rows, fixed[label]) == ladder(max_rows)
