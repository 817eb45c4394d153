"""The promise the kit makes where users lean on it (issue 49, item 7): no false alarm on PyTorch's own patterns, no
silent miss through the kit's own wrapper, exactly ``warmup`` eager calls before a capture, and a graph never replayed
in the other train/eval mode.

Two of PyTorch's own CUDA-graph tests (``test/test_cuda.py``) are ported through the kit's public API:
``test_graph_make_graphed_callables`` (with and without AMP, the graphed sections assigned back into their parent, then
training compared with an eager copy) and ``test_graph_cudnn_dropout`` (an ``nn.LSTM`` with dropout captured with the
guard on). The rest are the cases the issue measured: each would have caught one of its failures. On the CPU: the
guard alone (``Guard`` over what ``watch_reads`` saw). On the GPU (``pytest -m gpu``): through ``capture``,
``capture_buckets`` and ``graph_modules``, every graphed result compared with eager first."""
import collections
import copy
import functools

import pytest
import torch

from cudagraph_kit import CaptureError, StaleGraphError, capture, capture_buckets, graph_modules
from cudagraph_kit.guard import Guard, watch_reads

gpu = pytest.mark.gpu
F = torch.nn.functional


class Block(torch.nn.Module):
    """A section of a model; the tests build two of this one class (PyTorch's test graphs two ``Sequential``
    sections), so that anything keyed by the class name collides."""

    def __init__(self, d_in, d_out, p=0.0):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(d_in, d_out), torch.nn.Dropout(p))

    def forward(self, x):
        return self.inner(x)


def replace_weight(linear):
    """``linear.weight = nn.Parameter(...)``: what a graph must refuse to replay over (it reads the old tensor)."""
    linear.weight = torch.nn.Parameter(torch.randn_like(linear.weight))


def unrelated_module():
    """A module built anywhere in the process: PyTorch's registration hooks fire for its weight and bias."""
    return torch.nn.Linear(2, 2)


def watched_guard(fn, roots, *inputs):
    """``Guard(roots, what fn(*inputs) read)``: the guard as the kit builds it from a watched call."""
    with watch_reads(skip=inputs) as reads:
        fn(*inputs)
    return Guard(roots, reads.tensors)


def passes_every_check(g):
    """The per-call check and a full check both pass (a false alarm on either is a broken promise)."""
    for _ in range(3):
        g.check()
    g.check(full=True)
    g.check()


# ------------------------------------------------------------------------------------ the guard alone, on the CPU
@pytest.mark.parametrize("which", [0, 1], ids=["first-root", "second-root"])
def test_two_roots_of_one_class_then_an_unrelated_module_raise_nothing_until_a_weight_is_replaced(which):
    """Promise: two roots of one class (``Guard((block_a, block_b), ...)``, as ``graph_modules((model[0], model[1]),
    ...)`` builds it) never collide. An unrelated ``nn.Linear(2, 2)`` built afterwards raises nothing (before issue
    49: "Block.inner now holds another Sequential"); a weight replaced in either root raises, naming that root's
    weight."""
    torch.manual_seed(0)
    blocks = (Block(8, 16), Block(16, 4))
    x = torch.randn(3, 8)
    g = watched_guard(lambda t: blocks[1](blocks[0](t)), blocks, x)
    assert len(g) == 4 and g.unplaced == []          # two weights, two biases, each placed
    unrelated_module()
    passes_every_check(g)
    replace_weight(blocks[which].inner[0])
    with pytest.raises(StaleGraphError, match=rf"Block #{which + 1}\.inner\.0\.weight"):
        g.check()


