"""Variable shapes with CUDA graphs: one graph per bucket size, a bucket planner, and a memory ledger.

A CUDA graph replays fixed shapes. To serve requests of many batch sizes, capture one graph per *bucket*
size, pad each request up to the nearest bucket, run that bucket's graph, and slice the real rows back out.
Serving engines do this with one memory pool shared by all buckets, captured largest first.

- :func:`capture_buckets` -> :class:`BucketedGraphs`: the bucketed callable (pad, replay, slice; eager and
  counted above the largest bucket).
- :func:`ladder`, :func:`plan_buckets`, :func:`evaluate_buckets`: fixed ladders of bucket sizes, and a planner
  that picks sizes from observed request sizes under a limit on graphs and/or memory;
  :func:`measure_bucket_costs` gives it the GPU time of each size.
- :class:`MemoryLedger`, :func:`pool_usage`: memory per graph and per pool, from the allocator's own statistics.

Padding is only correct for functions whose output rows depend only on their own input rows (an MLP, a
transformer block whose attention runs *within* each request): anything that mixes rows across the batch
dimension (batch norm in training mode, attention across the batch, a sum over the batch) would let the
padding rows leak into the results. :meth:`BucketedGraphs.verify` checks this with poison padding.

Example::

    import torch
    from cudagraph_kit.buckets import capture_buckets

    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    serve = capture_buckets(model, torch.randn(64, 512, device="cuda"))   # buckets 1, 2, 4, 8, 16, ..., 64
    y = serve(torch.randn(37, 512, device="cuda"))   # padded to 40 rows, replayed, sliced back: y has 37 rows
    print(serve.stats)                                # calls per bucket, padded rows, eager overflows

The module needs PyTorch and the kit's ``capture.py`` (numpy for the planner, pandas for the ledger's table): to
use it in a project of yours, copy ``capture.py`` with it (and ``timing.py`` for :func:`measure_bucket_costs`).
"""
from __future__ import annotations

import bisect
import contextlib
import math
import statistics
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

try:  # inside cudagraph_kit
    from .capture import (NO_CUDA_MESSAGE, CaptureError, NoCudaError, describe_tensor, capture_stream, graph_capture,
                          recover_from_failed_capture)
except ImportError:  # copied into a project: capture.py sits beside this file
    try:
        from capture import (NO_CUDA_MESSAGE, CaptureError, NoCudaError, describe_tensor, capture_stream, graph_capture,
                             recover_from_failed_capture)
    except ModuleNotFoundError as exc:
        if exc.name != "capture":
            raise
        raise ImportError("buckets.py needs the kit's capture.py in the same folder (errors, recovery and the "
                          "capture stream live there). Fix: copy cudagraph_kit/capture.py beside it.") from exc

__all__ = [
    "BucketedGraphs", "BucketStats", "BucketOverflowWarning", "capture_buckets", "ladder",
    "BucketPlan", "plan_buckets", "evaluate_buckets", "interpolate", "measure_bucket_costs", "BucketCosts",
    "MemoryLedger", "pool_usage", "graph_pools",
]

MiB = 2 ** 20


# ------------------------------------------------------------------------------------------------ ladders
def ladder(max_size: int, spacing: int | str = "default") -> list[int]:
    """Bucket sizes from 1 up to ``max_size`` (always included), ascending.

    ``spacing``: ``"default"`` (1, 2, 4, then steps of 8 up to 256, then steps of 16, the pattern serving
    engines use), ``"pow2"`` (1, 2, 4, 8, ...), or an int ``step`` (1, 2, 4, ... below ``step``, then every
    multiple of ``step``; ``1`` gives every size).

    Example::

        ladder(40)             # [1, 2, 4, 8, 16, 24, 32, 40]
        ladder(40, "pow2")     # [1, 2, 4, 8, 16, 32, 40]
        ladder(10, 4)          # [1, 2, 4, 8, 10]
    """
    if not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"max_size must be a positive int, got {max_size!r}.")
    if spacing == "default":
        sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max_size + 1, 16))
    elif spacing == "pow2":
        sizes = [2 ** e for e in range(max_size.bit_length())]
    elif isinstance(spacing, int) and spacing >= 1:
        sizes = [2 ** e for e in range(spacing.bit_length()) if 2 ** e < spacing] + list(range(spacing, max_size + 1, spacing))
    else:
        raise ValueError(f"spacing must be 'default', 'pow2' or a positive int step, got {spacing!r}.")
    return sorted({s for s in sizes if s <= max_size} | {max_size})


# ------------------------------------------------------------------------------------------------ pytrees
_TENSOR = object()  # marks where a tensor sat among an output's leaves


def _flatten(obj) -> tuple[list, Any]:
    """The tensors in ``obj`` (nested tuples, lists, dicts, namedtuples: ``torch.utils._pytree``) and what
    :func:`_unflatten` needs to rebuild it: the tree spec and the other leaves, kept as they are."""
    leaves, spec = tree_flatten(obj)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return tensors, (spec, [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves])


def _unflatten(structure, tensors: Iterable):
    spec, leaves = structure
    it = iter(tensors)
    return tree_unflatten([next(it) if leaf is _TENSOR else leaf for leaf in leaves], spec)


# ------------------------------------------------------------------------------------------------ the callable
class BucketOverflowWarning(UserWarning):
    """A request was larger than the largest captured bucket and ran eagerly (warned once per object)."""


