"""Schedules that change beta1 (Adam/AdamW) or momentum (SGD) every step, inside a whole-step graph:
OneCycleLR and CyclicLR with cycle_momentum=True.

capture_train_step keeps the value the captured optimizer step reads in a GPU tensor and refreshes it before
each replay, where this PyTorch's step path reads a tensor there on the GPU (probed on the spot: a throw-away
optimizer steps under a dispatch mode that watches for host reads). Elsewhere the schedule is refused before
anything runs, with the reason and the fix. The CPU tests check the probe, the refusal and the state machine
(with the CPU stand-in capture); the GPU tests train a whole cycle against eager.
"""
import copy

import pytest
import torch

from cudagraph_kit import train_step as ts
from cudagraph_kit.train_step import GraphedTrainStep, capture_train_step

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
mse = torch.nn.functional.mse_loss
sched = torch.optim.lr_scheduler


def make_model(device="cpu", seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)


def make_batches(n, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g).to(device), torch.randn(16, 8, generator=g).to(device))
            for _ in range(n)]


def one_cycle(opt, n):
    return sched.OneCycleLR(opt, max_lr=0.05, total_steps=n, cycle_momentum=True)


def cyclic(opt, n):  # one whole cycle up and down in n steps, beta1/momentum cycled inversely
    return sched.CyclicLR(opt, base_lr=1e-3, max_lr=0.05, step_size_up=n // 2, step_size_down=n - n // 2,
                          cycle_momentum=True, base_momentum=0.8, max_momentum=0.95)


SCHEDULES = {"OneCycleLR": one_cycle, "CyclicLR": cyclic}


def eager_train(model, opt, scheduler, batches, device_hparams_from=None):
    """The eager loop. With ``device_hparams_from=k``, steps k.. read the LR and beta1 from float32 GPU tensors
    filled from the group's values (what the graph's replays read); earlier steps read the numbers."""
    lr_t = b1_t = None
    beta1s = []
    for i, (x, y) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        mse(model(x), y).backward()
        group = opt.param_groups[0]
        beta1s.append(group["betas"][0] if "betas" in group else group["momentum"])
        if device_hparams_from is not None and i >= device_hparams_from:
            lr, betas = group["lr"], group["betas"]
            if lr_t is None:
                lr_t = torch.zeros((), dtype=torch.float32, device=x.device)
                b1_t = torch.zeros((), dtype=torch.float32, device=x.device)
            lr_t.fill_(lr)
            b1_t.fill_(betas[0])
            group["lr"], group["betas"] = lr_t, (b1_t, betas[1])
            opt.step()
            group["lr"], group["betas"] = lr, betas
        else:
            opt.step()
        scheduler.step()
    return beta1s


# ------------------------------------------------------------------------------------------------ on any machine
def test_sgd_momentum_cycle_is_refused_up_front_with_the_reason_and_fix():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=False)
    one_cycle(opt, 10)
    works, why = ts._reads_on_device(opt, opt.param_groups[0], "momentum", "cpu")
    assert not works and "host" in why  # `momentum != 0` and alpha=momentum read it on the host
    with pytest.raises(ValueError, match=r"cycle_momentum=True.*momentum every step.*"
                                         r"PyTorch .*cycle_momentum=False") as info:
        ts._refuse_cycled_momentum(opt, "cpu")
    assert torch.__version__ in str(info.value)


def test_no_cycling_scheduler_no_probe_no_refusal():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=False)
    sched.OneCycleLR(opt, max_lr=0.05, total_steps=10, cycle_momentum=False)
    assert "max_momentum" not in opt.param_groups[0]
    ts._refuse_cycled_momentum(opt, "cpu")  # nothing to refuse: momentum stays fixed


