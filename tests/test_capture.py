"""capture(): errors on CPU; the call path with a stand-in graph on CPU; equality with eager, several calls
per graph, shared pools on the GPU."""
import importlib

import pytest
import torch

from cudagraph_kit import CaptureError, GraphedCallable, NoCudaError, graph_features, shared_pool
from cudagraph_kit.graphed import ReseedWarning, capture

HAS_CUDA = torch.cuda.is_available()
capture_module = importlib.import_module("cudagraph_kit.graphed")  # the module (its function: `capture`, above)


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


# ---------------------------------------------------------------- any machine
@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_no_cuda_raises_clear_error():
    with pytest.raises(NoCudaError, match="need an NVIDIA GPU.*eager_fallback=True"):
        capture(gelu, torch.randn(4))


def test_non_tensor_sample_argument_is_rejected():
    with pytest.raises(TypeError, match=r"sample argument 1 is a float.*functools.partial"):
        capture(lambda x, s: x * s, torch.randn(4), 2.0, eager_fallback=True)


def test_bad_options_rejected():
    with pytest.raises(ValueError, match="calls_per_graph must be >= 1"):
        capture(gelu, torch.randn(4), calls_per_graph=0, eager_fallback=True)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_eager_fallback_is_labelled_and_correct():
    g = capture(gelu, torch.randn(2, 3), eager_fallback=True)
    assert g.mode == "eager" and g.graph is None and "mode='eager'" in repr(g)
    y = torch.randn(2, 3)
    torch.testing.assert_close(g(y), gelu(y))
    torch.testing.assert_close(g.replay(), gelu(g.static_inputs[0]))


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA path")
def test_eager_fallback_validates_shapes_like_a_graph():
    g = capture(gelu, torch.randn(2, 3), eager_fallback=True)
    with pytest.raises(ValueError, match=r"captured for shape \(2, 3\) float32.*got shape \(4, 3\)"):
        g(torch.randn(4, 3))
    with pytest.raises(TypeError, match="captured with 1 argument"):
        g(torch.randn(2, 3), torch.randn(2, 3))


def test_graph_features_agree_with_what_this_pytorch_documents():
    """Each flag against PyTorch's own public surface, not the kit's version arithmetic: the documented
    parameters of ``torch.cuda.graph`` (``check_input_liveness``; a ``MemPool`` as ``pool``) and the attributes
    that exist. The GPU test below checks the same flags by using each feature."""
    import inspect
    features = graph_features()
    assert set(features) == {"check_input_liveness", "mempool_capture_pool", "generators_register_themselves",
                             "debug_dump"}
    doc = inspect.getdoc(torch.cuda.graph) or ""
    assert features["check_input_liveness"] == ("check_input_liveness" in doc), doc
    assert features["debug_dump"] == callable(getattr(torch.cuda.CUDAGraph, "debug_dump", None))
    if features["mempool_capture_pool"]:  # a MemPool exists and torch.cuda.graph says it takes one as its pool
        assert hasattr(torch.cuda, "MemPool") and ":class:`~torch.cuda.MemPool`" in doc, doc
    if not hasattr(torch.cuda, "MemPool") or "MemPool" not in doc:
        assert not features["mempool_capture_pool"]