@dataclass
class BucketStats:
    """What a :class:`BucketedGraphs` did: requests, rows, padding, calls per bucket and eager overflows."""
    requests: int = 0
    rows: int = 0                 # real rows served (graphed and overflow)
    padded_rows: int = 0          # rows of padding computed by the buckets
    eager_overflows: int = 0      # requests above the largest bucket (ran eagerly)
    overflow_rows: int = 0
    calls: dict = field(default_factory=dict)  # bucket size -> calls

    @property
    def pad_fraction(self) -> float:
        """Share of the rows the buckets computed that were padding (0 when nothing was padded)."""
        computed = self.rows - self.overflow_rows + self.padded_rows
        return self.padded_rows / computed if computed else 0.0

    def __str__(self):
        calls = ", ".join(f"{b}: {c}" for b, c in sorted(self.calls.items()))
        return (f"{self.requests} requests, {self.rows} rows, {self.padded_rows} padded rows "
                f"({self.pad_fraction:.1%} of computed rows), {self.eager_overflows} eager overflow(s); "
                f"calls per bucket {{{calls}}}")


class BucketedGraphs:
    """One graph per bucket size; a call pads the request to the nearest bucket, replays, slices. Build it
    with :func:`capture_buckets`.

    All buckets read one static input buffer per argument and write one static output buffer per output
    (each holding the largest bucket's rows), so a result is a view that the next call overwrites: clone it
    (or pass ``clone_outputs=True``) to keep it. Requests above the largest bucket run ``fn`` eagerly and are
    counted in ``stats.eager_overflows`` (a :class:`BucketOverflowWarning` the first time), never silently.

    Attributes: ``sizes`` (ascending), ``graphs`` ({size: torch.cuda.CUDAGraph}; empty in eager mode),
    ``mode`` ("graph" or "eager"), ``pool`` (the shared pool handle, None for private pools), ``stats``
    (:class:`BucketStats`), ``capture_log`` (per bucket: seconds, bytes the pool grew by), ``static_inputs``,
    ``static_outputs``, ``dim``, ``pad_value``.
    """

    def __init__(self, fn, sizes, dim, pad_value, overflow, mode, no_grad, clone_outputs):
        self.fn = fn
        self.sizes = list(sizes)
        self.dim = dim
        self.pad_value = pad_value
        self.overflow = overflow
        self.mode = mode
        self.no_grad = no_grad
        self.clone_outputs = clone_outputs
        self.graphs: dict = {}
        self.pool = None
        self.static_inputs: tuple = ()
        self.static_outputs: tuple = ()
        self.capture_log: list = []
        self.stats = BucketStats()
        self._out_spec = None
        self._specs: tuple = ()
        self._views: dict = {}       # bucket -> input views
        self._warned = False

    # -- construction ------------------------------------------------------------------------------------
    def _init_buffers(self, sample_args):
        top = self.sizes[-1]
        bufs, specs = [], []
        for a in sample_args:
            shape = list(a.shape)
            shape[self.dim] = top
            fill = 0.0 if self.pad_value is None else self.pad_value
            buf = torch.full(shape, fill, dtype=a.dtype, device=a.device)
            rows = min(a.shape[self.dim], top)
            buf.narrow(self.dim, 0, rows).copy_(a.narrow(self.dim, 0, rows))
            bufs.append(buf)
            specs.append((a.dim(), tuple(a.shape[:self.dim]), tuple(a.shape[self.dim + 1:]), a.dtype, a.device))
        self.static_inputs = tuple(bufs)
        self._specs = tuple(specs)
        self._views = {b: tuple(buf.narrow(self.dim, 0, b) for buf in bufs) for b in self.sizes}

    def _check_outputs(self, out, b):
        leaves, spec = _flatten(out)
        if not leaves:
            raise TypeError("the function returned no tensor; a bucketed graph needs tensor outputs.")
        for i, o in enumerate(leaves):
            if o.dim() <= self.dim or o.shape[self.dim] != b:
                raise ValueError(
                    f"output {i} has {describe_tensor(o)} for a bucket of {b} rows along dim {self.dim}. Bucketing "
                    "pads rows and slices them off again, so every output needs one row per input row along "
                    "that dim. Fix: return per-row results (reduce over the batch after the call), or set dim.")
        if self._out_spec is None:
            self._out_spec = spec
        else:
            want = [(o.shape[:self.dim], o.shape[self.dim + 1:], o.dtype) for o in self.static_outputs]
            got = [(o.shape[:self.dim], o.shape[self.dim + 1:], o.dtype) for o in leaves]
            if spec != self._out_spec or want != got:
                raise ValueError(f"the outputs for {b} rows differ in structure, shape or dtype from those of "
                                 f"the largest bucket ({self.sizes[-1]} rows). Fix: make the function return the "
                                 "same structure for every batch size.")
        return leaves

    def _init_outputs(self, leaves):
        self.static_outputs = tuple(torch.empty_like(o) for o in leaves)

    def _run_eager_bucket(self, b):
        ctx = torch.no_grad() if self.no_grad else contextlib.nullcontext()
        with ctx:
            out = self.fn(*self._views[b])
            leaves = self._check_outputs(out, b)
            if not self.static_outputs:
                self._init_outputs(leaves)
            for o, buf in zip(leaves, self.static_outputs):
                buf.narrow(self.dim, 0, b).copy_(o)

    def _capture(self, warmup: int, pool):
        device = self.static_inputs[0].device
        stream = capture_stream(device)  # the kit's stream rule: warm-up and capture on one stream per GPU
        if pool == "shared":
            self.pool = torch.cuda.graph_pool_handle()
        elif pool is not None and pool != "private":
            self.pool = pool
        grad = torch.no_grad if self.no_grad else torch.enable_grad
        for b in reversed(self.sizes):  # largest first: the smaller buckets reuse its memory in a shared pool
            t0 = time.perf_counter()
            views = self._views[b]
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream), grad():
                for _ in range(max(warmup, 1)):  # at least one: it checks the outputs' shapes
                    out = self.fn(*views)
                leaves = self._check_outputs(out, b)
            torch.cuda.current_stream(device).wait_stream(stream)
            if not self.static_outputs:  # allocated on the stream that replays and reads them
                self._init_outputs(leaves)
            del out, leaves
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # so the reserved-memory delta below is what this capture added
            reserved = torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            try:
                with grad(), graph_capture(graph, pool=self.pool, stream=stream):
                    out = self.fn(*views)
                    leaves = _flatten(out)[0]
                    for i, buf in enumerate(self.static_outputs):
                        buf.narrow(self.dim, 0, b).copy_(leaves[i])
                    del out, leaves  # their memory goes back to the pool, for the next (smaller) bucket to reuse
            except Exception as exc:
                del graph
                recover_from_failed_capture(device)
                err = CaptureError.from_exception(exc)  # .cause, .fix, .original as everywhere in the kit
                err.args = (f"bucket of {b} rows: " + str(err),)
                raise err from exc
            torch.cuda.synchronize(device)
            self.graphs[b] = graph
            self.capture_log.append({
                "size": b, "seconds": time.perf_counter() - t0,
                "pool_growth_bytes": torch.cuda.memory_reserved(device) - reserved,
                "pool": tuple(graph.pool()),
            })

    # -- calling -----------------------------------------------------------------------------------------
    def bucket_for(self, rows: int) -> int | None:
        """The smallest bucket holding ``rows`` rows, or None above the largest bucket."""
        i = bisect.bisect_left(self.sizes, rows)
        return self.sizes[i] if i < len(self.sizes) else None

    def _rows(self, args) -> int:
        if len(args) != len(self._specs):
            raise TypeError(f"these buckets were captured for {len(self._specs)} argument(s), got {len(args)}. "
                            "Fix: pass the same arguments as the sample.")
        n, d = None, self.dim
        for i, (a, (ndim, pre, post, dtype, device)) in enumerate(zip(args, self._specs)):
            ok = isinstance(a, torch.Tensor) and a.dim() == ndim and a.dtype == dtype and a.device == device
            if not ok or tuple(a.shape[:d]) != pre or tuple(a.shape[d + 1:]) != post:
                expect = list(pre) + ["rows"] + list(post)
                raise ValueError(
                    f"argument {i}: the buckets were captured for shape ({', '.join(map(str, expect))}) "
                    f"{str(dtype).replace('torch.', '')} on {device}, got {describe_tensor(a)}. Only the size along "
                    f"dim {d} may vary; nothing was copied or replayed. Fix: convert it (.to(device, dtype)) or "
                    "capture buckets for this shape.")
            rows = a.shape[d]
            if n is None:
                n = rows
            elif rows != n:
                raise ValueError(f"argument {i} has {rows} rows along dim {d}, argument 0 has {n}; every argument "
                                 "of a request needs the same number of rows.")
        if n == 0:
            raise ValueError("an empty request (0 rows): there is nothing to run. Fix: skip empty requests.")
        return n

    def __call__(self, *args):
        """Run one request of any number of rows; returns ``fn``'s result for exactly those rows."""
        n = self._rows(args)
        b = self.bucket_for(n)
        stats = self.stats
        stats.requests += 1
        stats.rows += n
        if b is None:
            return self._overflow(args, n)
        d = self.dim
        for a, view in zip(args, self._views[b]):
            view.narrow(d, 0, n).copy_(a)
            if n < b and self.pad_value is not None:
                view.narrow(d, n, b - n).fill_(self.pad_value)
        if self.mode == "graph":
            self.graphs[b].replay()
        else:
            self._run_eager_bucket(b)
        stats.padded_rows += b - n
        stats.calls[b] = stats.calls.get(b, 0) + 1
        outs = [o.narrow(d, 0, n) for o in self.static_outputs]
        if self.clone_outputs:
            outs = [o.clone() for o in outs]
        return _unflatten(self._out_spec, outs)

    def _overflow(self, args, n):
        top = self.sizes[-1]
        if self.overflow == "error":
            self.stats.requests -= 1
            self.stats.rows -= n
            raise ValueError(f"a request of {n} rows is larger than the largest captured bucket ({top}); nothing "
                             f"ran. Fix: capture a bucket of at least {n} rows, split the request, or pass "
                             "overflow='eager' to run such requests eagerly (counted).")
        self.stats.eager_overflows += 1
        self.stats.overflow_rows += n
        if not self._warned:
            self._warned = True
            warnings.warn(f"a request of {n} rows is larger than the largest captured bucket ({top}) and ran "
                          "eagerly (no graph); such requests are counted in .stats.eager_overflows and this "
                          f"warning is shown once. Fix: capture a bucket of at least {n} rows, or split requests.",
                          BucketOverflowWarning, stacklevel=3)
        ctx = torch.no_grad() if self.no_grad else contextlib.nullcontext()
        with ctx:
            return self.fn(*args)

    def verify(self, *args, poison: float = float("nan")) -> float:
        """Largest difference between this call and eager ``fn`` on ``args``, with the padding rows filled
        with ``poison`` (NaN by default): ``inf`` when poison leaked into the real rows (the function mixes
        rows across the batch dimension, so bucketing it is wrong). Correct before fast: call this first.

        Example::

            err = serve.verify(x)            # x: a request whose size is not a bucket size
            assert err < 1e-4
        """
        saved, saved_stats = self.pad_value, self.stats
        self.pad_value, self.stats = poison, BucketStats()
        try:
            got = [g.clone() for g in _flatten(self(*args))[0]]
        finally:
            self.pad_value, self.stats = saved, saved_stats
        ctx = torch.no_grad() if self.no_grad else contextlib.nullcontext()
        with ctx:
            want = _flatten(self.fn(*args))[0]
        err = 0.0
        for g, w in zip(got, want):
            g, w = g.double(), w.double()
            if ((~torch.isfinite(g)) & torch.isfinite(w)).any():
                return math.inf  # the poison reached a real row
            both = torch.isfinite(g) & torch.isfinite(w)
            if both.any():
                err = max(err, (g[both] - w[both]).abs().max().item())
        return err

    def reset_stats(self) -> None:
        """Start counting afresh (calls per bucket, padding, overflows)."""
        self.stats = BucketStats()

    @property
    def capture_seconds(self) -> float:
        """Wall time spent warming up and capturing all buckets."""
        return sum(e["seconds"] for e in self.capture_log)

    def __repr__(self):
        s = self.sizes if len(self.sizes) <= 12 else self.sizes[:5] + ["..."] + self.sizes[-3:]
        pool = "eager" if self.mode == "eager" else ("shared pool" if self.pool is not None else "private pools")
        return (f"BucketedGraphs({getattr(self.fn, '__name__', type(self.fn).__name__)}, mode={self.mode!r}, "
                f"{len(self.sizes)} buckets {s}, {pool}, inputs=[{', '.join(describe_tensor(t) for t in self.static_inputs)}])")