def test_the_probe_sees_a_path_that_reads_on_the_device_and_one_that_reads_on_the_host(monkeypatch):
    class DeviceBeta(torch.optim.Optimizer):  # reads beta1 only in tensor ops
        def __init__(self, params, lr=0.1, betas=(0.9, 0.99)):
            super().__init__(params, dict(lr=lr, betas=betas))

        @torch.no_grad()
        def step(self):
            for g in self.param_groups:
                for p in g["params"]:
                    p.mul_(g["betas"][0]).add_(p.grad, alpha=-0.1)

    class HostBeta(DeviceBeta):  # turns beta1 into a Python number: a host read
        @torch.no_grad()
        def step(self):
            for g in self.param_groups:
                for p in g["params"]:
                    p.add_(p.grad, alpha=-float(g["betas"][0]))

    p = torch.nn.Parameter(torch.ones(3))
    for cls, works in ((DeviceBeta, True), (HostBeta, False)):
        opt = cls([p])
        ok, why = ts._reads_on_device(opt, opt.param_groups[0], "betas", "cpu", lr_on_device=False)
        assert ok is works, why


def test_state_machine_refreshes_beta1_before_each_replay(monkeypatch):
    """CPU stand-in capture (the replay re-runs the captured Python work on the tensors the step swapped in):
    a beta1 or LR that is not copied in before a replay trains differently from eager, and this fails."""
    from test_train_step import ReplayingCapture  # the CPU stand-in for a CUDA graph

    monkeypatch.setattr(ts, "_reads_on_device", lambda *a, **k: (True, ""))  # as on a GPU path that can
    monkeypatch.setattr(ts, "_reads_lr_on_device", lambda opt, group: True)
    n = 24
    ref, test = make_model(), make_model()
    batches = make_batches(n)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, foreach=False)
    beta1s = eager_train(ref, ref_opt, one_cycle(ref_opt, n), batches)
    assert len(set(beta1s)) > n // 2  # beta1 really changes every step
    opt = torch.optim.AdamW(test.parameters(), lr=1e-3, foreach=False)
    scheduler = one_cycle(opt, n)
    fake = ReplayingCapture(test, opt)
    step = GraphedTrainStep(test, opt, mse, batches[0], warmup=2, amp_dtype=None, scaler=None, clone_loss=True,
                            mode="graph", capture=fake)
    for x, y in batches:
        step(x, y)
        scheduler.step()
    assert step.state == "captured" and step.replays == n - 2
    hp = step.hyperparameters[0]  # the public view of what the graph reads and what it froze
    assert set(hp["on_gpu"]) - {"lr"} == {"betas"} and "betas" not in hp["frozen"]  # beta1 follows the schedule
    assert "betas[1:]" in hp["frozen"] and "weight_decay" in hp["frozen"]  # beta2 and the rest: fixed at capture
    assert hp["on_gpu"]["betas"].item() == pytest.approx(beta1s[-1], rel=1e-6)  # what the last replay read
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    # beta2 stays frozen: a change is refused, not ignored
    opt.param_groups[0]["betas"] = (opt.param_groups[0]["betas"][0], 0.5)
    with pytest.raises(RuntimeError, match=r"'betas\[1:\]' changed"):
        step(*batches[0])


# ------------------------------------------------------------------------------------------------------ GPU
def _adam_supported(foreach):
    opt = torch.optim.Adam(make_model("cuda").parameters(), lr=1e-3, capturable=True, foreach=foreach)
    return ts._reads_on_device(opt, opt.param_groups[0], "betas", torch.device("cuda"))


