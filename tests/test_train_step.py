"""Tests of cudagraph_kit.train_step: clear errors and eager fallback on CPU; parity with eager on the GPU."""
import copy

import pytest
import torch

from cudagraph_kit.graphed import CaptureError, NoCudaError
from cudagraph_kit.train_step import GraphedTrainStep, capture_train_step

HAS_CUDA = torch.cuda.is_available()
mse = torch.nn.functional.mse_loss


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
    if kind == "adamw_cpu":  # capturable=True is GPU-only; the CPU stand-in tests use a plain AdamW
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    raise ValueError(kind)


def eager_train(model, opt, batches, loss_fn=mse, sched=None, max_grad_norm=None, accumulate=1, record=None):
    """The hand-written eager loop every variant is compared with (schedule, clipping, accumulation optional).

    ``record`` (a dict) collects the LR after each call and the total gradient norm of each optimizer step.
    """
    losses = []
    for i, (x, y) in enumerate(batches):
        if i % accumulate == 0:
            opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        (loss / accumulate if accumulate > 1 else loss).backward()
        if i % accumulate == accumulate - 1:
            if max_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                if record is not None:
                    record.setdefault("norms", []).append(norm.item())
            opt.step()
            if sched is not None:
                sched.step()
        if record is not None:
            record.setdefault("lrs", []).append(opt.param_groups[0]["lr"])
        losses.append(loss.detach())
    return losses


def warmup_cosine(opt, warmup=5, total=50):
    """Linear warm-up then cosine decay, the schedule of most real training loops."""
    sched = torch.optim.lr_scheduler
    return sched.SequentialLR(opt, [sched.LinearLR(opt, start_factor=0.1, total_iters=warmup),
                                    sched.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])


class FakeGraph:
    """What ReplayingCapture returns: replay() runs the recorded work again into the same static outputs."""

    def __init__(self, work, outputs, fresh_grads):
        self.work, self.outputs, self.fresh_grads, self.replays = work, outputs, fresh_grads, 0

    def replay(self):
        with torch.no_grad():
            for g in self.fresh_grads:  # grads that did not exist at capture are written, not added to
                g.zero_()
        loss, norm = self.work()
        with torch.no_grad():
            self.outputs[0].copy_(loss)
            if norm is not None:
                self.outputs[1].copy_(norm)
        self.replays += 1


class ReplayingCapture:
    """CPU stand-in for ``cuda_graph_capture`` that keeps a CUDA graph's semantics where the step relies on them.

    - Capturing records the work but trains nothing: the recording run's changes to parameters, gradients
      and optimizer state are undone (a real capture launches no kernels).
    - Its outputs are static: each replay writes into the tensors returned at capture.
    - Gradients that were None at capture are allocated by the capture and *overwritten* by each replay
      (a captured backward into a fresh .grad); gradients that existed at capture are added to.
    - A replay re-runs the same Python work on whatever the static batch and LR tensors hold then, so a
      state machine that forgets to copy a batch or an LR in trains differently from eager, and the test fails.
    """

    def __init__(self, model, optimizer):
        self.model, self.optimizer, self.graphs, self.fail_next = model, optimizer, [], None

    def _state(self):
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        tensors = params + [p.grad for p in params if p.grad is not None]
        for st in self.optimizer.state.values():
            tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
        return params, tensors

    def __call__(self, work, pool, device):
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        params, tensors = self._state()
        unset = [p for p in params if p.grad is None]
        saved = [t.detach().clone() for t in tensors]
        outputs = work()
        with torch.no_grad():
            for t, v in zip(tensors, saved):
                t.copy_(v)
        graph = FakeGraph(work, outputs, [p.grad for p in unset])
        self.graphs.append(graph)
        return graph, outputs


