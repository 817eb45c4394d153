"""Python state that changes from one call to the next, whichever way the function reaches it: check_capturable
names the line, verify's behavioural check (eager twice on identical inputs, RNG fixed, tensor state put back)
reports "depends on state that the graph freezes" instead of a mismatch. Ordinary code that keeps its state in
tensors updated in place (BatchNorm running stats, an optimizer step) or in locals is not flagged.

The check_capturable and verify tests run on any machine (verify compares any two callables; its behavioural
check runs the eager reference only); the GPU tests capture the same functions for real.
"""
import pytest
import torch

from cudagraph_kit import check_capturable
from cudagraph_kit.graphed import capture
from cudagraph_kit.verification import verify

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
THIS_FILE = "test_frozen_state.py"


# ------------------------------------------------------------------------------- the forms of changing state
class Counter:
    def __init__(self):
        self.n = 0


class Config:
    count = 0


def object_in_closure():
    box = Counter()

    def fn(x):
        box.n += 1  # FORM: attribute of an object held in a closure
        return x * box.n
    return fn, "box.n", "box.n += 1  # FORM: attribute of an object held in a closure"


ITEMS = {"n": 0}


def container_item():
    def fn(x):
        ITEMS["n"] += 1  # FORM: container item
        return x * ITEMS["n"]
    return fn, "ITEMS['n']", 'ITEMS["n"] += 1  # FORM: container item'


def class_attribute():
    def fn(x):
        Config.count += 1  # FORM: class attribute
        return x * Config.count
    return fn, "Config.count", "Config.count += 1  # FORM: class attribute"


_CALLS = [0]


def _next_scale():
    _CALLS[0] += 1  # FORM: changed inside a helper the function calls
    return _CALLS[0]


def via_helper():
    def fn(x):
        return x * _next_scale()
    return fn, "_CALLS[0]", "_CALLS[0] += 1  # FORM: changed inside a helper the function calls"


STEP = 0


def global_number():
    def fn(x):
        global STEP
        STEP += 1  # FORM: rebound global
        return x * STEP
    return fn, "global 'STEP'", "STEP += 1  # FORM: rebound global"


def closure_number():
    k = 0

    def fn(x):
        nonlocal k
        k += 1  # FORM: rebound closure name
        return x * k
    return fn, "closure variable 'k'", "k += 1  # FORM: rebound closure name"


SETTINGS = Counter()


def global_object_attribute():
    def fn(x):
        SETTINGS.n += 1  # FORM: attribute of a global object
        return x * SETTINGS.n
    return fn, "SETTINGS.n", "SETTINGS.n += 1  # FORM: attribute of a global object"


FORMS = {"object in closure": object_in_closure, "container item": container_item,
         "class attribute": class_attribute, "via a helper": via_helper, "global": global_number,
         "closure": closure_number, "global object attribute": global_object_attribute}


# ------------------------------------------------------------------------------- ordinary code (no state)
def local_accumulator():
    def fn(x):
        total = 0.0
        for i in range(3):
            total += i
        return x * total
    return fn, (torch.randn(8, 4, device=DEVICE),)


def batchnorm_running_stats():
    bn = torch.nn.BatchNorm1d(4).to(DEVICE)  # running_mean/var and num_batches_tracked change in place

    def fn(x):
        return bn(x)
    return fn, (torch.randn(8, 4, device=DEVICE),)