@gpu
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_gpu_momentum_schedule_over_a_whole_cycle_matches_eager(kind, schedule, record_property):
    """beta1 and the LR follow OneCycleLR / CyclicLR(cycle_momentum=True) inside the graph for a whole cycle."""
    works, why = _adam_supported(foreach=False)
    if not works:  # then capture_train_step must refuse it (checked by the next test)
        pytest.skip(f"this PyTorch's Adam(foreach=False, capturable=True) reads beta1 on the host: {why}")
    n, warmup = 40, 3
    cls = getattr(torch.optim, kind)

    def opt_for(m):
        return cls(m.parameters(), lr=1e-3, capturable=True, foreach=False, weight_decay=0.01)

    base = make_model("cuda")
    batches = make_batches(n, device="cuda")
    # eager with numbers (what a user's eager loop does), twice: is eager itself deterministic here?
    runs = []
    for _ in range(2):
        m = copy.deepcopy(base)
        o = opt_for(m)
        runs.append((m, eager_train(m, o, SCHEDULES[schedule](o, n), batches)))
    (ref, beta1s), (ref2, _) = runs
    deterministic = all(torch.equal(a, b) for a, b in zip(ref.parameters(), ref2.parameters()))
    # eager reading the same GPU tensors as the graph's replays (same kernels): bitwise where eager is deterministic
    same = copy.deepcopy(base)
    o = opt_for(same)
    eager_train(same, o, SCHEDULES[schedule](o, n), batches, device_hparams_from=warmup)
    test = copy.deepcopy(base)
    opt = opt_for(test)
    scheduler = SCHEDULES[schedule](opt, n)
    step = capture_train_step(test, opt, mse, batches[0], warmup=warmup)
    for x, y in batches:
        step(x, y)
        scheduler.step()
    torch.cuda.synchronize()
    assert step.state == "captured" and step.replays == n - warmup
    assert len(set(beta1s)) > n // 2 and "betas" in step.hyperparameters[0]["on_gpu"]
    assert step.hyperparameters[0]["on_gpu"]["betas"].item() == pytest.approx(beta1s[-1], rel=1e-6)
    diff = max((a - b).abs().max().item() for a, b in zip(test.parameters(), ref.parameters()))
    bitwise = all(torch.equal(a, b) for a, b in zip(test.parameters(), same.parameters()))
    record_property("max_abs_diff_vs_eager", diff)
    print(f"\n{kind} + {schedule}(cycle_momentum=True), {n} steps: max |param diff| vs eager = {diff:.3g}; "
          f"bitwise equal to eager on the same GPU hyper-parameter tensors: {bitwise}; eager deterministic: "
          f"{deterministic}")
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    if deterministic:
        assert bitwise
    frozen = copy.deepcopy(base)  # the same run with beta1 held fixed: the schedule mattered
    o = opt_for(frozen)
    s = SCHEDULES[schedule](o, n)
    for g in o.param_groups:
        g.pop("max_momentum"), g.pop("base_momentum")
    s.cycle_momentum = False
    eager_train(frozen, o, s, batches)
    assert max((a - b).abs().max().item() for a, b in zip(frozen.parameters(), test.parameters())) > 1e-5


@gpu
@pytest.mark.parametrize("make", [
    lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, capturable=True),              # foreach (default)
    lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, capturable=True, fused=True),
    lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True),
], ids=["adam_foreach", "adamw_fused", "sgd_fused"])
def test_gpu_paths_that_read_beta1_or_momentum_on_the_host_are_refused_or_work(make):
    """Whatever this PyTorch does, nothing is silently frozen: the probe decides, and either the schedule is
    refused before anything runs (naming the fix) or it trains like eager."""
    model = make_model("cuda")
    ref = copy.deepcopy(model)
    opt = make(model)
    scheduler = one_cycle(opt, 20)
    key = "betas" if "betas" in opt.param_groups[0] else "momentum"
    works, _ = ts._reads_on_device(opt, opt.param_groups[0], key, torch.device("cuda"),
                                   ts._reads_lr_on_device(opt, opt.param_groups[0]))
    batches = make_batches(20, device="cuda")
    if not works:
        with pytest.raises(ValueError, match=r"cycle_momentum=True.*cycle_momentum=False"):
            capture_train_step(model, opt, mse, batches[0])
        return
    step = capture_train_step(model, opt, mse, batches[0])
    for x, y in batches:
        step(x, y)
        scheduler.step()
    assert step.state == "captured" and key in step.hyperparameters[0]["on_gpu"]
    ref_opt = make(ref)
    eager_train(ref, ref_opt, one_cycle(ref_opt, 20), batches)
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
