"""The stream rule (graphed.capture_stream, docs/ARCHITECTURE.md): every helper warms up and captures on one side
stream per GPU, reused. On the GPU: helpers that share a pool capture on that one stream (seen from inside the
captured functions), and repeated captures do not pile up cuBLAS workspaces (PyTorch's own bound)."""
import gc

import pytest
import torch

from cudagraph_kit import capture_buckets, capture_stream, capture_train_step, shared_pool
from cudagraph_kit.graphed import capture

gpu = pytest.mark.gpu


def test_capture_stream_refuses_a_cpu_device():
    with pytest.raises(ValueError, match=r"needs a CUDA device, got cpu.*Fix: pass the GPU"):
        capture_stream("cpu")


class StreamLog:
    """Wraps a function and records, per call, the stream it ran on and whether that stream was capturing."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        self.calls.append((torch.cuda.current_stream().cuda_stream, torch.cuda.is_current_stream_capturing()))
        return self.fn(*args)

    def streams(self, capturing: bool) -> set:
        return {s for s, c in self.calls if c == capturing}


@gpu
def test_helpers_sharing_a_pool_warm_up_and_capture_on_one_stream():
    kit = capture_stream(torch.device("cuda", torch.cuda.current_device()))
    assert kit is capture_stream() and kit != torch.cuda.default_stream()   # one side stream, reused
    lin = torch.nn.Linear(32, 32).cuda()
    pool = shared_pool()
    one = StreamLog(lambda t: torch.relu(lin(t)))
    g = capture(one, torch.randn(8, 32, device="cuda"), pool=pool)
    many = StreamLog(lambda t: torch.relu(lin(t)))
    serve = capture_buckets(many, torch.randn(8, 32, device="cuda"), sizes=[4, 8], pool=pool)

    model = torch.nn.Linear(32, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = StreamLog(torch.nn.functional.mse_loss)
    x, y = torch.randn(8, 32, device="cuda"), torch.randn(8, 4, device="cuda")
    step = capture_train_step(model, opt, loss, (x, y), warmup=2)
    for _ in range(4):  # 2 eager warm-ups, the capture, a replay
        step(x, y)

    assert step.state == "captured"
    for log in (one, many, loss):
        assert log.streams(capturing=True) == {kit.cuda_stream}, "captured on another stream"
        assert log.streams(capturing=False) == {kit.cuda_stream}, "warmed up on another stream"
    # sharing the pool leaves every graph correct, replayed in any order
    xs = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        want = torch.relu(lin(xs))
        got_buckets = serve(xs[:5]).clone()
        got_one = g(xs).clone()
        torch.testing.assert_close(got_one, want)
        torch.testing.assert_close(got_buckets, want[:5])


@gpu
def test_torchs_default_capture_stream_is_not_the_kits():
    before = getattr(torch.cuda.graph, "default_capture_stream", None)
    capture(torch.relu, torch.randn(4, device="cuda"))
    capture_buckets(torch.relu, torch.randn(4, 2, device="cuda"), sizes=[2, 4])
    after = getattr(torch.cuda.graph, "default_capture_stream", None)
    # PyTorch may create its own lazily (some releases do in every torch.cuda.graph()); the kit never sets it
    assert after is before or (before is None and after != capture_stream())


@gpu
def test_repeated_captures_do_not_grow_device_memory():
    """PyTorch's test_repeat_graph_capture_cublas_workspace_memory (test/test_cuda.py), through the kit: a
    matmul captured 100 times (each graph dropped) may grow the device memory in use (torch.cuda.mem_get_info) by
    at most 0.1 GB. Warm-ups on fresh streams (PyTorch hands them out from a pool per device) added cuBLAS
    workspaces, one per stream, that stay allocated."""
    blas = getattr(torch.backends.cuda, "preferred_blas_library", None)
    saved = blas() if blas else None
    if blas:
        blas("cublas")  # as PyTorch's test does
    try:
        a = torch.rand((1024, 512), device="cuda")
        b = torch.rand((512, 64), device="cuda")
        want = torch.mm(a, b)  # warm-up, as there (and the eager result every graph is compared with)
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        free_before, total = torch.cuda.mem_get_info()
        for _ in range(100):
            g = capture(torch.mm, a, b)
            torch.testing.assert_close(g.replay(), want, rtol=1e-4, atol=1e-3)  # 512-term fp32 sums
            del g
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        free_after, _ = torch.cuda.mem_get_info()
    finally:
        if blas:
            blas(saved)
    grown_gb = (free_before - free_after) / 1e9
    print(f"\ndevice memory in use grew by {grown_gb:.3f} GB over 100 captures of torch.mm")
    assert grown_gb < 0.1
