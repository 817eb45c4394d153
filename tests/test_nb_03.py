"""Notebook 03 (jit.script / torch.compile with graphs): execute it small and check what it recorded."""
import json

import pandas as pd
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
IP = ", input in place"
GRAPH_VARIANTS = {"cuda graph", "cuda graph" + IP, "jit.script + graph", "jit.script + graph" + IP,
                  "torch.compile + graph", "torch.compile + graph" + IP}
PHASE_1, PHASE_2 = "1: before mark_step_begin", "2: after mark_step_begin"
STALE_OUTCOMES = {"raises RuntimeError", "kept (y1 still holds f(x1))", "silently overwritten"}
CLAIM_COLUMNS = ["claim", "statement", "verdict", "lo", "hi", "above"]
GELU_CLAIMS = ("graph_beats_eager", "fusion_beats_graph", "fusion_adds_to_graph", "graph_adds_to_fusion",
               "ro_naive_beats_eager", "ro_static_beats_eager")
OTHER_CLAIMS = {"compiled_graph_slower_mlp", "ro_beats_eager_mlp", "ro_beats_compile_mlp", "ro_beats_eager_training",
                "kit_beats_ro_training"}
MLP_CASE = "MLP 12x(Linear 256+ReLU), batch 8"
TRAIN_CASE = MLP_CASE + ", SGD training step"
# claims on a variant's speedup over its case's eager: (case, variant) whose saved interval the claim must carry
SPEEDUP_CLAIMS = {**{f"graph_beats_eager_{c}": (c, "cuda graph" + IP) for c in ("small", "large")},
                  **{f"ro_naive_beats_eager_{c}": (c, "reduce-overhead, naive (y = f(x))") for c in ("small", "large")},
                  **{f"ro_static_beats_eager_{c}": (f"{c}, phase 2", "reduce-overhead, static input")
                     for c in ("small", "large")},
                  "ro_beats_eager_mlp": (MLP_CASE, "reduce-overhead + mark_step_begin"),
                  "ro_beats_eager_training": (TRAIN_CASE, "reduce-overhead forward+backward")}


def expected_verdict(lo, hi, above):
    return "holds" if lo > above else "fails" if hi <= above else "unclear"


def plain(variant):
    return variant.replace(" (eager fallback)", "")