@pytest.mark.parametrize("which", [0, 1], ids=["first-closure", "second-closure"])
def test_two_closures_from_one_factory_raise_nothing_until_a_weight_is_replaced(which):
    """Promise: two closures made by one factory (each holds its module in a cell named ``m``) are two holders, not
    one label: an unrelated module built raises nothing; a weight replaced in either closure's module raises."""
    def make(m):
        return lambda x: m(x)

    torch.manual_seed(0)
    modules = (torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    f1, f2 = make(modules[0]), make(modules[1])

    def both(x):
        return f2(f1(x))

    x = torch.randn(3, 8)
    g = watched_guard(both, both, x)
    assert len(g) == 4 and g.unplaced == []
    unrelated_module()
    passes_every_check(g)
    replace_weight(modules[which])
    with pytest.raises(StaleGraphError, match=r"weight was replaced"):
        g.check()


@pytest.mark.parametrize("make_optimizer", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=1e-3),
], ids=["sgd-momentum", "adam"])
def test_optimizer_state_keyed_by_tensors_raises_no_false_alarm(make_optimizer):
    """Promise: optimizer state is a dict keyed by the parameters (SGD's momentum buffers, Adam's moments and step
    counts); a watched training step reads it, and neither an unrelated module built nor further in-place steps raise
    anything. Replacing the state's tensors (a checkpoint loaded as copies) still raises."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 4))   # same-shape parameters: same-shape state
    opt = make_optimizer(model.parameters())
    x, y = torch.randn(6, 8), torch.randn(6, 4)

    def step(a, b):
        opt.zero_grad(set_to_none=False)   # gradients zeroed in place: the same tensors every step
        F.mse_loss(model(a), b).backward()
        opt.step()

    step(x, y)                             # creates the gradients and the optimizer state
    g = watched_guard(step, step, x, y)
    assert any(t is s for state in opt.state.values() for s in state.values() for t in g.tensors)
    unrelated_module()
    passes_every_check(g)
    for _ in range(2):
        step(x, y)                         # in-place updates of weights and state
        g.check()
    unrelated_module()
    passes_every_check(g)
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # new state tensors: a graph would step the old ones
    with pytest.raises(StaleGraphError):
        g.check(full=True)


class _CacheLayer:
    """A plain object holding plain tensors, as a transformers ``StaticCache`` layer holds its keys and values."""

    def __init__(self):
        self.keys, self.values = torch.zeros(4, 8), torch.zeros(4, 8)


class _Cache:
    def __init__(self, n):
        self.layers = [_CacheLayer() for _ in range(n)]


def _cached_step():
    model, cache = torch.nn.Linear(8, 8), _Cache(3)

    def step(x):
        h = model(x)
        for layer in cache.layers:
            h = h + layer.keys.sum(0) + layer.values.sum(0)
        return h
    return model, cache, step


@pytest.mark.parametrize("replace", [
    lambda cache: cache.layers.__setitem__(1, _CacheLayer()),
    lambda cache: setattr(cache, "layers", [_CacheLayer() for _ in cache.layers]),
], ids=["one-layer", "the-list"])
def test_a_cache_layer_replaced_and_dropped_raises_on_the_next_call(replace):
    """Promise: a cache's layer (a plain object holding plain tensors, as a ``StaticCache`` holds its keys and
    values), or the list of them, replaced and dropped, raises on the very next call."""
    model, cache, step = _cached_step()
    x = torch.randn(4, 8)
    g = watched_guard(step, step, x)
    assert len(g) == 2 + 2 * 3          # the weight, the bias, keys and values of three layers
    passes_every_check(g)
    replace(cache)
    with pytest.raises(StaleGraphError, match=r"cache\.layers"):
        g.check()


def test_a_cache_layer_replaced_while_kept_alive_raises_by_the_next_full_check():
    """A layer replaced while something else keeps the old one alive (so nothing is freed) raises too, at the latest
    by the next full check (``full_check_every`` calls)."""
    model, cache, step = _cached_step()
    x = torch.randn(4, 8)
    g = watched_guard(step, step, x)
    kept = cache.layers[2]
    cache.layers[2] = _CacheLayer()
    calls = 0
    with pytest.raises(StaleGraphError, match=r"cache\.layers\[2\]"):
        for calls in range(1, g.full_check_every + 1):
            g.check()
    assert kept is not None and calls <= g.full_check_every


def test_a_replaced_module_next_to_a_cache_raises_on_the_next_call():
    """What leads to a module's tensors (kept alive by the guard) is read on every call."""
    model, cache, step = _cached_step()
    x = torch.randn(4, 8)
    g = watched_guard(step, step, x)
    step.__closure__[[c.cell_contents for c in step.__closure__].index(model)].cell_contents = torch.nn.Linear(8, 8)
    with pytest.raises(StaleGraphError, match="model"):
        g.check()


