"""Notebook 04 executed by papermill (SMOKE: tiny, on whatever machine runs the tests); assertions on what it recorded."""
import json
import re

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook

CUDA = torch.cuda.is_available()
BF16 = CUDA and torch.cuda.get_device_capability() >= (8, 0)  # bf16 tensor cores, not torch's emulation check
PAYS = 1.10  # the notebook's threshold: the graph "pays" above it


def tag(name):
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def expected_verdict(c):
    return "holds" if c.lo > c.above else "fails" if c.hi <= c.above else "unclear"


def test_resnet50_notebook_records_sweep_training_feeding_and_parity(run_notebook):
    folder = run_notebook("04_resnet50", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "executed_as", "median_us", "speedup", "floor_us", "section", "batch",
            "images_per_s", "windows", "median_pi_lo", "median_pi_hi", "speedup_lo", "speedup_hi"} <= set(df.columns)

    # inference: an eager and a graph row for every batch size of the SMOKE sweep (1, 2), each checked vs eager
    inf = df[df.section == "inference"].astype({"batch": int})
    dtypes = set(inf.dtype)
    assert dtypes == ({"fp16"} if CUDA else {"fp32 (CPU)"})
    for dtype in dtypes:
        rows = inf[inf.dtype == dtype]
        assert sorted(rows.batch.unique()) == [1, 2]
        for b in (1, 2):
            pair = rows[rows.batch == b]
            assert list(pair.variant.str.split(" \\(").str[0]) == ["eager", "cuda graph"]
            assert pair.speedup.iloc[0] == 1.0 and (pair.median_us > 0).all()
            graph = pair.iloc[1]
            assert pair.max_abs_diff.iloc[0] == 0  # the eager row is the reference
            if CUDA:  # the replayed kernels against eager on a fresh input, within the tolerance the notebook used
                assert "tolerance" in df, ("notebook 04 records no tolerance column beside max_abs_diff: "
                                           "record the bound its graph-vs-eager check used")
                assert 0 <= graph.max_abs_diff <= graph.tolerance, graph
            else:  # the kit's eager fallback runs the same function on the same input: exactly eager's output
                assert graph.max_abs_diff == 0, graph
            assert graph.images_per_s == pytest.approx(b / (graph.median_us * 1e-6))
            # the speedup of a window is its eager median over its graph median: the combined median lies between
            assert graph.speedup > 0 and graph.window_speedups.count(";") == 1

    # training: eager and whole-step graph, SGD and AdamW, for the SMOKE batch; losses compared before timing
    tr = df[df.section == "training"].astype({"batch": int})
    assert set(tr.optimizer) == {"SGD momentum", "AdamW"} and set(tr.batch) == {8 if CUDA else 2}
    assert set(tr.dtype) == ({"bf16", "fp16+GradScaler"} if BF16 else {"fp16+GradScaler"} if CUDA else {"fp32 (CPU)"})
    graphs = tr[tr.variant.str.startswith("whole-step graph")]
    assert len(graphs) == len(tr) // 2
    # SGD runs the same optimizer code eagerly and in the graph: the losses agree exactly, in bf16 and in fp16 with
    # a GradScaler (the scaler's skipped steps included), so the kit's warm-up leaves the scaler's state as eager
    # training does (the committed H200 run: bitwise equal over 6 steps at bs32 and bs128). AdamW is the default
    # implementation eagerly and capturable=True in the graph: two orderings of the same update that drift apart
    # (6% after 6 steps in the committed bf16 bs32 run): held to the notebook's own 10% bound.
    sgd = graphs.optimizer == "SGD momentum"
    assert (graphs[sgd].max_rel_loss_diff <= 1e-6).all(), graphs[sgd][["case", "losses_eager", "losses_graph"]]
    assert (graphs[~sgd].max_rel_loss_diff < 0.1).all()
    # both columns went through the CSV: equal to its precision, not bit for bit
    assert list(tr.ms_per_step) == pytest.approx(list(tr.median_us / 1e3), rel=1e-9)
    # both sides' optimizer settings are in the label: eager AdamW is the default one, the graph's capturable
    adamw = tr[tr.optimizer == "AdamW"].case
    assert adamw.str.contains("eager: capturable=False").all() and adamw.str.contains("graph: capturable=True").all()

    # every timed comparison is a median of windows with a prediction interval (smoke run: 2 windows)
    timed = pd.concat([inf, tr])
    assert (timed.windows == 2).all()
    assert ((timed.median_pi_lo <= timed.median_us) & (timed.median_us <= timed.median_pi_hi)).all()
    compared = timed[timed.variant != "eager"]
    assert len(compared) == len(timed) // 2
    assert ((compared.speedup_lo <= compared.speedup) & (compared.speedup <= compared.speedup_hi)).all()
    eager = timed[timed.variant == "eager"]
    assert (eager.speedup == 1.0).all()

    # data feeding: three measurements in windows and a verdict on what limits throughput
    feed = df[df.section == "data feeding"]
    assert list(feed.variant) == ["loader only", "step only", "loader + step"]
    assert (feed.images_per_s > 0).all() and feed.bound_by.nunique() == 1
    assert (feed.windows == 2).all() and ((feed.median_pi_lo <= feed.median_us) & (feed.median_us <= feed.median_pi_hi)).all()

    # accuracy parity on digits: validation accuracy per epoch for eager and graphed, final parameters compared
    par = df[df.section == "accuracy parity"]
    per_epoch = par[par.val_acc.notna()]
    eager_acc = per_epoch[per_epoch.variant == "eager"].sort_values("epoch")
    graphed = per_epoch[per_epoch.variant != "eager"]
    graphed = graphed[~graphed.case.duplicated(keep="last")].sort_values("epoch")  # the graphed run's rows
    assert list(eager_acc.epoch) == [1, 2] and list(graphed.epoch) == [1, 2]
    assert eager_acc.val_acc.iloc[-1] > 0.8  # it learned (chance is 0.1)
    assert (graphed.val_acc.values - eager_acc.val_acc.values).__abs__().max() <= 0.02
    finals = par[par.case.str.contains("final parameters")].set_index("case")
    main = finals.loc["parity digits CNN final parameters, graphed vs eager"]
    acc = finals.loc["parity digits CNN final parameters, accumulate=4, graphed vs eager"]
    assert main.eager_steps == 2 and acc.eager_steps == 1  # the short last batch of each epoch ran eagerly

    # the comparative sentences are claims computed from those intervals, saved beside the results
    claims = pd.read_csv(folder / "claims.csv")
    assert list(claims.columns) == ["claim", "statement", "verdict", "lo", "hi", "above"]
    expected = set()
    train_bs = 8 if CUDA else 2  # the smoke run's training batch
    for d in dtypes:
        expected |= {f"infer_{tag(d)}_bs{b}_graph_pays" for b in (1, 2)} | {f"infer_{tag(d)}_pays_at_large_batches"}
    if BF16:  # the bf16 graph against the fp16 + GradScaler graph, window by window
        expected |= {f"train_bs{train_bs}_{tag(o)}_graph_bf16_faster" for o in ("SGD momentum", "AdamW")}
    expected |= {f"train_{tag(a)}_bs{train_bs}_{tag(o)}_graph_pays" for a in set(tr.dtype)
                 for o in ("SGD momentum", "AdamW")}
    expected |= {"feed_loader_faster_than_step", "feed_loop_costs_15pct_over_slower_part"}
    assert set(claims.claim) == expected and claims.claim.is_unique
    assert (claims.lo <= claims.hi).all()
    fallback = claims.verdict == "eager fallback"  # a graph claim whose graph rows ran eagerly (no GPU)
    assert fallback.any() != CUDA and (claims[fallback].claim.str.contains("graph_pays|pays_at|bf16_faster")).all()
    assert set(claims[~fallback].verdict) <= {"holds", "fails", "unclear"}
    for c in claims[fallback].itertuples():
        assert "no GPU, so the graph side ran eagerly" in c.statement, c
    stop_ids = claims.claim.str.endswith("_pays_at_large_batches")
    for c in claims[~fallback & ~stop_ids].itertuples():  # the sentence of its verdict, from the saved interval
        assert c.verdict == expected_verdict(c), c
        assert ("too close" in c.statement) == (c.verdict == "unclear"), c
        assert "nan" not in c.statement.lower(), c
    by_id = claims.set_index("claim")

    # "pays" verdicts rest on the speedup interval of their row, against the 1.10x threshold
    for r in compared.itertuples():
        if r.section == "inference":
            cid = f"infer_{tag(r.dtype)}_bs{r.batch}_graph_pays"
        else:
            cid = f"train_{tag(r.dtype)}_bs{r.batch}_{tag(r.optimizer)}_graph_pays"
        c = by_id.loc[cid]
        assert (c.lo, c.hi, c.above) == pytest.approx((r.speedup_lo, r.speedup_hi, PAYS))
    for d in dtypes:
        g = inf[(inf.dtype == d) & (inf.variant != "eager")].set_index("batch").sort_index()
        # "stops paying": the smallest batch from which every interval lies at or below the threshold
        stop = None
        for b in reversed(list(g.index)):
            if g.speedup_hi[b] <= PAYS:
                stop = b
            else:
                break
        c = by_id.loc[f"infer_{tag(d)}_pays_at_large_batches"]
        if not CUDA:
            assert c.verdict == "eager fallback"
        elif stop is None:  # the graph still clears the threshold, or no clear verdict, at the largest batch
            assert (c.lo, c.hi) == pytest.approx((g.speedup_lo[2], g.speedup_hi[2])) and c.verdict != "holds"
        else:
            assert c.verdict == "holds" and f"from {stop} images per batch on" in c.statement, c
            assert (c.lo, c.hi) == pytest.approx((g.speedup_lo[stop], g.speedup_hi[stop]))
    # which part limits the data feeding is the verdict of the claim, in words
    c = by_id.loc["feed_loader_faster_than_step"]
    assert c.statement.startswith("data feeding: the loader alone"), c.statement
    assert (feed.bound_by.iloc[0] == "the training step") == (c.verdict == "holds")
    assert (feed.bound_by.iloc[0] == "the input pipeline") == (c.verdict == "fails")
    unclear = re.fullmatch(r"neither clearly: the training step was the slower part in (\d+) of (\d+) windows",
                           feed.bound_by.iloc[0])
    assert bool(unclear) == (c.verdict == "unclear")
    if unclear:
        assert int(unclear.group(1)) <= int(unclear.group(2)) == int(feed.windows.iloc[0])

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
        assert (graphed.val_acc.values == eager_acc.val_acc.values).all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    for png in ("inference_sweep", "training_throughput", "accuracy_parity"):
        assert (folder / f"{png}.png").stat().st_size > 10_000