@pytest.mark.notebook
def test_nb_03_records_correct_variants(run_notebook):
    folder = run_notebook("03_jit_compile", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())

    # the schema every notebook shares, plus this notebook's columns
    for col in ("case", "shape", "phase", "variant", "median_us", "windows", "speedup", "speedup_lo", "speedup_hi",
                "floor_us", "kernels_per_call", "copies_per_call", "max_abs_err", "executed_as", "matmul_precision"):
        assert col in df.columns, col
    phase_2_gelu = {"small, phase 2", "large, phase 2"} if HAS_CUDA else set()
    train = {TRAIN_CASE} if HAS_CUDA else set()  # the training step needs reduce-overhead: a GPU
    assert set(df["case"]) == {"small", "large", MLP_CASE, *phase_2_gelu, *train}
    assert (folder / "time_per_call.png").stat().st_size > 10_000

    # correctness: every executed variant agrees with eager on fresh data
    assert df["max_abs_err"].notna().all()
    gelu = df[df["case"].str.contains("small|large")]
    assert (gelu["max_abs_err"] < 1e-4).all(), gelu[["case", "variant", "max_abs_err"]]

    # every case has eager first as its own baseline, and one phase: the GELU of sections 2-4 before the first
    # mark_step_begin, everything timed after it in phase 2
    for case, rows in df.groupby("case", sort=False):
        assert rows["variant"].iloc[0] == "eager" and rows["speedup"].iloc[0] == 1.0, case
        assert rows["phase"].nunique() == 1, case
    assert set(df[df["case"].isin(["small", "large"])]["phase"]) == {PHASE_1}
    assert (df[~df["case"].isin(["small", "large"])]["phase"] == PHASE_2).all()
    assert (df[df["case"] == MLP_CASE]["shape"] == "8x256").all()

    # every number is a median over timing windows (smoke run: 2), published with its prediction interval
    assert (df["windows"] == 2).all(), df[["case", "variant", "windows"]]
    timed = df[df["variant"] != "eager"]
    assert (timed["speedup_lo"] <= timed["speedup"]).all() and (timed["speedup"] <= timed["speedup_hi"]).all()
    assert (timed["window_speedups"].astype(str).str.count(";") == 1).all()

    w1 = df[df["phase"] == PHASE_1]
    # jit.script where TorchScript still runs, and torch.compile (SMOKE: at least the small case)
    if hasattr(torch, "jit") and hasattr(torch.jit, "script"):
        assert (w1["variant"] == "jit.script").sum() == 2
        assert env["torchscript_fuser"]
    assert ((w1["variant"] == "torch.compile") & (w1["case"] == "small")).any()

    # the comparative sentences are claims computed from the intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv")
    assert list(claims.columns) == CLAIM_COLUMNS and claims["claim"].is_unique
    assert {"graph_beats_eager_small", "graph_beats_eager_large", "fusion_beats_graph_small"} <= set(claims["claim"])
    for c in claims.itertuples():
        if c.claim in SPEEDUP_CLAIMS:  # the interval is the saved row's prediction interval
            case, variant = SPEEDUP_CLAIMS[c.claim]
            row = df[(df["case"] == case) & (df["variant"].map(plain) == variant)].iloc[0]
            assert (c.lo, c.hi) == pytest.approx((row["speedup_lo"], row["speedup_hi"])), c.claim
        if HAS_CUDA:
            assert c.verdict == expected_verdict(c.lo, c.hi, c.above), c
            assert not any(w in c.statement for w in ("holds", "fails", "unclear")), c.statement  # plain sentences
        else:  # no verdict about a graph that was not built: every claim here compares a graph that ran eagerly
            assert c.verdict == "eager fallback" and "ran eagerly" in c.statement, c

    if HAS_CUDA:
        assert env["executed_as"] == "cuda"
        assert env["matmul_precision"] == "high" and (df["matmul_precision"] == "high").all()
        graphed = df[df["variant"].isin(GRAPH_VARIANTS) | df["variant"].str.startswith("reduce-overhead")]
        assert (graphed["executed_as"] == "cuda graph").all()
        # floors exist for rows that ran purely as graph replays (the manual graphs); counts for every row
        assert df[df["variant"].isin(GRAPH_VARIANTS)]["floor_us"].notna().all() and df["kernels_per_call"].notna().all()
        # g(x) copies its input into the graph (a memcpy); replaying in place copies nothing
        assert (w1[w1["variant"] == "cuda graph"]["copies_per_call"] >= 1).all()
        assert (w1[w1["variant"] == "cuda graph" + IP]["copies_per_call"] == 0).all()
        # what reading a stale reduce-overhead output did, measured: from a replay and from a warm-up run
        assert env["reduce_overhead_stale_output"] in STALE_OUTCOMES
        assert env["reduce_overhead_stale_output_first_call"] in STALE_OUTCOMES
        # the deeper MLP: every variant timed in the same windows, reduce-overhead among them
        mlp = df[df["case"] == MLP_CASE].set_index("variant")
        assert {"eager", "torch.compile", "reduce-overhead + mark_step_begin", "cuda graph", "cuda graph" + IP,
                "torch.compile + graph" + IP} <= set(mlp.index)
        assert mlp.loc["eager", "kernels_per_call"] >= 2 * 12  # Linear + ReLU per layer, launched one by one
        # a fair comparison: the compiled forward's kernels are not far slower on the GPU than eager's
        eager_floor, compiled_floor = mlp.loc["cuda graph" + IP, "floor_us"], mlp.loc["torch.compile + graph" + IP,
                                                                                       "floor_us"]
        assert eager_floor > 0 and compiled_floor > 0
        assert compiled_floor < 1.5 * eager_floor, (eager_floor, compiled_floor)
        # the training step: parity first, then the same windows; its claims come from that table
        steps = df[df["case"] == TRAIN_CASE].set_index("variant")
        assert list(steps.index) == ["eager", "reduce-overhead forward+backward", "kit whole-step graph"]
        assert (steps["max_abs_err"] < 1e-4).all()
        assert steps.loc["kit whole-step graph", "executed_as"] == "cuda graph"
        # every claim of the GPU run is there
        expected = {f"{k}_{case}" for k in GELU_CLAIMS for case in ("small", "large")} | OTHER_CLAIMS
        if (w1["variant"] == "jit.script").any():
            expected |= {"compile_beats_script_graph_small", "compile_beats_script_graph_large"}
        assert set(claims["claim"]) == expected
    else:
        # honest labels: nothing that ran eagerly is called a graph, and no GPU-only measurement is made up
        assert env["executed_as"].startswith("cpu")
        assert (df["executed_as"] == "eager").all()
        graph_rows = df[df["variant"].map(plain).isin(GRAPH_VARIANTS)]
        assert len(graph_rows) and graph_rows["variant"].str.endswith(" (eager fallback)").all()
        assert not any(v.startswith("reduce-overhead") for v in df["variant"])
        assert df["floor_us"].isna().all() and df["kernels_per_call"].isna().all()
        assert (df["device"] == "CPU (no CUDA)").all()
        assert env["reduce_overhead_stale_output"] is None and env["reduce_overhead_stale_output_first_call"] is None
        assert list(df[df["case"] == MLP_CASE]["variant"].map(plain)) == ["eager", "cuda graph", "cuda graph" + IP]
        assert not any(c.startswith("ro_") or c in OTHER_CLAIMS for c in claims["claim"])
