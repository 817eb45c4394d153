"""GPU: every classic pitfall is found by check_capturable or verify, or raises a clear error; after each kind
of failed capture the same process captures and computes correctly; capture/release cycles leak nothing.

Failures that could damage the CUDA context run in a fresh process (the experiments of
``cudagraph_kit.course.lessons.pitfall_scripts``, which notebook 05 runs too), which then checks that it keeps working.
Run on the GPU machine: ``python -m pytest -m gpu tests/test_pitfalls_gpu.py -s`` (``-s`` prints numbers).
"""
import functools
import gc

import pytest
import torch

from cudagraph_kit import CaptureError, check_capturable, explain, graph_modules, shared_pool
from cudagraph_kit.advice import advise
from cudagraph_kit.graphed import capture
from cudagraph_kit.verification import verify
from cudagraph_kit.course.lessons.pitfall_scripts import (background_thread_allocates, docs_recipe_capture,
                                           failed_capture_then_recovery, run_isolated, two_captures, warmup_stream)

pytestmark = pytest.mark.gpu
run = functools.partial(run_isolated, timeout=300)


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


# ------------------------------------------------------------------ failed captures: clear error, then recovery
FAILURE_KINDS = ["item", "print", "boolean_mask", "cpu_copy", "pageable_copy", "custom_generator",
                 "synchronize", "unjoined_stream", "adam_capturable_false"]


@pytest.mark.parametrize("kind", FAILURE_KINDS)
def test_failed_capture_raises_capture_error_and_the_process_keeps_working(kind):
    r = run(failed_capture_then_recovery, kind)
    print(f"\n{kind}: raised {r.get('raised')}; cause: {r.get('cause')}; afterwards eager_ok={r.get('eager_ok')} "
          f"graph_ok={r.get('graph_ok')}")
    assert r["exit code"] == 0, r
    assert r["raised"] == "CaptureError", r
    assert "Fix:" in r["message"] and "Original error:" in r["message"]
    assert r["eager_ok"] and r["graph_ok"]


def test_reseeding_inside_a_capture_leaves_the_process_working():
    """torch.manual_seed inside the captured function: PyTorch 2.11 on an H100 did not refuse it (an earlier guess
    was a CaptureError), so it is a silent pitfall that check_capturable reports before capture (tested below).
    Whatever the PyTorch version does, the process must keep working."""
    r = run(failed_capture_then_recovery, "manual_seed")
    print(f"\nmanual_seed: raised {r.get('raised')}; afterwards eager_ok={r.get('eager_ok')} graph_ok={r.get('graph_ok')}")
    assert r["exit code"] == 0, r
    assert r["raised"] in (None, "CaptureError"), r
    assert r["eager_ok"] and r["graph_ok"]


# The same functions, inspected eagerly before any capture: what check_capturable reports for each.
def _side_unjoined():
    side = torch.cuda.Stream()

    def unjoined(t):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = t * 2
        return y
    return unjoined


def _side_joined():
    side = torch.cuda.Stream()

    def joined(t):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = t * 2
        torch.cuda.current_stream().wait_stream(side)
        return y
    return joined


def _adam_step(capturable):
    lin = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3, capturable=capturable)

    def step(t):
        opt.zero_grad(set_to_none=False)
        lin(t).square().mean().backward()
        opt.step()
        return t
    return step


CPU_SCALE = torch.tensor(2.0)


def _autocast_cached(t):
    with torch.autocast("cuda", dtype=torch.float16):   # cache_enabled defaults to True
        return t * 2
GEN = None


def _custom_gen(t):
    global GEN
    GEN = GEN or torch.Generator(device="cuda")
    return t + torch.randn(t.shape, device="cuda", generator=GEN)


