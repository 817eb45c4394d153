"""The diagnostics: what check_capturable, verify, advise and explain do on any machine (CPU-honest parts).

verify() compares any callable with its eager reference; the CPU tests feed it plain functions that behave
like the broken graphs (a stale buffer, a frozen number, reused output memory) to test what it reports.
The same pitfalls with real CUDA graphs are in tests/test_pitfalls_gpu.py.
"""
import functools

import pytest
import torch

from cudagraph_kit import CaptureError, check_capturable, explain
from cudagraph_kit.advice import (Advice, ReplayCost, _verdict, advise, expected_effect, graph_gpu_time,
                                  predict_graph_time)
from cudagraph_kit.graphed import capture
from cudagraph_kit.check import CheckReport
from cudagraph_kit.verification import verify

HAS_CUDA = torch.cuda.is_available()
THIS_FILE = "test_diagnose.py"


def _only(report, kind):
    found = [f for f in report.findings if f.kind == kind]
    assert found, f"no {kind!r} finding in:\n{report}"
    return found


# ------------------------------------------------------------------------------------ check_capturable
def test_clean_function_looks_capturable_and_says_so():
    def clean(x, w):
        return torch.relu(x @ w) * 0.5 + torch.where(x.sum(1, keepdim=True) > 0, 1.0, 0.0)

    report = check_capturable(clean, torch.randn(4, 3), torch.randn(3, 2))
    assert report.ok and len(report) == 0
    assert "looks capturable" in str(report)


def test_item_is_a_host_sync_at_the_users_line():
    def syncs(x):
        y = x * 2
        if y.sum().item() > 0:  # the line to report
            y = y + 1
        return y

    report = check_capturable(syncs, torch.randn(8))
    (f,) = _only(report, "host sync")
    assert (THIS_FILE + ":") in f.where and "(syncs)" in f.where
    assert f.code == "if y.sum().item() > 0:  # the line to report"
    assert "item" in f.what and f.fix
    assert not report.ok and "looks capturable" not in str(report)


def test_boolean_mask_and_changing_output_shape_are_data_dependent():
    def masked(x):
        return x[x > 0]

    report = check_capturable(masked, torch.ones(64))  # 64 selected; the second call's new values select fewer
    found = _only(report, "data-dependent shape")
    assert all(f.code == "return x[x > 0]" for f in found)
    assert any("output shapes change with the input values" in f.what for f in found)
    assert any("boolean mask" in f.what for f in found)


@pytest.mark.parametrize("op", [torch.nonzero, torch.unique, lambda x: torch.masked_select(x, x > 0)],
                         ids=["nonzero", "unique", "masked_select"])
def test_data_dependent_ops(op):
    report = check_capturable(lambda x: op(x), torch.randint(0, 5, (32,)))
    assert "data-dependent shape" in report.kinds(), str(report)


def _dispatched_ops(fn, *args):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Log() as log:
        fn(*args)
    return log.ops


def test_boolean_mask_assignment_of_a_tensor_names_masked_fill():
    def assign(x, v):
        x = x.clone()
        x[x < 0] = v
        return x

    report = check_capturable(assign, torch.randn(16), torch.zeros(1))
    (f,) = _only(report, "host sync")
    assert "masked_fill_" in f.fix and f.code == "x[x < 0] = v"

    def assign_number(x):  # PyTorch runs this as masked_fill_: fixed shapes, nothing to report
        x = x.clone()
        x[x < 0] = 0.0
        return x

    # Which path the running PyTorch takes: up to 2.13 Python calls masked_fill_ itself; 2.14 sends index_put_
    # with the number as a one-element CPU tensor, which ATen lowers to masked_fill_ (canDispatchToMaskedFill).
    # Either way no nonzero runs, so on every version in the range the verdict is the same.
    ops = _dispatched_ops(assign_number, torch.randn(16))
    assert "aten.nonzero.default" not in ops and ("aten.masked_fill_.Scalar" in ops or "aten.index_put_.default" in ops), ops
    assert check_capturable(assign_number, torch.randn(16)).ok


