"""Reliability fixes that are honest to test without a GPU: grad mode in eager fallback, one device per
capture, bare tensors refused by graph_modules (copying helpers alone: tests/test_copy_alone.py)."""
import pytest
import torch

from cudagraph_kit import graph_modules
from cudagraph_kit.graphed import capture

HAS_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(HAS_CUDA, reason="checks the eager fallback used without CUDA")
def test_eager_fallback_keeps_no_grad_on_later_calls():
    lin = torch.nn.Linear(4, 2)
    g = capture(lin, torch.randn(3, 4), eager_fallback=True)          # no_grad=True (the default)
    assert g.mode == "eager"
    assert not g(torch.randn(3, 4)).requires_grad                     # a later call: no autograd history
    assert not g.replay().requires_grad
    g_train = capture(lin, torch.randn(3, 4), eager_fallback=True, no_grad=False)
    assert g_train(torch.randn(3, 4)).requires_grad                   # asked for grad: gets it


def test_samples_on_several_devices_are_refused():
    with pytest.raises(ValueError, match=r"several devices \(cpu, meta\).*same GPU"):
        capture(torch.add, torch.randn(2), torch.empty(2, device="meta"), eager_fallback=True)


@pytest.mark.parametrize("modules, sample_args, match", [
    (torch.nn.Linear(4, 4), torch.randn(2, 4), r"sample_args is a bare tensor of shape \(2, 4\).*sample_args=\(x,\)"),
    ((torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), (torch.randn(2, 4), torch.randn(2, 4)),
     r"sample_args\[0\] is a bare tensor"),
    (torch.nn.Linear(4, 4), 3.0, "must be a tuple of tensors, got float"),
], ids=["one_module", "two_modules", "number"])
def test_graph_modules_refuses_bare_tensors_before_anything_else(modules, sample_args, match):
    with pytest.raises(TypeError, match=match):
        graph_modules(modules, sample_args)
