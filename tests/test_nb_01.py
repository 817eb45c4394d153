"""Notebook 01 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

from cudagraph_kit.course.running.paths import FIGURES_DIR

pytestmark = pytest.mark.notebook


def test_gelu_notebook_records_correct_and_honest_results(run_notebook):
    folder = run_notebook("01_gelu", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    # the takeaways it showed: this run's on a GPU, else the recorded run's, under a line naming that run's GPU
    executed = json.loads((folder.parent.parent / "01_gelu.ipynb").read_text())
    shown = [o for c in executed["cells"] if "show_takeaways(" in "".join(c["source"]) and c["cell_type"] == "code"
             for o in c["outputs"]]
    text = "".join("".join(o.get("data", {}).get("text/markdown", o.get("text", ""))) for o in shown)
    recorded = json.loads((FIGURES_DIR / "01_gelu" / "env.json").read_text())
    if torch.cuda.is_available():
        assert f"This run, on {torch.cuda.get_device_name(0)}" in text
    else:
        assert "No graph ran here; the recorded run's takeaways." in text and recorded["gpu"] in text
    assert text.count("\n1. ") == 1 and "\n5. " in text and "\n6. " not in text   # five takeaways
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us", "kernels_per_call",
            "copies_per_call"} <= set(df.columns)
    assert {"small", "large"} <= set(df.case)
    assert (df.median_us > 0).all()
    # correctness was checked against eager and recorded
    main = df[df.case.isin(["small", "large"])]
    assert (main.max_abs_err < 1e-6).all()
    # both ways of calling the graph are in the headline table: replay in place, and g(x) with its input copy
    assert set(main.variant.str.replace(" (eager fallback)", "", regex=False)) == {
        "eager", "graph replay", "graph copy+replay"}
    # every comparison, the calls-per-graph one included, has eager first as its own baseline
    firsts = df.groupby("case", sort=False).first()
    assert (firsts.variant == "eager").all() and (firsts.speedup == 1.0).all()
    # the sweep covers several sizes and the calls-per-graph study is there
    assert df.case.str.startswith("sweep").sum() >= 2 * 5
    assert sorted(df.calls_per_graph.dropna().unique()) in ([1, 10], [1, 10, 100])
    # the headline-vs-sweep check (appendix) was computed and recorded beside the results
    check = json.loads((folder / "headline_vs_sweep.json").read_text())
    assert check["small_numel"] > 0 and check["sweep_numel"] > 0 and (isinstance(check["agree"], bool) if torch.cuda.is_available() else check["agree"] is None)
    if torch.cuda.is_available():
        assert (df[df.variant.str.startswith("graph")].executed_as == "cuda graph").all()
        # g(x) is the replay plus one memcpy into the static input, not one more kernel
        copy = main[main.variant == "graph copy+replay"]
        replay = main[main.variant == "graph replay"]
        assert (copy.copies_per_call >= 1).all() and (replay.copies_per_call == 0).all()
        assert (copy.kernels_per_call.values == replay.kernels_per_call.values).all()
        assert env["gpu"] and env["copy_bandwidth_TBps"] > 0
        # the pictures (section 7), read from the profiler after all timings: 3 eager calls launch 15 kernels
        # one by one; 3 replays are 3 graph launches and the same 15 kernels on the GPU
        pictures = env["pictures"]
        eager, graph = pictures["eager: 3 calls"], pictures["CUDA graph: 3 replays"]
        assert eager["kernel_launches"] == 15 and eager["graph_launches"] == 0 and eager["gpu_kernels"] == 15
        assert graph["graph_launches"] == 3 and graph["kernel_launches"] == 0 and graph["gpu_kernels"] == 15
        assert pictures["graph_nodes"]["kernels"] == 5 and pictures["graph_nodes"]["source"] in ("dot", "profiler")
        assert (folder / "timeline.png").stat().st_size > 10_000 and (folder / "graph_nodes.png").is_file()
    else:  # honest labels: nothing that ran on the CPU is called a graph
        assert (df.executed_as == "eager").all()
        assert df[df.variant.str.contains("graph")].variant.str.endswith("(eager fallback)").all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
        assert env["pictures"] == {} and not (folder / "timeline.png").exists()  # the pictures need a GPU
    assert (folder / "size_sweep.png").stat().st_size > 10_000
    assert (folder / "calls_per_graph.png").is_file()
    # every speedup is published with a prediction interval over timing windows (smoke run: 2 windows each)
    graphed = df[df.variant != "eager"]
    assert (graphed.windows == 2).all()
    assert (graphed.speedup_lo <= graphed.speedup).all() and (graphed.speedup <= graphed.speedup_hi).all()
    assert (graphed.window_speedups.str.count(";") == 1).all()
    # the comparative sentences are claims computed from those intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv").set_index("claim")
    headline = ["replay_beats_eager_small", "copy_replay_beats_eager_small", "replay_saves_10pct_large"]
    assert set(claims.index) == {*headline, "graph_stops_paying", "more_calls_per_graph_faster",
                                 "many_calls_near_floor"}
    assert (claims.dropna(subset=["lo", "hi"]).eval("lo <= hi")).all()
    # one verdict per interval: no two claims rest on the same interval
    measured = claims.dropna(subset=["lo", "hi"])
    assert not measured.duplicated(subset=["lo", "hi"]).any(), measured
    for cid in headline:  # the sentence printed is the one of its verdict, from the saved interval
        c = claims.loc[cid]
        row = graphed[(graphed.case == cid.split("_")[-1]) & graphed.variant.str.startswith(
            "graph copy+replay" if cid.startswith("copy") else "graph replay")].iloc[0]
        assert (c.lo, c.hi) == pytest.approx((row.speedup_lo, row.speedup_hi))
        if torch.cuda.is_available():
            expected = "holds" if c.lo > c.above else "fails" if c.hi <= c.above else "unclear"
            assert c.verdict == expected, (cid, c.verdict)
            assert ("too close" in c.statement) == (expected == "unclear"), c.statement
            assert " not " not in f" {c.statement} ", c.statement  # says which way the interval points
    if torch.cuda.is_available():
        assert set(claims.verdict) <= {"holds", "fails", "unclear"}
        # the crossover recorded for the decision chart is the one the claim states
        assert (claims.loc["graph_stops_paying", "verdict"] == "holds") == (env["crossover_numel"] is not None)
        assert claims.loc["many_calls_near_floor", "lo"] > 0  # a floor was measured for the graph rows
    else:  # every graph ran eagerly: no verdict about a graph, no sentence that says a graph is faster
        assert (claims.verdict == "eager fallback").all(), claims.verdict
        assert not claims.statement.str.contains("faster than eager").any(), list(claims.statement)
        assert claims.statement.str.contains("compares eager with eager").all(), list(claims.statement)
        assert env["crossover_numel"] is None
