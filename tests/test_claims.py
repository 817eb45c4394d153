"""Claims as plain sentences (course/claims.py): which way the interval points, eager fallbacks, the builders."""
import math

import pandas as pd
import pytest

from cudagraph_kit.course.measuring.claims import (EAGER_FALLBACK, Claim, best_of, faster, load_claims, save_claims, speedup,
                                         stops_paying, summary, summary_table, takeaways, versus, within_floor)
from cudagraph_kit.course.measuring.measure import Measured

NEGATIONS = (" not ", " no faster", " never ", "n't ")


def plain(text):
    return not any(n in f" {text} " for n in NEGATIONS)


def test_an_eager_fallback_claim_states_no_verdict_about_a_graph(tmp_path):
    """The CPU run of 01 printed '[holds] large: the graph replay is faster than eager (1.12-1.78x)' with both sides
    eager: with eager_fallback the interval is kept (claims.csv), the verdict and the sentence say what ran, and the
    sentence quotes no eager-vs-eager ratio (on a CPU they ran to 0.00-19170582x)."""
    graph = faster("replay_beats_eager_large", 1.12, 1.78, "large: the graph replay")
    fallback = faster("replay_beats_eager_large", 1.12, 1.78, "large: the graph replay", eager_fallback=True)
    assert graph.verdict == "holds" and graph.statement == "large: the graph replay is 1.12-1.78x faster than eager"
    assert fallback.verdict == EAGER_FALLBACK == "eager fallback"
    text = fallback.statement
    assert "no GPU" in text and "eager with eager" in text and "1.12" not in text and "x" not in text.split(";")[-1]
    assert (fallback.row()["lo"], fallback.row()["hi"]) == (1.12, 1.78)
    assert "faster" not in text and "holds" not in text and "fails" not in text
    for lo, hi in [(0.5, 0.9), (0.8, 1.3), (float("nan"), float("nan"))]:
        c = faster("x", lo, hi, "the graph", eager_fallback=True)
        assert c.verdict == EAGER_FALLBACK and "eager with eager" in c.statement
    assert "not measured" in faster("x", float("nan"), float("nan"), "g", eager_fallback=True).statement
    save_claims(tmp_path, [faster("a", 1.12, 1.78, "g"), fallback])
    saved = load_claims(tmp_path).set_index("claim")
    assert saved.loc["a", "verdict"] == "holds" and saved.loc["replay_beats_eager_large", "verdict"] == EAGER_FALLBACK
    assert saved.loc["replay_beats_eager_large", "lo"] == pytest.approx(1.12)


@pytest.mark.parametrize("lo, hi, verdict, sentence", [
    (4.1, 9.4, "holds", "the graph is 4.10-9.40x faster than eager"),
    (0.8, 0.95, "fails", "the graph is 1.05-1.25x slower than eager"),
    (0.9, 1.3, "unclear", "the graph and eager are too close to call: 0.90-1.30x as fast"),
])
def test_faster_says_which_way_the_interval_points(lo, hi, verdict, sentence):
    c = faster("replay_beats_eager_small", lo, hi, "the graph")
    assert (c.verdict, c.statement) == (verdict, sentence)
    assert plain(c.statement)


def test_faster_with_a_margin_names_it_and_reads_plainly():
    holds = faster("saves_10pct", 1.15, 1.4, "the graph", above=1.10)
    fails = faster("saves_10pct", 1.01, 1.08, "the graph", above=1.10)
    unclear = faster("saves_10pct", 1.05, 1.2, "the graph", above=1.10)
    assert holds.statement == "the graph is 1.15-1.40x faster than eager: more than 10% faster"
    assert fails.statement == "the graph is 1.01-1.08x as fast as eager: at most 10% faster"
    assert unclear.statement == "the graph is 1.05-1.20x as fast as eager: too close to 1.1x to call"
    assert [c.verdict for c in (holds, fails, unclear)] == ["holds", "fails", "unclear"]
    assert all(plain(c.statement) for c in (holds, fails, unclear))
    with pytest.raises(ValueError, match="at least 1"):
        faster("x", 0.5, 0.7, "the graph", above=0.8)


