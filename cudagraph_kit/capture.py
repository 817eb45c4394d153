"""Capture a callable into a CUDA graph once, then call it with new inputs.

What it arranges (all with PyTorch's own ``torch.cuda.graph``): warm-up on a side stream, static input
buffers that new arguments are copied into, the capture itself (optionally into a shared memory pool, and
optionally several calls in one graph), and checks that turn silent corruption into clear errors.

It also holds the kit's shared parts: the error types and explanations of failed captures, the recovery after
one, and the stream rule (:func:`capture_stream`) that every helper of the kit follows.

Example::

    import torch
    from cudagraph_kit.capture import capture

    def gelu(x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.41421))

    x = torch.randn(1, 3, 224, 224, device="cuda")
    g = capture(gelu, x)            # warm-up, capture
    y = g(torch.randn_like(x))      # copy into the static input, replay, return the static output
    torch.testing.assert_close(y, gelu(g.static_inputs[0]))

``y`` lives in the graph's memory: the next call overwrites it. Pass ``clone_outputs=True`` (or clone the
result yourself) when you keep outputs across calls.
"""
from __future__ import annotations

import contextlib
import gc
import re
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map_only

__all__ = ["capture", "GraphedCallable", "shared_pool", "capture_stream", "graph_capture", "NoCudaError",
           "CaptureError", "recover_from_failed_capture", "explain", "Explanation", "explain_capture_failure",
           "no_cuda_message", "graph_features",
           "register_generators"]


class NoCudaError(RuntimeError):
    """Raised when a CUDA graph is asked for on a machine without a usable CUDA GPU."""


class CaptureError(RuntimeError):
    """Raised when stream capture fails; the message names the likely cause and the fix.

    ``CaptureError.from_exception(exc)`` builds one from the error PyTorch raised; its attributes ``cause``,
    ``fix`` and ``original`` hold the three parts of the message (the message alone is enough to read).
    """

    cause: str = ""
    fix: str = ""
    original: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> "CaptureError":
        cause, fix, original = diagnose_capture_failure(exc)
        err = cls(_format_failure(cause, fix, original))
        err.cause, err.fix, err.original = cause, fix, original
        return err


NO_CUDA_MESSAGE = (
    "CUDA graphs need an NVIDIA GPU, and torch.cuda.is_available() is False here. "
    "Fix: run on a machine (or Colab runtime) with a CUDA GPU, or pass eager_fallback=True to run the "
    "function eagerly; results are then labelled 'eager', never 'graph'."
)


def no_cuda_message(fix: str) -> str:
    """The kit's no-CUDA error text, ending with what to do instead (every helper raises the same sentence).

    Example::

        raise NoCudaError(no_cuda_message("run on a machine with a CUDA GPU, or call the modules themselves."))
    """
    return NO_CUDA_MESSAGE.split("Fix: ")[0] + "Fix: " + fix


class Explanation:
    """Why a capture (or a kit call) failed: ``cause``, ``fix`` and the ``original`` error text (see :func:`explain`)."""

    def __init__(self, cause: str, fix: str, original: str):
        self.cause, self.fix, self.original = cause, fix, original

    def __str__(self):
        return f"cause: {self.cause}\nfix: {self.fix}\noriginal error: {self.original}"

    __repr__ = __str__


def explain(exc: BaseException) -> Explanation:
    """Cause, fix and original error for an exception from a capture or a kit call: the explanation
    ``capture``, ``capture_train_step`` and ``graph_modules`` put into their ``CaptureError``; for the kit's other
    errors, the message's own "Fix:" part.

    Example::

        try:
            g = capture(fn, x)
        except Exception as e:
            print(explain(e))
    """
    if isinstance(exc, CaptureError) and exc.cause:
        return Explanation(exc.cause, exc.fix, exc.original)
    cause, fix, original = diagnose_capture_failure(exc)
    if cause == _GENERIC_CAUSE and "Fix:" in str(exc):
        before, _, after = str(exc).partition("Fix:")
        return Explanation(before.strip().rstrip("."), after.strip().split("\n")[0].rstrip("."),
                           f"{type(exc).__name__}: {exc}")
    return Explanation(cause, fix, original)

