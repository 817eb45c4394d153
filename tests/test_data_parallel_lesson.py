"""Notebook 07's sentences about the recorded two-GPU sweep: each model's throughput in its own unit, and the
jitter takeaway built from the recorded spread across ranks (CPU: they read the committed figures)."""
import sys
from pathlib import Path

import pandas as pd
import pytest

from cudagraph_kit.course.lessons.data_parallel import sweep_pairs, sweep_sentences, sweep_takeaways
from cudagraph_kit.course.measuring import results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    rec = results.load("07_data_parallel_sweep")
    if rec is None:
        pytest.skip("no recorded two-GPU sweep in figures/")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ddp_train
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return rec.df, sweep_pairs(rec.df, ddp_train.issue_times(pd.read_csv(rec.dir / "steps.csv.gz")))


def test_each_model_has_its_own_unit(sweep):
    df, pairs = sweep
    text = sweep_sentences(pairs, df)
    assert "MLP: " in text and "ResNet-50: " in text
    mlp, resnet = text.split("ResNet-50: ")[0], text.split("ResNet-50: ")[1]
    assert "samples/s" in mlp and "images/s" not in mlp
    assert "images/s" in resnet.split("\n\n")[0]


def test_the_jitter_takeaway_quotes_the_recorded_spread_across_ranks(sweep):
    df, pairs = sweep
    jitter = [t for t in sweep_takeaways(pairs, df) if "slowest rank" in t]
    assert len(jitter) == 1
    for label, (e, g, _, _) in pairs.items():
        assert f"{label} {e.step_rank_diff_p99_us:,.0f} µs eager, {g.step_rank_diff_p99_us:,.0f} µs graphed" in jitter[0]