def capture_buckets(fn: Callable[..., Any], *sample_args: torch.Tensor, sizes: Sequence[int] | None = None,
                    max_size: int | None = None, dim: int = 0, pool="shared", pad_value: float | None = 0.0,
                    warmup: int = 3, overflow: str = "eager", no_grad: bool = True, clone_outputs: bool = False,
                    eager_fallback: bool = False) -> BucketedGraphs:
    """Capture ``fn`` once per bucket size and return a :class:`BucketedGraphs` that serves any request size.

    - ``sample_args``: tensors like a request (dtype, device, every dim but ``dim``); their values only seed
      the static inputs.
    - ``sizes``: bucket sizes (or a :class:`BucketPlan`); default ``ladder(max_size)`` with ``max_size``
      defaulting to the samples' size along ``dim``.
    - ``pool``: ``"shared"`` (one pool for all buckets, captured largest first: memory near that of the largest
      bucket alone), ``"private"`` (a pool per graph, PyTorch's default: memory adds up), or a pool handle.
      Sharing is safe here because buckets never replay concurrently and every result lands in the static
      output buffers, outside the pool. If the shared pool still holds clearly more than the largest bucket
      alone (read it with :class:`MemoryLedger`), its segments fragment: start Python with
      ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and measure again (the kit never changes allocator
      settings, which apply to the whole process).
    - ``pad_value``: what the padding rows hold (written on every padded call); ``None`` leaves whatever the
      previous request left there (one launch less; still correct for row-independent functions).
    - ``warmup``: eager calls before each bucket's capture, on the capture stream (at least one, which also
      checks that every output has one row per input row).
    - ``overflow``: ``"eager"`` (run requests above the largest bucket eagerly, counted and warned once) or
      ``"error"``.
    - ``no_grad``: run under ``torch.no_grad()`` (inference). ``clone_outputs``: return copies.
    - ``eager_fallback``: without CUDA run every bucket eagerly (``mode == "eager"``) instead of raising
      ``NoCudaError``; padding, slicing and counting behave exactly as with graphs.

    Only functions whose output rows depend on their own input rows alone are correct under padding.

    Example::

        serve = capture_buckets(model, torch.randn(128, 64, 256, device="cuda"), sizes=[8, 32, 128])
        out = serve(batch)            # batch: (n, 64, 256) with 1 <= n <= 128; out has n rows
    """
    if not sample_args:
        raise TypeError("capture_buckets needs at least one sample tensor (a request-like input).")
    for i, a in enumerate(sample_args):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"sample argument {i} is a {type(a).__name__}, not a tensor. Fix: bind other "
                            "arguments into the function first, e.g. functools.partial(fn, scale=2.0).")
    ndim = sample_args[0].dim()
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim={dim} is out of range for a sample of {ndim} dims.")
    dim = dim % ndim
    if any(a.dim() != ndim for a in sample_args):
        raise ValueError("every sample argument needs the same number of dims (the batch dim is shared).")
    if overflow not in ("eager", "error"):
        raise ValueError(f"overflow must be 'eager' or 'error', got {overflow!r}.")
    if hasattr(sizes, "sizes"):  # a BucketPlan
        sizes = sizes.sizes
    if sizes is None:
        sizes = ladder(max_size or sample_args[0].shape[dim])
    sizes = sorted(set(int(s) for s in sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"bucket sizes must be positive ints, got {sizes}.")
    if max_size is not None and sizes[-1] != max_size:
        raise ValueError(f"max_size={max_size} but the largest bucket is {sizes[-1]}; give one or the other.")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}.")
    if not (pool in ("shared", "private", None) or isinstance(pool, (tuple, getattr(torch.cuda, "MemPool", ())))):
        raise ValueError(f"pool must be 'shared', 'private' or a pool from cudagraph_kit.shared_pool() (or "
                         f"torch.cuda.graph_pool_handle()), got {pool!r}.")

    cuda = torch.cuda.is_available()
    if not cuda and not eager_fallback:
        raise NoCudaError(NO_CUDA_MESSAGE)
    if cuda:
        for i, a in enumerate(sample_args):
            if not a.is_cuda:
                raise ValueError(f"sample argument {i} is on {a.device}. A CUDA graph can only read GPU memory. "
                                 "Fix: move it to the GPU before capturing, e.g. x.cuda().")
    mode = "graph" if cuda else "eager"
    bg = BucketedGraphs(fn, sizes, dim, pad_value, overflow, mode, no_grad, clone_outputs)
    bg._init_buffers(sample_args)
    if mode == "graph":
        bg._capture(warmup, pool)
    else:
        for b in reversed(sizes):  # validate every bucket's outputs once, as a capture would
            bg._run_eager_bucket(b)
    return bg


