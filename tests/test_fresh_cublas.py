"""fresh_cublas_workspace: frees PyTorch's cuBLAS workspaces only while a capture is under way, so a graph captured
beside reduce-overhead gets its own workspace; outside a capture it only calls the function."""
import pytest
import torch

from cudagraph_kit.graphed import capture, fresh_cublas_workspace


def test_outside_a_capture_it_calls_through_and_frees_nothing(monkeypatch):
    cleared = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: cleared.append(1), raising=False)

    def add(x, k=1):
        """adds k"""
        return x + k

    f = fresh_cublas_workspace(add)
    assert torch.equal(f(torch.ones(2), k=2), torch.full((2,), 3.0))
    assert (f.__name__, f.__doc__, cleared) == ("add", "adds k", [])


def test_during_a_capture_it_frees_the_workspaces_first(monkeypatch):
    order = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: order.append("clear"), raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    f = fresh_cublas_workspace(lambda x: order.append("fn") or x)
    f(torch.ones(1))
    assert order == ["clear", "fn"]


def test_a_module_keeps_its_attributes_to_itself():
    lin = torch.nn.Linear(2, 2)
    f = fresh_cublas_workspace(lin)
    assert not hasattr(f, "_parameters")      # wraps copies the name and doc, not a module's __dict__
    assert torch.equal(f(torch.ones(1, 2)), lin(torch.ones(1, 2)))


@pytest.mark.gpu
def test_a_wrapped_graph_survives_the_workspace_clear_reduce_overhead_does():
    """Capture a matmul chain wrapped, then free the workspaces (what reduce-overhead's warm-up does) and fill new
    memory: the replay still matches eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    w = [torch.randn(512, 512, device="cuda") / 23 for _ in range(4)]

    def chain(x):
        for m in w:
            x = torch.relu(x @ m)
        return x

    x = torch.randn(64, 512, device="cuda")
    g = capture(fresh_cublas_workspace(chain), x)
    torch._C._cuda_clearCublasWorkspaces()
    junk = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(8)]   # may reuse freed workspace memory
    x2 = torch.randn(64, 512, device="cuda")
    torch.testing.assert_close(g(x2), chain(x2))
    del junk