def test_a_few_holders_each_replaced_or_emptied_raise_on_the_next_call():
    """A wrapper's few holders (its ``__wrapped__``, its closure cell) are each read on every call: replaced, or the
    cell emptied, the next call raises StaleGraphError (never a bare ValueError)."""
    from cudagraph_kit.graphed import fresh_cublas_workspace
    for change in ("wrapped", "cell", "emptied"):
        model = torch.nn.Linear(8, 8)
        wrapped = fresh_cublas_workspace(model)
        x = torch.randn(4, 8)
        g = watched_guard(wrapped, wrapped, x)
        passes_every_check(g)
        cell = wrapped.__closure__[[c.cell_contents for c in wrapped.__closure__].index(model)]
        if change == "wrapped":
            wrapped.__wrapped__ = torch.nn.Linear(8, 8)
        elif change == "cell":
            cell.cell_contents = torch.nn.Linear(8, 8)
        else:
            del cell.cell_contents
        with pytest.raises(StaleGraphError):
            g.check()


def test_a_stale_graph_stays_refused_on_every_later_call():
    """Once a change raised, the next calls raise too (the event that reported it is not needed twice)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(4, 8)
    g = watched_guard(model, model, x)
    replace_weight(model[2])
    for _ in range(3):
        with pytest.raises(StaleGraphError, match=r"2\.weight was replaced"):
            g.check()


def _torch_looking_wrapper(fn):
    """A hand-made wrapper that copies ``__module__`` from a torch class, as ``functools.wraps`` does for a module."""
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapped.__module__ = "torch.nn.modules.container"
    wrapped.__qualname__ = wrapped.__name__ = "Sequential"
    return wrapped


def _kit_wrapper(fn):
    from cudagraph_kit.graphed import fresh_cublas_workspace
    return fresh_cublas_workspace(fn)


@pytest.mark.parametrize("wrap", [_torch_looking_wrapper, _kit_wrapper], ids=["hand-made", "fresh_cublas_workspace"])
def test_a_wrapper_that_copies_a_torch_module_name_is_still_searched(wrap):
    """Promise: whether code is PyTorch's own is decided by where it lives, not by ``__module__``: a wrapper whose
    ``__module__`` is ``torch.nn.modules.container`` (the kit's ``fresh_cublas_workspace(module)`` copies it) still
    leads the guard to the wrapped module, so a replaced weight raises (before issue 49: silently replays stale)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    fn = wrap(m)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fn(x), m(x))
    g = watched_guard(fn, fn, x)
    assert len(g) == 4
    unrelated_module()
    passes_every_check(g)
    replace_weight(m[0])
    with pytest.raises(StaleGraphError, match=r"0\.weight"):
        g.check()