# ------------------------------------------------------------------------------------------------ planner
def _histogram(observed) -> Counter:
    if isinstance(observed, Mapping):
        hist = Counter({int(k): int(v) for k, v in observed.items() if v})
    else:
        if isinstance(observed, torch.Tensor):
            observed = observed.flatten().tolist()
        hist = Counter(int(s) for s in observed)
    bad = [s for s in hist if s < 1]
    if bad:
        raise ValueError(f"request sizes must be >= 1, got {sorted(bad)[:5]}.")
    if not hist:
        raise ValueError("no observed request sizes: give a list of sizes or a {size: count} histogram.")
    return hist


def _as_function(f, name):
    if f is None or callable(f):
        return f
    if isinstance(f, Mapping):
        return interpolate(f)
    raise TypeError(f"{name} must be a callable size -> value or a {{size: value}} mapping, got {type(f).__name__}.")


def interpolate(points: Mapping[int, float]) -> Callable[[int], float]:
    """A function of the size that interpolates measured ``{size: value}`` points linearly (constant beyond).

    Use it to turn a few measured timings or memory readings into the planner's ``cost`` or ``graph_memory``.

    Example::

        cost = interpolate({1: 20.0, 32: 24.0, 128: 61.0})   # µs per replay, measured for three sizes
        cost(64)                                              # 36.3...
    """
    import numpy as np

    if not points:
        raise ValueError("interpolate needs at least one {size: value} point.")
    xs = sorted(points)
    ys = [float(points[x]) for x in xs]
    return lambda s: float(np.interp(s, xs, ys))