@pytest.mark.parametrize("make, expected", [
    (lambda: (lambda t: t * t.sum().item()), "host sync"),
    (lambda: (lambda t: (print(t), t * 2)[1]), "host sync"),
    (lambda: (lambda t: t[t > 0] * 2), "data-dependent shape"),
    (lambda: (lambda t: torch.nonzero(t)), "data-dependent shape"),
    (lambda: (lambda t: t.cpu() * 2), "host sync"),
    (lambda: (lambda t: t + torch.ones(t.shape).cuda()), "pageable copy"),
    (lambda: (lambda t: t * CPU_SCALE), "CPU tensor"),
    (lambda: _custom_gen, "RNG"),
    (lambda: (lambda t: (torch.manual_seed(0), t * 2)[1]), "RNG"),
    (lambda: (lambda t: (torch.cuda.synchronize(), t * 2)[1]), "host sync"),
    (_side_unjoined, "side stream"),
    (lambda: _adam_step(capturable=False), "optimizer"),
    (lambda: _autocast_cached, "autocast cache"),
], ids=["item", "print", "boolean_mask", "nonzero", "cpu_copy", "pageable_copy", "cpu_scalar", "custom_generator",
        "manual_seed", "synchronize", "unjoined_stream", "adam_capturable_false", "autocast_cache"])
def test_check_capturable_finds_it_before_capture(make, expected):
    report = check_capturable(make(), torch.randn(8, 64, device="cuda"))
    print(f"\n{report}")
    assert expected in report.kinds()
    assert all("test_pitfalls_gpu.py:" in f.where for f in report.findings if f.kind == expected)


@pytest.mark.parametrize("make", [lambda: gelu, _side_joined, lambda: _adam_step(capturable=True),
                                  lambda: (lambda t: torch.where(t > 0, t, 0.0) * torch.rand_like(t))],
                         ids=["gelu", "joined_stream", "adam_capturable", "where_and_default_rng"])
def test_capturable_functions_look_capturable(make):
    report = check_capturable(make(), torch.randn(8, 64, device="cuda"))
    print(f"\n{report}")
    assert report.ok, str(report)