def test_an_end_next_to_its_threshold_shows_the_digit_that_decides_the_verdict():
    """An interval that clears 1.1x by a hair must not read "1.10-", as if it sat on the threshold (01's large GELU
    on the H200, 2026-11-29: lo 1.1018), nor one that misses it read "1.10" (lo 1.0985)."""
    clears = faster("saves_10pct", 1.1018, 1.46, "the graph", above=1.10)
    misses = faster("saves_10pct", 1.0985, 1.46, "the graph", above=1.10)
    assert clears.statement == "the graph is 1.102-1.46x faster than eager: more than 10% faster"
    assert misses.statement == "the graph is 1.099-1.46x as fast as eager: too close to 1.1x to call"
    rendered = takeaways(["Graphs pay on large tensors too: {saves_10pct}."], [clears])
    assert rendered == ["Graphs pay on large tensors too: 1.102-1.46x."]     # the takeaway rounds as the verdict


def test_a_claim_id_must_be_quotable():
    with pytest.raises(ValueError, match="lower-case"):
        Claim("Bad id", 1, 2, holds="h", fails="f")
    row = Claim("a", 5.2, 7.0, holds="h {lo:.1f}-{hi:.1f}", fails="f").row()
    assert list(row) == ["claim", "statement", "verdict", "lo", "hi", "above"] and row["statement"] == "h 5.2-7.0"
    assert math.isclose(row["lo"], 5.2)


def measured(cuda=True):
    """A Measured of three windows: eager 100 µs; graph 20-25 µs; compiled 50-60 µs; graph floor 10 µs."""
    frames = []
    for g, c in [(20, 50), (22, 55), (25, 60)]:
        frames.append(pd.DataFrame({
            "case": ["small"] * 3, "variant": ["eager", "graph" if cuda else "graph (eager fallback)", "compiled"],
            "executed_as": ["eager", "cuda graph" if cuda else "eager", "eager"],
            "median_us": [100.0, g, c], "speedup": [1.0, 100 / g, 100 / c],
            "floor_us": [float("nan"), 10.0 if cuda else float("nan"), float("nan")]}))
    from cudagraph_kit.intervals import combine_windows
    return Measured(combine_windows(frames), frames)


def test_builders_read_a_measurement(monkeypatch):
    import cudagraph_kit.course.measuring.measure as measure_module
    monkeypatch.setattr(measure_module, "_cuda", lambda: True)
    m = measured()
    s = speedup(m, "graph_beats_eager", "small", "graph", subject="the graph")
    assert s.verdict == "holds" and s.statement.startswith("the graph is ") and "faster than eager" in s.statement
    v = versus(m, "graph_beats_compiled", ("small", "graph"), ("small", "compiled"))
    assert v.verdict == "holds" and v.lo > 2 and "faster than compiled" in v.statement
    b = best_of(m, "fastest", "small", ["graph", "compiled"])
    assert b.statement.startswith("small: graph (fastest) is") and b.lo == v.lo
    w = within_floor(m, "near_floor", "small", "graph", 4.0)
    assert w.verdict == "holds" and w.statement.startswith("small: graph runs within 4x of its GPU floor")
    tight = within_floor(m, "near_floor", "small", "graph", 1.05)
    assert tight.verdict == "fails" and "more than 1.05x" in tight.statement
    with pytest.raises(KeyError, match="no row"):
        speedup(m, "x", "small", "missing")


def test_builders_give_no_graph_verdict_for_an_eager_fallback(monkeypatch):
    import cudagraph_kit.course.measuring.measure as measure_module
    monkeypatch.setattr(measure_module, "_cuda", lambda: False)
    m = measured(cuda=False)
    for c in (speedup(m, "a", "small", "graph"), versus(m, "b", ("small", "graph"), ("small", "compiled")),
              within_floor(m, "c", "small", "graph", 1.5)):
        assert c.verdict == EAGER_FALLBACK and "eager with eager" in c.statement


def test_stops_paying_reads_verdicts_not_points():
    pts = [(2**20, 1.5, 2.0), (2**22, 0.9, 1.4), (2**24, 1.0, 1.05)]
    c = stops_paying("stops", pts, 1.10, "the graph", " elements")
    assert c.verdict == "holds"
    # one verdict about one interval per sentence: the unclear point below (2**22) is not folded into it
    assert c.statement == "the graph stops paying (at most 1.1x) from 16,777,216 elements on"
    pays = stops_paying("stops", [(1, 2.0, 3.0), (2, 1.5, 1.9)], 1.10, "the graph")
    assert pays.verdict == "fails" and pays.statement.startswith("the graph pays at every point measured, up to 2")
    assert all(plain(c.statement) for c in (c, pays))