# (substring of the CUDA/PyTorch error, cause, fix)
_KNOWN_FAILURES = [
    ("operation not permitted when stream is capturing",
     "the function synchronizes with the CPU while being captured (.item(), .cpu(), .tolist(), print of a "
     "CUDA tensor, torch.nonzero, boolean-mask indexing or another data-dependent shape)",
     "move that work out of the captured function; run it eagerly once under "
     "torch.cuda.set_sync_debug_mode('error') to find the line"),
    ("previous error during capture", "the capture was invalidated by an earlier illegal operation: a CPU "
     "synchronization, or an unsafe call (e.g. a memory allocation) from another thread while capturing in "
     "capture_error_mode='global'",
     "run the function eagerly under cudagraph_kit.diagnose.check_capturable to find the line; keep other "
     "threads off the GPU while capturing, or capture with capture_error_mode='thread_local'"),
    ("capture_end", "the capture was invalidated by an operation that is illegal during capture "
     "(often a synchronization, or work on another stream that was not joined back)",
     "run the function eagerly under torch.cuda.set_sync_debug_mode('error') to find the synchronizing line; "
     "join side streams back with current_stream().wait_stream(side)"),
    ("StreamCaptureInvalidated", "the capture was invalidated by an operation that is illegal during capture",
     "run the function eagerly under torch.cuda.set_sync_debug_mode('error') to find the synchronizing line"),
    ("StreamCaptureUnsupported", "the function used an operation that cannot be captured (a synchronizing "
     "or host-blocking call)", "move that operation out of the captured function"),
    ("current_seed", "the function reads or sets the RNG seed during capture (torch.manual_seed, "
     "torch.initial_seed)", "seed before capturing; graphs advance the RNG offset by themselves on each replay"),
    ("Expected all tensors to be on the same device", "the function mixes a CPU tensor into GPU work",
     "create constants on the GPU before capturing (a graph cannot copy from pageable CPU memory)"),
    ("capturable", "an optimizer that cannot be captured", "construct it with capturable=True"),
    ("CUDAGeneratorImpl", "the function changes or reads the RNG state during capture (manual_seed, "
     "get_rng_state/set_rng_state, or a torch.Generator the graph does not know)",
     "seed before capturing and draw from the default generator (a graph advances its offset on every "
     "replay)"),
    ("not in capture mode", "the function draws random numbers from a CUDA torch.Generator that is not the "
     "default one and was not registered with the graph",
     "pass it to the kit: capture(fn, x, generators=[gen]) (by hand: register_generators(graph, [gen]) "
     "before the capture), or draw from the default CUDA generator"),
    ("unexpected CUDA generator", "the function draws random numbers from a CUDA torch.Generator that is not "
     "the default one", "draw from the default CUDA generator inside a graph"),
    ("unjoined", "work was forked onto another stream and not joined back before the capture ended",
     "make the capturing stream wait for the side stream: torch.cuda.current_stream().wait_stream(side)"),
    ("not joined to the primary stream", "work was forked onto another stream and not joined back before the "
     "capture ended", "make the capturing stream wait for the side stream: "
     "torch.cuda.current_stream().wait_stream(side)"),
    ("uncaptured work in another stream", "a stream in the capture waited on work that is not part of it (an "
     "event or stream from outside the capture)", "fork side streams from the capturing stream "
     "(side.wait_stream(torch.cuda.current_stream())) inside the captured region"),
    ("legacy stream", "the default (legacy) stream got involved in the capture, e.g. an autograd node created "
     "during a warm-up on the default stream", "warm up on a side stream and drop references to the warm-up's "
     "autograd graph (del loss) before capturing"),
    ("hooks registered", "make_graphed_callables refuses modules with hooks registered",
     "remove the module's hooks before graphing it (register them again afterwards)"),
]

_GENERIC_CAUSE = "the function did something a CUDA graph cannot record"
_GENERIC_FIX = ("check that the function runs eagerly, has no CPU synchronization "
                "(torch.cuda.set_sync_debug_mode('error') finds the line) and uses only GPU tensors; "
                "cudagraph_kit.diagnose.check_capturable(fn, *args) lists what to change")


