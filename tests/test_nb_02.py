"""Notebook 02 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook


def test_train_step_notebook_records_parity_and_honest_labels(run_notebook):
    folder = run_notebook("02_train_step", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us",
            "max_abs_param_diff", "params_bitwise_equal", "eager_steps"} <= set(df.columns)

    # timings: eager and the kit's whole step for SGD and Adam on the blog's MLP; eager is its own baseline
    timed = df[df.median_us.notna()]
    for opt in ("SGD", "Adam(capturable)"):
        rows = timed[timed.case == f"MLP 32x128x256x16, {opt}"]
        assert rows.variant.iloc[0] == "eager" and rows.speedup.iloc[0] == 1.0
        assert rows.variant.str.startswith("whole-step graph").any()
    assert (timed.median_us > 0).all()

    # parity: three training runs (SGD, Adam without dropout; SGD with dropout), each with short batches
    parity = df[df.case.str.startswith("parity")].set_index("case")
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

    if torch.cuda.is_available():
        assert (df[df.variant == "whole-step graph"].executed_as == "cuda graph").all()
        assert env["gpu"]
    else:
        # eager fallback runs the same code as the eager loop: identical, dropout included
        assert (parity.max_abs_param_diff == 0).all() and parity.params_bitwise_equal.all()
        # honest labels: nothing that ran on the CPU is called a graph
        assert (df.executed_as == "eager").all()
        graphish = df[df.variant.str.contains("graph")]
        assert len(graphish) == 5 and graphish.variant.str.endswith("(eager fallback)").all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    assert (folder / "loss_curves.png").stat().st_size > 10_000
    assert (folder / "step_time.png").is_file()
