"""Notebook 04 executed by papermill (SMOKE: tiny, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook

CUDA = torch.cuda.is_available()


def test_resnet50_notebook_records_sweep_training_feeding_and_parity(run_notebook):
    folder = run_notebook("04_resnet50", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us", "section", "batch",
            "images_per_s"} <= set(df.columns)

    # inference: an eager and a graph row for every batch size of the SMOKE sweep (1, 2), each checked vs eager
    inf = df[df.section == "inference"]
    dtypes = set(inf.dtype)
    assert dtypes == ({"fp16", "bf16"} if CUDA and torch.cuda.get_device_capability() >= (8, 0)
                      else {"fp16"} if CUDA else {"fp32 (CPU)"})
    for dtype in dtypes:
        rows = inf[inf.dtype == dtype]
        assert sorted(rows.batch.unique()) == [1, 2]
        for b in (1, 2):
            pair = rows[rows.batch == b]
            assert list(pair.variant.str.split(" \\(").str[0]) == ["eager", "cuda graph"]
            assert pair.speedup.iloc[0] == 1.0 and (pair.median_us > 0).all()
            graph = pair.iloc[1]
            assert bool(graph.correct) and graph.max_abs_diff <= 1e-2 * 200
            assert graph.images_per_s == pytest.approx(b / (graph.median_us * 1e-6))

    # training: eager and whole-step graph, SGD and AdamW, for the SMOKE batch; losses compared before timing
    tr = df[df.section == "training"]
    assert set(tr.optimizer) == {"SGD momentum", "AdamW"} and set(tr.batch) == {2}
    graphs = tr[tr.variant.str.startswith("whole-step graph")]
    assert len(graphs) == len(tr) // 2 and (graphs.max_rel_loss_diff < 2e-2).all()
    assert (tr.ms_per_step == tr.median_us / 1e3).all()

    # data feeding: three measurements and a verdict on what limits throughput
    feed = df[df.section == "data feeding"]
    assert list(feed.variant) == ["loader only", "step only", "loader + step"]
    assert (feed.images_per_s > 0).all() and feed.bound_by.nunique() == 1

    # accuracy parity on digits: validation accuracy per epoch for eager and graphed, final parameters compared
    par = df[df.section == "accuracy parity"]
    per_epoch = par[par.val_acc.notna()]
    eager = per_epoch[per_epoch.variant == "eager"].sort_values("epoch")
    graphed = per_epoch[per_epoch.variant != "eager"]
    graphed = graphed[~graphed.case.duplicated(keep="last")].sort_values("epoch")  # the graphed run's rows
    assert list(eager.epoch) == [1, 2] and list(graphed.epoch) == [1, 2]
    assert eager.val_acc.iloc[-1] > 0.8  # it learned (chance is 0.1)
    assert (graphed.val_acc.values - eager.val_acc.values).__abs__().max() <= 0.02
    finals = par[par.case.str.contains("final parameters")].set_index("case")
    main = finals.loc["parity digits CNN final parameters, graphed vs eager"]
    acc = finals.loc["parity digits CNN final parameters, accumulate=4, graphed vs eager"]
    assert main.eager_steps == 2 and acc.eager_steps == 1  # the short last batch of each epoch ran eagerly

    if CUDA:
        assert (inf[inf.variant.str.startswith("cuda graph")].executed_as == "cuda graph").all()
        assert (graphs.executed_as == "cuda graph").all()
        assert main.replays > 0 and acc.replays > 0
        # eager SGD(fused) gets the LR as a Python float, the graph from a float32 tensor: rounding-level drift
        assert main.max_abs_param_diff < 1e-3 and acc.max_abs_param_diff < 1e-3
        assert env["gpu"]
    else:
        # honest labels: nothing that ran on the CPU is called a graph; the kit's eager fallback is exact
        assert (df.executed_as == "eager").all()
        graphish = df[df.variant.str.contains("graph")]
        assert len(graphish) and graphish.variant.str.contains("eager fallback").all()
        assert main.max_abs_param_diff == 0 and bool(main.params_bitwise_equal)
        assert acc.max_abs_param_diff == 0 and bool(acc.params_bitwise_equal)
        assert (graphed.val_acc.values == eager.val_acc.values).all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    for png in ("inference_sweep", "training_throughput", "accuracy_parity"):
        assert (folder / f"{png}.png").stat().st_size > 10_000
