"""Capture a callable into a CUDA graph once, then call it with new inputs.

What it arranges (all with PyTorch's own ``torch.cuda.graph``): warm-up on a side stream, static input
buffers that new arguments are copied into, the capture itself (optionally into a shared memory pool, and
optionally several calls in one graph), and checks that turn silent corruption into clear errors.

It also holds the kit's shared parts: the error types and explanations of failed captures, the recovery after
one, the stream rule (:func:`capture_stream`) that every helper of the kit follows, the check that a graph's
read tensors are still the ones it read (``guard.py``, beside this file) and the profiler session that leaves no residue
(:func:`profiler_session`).

It runs inside other people's processes and leaves them as it found them: it replaces nothing of PyTorch's (a
reseed inside the function is seen from the generators' seed and offset, :class:`reseeding_calls`), pauses the
garbage collector only while a capture runs (:func:`graph_capture`), and sets ``TEARDOWN_CUPTI`` only for its own
profiler sessions. A graph built from modules never silently reads weights replaced since the capture: it raises
:class:`StaleGraphError` before replaying (``check_weights``).

Example::

    import torch
    from cudagraph_kit.graphed import capture

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
import functools
import gc
import importlib.util
import os
import re
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map_only

if __package__:
    from . import guard  # what the graph read, and the check before every replay
else:  # this file copied beside guard.py, outside the package: that guard.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("guard")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's guard.py from its own folder {_here}, "
                          f"but `import guard` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/guard.py beside it, that folder first on sys.path.")
    import guard  # type: ignore[import-not-found, no-redef]
StaleGraphError = guard.StaleGraphError
STALE_FIX = guard.STALE_FIX

__all__ = ["capture", "GraphedCallable", "shared_pool", "capture_stream", "graph_capture", "after_capture", "gc_paused",
           "fresh_cublas_workspace", "NoCudaError",
           "CaptureError", "recover_from_failed_capture", "confirm_host_sync", "explain", "Explanation", "explain_capture_failure",
           "no_cuda_message", "graph_features", "register_generators", "StaleGraphError",
           "reseeding_calls", "ReseedWarning", "profiler_session"]


class NoCudaError(RuntimeError):
    """Raised when a CUDA graph is asked for on a machine without a usable CUDA GPU."""


# A reseed inside a captured function: the same cause and fix whether the kit saw it in the warm-up (reseed_error) or
# PyTorch refused it during the capture (CUDAGeneratorImpl::set_current_seed asserts that no capture is under way).
_RESEED_CAUSE = ("the function calls torch.manual_seed (or another reseeding call) inside: a CUDA graph cannot reseed, "
                 "so replays would never reseed and their random numbers would differ from eager; nothing was "
                 "captured")
_RESEED_FIX = ("seed before capture, not inside the function (each replay advances the generator's offset and draws "
               "fresh numbers); if every call must start from the same seed, call torch.manual_seed(s) before each "
               "replay, outside the graph (a replay reads the generator's seed and offset when it starts), or draw "
               "from a CUDA torch.Generator passed as capture(..., generators=[gen]) and seed that one between replays")


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

# CUDA's "operation not permitted when stream is capturing" names no operation: a synchronization with the CPU is the
# usual one, but not the only one. capture() and capture_buckets() tell which (confirm_host_sync); elsewhere the
# cause lists the candidates and claims none.
_NOT_PERMITTED_CAUSE = ("an operation CUDA cannot record ran during the capture: a synchronization with the CPU "
                        "(.item(), .cpu(), torch.cuda.synchronize(), print of a CUDA tensor, torch.nonzero, "
                        "boolean-mask indexing) or a call that changes CUDA's state")
_SYNC_CAUSE = "the function synchronizes with the CPU while being captured: {what}"

# (substring of the CUDA/PyTorch error, cause, fix)
_KNOWN_FAILURES = [
    # first: the text searched includes the error a failure was raised while handling, and the first match wins
    ("set_current_seed", _RESEED_CAUSE, _RESEED_FIX),
    ("operation not permitted when stream is capturing", _NOT_PERMITTED_CAUSE,
     "run the function eagerly once under torch.cuda.set_sync_debug_mode('error') to find a synchronizing line "
     "(cudagraph_kit.check.check_capturable(fn, *args) lists every cause it knows), and move that work out of the "
     "captured function"),
    ("previous error during capture", "the capture was invalidated by an earlier illegal operation: a CPU "
     "synchronization, or an unsafe call (e.g. a memory allocation) from another thread while capturing in "
     "capture_error_mode='global'",
     "run the function eagerly under cudagraph_kit.check.check_capturable to find the line; keep other "
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
                "cudagraph_kit.check.check_capturable(fn, *args) lists what to change")


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


def confirm_host_sync(err: "CaptureError", fn, args, no_grad: bool = True) -> "CaptureError":
    """For a capture that failed where a synchronization with the CPU is a candidate cause (CUDA's "operation not
    permitted when stream is capturing", an invalidated capture): run ``fn(*args)`` eagerly once with
    ``torch.cuda.set_sync_debug_mode("error")`` (put back after): an implicit synchronization there (``.item()``,
    ``.cpu()``, ``torch.nonzero``) names the operation as the cause. Sync debug mode does not see an explicit
    ``torch.cuda.synchronize()`` nor a call that changes CUDA's state, so when it sees nothing, and for any other
    ``err``, ``err`` is returned as it is, naming the candidates and claiming none. Called after
    :func:`recover_from_failed_capture`.

    Example::

        err = confirm_host_sync(CaptureError.from_exception(exc), fn, static_inputs)
    """
    if "synchroniz" not in err.cause:
        return err
    before = torch.cuda.get_sync_debug_mode()
    seen = None
    try:
        torch.cuda.set_sync_debug_mode("error")
        with torch.no_grad() if no_grad else torch.enable_grad():
            fn(*args)
        torch.cuda.set_sync_debug_mode(before)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        if "synchroniz" in str(exc).lower():
            seen = str(exc).strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - the eager call failed otherwise: the capture's own error stands
        pass
    finally:
        torch.cuda.set_sync_debug_mode(before)
    if seen is None:   # sync debug mode sees implicit synchronizations only: claim nothing more than before
        return err
    cause = _SYNC_CAUSE.format(what=seen)
    fix = ("move that work out of the captured function (compute the value before capture, or keep it on the GPU: "
           "torch.where instead of if tensor:)")
    new = CaptureError(_format_failure(cause, fix, err.original))
    new.cause, new.fix, new.original = cause, fix, err.original
    return new


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
    last graph in it goes. PyTorch's CUDA notes ("Sharing memory across captures", pytorch#166975): graphs may
    share a pool if they are always replayed in the order they were captured and never concurrently, or if they do
    not depend on each other's outputs and never run concurrently; replaying one can overwrite another's outputs,
    so clone an output you keep before replaying another graph.

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
def gc_paused():
    """Python's cyclic garbage collector paused inside the block, put back as it was after (also on error): the
    reason is in ``graph_capture``. ``graph_modules`` wraps ``make_graphed_callables`` in it.

    Example::

        with gc_paused():
            graphed = torch.cuda.make_graphed_callables(block, (x,))
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def fresh_cublas_workspace(fn):
    """``fn`` wrapped for capturing beside ``torch.compile(mode="reduce-overhead")``: while a capture is under way,
    each call first frees PyTorch's cached cuBLAS workspaces, so that the capture allocates a fresh one inside the
    graph's own pool, where nothing else can take it. Outside a capture the wrapper only calls ``fn``.

    Why: reduce-overhead frees those workspaces whenever it warms up or records (``clear_cublass_cache`` in
    ``torch/_inductor/cudagraph_trees.py``); a graph captured earlier with the old workspace would then write into
    memory the allocator may hand to other tensors. Wrap every function you capture in a process that also uses
    reduce-overhead (or ``transformers``' compiled ``generate``).

    Example::

        g = capture(fresh_cublas_workspace(model), x)
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)   # what Inductor's graph trees call

    @functools.wraps(fn, updated=())   # the name and docstring, not a module's attributes
    def wrapped(*args, **kwargs):
        if clear is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            clear()
        return fn(*args, **kwargs)
    return wrapped


def after_capture(capture_stream=None) -> None:
    """Order the caller's stream after the work PyTorch ran on ``capture_stream`` outside the graph (the whole GPU when
    the stream is unknown, as after ``make_graphed_callables``). Every helper of the kit calls it once per capture.

    Why: before a capture begins, ``CUDAGraph.capture_begin`` writes each registered generator's seed and offset into
    small device tensors (``CUDAGeneratorState::capture_prologue``, two ``fill_`` kernels) on the capture stream, and
    nothing orders them before the first replay on another stream, whose own prologue writes the same tensors. If the
    capture stream's write lands late, that first replay draws from the seed the generator had at capture (the
    second replay matches eager again). One ``wait_stream`` (no host synchronization) closes it; the per-call path is
    unchanged. ``tests/test_first_replay_order.py`` delays the capture stream on purpose: plain ``torch.cuda.graph``'s
    first replay then differs from eager, and the kit's does not (an H200, PyTorch 2.11).

    Example::

        with torch.cuda.graph(g, stream=s):
            y = model(static_x)
        after_capture(s)      # now g.replay() on the current stream draws what eager draws
    """
    if capture_stream is None:
        torch.cuda.synchronize()
    else:
        torch.cuda.current_stream(capture_stream.device).wait_stream(capture_stream)


@contextlib.contextmanager
def graph_capture(graph, pool=None, stream=None, collect_garbage: bool = False, **options):
    """``torch.cuda.graph(graph, pool=pool, stream=stream, **options)`` with Python's cyclic garbage collector paused
    while it captures; every helper of the kit captures through this (``graph_modules``, which captures through
    ``make_graphed_callables``, pauses it with ``gc_paused``).

    Why the pause: a ``CUDAGraph`` left in a reference cycle (an old graph, a helper holding one) is freed whenever the
    collector happens to run. If that is during another capture, its teardown calls CUDA while a stream captures
    ("operation not permitted when stream is capturing (function reset)"), and the capture fails ("operation failed
    due to a previous error during capture"; seen on an H100 in a training-step capture; pytorch/pytorch#161037 has a
    reproducer). Until PyTorch 2.8, ``torch.cuda.graph`` ran ``gc.collect()`` before every capture, which freed such
    graphs first; pytorch/pytorch#158193 made that opt-in (``torch.compiler.config.force_cudagraph_gc``, environment
    variable ``TORCH_CUDAGRAPH_GC``) because it is expensive for many captures in a row, and newer releases destroy a
    graph in relaxed capture mode. Pausing the collector (``gc.disable()``, put back as it was after, also when the
    capture fails) keeps such frees out of the capture on every release at no cost: the cycle is collected later,
    outside it. ``torch.cuda.graph`` itself still synchronizes and empties the caching allocator's cache before each
    capture (and collects garbage there on PyTorch 2.8 and older); the kit adds nothing to that.

    ``collect_garbage=True`` also runs a full ``gc.collect()`` before the capture: it frees memory held only by dead
    reference cycles (old graphs and their pools) for the new graph to use, at the cost of a walk over every Python
    object. No helper of the kit asks for it.

    After the capture, the caller's stream waits for the capture stream (``after_capture`` says why: the first
    replay would otherwise race the random number generators' set-up).

    Example::

        g = torch.cuda.CUDAGraph()
        with graph_capture(g, stream=capture_stream()):
            y = model(static_x)
    """
    if collect_garbage:
        gc.collect()
    capturing = torch.cuda.graph(graph, pool=pool, stream=stream, **options)
    with gc_paused(), capturing:
        yield graph
    after_capture(capturing.capture_stream)


def _cupti_teardown_supported() -> bool:
    """True when tearing CUPTI down after a profiler session is safe with CUDA graphs alive (CUDA >= 12.6)."""
    try:
        major, minor = (int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (12, 6)


@contextlib.contextmanager
def profiler_session():
    """Wrap one ``torch.profiler`` session so that it leaves no residue: ``TEARDOWN_CUPTI=1``, where CUDA supports the
    teardown with graphs alive (12.6+).

    A profiler session leaves CUPTI attached, and every later kernel launch in the process is slower (a third or
    more) unless CUPTI is torn down. PyTorch's profiler (kineto, ``CuptiActivityApi``) reads ``TEARDOWN_CUPTI`` when a
    session stops, inside ``profile.__exit__`` (``teardownContext``: tear down or not), and when a session starts (to
    re-create the CUPTI subscriber that a teardown removed, unless ``DISABLE_CUPTI_LAZY_REINIT`` is set). So the
    ``with profile(...)`` block must run inside this one, and once a session has torn CUPTI down, the variable stays
    set for the rest of the process: every later session, the kit's or yours, then re-creates CUPTI at its start and
    tears it down at its end. (Put back to unset, a later session of the notebook's own failed on an H100 with
    PyTorch 2.11: "unspecified launch failure" as it stopped.) This is the one change the kit leaves in the process,
    and only after it profiled; a value you set yourself is left as it is.

    Example::

        with profiler_session(), torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
    """
    if "TEARDOWN_CUPTI" not in os.environ and _cupti_teardown_supported():
        os.environ["TEARDOWN_CUPTI"] = "1"  # left set: see the docstring
    yield



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
                 no_grad: bool = True, guard: "guard.Guard | None" = None):
        self.fn = fn
        self.guard = guard if guard else None  # checked before every copy and replay (None: nothing to check)
        self.no_grad = no_grad
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs
        self.graph = graph
        self.mode = mode
        self.calls_per_graph = calls_per_graph
        self.clone_outputs = clone_outputs
        self.pool = pool
        self._specs = tuple((s.shape, s.dtype, s.device) for s in static_inputs)
        # hot-path shortcuts for __call__: graph mode, one tensor input (or two: a decode step's tokens and
        # positions), outputs returned as they are
        self._fast = self._fast2 = None
        if graph is not None and len(static_inputs) in (1, 2) and not clone_outputs:
            check = self.guard.check if self.guard is not None else None
            specs = tuple(x for s in static_inputs for x in (s, s.shape, s.dtype, s.get_device()))
            if len(static_inputs) == 1:
                self._fast = specs + (graph.replay, static_outputs, check)
            else:
                self._fast2 = specs + (graph.replay, static_outputs, check)

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
            static, shape, dtype, device_index, replay, outputs, check_weights = fast
            a = args[0]
            try:
                ok = a.shape == shape and a.dtype is dtype and a.get_device() == device_index
            except AttributeError:
                ok = False
            if not ok:
                self._check(args)
            if check_weights is not None:
                check_weights()
            if a is not static:
                static.copy_(a)
            replay()
            return outputs
        fast = self._fast2
        if fast is not None and len(args) == 2:
            s0, shape0, dtype0, device0, s1, shape1, dtype1, device1, replay, outputs, check_weights = fast
            a0, a1 = args
            try:
                ok = (a0.shape == shape0 and a0.dtype is dtype0 and a0.get_device() == device0
                      and a1.shape == shape1 and a1.dtype is dtype1 and a1.get_device() == device1)
            except AttributeError:
                ok = False
            if not ok:
                self._check(args)
            if check_weights is not None:
                check_weights()
            if a0 is not s0:
                s0.copy_(a0)
            if a1 is not s1:
                s1.copy_(a1)
            replay()
            return outputs
        if len(args) != len(self.static_inputs) or self.graph is None:
            return self._slow_call(args)
        self._check(args)
        if self.guard is not None:
            self.guard.check()
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
        """Replay on whatever the static inputs hold now (no copies, no argument checks; the weight check of
        ``check_weights`` runs); returns the static outputs."""
        if self.mode == "eager":
            return self(*self.static_inputs)
        if self.guard is not None:
            self.guard.check()
        self.graph.replay()
        return self.static_outputs

    def __repr__(self):
        return (f"GraphedCallable({getattr(self.fn, '__name__', self.fn)!r}, mode={self.mode!r}, "
                f"inputs=[{', '.join(describe_tensor(s) for s in self.static_inputs)}], "
                f"calls_per_graph={self.calls_per_graph})")


def capture(fn: Callable[..., Any], *sample_args: torch.Tensor, warmup: int = 3, pool=None,
            calls_per_graph: int = 1, clone_outputs: bool = False, no_grad: bool = True,
            eager_fallback: bool = False, generators=(), check_input_liveness: bool = False,
            check_weights: bool = True) -> GraphedCallable:
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
      replay, so use it to debug). It checks that those tensors are alive, not that the module still holds them:
      ``check_weights`` does that.
    - ``check_weights``: guard the graph against stale tensors (``guard.py``): the last warm-up call (the capture
      itself when ``warmup=0``) is watched, so ``fn`` runs exactly ``warmup`` times before the capture; it records
      the tensors ``fn`` really reads and where each is held (module parameters and buffers, object attributes,
      closure variables, default arguments, globals, containers), and the train/eval mode of the modules on the
      way. Before calls and replays, :class:`StaleGraphError` is raised if one was replaced, re-typed or moved
      (``model.weight = ...``, ``model.half()``, ``w.data = w.data.t()``) or a module changed mode (``model.eval()``
      after a capture in training mode), instead of replaying on old weights, released memory or the other mode;
      ``guard.py``'s docstring says exactly what is checked on which call. In-place updates (``load_state_dict``,
      ``param.copy_``) pass. Its cost per call is stated in the README ("what the kit costs"); in a loop that cannot
      change weights, check once per block with ``guard.weights_fixed(g)``. The guard is ``g.guard``.

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
    device = sample_args[0].device if sample_args else torch.device("cuda", torch.cuda.current_device())
    reseeds: list = []  # reseeds seen in the warm-up (a graph cannot replay them); see reseeding_calls
    watched = _watching_reseeds(fn, reseeds, device, generators)
    with torch.cuda.device(device):
        side = capture_stream(device)  # warm-up and capture on the kit's one stream for this GPU
        side.wait_stream(torch.cuda.current_stream(device))
        reads = None
        with torch.cuda.stream(side), grad_ctx():
            for i in range(warmup):
                # the last warm-up call is watched: what does fn really read? (no extra call: fn runs exactly
                # `warmup` times before the capture; force_eager: a compiled fn runs its Python code for that call,
                # after the earlier warm-ups compiled it; with warmup=1 it runs as compiled)
                watch = guard.watch_reads(skip=static_inputs, force_eager=warmup > 1) \
                    if check_weights and i == warmup - 1 else contextlib.nullcontext()
                with watch as watching:
                    watched(*static_inputs)
                reads = watching or reads
        torch.cuda.current_stream(device).wait_stream(side)
        if reseeds:
            raise reseed_error(reseeds, "its warm-up")
        # warmup=0: the capture itself is watched (a compiled fn then runs as compiled, nothing forced eager)
        watch_capture = guard.watch_reads(skip=static_inputs, force_eager=False) if check_weights and not warmup \
            else contextlib.nullcontext()

        graph = torch.cuda.CUDAGraph()
        register_generators(graph, generators)
        try:
            # a reseed here is refused by PyTorch itself (set_current_seed during capture): from_exception explains it
            with grad_ctx(), graph_capture(graph, pool=pool, stream=side, **options), watch_capture as watching:
                for _ in range(calls_per_graph):
                    out = fn(*static_inputs)
        except Exception as exc:
            del graph
            recover_from_failed_capture(device)
            with torch.cuda.stream(side):
                raise confirm_host_sync(CaptureError.from_exception(exc), fn, static_inputs, no_grad) from exc
    read = (reads or watching).tensors if check_weights else ()
    checked = guard.Guard(fn, read) if check_weights else None
    return GraphedCallable(fn, static_inputs, out, graph, "graph", calls_per_graph, clone_outputs,
                           graph.pool(), no_grad=no_grad, guard=checked)


def _generator_state(gen) -> tuple:
    """``(seed, offset)`` of a torch.Generator, read on the host (no draw, no sync); offset None where the generator
    has none (the CPU's Mersenne Twister). Only outside a capture: PyTorch refuses the reads during one."""
    seed = gen.initial_seed()
    if gen.device.type != "cuda":
        return seed, None
    if hasattr(gen, "get_offset"):
        return seed, gen.get_offset()
    state = gen.get_state()  # older PyTorch: a CUDA generator's state is its seed and offset, 8 bytes each
    return seed, int.from_bytes(bytes(state[8:16].tolist()), "little")


def _default_generator(device):
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else
                                             torch.cuda.current_device()]
    return torch.default_generator