def fake_graph_step(model, opt, sample_batch, warmup=2, **kw):
    """A GraphedTrainStep in graph mode on the CPU, capturing through ReplayingCapture."""
    fake = ReplayingCapture(model, opt)
    step = GraphedTrainStep(model, opt, kw.pop("loss_fn", mse), sample_batch, warmup=warmup, amp_dtype=None,
                            scaler=None, clone_loss=True, mode="graph", capture=fake, **kw)
    return step, fake


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
    with pytest.raises(ValueError, match=r"param group\(s\) \[1\] have capturable=False.*capturable=True"):
        capture_train_step(model, opt, torch.nn.MSELoss(), make_batches(1)[0])


def test_capturable_is_read_per_param_group_not_from_the_defaults():
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # constructed with the default capturable=False
    for group in opt.param_groups:
        group["capturable"] = True                        # ... then every group switched on, as step() reads it
    assert opt.defaults["capturable"] is False
    from cudagraph_kit.train_step import _check_capturable
    _check_capturable(opt)  # accepted: no group is capturable=False
    if not HAS_CUDA:  # past the optimizer check, the next refusal is the missing GPU
        with pytest.raises(NoCudaError):
            capture_train_step(model, opt, torch.nn.MSELoss(), make_batches(1)[0])
    opt.param_groups[0]["capturable"] = False
    with pytest.raises(ValueError, match="constructed with capturable=False"):
        _check_capturable(opt)


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


def test_eager_fallback_bf16_autocast_on_cpu_matches_eager_autocast_loop():
    ref = make_model()
    test = copy.deepcopy(ref)
    batches = make_batches(4)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for x, y in batches:
        ref_opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.detach())
    step = capture_train_step(test, torch.optim.SGD(test.parameters(), lr=0.1), torch.nn.MSELoss(),
                              batches[0], amp_dtype=torch.bfloat16, eager_fallback=True)
    losses = [step(x, y) for x, y in batches]
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0)
    assert bitwise_equal(ref, test) and max_param_diff(ref, make_model()) > 0


def test_bare_tensor_sample_batch_is_a_clear_error():
    model = make_model()
    x, _ = make_batches(1)[0]
    with pytest.raises(TypeError, match=r"single tensor.*sample_batch=\(x, y\)"):
        capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), mse, x, eager_fallback=True)


def test_bad_accumulate_and_max_grad_norm():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="accumulate"):
            capture_train_step(model, opt, mse, make_batches(1)[0], accumulate=bad, eager_fallback=True)
    with pytest.raises(ValueError, match="max_grad_norm"):
        capture_train_step(model, opt, mse, make_batches(1)[0], max_grad_norm=0.0, eager_fallback=True)


# -- the state machine on a CPU, through ReplayingCapture (a stand-in for the CUDA graph) ----------------------
def test_state_machine_warmup_capture_replay_and_short_batch():
    ref = make_model()
    test = copy.deepcopy(ref)
    batches = make_batches(6, last=5) + make_batches(3, seed=4)  # 6 full, a short one, 3 full
    ref_losses = eager_train(ref, make_opt("sgd_momentum", ref.parameters()), batches)
    step, fake = fake_graph_step(test, make_opt("sgd_momentum", test.parameters()), batches[0], warmup=2)
    states, grads_at_capture = [], None
    losses = []
    for x, y in batches:
        if step.state == "warmup":
            assert step.hyperparameters == []  # nothing captured yet: no hyper-parameter is read from the GPU
        losses.append(step(x, y))
        states.append(step.state)
        if step.state == "captured" and grads_at_capture is None:
            grads_at_capture = [p.grad for p in test.parameters()]
    assert states == ["warmup"] * 2 + ["captured"] * 8
    # SGD(lr=0.05, momentum=0.9): each hyper-parameter is either read from a GPU tensor or frozen, never both;
    # plain SGD reads both as Python numbers, so both are frozen at their values
    (hp,) = step.hyperparameters
    for key in ("lr", "momentum"):
        assert (key in hp["on_gpu"]) != (key in hp["frozen"]), hp
    assert hp["on_gpu"] == {} and hp["frozen"]["lr"] == 0.05 and hp["frozen"]["momentum"] == 0.9, hp
    assert len(fake.graphs) == 1 and step.graphs == {"step": fake.graphs[0]} and step.graph is fake.graphs[0]
    assert fake.graphs[0].replays == step.replays == 7  # 10 calls - 2 warm-up - 1 short batch
    assert step.eager_steps == 1 and step.warmup_steps == 2 and step.optimizer_steps == 10
    assert all(p.grad is g for p, g in zip(test.parameters(), grads_at_capture))  # short batch kept them
    assert bitwise_equal(ref, test), max_param_diff(ref, test)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0)
    assert max_param_diff(ref, make_model()) > 1e-3  # it trained


