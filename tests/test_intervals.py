"""Prediction intervals over timing windows (cudagraph_kit/intervals.py) and the claims rendered from them
(cudagraph_kit/course/measuring/claims.py): coverage, verdicts, the combined table, claims.csv, quoted claims."""
import math
import random
import re
from pathlib import Path

import pandas as pd
import pytest

from cudagraph_kit.course.measuring.claims import CLAIM_COLUMNS, Claim, load_claims, quoted_claims, save_claims
from cudagraph_kit.intervals import combine_windows, prediction_interval, verdict

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("n,level", [(3, 0.90), (5, 0.90), (3, 0.95), (40, 0.90)])
def test_one_more_window_lands_inside_as_often_as_promised(n, level):
    """Windows drawn log-normally (a host that drifts): the next window falls inside the interval of the
    previous n at the stated rate (2,000 trials, seeded), where the min-max of n would hold only (n-1)/(n+1)."""
    rng = random.Random(n * 1000 + int(level * 100))
    hits = minmax_hits = 0
    trials = 2000
    for _ in range(trials):
        windows = [math.exp(rng.gauss(math.log(6.0), 0.15)) for _ in range(n)]
        new = math.exp(rng.gauss(math.log(6.0), 0.15))
        lo, hi = prediction_interval(windows, level)
        hits += lo <= new <= hi
        minmax_hits += min(windows) <= new <= max(windows)
    assert abs(hits / trials - level) < 0.03, hits / trials
    if n == 3:
        assert abs(minmax_hits / trials - (n - 1) / (n + 1)) < 0.04  # what the interval replaces


def test_interval_needs_two_windows_and_positive_values():
    assert all(math.isnan(v) for v in prediction_interval([5.0]))
    assert all(math.isnan(v) for v in prediction_interval([5.0, float("nan")]))
    with pytest.raises(ValueError, match="positive"):
        prediction_interval([1.0, -2.0])
    with pytest.raises(ValueError, match="level"):
        prediction_interval([1.0, 2.0], level=0.8)
    lo, hi = prediction_interval([2.0, 2.0, 2.0])
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def test_verdicts():
    assert verdict(1.2, 1.5) == "holds"
    assert verdict(0.5, 0.9) == "fails"
    assert verdict(0.5, 1.0) == "fails"         # "faster than 1x" is not shown by an interval reaching 1x
    assert verdict(0.9, 1.3) == "unclear"
    assert verdict(float("nan"), float("nan")) == "unclear"
    assert verdict(1.2, 1.5, above=1.3) == "unclear"
    with pytest.raises(ValueError, match="lo <= hi"):
        verdict(2.0, 1.0)


def _window(eager_us, graph_us, case="small"):
    return pd.DataFrame({"case": [case, case], "variant": ["eager", "graph"], "median_us": [eager_us, graph_us],
                         "speedup": [1.0, eager_us / graph_us], "executed_as": ["eager", "cuda graph"],
                         "floor_us": [float("nan"), 2.0]})


def test_combine_windows_gives_one_row_per_variant_with_its_interval():
    frames = [_window(20.0, 3.0), _window(26.0, 3.1), _window(17.0, 2.9)]
    table = combine_windows(frames).set_index("variant")
    graph = table.loc["graph"]
    speedups = sorted(e / g for e, g in ((20.0, 3.0), (26.0, 3.1), (17.0, 2.9)))
    assert graph.windows == 3 and graph.speedup == pytest.approx(speedups[1])
    assert graph.speedup_pi_lo < speedups[0] and graph.speedup_pi_hi > speedups[-1]
    assert graph.median_us == pytest.approx(3.0) and graph.executed_as == "cuda graph" and graph.floor_us == 2.0
    assert table.loc["eager"].speedup == 1.0 and table.loc["eager"].speedup_pi_lo == pytest.approx(1.0)
    assert (graph.speedup_lo, graph.speedup_hi) == (graph.speedup_pi_lo, graph.speedup_pi_hi)  # what a save publishes
    assert graph.vs_floor == pytest.approx(3.0 / 2.0)