def diagnose_capture_failure(exc: BaseException) -> tuple:
    """``(cause, fix, original)`` for an exception raised while capturing (``original`` includes its cause)."""
    original = f"{type(exc).__name__}: {exc}"
    chain = exc.__cause__ or exc.__context__
    if chain is not None:
        original += f" (while handling {type(chain).__name__}: {chain})"
    for needle, cause, fix in _KNOWN_FAILURES:
        if needle.lower() in original.lower():
            return cause, fix, original
    return _GENERIC_CAUSE, _GENERIC_FIX, original


def _format_failure(cause: str, fix: str, original: str) -> str:
    return f"CUDA graph capture failed: {cause}. Fix: {fix}.\nOriginal error: {original}"


def explain_capture_failure(exc: BaseException) -> str:
    """:func:`explain` as one text: 'CUDA graph capture failed: cause. Fix: fix. Original error: ...'."""
    if isinstance(exc, CaptureError) and exc.cause:
        return str(exc)
    e = explain(exc)
    return _format_failure(e.cause, e.fix, e.original)


def torch_release() -> tuple:
    """``(major, minor)`` of the installed PyTorch, e.g. ``(2, 11)`` for "2.11.0+cu130"."""
    return tuple(int(n) for n in re.findall(r"\d+", torch.__version__)[:2])


def graph_features() -> dict:
    """Which newer CUDA-graph tools this PyTorch has; the kit uses each where it is present.

    - ``check_input_liveness``: ``torch.cuda.graph(..., check_input_liveness=True)`` raises at replay when a
      tensor the graph reads (but does not own) was freed since the capture (PyTorch 2.13+);
      ``capture(..., check_input_liveness=True)`` turns it on.
    - ``mempool_capture_pool``: graphs take a ``torch.cuda.MemPool`` as their pool (PyTorch 2.14+);
      :func:`shared_pool` returns one there.
    - ``generators_register_themselves``: a graph follows every CUDA ``torch.Generator`` it draws from, and
      ``CUDAGraph.register_generator_state`` is a deprecated no-op (PyTorch 2.14+); before, ``capture(...,
      generators=[gen])`` registers them.
    - ``debug_dump``: ``CUDAGraph.debug_dump`` writes the graph as DOT (``show.graph_nodes`` reads it).

    Example::

        graph_features()   # {'check_input_liveness': False, 'mempool_capture_pool': False, ...} on PyTorch 2.11
    """
    import inspect

    try:
        graph_options = inspect.signature(torch.cuda.graph).parameters
    except (TypeError, ValueError):
        graph_options = {}
    newer = torch_release() >= (2, 14)
    return {"check_input_liveness": "check_input_liveness" in graph_options,
            "mempool_capture_pool": newer and hasattr(torch.cuda, "MemPool"),
            "generators_register_themselves": newer,
            "debug_dump": hasattr(torch.cuda.CUDAGraph, "debug_dump")}


def shared_pool():
    """A memory pool that several ``capture(..., pool=...)`` calls can share (saves memory).

    Where graphs take one (PyTorch 2.14+) it is a ``torch.cuda.MemPool``: its memory stays reserved while this
    object or any graph captured into it lives. Before, it is ``torch.cuda.graph_pool_handle()``, freed when the
    last graph in it goes. Graphs sharing a pool must be replayed in the order they were captured if one reads
    another's output.

    Example::

        pool = shared_pool()
        g1 = capture(encoder, x, pool=pool)
        g2 = capture(decoder, g1.static_outputs, pool=pool)   # reuses g1's intermediate memory
    """
    if graph_features()["mempool_capture_pool"]:
        return torch.cuda.MemPool()
    return torch.cuda.graph_pool_handle()


def _check_generators(generators) -> None:
    for gen in generators:
        if not isinstance(gen, torch.Generator) or gen.device.type != "cuda":
            raise ValueError(f"generators takes CUDA torch.Generator objects, got {gen!r}. Fix: pass the "
                             "torch.Generator(device='cuda') objects the function draws from.")


