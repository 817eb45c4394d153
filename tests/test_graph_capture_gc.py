"""graph_capture pauses Python's garbage collector while it captures, without a full collection: a CUDAGraph left
in a reference cycle is never freed inside another capture (its teardown calls CUDA while a stream captures; seen
breaking a training-step capture on an H100), and is freed after it. The collector's state is put back, also when
the capture fails."""
import gc
import weakref

import pytest
import torch

from cudagraph_kit.graphed import CaptureError, capture, capture_stream, graph_capture

pytestmark = pytest.mark.gpu


class Holder:
    """A reference cycle around a captured graph: only the cyclic collector frees it."""


def _drop_a_cyclic_graph_and_allocate(pending: list, refs: list, inside: list) -> None:
    enabled = gc.isenabled()
    gc.disable()                            # no collection while the cycle is built: it stays in the youngest
    h = Holder()                            # generation (a collection now would promote it to an older one, which
    h.me = h                                # the collector visits far less often: the control then fails by chance)
    h.graph = pending.pop()                 # a GraphedCallable: it holds a torch.cuda.CUDAGraph
    refs.append(weakref.ref(h))
    del h                                   # now cyclic garbage
    if enabled:                             # inside a capture graph_capture has paused the collector: kept paused
        gc.enable()
    junk = [[i] for i in range(2000)]       # container allocations: with threshold 1 the collector runs now
    del junk
    inside.append(refs[-1]() is None)       # was the cycle (and its graph) freed here?


def test_a_cyclic_graph_is_never_freed_inside_a_capture_and_is_freed_after():
    x = torch.ones(64, device="cuda")
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    try:
        # control: the same steps outside a capture, collector running: the cycle is freed at once
        pending, refs, inside = [capture(lambda t: t * 3, x)], [], []
        _drop_a_cyclic_graph_and_allocate(pending, refs, inside)
        assert inside == [True], "the set-up does not make the collector free the cycle; the test would prove nothing"

        pending, refs, inside = [capture(lambda t: t * 3, x)], [], []

        def fn(t):
            if torch.cuda.is_current_stream_capturing() and pending:
                _drop_a_cyclic_graph_and_allocate(pending, refs, inside)
            return t * 2 + 1

        g = capture(fn, x)
        assert inside == [False], "a cyclic graph was freed by the collector inside the capture"
        assert gc.isenabled() and gc.get_threshold() == (1, 1, 1)   # the pause ended with the capture
        torch.testing.assert_close(g(x), x * 2 + 1)
        gc.collect()
        assert refs[0]() is None                                   # freed after the capture, outside it
    finally:
        gc.set_threshold(*thresholds)
        (gc.enable if enabled else gc.disable)()


def test_the_collector_is_put_back_as_it_was_also_after_a_failed_capture():
    x = torch.ones(8, device="cuda")
    enabled = gc.isenabled()
    try:
        gc.disable()  # the caller's choice is kept
        capture(lambda t: t + 1, x)
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(CaptureError):
            capture(lambda t: t + float(t.sum()), x)  # a host sync: the capture fails
        assert gc.isenabled()
        graph = torch.cuda.CUDAGraph()
        garbage = Holder()
        garbage.me = garbage
        ref = weakref.ref(garbage)
        del garbage
        with graph_capture(graph, stream=capture_stream(), collect_garbage=True):  # opt-in full collection
            assert ref() is None and not gc.isenabled()
            y = x * 2
        graph.replay()
        torch.testing.assert_close(y, x * 2)
    finally:
        (gc.enable if enabled else gc.disable)()


def test_graph_modules_captures_with_the_collector_paused(monkeypatch):
    """make_graphed_callables captures too: graph_modules pauses the collector around it (a flaky
    'operation failed due to a previous error during capture' in test_partial on an H100 came from its absence)."""
    from cudagraph_kit.partial import graph_modules

    real, seen = torch.cuda.make_graphed_callables, []

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", spy)
    enabled = gc.isenabled()
    gc.enable()
    try:
        block = torch.nn.Linear(16, 16).cuda()
        graph_modules(block, (torch.randn(4, 16, device="cuda", requires_grad=True),))
        assert seen == [False] and gc.isenabled()
    finally:
        if not enabled:
            gc.disable()