def test_combine_windows_carries_columns_from_the_window_that_has_them_and_drops_window_spread():
    """The profiler's floor is read in the last window only; a notebook's own columns ride along; one window's
    quartiles do not (they are no interval for a rerun)."""
    frames = [_window(20.0, 3.0), _window(26.0, 3.1), _window(17.0, 2.9)]
    for f in frames[:2]:
        f["floor_us"], f["executed_as"] = float("nan"), "unknown"  # timed without the profiler
    for f in frames:
        f["iqr_us"], f["speedup_lo"], f["numel"] = 0.1, 0.5, 4096
    graph = combine_windows(frames).set_index("variant").loc["graph"]
    assert graph.floor_us == 2.0 and graph.numel == 4096 and "iqr_us" not in graph.index
    assert graph.executed_as == "cuda graph"
    assert graph.speedup_lo == graph.speedup_pi_lo != 0.5
    with pytest.raises(ValueError, match="compare"):
        combine_windows([pd.DataFrame({"variant": ["x"]})])
    with pytest.raises(ValueError, match="at least one"):
        combine_windows([])


def test_a_claim_prints_the_sentence_of_its_verdict(tmp_path):
    kw = dict(holds="graph faster ({lo:.1f}-{hi:.1f}x)", fails="graph slower ({lo:.2f}-{hi:.2f}x)")
    holds, fails, unclear = Claim("a", 5.2, 7.0, **kw), Claim("b", 0.5, 0.9, **kw), Claim("c", 0.8, 1.3, **kw)
    assert (holds.statement, holds.verdict) == ("graph faster (5.2-7.0x)", "holds")
    assert (fails.statement, fails.verdict) == ("graph slower (0.50-0.90x)", "fails")
    assert unclear.verdict == "unclear" and unclear.statement == "0.8-1.3: too close to 1 to call"
    assert "not measured" in Claim("d", float("nan"), float("nan"), **kw).statement
    with pytest.raises(ValueError, match="claim id"):
        Claim("Graph Wins", 1.0, 2.0, **kw)
    path = save_claims(tmp_path, [holds, fails, unclear])
    saved = load_claims(tmp_path)
    assert path.name == "claims.csv" and list(saved.columns) == CLAIM_COLUMNS
    assert saved.verdict.tolist() == ["holds", "fails", "unclear"] and saved.claim.tolist() == ["a", "b", "c"]
    with pytest.raises(ValueError, match="unique"):
        save_claims(tmp_path, [holds, holds])
    assert load_claims(tmp_path / "nowhere") is None


def test_quoted_claims_are_found_in_prose():
    text = "# The graph wins: {claim:graph_beats_eager}. Padding: {claim:pad_cheap_06}.\n{claim:Not An Id}"
    assert quoted_claims(text) == ["graph_beats_eager", "pad_cheap_06"]


