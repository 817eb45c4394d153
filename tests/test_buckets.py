"""buckets: padding, slicing, overflow counting, the planner and the ledger on CPU (eager fallback); graphs,
shared vs private pools and the ledger on the GPU."""
import itertools
import math
import warnings

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from cudagraph_kit import (MemoryLedger, capture_buckets, capture_train_step, evaluate_buckets, ladder, plan_buckets,
                           pool_usage)
from cudagraph_kit.bucket_graphs import BucketOverflowWarning
from cudagraph_kit.bucket_plan import interpolate, measure_bucket_costs
from cudagraph_kit.graphed import CaptureError, NoCudaError, capture
from cudagraph_kit.memory import graph_pools

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
NAN = float("nan")


class Block(nn.Module):
    """Transformer block; x is (requests, seq, d); attention runs within each request (rows independent)."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def mlp(d=16):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d)).to(DEVICE).eval()


def fallback(fn, *sample, **kw):
    return capture_buckets(fn, *sample, eager_fallback=True, **kw)


# ------------------------------------------------------------------------------------------ ladders
def test_ladders():
    assert ladder(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert ladder(40, "pow2") == [1, 2, 4, 8, 16, 32, 40]
    assert ladder(64, "pow2") == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(10, 4) == [1, 2, 4, 8, 10]
    assert ladder(5, 1) == [1, 2, 3, 4, 5]
    assert ladder(3) == [1, 2, 3]
    big = ladder(300)
    assert big[:4] == [1, 2, 4, 8] and 256 in big and 272 in big and big[-1] == 300 and 264 not in big
    with pytest.raises(ValueError, match="max_size must be a positive int"):
        ladder(0)
    with pytest.raises(ValueError, match="spacing must be"):
        ladder(16, "fib")


# ------------------------------------------------------------------------------------------ the callable (any machine)
def test_every_size_matches_eager_and_is_sliced():
    model = mlp()
    with torch.no_grad():
        serve = fallback(model, torch.randn(16, 16, device=DEVICE))
        assert serve.sizes == [1, 2, 4, 8, 16]
        for n in range(1, 17):
            x = torch.randn(n, 16, device=DEVICE)
            y = serve(x)
            assert y.shape == (n, 16)
            torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    st = serve.stats
    assert st.requests == 16 and st.rows == sum(range(1, 17)) and st.eager_overflows == 0
    assert st.calls == {1: 1, 2: 1, 4: 2, 8: 4, 16: 8}
    assert st.padded_rows == sum(serve.bucket_for(n) - n for n in range(1, 17)) == 35
    assert st.pad_fraction == pytest.approx(35 / (136 + 35))
    serve.reset_stats()
    assert serve.stats.requests == 0 and serve.stats.calls == {}


def test_poison_padding_never_leaks_into_rows():
    model = Block().to(DEVICE).eval()
    serve = fallback(model, torch.randn(8, 4, 32, device=DEVICE), sizes=[2, 8], pad_value=NAN)
    with torch.no_grad():
        for n in (1, 3, 5, 7):
            x = torch.randn(n, 4, 32, device=DEVICE)
            y = serve(x)
            assert torch.isfinite(y).all(), f"padding leaked at n={n}"
            torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
            assert serve.verify(x) < 1e-4
    # the padding rows really held the poison (so the check above could have failed)
    assert torch.isnan(serve.static_inputs[0][7]).all()


def test_verify_catches_a_function_that_mixes_rows():
    serve = fallback(lambda t: t - t.mean(dim=0), torch.randn(8, 4, device=DEVICE))
    x = torch.randn(3, 4, device=DEVICE)            # padded to 4 rows
    assert math.isinf(serve.verify(x))
    assert serve.verify(torch.randn(4, 4, device=DEVICE)) < 1e-6   # a bucket size: nothing padded, nothing leaks
    assert serve.stats.requests == 0                 # verify leaves the counters alone
    assert serve.pad_value == 0.0                    # and restores the pad value


def test_stale_rows_without_padding_fill_stay_out_of_results():
    model = mlp()
    serve = fallback(model, torch.randn(8, 16, device=DEVICE), sizes=[8], pad_value=None)
    with torch.no_grad():
        serve(torch.full((8, 16), 1e6, device=DEVICE))      # fills the buffer with large values
        x = torch.randn(3, 16, device=DEVICE)
        torch.testing.assert_close(serve(x), model(x), rtol=1e-4, atol=1e-5)
    assert serve.static_inputs[0][5, 0].item() == 1e6        # the stale rows are still there


def test_overflow_runs_eagerly_counted_and_warned_once():
    model = mlp()
    serve = fallback(model, torch.randn(8, 16, device=DEVICE))
    x = torch.randn(11, 16, device=DEVICE)
    with pytest.warns(BucketOverflowWarning, match=r"11 rows is larger than the largest captured bucket \(8\)"):
        y = serve(x)
    with torch.no_grad():
        torch.testing.assert_close(y, model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no second warning
        serve(torch.randn(20, 16, device=DEVICE))
    st = serve.stats
    assert st.eager_overflows == 2 and st.overflow_rows == 31 and st.requests == 2 and st.padded_rows == 0
    assert st.calls == {}


def test_overflow_error_mode_refuses_and_counts_nothing():
    serve = fallback(mlp(), torch.randn(8, 16, device=DEVICE), overflow="error")
    with pytest.raises(ValueError, match="larger than the largest captured bucket.*overflow='eager'"):
        serve(torch.randn(9, 16, device=DEVICE))
    assert serve.stats.requests == 0 and serve.stats.eager_overflows == 0
    assert serve(torch.randn(2, 16, device=DEVICE)).shape == (2, 16)   # still works


def test_several_arguments_structured_outputs_and_another_dim():
    def fn(a, b):
        return {"sum": a + b, "pair": (a * 2, b.relu())}
    serve = fallback(fn, torch.randn(3, 8, 5, device=DEVICE), torch.randn(3, 8, 5, device=DEVICE), dim=1)
    assert serve.sizes == [1, 2, 4, 8]
    a, b = torch.randn(3, 6, 5, device=DEVICE), torch.randn(3, 6, 5, device=DEVICE)
    out = serve(a, b)
    assert set(out) == {"sum", "pair"} and isinstance(out["pair"], tuple)
    torch.testing.assert_close(out["sum"], a + b)
    torch.testing.assert_close(out["pair"][0], a * 2)
    torch.testing.assert_close(out["pair"][1], b.relu())
    assert serve.stats.calls == {8: 1}


def test_namedtuples_and_non_tensor_leaves_come_back_as_they_were():
    from collections import namedtuple
    Out = namedtuple("Out", "y label extra")

    serve = fallback(lambda t: Out(t * 3, "rows", [t + 1, None, 7]), torch.randn(8, 4, device=DEVICE))
    x = torch.randn(5, 4, device=DEVICE)
    out = serve(x)
    assert type(out) is Out and out.label == "rows" and out.extra[1:] == [None, 7]
    torch.testing.assert_close(out.y, x * 3)
    torch.testing.assert_close(out.extra[0], x + 1)


def test_results_are_views_unless_cloned():
    serve = fallback(lambda t: t * 2, torch.randn(4, 3, device=DEVICE))
    first = serve(torch.ones(4, 3, device=DEVICE))
    serve(torch.zeros(4, 3, device=DEVICE))
    assert first.abs().sum().item() == 0              # overwritten by the next call
    kept = fallback(lambda t: t * 2, torch.randn(4, 3, device=DEVICE), clone_outputs=True)
    first = kept(torch.ones(4, 3, device=DEVICE))
    kept(torch.zeros(4, 3, device=DEVICE))
    assert first.sum().item() == 24


def test_bad_requests_get_clear_errors_and_nothing_breaks():
    serve = fallback(mlp(), torch.randn(8, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"captured for shape \(rows, 16\) float32.*got shape \(3, 12\)"):
        serve(torch.randn(3, 12, device=DEVICE))
    with pytest.raises(ValueError, match="float32"):
        serve(torch.randn(3, 16, device=DEVICE, dtype=torch.float64))
    with pytest.raises(TypeError, match="captured for 1 argument"):
        serve(torch.randn(3, 16, device=DEVICE), torch.randn(3, 16, device=DEVICE))
    with pytest.raises(ValueError, match="empty request"):
        serve(torch.randn(0, 16, device=DEVICE))
    assert serve.stats.requests == 0
    assert serve(torch.randn(3, 16, device=DEVICE)).shape == (3, 16)

    two = fallback(torch.add, torch.randn(4, 2, device=DEVICE), torch.randn(4, 2, device=DEVICE))
    with pytest.raises(ValueError, match="argument 1 has 2 rows along dim 0, argument 0 has 3"):
        two(torch.randn(3, 2, device=DEVICE), torch.randn(2, 2, device=DEVICE))


def test_bad_capture_arguments():
    x = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(ValueError, match="one row per input row"):
        fallback(lambda t: t.sum(0), x)                 # reduces over the batch: cannot be bucketed
    with pytest.raises(TypeError, match="sample argument 1 is a float"):
        fallback(lambda t, s: t * s, x, 2.0)
    with pytest.raises(ValueError, match="overflow must be"):
        fallback(torch.relu, x, overflow="split")
    with pytest.raises(ValueError, match="positive ints"):
        fallback(torch.relu, x, sizes=[0, 4])
    with pytest.raises(ValueError, match="max_size=16 but the largest bucket is 8"):
        fallback(torch.relu, x, sizes=[4, 8], max_size=16)
    with pytest.raises(ValueError, match="pool must be"):
        fallback(torch.relu, x, pool="global")
    serve = fallback(torch.relu, x, sizes=plan_buckets([1, 3, 8], max_graphs=2))   # a BucketPlan works as sizes
    assert serve.sizes == [3, 8]


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_no_cuda_without_fallback_is_a_clear_error():
    with pytest.raises(NoCudaError, match="eager_fallback=True"):
        capture_buckets(torch.relu, torch.randn(4, 2))
    serve = capture_buckets(torch.relu, torch.randn(4, 2), eager_fallback=True)
    assert serve.mode == "eager" and serve.graphs == {} and "mode='eager'" in repr(serve)
    assert serve.capture_log == [] and serve.capture_seconds == 0


# ------------------------------------------------------------------------------------------ planner
def brute_force(hist, max_graphs=None, budget=None, mem=None, cost=float, top=None, pad_cost=0.0):
    top = top or max(hist)
    cands = sorted({s for s in hist if s <= top} | {top})
    best = None
    for k in range(1, (max_graphs or len(cands)) + 1):
        for combo in itertools.combinations(cands[:-1], k - 1):
            sizes = list(combo) + [top]
            if budget is not None and sum(mem(s) for s in sizes) > budget:
                continue
            waste = evaluate_buckets(hist, sizes, cost, pad_cost)["expected_waste"]
            if best is None or waste < best[0] - 1e-9:
                best = (waste, sizes)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_planner_is_optimal_against_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = (1 + (20 * torch.rand(60, generator=gen) ** 2).floor()).int().tolist()
    hist = {s: sizes.count(s) for s in set(sizes)}
    for max_graphs in (1, 2, 3, 5):
        plan = plan_buckets(sizes, max_graphs=max_graphs)
        waste, _ = brute_force(hist, max_graphs)
        assert plan.n_graphs <= max_graphs and plan.sizes[-1] == max(sizes)
        assert plan.expected_waste == pytest.approx(waste)
    cost = lambda s: 10 + 2.0 * max(s, 8)            # flat up to 8 rows, then linear  # noqa: E731
    plan = plan_buckets(hist, max_graphs=3, cost=cost)
    assert plan.expected_waste == pytest.approx(brute_force(hist, 3, cost=cost)[0])
    for pad in (0.5, 4.0):                           # a cost per padded request on top of the padded rows
        plan = plan_buckets(hist, max_graphs=3, cost=cost, pad_cost=pad)
        assert plan.expected_waste == pytest.approx(brute_force(hist, 3, cost=cost, pad_cost=pad)[0])
    mem = lambda s: 1000 + 100 * s                  # noqa: E731
    budget = 4500 + 100 * max(sizes)
    plan = plan_buckets(sizes, memory_budget=budget, graph_memory=mem, resolution=budget // 100)  # exact units
    assert plan.memory <= budget
    assert plan.expected_waste == pytest.approx(brute_force(hist, None, budget, mem)[0])


def test_planner_basics_and_errors():
    sizes = [1] * 50 + [7] * 30 + [8] * 5 + [30] * 15
    plan = plan_buckets(sizes, max_graphs=3)
    assert plan.sizes == [1, 8, 30] and plan.expected_waste == pytest.approx(30 * 1 / 100)
    assert plan.overflow_requests == 0 and plan.memory is None
    plan = plan_buckets(sizes, max_graphs=2, max_size=16)          # 30 is above max_size: an overflow
    assert plan.sizes[-1] == 16 and plan.overflow_requests == 15
    assert plan_buckets({4: 3, 9: 1}).sizes == [4, 9]               # a histogram; no limits: every size
    flat = plan_buckets(sizes, max_graphs=4, cost=lambda s: 5.0)    # padding costs nothing: one bucket
    assert flat.sizes == [30] and flat.expected_waste == 0
    writes = plan_buckets(sizes, max_graphs=3, cost=lambda s: 5.0, pad_cost=1.0)  # but writing padding does
    assert writes.sizes == [1, 7, 30] and writes.expected_waste == pytest.approx(5 * 1.0 / 100)
    with pytest.raises(ValueError, match="pad_cost must be a cost >= 0"):
        plan_buckets(sizes, pad_cost=-1.0)
    with pytest.raises(ValueError, match="needs graph_memory"):
        plan_buckets(sizes, memory_budget=100)
    with pytest.raises(ValueError, match=r"largest bucket \(30 rows\) alone needs"):
        plan_buckets(sizes, memory_budget=100, graph_memory=lambda s: 1000)
    with pytest.raises(ValueError, match="max_graphs must be >= 1"):
        plan_buckets(sizes, max_graphs=0)
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        plan_buckets([0, 3])
    with pytest.raises(ValueError, match="no observed request sizes"):
        plan_buckets([])


def test_evaluate_and_interpolate():
    ev = evaluate_buckets([3, 5, 9, 30], [4, 8, 16])
    assert ev["padded_rows"] == 1 + 3 + 7 and ev["overflow_requests"] == 1 and ev["requests"] == 4
    assert ev["pad_fraction"] == pytest.approx(11 / (3 + 5 + 9 + 11))
    f = interpolate({1: 20.0, 32: 24.0, 128: 61.0})
    assert f(1) == 20.0 and f(64) == pytest.approx(24 + 37 / 3) and f(500) == 61.0
    with pytest.raises(ValueError):
        interpolate({})


def test_bucket_costs_cover_every_size_and_refuse_a_short_sample():
    serve = fallback(mlp(), torch.randn(8, 16, device=DEVICE), sizes=[2, 5, 8])
    costs = measure_bucket_costs(serve, torch.randn(8, 16, device=DEVICE), rounds=1, calls=2)
    assert sorted(costs) == [2, 5, 8] and all(v > 0 and math.isfinite(v) for v in costs.values())
    assert costs.pad_us >= 0.0 and costs.clock == ("GPU" if HAS_CUDA else "wall (no CUDA)")
    assert sorted(measure_bucket_costs(serve, torch.randn(8, 16, device=DEVICE), sizes=[3, 1], rounds=1,
                                       calls=1)) == [1, 3]
    with pytest.raises(ValueError, match="fewer than the largest size"):
        measure_bucket_costs(serve, torch.randn(4, 16, device=DEVICE))
    with pytest.raises(ValueError, match="rounds and calls must be >= 1"):
        measure_bucket_costs(serve, torch.randn(8, 16, device=DEVICE), rounds=0)
    plan = plan_buckets([1, 2, 2, 7], max_graphs=2, cost={**costs, 1: costs[2], 7: costs[8]}, max_size=8)
    assert plan.n_graphs <= 2 and plan.sizes[-1] == 8


# ------------------------------------------------------------------------------------------ ledger (any machine)
def test_ledger_reads_what_it_can_without_failing():
    ledger = MemoryLedger()
    serve = fallback(mlp(), torch.randn(8, 16, device=DEVICE))
    with ledger.measure("build") as row:
        capture(mlp(), torch.randn(4, 16, device=DEVICE), eager_fallback=True)
    row_b = ledger.record("buckets", serve)
    table = ledger.table()
    assert list(table.label) == ["build", "buckets"] and "seconds" in row
    assert row_b["buffers"] == (8 * 16 + 8 * 16) * 4           # static input + output buffers
    if not HAS_CUDA:
        assert row_b["graphs"] == 0 and "no CUDA" in row_b["note"] and pool_usage() == {}
    with pytest.raises(TypeError, match="cannot find CUDA graphs in a str"):
        ledger.record("nonsense", "graph")


# ------------------------------------------------------------------------------------------ GPU
def test_measure_memory_is_an_explicit_flag():
    with pytest.raises(TypeError, match="measure_memory must be True or False"):
        fallback(torch.relu, torch.randn(4, 2, device=DEVICE), measure_memory="yes")


gpu = pytest.mark.gpu


@gpu
def test_gpu_capture_buckets_empties_the_allocator_cache_only_when_asked(monkeypatch):
    """By default the kit adds no torch.cuda.empty_cache() of its own: capturing k buckets calls it exactly as often
    as k bare torch.cuda.graph captures do (PyTorch empties the cache as each capture begins). measure_memory=True
    adds one per bucket and fills capture_log's pool_growth_bytes."""
    calls = []
    empty_cache = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(1), empty_cache())[1])
    x = torch.randn(8, 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.relu(x)
    torch.cuda.current_stream().wait_stream(side)
    bare = torch.cuda.CUDAGraph()
    with torch.cuda.graph(bare, stream=side):
        torch.relu(x)
    by_torch = len(calls)          # what one capture costs in empty_cache calls, PyTorch's own
    sizes = [2, 4, 8]
    calls.clear()
    serve = capture_buckets(torch.relu, x, sizes=sizes)
    assert len(calls) == by_torch * len(sizes)
    assert all(set(e) == {"size", "seconds", "pool"} for e in serve.capture_log)
    calls.clear()
    measured = capture_buckets(mlp(16), torch.randn(64, 16, device="cuda"), sizes=[16, 64], measure_memory=True)
    assert len(calls) == (by_torch + 1) * 2
    growth = {e["size"]: e["pool_growth_bytes"] for e in measured.capture_log}
    assert growth[64] > 0 and growth[16] >= 0, growth   # the largest bucket, captured first, grows the pool


@gpu
@pytest.mark.parametrize("make", [
    lambda: (mlp(256), (256,)),
    lambda: (Block(64, 4).cuda().eval(), (16, 64)),
], ids=["mlp", "transformer_block"])
def test_gpu_every_size_matches_eager_in_a_shared_pool(make):
    model, row = make()
    serve = capture_buckets(model, torch.randn(32, *row, device="cuda"), pad_value=NAN)
    assert serve.mode == "graph" and len(serve.graphs) == len(serve.sizes) == len(ladder(32))
    assert [e["size"] for e in serve.capture_log] == sorted(serve.sizes, reverse=True)   # largest first
    assert len(graph_pools(serve)) == 1 and graph_pools(serve)[0] == tuple(serve.pool)
    with torch.no_grad():
        for n in range(1, 33):
            x = torch.randn(n, *row, device="cuda")
            y = serve(x).clone()
            assert torch.isfinite(y).all(), f"NaN padding leaked at n={n}"
            torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-4)
    assert serve.stats.requests == 32 and serve.stats.eager_overflows == 0
    assert serve.verify(torch.randn(5, *row, device="cuda")) < 1e-4


