"""Claims whose graph side ran as an eager fallback, and the plain sentences of faster() (course/claims.py)."""
import math

import pandas as pd
import pytest

from cudagraph_kit.course.claims import EAGER_FALLBACK, Claim, faster, load_claims, save_claims

NEGATIONS = (" not ", " no faster", " never ")


def test_an_eager_fallback_claim_states_no_verdict_about_a_graph(tmp_path):
    """The CPU run of 01 printed '[holds] large: the graph replay is faster than eager (1.12-1.78x)' with both sides
    eager: with eager_fallback the interval is kept, the verdict and the sentence say what ran."""
    kw = dict(holds="large: the graph replay is faster than eager ({lo:.2f}-{hi:.2f}x)",
              fails="large: the graph replay takes at least as long as eager ({lo:.2f}-{hi:.2f}x)")
    graph = Claim("replay_beats_eager_large", 1.12, 1.78, **kw)
    fallback = Claim("replay_beats_eager_large", 1.12, 1.78, eager_fallback=True, **kw)
    assert graph.verdict == "holds" and "faster than eager" in graph.statement
    assert fallback.verdict == EAGER_FALLBACK == "eager fallback"
    text = fallback.statement
    assert text.startswith("replay_beats_eager_large: eager vs eager (no GPU")
    assert "no verdict about a graph" in text and "1.12-1.78" in text
    assert "faster" not in text and "holds" not in text and "fails" not in text
    # every interval gives the same sentence: no verdict leaks through from lo/hi
    for lo, hi in [(0.5, 0.9), (0.8, 1.3), (float("nan"), float("nan"))]:
        c = Claim("replay_beats_eager_large", lo, hi, eager_fallback=True, **kw)
        assert c.verdict == EAGER_FALLBACK and "no verdict about a graph" in c.statement
    assert "not measured" in Claim("x", float("nan"), float("nan"), eager_fallback=True, **kw).statement
    # claims.csv keeps the interval and says what ran
    save_claims(tmp_path, [Claim("a", 1.12, 1.78, **kw), fallback])
    saved = load_claims(tmp_path).set_index("claim")
    assert saved.loc["a", "verdict"] == "holds" and saved.loc["replay_beats_eager_large", "verdict"] == EAGER_FALLBACK
    assert saved.loc["replay_beats_eager_large", "lo"] == pytest.approx(1.12)


@pytest.mark.parametrize("lo, hi, verdict, words", [
    (4.1, 9.4, "holds", "is faster than eager (4.10-9.40x"),
    (0.8, 0.95, "fails", "takes at least as long as eager (0.80-0.95x"),
    (0.9, 1.3, "unclear", "against eager: no clear difference (the interval 0.90-1.30x straddles 1x)"),
])
def test_faster_says_which_way_the_interval_points_without_negating_faster(lo, hi, verdict, words):
    c = faster("replay_beats_eager_small", lo, hi, "small: the graph replay")
    assert c.verdict == verdict
    assert c.statement.startswith("small: the graph replay") and words in c.statement
    assert not any(n in f" {c.statement} " for n in NEGATIONS), c.statement


def test_faster_with_a_margin_names_it_and_reads_plainly():
    holds = faster("saves_10pct", 1.15, 1.4, "large: the graph replay", above=1.10)
    fails = faster("saves_10pct", 1.01, 1.08, "large: the graph replay", above=1.10)
    unclear = faster("saves_10pct", 1.05, 1.2, "large: the graph replay", above=1.10)
    assert holds.verdict == "holds" and "more than 10% faster than eager (1.15-1.40x" in holds.statement
    assert fails.verdict == "fails" and "at most 10% faster than eager (1.01-1.08x" in fails.statement
    assert unclear.verdict == "unclear" and "straddles 1.1x" in unclear.statement
    for c in (holds, fails, unclear):
        assert not any(n in f" {c.statement} " for n in NEGATIONS), c.statement
    # the interval of a fallback is kept; the sentence is the fallback's
    c = faster("saves_10pct", 1.15, 1.4, "large: the graph replay", above=1.10, eager_fallback=True)
    assert c.verdict == EAGER_FALLBACK and (c.lo, c.hi, c.above) == (1.15, 1.4, 1.10)


def test_faster_refuses_a_threshold_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        faster("x", 0.5, 0.7, "the graph", above=0.8)


def test_a_graph_run_is_unchanged_by_the_new_field():
    """Without eager_fallback a claim renders as before (recorded GPU runs keep their verdicts and sentences)."""
    c = Claim("a", 5.2, 7.0, holds="h {lo:.1f}-{hi:.1f}", fails="f")
    assert (c.verdict, c.statement) == ("holds", "h 5.2-7.0")
    row = c.row()
    assert list(row) == ["claim", "statement", "verdict", "lo", "hi", "above"]
    assert math.isclose(row["lo"], 5.2) and isinstance(pd.Series(row)["statement"], str)