def test_python_counter_global_closure_and_attribute():
    state = {"calls": 0}
    scale = 1.0

    def uses_closure(x):
        nonlocal scale
        scale = scale * 2            # changes a closure variable
        state["calls"] += 1          # a dict item held in the closure: changes too
        return x * scale

    report = check_capturable(uses_closure, torch.randn(4), calls=3)
    f, item = _only(report, "Python state")
    assert "closure variable 'scale' (1.0 -> 2.0 -> 4.0 -> 8.0)" in f.what
    assert f.code == "scale = scale * 2            # changes a closure variable"
    assert "state['calls'] (0 -> 1 -> 2 -> 3)" in item.what and item.code.startswith('state["calls"] += 1')

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            return self.lin(x) / self.steps

    report = check_capturable(Counter(), torch.randn(2, 4))
    (f,) = _only(report, "Python state")
    assert "Counter.steps (0 -> 1 -> 2)" in f.what and f.code == "self.steps += 1"


def test_lr_scheduler_inside_the_step_is_frozen_python_state_and_capturable_false_is_reported():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def train_step(x, y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()

    report = check_capturable(train_step, torch.randn(8, 4), torch.randn(8, 1))
    (state,) = _only(report, "Python state")
    assert "['lr'] (0.1 -> 0.05 -> 0.025)" in state.what and state.code == "sched.step()"
    (opt_finding,) = _only(report, "optimizer")
    assert "capturable=False" in opt_finding.what and opt_finding.code == "opt.step()"
    assert "capturable=True" in opt_finding.fix
    # the optimizer's own CPU bookkeeping (.item() of its CPU step count) is not blamed on the user
    assert "host sync" not in report.kinds(), str(report)


def test_sgd_step_without_schedule_looks_capturable():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    report = check_capturable(train_step, torch.randn(8, 4), torch.randn(8, 1))
    assert report.ok, str(report)


def test_reseeding_and_autocast_cache():
    def reseeds(x):
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x * torch.rand_like(x)

    report = check_capturable(reseeds, torch.randn(4))
    (rng,) = _only(report, "RNG")  # one finding, though manual_seed also seeds CUDA internally
    assert rng.code == "torch.manual_seed(0)"
    (ac,) = _only(report, "autocast cache")
    assert "cache_enabled=False" in ac.fix

    def no_cache(x):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            return x * 2

    assert check_capturable(no_cache, torch.randn(4)).ok


def test_python_number_argument():
    report = check_capturable(lambda x, s: x * s, torch.randn(3), 2.5)
    (f,) = _only(report, "Python argument")
    assert "Python float (2.5)" in f.what and (THIS_FILE + ":") in f.where


def test_report_table_and_frame():
    report = check_capturable(lambda x: x[x > 0], torch.randn(16))
    assert isinstance(report, CheckReport)
    text = str(report)
    assert "kind" in text and "where" in text and "fix:" in text
    df = report.to_frame()
    assert list(df.columns) == ["kind", "where", "what", "fix", "code", "count"] and len(df) == len(report)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only note")
def test_cpu_run_says_what_it_could_not_check():
    report = check_capturable(lambda x: x + 1, torch.randn(3))
    assert report.ok and any("need a GPU" in n for n in report.notes)


def test_first_call_error_propagates_and_state_is_restored():
    def broken(x):
        raise ValueError("user bug")

    mode = torch.is_grad_enabled()
    with pytest.raises(ValueError, match="user bug"):
        check_capturable(broken, torch.randn(3))
    assert torch.is_grad_enabled() == mode
    assert torch.manual_seed.__module__ == "torch.random"  # the seeding hooks are gone
    assert check_capturable(lambda x: x * 2, torch.randn(3)).ok


# ------------------------------------------------------------------------------------------------- verify
def test_verify_passes_for_an_eager_fallback_graph():
    def gelu(x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.41421))

    x = torch.randn(4, 8)
    g = capture(gelu, x, eager_fallback=True) if not HAS_CUDA else capture(gelu, x.cuda())
    report = verify(g, gelu, g.static_inputs[0], steps=3)
    assert report.ok and report.first is None and len(report.rows) == 3
    assert "matches eager" in str(report)
    assert [r["inputs"] for r in report.rows] == ["random", "NaN", "random"]


