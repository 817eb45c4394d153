"""Schedules that change beta1 (Adam/AdamW) or momentum (SGD) every step, inside a whole-step graph:
OneCycleLR and CyclicLR with cycle_momentum=True.

capture_train_step keeps the value the captured optimizer step reads in a GPU tensor and refreshes it before
each replay, where this PyTorch's step path reads a tensor there on the GPU (probed on the spot: a throw-away
optimizer steps under a dispatch mode that watches for host reads). Elsewhere the schedule is refused before
anything runs, with the reason and the fix. Every test reads the outcome through the public API
(``capture_train_step``, ``GraphedTrainStep`` and its ``hyperparameters`` property): the CPU tests, with the CPU
stand-in capture, check what the probe decided, the refusal of a frozen value that changed, and the state
machine; the GPU tests train a whole cycle against eager and check the up-front refusal.
"""
import copy
import re

import pytest
import torch

from cudagraph_kit import train_step as ts
from cudagraph_kit.train_step import GraphedTrainStep, capture_train_step

from test_train_step import fake_graph_step  # GraphedTrainStep on the CPU stand-in capture

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
def test_a_momentum_read_on_the_host_is_frozen_and_a_cycled_change_is_refused_with_the_fix():
    """SGD(fused=False) reads momentum on the host (``momentum != 0``, ``alpha=momentum``): the graph freezes it,
    ``hyperparameters`` says so, and the change a cycling scheduler makes is refused before the replay, with the
    reason and the fix; nothing is trained by the refused call."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=False)
    batches = make_batches(4)
    step, _ = fake_graph_step(model, opt, batches[0])
    for x, y in batches:
        step(x, y)
    assert step.state == "captured"
    hp = step.hyperparameters[0]
    assert hp["on_gpu"] == {} and hp["frozen"]["momentum"] == 0.9 and hp["frozen"]["lr"] == 0.1
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0]["momentum"] = 0.85  # what OneCycleLR/CyclicLR(cycle_momentum=True) do every step
    with pytest.raises(RuntimeError, match=r"(?s)'momentum' changed from 0.9 to 0.85.*cycle_momentum=True.*"
                                           r"PyTorch .*Fix: .*cycle_momentum=False") as info:
        step(*batches[0])
    assert torch.__version__ in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_probe_sees_a_path_that_reads_on_the_device_and_one_that_reads_on_the_host():
    """Two optimizers that differ only in how their step reads beta1: tensor ops only (the graph can refresh it:
    ``on_gpu``) or a Python number (a host read: ``frozen``). Seen through ``hyperparameters`` after capture."""
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

    batches = make_batches(3)
    for cls, on_gpu in ((DeviceBeta, True), (HostBeta, False)):
        model = make_model()
        step, _ = fake_graph_step(model, cls(model.parameters()), batches[0])
        for x, y in batches:
            step(x, y)
        assert step.state == "captured"
        hp = step.hyperparameters[0]
        assert ("betas" in hp["on_gpu"]) is on_gpu and ("betas" in hp["frozen"]) is not on_gpu, (cls, hp)
        assert hp["frozen"]["lr"] == 0.1  # neither reads a tensor LR: frozen, checked before each replay


def test_state_machine_refreshes_beta1_before_each_replay(monkeypatch):
    """CPU stand-in capture (the replay re-runs the captured Python work on the tensors the step swapped in):
    a beta1 or LR that is not copied in before a replay trains differently from eager, and this fails."""
    from test_train_step import ReplayingCapture  # the CPU stand-in for a CUDA graph

    # as on a GPU whose step path reads beta1 and the LR from GPU tensors (the CPU step cannot: capturable=True
    # needs CUDA); what follows is the state machine's refreshing, read through hyperparameters
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
def _refused_cycle(exc: ValueError) -> bool:
    """capture_train_step's up-front refusal of a cycled beta1/momentum this PyTorch would freeze."""
    return bool(re.search(r"(?s)cycle_momentum=True.*PyTorch .*Fix: .*cycle_momentum=False", str(exc))) and \
        torch.__version__ in str(exc)


@gpu
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_gpu_momentum_schedule_over_a_whole_cycle_matches_eager(kind, schedule, record_property):
    """beta1 and the LR follow OneCycleLR / CyclicLR(cycle_momentum=True) inside the graph for a whole cycle."""
    n, warmup = 40, 3
    cls = getattr(torch.optim, kind)

    def opt_for(m):
        return cls(m.parameters(), lr=1e-3, capturable=True, foreach=False, weight_decay=0.01)

    base = make_model("cuda")
    batches = make_batches(n, device="cuda")
    test = copy.deepcopy(base)
    opt = opt_for(test)
    scheduler = SCHEDULES[schedule](opt, n)
    try:
        step = capture_train_step(test, opt, mse, batches[0], warmup=warmup)
    except ValueError as exc:  # refused up front, with the reason and the fix (the next test checks refusals too)
        assert _refused_cycle(exc), exc
        pytest.skip(f"this PyTorch's {kind}(foreach=False, capturable=True) reads beta1 on the host: {exc}")
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
    batches = make_batches(20, device="cuda")
    try:
        step = capture_train_step(model, opt, mse, batches[0])
    except ValueError as exc:  # refused before anything ran, naming the reason and the fix
        assert _refused_cycle(exc), exc
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
        return
    for x, y in batches:
        step(x, y)
        scheduler.step()
    assert step.state == "captured" and key in step.hyperparameters[0]["on_gpu"]
    ref_opt = make(ref)
    eager_train(ref, ref_opt, one_cycle(ref_opt, 20), batches)
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@gpu
def test_a_scheduler_that_keeps_momentum_fixed_is_not_refused():
    """OneCycleLR(cycle_momentum=False) on SGD(fused=True): only the LR moves; capture_train_step takes it, the
    LR follows the schedule inside the graph and momentum stays what it was (frozen or refreshed, 0.9)."""
    model = make_model("cuda")
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    scheduler = sched.OneCycleLR(opt, max_lr=0.05, total_steps=12, cycle_momentum=False)
    assert "max_momentum" not in opt.param_groups[0]
    batches = make_batches(12, device="cuda")
    step = capture_train_step(model, opt, mse, batches[0])
    for x, y in batches:
        step(x, y)
        used_lr = opt.param_groups[0]["lr"]  # what this replay read (refreshed before it); the scheduler moves on
        scheduler.step()
    hp = step.hyperparameters[0]
    momentum = hp["on_gpu"]["momentum"].item() if "momentum" in hp["on_gpu"] else hp["frozen"]["momentum"]
    assert step.state == "captured" and momentum == pytest.approx(0.9)
    assert hp["on_gpu"]["lr"].item() == pytest.approx(used_lr, rel=1e-6)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, fused=True)
    ref_sched = sched.OneCycleLR(ref_opt, max_lr=0.05, total_steps=12, cycle_momentum=False)
    for x, y in batches:
        ref_opt.zero_grad(set_to_none=True)
        mse(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
