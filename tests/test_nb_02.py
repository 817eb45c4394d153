"""Notebook 02 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook

PARTS = {"whole eager step", "zero_grad", "forward + loss", "zero_grad + forward + loss + backward",
         "optimizer.step() alone"}


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

    # where the eager step's time goes: every part timed, for both optimizers, in one window each
    for opt in ("SGD", "Adam(capturable)"):
        parts = timed[timed.case == f"eager step parts, MLP 32x128x256x16, {opt}"]
        assert set(parts.variant) == PARTS
        assert parts.variant.iloc[0] == "whole eager step"
        whole = parts[parts.variant == "whole eager step"].median_us.iloc[0]
        # each part does a subset of the whole step's work; allow timing noise on a shared CPU
        assert (parts.median_us < 3 * whole).all()

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
            assert list(rows.variant) == ["eager", "whole-step graph"]
            assert rows.executed_as.tolist() == ["eager", "cuda graph"]
        assert len(amp_parity) == len(expected)
        assert (amp_parity.max_abs_param_diff < 1e-4).all() and (amp_parity.moved_from_init > 1e-3).all()
        # the floor and kernel counts of the parts come from the profiler
        parts = timed[timed.case.str.startswith("eager step parts")]
        assert parts.kernels_per_call.notna().all()
        whole = parts[parts.variant == "whole eager step"]
        assert (whole.kernels_per_call > parts[parts.variant == "forward + loss"].kernels_per_call.values).all()
        # if autograd's AccumulateGrad stream warning was raised, the notebook recorded who raised it, and where
        warned = env["accumulate_grad_stream_warning"]
        assert warned is None or (warned[1] in set(df.case) and (
            warned[0] in ("the timing", "make_graphed_callables' warm-up and capture")
            or warned[0].removeprefix("the first steps of ").strip("'") in set(df.variant)))
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
    assert (folder / "loss_curves.png").stat().st_size > 10_000
    assert (folder / "step_time.png").is_file()