def test_replay_uses_each_new_batch_and_distinct_losses():
    model = make_model()
    batches = make_batches(6)
    step, fake = fake_graph_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batches[0], warmup=1)
    losses = torch.stack([step(x, y) for x, y in batches])
    expected = torch.stack([mse(model(x), y).detach() for x, y in batches])  # lr 0: the model never changes
    torch.testing.assert_close(losses, expected, rtol=0, atol=0)
    assert len(set(losses.tolist())) == 6


def test_zero_grad_runs_once_before_capture_and_never_around_a_replay():
    """What exercise 02.1's check tells a learner who lists zero_grad: after capture it is not run at all, neither
    eagerly nor inside the graph (the grads are set to None once before capturing; each replay overwrites them)."""
    model = make_model()
    opt = make_opt("sgd", model.parameters())
    calls = []
    plain = opt.zero_grad
    opt.zero_grad = lambda *a, **k: (calls.append(k.get("set_to_none", a[0] if a else True)), plain(*a, **k))[1]
    batches = make_batches(5)
    step, fake = fake_graph_step(model, opt, batches[0], warmup=1)
    step(*batches[0])                       # the eager warm-up step: zero_grad, as an eager loop does
    assert len(calls) == 1 and not fake.graphs
    step(*batches[1])                       # capture (and its one replay): zero_grad(set_to_none=True) just before
    assert calls[1:] == [True] and len(fake.graphs) == 1
    for x, y in batches[2:]:
        step(x, y)                          # replays: no zero_grad, in the graph or around it
    assert len(calls) == 2 and fake.graphs[0].replays == 4


def test_zero_grad_after_capture_is_refused_and_nothing_runs():
    model = make_model()
    opt = make_opt("sgd", model.parameters())
    batches = make_batches(5)
    step, fake = fake_graph_step(model, opt, batches[0], warmup=1)
    for x, y in batches[:3]:
        step(x, y)
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="remove zero_grad"):
        step(*batches[3])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert fake.graphs[0].replays == 2


def _fused_sgd_runs_on(device) -> bool:
    """Whether this PyTorch has fused SGD on ``device`` (on the CPU only from about 2.4 on): asked of the running
    PyTorch, not of a version table."""
    w = torch.nn.Parameter(torch.ones(2, device=device))
    w.grad = torch.ones(2, device=device)
    try:
        torch.optim.SGD([w], lr=0.1, fused=True).step()
        return True
    except (RuntimeError, NotImplementedError):
        return False


