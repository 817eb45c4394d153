"""Notebook 01 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook


def test_gelu_notebook_records_correct_and_honest_results(run_notebook):
    folder = run_notebook("01_gelu", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us"} <= set(df.columns)
    assert {"small", "large"} <= set(df.case)
    assert (df.median_us > 0).all()
    # correctness was checked against eager and recorded
    main = df[df.case.isin(["small", "large"])]
    assert (main.max_abs_err < 1e-6).all()
    # the first variant of every comparison is its own baseline (calls-per-graph rows compare with eager small)
    firsts = df[df.case != "small, calls per graph"].groupby("case").speedup.first()
    assert (firsts == 1.0).all()
    # the sweep covers several sizes and the calls-per-graph study is there
    assert df.case.str.startswith("sweep").sum() >= 2 * 5
    assert sorted(df.calls_per_graph.dropna().unique()) in ([1, 10], [1, 10, 100])
    if torch.cuda.is_available():
        assert (df[df.variant.str.startswith("graph")].executed_as == "cuda graph").all()
        assert env["gpu"]
    else:  # honest labels: nothing that ran on the CPU is called a graph
        assert (df.executed_as == "eager").all()
        assert df[df.variant.str.contains("graph")].variant.str.endswith("(eager fallback)").all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    assert (folder / "size_sweep.png").stat().st_size > 10_000
    assert (folder / "calls_per_graph.png").is_file()