def test_verify_catches_a_stale_static_input():
    static = torch.randn(5)

    def graphed(x):  # like a graph whose input was rebound instead of copied into: reads `static`
        return static * 2

    report = verify(graphed, lambda x: x * 2, static, steps=3, static_inputs=[static])
    assert not report.ok and report.first["step"] == 0
    assert report.first["what"] == "the output"
    assert "not copied into" in report.first["hint"] or "not reaching" in report.first["hint"]
    assert "DIVERGES at step 0" in str(report)


def test_verify_names_the_step_whose_inputs_a_graph_replayed():
    last = {}

    def graphed(x):  # computes on the previous call's input, like a buffer updated one step late
        prev = last.get("x", x)
        last["x"] = x.clone()
        return prev + 1

    report = verify(graphed, lambda x: x + 1, torch.randn(6), steps=3, poison=False)
    assert not report.ok and report.first["step"] == 1
    assert "computed on step 0's inputs" in report.first["hint"]


def test_verify_catches_a_frozen_learning_rate_in_a_training_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ref = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    frozen_lr = opt.param_groups[0]["lr"]

    def graphed_step(x, y):  # replays the lr read "at capture", like a graph with a Python-float lr
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= frozen_lr * p.grad

    def eager_step(x, y):
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()

    def schedule(step):
        for o in (opt, ref_opt):
            o.param_groups[0]["lr"] = 0.1 * 0.5 ** step

    report = verify(graphed_step, eager_step, torch.randn(8, 4), torch.randn(8, 1), steps=3,
                    state=[(model, ref)], before_step=schedule)
    assert not report.ok and report.first["step"] == 1  # equal while the lr has not changed yet
    assert report.first["what"].startswith("Linear ") and "frozen" in report.first["hint"]


def test_verify_flags_outputs_that_share_memory_across_calls():
    buf = torch.zeros(3)

    def graphed(x):  # writes into one buffer and returns it, like a graph's static output
        buf.copy_(x * 3)
        return buf

    report = verify(graphed, lambda x: x * 3, torch.randn(3), steps=3)
    assert report.ok and report.outputs_reused
    assert "overwritten by the next call" in str(report)


def test_verify_training_step_with_optimizer_state_and_dropout_rng():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (net, ref))

    def make_step(m, o):
        def step(x, y):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
            return loss.detach()
        return step

    make_step(net, opt)(torch.randn(8, 4), torch.randn(8, 1))  # optimizer state exists on the graph side only
    report = verify(make_step(net, opt), make_step(ref, ref_opt), torch.randn(8, 4), torch.randn(8, 1),
                    steps=4, state=[(net, ref), (opt, ref_opt)])
    assert report.ok, str(report)  # same start state, same RNG state for both: dropout masks agree
    assert all(r["state_equal"] for r in report.rows)