@pytest.mark.parametrize("kind", ["sgd_fused", "sgd_fused_momentum"])
def test_lr_schedule_reaches_the_graph(kind):
    """Warm-up + cosine over 50 steps: the graph trains with each new LR, exactly like the eager loop."""
    if not _fused_sgd_runs_on("cpu"):  # the models here are on the CPU
        pytest.skip(f"PyTorch {torch.__version__} has no fused SGD on the CPU")
    momentum = 0.9 if kind.endswith("momentum") else 0.0

    def opt_for(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum, fused=True)

    ref = make_model()
    test = copy.deepcopy(ref)
    batches = make_batches(50)
    rec = {}
    ref_losses = eager_train(ref, (ro := opt_for(ref)), batches, sched=warmup_cosine(ro), record=rec)
    opt = opt_for(test)
    sched = warmup_cosine(opt)
    step, fake = fake_graph_step(test, opt, batches[0], warmup=3)
    losses, lrs, graph_lrs = [], [], []
    for x, y in batches:
        losses.append(step(x, y))
        if step.state == "captured":
            graph_lrs.append(step.hyperparameters[0]["on_gpu"]["lr"].item())  # what the captured step read
            assert graph_lrs[-1] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-6)
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == rec["lrs"] and len(set(graph_lrs)) > 40  # the LR changed on (nearly) every replay
    assert step.replays == 47
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-6, atol=1e-7)
    frozen = copy.deepcopy(make_model())  # the same run with the LR frozen after warm-up trains differently
    eager_train(frozen, opt_for(frozen), batches)
    assert max_param_diff(frozen, test) > 1e-4


def test_scheduler_on_an_optimizer_that_freezes_the_lr_is_refused():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # foreach: reads the LR on the host
    warmup_cosine(opt)
    with pytest.raises(ValueError, match=r"fused=True.*capturable=True"):
        capture_train_step(model, opt, mse, make_batches(1)[0])  # refused before anything else
    step, fake = fake_graph_step(model, opt, make_batches(1)[0], warmup=1)
    batches = make_batches(3)
    step(*batches[0])  # an eager warm-up step is fine
    with pytest.raises(ValueError, match="LR scheduler is attached"):
        step(*batches[1])  # the capture is refused
    assert fake.graphs == [] and step.state == "warmup"


def test_lr_or_momentum_changed_after_capture_is_refused_for_frozen_values():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = make_batches(6)
    step, fake = fake_graph_step(model, opt, batches[0], warmup=1)
    for x, y in batches[:3]:
        step(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0]["lr"] = 0.05
    with pytest.raises(RuntimeError, match=r"LR changed from 0.1 to 0.05.*fused=True"):
        step(*batches[3])
    opt.param_groups[0]["lr"] = 0.1
    opt.param_groups[0]["momentum"] = 0.8
    with pytest.raises(RuntimeError, match="'momentum' changed from 0.9 to 0.8"):
        step(*batches[3])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # nothing ran
    opt.param_groups[0]["momentum"] = 0.9
    step(*batches[3])  # back to the captured values: it trains on
    assert fake.graphs[0].replays == 3


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_clipping_matches_eager_clip_grad_norm(mode):
    ref = make_model()
    test = copy.deepcopy(ref)
    batches = make_batches(12, last=5)
    rec = {}
    ref_losses = eager_train(ref, make_opt("sgd_momentum", ref.parameters()), batches, max_grad_norm=0.3, record=rec)
    assert max(rec["norms"]) > 0.3  # clipping is active
    opt = make_opt("sgd_momentum", test.parameters())
    if mode == "graph":
        step, _ = fake_graph_step(test, opt, batches[0], warmup=2, max_grad_norm=0.3)
    else:
        step = capture_train_step(test, opt, mse, batches[0], max_grad_norm=0.3, eager_fallback=True)
    norms, losses = [], []
    for x, y in batches:
        losses.append(step(x, y))
        norms.append(step.grad_norm.item())
    assert norms == pytest.approx(rec["norms"], rel=1e-6)
    assert bitwise_equal(ref, test), max_param_diff(ref, test)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0)
    unclipped = copy.deepcopy(make_model())
    eager_train(unclipped, make_opt("sgd_momentum", unclipped.parameters()), batches)
    assert max_param_diff(unclipped, test) > 1e-4  # clipping changed the result: the comparison can fail


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_accumulation_matches_eager(mode):
    ref = make_model()
    test = copy.deepcopy(ref)
    # windows of 3 micro-batches; the short batch falls in the middle of the 4th window
    batches = make_batches(10, seed=2) + make_batches(0, last=7) + make_batches(4, seed=5)
    ref_losses = eager_train(ref, make_opt("adamw_cpu", ref.parameters()), batches, accumulate=3)
    opt = make_opt("adamw_cpu", test.parameters())
    if mode == "graph":
        step, fake = fake_graph_step(test, opt, batches[0], warmup=2, accumulate=3)
    else:
        step = capture_train_step(test, opt, mse, batches[0], accumulate=3, eager_fallback=True)
    losses = [step(x, y) for x, y in batches]
    assert step.optimizer_steps == 5 and step.eager_steps == 1
    if mode == "graph":
        assert set(step.graphs) == {"first", "middle", "last"} and len(fake.graphs) == 3
        assert step.replays == 15 - 6 - 1  # 2 warm-up windows of 3 calls, 1 short batch
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0)
    assert bitwise_equal(ref, test), max_param_diff(ref, test)
    assert max_param_diff(ref, make_model()) > 1e-3


