"""Tests of cudagraph_kit.train_step: clear errors and eager fallback on CPU; parity with eager on the GPU."""
import copy
import importlib.util
import shutil

import pytest
import torch

from cudagraph_kit.capture import NoCudaError
from cudagraph_kit.train_step import GraphedTrainStep, capture_train_step

HAS_CUDA = torch.cuda.is_available()


def make_model(device="cpu", dropout=False, seed=0):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(128, 256), torch.nn.Dropout(0.2), torch.nn.Linear(256, 16), torch.nn.Dropout(0.1)]
    if not dropout:
        layers = [m for m in layers if not isinstance(m, torch.nn.Dropout)]
    return torch.nn.Sequential(*layers).to(device)


def make_batches(n, batch=32, device="cpu", seed=1, last=None):
    g = torch.Generator().manual_seed(seed)
    sizes = [batch] * n + ([last] if last else [])
    return [(torch.randn(b, 128, generator=g).to(device), torch.randn(b, 16, generator=g).to(device)) for b in sizes]


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, capturable=True)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, capturable=True)
    raise ValueError(kind)


def eager_train(model, opt, batches, loss_fn=torch.nn.functional.mse_loss):
    """The hand-written eager loop every variant is compared with."""
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def max_param_diff(a, b):
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def bitwise_equal(a, b):
    return all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))


# ---------------------------------------------------------------------------------------------- CPU tests
def test_non_capturable_adam_names_the_fix():
    model = make_model()
    for opt in (torch.optim.Adam(model.parameters()), torch.optim.AdamW(model.parameters(), lr=1e-3)):
        with pytest.raises(ValueError, match=r"capturable=True") as info:
            capture_train_step(model, opt, torch.nn.MSELoss(), make_batches(1)[0])
        assert type(opt).__name__ in str(info.value)


def test_one_non_capturable_param_group_is_caught():
    model = make_model()
    opt = torch.optim.Adam([{"params": model[0].parameters()},
                            {"params": model[1].parameters(), "capturable": False}], capturable=True)
    with pytest.raises(ValueError, match="capturable=True"):
        capture_train_step(model, opt, torch.nn.MSELoss(), make_batches(1)[0])


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA error")
def test_no_cuda_raises_nocudaerror():
    model = make_model()
    with pytest.raises(NoCudaError, match="eager_fallback=True"):
        capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss(),
                           make_batches(1)[0])
    assert issubclass(NoCudaError, RuntimeError)


def test_bad_arguments():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_batches(1)[0]
    with pytest.raises(ValueError, match="warmup"):
        capture_train_step(model, opt, torch.nn.MSELoss(), (x, y), warmup=0, eager_fallback=True)
    with pytest.raises(ValueError, match="inputs..., target"):
        capture_train_step(model, opt, torch.nn.MSELoss(), (x,), eager_fallback=True)
    with pytest.raises(TypeError, match="not a tensor"):
        capture_train_step(model, opt, torch.nn.MSELoss(), (x, 3.0), eager_fallback=True)
    with pytest.raises(ValueError, match="GradScaler"):
        capture_train_step(model, opt, torch.nn.MSELoss(), (x, y), amp_dtype=torch.float16, eager_fallback=True)
    with pytest.raises(ValueError, match="amp_dtype"):
        capture_train_step(model, opt, torch.nn.MSELoss(), (x, y), amp_dtype=torch.float64, eager_fallback=True)
    step = capture_train_step(model, opt, torch.nn.MSELoss(), (x, y), eager_fallback=True)
    with pytest.raises(TypeError, match="step\\(\\*inputs, target\\)"):
        step(x)
    with pytest.raises(ValueError, match="float64"):
        step(x.double(), y)


@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "adamw_cpu"])
def test_eager_fallback_matches_hand_written_loop(kind):
    def opt_for(m):
        if kind == "adamw_cpu":  # capturable=True is GPU-only, so the CPU fallback uses a plain AdamW
            return torch.optim.AdamW(m.parameters(), lr=1e-3)
        return make_opt(kind, m.parameters())

    ref = make_model(dropout=True)
    test = copy.deepcopy(ref)
    batches = make_batches(6, last=7)  # includes a short last batch
    torch.manual_seed(123)
    ref_losses = eager_train(ref, opt_for(ref), batches)

    torch.manual_seed(123)  # same dropout masks in the same order
    step = capture_train_step(test, opt_for(test), torch.nn.functional.mse_loss, batches[0],
                              eager_fallback=True, warmup=2)
    losses = [step(x, y) for x, y in batches]
    assert step.mode == "eager" and step.graph is None
    assert bitwise_equal(ref, test), max_param_diff(ref, test)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0)
    assert max_param_diff(ref, make_model(dropout=True)) > 0  # training moved the parameters: the test can fail