def test_a_guard_over_a_module_refuses_the_other_train_eval_mode():
    """Promise: the train/eval mode of the modules a call read is part of what must not change: recorded in training
    mode (dropout), ``model.eval()`` raises StaleGraphError naming the mode, and ``model.train()`` passes again."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    g = watched_guard(m, m, x)
    passes_every_check(g)
    m.eval()
    with pytest.raises(StaleGraphError, match=r"eval|training"):
        g.check()
    m.train()
    passes_every_check(g)


# ------------------------------------------------------------------ PyTorch's own tests, ported through the kit (GPU)
N, D_IN, H, D_OUT = 64, 32, 48, 16


def _two_block_models(p=(0.1, 0.2)):
    """Two identical ``Sequential(Block, Block)`` models on the GPU: one to graph, one eager control."""
    torch.manual_seed(5)
    models = [torch.nn.Sequential(Block(D_IN, H, p[0]), Block(H, D_OUT, p[1])).cuda() for _ in range(2)]
    models[0].load_state_dict(models[1].state_dict())
    return models


@gpu
@pytest.mark.parametrize("with_amp", [False, True], ids=["without_amp", "with_amp"])
def test_graph_make_graphed_callables_through_graph_modules(with_amp):
    """Ports PyTorch's ``test_graph_make_graphed_callables`` (cache_enabled=False, the kit's rule): two sections of
    one class and two functions (relu, mse_loss) graphed in one call, the sections assigned back into their parent
    (``model[0], model[1] = ...``), an unrelated module built, then ten SGD steps with dropout from one seed.
    Promise: no false alarm (before issue 49: "Block.inner now holds another Sequential" on the first training call),
    and losses and weights match the eager control; in eval mode the sections run eagerly, as
    ``make_graphed_callables`` does. Under AMP the sample activations are fp16 (what the sections really receive: the
    kit checks dtypes)."""
    torch.manual_seed(5)
    torch.cuda.manual_seed(5)
    model_graphed, model_control = _two_block_models()
    opt_graphed = torch.optim.SGD(model_graphed.parameters(), lr=0.1)
    opt_control = torch.optim.SGD(model_control.parameters(), lr=0.1)
    act = torch.float16 if with_amp else torch.float32
    x = torch.randn(N, D_IN, device="cuda")
    h = torch.randn(N, H, device="cuda", dtype=act, requires_grad=True)
    y_pred = torch.randn(N, D_OUT, device="cuda", dtype=act, requires_grad=True)
    y = torch.randn(N, D_OUT, device="cuda")
    loss_fn_control, relu_control = F.mse_loss, F.relu
    amp = functools.partial(torch.autocast, "cuda", dtype=torch.float16, enabled=with_amp, cache_enabled=False)
    with amp():
        model_graphed[0], model_graphed[1], relu_graphed, loss_fn_graphed = graph_modules(
            (model_graphed[0], model_graphed[1], relu_control, loss_fn_control),
            ((x,), (h,), (y_pred,), (y_pred, y)))
    unrelated_module()

    real_inputs = [torch.rand_like(x) for _ in range(10)]
    real_targets = [torch.rand_like(y) for _ in range(10)]
    losses = {}
    for name, m, opt, relu, loss_fn in (("graphed", model_graphed, opt_graphed, relu_graphed, loss_fn_graphed),
                                        ("control", model_control, opt_control, relu_control, loss_fn_control)):
        # the same seed before each loop: the dropout masks of the graphed and the eager run are the same
        torch.manual_seed(5)
        torch.cuda.manual_seed(5)
        losses[name] = []
        for data, target in zip(real_inputs, real_targets):
            opt.zero_grad(set_to_none=True)
            with amp():
                out = relu(m(data))
                loss = loss_fn(out, target)
                loss.backward()
            opt.step()
            losses[name].append(loss.detach().clone())   # a graphed output is overwritten by the next replay

    tol = dict(rtol=1e-3, atol=1e-3) if with_amp else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(losses["graphed"]), torch.stack(losses["control"]), **tol)
    for p, pc in zip(model_graphed.parameters(), model_control.parameters()):
        torch.testing.assert_close(p, pc, **tol)
    # graphed in training mode: eval runs the sections' own forward (any batch size), as in PyTorch's test
    model_graphed.eval()
    model_control.eval()
    with torch.no_grad():
        torch.testing.assert_close(model_graphed(real_inputs[0]), model_control(real_inputs[0]), **tol)
        torch.testing.assert_close(model_graphed(real_inputs[0][:5]), model_control(real_inputs[0][:5]), **tol)


@gpu
def test_graph_cudnn_dropout_captures_with_the_guard_on():
    """Ports PyTorch's ``test_graph_cudnn_dropout`` (smaller sequence and batch): an ``nn.LSTM(512, 512, 2,
    dropout=0.5)`` in training mode, called eagerly, captured with ``capture`` and the guard on (the default), then
    replays mixed with eager calls. Promise: the capture raises nothing (before issue 49: a CaptureError blaming a
    host sync the function never made: the guard's extra call re-seeded cuDNN's dropout state inside the capture),
    the result is the LSTM's (layer 1's final state, before any dropout, equals eager), and the guard still watches
    the weights."""
    torch.manual_seed(0)
    model = torch.nn.LSTM(512, 512, 2, dropout=0.5).cuda()
    x = torch.ones(10, 16, 512, device="cuda")
    model(x)
    g = capture(model, x)   # check_weights=True: the default
    assert g.guard is not None and len(g.guard) > 0
    out, (h_n, c_n) = g(x)
    out, h_n, c_n = out.clone(), h_n.clone(), c_n.clone()   # the next replay overwrites the graph's outputs
    with torch.no_grad():
        ref_out, (ref_h, ref_c) = model(x)
    torch.testing.assert_close(h_n[0], ref_h[0], rtol=1e-4, atol=1e-4)   # layer 1: no dropout before it
    torch.testing.assert_close(c_n[0], ref_c[0], rtol=1e-4, atol=1e-4)
    assert out.shape == ref_out.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out[-1], h_n[1])                           # layer 2's output ends in its final state
    ratio = (out.abs().mean() / ref_out.abs().mean()).item()             # dropout masks differ; the scale does not
    assert 0.8 < ratio < 1.25, ratio
    # PyTorch's sequence: replay, eager, replay (DropoutState must not mix captured and uncaptured syncs)
    g(x)
    with torch.no_grad():
        model(x)
    g(x)
    torch.cuda.synchronize()
    model.weight_hh_l1 = torch.nn.Parameter(torch.randn_like(model.weight_hh_l1))
    with pytest.raises(StaleGraphError, match=r"weight_hh_l1"):
        g(x)


# ------------------------------------------------------------------------ what the issue measured, on the GPU
@gpu
@pytest.mark.parametrize("which", ["second-block", "first-block", "half"])
def test_graph_modules_assigned_back_still_refuse_a_changed_weight(which):
    """Promise: after ``model[0], model[1] = graph_modules((model[0], model[1]), ...)`` (two sections of one class
    assigned back into their parent), the graphed model matches eager, and then a weight replaced in either section,
    or ``model.half()``, raises StaleGraphError on the next call instead of replaying stale (no silent miss)."""
    model, eager = _two_block_models(p=(0.0, 0.0))
    x = torch.randn(N, D_IN, device="cuda")
    h = torch.randn(N, H, device="cuda", requires_grad=True)
    model[0], model[1] = graph_modules((model[0], model[1]), ((x,), (h,)))
    unrelated_module()
    for _ in range(2):
        data, target = torch.randn(N, D_IN, device="cuda"), torch.randn(N, D_OUT, device="cuda")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        out_g, out_e = model(data), eager(data)
        torch.testing.assert_close(out_g, out_e, rtol=1e-5, atol=1e-6)
        F.mse_loss(out_g, target).backward()
        F.mse_loss(out_e, target).backward()
        for pg, pe in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(pg.grad, pe.grad, rtol=1e-5, atol=1e-6)
    if which == "half":
        model.half()
        match = r"float16"
    else:
        block = 1 if which == "second-block" else 0
        replace_weight(model[block].inner[0])
        match = r"inner\.0\.weight"
    with pytest.raises(StaleGraphError, match=match):
        model(torch.randn(N, D_IN, device="cuda"))


@gpu
def test_capture_of_the_kits_own_wrapper_refuses_a_replaced_weight():
    """Promise: ``capture(fresh_cublas_workspace(nn.Sequential(...)), x)`` (notebook 03's pattern; the wrapper copies
    ``__module__`` from torch's class) is guarded like the module itself: in-place updates replay correctly, a
    replaced weight raises StaleGraphError and nothing is replayed (before issue 49: it silently replays the old
    weight)."""
    from cudagraph_kit.graphed import fresh_cublas_workspace
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        g = capture(fresh_cublas_workspace(m), x)
        torch.testing.assert_close(g(x), m(x))
        m[2].bias.add_(1.0)                              # in place: the graph sees it
        torch.testing.assert_close(g(x), m(x))
        before = g.static_outputs.clone()
        replace_weight(m[0])
        with pytest.raises(StaleGraphError, match=r"0\.weight"):
            g(torch.randn(4, 8, device="cuda"))
        torch.testing.assert_close(g.static_outputs, before)   # never replayed


@gpu
@pytest.mark.parametrize("warmup, calls_per_graph", [(3, 1), (3, 2), (1, 1), (0, 1)])
def test_capture_calls_the_function_exactly_warmup_times_before_capturing(warmup, calls_per_graph):
    """Promise: ``capture(f, x, warmup=w, calls_per_graph=k)`` runs ``f`` eagerly exactly ``w`` times, then ``k``
    times inside the capture: ``w + k`` Python calls in all (before issue 49: ``w + 1 + k``: the guard's extra
    watched call), and replays add none."""
    w = torch.randn(64, device="cuda")
    b = torch.randn(64, device="cuda")
    calls = [0]

    def f(t):
        calls[0] += 1   # on the host: counts Python calls, eager or captured
        return torch.tanh(t * w + b)

    x, x2 = torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")
    expected = torch.tanh(x2 * w + b)   # eager, uncounted (also loads the kernels before a warmup=0 capture)
    g = capture(f, x, warmup=warmup, calls_per_graph=calls_per_graph)
    assert calls[0] == warmup + calls_per_graph
    torch.testing.assert_close(g(x2), expected)
    g(x)
    assert calls[0] == warmup + calls_per_graph   # replays run no Python


@gpu
def test_capture_buckets_calls_the_function_exactly_warmup_times_per_bucket():
    """Promise: ``capture_buckets(f, x, sizes=[2, 4], warmup=2)`` runs ``f`` on each bucket exactly ``warmup`` times
    eagerly and once in its capture (3 calls per bucket; before issue 49 the first bucket captured got one more), and
    replays add none."""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 8).cuda()
    rows = collections.Counter()

    def f(t):
        rows[t.shape[0]] += 1
        return m(t)

    x = torch.randn(4, 16, device="cuda")
    serve = capture_buckets(f, x, sizes=[2, 4], warmup=2)
    assert dict(rows) == {4: 3, 2: 3}
    with torch.no_grad():
        for n in (4, 3, 2, 1):
            req = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(serve(req), m(req))
    assert dict(rows) == {4: 3, 2: 3}


@gpu
def test_batchnorm_statistics_move_exactly_warmup_times_before_capture():
    """Promise: a BatchNorm in training mode, captured with ``warmup=3``, has counted exactly 3 batches when the
    capture returns (before issue 49: 4), with running statistics equal to three eager calls; each replay then moves
    them once, as an eager call does."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(8).cuda()
    ref = copy.deepcopy(bn)
    x = torch.randn(16, 8, device="cuda")
    g = capture(bn, x, warmup=3)
    torch.cuda.synchronize()
    assert int(bn.num_batches_tracked) == 3
    with torch.no_grad():
        for _ in range(3):
            ref(x)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    with torch.no_grad():
        for _ in range(2):
            batch = torch.randn(16, 8, device="cuda")
            torch.testing.assert_close(g(batch), ref(batch))
    assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == 5
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)


