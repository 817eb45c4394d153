"""The first replay after a capture draws the random numbers eager draws, even when the GPU runs the capture stream
late (graphed.after_capture). GPU only.

Before a capture begins, PyTorch writes each generator's seed and offset into device tensors on the capture stream;
the first replay, on the caller's stream, writes them again and then reads them. Nothing in PyTorch orders the two
streams. Here a sleep kernel queued on the capture stream right before ``capture_begin`` makes that stream late on
purpose (as a busy GPU can), and the captured function sleeps before it draws, so a late write lands inside the
first replay. Plain ``torch.cuda.graph`` then draws from the capture-time seed; the kit's helpers do not.
"""
import time

import pytest
import torch

from cudagraph_kit import graph_modules
from cudagraph_kit.graphed import capture

pytestmark = pytest.mark.gpu
LATE_MS, DRAW_AFTER_MS = 3000, 4000   # the capture stream's delay, and the replay's sleep before it draws
QUEUED_AT = []   # host clock when the delay was queued on the capture stream


def _cycles(ms: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that take about ``ms`` on this GPU (measured with CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)    # clocks up first: a cycle count calibrated at idle clocks sleeps short later
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return int(20_000_000 / start.elapsed_time(end) * ms)


@pytest.fixture
def late_capture_stream(monkeypatch):
    """Every ``torch.cuda.CUDAGraph`` made in the test (the kit's and ``make_graphed_callables``') queues a sleep on
    the capture stream just before ``capture_begin``; returns a function that sleeps, then draws dropout."""
    late, draw_after = _cycles(LATE_MS), _cycles(DRAW_AFTER_MS)
    QUEUED_AT.clear()   # this test's capture only: never an earlier test's clock

    class LateCaptureStream(torch.cuda.CUDAGraph):
        def capture_begin(self, *args, **kwargs):
            torch.cuda._sleep(late)   # on the capture stream: torch.cuda.graph made it current
            QUEUED_AT.append(time.perf_counter())
            super().capture_begin(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", LateCaptureStream)

    def sleep_then_dropout(x):
        torch.cuda._sleep(draw_after)
        return torch.nn.functional.dropout(x, 0.5, training=True)
    return sleep_then_dropout


def _first_replay_and_eager(replay_once, eager, x, host_waited=False):
    """The first replay and eager, both after seed 2. Unless the helper under test waits on the host
    (``host_waited``: its fix is a synchronize), the host must reach the replay while the capture stream is still
    late; otherwise the race cannot happen and the test would prove nothing."""
    host_ms = (time.perf_counter() - QUEUED_AT[-1]) * 1e3
    assert host_waited or host_ms < LATE_MS / 2, (
        f"the host reached the first replay {host_ms:.0f} ms after the capture stream's {LATE_MS} ms delay was "
        "queued: something between waited for the capture stream, so this run cannot show the race")
    torch.manual_seed(2)              # the capture ran under seed 1
    first = replay_once(x).clone()
    torch.manual_seed(2)
    return first, eager(x)


def test_plain_torch_cuda_graph_leaves_the_first_replay_racing_a_late_capture_stream(late_capture_stream):
    """The premise: without an order between the streams, the first replay draws from the capture-time seed. If
    this starts to fail, PyTorch orders its capture prologue itself and ``after_capture`` has become redundant."""
    x = torch.ones(4096, device="cuda")
    late_capture_stream(x)            # warm up, as any capture does: a kernel first loaded inside a capture
    torch.cuda.synchronize()          # (CUDA's lazy loading) can synchronize the context and hide the race
    torch.manual_seed(1)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=side):
        static_out = late_capture_stream(x)

    def replay_once(_):
        graph.replay()
        return static_out
    first, eager = _first_replay_and_eager(replay_once, late_capture_stream, x)
    assert not torch.equal(first, eager)
    torch.manual_seed(2)
    graph.replay()
    torch.manual_seed(2)
    assert torch.equal(static_out, late_capture_stream(x))   # the next replay's own write wins: it matches again


def test_capture_orders_the_first_replay_after_a_late_capture_stream(late_capture_stream):
    x = torch.ones(4096, device="cuda")
    torch.manual_seed(1)
    g = capture(late_capture_stream, x, warmup=1)
    first, eager = _first_replay_and_eager(g, late_capture_stream, x)
    assert torch.equal(first, eager), f"{(first != eager).sum().item()} of {x.numel()} elements differ from eager"


def test_graph_modules_orders_the_first_replay_after_a_late_capture_stream(late_capture_stream):
    class SleepThenDropout(torch.nn.Module):
        def forward(self, x):
            return late_capture_stream(x)
    net = SleepThenDropout().cuda().train()
    x = torch.ones(4096, device="cuda", requires_grad=True)
    torch.manual_seed(1)
    graphed = graph_modules(net, (x,), warmup=1)
    first, eager = _first_replay_and_eager(graphed, late_capture_stream, x, host_waited=True)   # forward graphed
    assert torch.equal(first, eager), f"{(first != eager).sum().item()} of {x.numel()} elements differ from eager"