def test_summary_is_one_sentence_per_claim(capsys):
    claims = [faster("a", 2, 3, "the graph"), faster("b", 0.5, 0.8, "the compiled forward")]
    assert summary(claims) is None    # shown, not returned: a cell ending with it shows one table
    df = summary_table(claims)
    assert list(df.finding) == ["the graph is 2.00-3.00x faster than eager",
                                "the compiled forward is 1.25-2.00x slower than eager"]
    out = capsys.readouterr().out
    assert "1. the graph is 2.00-3.00x faster" in out and "holds" not in out and "other" not in out
    summary(claims, headlines=["b", "not measured"])    # the headlines this run has, then a count of the rest
    out = capsys.readouterr().out
    assert out == "1. the compiled forward is 1.25-2.00x slower than eager\nclaims.csv has this run's 1 other verdict.\n"


def test_an_interval_whose_ends_read_alike_is_one_number_and_sizes_read_with_separators():
    """Seen in the recorded run: "1.20-1.20x faster" (every window gave the same ratio) and "from 16777216 elements
    on"."""
    assert faster("a", 1.2, 1.2, "the graph").statement == "the graph is 1.20x faster than eager"
    assert faster("a", 1.2, 1.25, "the graph").statement == "the graph is 1.20-1.25x faster than eager"
    c = stops_paying("g", [(2 ** 20, 1.5, 2.0), (2 ** 24, 1.0, 1.05)], 1.10, "the graph", " elements")
    assert c.statement == "the graph stops paying (at most 1.1x) from 16,777,216 elements on"


# ------------------------------------------------------------------------------------------------ takeaways
def test_takeaways_render_numbers_from_the_claims_and_never_say_more_than_they_found():
    from cudagraph_kit.course.measuring.claims import faster, takeaways
    holds = faster("graph_beats_eager", 6.8, 9.14, "small: graph replay")
    unclear = faster("graph_saves_10pct", 1.01, 1.19, "large: graph replay", above=1.10)
    lines = ["A graph made the small GELU {graph_beats_eager} faster.",
             "It said: {graph_beats_eager:statement}.",
             "Large work gains little, since the GPU's work dominates: it saved {graph_saves_10pct}.",
             "Correct before fast.",
             "Large: {graph_saves_10pct}."]
    shown = takeaways(lines, [holds, unclear])
    assert shown[0] == "A graph made the small GELU 6.80-9.14x faster."
    assert shown[1] == "It said: small: graph replay is 6.80-9.14x faster than eager."
    # unclear: the line keeps its lesson, and its claim becomes the measured finding (never an unmade claim)
    assert shown[2] == f"Large work gains little, since the GPU's work dominates. Measured: {unclear.statement}."
    assert "saved 1.01" not in shown[2] and "instead" not in shown[2]
    assert shown[3] == "Correct before fast."
    assert shown[4] == f"Measured: {unclear.statement}."    # no lesson of four words or more: the finding alone
    with pytest.raises(KeyError, match="never_made"):
        takeaways(["{never_made}"], [holds])
    assert takeaways(["{never_made} is left out.", "Kept."], [holds], missing="skip") == ["Kept."]


def test_a_cpu_learner_reads_the_recorded_runs_takeaways_labelled_with_its_gpu(capsys, monkeypatch):
    """Without a GPU the claims are eager fallbacks: the takeaways come from the recorded claims.csv of figures/,
    under a line naming the recorded run's GPU and date."""
    import json

    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # a CPU learner's machine, also on a GPU host
    from cudagraph_kit.course.measuring.claims import faster
    from cudagraph_kit.course.measuring.results import show_takeaways
    from cudagraph_kit.course.running.paths import FIGURES_DIR
    here = [faster("replay_beats_eager_small", 1.0, 1.1, "small: graph replay", eager_fallback=True)]
    shown = show_takeaways("01_gelu", here, ["A graph made the small GELU {replay_beats_eager_small} faster."])
    recorded = pd.read_csv(FIGURES_DIR / "01_gelu" / "claims.csv").set_index("claim").loc["replay_beats_eager_small"]
    assert recorded.verdict == "holds"
    from cudagraph_kit.course.measuring.claims import _x   # a ratio as the sentences write it
    assert shown == [f"A graph made the small GELU {_x(recorded.lo)}-{_x(recorded.hi)}x faster."]
    printed = capsys.readouterr().out
    env = json.loads((FIGURES_DIR / "01_gelu" / "env.json").read_text())
    assert "No graph ran here; the recorded run's takeaways." in printed and env["gpu"] in printed
    assert env["date"] in printed
