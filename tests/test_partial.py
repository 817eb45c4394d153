"""graph_modules(): make_graphed_callables with its traps turned into clear errors. The per-call checks run on
any machine (called directly); capture and replay need the GPU."""
import copy

import pytest
import torch

from cudagraph_kit import NoCudaError, graph_modules
from cudagraph_kit import partial

HAS_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_no_cuda_raises():
    with pytest.raises(NoCudaError, match="NVIDIA GPU"):
        graph_modules(torch.nn.Linear(4, 4), (torch.randn(2, 4),))


# ---------------------------------------------------------------- the per-call checks, on any machine
def _checked_call(*samples, autocast_at_capture=False, module=None):
    calls = []
    specs = tuple(partial._spec(t) for t in samples)
    fn = partial._checked(lambda *a, **k: calls.append((a, k)) or "replayed", specs, autocast_at_capture,
                          "Block", module=module)
    return fn, calls


def test_checked_call_passes_matching_inputs_through():
    fn, calls = _checked_call(torch.randn(4, 8), torch.randn(4, 3, requires_grad=True))
    a, b = torch.randn(4, 8), torch.randn(4, 3, requires_grad=True)
    assert fn(a, b, scale=2) == "replayed"
    assert calls == [((a, b), {"scale": 2})]


@pytest.mark.parametrize("args, error, match", [
    (lambda: (torch.randn(4, 8),), TypeError, r"Block was graphed with 2 input\(s\), got 1"),
    (lambda: (torch.randn(2, 8), torch.randn(4, 3, requires_grad=True)), ValueError,
     r"Block: input 0 is \(\(2, 8\), torch.float32, device\(type='cpu'\), False\).*Nothing was replayed"),
    (lambda: (torch.randn(4, 8, requires_grad=True), torch.randn(4, 3, requires_grad=True)), ValueError,
     r"input 0 is .*True\).*requires_grad=True only for activations"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 3)), ValueError, r"input 1 is \(\(4, 3\), torch.float32, .*False\)"),
    (lambda: (torch.randn(4, 8).double(), torch.randn(4, 3, requires_grad=True)), ValueError, r"torch.float64"),
    (lambda: ([0.0] * 8, torch.randn(4, 3, requires_grad=True)), ValueError, r"input 0 is list"),
], ids=["count", "shape", "requires_grad_on_data", "requires_grad_off_on_activation", "dtype", "non_tensor"])
def test_checked_call_refuses_mismatches_before_replaying(args, error, match):
    fn, calls = _checked_call(torch.randn(4, 8), torch.randn(4, 3, requires_grad=True))
    with pytest.raises(error, match=match):
        fn(*args())
    assert calls == []


def test_checked_call_refuses_another_autocast_state(monkeypatch):
    fn, calls = _checked_call(torch.randn(4, 8), autocast_at_capture=False)
    monkeypatch.setattr(partial, "_autocast_enabled", lambda: True)  # as if called under torch.autocast("cuda")
    with pytest.raises(RuntimeError, match="graphed with autocast off but is called with autocast on"):
        fn(torch.randn(4, 8))
    on, calls_on = _checked_call(torch.randn(4, 8), autocast_at_capture=True)
    assert on(torch.randn(4, 8)) == "replayed" and len(calls_on) == 1
    monkeypatch.setattr(partial, "_autocast_enabled", lambda: False)
    with pytest.raises(RuntimeError, match="graphed with autocast on but is called with autocast off"):
        on(torch.randn(4, 8))
    assert calls == [] and len(calls_on) == 1


def test_checked_call_skips_checks_when_the_module_left_its_capture_mode():
    module = torch.nn.Linear(8, 2)  # graphed in training mode
    fn, calls = _checked_call(torch.randn(4, 8), module=module)
    with pytest.raises(ValueError, match="input 0"):
        fn(torch.randn(3, 8))
    module.eval()  # make_graphed_callables runs the original forward in eval mode: any shape is fine
    assert fn(torch.randn(3, 8)) == "replayed" and len(calls) == 1
    module.train()
    with pytest.raises(ValueError, match="input 0"):
        fn(torch.randn(3, 8))


def _blocks():
    torch.manual_seed(0)
    return (torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU()).cuda(),
            torch.nn.Linear(256, 16).cuda())


@pytest.mark.gpu
def test_forward_backward_match_eager_with_shared_pool():
    b1, b2 = _blocks()
    e1, e2 = copy.deepcopy(b1), copy.deepcopy(b2)
    x = torch.randn(32, 128, device="cuda")
    h = torch.randn(32, 256, device="cuda", requires_grad=True)
    g1, g2 = graph_modules((b1, b2), ((x,), (h,)))
    for _ in range(3):
        data, target = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")
        for m in (g1, g2, e1, e2):
            m.zero_grad(set_to_none=True)
        loss_g = torch.nn.functional.mse_loss(g2(g1(data)), target)
        loss_g.backward()
        loss_e = torch.nn.functional.mse_loss(e2(e1(data)), target)
        loss_e.backward()
        torch.testing.assert_close(loss_g, loss_e)
        for pg, pe in zip(list(g1.parameters()) + list(g2.parameters()), list(e1.parameters()) + list(e2.parameters())):
            torch.testing.assert_close(pg.grad, pe.grad)


@pytest.mark.gpu
def test_requires_grad_and_shape_mismatch_are_refused():
    b1, _ = _blocks()
    g1 = graph_modules(b1, (torch.randn(32, 128, device="cuda"),))
    with pytest.raises(ValueError, match="requires_grad=True only for activations"):
        g1(torch.randn(32, 128, device="cuda", requires_grad=True))
    with pytest.raises(ValueError, match=r"input 0 is \(\(8, 128\)"):
        g1(torch.randn(8, 128, device="cuda"))
    g1.eval()  # eval mode runs the original forward: any shape works
    assert g1(torch.randn(8, 128, device="cuda")).shape == (8, 256)


@pytest.mark.gpu
def test_autocast_cache_trap_and_state_mismatch():
    b1, _ = _blocks()
    x = torch.randn(32, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="cache_enabled=False"):
            graph_modules(b1, (x,))
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
        g1 = graph_modules(b1, (x,))
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            assert g1(x).dtype == torch.float16
    with pytest.raises(RuntimeError, match="graphed with autocast on but is called with autocast off"):
        g1(x)


@pytest.mark.gpu
def test_cpu_sample_arg_rejected():
    with pytest.raises(ValueError, match=r"must be a CUDA tensor.*\.cuda\(\)"):
        graph_modules(torch.nn.Linear(4, 4).cuda(), (torch.randn(2, 4),))