# ------------------------------------------------------------------------------------ the silent failures
def test_verify_catches_a_rebound_static_input():
    static_x = torch.randn(256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gelu(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = gelu(static_x)

    def graphed_rebinding(x):
        static = x          # the pitfall: a new name for the new data, the graph still reads static_x
        graph.replay()
        return static_y

    def graphed_copying(x):
        static_x.copy_(x)   # the fix
        graph.replay()
        return static_y

    bad = verify(graphed_rebinding, gelu, static_x, steps=3, static_inputs=[static_x])
    print(f"\n{bad}")
    assert not bad.ok and bad.first["step"] == 0 and "not copied" in bad.first["hint"]
    good = verify(graphed_copying, gelu, static_x, steps=3, static_inputs=[static_x])
    assert good.ok and good.outputs_reused  # correct, and it still hands out one output buffer


def test_verify_catches_outputs_kept_across_replays():
    g = capture(gelu, torch.randn(64, device="cuda"))
    kept = [g(torch.full((64,), float(i), device="cuda")) for i in range(3)]
    assert all(k is kept[0] for k in kept)  # the pitfall: three names for one buffer
    report = verify(g, gelu, g.static_inputs[0], steps=3)
    print(f"\n{report}")
    assert report.ok and report.outputs_reused
    cloned = capture(gelu, torch.randn(64, device="cuda"), clone_outputs=True)
    assert not verify(cloned, gelu, cloned.static_inputs[0], steps=3).outputs_reused


def test_verify_catches_a_frozen_python_counter():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    m = Scaled()
    g = capture(m, torch.randn(16, device="cuda"))
    report = verify(g, m, g.static_inputs[0], steps=3)
    print(f"\n{report}")
    # eager itself gives another output on identical inputs: verify reports the frozen state, not a mismatch
    assert not report.ok and report.frozen_state is not None and report.first is report.frozen_state
    assert "Scaled.calls" in report.frozen_state["cause"] and "self.calls += 1" in report.frozen_state["cause"]
    assert "Python state" in check_capturable(Scaled(), torch.randn(16, device="cuda")).kinds()


def _docs_mlp(seed=0, dropout=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(64, 128), torch.nn.Dropout(0.2), torch.nn.Linear(128, 8)]
    return torch.nn.Sequential(*[m for m in layers if dropout or not isinstance(m, torch.nn.Dropout)]).cuda()


def _eager_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


@pytest.mark.parametrize("lr_as_tensor", [False, True], ids=["python_float_lr", "tensor_lr"])
def test_verify_catches_a_frozen_learning_rate_and_a_tensor_lr_fixes_it(lr_as_tensor):
    model, ref = _docs_mlp(), _docs_mlp()
    lr = torch.tensor(1e-2, device="cuda") if lr_as_tensor else 1e-2
    opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=torch.tensor(1e-2, device="cuda") if lr_as_tensor else 1e-2,
                               capturable=True)
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    graph, loss = docs_recipe_capture(model, opt, x, y)

    def graphed(xb, yb):
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        return loss.detach().clone()

    def schedule(step):  # halve the learning rate on both sides before every step after the first
        for o in (opt, ref_opt):
            group = o.param_groups[0]
            new = 1e-2 * 0.5 ** step
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(new)   # in place: the graph reads this tensor at every replay
            else:
                group["lr"] = new        # a new Python float: the graph never sees it

    report = verify(graphed, _eager_step(ref, ref_opt), x, y, steps=3, state=[(model, ref), (opt, ref_opt)],
                    before_step=schedule)
    print(f"\nlr as tensor={lr_as_tensor}: {report}")
    if lr_as_tensor:
        assert report.ok, str(report)
    else:
        assert not report.ok and report.first["step"] == 1 and "frozen" in report.first["hint"]


def test_dropout_inside_a_graph_matches_eager_given_the_same_rng_state():
    model, ref = _docs_mlp(dropout=True), _docs_mlp(dropout=True)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    graph, loss = docs_recipe_capture(model, opt, x, y)

    def graphed(xb, yb):
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        return loss.detach().clone()

    report = verify(graphed, _eager_step(ref, ref_opt), x, y, steps=4, state=[(model, ref), (opt, ref_opt)])
    print(f"\n{report}")
    assert report.ok, str(report)


def test_changing_shape_is_refused_and_check_capturable_names_it():
    g = capture(gelu, torch.randn(8, 64, device="cuda"))
    with pytest.raises(ValueError, match=r"captured for shape \(8, 64\).*got shape \(5, 64\)"):
        g(torch.randn(5, 64, device="cuda"))
    report = check_capturable(lambda t: t[: int(t[0, 0] > 0) + 4], torch.randn(8, 64, device="cuda"))
    assert "host sync" in report.kinds()


def test_graph_modules_raises_capture_error_and_recovers():
    class Syncs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.lin(x)
            return h * float(h.abs().max())   # a host sync inside a graphed module

    with pytest.raises(CaptureError) as info:
        graph_modules(Syncs().cuda(), (torch.randn(4, 16, device="cuda"),))
    print(f"\n{explain(info.value)}")
    assert explain(info.value).fix
    lin = torch.nn.Linear(16, 16).cuda()
    g = graph_modules(lin, (torch.randn(4, 16, device="cuda"),))
    x = torch.randn(4, 16, device="cuda")
    torch.testing.assert_close(g(x), torch.nn.functional.linear(x, lin.weight, lin.bias))


# ------------------------------------------------------------------------------------ warm-up stream, threads
def test_warmup_on_a_side_stream_avoids_the_accumulate_grad_stream_mismatch():
    side = run(warmup_stream, "side stream, loss deleted")
    kept = run(warmup_stream, "side stream, loss kept")
    default = run(warmup_stream, "default stream, loss kept")
    print(f"\nside-stream warm-up: {side}\nside stream, warm-up loss kept: {kept}\ndefault-stream warm-up: {default}")
    assert side["exit code"] == 0 and side["capture"] == "ok" and not side["AccumulateGrad warning"], side
    assert default["exit code"] == 0 and default["eager works after"], default
    # warm-up on the default stream: PyTorch warns about the AccumulateGrad stream, or the capture fails
    assert default["AccumulateGrad warning"] or default["capture"] != "ok"


def test_background_thread_and_capture_error_mode():
    strict = run(background_thread_allocates, "global")
    local = run(background_thread_allocates, "thread_local")
    print(f"\nglobal: {strict}\nthread_local: {local}")
    assert strict["exit code"] == 0 and local["exit code"] == 0, (strict, local)
    assert strict["thread"] != "ok" or strict["capture"] != "ok"  # the other thread's cudaMalloc is refused
    assert local["thread"] == "ok" and local["capture"] == "ok" and local["correct"]
    assert strict["eager works after"] and local["eager works after"]


# ------------------------------------------------------------------------------------------------- memory
def test_shared_pool_holds_less_than_private_pools():
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    sizes = [512, 384, 256, 128]   # largest first, as the docs advise for a shared pool

    def reserved_by(pool_of):
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        graphs = [capture(mlp, torch.randn(n, 1024, device="cuda"), pool=pool_of()) for n in sizes]
        for g in graphs:  # still correct
            x = torch.randn_like(g.static_inputs[0])
            with torch.no_grad():
                torch.testing.assert_close(g(x), mlp(x))
        used = torch.cuda.memory_reserved() - before
        del graphs
        return used

    private = reserved_by(lambda: None)
    pool = shared_pool()
    shared = reserved_by(lambda: pool)
    print(f"\n{len(sizes)} graphs: private pools {private / 2**20:.1f} MiB reserved, one shared pool "
          f"{shared / 2**20:.1f} MiB")
    assert shared < private


@pytest.mark.parametrize("fails", [False, True], ids=["captures", "failed_captures"])
def test_capture_release_cycles_leave_allocated_memory_where_it_started(fails):
    x = torch.randn(1, 3, 224, 224, device="cuda")
    fn = (lambda t: t * t.sum().item()) if fails else gelu

    def cycle():
        try:
            g = capture(fn, x)
            g(x)
            del g
        except CaptureError:
            pass

    for _ in range(3):  # first captures create lasting state (cuBLAS, RNG, capture stream)
        cycle()
    gc.collect()
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    for _ in range(100):
        cycle()
    gc.collect()
    torch.cuda.synchronize()
    end = torch.cuda.memory_allocated()
    print(f"\n100 {'failed ' if fails else ''}capture/release cycles: memory_allocated {start} -> {end} bytes, "
          f"reserved {torch.cuda.memory_reserved()} bytes")
    assert end == start
    g = capture(gelu, x)
    torch.testing.assert_close(g(x), gelu(x))


# ------------------------------------------------------------------------------- two hand-written captures
def test_a_graph_does_not_own_what_it_reads():
    kept = run(two_captures, "keep everything")
    dropped = run(two_captures, "drop")
    print(f"\nkept alive: {kept}\ndropped: {dropped}")
    assert kept["exit code"] == 0 and kept["replay of graph 1"] == "ok", kept
    assert all(state.endswith(": allocated") for state in kept["graph 1 memory"]), kept
    # graph 1's model, optimizer state and inputs were freed: after the second capture (whose
    # torch.cuda.graph() empties the cache) part of that memory is no longer graph 1's to read
    freed = sum(n for state, n in dropped["graph 1 memory"].items() if not state.endswith(": allocated"))
    assert freed > 0 or dropped.get("replay of graph 1") != "ok", dropped


# ------------------------------------------------------------------------------------------------- advise
def test_advise_predicts_the_small_and_large_gelu():
    rows = []
    for shape in [(1, 3, 224, 224), (32, 3, 224, 224)]:
        x = torch.randn(shape, device="cuda")
        a = advise(gelu, x)
        g = capture(gelu, x)
        from cudagraph_kit import compare
        df = compare({"eager": gelu, "graph": lambda t, g=g: g.replay()}, x, case=str(shape))
        measured, graph_us = float(df.speedup.iloc[1]), float(df.median_us.iloc[1])
        rows.append((shape, a.speedup, measured))
        print(f"\n{a}\n  measured: graph {graph_us:.1f} µs, speedup {measured:.2f}x")
        assert a.eager_us > 0 and a.floor_us > 0 and a.kernels_per_call >= 5 and a.launch_us > 0
        assert a.graph_gpu_us <= a.floor_us and a.speedup >= a.speedup_if_no_gap_saved
        # the model predicts the graph's time; eager time drifts with the host between two measurements
        assert 1 / 1.5 < a.graph_us / graph_us < 1.5
    assert rows[0][1] > rows[1][1]  # the small tensor is launch-bound, the large one is not


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_capture_runs_on_the_inputs_device_not_the_current_one():
    x = torch.randn(64, device="cuda:1")
    with torch.cuda.device(0):
        g = capture(gelu, x)
        assert g.graph is not None
        torch.testing.assert_close(g(x), gelu(x))
    with pytest.raises(ValueError, match="several devices"):
        capture(torch.add, torch.randn(2, device="cuda:0"), torch.randn(2, device="cuda:1"))