def test_eager_fallback_bf16_autocast_on_cpu_runs():
    model = make_model()
    step = capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss(),
                              make_batches(1)[0], amp_dtype=torch.bfloat16, eager_fallback=True)
    losses = [step(x, y) for x, y in make_batches(3)]
    assert all(torch.isfinite(l) for l in losses)


def test_module_stands_alone(tmp_path):
    """The file works when copied on its own (no cudagraph_kit package around it)."""
    import cudagraph_kit.train_step as ts
    target = tmp_path / "my_train_step.py"
    shutil.copy(ts.__file__, target)
    spec = importlib.util.spec_from_file_location("my_train_step", target)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert issubclass(mod.NoCudaError, RuntimeError)
    model = make_model()
    step = mod.capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.MSELoss(),
                                  make_batches(1)[0], eager_fallback=True)
    assert step.mode == "eager"


# ---------------------------------------------------------------------------------------------- GPU tests
gpu = pytest.mark.gpu


def _graph_vs_eager(kind, n=20, last=None, warmup=3, **kw):
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(n, device="cuda", last=last)
    ref_losses = eager_train(ref, make_opt(kind, ref.parameters()), batches)
    step = capture_train_step(test, make_opt(kind, test.parameters()), torch.nn.functional.mse_loss,
                              batches[0], warmup=warmup, **kw)
    losses = [step(x, y) for x, y in batches]
    torch.cuda.synchronize()
    return ref, test, step, ref_losses, losses


@gpu
@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "adam", "adamw"])
def test_graph_matches_eager(kind, record_property):
    ref, test, step, ref_losses, losses = _graph_vs_eager(kind, n=30)
    assert step.mode == "graph" and step.state == "captured" and step.eager_steps == 0
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    diff, bitwise = max_param_diff(ref, test), bitwise_equal(ref, test)
    record_property("max_abs_diff", diff)
    record_property("bitwise_equal", bitwise)
    print(f"\n{kind}: max |param diff| after 30 steps = {diff:.3g}, bitwise equal: {bitwise}")
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-6, atol=1e-7)
    assert max_param_diff(ref, make_model("cuda")) > 1e-3  # it trained


@gpu
@pytest.mark.parametrize("kind", ["sgd_momentum", "adam"])
def test_partial_batch_runs_eagerly_and_graph_continues(kind):
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    epoch = make_batches(8, device="cuda", last=5)  # 8 full batches + a short one
    batches = epoch + make_batches(8, device="cuda", seed=7, last=5) + make_batches(4, device="cuda", seed=9)
    ref_losses = eager_train(ref, make_opt(kind, ref.parameters()), batches)
    step = capture_train_step(test, make_opt(kind, test.parameters()), torch.nn.functional.mse_loss, batches[0])
    grads_before = None
    losses = []
    for x, y in batches:
        losses.append(step(x, y))
        if step.state == "captured" and grads_before is None:
            grads_before = [p.grad.data_ptr() for p in test.parameters()]
    torch.cuda.synchronize()
    assert step.eager_steps == 2 and step.state == "captured"
    assert [p.grad.data_ptr() for p in test.parameters()] == grads_before  # static grads kept
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack([l.float() for l in losses]), torch.stack(ref_losses),
                               rtol=1e-5, atol=1e-6)


@gpu
def test_loss_is_a_distinct_tensor_per_step():
    _, _, step, ref_losses, losses = _graph_vs_eager("sgd", n=8)
    assert len({l.data_ptr() for l in losses}) == len(losses)
    assert len(set(torch.stack(losses).tolist())) > 1
    # clone_loss=False returns the graph's static loss: the same tensor each time, overwritten by each replay
    model = make_model("cuda")
    batches = make_batches(6, device="cuda")
    step = capture_train_step(model, make_opt("sgd", model.parameters()), torch.nn.functional.mse_loss,
                              batches[0], clone_loss=False)
    out = [step(x, y) for x, y in batches]
    assert out[-1] is out[-2] is step.static_loss


