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
    fn = partial._checked(lambda *a, **k: calls.append((a, k)) or "replayed", samples, autocast_at_capture,
                          "Block", module=module)
    return fn, calls


def test_checked_call_passes_matching_inputs_through():
    fn, calls = _checked_call(torch.randn(4, 8), torch.randn(4, 3, requires_grad=True))
    a, b = torch.randn(4, 8), torch.randn(4, 3, requires_grad=True)
    assert fn(a, b, scale=2) == "replayed"
    assert calls == [((a, b), {"scale": 2})]


def test_checked_call_lets_a_real_input_skip_the_gradient_its_sample_asked_for():
    # as make_graphed_callables does: the graph computes that gradient and autograd drops it
    fn, calls = _checked_call(torch.randn(4, 8), torch.randn(4, 3, requires_grad=True))
    assert fn(torch.randn(4, 8), torch.randn(4, 3)) == "replayed" and len(calls) == 1


def test_checked_call_accepts_nested_sample_args_and_checks_their_structure():
    sample = ({"x": torch.randn(4, 8), "mask": torch.ones(4, dtype=torch.bool)}, [torch.randn(3)])
    fn, calls = _checked_call(*sample)
    batch = ({"x": torch.randn(4, 8), "mask": torch.zeros(4, dtype=torch.bool)}, [torch.randn(3)])
    assert fn(*batch) == "replayed" and calls[0][0] is not None
    with pytest.raises(ValueError, match="nested differently"):  # keys in another order would swap the copies
        fn({"mask": torch.zeros(4, dtype=torch.bool), "x": torch.randn(4, 8)}, [torch.randn(3)])
    with pytest.raises(ValueError, match=r"input 1 is \(\(5,\), torch.bool"):
        fn({"x": torch.randn(4, 8), "mask": torch.zeros(5, dtype=torch.bool)}, [torch.randn(3)])
    assert len(calls) == 1


@pytest.mark.parametrize("args, error, match", [
    (lambda: (torch.randn(4, 8),), TypeError, r"Block was graphed with 2 input\(s\), got 1"),
    (lambda: (torch.randn(2, 8), torch.randn(4, 3, requires_grad=True)), ValueError,
     r"Block: input 0 is \(\(2, 8\), torch.float32, device\(type='cpu'\)\).*Nothing was replayed"),
    (lambda: (torch.randn(4, 8, requires_grad=True), torch.randn(4, 3, requires_grad=True)), ValueError,
     r"input 0 requires grad, but its sample arg did not.*silently get none.*requires_grad=True"),
    (lambda: (torch.randn(4, 8).double(), torch.randn(4, 3, requires_grad=True)), ValueError, r"torch.float64"),
    (lambda: ([0.0] * 8, torch.randn(4, 3, requires_grad=True)), ValueError, r"nested differently"),
    (lambda: ("text", torch.randn(4, 3, requires_grad=True)), ValueError, r"input 0 is str"),
], ids=["count", "shape", "requires_grad_on_data", "dtype", "nested_list", "non_tensor"])
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
    with pytest.raises(ValueError, match="requires grad, but its sample arg did not"):
        g1(torch.randn(32, 128, device="cuda", requires_grad=True))
    with torch.no_grad():  # no gradient wanted: nothing is lost
        assert g1(torch.randn(32, 128, device="cuda", requires_grad=True)).shape == (32, 256)
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


class _DictBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, batch):
        y = self.lin(batch["x"]) * batch["scale"]
        return {"y": y, "h": torch.relu(y)}


@pytest.mark.gpu
def test_dict_sample_args_and_a_real_input_without_grad_match_eager():
    """A pytree (dict) sample argument works as in make_graphed_callables; a real activation that needs no
    gradient may be passed to a graph whose sample required one."""
    torch.manual_seed(0)
    block = _DictBlock().cuda()
    eager = copy.deepcopy(block)
    sample = {"x": torch.randn(4, 16, device="cuda", requires_grad=True), "scale": torch.rand(4, 1, device="cuda")}
    graphed = graph_modules(block, (sample,))
    for requires_grad in (True, False):
        x = torch.randn(4, 16, device="cuda", requires_grad=requires_grad)
        x_e = x.detach().clone().requires_grad_(requires_grad)
        scale = torch.rand(4, 1, device="cuda")
        for m in (graphed, eager):
            m.zero_grad(set_to_none=True)
        out_g, out_e = graphed({"x": x, "scale": scale}), eager({"x": x_e, "scale": scale})
        assert set(out_g) == {"y", "h"}
        torch.testing.assert_close(out_g["y"], out_e["y"])
        out_g["y"].square().sum().backward()
        out_e["y"].square().sum().backward()
        for pg, pe in zip(graphed.parameters(), eager.parameters()):
            torch.testing.assert_close(pg.grad, pe.grad)
        if requires_grad:
            torch.testing.assert_close(x.grad, x_e.grad)


@pytest.mark.gpu
def test_a_callable_that_reseeds_inside_is_refused():
    class Reseeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            torch.manual_seed(0)
            return torch.nn.functional.dropout(self.lin(x), 0.5)

    from cudagraph_kit import CaptureError
    with pytest.raises(CaptureError, match=r"torch.manual_seed.*seed before capture"):
        graph_modules(Reseeds().cuda(), (torch.randn(4, 8, device="cuda"),))
    torch.rand(2, device="cuda")  # the process keeps working