def test_verify_rejects_zero_steps():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        verify(torch.relu, torch.relu, torch.randn(2), steps=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_verify_tolerates_what_assert_close_tolerates(dtype):
    """verify's default tolerances are torch.testing.assert_close's, read from PyTorch: the same differences pass."""
    import importlib
    compare = importlib.import_module("cudagraph_kit.verification")._compare
    want = torch.linspace(1, 2, 64, dtype=torch.float64)
    for scale in (1e-9, 1e-7, 1e-5, 1e-4, 1e-2, 1e-1):
        got, ref = (want * (1 + scale)).to(dtype), want.to(dtype)
        try:
            torch.testing.assert_close(got, ref)
            close = True
        except AssertionError:
            close = False
        assert compare(got, ref)[0] == close, (dtype, scale)


def test_verify_compares_a_dtype_without_assert_close_defaults_like_float32():
    """float8 has no default in assert_close (it would demand equality); verify takes float32's there."""
    import importlib
    tolerances = importlib.import_module("cudagraph_kit.verification")._tolerances
    from torch.testing._comparison import default_tolerances
    assert tolerances(torch.float32) == default_tolerances(torch.float32)
    if hasattr(torch, "float8_e4m3fn"):
        assert default_tolerances(torch.float8_e4m3fn) == (0.0, 0.0)
        assert tolerances(torch.float8_e4m3fn) == default_tolerances(torch.float32)


# ------------------------------------------------------------------------------------------------- advise
COST = ReplayCost(launch_us=5.5, graph_node_us=1.2, graph_start_us=0.9, eager_node_us=2.3, eager_start_us=0.1)


def test_predict_graph_time_is_gpu_time_node_replay_or_host_launch():
    assert predict_graph_time(50.0, 5, COST) == 50.0                  # GPU-bound: the graph's GPU time
    assert predict_graph_time(5.0, 20, COST) == pytest.approx(0.9 + 20 * 1.2)  # tiny nodes: at least a node each
    assert predict_graph_time(1.3, 1, COST) == 5.5                    # one small kernel: the host's replay cost


def test_graph_gpu_time_removes_the_launch_gaps():
    assert COST.gap_saved_us == pytest.approx(1.1)
    assert graph_gpu_time(12.4, 5, COST) == pytest.approx(12.4 - 5 * 1.1 + 0.9 - 0.1)
    assert graph_gpu_time(1.0, 5, COST) == 0.0                        # never negative
    slower = ReplayCost(5.5, graph_node_us=2.5, graph_start_us=0.9, eager_node_us=2.3, eager_start_us=0.1)
    assert slower.gap_saved_us == 0.0                                 # a graph never adds launch gaps here


def test_advise_words_follow_its_own_prediction():
    """The words name the band the predicted speedup lies in, with its threshold: never "will not help" for a
    predicted gain (notebook 05 printed that beside 1.06x predicted, 1.08-1.13x measured)."""
    assert [expected_effect(s) for s in (0.5, 0.95, 1.06, 1.1, 1.12, 7.7)] == [
        "slower", "about as fast", "about as fast", "about as fast", "faster", "faster"]
    assert expected_effect(float("nan")) == "unknown"
    near = _verdict(1.06)
    assert "about as fast as eager" in near and "within 1.1x" in near and "not help" not in near
    assert "should help a little" in _verdict(1.2) and "between 1.1x and 1.5x" in _verdict(1.2)
    assert "should help (" in _verdict(7.7) and "slower than eager" in _verdict(0.8)


def test_advise_puts_its_prediction_in_words_with_synthetic_timings(monkeypatch):
    """advise() end to end on CPU with the measurements replaced by synthetic ones: notebook 05's large GELU."""
    import pandas as pd

    import cudagraph_kit.advice as adv

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(adv.timing, "compare", lambda fns, *a, **k: pd.DataFrame(
        [{"median_us": 71.2, "kernels_per_call": 5.0, "copies_per_call": 0.0}]))
    monkeypatch.setattr(adv.timing, "device_time", lambda fn, *a, **k: (70.7, True))
    cost = ReplayCost(launch_us=5.4, graph_node_us=1.0, graph_start_us=1.0, eager_node_us=1.8, eager_start_us=0.7)
    a = advise(torch.relu, torch.randn(4), cost=cost)
    assert a.graph_gpu_us == pytest.approx(70.7 - 5 * 0.8 + 1.0 - 0.7) and a.speedup == pytest.approx(71.2 / 67.0)
    assert a.effect == "about as fast" and a.verdict == _verdict(a.speedup) and a.verdict in str(a)
    monkeypatch.setattr(adv.timing, "device_time", lambda fn, *a, **k: (7.0, True))   # small GELU: launch-bound
    fast = advise(torch.relu, torch.randn(4), cost=cost)
    assert fast.effect == "faster" and fast.speedup > 1.5 and "should help" in fast.verdict


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_advise_without_cuda_says_so():
    a = advise(torch.relu, torch.randn(4))
    assert isinstance(a, Advice) and "need an NVIDIA GPU" in str(a)


# ------------------------------------------------------------------------------------------------ explain
def test_explain_splits_cause_fix_original():
    exc = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    e = explain(exc)
    # CUDA's text names no operation: the cause lists the candidates and claims none (capture() confirms, GPU tests)
    assert "synchronization with the CPU" in e.cause and "synchronizes" not in e.cause and "set_sync_debug_mode" in e.fix
    assert e.original.startswith("RuntimeError: CUDA error: operation not permitted")
    wrapped = CaptureError.from_exception(exc)
    assert (explain(wrapped).cause, explain(wrapped).fix) == (e.cause, e.fix)
    assert str(wrapped).startswith("CUDA graph capture failed: ") and "Original error: RuntimeError" in str(wrapped)


def test_explain_kit_errors_use_their_fix():
    g = capture(torch.relu, torch.randn(2, 3), eager_fallback=True) if not HAS_CUDA else \
        capture(torch.relu, torch.randn(2, 3, device="cuda"))
    with pytest.raises(ValueError) as info:
        g(torch.randn(5, 3, device=g.static_inputs[0].device))
    e = explain(info.value)
    assert "captured for shape (2, 3)" in e.cause and e.fix.startswith("pass a matching tensor")


def test_explain_unknown_error_points_to_check_capturable():
    e = explain(KeyError("something else"))
    assert "check_capturable" in e.fix and "KeyError" in e.original


def test_explain_capture_failure_is_explain_as_one_text():
    """graphed.explain_capture_failure gives explain()'s parts as the CaptureError message reads, a kit error's own
    fix included (one implementation, in graphed.py)."""
    from cudagraph_kit.graphed import explain_capture_failure
    exc = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    e = explain(exc)
    assert explain_capture_failure(exc) == (f"CUDA graph capture failed: {e.cause}. Fix: {e.fix}.\n"
                                            f"Original error: {e.original}")
    kit = ValueError("the sample is on the CPU. Fix: move it to the GPU first.")
    assert "Fix: move it to the GPU first." in explain_capture_failure(kit)


def test_no_cuda_message_keeps_the_kit_sentence_and_takes_the_fix():
    from cudagraph_kit.graphed import NO_CUDA_MESSAGE, no_cuda_message
    fix = "run on a machine with a CUDA GPU; without one, call the modules themselves (eagerly)."
    text = no_cuda_message(fix)
    assert text.startswith("CUDA graphs need an NVIDIA GPU, and torch.cuda.is_available() is False here. Fix: ")
    assert text.endswith("Fix: " + fix) and text.count("Fix:") == 1
    assert no_cuda_message(NO_CUDA_MESSAGE.split("Fix: ")[1]) == NO_CUDA_MESSAGE


@pytest.mark.gpu
def test_boolean_mask_assignment_verdict_matches_what_cuda_does():
    """The ground truth on this GPU and PyTorch: CUDA's sync debug mode raises on a synchronizing call. The kit's
    verdict for each form of x[mask] = v must agree with it."""
    def assign(x, v):
        x = x.clone()
        x[x < 0] = v
        return x

    def assign_number(x):
        x = x.clone()
        x[x < 0] = 0.0
        return x

    x, v = torch.randn(1024, device="cuda"), torch.zeros(1, device="cuda")
    cases = {"tensor value": (assign, (x, v)), "number": (assign_number, (x,))}
    for name, (fn, args) in cases.items():
        fn(*args)  # warm up (first-call allocations are not what is judged)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn(*args)
            syncs = False
        except RuntimeError as e:
            syncs = "synchroniz" in str(e)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        flagged = "host sync" in check_capturable(fn, *args).kinds()
        assert flagged == syncs, f"{name}: CUDA syncs={syncs}, check_capturable flags a host sync={flagged}"