class reseeding_calls:
    """``with reseeding_calls(device) as seen:`` lists the reseeds of the generator(s) seen across the block: the
    default generator of ``device`` (default: the current GPU, else the CPU's) and any ``generators`` given. It
    patches nothing: it reads each generator's seed and Philox offset before and after the block.

    A graph cannot replay a reseed (replays would never reseed). What the two readings show, for one call:

    - draws random numbers: same seed, the offset moved forward (nothing reported);
    - draws nothing: same seed and offset (nothing reported);
    - reseeds to another seed (``torch.manual_seed``, ``torch.cuda.seed``, ``set_rng_state`` of another seed),
      whether it draws after or not: the seed changed (reported);
    - reseeds to the seed it already had after earlier draws, or restores an earlier state: the offset went backwards
      (reported).

    What the readings cannot tell apart: a reseed to the seed the generator already has, when the offset before the
    block is no higher than where the block's own draws end (e.g. ``torch.manual_seed(0)`` before capturing and again
    first thing in the function), looks like an ordinary draw; and PyTorch allows that reseed during a capture too
    (``CUDAGeneratorImpl::set_current_seed`` refuses only a *different* seed while capturing, and makes the same seed a
    no-op). Across several blocks it leaves a trace: with ``history`` (one list shared by consecutive calls of the same
    function), a call that advanced the offset followed by one that did not gets a :class:`ReseedWarning`. That is a
    warning, not an error, because a function that draws only in its first call (a ``LazyLinear`` initialising its
    weights on the GPU) leaves the same trace. ``check_capturable`` (which instruments the seeding calls while it
    runs) names the line. A reseed to another seed is seen, and refused, whatever the offsets. Another thread that
    reseeds the same generator inside the block is reported too.

    Example::

        with reseeding_calls(x.device) as seen:
            fn(x)                               # an eager call, not during a capture
        if seen:
            raise reseed_error(seen, "its warm-up")
    """

    def __init__(self, device=None, generators=(), history: list | None = None):
        self.device, self.generators, self.history = device, tuple(generators), history

    def _read(self) -> list:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return []  # PyTorch refuses these reads during a capture (and refuses a reseed there itself)
        gens = (_default_generator(self.device),) + self.generators
        return [(gen, _generator_state(gen)) for gen in gens]

    def __enter__(self) -> list:
        self.seen: list = []
        self.before = self._read()
        return self.seen

    def __exit__(self, *exc) -> bool:
        after = dict((id(gen), state) for gen, state in self._read())
        for gen, (seed, offset) in self.before:
            if id(gen) not in after:
                continue
            seed_after, offset_after = after[id(gen)]
            name = f"the default {gen.device} generator" if gen is _default_generator(self.device) else \
                f"a {gen.device} torch.Generator"
            if seed_after != seed:
                self.seen.append(f"{name}'s seed changed from {seed} to {seed_after}")
            elif offset is not None and offset_after is not None and offset_after < offset:
                self.seen.append(f"{name}'s offset went back from {offset} to {offset_after} (seed {seed})")
            elif self.history is not None and offset is not None and offset_after is not None and \
                    gen is _default_generator(self.device):
                advanced = offset_after > offset
                if self.history and self.history[-1] and not advanced:
                    warnings.warn(ReseedWarning(RESEED_SUSPECT), stacklevel=4)
                self.history.append(advanced)
        return False