def _dropout_net(training):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).cuda()
    return m.train(training)


def _matches_eager(call, m, x):
    """The graphed call equals eager from the same CUDA seed (a replay draws the dropout mask eager draws)."""
    torch.cuda.manual_seed(7)
    got = call(x).clone()
    torch.cuda.manual_seed(7)
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(got, want)


@gpu
@pytest.mark.parametrize("maker", ["capture", "capture_buckets"])
@pytest.mark.parametrize("captured_training", [True, False], ids=["captured-train", "captured-eval"])
def test_a_graph_called_in_the_other_mode_raises(maker, captured_training):
    """Promise: a graph captured with its modules in training mode (dropout) and called after ``model.eval()`` (or
    the reverse) raises StaleGraphError naming the mode, before anything is copied or replayed (before issue 49: it
    silently replays the captured mode); back in the captured mode it replays correctly again."""
    m = _dropout_net(captured_training)
    x = torch.randn(4, 8, device="cuda")
    g = capture(m, x) if maker == "capture" else capture_buckets(m, x, sizes=[2, 4])
    _matches_eager(g, m, x)
    m.train(not captured_training)
    with pytest.raises(StaleGraphError, match=r"eval|training"):
        g(torch.randn(4, 8, device="cuda"))
    m.train(captured_training)
    _matches_eager(g, m, x)


