"""Notebook 05's readings on CPU: short causes for tables of errors (lessons/pitfalls.py), the memory claim
(measuring/verdicts.py), the reading of the reduce-overhead experiment, advise's claims (measuring/claims.py) and
table beside the measured timings (measuring/predictions.py), and the detached eager step (lessons/models.py)."""
import math
import types

import pandas as pd

from cudagraph_kit.course.measuring.measure import Measured
from cudagraph_kit.course.lessons.models import detached_eager_step
from cudagraph_kit.course.lessons.pitfalls import short_cause, show_isolated, show_reduce_overhead
from cudagraph_kit.course.measuring.claims import advise_claim, advise_words_claim
from cudagraph_kit.course.measuring.predictions import show_advise
from cudagraph_kit.course.measuring.verdicts import advise_overall_claim, advise_vs_measured, memory_reading

CUDA_ERROR = ("AcceleratorError: CUDA error: operation failed due to a previous error during capture\n"
              "Search for `cudaErrorStreamCaptureInvalidated' in https://docs.nvidia.com/cuda/cuda-runtime-api/")


def test_short_cause_keeps_the_type_and_the_first_clause():
    assert short_cause(CUDA_ERROR) == "AcceleratorError: operation failed due to a previous error during capture"
    assert short_cause("RuntimeError: Expected all tensors on one device. Found cpu and cuda:0") == (
        "RuntimeError: Expected all tensors on one device")
    assert short_cause("ok") == "ok"
    cut = short_cause("ValueError: " + "x" * 200)
    assert len(cut) == 80 and cut.endswith("…")
    assert short_cause(True) is True and math.isnan(short_cause(float("nan")))


def test_show_isolated_prints_short_causes_and_the_first_error_once(capsys):
    rows = [{"variant": "default", "capture": CUDA_ERROR, "exit code": 0},
            {"variant": "side", "capture": "ok", "exit code": 0},
            {"variant": "other", "capture": "RuntimeError: a second error", "exit code": 0}]
    runs = show_isolated(rows, ["variant", "capture", "not there"])
    printed = capsys.readouterr().out
    table, _, rest = printed.partition("\n\n")
    assert "AcceleratorError: operation failed due to a previous error during capture" in table
    assert "Search for" not in table and "exit code" not in table  # only the columns asked for
    assert max(len(line) for line in table.splitlines()) < 120
    assert rest.count("cudaErrorStreamCaptureInvalidated") == 1 and "a second error" not in rest
    assert runs.capture[0] == CUDA_ERROR and list(runs.columns) == ["variant", "capture", "exit code"]


def test_memory_reading_claims_a_saving_only_when_the_shared_pool_reserved_less():
    rows, claim = memory_reading(600 * 2**20, 200 * 2**20, [512, 256, 128])
    assert [(r["variant"], r["reserved_mib"]) for r in rows] == [("private pool per graph", 600.0),
                                                                  ("one shared pool", 200.0)]
    assert rows[0]["case"] == "memory: 3 graphs (batch 512..128)"
    assert claim.verdict == "holds" and "3.00x less" in claim.statement
    _, claim = memory_reading(200 * 2**20, 300 * 2**20, [512, 256, 128])
    assert claim.verdict == "fails" and "saved nothing" in claim.statement


def test_show_reduce_overhead_detects_only_what_the_experiment_showed(capsys):
    silent = {"exit code": 0, "skips": 1, "messages": ["skipping cudagraphs due to mutated inputs"],
              "old output": "silently holds the next call's values", "clone keeps it": True}
    seen, detected, found_by = show_reduce_overhead(silent, "2.x")
    assert detected is True and "1 skip(s)" in seen and "clone" in found_by
    assert "did not raise" in capsys.readouterr().out
    assert show_reduce_overhead({**silent, "skips": 0}, "2.x")[1] is False
    assert show_reduce_overhead({**silent, "clone keeps it": False}, "2.x")[1] is False
    _, detected, found_by = show_reduce_overhead({**silent, "old output": "RuntimeError: accessing tensor output"},
                                                 "2.x")
    assert detected is True and "RuntimeError" in found_by
    assert show_reduce_overhead({"exit code": "killed after 300 s", "stderr": "timed out"}, "2.x")[1] is False
    assert show_reduce_overhead(None, "2.x")[:2] == ("needs a GPU", None)


