"""timing: statistics on any machine; GPU-busy floor, kernel counts and graph detection on the GPU."""
import math
import time

import pytest
import torch

from cudagraph_kit import capture, compare, gpu_time, timeit
from cudagraph_kit.timing import _busy_union

HAS_CUDA = torch.cuda.is_available()


def test_timeit_measures_a_known_sleep():
    t = timeit(time.sleep, 0.002, calls=3, samples=3, warmup=0)
    assert 1900 < t.median_us < 20000, t  # sleep(2 ms) takes at least 2 ms
    assert t.min_us <= t.median_us <= t.max_us and t.iqr_us >= 0
    assert len(t.samples_us) == 3
    assert t.clock == ("wall+sync" if HAS_CUDA else "wall (CPU)")


def test_units_per_call_divides():
    t1 = timeit(time.sleep, 0.001, calls=2, samples=3, warmup=0)
    t4 = timeit(time.sleep, 0.001, calls=2, samples=3, warmup=0, units_per_call=4)
    assert t4.median_us < t1.median_us / 2


def test_timeit_rejects_bad_counts():
    with pytest.raises(ValueError, match="calls and samples must be >= 1"):
        timeit(lambda: None, calls=0)


def test_busy_union_merges_overlaps():
    assert _busy_union([(0, 10), (5, 15), (20, 30)]) == 25
    assert _busy_union([]) == 0


@pytest.mark.skipif(HAS_CUDA, reason="CPU behaviour")
def test_compare_on_cpu_is_labelled_eager_and_has_no_floor():
    df = compare({"slow": lambda: time.sleep(0.002), "fast": lambda: None}, case="c", calls=3, samples=3, warmup=0)
    assert list(df["variant"]) == ["slow", "fast"]
    assert (df["executed_as"] == "eager").all()
    assert df["speedup"].iloc[0] == 1.0 and df["speedup"].iloc[1] > 10
    assert df["floor_us"].isna().all()
    assert gpu_time(lambda: None) is None


def test_compare_needs_variants():
    with pytest.raises(ValueError, match="at least one"):
        compare({})


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


@pytest.mark.gpu
def test_gpu_time_counts_gelu_kernels_and_detects_graph():
    x = torch.randn(1, 3, 224, 224, device="cuda")
    eager = gpu_time(gelu, x, calls=10)
    assert eager.kernels == pytest.approx(5, abs=0.01)  # div, erf, add, mul, mul
    assert eager.graph_launches == 0 and eager.busy_us > 0
    g = capture(gelu, x)
    graphed = gpu_time(g.replay, calls=10)
    assert graphed.graph_launches == pytest.approx(1)
    assert graphed.kernels == pytest.approx(5, abs=0.01)
    g10 = capture(gelu, x, calls_per_graph=10)
    per_call = gpu_time(g10.replay, calls=5)
    assert per_call.kernels == pytest.approx(5, abs=0.01)  # divided by calls_per_graph


@pytest.mark.gpu
def test_compare_small_gelu_graph_is_faster_and_near_floor():
    x = torch.randn(1, 3, 224, 224, device="cuda")
    g = capture(gelu, x)
    df = compare({"eager": lambda: gelu(x), "graph": g.replay}, case="small", calls=200, samples=5)
    eager, graph = df.iloc[0], df.iloc[1]
    assert eager["executed_as"] == "eager" and graph["executed_as"] == "cuda graph"
    assert graph["speedup"] > 1.5, df  # launch-bound: a graph removes most of the launch cost
    assert not math.isnan(graph["floor_us"]) and graph["median_us"] >= 0.8 * graph["floor_us"]
    # CUDA events time the same calls: they agree with the host clock to within the sync's cost
    assert abs(graph["event_median_us"] - graph["median_us"]) < 0.3 * graph["median_us"] + 5