@pytest.mark.gpu
def test_graph_features_agree_with_what_this_pytorch_does():
    """Each flag against the feature used: torch.cuda.graph accepts check_input_liveness; a capture into a
    MemPool pool works; where the kit says generators register themselves, a draw from an unregistered CUDA
    generator replays new numbers like eager (where it says they do not, test_torch_graph_properties checks that
    leaving the registration out is refused)."""
    x = torch.ones(8, device="cuda")
    features = graph_features()

    def captures(**options):
        g, stream = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
        try:
            with torch.cuda.graph(g, **options):
                x.mul(2)
        except TypeError:  # an option (or a pool type) this PyTorch does not take, refused before capturing
            torch.cuda.set_stream(stream)  # a refusal inside __enter__ leaves the capture stream current
            return False
        return True
    assert captures(check_input_liveness=True) == features["check_input_liveness"]
    if hasattr(torch.cuda, "MemPool"):
        assert captures(pool=torch.cuda.MemPool()) == features["mempool_capture_pool"]
    if features["generators_register_themselves"]:
        gen = torch.Generator(device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # no register_generator_state
            out = torch.rand(8, device="cuda", generator=gen)
        gen.manual_seed(3)
        replays = []
        for _ in range(2):
            g.replay()
            replays.append(out.clone())
        gen.manual_seed(3)
        eager = [torch.rand(8, device="cuda", generator=gen) for _ in range(2)]
        assert all(torch.equal(a, b) for a, b in zip(replays, eager)) and not torch.equal(*replays)


def test_check_input_liveness_on_a_pytorch_without_it_names_the_version(monkeypatch):
    monkeypatch.setattr(capture_module, "graph_features", lambda: {"check_input_liveness": False})
    with pytest.raises(ValueError, match=r"check_input_liveness needs PyTorch 2.13 or newer.*Fix: upgrade"):
        capture(gelu, torch.randn(4), check_input_liveness=True, eager_fallback=True)


@pytest.mark.parametrize("bad", [torch.Generator(), "cuda", 0], ids=["cpu_generator", "string", "int"])
def test_generators_must_be_cuda_generators(bad):
    with pytest.raises(ValueError, match=r"generators takes CUDA torch.Generator objects.*Fix"):
        capture(gelu, torch.randn(4), generators=[bad], eager_fallback=True)


# ---------------------------------------------------------------- the call path, with a stand-in graph (CPU)
class StandInGraph:
    """Replaces torch.cuda.CUDAGraph on a CPU: replay() recomputes the captured function into the static
    outputs in place, as a graph replay would, and counts replays."""

    def __init__(self, fn, static_inputs, static_outputs):
        self.fn, self.static_inputs, self.static_outputs = fn, static_inputs, static_outputs
        self.replays = 0

    def replay(self):
        self.replays += 1
        result = self.fn(*self.static_inputs)
        for out, new in zip(_flat(self.static_outputs), _flat(result)):
            out.copy_(new)

    def pool(self):
        return ("stand-in pool", id(self))


def _flat(obj):
    return [t for t in torch.utils._pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _graphed(fn, *samples, clone_outputs=False):
    static_inputs = tuple(s.clone() for s in samples)
    static_outputs = fn(*static_inputs)
    graph = StandInGraph(fn, static_inputs, static_outputs)
    g = GraphedCallable(fn=fn, static_inputs=static_inputs, static_outputs=static_outputs, graph=graph,
                        mode="graph", calls_per_graph=1, clone_outputs=clone_outputs, pool=graph.pool())
    return g, graph


def test_fast_path_copies_in_replays_once_and_returns_the_static_output():
    g, graph = _graphed(gelu, torch.randn(4, 8))
    static = g.static_inputs[0]
    x = torch.randn(4, 8)
    out = g(x)
    assert out is g.static_outputs and graph.replays == 1
    torch.testing.assert_close(static, x)
    torch.testing.assert_close(out, gelu(x))
    second = g(torch.zeros(4, 8))
    assert second is out  # graph memory: the next call overwrites the previous result
    torch.testing.assert_close(out, gelu(torch.zeros(4, 8)))


def test_fast_path_skips_the_copy_when_given_the_static_input_itself():
    g, graph = _graphed(gelu, torch.randn(4, 8))
    static = g.static_inputs[0]
    version = static._version  # bumped by every in-place write, copy_ included
    g(static)
    assert static._version == version and graph.replays == 1
    g(static.clone())
    assert static._version == version + 1 and graph.replays == 2


@pytest.mark.parametrize("bad, error, match", [
    (lambda: torch.randn(2, 8), ValueError, r"argument 0: the graph was captured for shape \(4, 8\) float32 on cpu, "
                                            r"got shape \(2, 8\) float32 on cpu"),
    (lambda: torch.randn(4, 8, dtype=torch.float64), ValueError, r"got shape \(4, 8\) float64"),
    (lambda: [0.0] * 8, ValueError, r"got list.*nothing was copied or replayed"),
    (lambda: None, ValueError, r"got NoneType"),
], ids=["shape", "dtype", "list", "none"])
def test_fast_path_refuses_a_mismatch_before_touching_the_graph(bad, error, match):
    g, graph = _graphed(gelu, torch.randn(4, 8))
    before, version = g.static_inputs[0].clone(), g.static_inputs[0]._version
    with pytest.raises(error, match=match):
        g(bad())
    assert graph.replays == 0 and g.static_inputs[0]._version == version
    torch.testing.assert_close(g.static_inputs[0], before)


def test_wrong_number_of_arguments_is_refused():
    g, graph = _graphed(gelu, torch.randn(4, 8))
    with pytest.raises(TypeError, match=r"captured with 1 argument\(s\), got 2"):
        g(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(TypeError, match=r"got 0"):
        g()
    assert graph.replays == 0


def test_two_input_fast_path_copies_both_and_refuses_a_mismatch_in_either_before_touching_the_graph():
    """Two inputs (a decode step's tokens and positions) take their own short path: both copied in, the static
    input itself never copied onto itself, and a wrong second argument refused before the first is copied."""
    g, graph = _graphed(torch.matmul, torch.randn(3, 5), torch.randn(5, 2))
    s0, s1 = g.static_inputs
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    out = g(a, b)
    assert out is g.static_outputs and graph.replays == 1
    torch.testing.assert_close(out, a @ b)
    version = s1._version
    g(torch.zeros(3, 5), s1)
    assert s1._version == version and graph.replays == 2
    torch.testing.assert_close(out, torch.zeros(3, 2))
    before0 = s0.clone()
    with pytest.raises(ValueError, match=r"argument 1: .*got shape \(2, 5\)"):
        g(torch.ones(3, 5), torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"argument 0: .*got shape \(3, 5\) float64"):
        g(torch.ones(3, 5, dtype=torch.float64), b)
    assert graph.replays == 2
    torch.testing.assert_close(s0, before0)


def test_general_path_several_inputs_and_cloned_outputs():
    g, graph = _graphed(torch.matmul, torch.randn(3, 5), torch.randn(5, 2), clone_outputs=True)
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    first = g(a, b)
    assert first is not g.static_outputs and graph.replays == 1
    torch.testing.assert_close(first, a @ b)
    g(torch.zeros(3, 5), b)
    torch.testing.assert_close(first, a @ b)  # a clone survives the next call
    with pytest.raises(ValueError, match=r"argument 1: .*got shape \(2, 5\)"):
        g(a, torch.randn(2, 5))
    assert graph.replays == 2


def test_cloned_outputs_keep_their_structure_and_non_tensor_leaves():
    fn = lambda a, b: (a + b, {"scale": 2, "prod": a * b})  # noqa: E731
    g, _ = _graphed(fn, torch.randn(3), torch.randn(3), clone_outputs=True)
    a, b = torch.randn(3), torch.randn(3)
    total, extra = g(a, b)
    assert extra["scale"] == 2 and extra["prod"] is not g.static_outputs[1]["prod"]
    torch.testing.assert_close(total, a + b)
    torch.testing.assert_close(extra["prod"], a * b)


def test_replay_uses_whatever_the_static_inputs_hold():
    g, graph = _graphed(gelu, torch.randn(4, 8))
    g.static_inputs[0].fill_(1.0)
    out = g.replay()
    assert out is g.static_outputs and graph.replays == 1
    torch.testing.assert_close(out, gelu(torch.ones(4, 8)))


# ---------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.register_buffer("offset", torch.randn(32))

    def forward(self, x):
        return self.bn(self.lin(x)) + self.offset


def _two_outputs(a, b):
    return a @ b, (a.sum(0), {"max": b.amax()})


@gpu
@pytest.mark.parametrize("make", [
    lambda: (gelu, (torch.randn(1, 3, 224, 224, device="cuda"),)),
    lambda: (torch.matmul, (torch.randn(128, 64, device="cuda"), torch.randn(64, 32, device="cuda"))),
    lambda: (WithBuffer().cuda().eval(), (torch.randn(16, 64, device="cuda"),)),
    lambda: (_two_outputs, (torch.randn(32, 16, device="cuda"), torch.randn(16, 8, device="cuda"))),
], ids=["elementwise", "matmul", "module_with_buffers", "multiple_outputs"])
def test_graph_matches_eager_on_new_inputs(make):
    fn, sample = make()
    g = capture(fn, *sample)
    assert g.mode == "graph" and isinstance(g.graph, torch.cuda.CUDAGraph)
    for _ in range(3):
        new = tuple(torch.randn_like(s) for s in sample)
        with torch.no_grad():
            expected = fn(*new)
        torch.testing.assert_close(g(*new), expected)


@gpu
def test_outputs_are_graph_memory_unless_cloned():
    x = torch.randn(8, device="cuda")
    g = capture(gelu, x)
    first = g(torch.ones(8, device="cuda"))
    g(torch.zeros(8, device="cuda"))
    torch.testing.assert_close(first, gelu(torch.zeros(8, device="cuda")))  # overwritten, as documented
    gc = capture(gelu, x, clone_outputs=True)
    kept = gc(torch.ones(8, device="cuda"))
    gc(torch.zeros(8, device="cuda"))
    torch.testing.assert_close(kept, gelu(torch.ones(8, device="cuda")))


@gpu
def test_several_calls_per_graph():
    x = torch.zeros(1000, device="cuda")
    g = capture(lambda t: t.add_(1.0), x, calls_per_graph=10)
    g.static_inputs[0].zero_()
    g.replay()
    assert g.calls_per_graph == 10
    torch.testing.assert_close(g.static_inputs[0], torch.full_like(x, 10.0))


@gpu
def test_shared_pool_two_graphs_stay_correct():
    pool = shared_pool()
    mempool = getattr(torch.cuda, "MemPool", None)
    assert (mempool is not None and isinstance(pool, mempool)) == graph_features()["mempool_capture_pool"]
    x = torch.randn(256, 256, device="cuda")
    g1 = capture(gelu, x, pool=pool)
    g2 = capture(torch.tanh, x, pool=pool)
    g3 = capture(torch.sigmoid, x, pool=g1.graph.pool())
    for _ in range(2):
        new = torch.randn_like(x)
        y1, y2, y3 = g1(new), g2(new), g3(new)
        torch.testing.assert_close(y1, gelu(new))
        torch.testing.assert_close(y2, torch.tanh(new))
        torch.testing.assert_close(y3, torch.sigmoid(new))


@gpu
@pytest.mark.parametrize("bad, match", [
    (lambda: torch.randn(2, 8, device="cuda"), r"captured for shape \(4, 8\) float32 on cuda:0, got shape \(2, 8\)"),
    (lambda: torch.randn(4, 8, device="cuda", dtype=torch.float16), r"got shape \(4, 8\) float16"),
    (lambda: torch.randn(4, 8), r"got shape \(4, 8\) float32 on cpu"),
    (lambda: [1.0] * 8, "got list"),
], ids=["shape", "dtype", "device", "non_tensor"])
def test_mismatched_call_is_refused_before_touching_the_graph(bad, match):
    x = torch.randn(4, 8, device="cuda")
    g = capture(gelu, x)
    before = g.static_inputs[0].clone()
    with pytest.raises(ValueError, match=match):
        g(bad())
    torch.testing.assert_close(g.static_inputs[0], before)  # nothing was copied


@gpu
def test_cpu_sample_argument_rejected_on_gpu_machine():
    with pytest.raises(ValueError, match=r"on cpu.*x.cuda\(\)"):
        capture(gelu, torch.randn(4))


@gpu
def test_failed_capture_explains_and_process_keeps_working():
    def syncs(x):
        y = x * 2
        if y.sum().item() > 0:  # .item() synchronizes: illegal during capture
            y = y + 1
        return y

    x = torch.randn(64, device="cuda")
    with pytest.raises(CaptureError, match="synchronizes with the CPU while being captured: .*synchroniz"):
        capture(syncs, x)   # the eager call under sync debug mode saw the .item(), and the cause names it
    # the process (and CUDA context) still works: eager work and a fresh capture succeed
    torch.testing.assert_close(gelu(x).cpu(), gelu(x.cpu()), rtol=1e-5, atol=1e-5)
    g = capture(gelu, x)
    torch.testing.assert_close(g(x), gelu(x))


# ---------------------------------------------------------------- reseeding inside the captured function
def test_reseeding_calls_reads_the_generator_and_patches_nothing():
    """On the CPU generator (no Philox offset there, so a changed seed is what shows): a reseed to another seed is
    seen however torch.manual_seed was imported; draws and no draws are not; torch's functions stay as they were."""
    from torch import manual_seed  # bound before the watch: seen all the same (the watch reads the generator)

    from cudagraph_kit.graphed import _watching_reseeds, reseed_error, reseeding_calls
    originals = {n: getattr(torch.cuda, n) for n in ("manual_seed", "manual_seed_all", "seed", "seed_all")}
    torch.manual_seed(11)
    with reseeding_calls("cpu") as seen:
        assert all(getattr(torch.cuda, n) is f for n, f in originals.items())  # nothing replaced inside either
        manual_seed(3)
    assert seen == ["the default cpu generator's seed changed from 11 to 3"]
    with reseeding_calls("cpu") as seen:
        torch.randn(3)       # draws
    with reseeding_calls("cpu") as seen_nothing:
        pass                 # draws nothing
    assert seen == [] and seen_nothing == []
    gen = torch.Generator().manual_seed(5)
    with reseeding_calls("cpu", generators=[gen]) as seen:
        gen.manual_seed(6)
    assert seen == ["a cpu torch.Generator's seed changed from 5 to 6"]
    found = []
    watched = _watching_reseeds(lambda x: torch.manual_seed(1) and x * 2, found, "cpu")
    assert torch.equal(watched(torch.ones(2)), torch.full((2,), 2.0)) and found == [
        "the default cpu generator's seed changed from 3 to 1"]
    err = reseed_error(found, "its warm-up")
    assert isinstance(err, CaptureError)
    assert "torch.manual_seed" in err.cause and "seed before capture" in err.fix
    assert "generators=[gen]" in err.fix and "seed changed from 3 to 1" in str(err) and "its warm-up" in str(err)


def test_a_reseed_refused_by_pytorch_during_capture_gets_the_reseed_explanation():
    """PyTorch refuses a reseed during capture (CUDAGeneratorImpl::set_current_seed asserts no capture is under way);
    the kit's explanation of that error is the one reseed_error gives, whatever else failed around it."""
    from cudagraph_kit.graphed import reseed_error
    refused = RuntimeError("Cannot call CUDAGeneratorImpl::set_current_seed during CUDA graph capture. If you need "
                           "this call to be captured, please file an issue. Current cudaStreamCaptureStatus: "
                           "cudaStreamCaptureStatusActive")
    err = CaptureError.from_exception(refused)
    assert (err.cause, err.fix) == (reseed_error([], "x").cause, reseed_error([], "x").fix)
    try:
        try:
            raise refused
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as chained:
        assert CaptureError.from_exception(chained).cause == err.cause


@pytest.mark.gpu
@pytest.mark.parametrize("warmup", [3, 0])
def test_reseeding_inside_the_function_is_refused_and_seeding_before_each_replay_matches_eager(warmup):
    """warmup=3: the warm-up sees the offset go back (many draws before, a reseed to the same seed inside);
    warmup=0: the seed inside differs from the generator's, which PyTorch refuses during the capture."""
    def noisy(x):
        torch.manual_seed(0)
        return x + torch.rand_like(x)

    x = torch.zeros(16, device="cuda")
    torch.manual_seed(0 if warmup else 1)
    for _ in range(100):  # each draw moves the Philox offset by a few counters: now past what one call of noisy draws
        torch.rand(16, device="cuda")
    with pytest.raises(CaptureError, match=r"torch.manual_seed.*seed before capture") as info:
        capture(noisy, x, warmup=warmup)
    assert "nothing was captured" in str(info.value)
    torch.rand(1, device="cuda")  # the process keeps working: the generator is usable

    def draw(x):
        return x + torch.rand_like(x)

    g = capture(draw, x)
    for _ in range(2):  # the fix: reseed before each replay, outside the graph
        torch.manual_seed(0)
        out = g(x).clone()
        torch.testing.assert_close(out, noisy(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_reseeding_calls_reads_the_cuda_generators_seed_and_offset():
    """The cases of reseeding_calls' docstring on the default CUDA generator, and the one it cannot see, which PyTorch
    refuses during the capture with the same explanation."""
    from cudagraph_kit.graphed import reseeding_calls
    x = torch.zeros(16, device="cuda")

    def seen_by(fn):
        with reseeding_calls(x.device) as seen:
            fn()
        return seen

    torch.manual_seed(5)
    assert seen_by(lambda: torch.rand_like(x)) == []                     # draws: the offset moves forward
    assert seen_by(lambda: x * 2) == []                                  # draws nothing
    assert "seed changed from 5 to 7" in seen_by(lambda: (torch.manual_seed(7), torch.rand_like(x)))[0]
    torch.rand(4096, device="cuda")                                      # the offset passes what one call draws
    assert "offset went back" in seen_by(lambda: (torch.manual_seed(7), torch.rand_like(x)))[0]  # same seed, drawn
    assert "seed changed" in seen_by(lambda: torch.cuda.manual_seed(8))[0]                       # no draw after

    def same_seed_inside(t):
        torch.manual_seed(0)
        return t + torch.rand_like(t)

    torch.manual_seed(0)  # seeded with the same value just before: one block looks like an ordinary draw
    assert seen_by(lambda: same_seed_inside(x)) == []
    torch.manual_seed(0)  # across warm-up calls it leaves a trace (drew, then did not): a warning, not an error,
    with pytest.warns(ReseedWarning, match="reseeds the generator to the seed it already had"):  # (see LazyLinear)
        capture(same_seed_inside, x)
    torch.rand(2, device="cuda")  # the process keeps working


@pytest.mark.gpu
def test_a_function_that_draws_only_in_its_first_call_is_not_taken_for_a_reseed():
    """LazyLinear initialises its weights from the CUDA generator in its first call only: warm-up offsets advance
    once and then stay, which is no reseed; the graph captures (with a ReseedWarning, since the trace is the same as
    a same-seed reseed's) and matches eager."""
    torch.manual_seed(0)
    lazy = torch.nn.LazyLinear(8).cuda()
    x = torch.randn(4, 16, device="cuda")
    with pytest.warns(ReseedWarning):
        g = capture(lazy, x)
    with torch.no_grad():
        torch.testing.assert_close(g(x), lazy(x))


@pytest.mark.gpu
def test_warm_up_draws_are_those_of_eager_calls():
    """Reading the generator around each warm-up call draws nothing: after capture(fn, x, warmup=3) the generator is
    where three eager calls leave it (notebook 02's bitwise eager-vs-graph loss parity relies on this)."""
    x = torch.zeros(1000, device="cuda")

    def noisy(t):
        return t + torch.rand_like(t)

    torch.manual_seed(3)
    capture(noisy, x, warmup=3)
    after_capture = torch.rand(4, device="cuda")
    torch.manual_seed(3)
    for _ in range(3):
        noisy(x)
    torch.testing.assert_close(after_capture, torch.rand(4, device="cuda"), rtol=0, atol=0)