@pytest.mark.parametrize("source", sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_prose_quotes_only_claims_the_notebook_recorded(source):
    """A notebook's markdown may quote a computed claim as {claim:ID}; that id must be in the claims.csv the
    recorded run saved (figures/<stem>/claims.csv)."""
    quoted = quoted_claims(source.read_text())
    recorded = load_claims(NOTEBOOKS.parent / "figures" / source.stem)
    known = set(recorded.claim) if recorded is not None else set()
    missing = [q for q in quoted if q not in known]
    assert not missing, f"{source.name} quotes claims its recorded run did not save: {missing}"
    assert all(re.fullmatch(r"[a-z0-9_]+", q) for q in quoted)


def test_ratio_across_windows_compares_two_non_baseline_variants():
    import pandas as pd
    from cudagraph_kit.intervals import ratio_across_windows

    def window(a_us, b_us):
        return pd.DataFrame({"case": ["bs8", "bs8", "bs8"], "variant": ["eager", "fp16", "bf16"],
                             "median_us": [100.0, a_us, b_us], "speedup": [1.0, 100 / a_us, 100 / b_us]})
    frames = [window(50, 40), window(52, 40), window(49, 41), window(51, 39)]
    r = ratio_across_windows(frames, ("bs8", "fp16"), ("bs8", "bf16"))
    assert r["windows"] == 4 and r["values"][0] == pytest.approx(1.25)
    assert r["lo"] < r["ratio"] < r["hi"] and r["lo"] > 1.0  # fp16 is slower than bf16 in every window
    same = ratio_across_windows([window(50, 50), window(40, 41), window(60, 58)], ("bs8", "fp16"), ("bs8", "bf16"))
    assert same["lo"] < 1.0 < same["hi"]  # no clear difference
    with pytest.raises(ValueError, match="found"):
        ratio_across_windows(frames, ("bs8", "fp16"), ("bs16", "bf16"))


def test_stops_clearing_reads_verdicts_not_points():
    from cudagraph_kit.intervals import stops_clearing

    pts = [(2 ** 24, 1.0, 1.05), (2 ** 20, 1.5, 2.0), (2 ** 22, 0.9, 1.4)]  # any order
    assert stops_clearing(pts, above=1.10) == {"from": 2 ** 24, "unclear_before": 2 ** 22}
    # a point estimate below the threshold with an interval that straddles it is no crossing
    assert stops_clearing([(1, 1.5, 2.0), (2, 1.05, 1.2)], above=1.10) == {"from": None, "unclear_before": None}
    # a failing point followed by a clearing one does not count: every larger point must fail
    assert stops_clearing([(1, 0.9, 1.0), (2, 1.3, 1.5), (3, 1.0, 1.05)], above=1.10)["from"] == 3
    assert stops_clearing([(1, 1.0, 1.05), (2, 0.9, 1.0)], above=1.10) == {"from": 1, "unclear_before": None}


# Published two-sided critical values of Student's t (3 decimals), for the levels intervals.py offers:
# df 1..30, then 31, 40, 60, 120, 1000 (where the old table fell back to the normal quantile, 1.645 / 1.960).
_PUBLISHED_T = {
    0.90: [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
           1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697],
    0.95: [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
           2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042],
}
_PUBLISHED_T_LARGE_DF = {0.90: {31: 1.696, 40: 1.684, 60: 1.671, 120: 1.658, 1000: 1.646},
                         0.95: {31: 2.040, 40: 2.021, 60: 2.000, 120: 1.980, 1000: 1.962}}


def _published_t():
    for level, values in _PUBLISHED_T.items():
        yield from ((level, df, v) for df, v in enumerate(values, start=1))
        yield from ((level, df, v) for df, v in _PUBLISHED_T_LARGE_DF[level].items())


@pytest.mark.parametrize("level,df,value", list(_published_t()))
def test_t_quantile_matches_published_tables_with_and_without_scipy(level, df, value):
    """The quantile the intervals use, SciPy's where it is installed, and the standard-library one either way,
    agree with the printed tables to 0.1% (past 30 degrees of freedom too: 1.696 at 31, not the normal 1.645)."""
    from cudagraph_kit.intervals import _t_ppf, _t_quantile
    assert _t_quantile(level, df) == pytest.approx(value, rel=1e-3)
    assert _t_ppf(0.5 + level / 2, df) == pytest.approx(value, rel=1e-3)


def test_t_quantile_without_scipy_agrees_with_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    from cudagraph_kit.intervals import _t_ppf
    for q in (0.95, 0.975, 0.6, 0.999):
        for df in [*range(1, 61), 99, 120, 500, 1000, 10**4, 10**5]:
            assert _t_ppf(q, df) == pytest.approx(float(scipy_stats.t.ppf(q, df)), rel=1e-9), (q, df)


def test_t_quantile_refuses_what_it_cannot_answer():
    from cudagraph_kit.intervals import _t_ppf, _t_quantile
    with pytest.raises(ValueError, match="level"):
        _t_quantile(0.8, 5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        _t_quantile(0.9, 0)
    with pytest.raises(ValueError, match="0.5 < q < 1"):
        _t_ppf(0.3, 5)


def test_t_quantile_falls_back_to_the_standard_library_without_scipy(monkeypatch):
    import sys
    from cudagraph_kit.intervals import _t_ppf, _t_quantile
    monkeypatch.setitem(sys.modules, "scipy", None)         # `import scipy...` now raises ImportError
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    assert _t_quantile(0.90, 31) == _t_ppf(0.95, 31) == pytest.approx(1.696, rel=1e-3)