def register_generators(graph, generators) -> None:
    """Let ``graph`` replay draws from CUDA ``torch.Generator`` objects other than the default one; call it before
    the capture. Older PyTorch needs ``graph.register_generator_state(gen)`` for each; PyTorch 2.14+ follows them by
    itself (the call is a deprecated no-op there, so it is skipped).

    Example::

        gen = torch.Generator(device="cuda").manual_seed(0)
        g = torch.cuda.CUDAGraph()
        register_generators(g, [gen])
        with torch.cuda.graph(g):
            y = torch.rand(8, device="cuda", generator=gen)
    """
    _check_generators(generators)
    if graph_features()["generators_register_themselves"] or not generators:
        return
    if not hasattr(graph, "register_generator_state"):
        raise RuntimeError(f"PyTorch {torch.__version__} cannot replay draws from a CUDA torch.Generator other than "
                           "the default one. Fix: draw from the default CUDA generator inside the graph.")
    for gen in generators:
        graph.register_generator_state(gen)


_CAPTURE_STREAMS: dict = {}  # GPU index -> the kit's capture stream on it


def capture_stream(device=None) -> "torch.cuda.Stream":
    """The kit's stream rule: every helper warms up and captures on this stream, one side stream per GPU, made
    on first use and reused for the life of the process.

    ``capture``, ``capture_buckets`` and ``capture_train_step`` warm up and capture on it, and ``ddp_for_graphs``
    builds DistributedDataParallel on it. Why one stream:

    - graphs that share a memory pool should be captured on the same stream for the pool's memory to be shared
      (the ``torch.cuda.graph`` documentation), so ``capture(..., pool=p)`` and ``capture_buckets(..., pool=p)``
      can share ``p``;
    - PyTorch keeps a cuBLAS workspace per (handle, stream). Warming up on the stream that then captures makes
      that workspace before the capture, outside every graph's pool, and reusing the stream keeps it to one per
      GPU (fresh warm-up streams would each add one, kept for the life of the process).

    ``device``: a GPU (``torch.device``, index or string); default the current one.

    Example::

        s = capture_stream()            # the same object on every call for this GPU
        with torch.cuda.graph(g, pool=pool, stream=s):   # capture by hand beside the kit's graphs
            ...
    """
    if device is None:
        index = torch.cuda.current_device()
    else:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"capture_stream needs a CUDA device, got {device}. Fix: pass the GPU the graph runs "
                             "on, e.g. x.device for a CUDA tensor x.")
        index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
    return _CAPTURE_STREAMS[index]


@contextlib.contextmanager
def graph_capture(graph, pool=None, stream=None, **options):
    """``torch.cuda.graph(graph, pool=pool, stream=stream, **options)`` with Python's cyclic garbage collector run just before
    the capture and paused during it; every helper of the kit captures through this.

    A ``CUDAGraph`` left in a reference cycle (an old graph, a helper holding one) is freed whenever the collector
    happens to run. If that is during another capture, its teardown calls CUDA, which is not permitted while a
    stream captures, and the capture fails ("operation failed due to a previous error during capture"). Older
    PyTorch collected before every capture; newer releases only do with ``torch.compiler.config.force_cudagraph_gc``
    (it costs time on many back-to-back captures).

    Example::

        g = torch.cuda.CUDAGraph()
        with graph_capture(g, stream=capture_stream()):
            y = model(static_x)
    """
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, **options):
            yield graph
    finally:
        if enabled:
            gc.enable()


