"""Notebook 02 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json
import re

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook

PARTS = {"whole eager step", "zero_grad", "forward + loss", "zero_grad + forward + loss + backward",
         "optimizer.step() alone"}
SIZES = {"32x128x256x16": "small", "640x4096x2048x1024": "docs"}
OPTS = {"SGD": "sgd", "Adam(capturable)": "adam"}


def expected_verdict(lo, hi, above):
    if not (lo == lo and hi == hi):
        return "unclear"
    return "holds" if lo > above else "fails" if hi <= above else "unclear"


def test_train_step_notebook_records_parity_and_honest_labels(run_notebook):
    folder = run_notebook("02_train_step", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us", "kernels_per_call",
            "max_abs_param_diff", "params_bitwise_equal", "eager_steps"} <= set(df.columns)

    # timings: eager and the kit's whole step for SGD and Adam on the blog's MLP; eager is its own baseline
    timed = df[df.median_us.notna()]
    for opt in ("SGD", "Adam(capturable)"):
        rows = timed[timed.case == f"MLP 32x128x256x16, {opt}"]
        assert rows.variant.iloc[0] == "eager" and rows.speedup.iloc[0] == 1.0
        assert rows.variant.str.startswith("whole-step graph").any()
    assert (timed.median_us > 0).all()

    # every timed row comes from the windows (smoke run: 2), with its speedup inside its prediction interval
    others = timed[timed.variant != "eager"]
    assert len(others) and (timed.windows == 2).all()
    assert (others.speedup_lo <= others.speedup).all() and (others.speedup <= others.speedup_hi).all()
    assert (others.window_speedups.str.count(";") == 1).all()

    # where the eager step's time goes: every part timed, for both optimizers, in every window
    for opt in ("SGD", "Adam(capturable)"):
        parts = timed[timed.case == f"eager step parts, MLP 32x128x256x16, {opt}"]
        assert set(parts.variant) == PARTS
        assert parts.variant.iloc[0] == "whole eager step"
        whole = parts[parts.variant == "whole eager step"].median_us.iloc[0]
        # each part does a subset of the whole step's work; allow timing noise (a CPU shared with other test
        # processes makes eager times jump several-fold between windows)
        assert (parts.median_us < (3 if torch.cuda.is_available() else 10) * whole).all()

    # parity: three training runs (SGD, Adam without dropout; SGD with dropout), each with short batches
    parity = df[df.case.str.startswith("parity") & ~df.case.str.contains("AMP")].set_index("case")
    parity = parity.astype({"dropout": bool, "params_bitwise_equal": bool})  # NaN in timing rows made them object
    assert len(parity) == 3
    assert (parity.steps >= 40).all() and (parity.eager_steps >= 3).all()  # one short batch per 11 steps
    assert (parity.moved_from_init > 1e-3).all()  # the runs trained, so a zero difference means something
    no_dropout = parity[~parity.dropout]
    assert len(no_dropout) == 2
    assert (no_dropout.max_abs_param_diff < 1e-6).all()
    assert (no_dropout.max_abs_loss_diff < 1e-6).all()
    dropout = parity[parity.dropout].iloc[0]
    assert abs(dropout.mean_loss_last_quarter_variant / dropout.mean_loss_last_quarter_eager - 1) < 0.25

    amp_parity = df[df.case.str.startswith("parity") & df.case.str.contains("AMP")]
    amp_timed = timed[timed.case.str.contains("AMP")]
    if torch.cuda.is_available():
        assert (df[df.variant == "whole-step graph"].executed_as == "cuda graph").all()
        assert env["gpu"]
        # AMP through capture_train_step: fp16 + GradScaler always, bf16 where the GPU has it
        expected = ["bf16", "fp16 + GradScaler"] if env["bf16"] else ["fp16 + GradScaler"]
        assert env["amp_cases"] == expected
        # the plain torch.cuda.make_graphed_callables cell checked output and gradients against eager
        assert env["plain_make_graphed_callables_grad_err"] is not None
        assert env["plain_make_graphed_callables_grad_err"] < 1e-4
        for label in expected:
            rows = amp_timed[amp_timed.case == f"MLP 32x128x256x16, SGD, AMP {label}"]
            if "GradScaler" in label:  # plain SGD (the scaler reads the inf check on the host) and fused SGD
                assert list(rows.variant) == ["eager", "whole-step graph", "whole-step graph, SGD(fused=True)"]
                assert rows.executed_as.tolist() == ["eager", "cuda graph", "cuda graph"]
            else:
                assert list(rows.variant) == ["eager", "whole-step graph"]
                assert rows.executed_as.tolist() == ["eager", "cuda graph"]
        assert len(amp_parity) == len(expected) + 1  # fp16 + GradScaler: with SGD and with SGD(fused=True)
        assert (amp_parity.max_abs_param_diff < 1e-4).all() and (amp_parity.moved_from_init > 1e-3).all()
        # the Adam eager rows are Adam(capturable=True), like the graph's; the default Adam is a row of its own
        for size in SIZES:
            rows = timed[timed.case == f"MLP {size}, Adam(capturable)"]
            assert list(rows.variant) == ["eager", "whole-step graph", "make_graphed_callables (model only)",
                                          "default eager Adam (capturable=False)"]
        # the Adam parity check: which hyper-parameters the graph reads as tensors, and the graph against an eager
        # run given the same tensors on the same steps
        check = env["adam_tensor_hparams_check"]
        assert "lr" in check["tensor_hparams"] and isinstance(check["graph_equals_tensor_eager"], bool)
        assert check["graph_vs_tensor_eager_max_diff"] < 1e-5 and check["graph_vs_eager_max_diff"] < 1e-5
        # the floor and kernel counts of the parts come from the profiler
        parts = timed[timed.case.str.startswith("eager step parts")]
        assert parts.kernels_per_call.notna().all()
        whole = parts[parts.variant == "whole eager step"]
        assert (whole.kernels_per_call > parts[parts.variant == "forward + loss"].kernels_per_call.values).all()
        # if autograd's AccumulateGrad stream warning was raised (once per process) by section 5's
        # make_graphed_callables rows, the first to make one, or else by the plain call, the notebook recorded where
        warned = env["accumulate_grad_stream_warning"]
        assert warned is None or (warned[0] in ("section 5's make_graphed_callables rows",
                                                "the plain make_graphed_callables cell") and warned[1] in set(df.case))
    else:
        # eager fallback runs the same code as the eager loop: identical, dropout included
        assert (parity.max_abs_param_diff == 0).all() and parity.params_bitwise_equal.all()
        # honest labels: nothing that ran on the CPU is called a graph; no AMP rows without a GPU
        assert (df.executed_as == "eager").all()
        graphish = df[df.variant.str.contains("graph")]
        assert len(graphish) == 5 and graphish.variant.str.endswith("(eager fallback)").all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
        assert env["plain_make_graphed_callables_grad_err"] is None  # the plain API needs a GPU
        assert len(amp_parity) == 0 and len(amp_timed) == 0 and env["amp_cases"] == []
        assert env["adam_tensor_hparams_check"] is None  # the Adam check needs capturable=True, a GPU
    assert (folder / "loss_curves.png").stat().st_size > 10_000
    assert (folder / "step_time.png").is_file()

    # the comparative sentences are claims computed from the windows' intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv")
    assert list(claims.columns) == ["claim", "statement", "verdict", "lo", "hi", "above"]
    expected_ids = {f"{what}_{o}" for what in ("optimizer_step_adds_time", "backward_adds_time") for o in OPTS.values()}
    expected_ids |= {f"graph_beats_eager_small_{o}" for o in OPTS.values()}
    if torch.cuda.is_available():
        for size, s in SIZES.items():
            for opt, o in OPTS.items():
                expected_ids |= {f"graph_beats_eager_{s}_{o}", f"model_only_beats_eager_{s}_{o}",
                                 f"graph_beats_model_only_{s}_{o}"}
                graph = timed[(timed.case == f"MLP {size}, {opt}") & (timed.variant == "whole-step graph")].iloc[0]
                if graph.floor_us > 0:  # a floor was measured: the graph-within-floor verdict is there
                    expected_ids.add(f"graph_within_floor_{s}_{o}")
            expected_ids.add(f"default_adam_beats_capturable_{s}")
        expected_ids |= {"amp_graph_beats_eager_fp16", "fused_sgd_graph_beats_plain_sgd_graph_fp16"}
        if env["bf16"]:
            expected_ids.add("amp_graph_beats_eager_bf16")
    assert set(claims.claim) == expected_ids and claims.claim.is_unique
    # a claim about a graph is a verdict only where the graph was built; the parts of an eager step are eager on
    # both sides, so they get a verdict on a CPU too
    about_graph = ~claims.claim.str.contains("adds_time")
    if torch.cuda.is_available():
        assert set(claims.verdict) <= {"holds", "fails", "unclear"}
    else:
        assert (claims[about_graph].verdict == "eager fallback").all()
        assert all("no GPU" in s for s in claims[about_graph].statement)
    for c in claims[claims.verdict != "eager fallback"].itertuples():  # the verdict follows from the saved interval
        below = c.claim.startswith("graph_within_floor")  # "within 1.1x of the floor": the interval lies below
        expected = (expected_verdict(1 / c.hi, 1 / c.lo, 1 / c.above) if below and c.lo > 0
                    else expected_verdict(c.lo, c.hi, c.above))
        assert c.verdict == expected, c
        assert ("too close" in c.statement) == (expected == "unclear"), c
        assert not re.search(r"\b(nan|holds|fails)\b", c.statement, re.IGNORECASE), c  # plain sentences
        assert c.lo <= c.hi
    for c in claims[claims.claim.str.startswith("graph_beats_eager_")].itertuples():  # from the table's interval
        size = next(k for k, v in SIZES.items() if f"_{v}_" in c.claim)
        opt = next(k for k, v in OPTS.items() if c.claim.endswith(f"_{v}"))
        row = timed[(timed.case == f"MLP {size}, {opt}") & timed.variant.str.startswith("whole-step graph")].iloc[0]
        assert (c.lo, c.hi) == pytest.approx((row.speedup_lo, row.speedup_hi))
