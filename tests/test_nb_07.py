"""Notebook 07 executed by papermill (small); assertions on the local torchrun run it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook


def test_data_parallel_notebook_records_its_local_run(run_notebook):
    folder = run_notebook("07_data_parallel", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    per_rank = pd.read_csv(folder / "per_rank.csv")
    assert {"case", "variant", "executed_as", "median_us", "speedup", "images_per_s", "p99_us",
            "rank_median_spread_us", "step_rank_diff_p99_us", "host_median_us"} <= set(df.columns)
    assert (df.median_us > 0).all() and (df.images_per_s > 0).all()
    assert df.speedup.iloc[0] == 1.0  # the eager run is the baseline
    # the single-process check: graphed (or, without CUDA, the kit's eager) DDP trained exactly like eager DDP
    assert env["demo_max_param_diff"] < 1e-5
    ranks = env["world_size"]
    assert (df.ranks == ranks).all() and sorted(per_rank["rank"].unique()) == list(range(ranks))
    assert (per_rank.steps == df.steps.iloc[0]).all() and df.steps.iloc[0] == 20  # SMOKE: 20 timed steps per rank
    if torch.cuda.is_available():
        assert list(df.variant) == ["eager", "whole-step graph"]
        assert df.executed_as.tolist() == ["eager", "cuda graph"] and bool(df.parity_ok.iloc[1])
        assert env["demo_mode"] == "graph" and env["gpu"]
    else:  # honest labels: two gloo processes, eager, nothing called a graph
        assert ranks == 2 and list(df.variant) == ["eager"] and (df.executed_as == "eager").all()
        assert (df.clock == "host (CPU)").all()
        assert env["demo_mode"] == "eager" and env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    assert (folder / "step_time_distributions.png").stat().st_size > 10_000