class ReseedWarning(UserWarning):
    """A warm-up drew random numbers in one call and none in the next: a reseed to the same seed, or a lazy init."""


RESEED_SUSPECT = (
    "the function drew random numbers from the CUDA generator in one warm-up call and none in the next. Either it "
    "draws only in its first call (lazy initialisation, e.g. LazyLinear: nothing to do), or it reseeds the generator "
    "to the seed it already had (torch.manual_seed inside the function): a graph cannot replay a reseed, so each "
    "replay would draw new numbers where eager repeats them. Fix: seed before capture, not inside the function; "
    "check_capturable(fn, *args) names the line that reseeds.")


def _watching_reseeds(fn, seen: list, device=None, generators=()):
    """``fn`` that adds to ``seen`` the reseeds each of its calls makes (see :class:`reseeding_calls`)."""
    history: list = []  # did each call advance the default generator's offset (see reseeding_calls)

    def watched(*args):
        watch = reseeding_calls(device, generators, history)
        try:
            with watch:
                return fn(*args)
        finally:
            seen.extend(watch.seen)  # filled when the block ends
    return watched


def reseed_error(calls: list, during: str) -> CaptureError:
    """The CaptureError for a function that reseeds the CUDA generator inside (``calls``: what
    :class:`reseeding_calls` saw)."""
    seen = "; ".join(dict.fromkeys(calls))
    err = CaptureError(_format_failure(_RESEED_CAUSE, _RESEED_FIX, f"seen during {during}: {seen}"))
    err.cause, err.fix, err.original = _RESEED_CAUSE, _RESEED_FIX, f"seen during {during}: {seen}"
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
