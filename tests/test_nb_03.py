"""Notebook 03 (jit.script / torch.compile with graphs): execute it small and check what it recorded."""
import json

import pandas as pd
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
GRAPH_VARIANTS = {"cuda graph", "cuda graph, input in place", "jit.script + graph",
                  "jit.script + graph, input in place", "torch.compile + graph",
                  "torch.compile + graph, input in place"}
PHASE_1, PHASE_2 = "1: before mark_step_begin", "2: after mark_step_begin"
STALE_OUTCOMES = {"raises RuntimeError", "kept (y1 still holds f(x1))", "silently overwritten"}
CLAIM_COLUMNS = ["claim", "statement", "verdict", "lo", "hi", "above"]
GELU_CLAIMS = ("graph_beats_eager", "fusion_beats_graph", "fusion_adds_to_graph", "graph_adds_to_fusion",
               "ro_naive_beats_eager", "ro_static_beats_eager")
OTHER_CLAIMS = {"compiled_graph_slower_mlp", "ro_beats_eager_mlp", "ro_beats_compile_mlp", "ro_beats_eager_training",
                "kit_beats_ro_training"}


def expected_verdict(lo, hi, above):
    return "holds" if lo > above else "fails" if hi <= above else "unclear"


@pytest.mark.notebook
def test_nb_03_records_correct_variants(run_notebook):
    folder = run_notebook("03_jit_compile", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())

    # the schema every notebook shares, plus this notebook's columns
    for col in ("case", "phase", "variant", "median_us", "windows", "speedup", "speedup_lo", "speedup_hi",
                "floor_us", "kernels_per_call", "copies_per_call", "max_abs_err", "executed_as", "matmul_precision"):
        assert col in df.columns, col
    mlp_case = [c for c in df["case"].unique() if c.startswith("MLP ") and not c.endswith("training step")]
    train_case = [c for c in df["case"].unique() if c.endswith("training step")]
    assert len(mlp_case) == 1 and set(df["case"]) == {"small", "large", mlp_case[0], *train_case}
    assert len(train_case) == (1 if HAS_CUDA else 0)  # the training step needs reduce-overhead: a GPU
    assert (folder / "time_per_call.png").stat().st_size > 10_000

    # correctness: every executed variant agrees with eager on fresh data
    assert df["max_abs_err"].notna().all()
    gelu = df[df["case"].isin(["small", "large"])]
    assert (gelu["max_abs_err"] < 1e-4).all(), gelu[["case", "variant", "max_abs_err"]]

    # every phase of every case has eager first as its own baseline
    for (case, phase), rows in df.groupby(["case", "phase"], sort=False):
        assert rows["variant"].iloc[0] == "eager" and rows["speedup"].iloc[0] == 1.0, (case, phase)
    assert set(gelu["phase"]) <= {PHASE_1, PHASE_2}
    assert (df[~df["case"].isin(["small", "large"])]["phase"] == PHASE_2).all()  # the MLP and the training step

    # every number is a median over timing windows (smoke run: 2), published with its prediction interval
    assert (df["windows"] == 2).all(), df[["case", "variant", "windows"]]
    timed = df[df["variant"] != "eager"]
    assert (timed["speedup_lo"] <= timed["speedup"]).all() and (timed["speedup"] <= timed["speedup_hi"]).all()
    assert (timed["window_speedups"].astype(str).str.count(";") == 1).all()

    w1 = gelu[gelu["phase"] == PHASE_1]
    variants = set(w1["variant"])
    # jit.script where TorchScript still runs, and torch.compile (SMOKE: at least the small case)
    if hasattr(torch, "jit") and hasattr(torch.jit, "script"):
        assert (w1["variant"] == "jit.script").sum() == 2
        assert env["torchscript_fuser"]
    assert ((w1["variant"] == "torch.compile") & (w1["case"] == "small")).any()

    # the comparative sentences are claims computed from the intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv")
    assert list(claims.columns) == CLAIM_COLUMNS
    sources = env["claim_sources"]
    assert set(claims["claim"]) == set(sources) and claims["claim"].is_unique
    for c in claims.itertuples():
        expected = expected_verdict(c.lo, c.hi, c.above)
        assert c.verdict == expected, c
        assert ("no clear difference" in c.statement) == (expected == "unclear"), c.statement
        assert f"{c.lo:.2f}-{c.hi:.2f}x" in c.statement
        src = sources[c.claim]
        if src["kind"] == "speedup":  # the interval is the saved row's prediction interval
            row = df[(df["case"] == src["case"]) & (df["variant"] == src["variant"])].iloc[0]
            assert (c.lo, c.hi) == pytest.approx((row["speedup_lo"], row["speedup_hi"]))
        else:  # a ratio of two variants' times, both timed in the same windows
            assert src["kind"] == "ratio"
            for v in (src["slower"], src["faster"]):
                assert ((df["case"] == src["case"]) & (df["variant"] == v)).any(), (c.claim, v)
    for key in ("reduce_overhead_gelu", "reduce_overhead_mlp", "reduce_overhead_training"):
        assert isinstance(env[key], str) and env[key]

    if HAS_CUDA:
        assert env["executed_as"] == "cuda"
        assert env["matmul_precision"] == "high" and (df["matmul_precision"] == "high").all()
        graphed = df[df["variant"].isin(GRAPH_VARIANTS) | df["variant"].str.startswith("reduce-overhead")]
        assert (graphed["executed_as"] == "cuda graph").all()
        # floors exist for rows that ran purely as graph replays (the manual graphs); counts for every row
        assert df[df["variant"].isin(GRAPH_VARIANTS)]["floor_us"].notna().all() and df["kernels_per_call"].notna().all()
        # g(x) copies its input into the graph (a memcpy); replaying in place copies nothing
        assert (w1[w1["variant"] == "cuda graph"]["copies_per_call"] >= 1).all()
        assert (w1[w1["variant"] == "cuda graph, input in place"]["copies_per_call"] == 0).all()
        # what reading a stale reduce-overhead output did, measured: from a replay and from a warm-up run
        assert env["reduce_overhead_stale_output"] in STALE_OUTCOMES
        assert env["reduce_overhead_stale_output_first_call"] in STALE_OUTCOMES
        # the deeper MLP: every variant timed in the same windows, reduce-overhead among them
        mlp = df[df["case"] == mlp_case[0]].set_index("variant")
        assert {"eager", "torch.compile", "reduce-overhead + mark_step_begin", "cuda graph",
                "cuda graph, input in place", "torch.compile + graph, input in place"} <= set(mlp.index)
        assert mlp.loc["eager", "kernels_per_call"] >= 2 * 12  # Linear + ReLU per layer, launched one by one
        # a fair comparison: the compiled forward's kernels are not far slower on the GPU than eager's
        floors = env["mlp_floors_us"]
        eager_floor = floors["eager's kernels (graph)"]
        compiled_floor = floors["the compiled forward's kernels (graph)"]
        assert eager_floor > 0 and compiled_floor > 0
        assert compiled_floor < 1.5 * eager_floor, floors
        # the training step: parity first, then the same windows; its claims come from that table
        train = df[df["case"] == train_case[0]].set_index("variant")
        assert list(train.index) == ["eager", "reduce-overhead forward+backward", "kit whole-step graph"]
        assert (train["max_abs_err"] < 1e-4).all()
        assert train.loc["kit whole-step graph", "executed_as"] == "cuda graph"
        # every claim of the GPU run is there, each rendered into the verdict strings saved in env.json
        expected = {f"{k}_{case}" for k in GELU_CLAIMS for case in ("small", "large")} | OTHER_CLAIMS
        if (w1["variant"] == "jit.script").any():
            expected |= {"compile_beats_script_graph_small", "compile_beats_script_graph_large"}
        assert set(claims["claim"]) == expected
        statements = claims.set_index("claim")["statement"]
        for cid in ("ro_naive_beats_eager_small", "ro_static_beats_eager_large"):
            assert statements[cid] in env["reduce_overhead_gelu"]
        for cid in ("ro_beats_eager_mlp", "ro_beats_compile_mlp", "compiled_graph_slower_mlp"):
            assert statements[cid] in env["reduce_overhead_mlp"]
        for cid in ("ro_beats_eager_training", "kit_beats_ro_training"):
            assert statements[cid] in env["reduce_overhead_training"]
    else:
        # honest labels: nothing claims to be a CUDA graph, and no GPU-only measurement is made up
        assert env["executed_as"].startswith("cpu")
        assert (df["executed_as"] == "eager").all()
        assert not (variants & GRAPH_VARIANTS)
        assert not any(v.startswith("reduce-overhead") for v in df["variant"])
        assert df["floor_us"].isna().all() and df["kernels_per_call"].isna().all()
        assert (df["device"] == "CPU (no CUDA)").all()
        assert env["reduce_overhead_stale_output"] is None and env["reduce_overhead_stale_output_first_call"] is None
        assert list(df[df["case"] == mlp_case[0]]["variant"]) == ["eager"]
        # the comparisons are GPU comparisons: a CPU run saves an empty claims.csv and says so
        assert claims.empty and sources == {}
        assert env["reduce_overhead_mlp"].startswith("not measured")