@gpu
def test_gpu_overflow_falls_back_eagerly_and_is_counted():
    model = mlp(64)
    serve = capture_buckets(model, torch.randn(16, 64, device="cuda"))
    x = torch.randn(40, 64, device="cuda")
    with pytest.warns(BucketOverflowWarning):
        y = serve(x)
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    assert serve.stats.eager_overflows == 1 and serve.stats.overflow_rows == 40 and serve.stats.calls == {}
    # the graphs keep working after an overflow
    x = torch.randn(9, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(serve(x), model(x), rtol=1e-4, atol=1e-5)
    assert serve.stats.calls == {16: 1}


@gpu
def test_gpu_shared_vs_private_pools_measured():
    """Prints the numbers (run with -s); a shared pool holds less than one pool per graph."""
    model = Block(128, 4).cuda().eval()
    sample = torch.randn(64, 32, 128, device="cuda")
    ledger = MemoryLedger()
    rows = {}
    for label, sizes, pool in [("largest alone", [64], "shared"), ("ladder, shared pool", ladder(64), "shared"),
                               ("ladder, one pool per graph", ladder(64), "private")]:
        with ledger.measure(label):
            serve = capture_buckets(model, sample, sizes=sizes, pool=pool)
        rows[label] = ledger.record(label, serve)
        del serve
        torch.cuda.empty_cache()
    table = ledger.table()
    print("\n" + table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    alone, shared, private = (rows[k]["held"] for k in ("largest alone", "ladder, shared pool",
                                                        "ladder, one pool per graph"))
    print(f"\nheld: largest bucket alone {alone / 2**20:.1f} MiB; ladder of {len(ladder(64))} buckets: shared pool "
          f"{shared / 2**20:.1f} MiB ({shared / alone:.2f}x the largest alone), one pool per graph "
          f"{private / 2**20:.1f} MiB ({private / shared:.2f}x the shared pool)")
    assert rows["ladder, shared pool"]["pools"] == 1 and rows["ladder, shared pool"]["pool_sharing"] == "shared"
    assert rows["ladder, one pool per graph"]["pools"] == len(ladder(64))
    assert alone > 0 and shared < private


@gpu
def test_gpu_bucket_costs_are_gpu_time_and_grow_with_rows():
    # an MLP wide enough that more requests are clearly more GPU work (in a small transformer block they are not:
    # on an H100 its 1-request graph took 65 µs of GPU time against 53 µs for 16 requests)
    from cudagraph_kit.timing import gpu_time, timeit
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().eval()
    sample = torch.randn(64, 64, 1024, device="cuda")
    exact = capture_buckets(model, sample, sizes=[1, 16, 64])
    costs = measure_bucket_costs(exact, sample)
    wall = {b: timeit(exact, sample[:b], calls=20).median_us for b in (1, 64)}
    busy = {b: gpu_time(exact, sample[:b]).busy_us for b in (1, 16, 64)}  # the profiler last: it slows later launches
    print(f"\nGPU µs per request: {costs}, padding {costs.pad_us:.2f} µs; profiler busy µs: {busy}; wall µs: {wall}")
    assert costs.clock == "GPU" and costs.upper_bounds == ()
    assert costs[1] < costs[16] < costs[64]                # more rows, more GPU work
    for b in (1, 16, 64):  # GPU time: the kernels' busy time plus the GPU's short gaps between graph nodes
        assert 0.9 * busy[b] <= costs[b] <= 1.5 * busy[b], (b, costs[b], busy[b])
    assert 0.0 < costs.pad_us < 0.5 * costs[1]             # writing padding rows: one small fill kernel
    assert measure_bucket_costs(capture_buckets(model, sample, sizes=[1, 64], pad_value=None), sample).pad_us == 0
    assert costs[64] <= 1.2 * wall[64]                     # GPU time, not more than a request takes alone


@gpu
def test_gpu_bucket_costs_retry_behind_a_longer_spin_and_flag_what_stays_an_upper_bound(monkeypatch):
    import cudagraph_kit.timing as timing
    serve = capture_buckets(mlp(), torch.randn(8, 16, device="cuda"), sizes=[4, 8], pad_value=None)
    spins, host_outruns = [], {"always": False}

    def device_time(fn, *args, calls=10, host_us=None):  # the host outruns the spin twice, or always
        spins.append(host_us)
        return 50.0 + len(spins), len(spins) % 3 == 0 and not host_outruns["always"]
    monkeypatch.setattr(timing, "device_time", device_time)
    costs = measure_bucket_costs(serve, torch.randn(8, 16, device="cuda"), rounds=1)
    assert len(spins) == 6 and spins[1] == 4 * spins[0] and spins[2] == 16 * spins[0]  # 1x, 4x, 16x per size
    assert costs.upper_bounds == () and costs == {4: 53.0, 8: 56.0}    # the queued try's time is the one kept

    spins.clear()
    host_outruns["always"] = True  # never queued: the result is kept as an upper bound, with a warning that says so
    with pytest.warns(UserWarning, match=r"sizes \[4, 8\].*upper bound"):
        costs = measure_bucket_costs(serve, torch.randn(8, 16, device="cuda"), rounds=1)
    assert costs.upper_bounds == (4, 8) and len(spins) == 6


@gpu
def test_gpu_ledger_reads_capture_buckets_and_train_step():
    ledger = MemoryLedger()
    model = mlp(64)
    g = capture(model, torch.randn(8, 64, device="cuda"))
    serve = capture_buckets(model, torch.randn(8, 64, device="cuda"))
    net = mlp(64).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    batch = (torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda"))
    step = capture_train_step(net, opt, nn.MSELoss(), batch)
    for _ in range(5):
        step(*batch)
    assert step.graph is not None
    for label, obj, n_graphs in [("capture", g, 1), ("buckets", serve, len(serve.sizes)), ("train step", step, 1)]:
        row = ledger.record(label, obj)
        assert row["graphs"] == n_graphs and row["pools"] == 1
        assert row["pool_reserved"] > 0 and row["held"] >= row["pool_reserved"] + row["buffers"] - 1
    usage = pool_usage()
    assert (0, 0) in usage and all(p in usage for p in graph_pools([g, serve, step]))


@gpu
def test_gpu_cpu_sample_is_refused_on_a_gpu_machine():
    with pytest.raises(ValueError, match="can only read GPU memory.*x.cuda"):
        capture_buckets(torch.relu, torch.randn(4, 2), eager_fallback=True)


@gpu
def test_gpu_failed_capture_is_explained_and_the_process_keeps_working():
    def syncs(x):
        return x * x.sum().item()                     # a host sync: illegal during capture
    with pytest.raises(CaptureError, match="bucket of 8 rows"):
        capture_buckets(syncs, torch.randn(8, 4, device="cuda"))
    model = mlp(16)
    serve = capture_buckets(model, torch.randn(8, 16, device="cuda"))
    x = torch.randn(3, 16, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(serve(x), model(x), rtol=1e-4, atol=1e-5)