def test_advise_vs_measured_puts_each_prediction_beside_its_graph_timing():
    table = pd.DataFrame({"case": ["a", "a"], "variant": ["eager", "graph"], "median_us": [10.0, 4.0],
                          "speedup": [1.0, 2.5], "speedup_pi_lo": [float("nan"), 2.0],
                          "speedup_pi_hi": [float("nan"), 3.0], "executed_as": ["eager", "cuda graph"]})
    advice = types.SimpleNamespace(speedup=2.4, kernels_per_call=3, eager_us=10.0, floor_us=1.0, graph_gpu_us=1.5,
                                   graph_us=4.2)
    rows, claims = advise_vs_measured({"a": advice}, Measured(table), {"a": "gelu_small"})
    row = rows.iloc[0]
    assert (row.measured_graph_us, row.measured_speedup, row.measured_lo, row.measured_hi) == (4.0, 2.5, 2.0, 3.0)
    assert (row.predicted_speedup, row.predicted_graph_us, row.graph_executed_as) == (2.4, 4.2, "cuda graph")
    assert [c.claim for c in claims] == ["advise_within_1_5x_gelu_small", "advise_words_gelu_small"]
    assert [c.verdict for c in claims] == ["holds", "holds"]                  # 2.4x said "faster"; 2.0-3.0x measured
    assert (row.advise_says, row.verdict, row.words_verdict) == ("faster", "holds", "holds")
    assert advise_overall_claim(claims).verdict == "holds"                 # reads the within-1.5x claim alone
    empty, none = advise_vs_measured({}, None, {})
    assert empty.empty and none == []


def test_advise_words_claim_can_fail_where_the_within_band_cannot():
    """Near 1x a 1.5x band around the prediction holds whatever the graph did; the words' direction does not."""
    said_same = advise_words_claim("advise_words_x", "GELU large", 1.06, 0.95, 1.05)
    straddles = advise_words_claim("advise_words_x", "GELU large", 1.06, 1.08, 1.13)
    clearly_faster = advise_words_claim("advise_words_x", "GELU large", 1.06, 1.15, 1.20)
    assert advise_claim("advise_within_1_5x_x", "GELU large", 1.06, 1.15, 1.20).verdict == "holds"
    assert (said_same.verdict, straddles.verdict, clearly_faster.verdict) == ("holds", "unclear", "fails")
    assert "about as fast as eager" in clearly_faster.statement
    assert "more than 1.1x faster: the words were wrong" in clearly_faster.statement
    assert "1.08-1.13x" in straddles.statement and "too close" in straddles.statement
    assert advise_words_claim("advise_words_x", "c", 1.06, 0.70, 0.80).verdict == "fails"   # clearly slower


def test_advise_words_claim_checks_each_direction():
    assert advise_words_claim("w", "c", 7.8, 5.7, 10.4).verdict == "holds"
    assert advise_words_claim("w", "c", 1.2, 0.95, 1.9).verdict == "unclear"
    wrong = advise_words_claim("w", "c", 1.2, 0.90, 1.05)
    assert wrong.verdict == "fails" and "none of it more than 1.1x faster" in wrong.statement
    assert advise_words_claim("w", "c", 0.8, 0.70, 0.85).verdict == "holds"        # said slower, was slower
    assert advise_words_claim("w", "c", 0.8, 0.95, 1.30).verdict == "fails"
    slower = advise_words_claim("w", "c", 0.8, 0.5, 0.8)
    assert (slower.lo, slower.hi) == (1.25, 2.0)                           # how many times slower, above 1.1
    unknown = advise_words_claim("w", "c", float("nan"), 1.0, 2.0)
    assert not unknown.measured and "no verdict" in unknown.statement
    for c in (wrong, slower):  # the sentence is plain words, no verdict labels
        assert not any(w in c.statement.split() for w in ("holds", "fails", "unclear"))


def test_show_advise_prints_this_runs_table_or_else_the_recorded_runs(capsys):
    table = pd.DataFrame([{"case": "GELU small", "nodes": 5, "predicted_graph_us": 4.2, "measured_graph_us": 4.0,
                           "predicted_speedup": 2.4, "measured_speedup": 2.5, "measured_lo": 2.0, "measured_hi": 3.0}])
    claim = advise_claim("advise_within_1_5x_gelu_small", "GELU small", 2.4, 2.0, 3.0)
    show_advise(table, [claim], "05_pitfalls")
    printed = capsys.readouterr().out
    assert "GELU small" in printed and claim.statement in printed and "recorded" not in printed
    show_advise(pd.DataFrame(), [], "05_pitfalls")   # no GPU: the recorded run's predictions, named
    printed = capsys.readouterr().out
    assert printed.startswith("No GPU here") and ("predicted_speedup" in printed or "no recorded GPU run" in printed)


def test_detached_eager_step_trains_and_returns_the_detached_loss():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    step = detached_eager_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    first, second = step(x, y), step(x, y)
    assert not first.requires_grad and second < first