def test_failed_capture_raises_capture_error_and_the_step_recovers():
    ref = make_model()
    test = copy.deepcopy(ref)
    batches = make_batches(6)
    step, fake = fake_graph_step(test, make_opt("sgd", test.parameters()), batches[0], warmup=2)
    fake.fail_next = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    step(*batches[0])
    step(*batches[1])
    with pytest.raises(CaptureError, match=r"(?s)a synchronization with the CPU.*Fix:.*Original error: RuntimeError"):
        step(*batches[2])
    assert step.state == "warmup" and step.graph is None
    for x, y in batches[2:]:  # the same batch again, then the rest: the capture succeeds this time
        step(x, y)
    assert step.state == "captured"
    eager_train(ref, make_opt("sgd", ref.parameters()), batches)
    assert bitwise_equal(ref, test), max_param_diff(ref, test)


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


def _schedule_run(kind, n=50, warmup=3):
    """Eager and graphed training from the same seed with warm-up + cosine: (ref, test, step, eager record, lrs)."""
    def opt_for(m):
        if kind == "sgd_fused_momentum":
            return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, fused=True)
        return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01, capturable=True)

    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(n, device="cuda")
    rec = {}
    ref_opt = opt_for(ref)
    ref_losses = eager_train(ref, ref_opt, batches, sched=warmup_cosine(ref_opt, total=n), record=rec)
    opt = opt_for(test)
    sched = warmup_cosine(opt, total=n)
    step = capture_train_step(test, opt, mse, batches[0], warmup=warmup)
    losses, lrs = [], []
    for x, y in batches:
        losses.append(step(x, y))
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    torch.cuda.synchronize()
    frozen = make_model("cuda")  # the same run at a constant LR, to show the comparison can fail
    eager_train(frozen, opt_for(frozen), batches)
    return ref, test, step, rec, lrs, ref_losses, losses, frozen


@gpu
@pytest.mark.parametrize("kind", ["sgd_fused_momentum", "adamw_capturable"])
def test_lr_schedule_parity_with_eager_over_50_steps(kind, record_property):
    ref, test, step, rec, lrs, ref_losses, losses, frozen = _schedule_run(kind)
    assert step.state == "captured" and step.replays == 47 and isinstance(step.graph, torch.cuda.CUDAGraph)
    assert lrs == rec["lrs"] and len(set(lrs)) > 40
    assert step.hyperparameters[0]["on_gpu"]["lr"].item() == pytest.approx(rec["lrs"][-2], rel=1e-6)  # the last replay's LR
    diff = max_param_diff(ref, test)
    record_property("max_abs_diff", diff)
    print(f"\n{kind} + warm-up/cosine, 50 steps: max |param diff| = {diff:.3g}, bitwise {bitwise_equal(ref, test)}")
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-5, atol=1e-6)
    assert max_param_diff(frozen, test) > 1e-4  # the schedule mattered