def optimizer_step():
    model = torch.nn.Linear(4, 1).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def fn(x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return fn, (torch.randn(8, 4, device=DEVICE), torch.randn(8, 1, device=DEVICE))


ORDINARY = {"local accumulator": local_accumulator, "BatchNorm running stats": batchnorm_running_stats,
            "optimizer step": optimizer_step}


@pytest.mark.parametrize("form", list(FORMS))
def test_check_capturable_flags_each_form_at_its_line(form):
    fn, label, code = FORMS[form]()
    report = check_capturable(fn, torch.randn(4))
    found = [f for f in report.findings if f.kind == "Python state"]
    assert len(found) == 1, str(report)
    (f,) = found
    assert label in f.what and "->" in f.what, f.what
    assert f.code == code and (THIS_FILE + ":") in f.where
    assert not report.ok and "looks capturable" not in str(report)


@pytest.mark.parametrize("case", list(ORDINARY))
def test_check_capturable_does_not_flag_ordinary_code(case):
    fn, args = ORDINARY[case]()
    report = check_capturable(fn, *args)
    assert "Python state" not in report.kinds(), str(report)
    assert report.ok, str(report)


def test_an_append_to_a_list_the_function_holds_is_a_lost_side_effect():
    seen = []

    def fn(x):
        seen.append(1)  # a replay appends nothing
        return x * 2

    (f,) = [f for f in check_capturable(fn, torch.randn(3)).findings if f.kind == "Python state"]
    assert "len(seen) (0 -> 1 -> 2)" in f.what and f.code.startswith("seen.append(1)")


def test_a_change_made_by_the_first_call_alone_is_warm_up_not_state():
    cache = {}

    def fn(x):
        if "w" not in cache:  # lazy initialisation: runs in the warm-up before any capture
            cache["w"] = 2.0
        return x * cache["w"]

    assert check_capturable(fn, torch.randn(3), calls=3).ok


@pytest.mark.parametrize("form", list(FORMS))
def test_verify_reports_state_the_graph_freezes_not_a_mismatch(form):
    fn, label, code = FORMS[form]()
    x = torch.randn(4)
    frozen_value = torch.tensor(1.0)

    def graphed(x):  # what a graph of fn replays: the value read at capture
        return x * frozen_value

    report = verify(graphed, fn, x, steps=2)
    assert not report.ok and report.frozen_state is not None and report.first is report.frozen_state
    assert report.frozen_state["what"] == "depends on state that the graph freezes"
    cause = report.frozen_state["cause"]
    assert label in cause and code in cause and THIS_FILE in cause, cause
    text = str(report)
    assert text.startswith("verify: depends on state that the graph freezes") and "DIVERGES" not in text


@pytest.mark.parametrize("case", list(ORDINARY))
def test_verify_behavioural_check_does_not_flag_ordinary_code(case):
    fn, args = ORDINARY[case]()
    report = verify(fn, fn, *args, steps=1, poison=False)
    assert report.frozen_state is None, str(report)


def test_verify_puts_the_references_tensor_state_back():
    fn, args = optimizer_step()
    model = fn.__closure__[[c for c in fn.__code__.co_freevars].index("model")].cell_contents
    before = [p.detach().clone() for p in model.parameters()]
    from cudagraph_kit.verification import _repeat_eagerly
    assert _repeat_eagerly(fn, args, [], [], None, None, 0) is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ------------------------------------------------------------------------------- the same with real graphs
@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
def test_gpu_verify_a_captured_stateful_function_reports_frozen_state(form):
    fn, label, _ = FORMS[form]()
    x = torch.randn(4, device="cuda")
    g = capture(fn, x)
    report = verify(g, fn, x, steps=2)
    assert report.frozen_state is not None and label in report.frozen_state["cause"], str(report)
    assert "depends on state that the graph freezes" in str(report)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["local accumulator", "BatchNorm running stats"])
def test_gpu_verify_ordinary_captured_code_matches(case):
    fn, args = ORDINARY[case]()
    g = capture(fn, *args)
    report = verify(g, fn, *args, steps=3)
    assert report.frozen_state is None, str(report)
    if case == "local accumulator":
        assert report.ok, str(report)


def test_a_rounding_sized_difference_with_no_state_seen_is_a_note_not_frozen_state():
    noise = iter([0.0, 1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 7e-6])

    def jittery(x):  # like a kernel with atomics: tiny run-to-run differences, no Python value of its own changes
        return x + next(noise)

    report = verify(jittery, jittery, torch.ones(4), steps=1, poison=False, rtol=0.0, atol=0.0)
    assert report.frozen_state is None and any("nondeterministic" in n for n in report.notes), str(report)