def _explain_dropout_mismatch(got, first, want, g, eager, x):
    """Fail with what the graphed call drew: whether its output changed after the call returned, whether a second
    replay from the same seed matches eager, and which philox offset of seed 7 eager would need to match it."""
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    changed_after_return = not torch.equal(got, first)
    torch.cuda.manual_seed(7)
    second_replay_matches = torch.allclose(g(x).detach(), want)
    offsets = []
    with torch.no_grad():
        for off in range(0, 257, 4):
            torch.cuda.manual_seed(7)
            gen.set_offset(off)
            if torch.allclose(eager(x), first):
                offsets.append(off)
    pytest.fail(f"graphed output differs from eager from seed 7: output changed after return={changed_after_return}, "
                f"second replay matches eager={second_replay_matches}, eager offsets matching the first replay="
                f"{offsets}; first replay {first.tolist()}, eager {want.tolist()}")


@gpu
def test_graph_modules_runs_eagerly_in_the_other_mode_as_make_graphed_callables_does():
    """Promise: ``graph_modules`` keeps ``make_graphed_callables``' behaviour: a module graphed in training mode and
    switched to ``eval()`` runs its own forward eagerly (no StaleGraphError, any batch size), its output equal to the
    eager module's in eval mode; back in training mode it replays the graph, equal to eager from the same seed."""
    m = _dropout_net(True)
    eager = copy.deepcopy(m)
    x = torch.randn(4, 8, device="cuda")
    g = graph_modules(m, (x,))
    torch.cuda.manual_seed(7)
    got = g(x)
    first = got.detach().clone()
    torch.cuda.manual_seed(7)
    want = eager(x)
    try:
        torch.testing.assert_close(got, want)
    except AssertionError:
        _explain_dropout_mismatch(got, first, want, g, eager, x)
    g.eval()
    eager.eval()
    with torch.no_grad():
        for n in (4, 3):
            req = torch.randn(n, 8, device="cuda")
            torch.testing.assert_close(g(req), eager(req))
    g.train()
    eager.train()
    torch.cuda.manual_seed(7)
    got = g(x)
    torch.cuda.manual_seed(7)
    torch.testing.assert_close(got, eager(x))


@gpu
def test_capture_error_names_a_host_sync_only_where_one_happened():
    """Promise: a CaptureError names a host synchronization where the capture saw one (``.item()`` inside the
    function), and the process keeps capturing afterwards; a function with no sync (the LSTM with dropout,
    ``test_graph_cudnn_dropout_captures_with_the_guard_on``) raises none."""
    def syncs(t):
        return t * t.sum().item()   # .item(): a host sync, illegal during capture

    x = torch.randn(8, 64, device="cuda")
    with pytest.raises(CaptureError, match=r"synchroniz"):
        capture(syncs, x)
    lstm = torch.nn.LSTM(64, 64, 2, dropout=0.5).cuda()
    seq = torch.ones(4, 8, 64, device="cuda")
    g = capture(lstm, seq)   # no sync inside: no CaptureError
    assert g.mode == "graph"
    out = g(seq)[0]
    assert out.shape == (4, 8, 64) and torch.isfinite(out).all()