@gpu
def test_scheduler_on_plain_sgd_is_refused_on_gpu():
    model = make_model("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    warmup_cosine(opt)
    with pytest.raises(ValueError, match=r"fused=True.*capturable=True"):
        capture_train_step(model, opt, mse, make_batches(1, device="cuda")[0])


@gpu
@pytest.mark.parametrize("kind", ["sgd_momentum", "adamw"])
def test_clipping_inside_the_graph_matches_eager(kind):
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(20, device="cuda", last=9)
    rec = {}
    eager_train(ref, make_opt(kind, ref.parameters()), batches, max_grad_norm=0.3, record=rec)
    assert max(rec["norms"]) > 0.3  # clipping is active
    step = capture_train_step(test, make_opt(kind, test.parameters()), mse, batches[0], max_grad_norm=0.3)
    norms = []
    for x, y in batches[:4]:  # warm-up and capture (the capture itself may synchronize)
        step(x, y)
        norms.append(step.grad_norm.clone())
    torch.cuda.set_sync_debug_mode("error")  # no host synchronization may happen inside a replayed step
    try:
        for x, y in batches[4:-1]:
            step(x, y)
            norms.append(step.grad_norm.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    step(*batches[-1])  # the short batch: an eager step
    norms.append(step.grad_norm.clone())
    assert step.state == "captured" and step.replays == 17  # 21 calls - 3 warm-up - 1 short batch
    assert torch.stack(norms).tolist() == pytest.approx(rec["norms"], rel=1e-5)
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_gradient_accumulation_graphs_match_eager():
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(10, device="cuda", seed=2) + make_batches(0, device="cuda", last=7) + \
        make_batches(7, device="cuda", seed=5)
    ref_losses = eager_train(ref, make_opt("adamw", ref.parameters()), batches, accumulate=3, max_grad_norm=1.0)
    step = capture_train_step(test, make_opt("adamw", test.parameters()), mse, batches[0], accumulate=3,
                              max_grad_norm=1.0, warmup=2)
    losses = [step(x, y) for x, y in batches]
    torch.cuda.synchronize()
    assert set(step.graphs) == {"first", "middle", "last"} and step.optimizer_steps == 6 and step.eager_steps == 1
    assert step.replays == 18 - 6 - 1  # 2 warm-up windows of 3 calls, 1 short batch
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_fp16_scaler_with_clipping_unscales_first_and_matches_eager():
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    batches = make_batches(20, device="cuda")
    opt_ref, scaler_ref = make_opt("adam", ref.parameters()), torch.amp.GradScaler("cuda", growth_interval=4)
    for x, y in batches:
        opt_ref.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = mse(ref(x), y)
        scaler_ref.scale(loss).backward()
        scaler_ref.unscale_(opt_ref)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.3)
        scaler_ref.step(opt_ref)
        scaler_ref.update()
    scaler = torch.amp.GradScaler("cuda", growth_interval=4)
    step = capture_train_step(test, make_opt("adam", test.parameters()), mse, batches[0], amp_dtype=torch.float16,
                              scaler=scaler, max_grad_norm=0.3)
    for x, y in batches:
        step(x, y)
    torch.cuda.synchronize()
    assert step.state == "captured" and scaler.get_scale() == scaler_ref.get_scale()
    assert step.grad_norm.item() < 100  # the norm of unscaled gradients, not of the scaled ones
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_step_with_item_raises_capture_error_and_process_keeps_working():
    def loss_with_item(out, y):
        loss = mse(out, y)
        if loss.item() > 1e9:  # a host sync: illegal while capturing
            loss = loss * 0
        return loss

    model = make_model("cuda")
    batches = make_batches(5, device="cuda")
    step = capture_train_step(model, make_opt("sgd", model.parameters()), loss_with_item, batches[0], warmup=1)
    step(*batches[0])  # eager warm-up works
    with pytest.raises(CaptureError, match=r"(?s)Fix:.*Original error"):
        step(*batches[1])
    assert step.state == "warmup"
    # the process and the CUDA context still work: eager training and a fresh graphed step
    ref = make_model("cuda")
    test = copy.deepcopy(ref)
    eager_train(ref, make_opt("sgd", ref.parameters()), batches)
    good = capture_train_step(test, make_opt("sgd", test.parameters()), mse, batches[0], warmup=1)
    for x, y in batches:
        good(x, y)
    torch.cuda.synchronize()
    assert good.state == "captured"
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-6, atol=1e-7)