def _pad_cost(cost, pad_cost) -> float:
    if pad_cost is None:
        pad_cost = getattr(cost, "pad_us", 0.0)
    pad_cost = float(pad_cost)
    if not pad_cost >= 0.0:
        raise ValueError(f"pad_cost must be a cost >= 0 per padded request, got {pad_cost}.")
    return pad_cost


class BucketCosts(dict):
    """``{size: µs}`` from :func:`measure_bucket_costs`, plus ``pad_us``: what padding a request costs on top of its
    bucket (writing the padding rows), which :func:`plan_buckets` adds for every padded request."""
    pad_us: float = 0.0
    clock: str = ""


def _timing():
    try:
        from . import timing
    except ImportError:  # pragma: no cover - this file copied on its own
        try:
            import timing  # the kit's timing.py copied beside this file
        except ImportError as exc:
            raise ImportError("measure_bucket_costs needs the kit's timing module. Fix: copy timing.py from "
                              "cudagraph_kit next to this file.") from exc
    return timing


def measure_bucket_costs(serve: "BucketedGraphs", *sample_args: torch.Tensor, sizes: Iterable[int] | None = None,
                         rounds: int = 5, calls: int = 10) -> dict:
    """What a request of each size costs a busy server: ``{size: µs}``, for :func:`plan_buckets`' ``cost``.

    When requests queue up behind each other, a bucket costs its **GPU time**; the wall time of one request alone
    is mostly the host's work for small buckets and hides how the GPU time grows with the rows. So each size is
    served ``calls`` times queued behind a spin kernel and timed with CUDA events (``timing.device_time``),
    round-robin over the sizes for ``rounds`` rounds (slow drift hits every size alike); the median per size is
    returned as a :class:`BucketCosts`. Its ``pad_us`` is what a padded request costs on top of its bucket: the
    write of its padding rows before the replay (``pad_value``), timed the same way on a few buckets.
    ``sample_args`` must hold at least ``max(sizes)`` rows; ``sizes`` defaults to ``serve.sizes`` (capture one
    graph per size to measure every size exactly). Without CUDA the wall time per call is returned instead (there
    is no GPU time to measure) and ``pad_us`` is 0; the numbers then only exercise the planner.

    Example::

        exact = capture_buckets(model, sample, sizes=range(1, 65))
        plan = plan_buckets(sizes_seen, max_graphs=11, cost=measure_bucket_costs(exact, sample))
    """
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds and calls must be >= 1, got rounds={rounds}, calls={calls}.")
    sizes = sorted(set(int(b) for b in (serve.sizes if sizes is None else sizes)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes must be positive row counts, got {sizes}.")
    rows = min(a.shape[serve.dim] for a in sample_args) if sample_args else 0
    if rows < sizes[-1]:
        raise ValueError(f"the sample has {rows} rows along dim {serve.dim}, fewer than the largest size to measure "
                         f"({sizes[-1]}). Fix: pass a sample with at least {sizes[-1]} rows.")
    timing = _timing()
    fns = {b: (lambda a=tuple(a.narrow(serve.dim, 0, b) for a in sample_args): serve(*a)) for b in sizes}
    # padding a request writes its padding rows into the bucket's static inputs before the replay (as __call__
    # does): time that write for one padding row of up to four buckets spread over the sizes
    padded = [b for b in serve.sizes if b >= 2] if serve.pad_value is not None and serve.mode == "graph" else []
    for b in padded[:: max(1, len(padded) // 4)][:4]:
        fns[("pad", b)] = (lambda b=b: [v.narrow(serve.dim, b - 1, 1).fill_(serve.pad_value)
                                        for v in serve._views[b]])
    host = {k: timing.timeit(f, calls=calls, samples=3).median_us for k, f in fns.items()}
    costs = BucketCosts()
    if not torch.cuda.is_available():
        costs.update({b: host[b] for b in sizes})
        costs.clock = "wall (no CUDA)"
        return costs
    keys = list(fns)
    times = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[k].append(timing.device_time(fns[k], calls=calls, host_us=host[k])[0])
    med = {k: float(statistics.median(t)) for k, t in times.items()}
    costs.update({b: med[b] for b in sizes})
    pads = [v for k, v in med.items() if isinstance(k, tuple)]
    costs.pad_us = float(statistics.median(pads)) if pads else 0.0
    costs.clock = "GPU"
    return costs


@dataclass
class BucketPlan:
    """The planner's choice: ``sizes`` (ascending) and what it expects on the observed sizes."""
    sizes: list
    expected_waste: float        # mean over requests of cost(bucket) - cost(size); padded rows with the default cost
    padded_rows_per_request: float
    pad_fraction: float          # padded rows / computed rows on the observed sizes
    memory: float | None         # sum of graph_memory over the buckets (None without a memory model)
    overflow_requests: int       # observed requests above the largest bucket (they would run eagerly)

    @property
    def n_graphs(self) -> int:
        return len(self.sizes)


def evaluate_buckets(observed, sizes: Sequence[int], cost=None, pad_cost: float | None = None) -> dict:
    """How ``sizes`` would serve the observed requests: padded rows, pad fraction, overflows, expected waste.

    ``expected_waste`` is the mean over requests of ``cost(bucket) - cost(size)``, plus ``pad_cost`` for every
    request that is padded at all (default: ``cost.pad_us`` for costs from :func:`measure_bucket_costs`, else 0).

    Example::

        evaluate_buckets([3, 5, 9, 30], ladder(32))   # {'requests': 4, 'padded_rows': 6, ...}
    """
    hist = _histogram(observed)
    sizes = sorted(set(sizes.sizes if hasattr(sizes, "sizes") else sizes))
    pad_cost = _pad_cost(cost, pad_cost)
    cost = _as_function(cost, "cost") or float
    n = rows = padded = over = 0
    waste = 0.0
    for s, c in hist.items():
        n += c
        rows += s * c
        i = bisect.bisect_left(sizes, s)
        if i == len(sizes):
            over += c
            continue
        padded += (sizes[i] - s) * c
        waste += (cost(sizes[i]) - cost(s) + (pad_cost if sizes[i] > s else 0.0)) * c
    computed = rows - sum(s * c for s, c in hist.items() if s > sizes[-1]) + padded
    return {"requests": n, "rows": rows, "padded_rows": padded, "padded_rows_per_request": padded / n,
            "pad_fraction": padded / computed if computed else 0.0, "overflow_requests": over,
            "expected_waste": waste / n, "n_graphs": len(sizes)}


def plan_buckets(observed, *, max_graphs: int | None = None, memory_budget: float | None = None,
                 graph_memory=None, cost=None, pad_cost: float | None = None, max_size: int | None = None,
                 resolution: int = 256) -> BucketPlan:
    """Choose bucket sizes that minimise the expected padded work on the observed request sizes.

    The objective is the sum over requests of ``cost(bucket) - cost(size)``: padded rows with the default
    ``cost(size) = size``; pass measured times (a callable or a ``{size: µs}`` mapping, interpolated) to
    minimise padded *time* instead (:func:`measure_bucket_costs` measures it). ``pad_cost`` is added for every
    request that is padded at all (writing its padding rows; default: ``cost.pad_us`` when ``cost`` came from
    :func:`measure_bucket_costs`, else 0), so a frequent size earns its own bucket. Constraints: at most
    ``max_graphs`` buckets (capture time grows with their number), and
    ``sum(graph_memory(b)) <= memory_budget`` (a callable or ``{size: bytes}``, e.g. read
    from a :class:`MemoryLedger`). The largest bucket is ``max_size`` (default: the largest observed size);
    larger observed requests are reported as overflows.

    An exact dynamic programme over the distinct observed sizes (an optimal bucket always sits on one). With a
    memory budget, each graph's memory is rounded *up* to ``memory_budget / resolution``, so the plan never
    exceeds the budget and is optimal up to that rounding.

    Example::

        plan = plan_buckets(sizes_seen_yesterday, max_graphs=8, max_size=128)
        serve = capture_buckets(model, sample, sizes=plan.sizes)
    """
    import numpy as np

    hist = _histogram(observed)
    pad = _pad_cost(cost, pad_cost)
    cost_f = _as_function(cost, "cost") or float
    mem_f = _as_function(graph_memory, "graph_memory")
    if memory_budget is not None and mem_f is None:
        raise ValueError("memory_budget needs graph_memory (bytes a bucket of a given size adds): a callable or "
                         "a {size: bytes} mapping, e.g. measured with MemoryLedger.")
    if max_graphs is not None and max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}.")
    top = int(max_size) if max_size is not None else max(hist)
    cands = sorted({s for s in hist if s <= top} | {top})
    k = len(cands)
    counts = np.array([hist.get(s, 0) for s in cands], dtype=float)
    c = np.array([cost_f(s) for s in cands], dtype=float)
    C = np.concatenate([[0.0], np.cumsum(counts)])
    S = np.concatenate([[0.0], np.cumsum(counts * c)])

    if memory_budget is None:
        U, m = 0, np.zeros(k, dtype=int)
    else:
        unit = memory_budget / resolution
        mem = np.array([mem_f(s) for s in cands], dtype=float)
        m = np.ceil(np.maximum(mem, 0.0) / unit - 1e-9).astype(int)
        U = resolution
        if m[-1] > U:
            raise ValueError(f"the largest bucket ({top} rows) alone needs about {mem[-1] / MiB:.1f} MiB, more than "
                             f"the budget of {memory_budget / MiB:.1f} MiB. Fix: raise memory_budget, or lower "
                             "max_size (larger requests then run eagerly).")
    J = min(max_graphs or k, k)
    inf = np.inf
    # f[j, i, u]: least waste covering the first i candidates with j buckets, the last one at candidate i-1,
    # using u memory units; parent[j, i, u]: how many candidates the previous buckets covered.
    f = np.full((J + 1, k + 1, U + 1), inf)
    parent = np.zeros((J + 1, k + 1, U + 1), dtype=np.int32)
    f[0, 0, 0] = 0.0
    for j in range(1, J + 1):
        for i in range(j - 1, k):
            p = np.arange(i + 1)                                   # previous buckets covered p candidates
            waste = c[i] * (C[i + 1] - C[p]) - (S[i + 1] - S[p])   # requests in (p, i] padded to cands[i]
            waste = waste + pad * (C[i + 1] - C[p] - counts[i])    # each of them but size cands[i] is padded
            total = f[j - 1, : i + 1, :] + waste[:, None]
            best = total.argmin(axis=0)
            vals = total[best, np.arange(U + 1)]
            if m[i] <= U:
                f[j, i + 1, m[i]:] = vals[: U + 1 - m[i]]
                parent[j, i + 1, m[i]:] = best[: U + 1 - m[i]]
    final = f[:, k, :]
    if not np.isfinite(final).any():
        raise ValueError("no set of buckets fits these limits. Fix: raise memory_budget or max_graphs.")
    lowest = final.min()
    tol = 1e-9 * max(1.0, abs(S[-1]))  # rounding in the prefix sums: treat these as ties
    j, u = min(((jj, uu) for jj, uu in zip(*np.nonzero(final <= lowest + tol))), key=lambda t: (t[0], t[1]))
    chosen, i = [], k
    while i > 0:
        chosen.append(cands[i - 1])
        p = int(parent[j, i, u])
        u -= int(m[i - 1])
        i, j = p, j - 1
    chosen.sort()
    ev = evaluate_buckets(hist, chosen, cost_f, pad)
    return BucketPlan(sizes=chosen, expected_waste=ev["expected_waste"],
                      padded_rows_per_request=ev["padded_rows_per_request"], pad_fraction=ev["pad_fraction"],
                      memory=float(sum(mem_f(s) for s in chosen)) if mem_f is not None else None,
                      overflow_requests=ev["overflow_requests"])


# ------------------------------------------------------------------------------------------------ ledger
def pool_usage(device=None) -> dict:
    """Memory per allocator pool, from ``torch.cuda.memory_snapshot()``: ``{pool_id: {"reserved", "allocated",
    "segments"}}`` in bytes. Pool ``(0, 0)`` is the allocator's default pool; every other id is a CUDA graph's
    private or shared pool. Empty without CUDA.

    Example::

        for pool, use in pool_usage().items():
            print(pool, use["reserved"] / 2**20, "MiB reserved")
    """
    if not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    usage: dict = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", index) != index:
            continue
        pid = tuple(seg.get("segment_pool_id", (0, 0)))
        u = usage.setdefault(pid, {"reserved": 0, "allocated": 0, "segments": 0})
        u["reserved"] += seg["total_size"]
        u["allocated"] += seg["allocated_size"]
        u["segments"] += 1
    return usage


def _graphs_and_buffers(obj) -> tuple[list, list]:
    """The CUDA graphs an object holds and its static tensors that live outside the graphs' pools."""
    if isinstance(obj, torch.cuda.CUDAGraph):
        return [obj], []
    if isinstance(obj, BucketedGraphs) or (hasattr(obj, "graphs") and hasattr(obj, "static_outputs")):
        return list(obj.graphs.values()), list(obj.static_inputs) + list(obj.static_outputs)
    if hasattr(obj, "static_batch") and hasattr(obj, "graph"):   # capture_train_step
        return ([obj.graph] if obj.graph is not None else []), list(obj.static_batch)
    if hasattr(obj, "static_inputs") and hasattr(obj, "graph"):  # capture()
        return ([obj.graph] if obj.graph is not None else []), list(obj.static_inputs)
    if isinstance(obj, (list, tuple)):
        graphs, bufs = [], []
        for o in obj:
            g, b = _graphs_and_buffers(o)
            graphs += g
            bufs += b
        return graphs, bufs
    if isinstance(obj, dict):
        return _graphs_and_buffers(list(obj.values()))
    raise TypeError(f"cannot find CUDA graphs in a {type(obj).__name__}; pass a capture() result, a "
                    "BucketedGraphs, a capture_train_step step, a torch.cuda.CUDAGraph, or a list of them.")


def graph_pools(obj) -> list:
    """The distinct memory-pool ids of the graphs in ``obj`` (see :func:`_graphs_and_buffers` for what it reads)."""
    graphs, _ = _graphs_and_buffers(obj)
    return list(dict.fromkeys(tuple(g.pool()) for g in graphs))


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.data_ptr(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


class MemoryLedger:
    """A ledger of GPU memory: before/after any block of code, and per graph and pool.

    ``measure(label)`` records reserved and allocated memory (``torch.cuda.memory_reserved/allocated``), the
    device memory in use (``torch.cuda.mem_get_info``: it also sees what the allocator does not, such as
    graphs' own executables) and the growth of every graph pool, before and after the block.
    ``record(label, obj)`` reads the pools of the graphs that ``obj`` holds (a ``capture()`` result, a
    :class:`BucketedGraphs`, a ``capture_train_step`` step, a ``CUDAGraph``, or a list of them) from
    ``torch.cuda.memory_snapshot()``: bytes reserved and in use per pool, whether the pool is shared, and the
    static buffers kept outside the pools. ``table()`` returns all rows as a DataFrame (MiB).

    Example::

        ledger = MemoryLedger()
        with ledger.measure("buckets, shared pool"):
            serve = capture_buckets(model, sample)
        ledger.record("buckets, shared pool", serve)
        print(ledger.table())
    """

    def __init__(self, device=None):
        self.cuda = torch.cuda.is_available()
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu"))
        self.rows: list = []

    def snapshot(self) -> dict:
        """Reserved, allocated and device-used bytes now, and :func:`pool_usage` (empty dict without CUDA)."""
        if not self.cuda:
            return {}
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return {"reserved": torch.cuda.memory_reserved(self.device),
                "allocated": torch.cuda.memory_allocated(self.device),
                "device_used": total - free, "pools": pool_usage(self.device)}

    @contextlib.contextmanager
    def measure(self, label: str, note: str = ""):
        """Record memory before and after the ``with`` block (deltas in the ledger's table)."""
        before = self.snapshot()
        row = {"label": label, "kind": "before/after", "note": note}
        t0 = time.perf_counter()
        try:
            yield row
        finally:
            row["seconds"] = time.perf_counter() - t0
            after = self.snapshot()
            if before:
                pools_b, pools_a = before["pools"], after["pools"]
                growth = {p: a["reserved"] - pools_b.get(p, {}).get("reserved", 0)
                          for p, a in pools_a.items() if p != (0, 0)}
                row.update({
                    "reserved_before": before["reserved"], "reserved_after": after["reserved"],
                    "reserved_delta": after["reserved"] - before["reserved"],
                    "allocated_delta": after["allocated"] - before["allocated"],
                    "device_used_delta": after["device_used"] - before["device_used"],
                    "graph_pool_growth": sum(max(g, 0) for g in growth.values()),
                    "new_pools": len(set(pools_a) - set(pools_b)),
                })
            self.rows.append(row)

    def record(self, label: str, obj, note: str = "") -> dict:
        """Read the memory of the graphs in ``obj`` now; returns (and keeps) one row of the table."""
        graphs, buffers = _graphs_and_buffers(obj)
        pools = list(dict.fromkeys(tuple(g.pool()) for g in graphs))
        row = {"label": label, "kind": "graphs", "note": note, "graphs": len(graphs), "pools": len(pools),
               "pool_sharing": ("shared" if len(pools) < len(graphs) else "private") if graphs else "-",
               "buffers": _nbytes(buffers)}
        if self.cuda:
            usage = pool_usage(self.device)
            row["pool_reserved"] = sum(usage.get(p, {}).get("reserved", 0) for p in pools)
            row["pool_allocated"] = sum(usage.get(p, {}).get("allocated", 0) for p in pools)
            row["held"] = row["pool_reserved"] + row["buffers"]
        else:
            row["note"] = (note + "; " if note else "") + "no CUDA: nothing captured, no GPU memory held"
        self.rows.append(row)
        return row

    def table(self):
        """All rows as a pandas DataFrame, byte counts in MiB (columns ending in ``_mib``)."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        for col in list(df.columns):
            if col in ("reserved_before", "reserved_after", "reserved_delta", "allocated_delta",
                       "device_used_delta", "graph_pool_growth", "buffers", "pool_reserved", "pool_allocated",
                       "held"):
                df[col + "_mib"] = df[col] / MiB
                df = df.drop(columns=col)
        return df
