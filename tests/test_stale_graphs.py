"""Nothing silently stale: a graph built from modules raises StaleGraphError, before copying or replaying anything,
when a parameter, buffer or submodule it read at capture was replaced, re-typed or moved; in-place updates pass.
The checker (capture.CapturedTensors) and the call path (with a stand-in graph) on the CPU; the stale cases of the
issue through the public API on the GPU, for capture and capture_train_step."""
import copy
import functools

import pytest
import torch

from cudagraph_kit.capture import CapturedTensors, GraphedCallable, StaleGraphError, capture
from cudagraph_kit.train_step import capture_train_step

gpu = pytest.mark.gpu
mse = torch.nn.functional.mse_loss


def small_model(device="cpu"):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(device)


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


# ------------------------------------------------------------------------------------- the checker, on the CPU
def test_records_every_parameter_and_buffer_and_in_place_updates_pass():
    model = small_model()
    checked = CapturedTensors.reached_from(model)
    tensors = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    assert len(checked) == len(tensors) == 9  # 2 Linear x (weight, bias), BN weight, bias and 3 buffers
    other = small_model()
    with torch.no_grad():
        other[0].weight.add_(1.0)
    model.load_state_dict(other.state_dict())           # copies in place
    with torch.no_grad():
        model[3].bias.copy_(torch.ones(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mse(model(torch.randn(5, 8)), torch.randn(5, 4)).backward()   # BatchNorm updates its buffers in place
    opt.step()
    model.eval().train().float().to("cpu")               # no new storage: already float32 on the CPU
    checked.check()
    assert checked.changes() == []


@pytest.mark.parametrize("change, match", [
    (lambda m: setattr(m[0], "weight", torch.nn.Parameter(torch.zeros(16, 8))),
     r"Sequential\.0\.weight was replaced by another tensor \(shape \(16, 8\) float32"),
    (lambda m: m.half(), r"Sequential\.0\.weight has new storage: shape \(16, 8\) float32 on cpu at capture, now "
                         r"shape \(16, 8\) float16"),
    (lambda m: m.to(torch.float64), r"has new storage.*float64"),
    (lambda m: setattr(m[3].weight, "data", torch.zeros(4, 16)), r"Sequential\.3\.weight has new storage"),
    (lambda m: m.__setitem__(0, torch.nn.Linear(8, 16)), r"Sequential\.0 was replaced by another Linear"),
    (lambda m: m[1].register_buffer("running_mean", torch.zeros(16)), r"Sequential\.1\.running_mean was replaced"),
    (lambda m: delattr(m[3], "bias"), r"Sequential\.3\.bias was removed"),
], ids=["parameter-assigned", "half", "to-float64", "data-assigned", "submodule-swapped", "buffer-replaced",
        "parameter-deleted"])
def test_a_replaced_or_retyped_tensor_raises_naming_it_and_the_fix(change, match):
    model = small_model()
    checked = CapturedTensors.reached_from(model)
    change(model)
    with pytest.raises(StaleGraphError, match=match) as info:
        checked.check()
    assert "nothing was copied or replayed" in str(info.value)
    assert "capture again" in info.value.fix and "load_state_dict" in info.value.fix and "copy_" in info.value.fix


MODEL = small_model()


def uses_the_global(x):
    return MODEL(x) * 2


def test_modules_are_found_through_methods_partials_closures_and_globals():
    model = small_model()

    def make_closure():
        m = model

        def f(x):
            return m(x)

        def rebind():
            nonlocal m
            m = small_model()
        return f, rebind

    closure, rebind = make_closure()

    class Runner:  # a callable object holding the model
        def __init__(self):
            self.net = model

        def __call__(self, x):
            return self.net(x)

    for fn in (model.forward, functools.partial(torch.nn.functional.linear, weight=model[0].weight),
               functools.partial(lambda m, x: m(x), model), closure, Runner(), uses_the_global):
        assert len(CapturedTensors.reached_from(fn)) >= 1, fn
    assert not CapturedTensors.reached_from(gelu)  # a function that reaches no module: nothing to check

    checked = CapturedTensors.reached_from(closure)
    rebind()
    with pytest.raises(StaleGraphError, match="the closure variable m now names another object"):
        checked.check()

    checked = CapturedTensors.reached_from(uses_the_global)
    global MODEL
    saved, MODEL = MODEL, small_model()
    try:
        with pytest.raises(StaleGraphError, match="MODEL was replaced by another Sequential"):
            checked.check()
    finally:
        MODEL = saved


# ----------------------------------------------------- the call path, with a stand-in graph on the CPU
class StandInGraph:
    def __init__(self, fn, static_inputs, static_outputs):
        self.fn, self.static_inputs, self.static_outputs, self.replays = fn, static_inputs, static_outputs, 0

    def replay(self):
        self.replays += 1
        self.static_outputs.copy_(self.fn(*self.static_inputs))

    def pool(self):
        return ("stand-in pool", id(self))


@pytest.mark.parametrize("clone_outputs", [False, True], ids=["fast-path", "general-path"])
def test_a_stale_graph_raises_before_copying_or_replaying(clone_outputs):
    model = small_model().eval()
    static = torch.randn(4, 8)
    with torch.no_grad():
        graph = StandInGraph(model, (static,), model(static))
        g = GraphedCallable(model, (static,), graph.static_outputs, graph, "graph", 1, clone_outputs,
                            graph.pool(), weights=CapturedTensors.reached_from(model))
        g(torch.randn(4, 8))
        assert graph.replays == 1
        model.half()
        before = static.clone()
        with pytest.raises(StaleGraphError, match="has new storage"):
            g(torch.randn(4, 8))
        with pytest.raises(StaleGraphError, match="has new storage"):
            g.replay()
    assert graph.replays == 1 and torch.equal(static, before)  # nothing copied, nothing replayed


def test_no_weights_no_check():
    """A function that reaches no module (01's GELU) carries no checker: its hot path is the plain one."""
    static = torch.randn(4)
    g = GraphedCallable(gelu, (static,), gelu(static), StandInGraph(gelu, (static,), gelu(static)), "graph", 1,
                        False, None, weights=CapturedTensors.reached_from(gelu))
    assert g.weights is None and g._fast[-1] is None


# ------------------------------------------------------------------------------------------- on the GPU
@gpu
@pytest.mark.parametrize("how", ["module", "closure"])
def test_the_stale_cases_of_the_issue_raise_and_in_place_updates_do_not(how):
    model = small_model("cuda").eval()
    x = torch.randn(4, 8, device="cuda")
    fn = model if how == "module" else (lambda t: model(t))

    g = capture(fn, x)
    new = small_model("cuda").eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5)
        model.load_state_dict(new.state_dict())                  # in place: the graph sees the new weights
        torch.testing.assert_close(g(x), new(x))
        model[0].weight.copy_(torch.zeros_like(model[0].weight))  # in place
        torch.testing.assert_close(g(x), model(x))
        out_before = g(x).clone()

        model[0].weight = torch.nn.Parameter(torch.randn(16, 8, device="cuda"))
        with pytest.raises(StaleGraphError, match=r"\.0\.weight was replaced by another tensor"):
            g(x)
        torch.testing.assert_close(g.static_outputs, out_before)   # never replayed

        g = capture(fn, x)
        model.half()   # re-types the same Parameters and releases the float32 storage the graph reads
        with pytest.raises(StaleGraphError, match=r"has new storage.*float32.*at capture, now .*float16"):
            g(x)
        with pytest.raises(StaleGraphError):
            g.replay()


@gpu
def test_bucketed_graphs_raise_on_a_replaced_or_retyped_weight_and_follow_in_place_updates():
    from cudagraph_kit import capture_buckets
    model = small_model("cuda").eval()
    serve = capture_buckets(model, torch.randn(8, 8, device="cuda"), sizes=[4, 8])
    x = torch.randn(3, 8, device="cuda")
    with torch.no_grad():
        model[3].weight.mul_(2.0)                                  # in place: the graphs see it
        torch.testing.assert_close(serve(x), model(x))
        model[3].weight = torch.nn.Parameter(torch.randn(4, 16, device="cuda"))
        with pytest.raises(StaleGraphError, match=r"\.3\.weight was replaced by another tensor"):
            serve(x)
        serve = capture_buckets(model, torch.randn(8, 8, device="cuda"), sizes=[4, 8])
        model.half()
        with pytest.raises(StaleGraphError, match="has new storage"):
            serve(x)
    assert capture_buckets(model.float(), torch.randn(8, 8, device="cuda"), sizes=[8],
                           check_weights=False).weights is None


@gpu
def test_check_weights_false_turns_the_check_off():
    model = small_model("cuda").eval()
    x = torch.randn(4, 8, device="cuda")
    g = capture(model, x, check_weights=False)
    assert g.weights is None
    model[0].weight = torch.nn.Parameter(torch.randn(16, 8, device="cuda"))
    g(x)   # replays on the old weights, as a raw torch.cuda.graph would: the caller turned the check off


def _train_step(device="cuda"):
    model = small_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(16, 8, device=device), torch.randn(16, 4, device=device)
    step = capture_train_step(model, opt, mse, (x, y), warmup=2)
    for _ in range(4):  # 2 warm-ups, the capture, a replay
        step(x, y)
    assert step.state == "captured" and step.replays == 2
    return model, opt, step, x, y


@gpu
@pytest.mark.parametrize("change, match", [
    (lambda m, o: o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, device="cuda"))]}),
     "param groups changed after capture"),
    (lambda m, o: setattr(m[0], "weight", torch.nn.Parameter(torch.randn(16, 8, device="cuda"))),
     r"\.0\.weight was replaced"),
    (lambda m, o: m.half(), "has new storage"),
    (lambda m, o: m[0].bias.requires_grad_(False), "requires_grad changed after capture"),
    (lambda m, o: o.load_state_dict(copy.deepcopy(o.state_dict())),   # a checkpoint: new state tensors
     r"optimizer\.state\[0\.weight\]\['momentum_buffer'\]"),
], ids=["add_param_group", "parameter-assigned", "half", "frozen", "optimizer-load_state_dict"])
def test_a_train_step_refuses_to_replay_after_its_model_or_optimizer_changed(change, match):
    model, opt, step, x, y = _train_step()
    change(model, opt)
    with pytest.raises(StaleGraphError, match=match) as info:
        step(x, y)
    assert "Nothing was run" in str(info.value) or "nothing was copied or replayed" in str(info.value)
    assert step.replays == 2


@gpu
def test_a_train_step_keeps_training_after_in_place_weight_updates():
    model, opt, step, x, y = _train_step()
    opt.load_state_dict(opt.state_dict())           # the same state tensors: nothing stale, nothing refused
    fresh = small_model("cuda")
    model.load_state_dict(fresh.state_dict())       # in place: the graph trains the loaded weights
    reference = small_model("cuda")
    reference.load_state_dict(fresh.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # equal momentum buffers, not the same tensors
    step(x, y)
    ref_opt.zero_grad()
    mse(reference(x), y).backward()
    ref_opt.step()
    torch.testing.assert_close(list(model.parameters()), list(reference.parameters()), rtol=1e-5, atol=1e-6)