def test_a_step_that_reseeds_inside_is_refused_at_capture():
    """torch.manual_seed inside the step: warm-up steps run it eagerly, but a graph would never reseed. The kit sees it
    from the generator's seed (make_model seeded 0; the step reseeds 1234), patching nothing."""
    def reseeding_loss(out, target):
        torch.manual_seed(1234)
        return mse(out, target)

    model = make_model()
    step, fake = fake_graph_step(model, torch.optim.SGD(model.parameters(), lr=0.1), make_batches(1)[0],
                                 warmup=2, loss_fn=reseeding_loss)
    batches = make_batches(3)
    step(*batches[0])
    step(*batches[1])  # two eager warm-up steps: they train as eager would
    with pytest.raises(CaptureError, match=r"torch.manual_seed.*seed before capture") as info:
        step(*batches[2])
    assert "warm-up steps" in str(info.value) and fake.graphs == [] and step.state == "warmup"


# ------------------------------------------------------------------ nothing silently stale (CPU, stand-in capture)
def _captured_fake_step(opt_kind="sgd_momentum"):
    model = make_model()
    opt = make_opt(opt_kind, model.parameters())
    step, fake = fake_graph_step(model, opt, make_batches(1)[0], warmup=2)
    for x, y in make_batches(4):  # two warm-ups, the capture, a replay
        step(x, y)
    assert step.state == "captured" and step.replays == 2
    return model, opt, step, fake


@pytest.mark.parametrize("change, match", [
    (lambda m, o: o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]}),
     r"param groups changed after capture \(1 group\(s\) of \[4\] parameter\(s\) then, 2 of \[4, 1\] now"),
    (lambda m, o: o.param_groups[0]["params"].pop(), "param groups changed after capture"),
    (lambda m, o: setattr(m[0], "weight", torch.nn.Parameter(torch.randn(256, 128))),
     r"model\.0\.weight was replaced"),
    (lambda m, o: m.double(), r"model\.0\.weight has new storage.*float64"),
    (lambda m, o: m[1].bias.requires_grad_(False), r"requires_grad changed after capture for 1\.bias"),
    (lambda m, o: o.load_state_dict(copy.deepcopy(o.state_dict())),
     r"optimizer\.state\[model\.\d\.(weight|bias)\]\['momentum_buffer'\]"),
], ids=["add_param_group", "param-removed", "parameter-assigned", "retyped", "frozen", "optimizer-checkpoint"])
def test_a_captured_step_refuses_to_replay_after_its_model_or_optimizer_changed(change, match):
    from cudagraph_kit.graphed import StaleGraphError
    model, opt, step, fake = _captured_fake_step()
    change(model, opt)
    with pytest.raises(StaleGraphError, match=match) as info:
        step(*make_batches(1)[0])
    assert "capture" in info.value.fix and fake.graphs[0].replays == step.replays == 2  # nothing replayed


def test_a_captured_step_keeps_replaying_after_in_place_updates():
    model, opt, step, fake = _captured_fake_step()
    opt.load_state_dict(opt.state_dict())                  # same state tensors
    fresh = make_model(seed=3)
    model.load_state_dict(fresh.state_dict())              # in place
    with torch.no_grad():
        model[0].bias.copy_(torch.zeros(256))
    for g in opt.param_groups:
        g["lr"] = g["lr"]                                  # untouched hyper-parameters
    step(*make_batches(1)[0])
    assert step.replays == 3
