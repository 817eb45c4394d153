"""Notebook 05's helpers on CPU: short causes for tables of errors, the memory claim, the reading of the
reduce-overhead experiment and advise's table beside the measured timings."""
import math
import types

import pandas as pd

from cudagraph_kit.course.measure import Measured
from cudagraph_kit.course.nb05_parts import (advise_vs_measured, memory_reading, short_cause, show_isolated,
                                             show_reduce_overhead)

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
    assert [c.claim for c in claims] == ["advise_within_1_5x_gelu_small"] and claims[0].verdict == "holds"
    empty, none = advise_vs_measured({}, None, {})
    assert empty.empty and none == []