@gpu
def test_wrong_dtype_or_device_is_refused_and_graph_survives():
    ref, test, step, _, _ = _graph_vs_eager("sgd", n=5)
    x, y = make_batches(1, device="cuda", seed=3)[0]
    with pytest.raises(ValueError, match="on cpu"):
        step(x.cpu(), y)
    with pytest.raises(ValueError, match="float64"):
        step(x, y.double())
    step(x, y)
    eager_train(ref, make_opt("sgd", ref.parameters()), [(x, y)])
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-6, atol=1e-7)


@gpu
def test_bf16_autocast_matches_eager_autocast():
    if torch.cuda.get_device_capability() < (8, 0):
        with pytest.raises(ValueError, match="float16"):
            model = make_model("cuda")
            capture_train_step(model, make_opt("sgd", model.parameters()), torch.nn.MSELoss(),
                               make_batches(1, device="cuda")[0], amp_dtype=torch.bfloat16)
        pytest.skip("bf16 needs compute capability >= 8.0 (the clear error was checked)")
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(20, device="cuda", last=9)
    opt_ref = make_opt("adam", ref.parameters())
    for x, y in batches:
        opt_ref.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        opt_ref.step()
    step = capture_train_step(test, make_opt("adam", test.parameters()), torch.nn.functional.mse_loss,
                              batches[0], amp_dtype=torch.bfloat16)
    losses = [step(x, y) for x, y in batches]
    torch.cuda.synchronize()
    assert step.state == "captured" and step.eager_steps == 1
    assert all(torch.isfinite(l) for l in losses)
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_fp16_with_grad_scaler_matches_eager_scaler_loop():
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(20, device="cuda", last=9)
    opt_ref, scaler_ref = make_opt("adam", ref.parameters()), torch.amp.GradScaler("cuda", growth_interval=4)
    for x, y in batches:
        opt_ref.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = torch.nn.functional.mse_loss(ref(x), y)
        scaler_ref.scale(loss).backward()
        scaler_ref.step(opt_ref)
        scaler_ref.update()
    scaler = torch.amp.GradScaler("cuda", growth_interval=4)
    step = capture_train_step(test, make_opt("adam", test.parameters()), torch.nn.functional.mse_loss,
                              batches[0], amp_dtype=torch.float16, scaler=scaler)
    losses = [step(x, y) for x, y in batches]
    torch.cuda.synchronize()
    assert step.state == "captured" and step.eager_steps == 1
    assert all(torch.isfinite(l) for l in losses)
    assert scaler.get_scale() == scaler_ref.get_scale()  # the scale update (outside the graph) ran every step
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_fp16_without_scaler_is_refused():
    model = make_model("cuda")
    with pytest.raises(ValueError, match="GradScaler"):
        capture_train_step(model, make_opt("sgd", model.parameters()), torch.nn.MSELoss(),
                           make_batches(1, device="cuda")[0], amp_dtype=torch.float16)


@gpu
def test_dropout_masks_change_between_replays():
    model = make_model("cuda", dropout=True)
    batches = make_batches(1, device="cuda") * 8  # the same batch every step
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: parameters fixed, only the masks vary
    step = capture_train_step(model, opt, torch.nn.functional.mse_loss, batches[0])
    losses = torch.stack([step(x, y) for x, y in batches]).tolist()
    assert len(set(losses[4:])) == len(losses[4:])  # replays draw new dropout masks


def test_graphedtrainstep_exported():
    import cudagraph_kit
    assert cudagraph_kit.capture_train_step is capture_train_step
    assert cudagraph_kit.GraphedTrainStep is GraphedTrainStep


@gpu
def test_habitual_zero_grad_after_capture_is_refused_not_silently_ignored():
    model = make_model("cuda")
    opt = make_opt("sgd", model.parameters())
    batches = make_batches(6, device="cuda")
    step = capture_train_step(model, opt, torch.nn.functional.mse_loss, batches[0], warmup=2)
    for x, y in batches[:4]:
        step(x, y)
    assert step.state == "captured"
    opt.zero_grad()  # sets .grad to None: the graph would keep writing the old buffers
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="remove zero_grad"):
        step(*batches[4])
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p, b)  # nothing ran