def describe_tensor(t) -> str:
    """``describe_tensor(torch.zeros(2, 3))`` -> "shape (2, 3) float32 on cpu" (the kit's error messages)."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


class GraphedCallable:
    """A callable captured once; calling it copies new inputs in and replays. Build it with :func:`capture`.

    Attributes: ``graph`` (``torch.cuda.CUDAGraph``, None in eager mode), ``static_inputs``,
    ``static_outputs``, ``mode`` ("graph" or "eager"), ``calls_per_graph``, ``pool``.
    """

    def __init__(self, fn, static_inputs, static_outputs, graph, mode, calls_per_graph, clone_outputs, pool,
                 no_grad: bool = True):
        self.fn = fn
        self.no_grad = no_grad
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs
        self.graph = graph
        self.mode = mode
        self.calls_per_graph = calls_per_graph
        self.clone_outputs = clone_outputs
        self.pool = pool
        self._specs = tuple((s.shape, s.dtype, s.device) for s in static_inputs)
        # hot-path shortcut for __call__: graph mode, one tensor input, outputs returned as they are
        self._fast = None
        if graph is not None and len(static_inputs) == 1 and not clone_outputs:
            s0 = static_inputs[0]
            self._fast = (s0, s0.shape, s0.dtype, s0.get_device(), graph.replay, static_outputs)

    def _check(self, args) -> None:
        if len(args) != len(self.static_inputs):
            raise TypeError(f"this graph was captured with {len(self.static_inputs)} argument(s), "
                            f"got {len(args)}. Fix: pass the same arguments as at capture.")
        for i, (a, (shape, dtype, device)) in enumerate(zip(args, self._specs)):
            if not (isinstance(a, torch.Tensor) and a.shape == shape and a.dtype == dtype and a.device == device):
                raise ValueError(
                    f"argument {i}: the graph was captured for {describe_tensor(self.static_inputs[i])}, "
                    f"got {describe_tensor(a)}. A graph replays fixed shapes, dtypes and devices; nothing was "
                    "copied or replayed. Fix: pass a matching tensor (pad a short batch, .to(dtype/device)), "
                    "or capture one graph per shape.")

    def __call__(self, *args):
        # Hot path, kept lean on purpose: the kit must cost < 1 µs over a hand-written copy_ + replay.
        # Every argument is checked before anything is copied, so a bad call never touches the graph.
        fast = self._fast
        if fast is not None and len(args) == 1:  # the common case: one tensor in, graph outputs back
            static, shape, dtype, device_index, replay, outputs = fast
            a = args[0]
            try:
                ok = a.shape == shape and a.dtype is dtype and a.get_device() == device_index
            except AttributeError:
                ok = False
            if not ok:
                self._check(args)
            if a is not static:
                static.copy_(a)
            replay()
            return outputs
        if len(args) != len(self.static_inputs) or self.graph is None:
            return self._slow_call(args)
        self._check(args)
        for a, s in zip(args, self.static_inputs):
            if a is not s:
                s.copy_(a)
        self.graph.replay()
        if self.clone_outputs:
            return tree_map_only(torch.Tensor, torch.clone, self.static_outputs)
        return self.static_outputs

    def _slow_call(self, args):
        self._check(args)  # raises on a wrong argument count
        out = None
        with torch.no_grad() if self.no_grad else torch.enable_grad():  # same grad mode as a captured graph
            for _ in range(self.calls_per_graph):  # eager mode
                out = self.fn(*args)
        self.static_outputs = out
        return out

    def replay(self):
        """Replay on whatever the static inputs hold now (no copies, no checks); returns the static outputs."""
        if self.mode == "eager":
            return self(*self.static_inputs)
        self.graph.replay()
        return self.static_outputs

    def __repr__(self):
        return (f"GraphedCallable({getattr(self.fn, '__name__', self.fn)!r}, mode={self.mode!r}, "
                f"inputs=[{', '.join(describe_tensor(s) for s in self.static_inputs)}], "
                f"calls_per_graph={self.calls_per_graph})")


def capture(fn: Callable[..., Any], *sample_args: torch.Tensor, warmup: int = 3, pool=None,
            calls_per_graph: int = 1, clone_outputs: bool = False, no_grad: bool = True,
            eager_fallback: bool = False, generators=(), check_input_liveness: bool = False) -> GraphedCallable:
    """Capture ``fn(*sample_args)`` into a CUDA graph and return a :class:`GraphedCallable`.

    - ``warmup``: eager calls before capture (lazy init, cuBLAS handles, autotuning), on the stream that then
      captures: :func:`capture_stream`, one per GPU, shared by every helper of the kit.
    - ``pool``: a handle from :func:`shared_pool` or another graph's ``graph.pool()`` to share memory.
    - ``calls_per_graph``: capture ``fn`` that many times in one graph, on the same static inputs, to amortize
      the graph launch for tiny work; each replay then does ``calls_per_graph`` calls (``timing`` divides by it).
    - ``clone_outputs``: return clones instead of the graph-owned outputs that the next call overwrites.
    - ``no_grad``: capture under ``torch.no_grad()`` (inference). For training see ``train_step``/``partial``.
    - ``eager_fallback``: without CUDA, run ``fn`` eagerly instead of raising ``NoCudaError``
      (``mode == "eager"``; every call then runs under the same grad mode a graph would have captured).
    - ``generators``: CUDA ``torch.Generator`` objects ``fn`` draws from besides the default one; they are
      registered with the graph (:func:`register_generators`), so each replay advances them as eager would.
    - ``check_input_liveness``: have PyTorch raise at replay if a tensor the graph reads but does not own (a
      weight or constant held outside ``fn``) was freed since the capture (PyTorch 2.13+; costs a check per
      replay, so use it to debug).

    All sample arguments must be tensors on one device; warm-up and capture run on that GPU, whichever
    device is current. A failed capture raises :class:`CaptureError` (cause, fix, original error) and leaves
    the process working.

    Example::

        g = capture(model, torch.randn(8, 3, 224, 224, device="cuda"))
        out = g(batch)              # batch must have the captured shape, dtype and device
    """
    if calls_per_graph < 1 or warmup < 0:
        raise ValueError(f"calls_per_graph must be >= 1 and warmup >= 0, got {calls_per_graph} and {warmup}.")
    options = {}
    if check_input_liveness:
        if not graph_features()["check_input_liveness"]:
            raise ValueError(f"check_input_liveness needs PyTorch 2.13 or newer (torch.cuda.graph's option); this is "
                             f"PyTorch {torch.__version__}. Fix: upgrade PyTorch, or leave check_input_liveness off "
                             "and keep every tensor the function reads alive while the graph is replayed.")
        options["check_input_liveness"] = True
    generators = tuple(generators)
    _check_generators(generators)
    for i, a in enumerate(sample_args):
        if not isinstance(a, torch.Tensor):
            raise TypeError(
                f"sample argument {i} is a {type(a).__name__}, not a tensor. A graph replays fixed GPU memory, "
                "so every argument must be a CUDA tensor. Fix: bind other arguments into the function first, "
                "e.g. functools.partial(fn, scale=2.0) or a lambda.")
    devices = sorted({str(a.device) for a in sample_args})
    if len(devices) > 1:
        raise ValueError(
            f"the sample arguments are on several devices ({', '.join(devices)}). One graph runs on one GPU. "
            "Fix: move every argument to the same GPU first, e.g. x.to('cuda:0').")
    cuda = torch.cuda.is_available()
    if not cuda and not eager_fallback:
        raise NoCudaError(NO_CUDA_MESSAGE)
    grad_ctx = torch.no_grad if no_grad else torch.enable_grad
    static_inputs = tuple(a.detach().clone() for a in sample_args)
    if not cuda:
        with grad_ctx():
            out = fn(*static_inputs)
        return GraphedCallable(fn, static_inputs, out, None, "eager", calls_per_graph, clone_outputs, None,
                               no_grad=no_grad)
    for i, a in enumerate(sample_args):
        if not a.is_cuda:
            raise ValueError(
                f"sample argument {i} is on {a.device}. A CUDA graph can only read GPU memory. "
                "Fix: move it to the GPU before capturing, e.g. x.cuda().")

    # warm up and capture on the GPU that holds the inputs, whatever the current device is
    reseeds: list = []  # reseeding calls made inside fn: a graph cannot replay them
    watched = _watching_reseeds(fn, reseeds)
    device = sample_args[0].device if sample_args else torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        side = capture_stream(device)  # warm-up and capture on the kit's one stream for this GPU
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), grad_ctx():
            for _ in range(warmup):
                watched(*static_inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        if reseeds:
            raise reseed_error(reseeds, "its warm-up")

        graph = torch.cuda.CUDAGraph()
        register_generators(graph, generators)
        try:
            with grad_ctx(), graph_capture(graph, pool=pool, stream=side, **options):
                for _ in range(calls_per_graph):
                    out = watched(*static_inputs)
        except Exception as exc:
            del graph
            recover_from_failed_capture(device)
            if reseeds:
                raise reseed_error(reseeds, "the capture") from exc
            raise CaptureError.from_exception(exc) from exc
        if reseeds:
            del graph
            raise reseed_error(reseeds, "the capture")
    return GraphedCallable(fn, static_inputs, out, graph, "graph", calls_per_graph, clone_outputs,
                           graph.pool(), no_grad=no_grad)


# Only the seeding calls. set_rng_state is left out: torch.compile saves and restores the RNG state around its
# work (seen on an H100 with PyTorch 2.11: capturing a compiled function called set_rng_state once in its warm-up),
# so watching it refused ordinary compiled code. verify()'s eager-twice check still sees a function whose output
# depends on an RNG state it sets.
_RESEEDING = ("manual_seed", "manual_seed_all", "seed", "seed_all")


class reseeding_calls:
    """``with reseeding_calls() as calls:`` collects the names of the calls that reseed the CUDA generator while the
    block runs (``manual_seed``, ``seed`` and their ``_all`` forms).

    ``torch.manual_seed`` seeds CUDA through ``torch.cuda.manual_seed_all``, looked up when it is called, so
    it is seen however it was imported. A graph cannot replay a reseed: replays would never reseed.
    """

    def __enter__(self) -> list:
        self.seen: list = []
        self.originals = {n: getattr(torch.cuda, n) for n in _RESEEDING if callable(getattr(torch.cuda, n, None))}
        for name, original in self.originals.items():
            setattr(torch.cuda, name, self._recording(name, original))
        return self.seen

    def _recording(self, name, original):
        seen = self.seen

        def call(*args, **kwargs):
            seen.append(name)
            return original(*args, **kwargs)
        call.__name__, call.__doc__, call.__wrapped__ = original.__name__, original.__doc__, original
        return call

    def __exit__(self, *exc) -> bool:
        for name, original in self.originals.items():
            setattr(torch.cuda, name, original)
        return False


def _watching_reseeds(fn, seen: list):
    """``fn`` that adds to ``seen`` the reseeding calls it makes (see :class:`reseeding_calls`)."""
    def watched(*args):
        with reseeding_calls() as calls:
            try:
                return fn(*args)
            finally:
                seen.extend(calls)
    return watched


def reseed_error(calls: list, during: str) -> CaptureError:
    """The CaptureError for a function that reseeds the CUDA generator inside (``calls`` from reseeding_calls)."""
    names = ", ".join(f"torch.cuda.{n}" for n in dict.fromkeys(calls))
    cause = ("the function calls torch.manual_seed (or another reseeding call) inside: a CUDA graph cannot reseed, "
             "so replays would never reseed and their random numbers would differ from eager; nothing was "
             "captured")
    fix = ("seed before capture, not inside the function (each replay advances the generator's offset and draws "
           "fresh numbers); if every call must start from the same seed, call torch.manual_seed(s) before each "
           "replay, outside the graph (a replay reads the generator's seed and offset when it starts), or draw "
           "from a CUDA torch.Generator passed as capture(..., generators=[gen]) and seed that one between replays")
    err = CaptureError(_format_failure(cause, fix, f"{names} called {len(calls)} time(s) during {during}"))
    err.cause, err.fix, err.original = cause, fix, f"{names} called during {during}"
    return err


def recover_from_failed_capture(device=None) -> None:
    """Leave the process usable after a capture failed: wait for the GPU, then clear the RNG's capture state.

    A capture that fails before ``capture_end`` finishes leaves PyTorch's default CUDA generator marked as
    capturing, and every later random op on that GPU raises "Offset increment outside graph capture encountered
    unexpectedly". One tiny successful capture runs the generator's capture prologue and epilogue again and
    clears it.
    """
    try:
        torch.cuda.synchronize(device)
    except Exception:  # a failed capture can leave an error to report; the caller's CaptureError says what
        pass
    try:
        with torch.cuda.device(device):
            scratch = torch.zeros(1, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # PyTorch's own capture stream, not the kit's (private pool, no cuBLAS)
                scratch.add_(1)
            del graph
            torch.cuda.synchronize()
    except Exception:  # nothing more can be done here; the next capture reports its own error
        pass
