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


def test_issue_time_reads_cpu_bound_from_the_first_steps_not_from_the_host_time_between_returns():
    """Section 5's rule (scripts/ddp_train.issue_times): over a whole run the host time between step returns is
    about the step time in every run, waiting included; the host time of the first steps after the window's
    opening synchronize is the time to issue a step. Synthetic steps of the three kinds of run the sweep has."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import ddp_train

    rows = []
    for rank in (0, 1):
        for step in range(40):
            # eager, CPU-bound: issuing takes the whole step from the first step on (rank 1 a little slower)
            rows.append(("m", "eager", rank, step, 1000.0 + 50 * rank, 1000.0 + 50 * rank))
            # graphed: the CPU issues in 50 µs until it is 10 steps ahead, then waits: host time = step time
            rows.append(("m", "whole-step graph", rank, step, 300.0, 50.0 if step < 10 else 300.0))
            # a synchronize per step: the CPU waits from the first step on, so no issue time
            rows.append(("m", "whole-step graph, sync each step", rank, step, 350.0, 350.0))
    steps = pd.DataFrame(rows, columns=["case", "variant", "rank", "step", "step_us", "host_us"])
    host_share = steps.groupby("variant").host_us.median() / steps.groupby("variant").step_us.median()
    assert (host_share > 0.99).all()  # the old rule (host time close to the step time) calls every run CPU-bound
    t = ddp_train.issue_times(steps).set_index("variant")
    assert t.loc["eager", "issue_us"] == pytest.approx(1050.0)  # the slowest rank's
    assert t.loc["eager", "cpu_bound"] is True and t.loc["whole-step graph", "cpu_bound"] is False
    assert t.loc["whole-step graph", "issue_share"] == pytest.approx(50 / 300)
    sync = t.loc["whole-step graph, sync each step"]
    assert sync.cpu_bound is None and sync.issue_us != sync.issue_us  # NaN: no issue time with a sync per step
