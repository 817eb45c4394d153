"""Variable shapes with CUDA graphs: one graph per bucket size, padded up and sliced back.

A CUDA graph replays fixed shapes. To serve requests of many batch sizes, capture one graph per *bucket*
size, pad each request up to the nearest bucket, run that bucket's graph, and slice the real rows back out.
Serving engines do this with one memory pool shared by all buckets, captured largest first.
:func:`capture_buckets` returns the bucketed callable, :class:`BucketedGraphs` (pad, replay, slice; eager and
counted above the largest bucket); :func:`ladder` gives fixed ladders of bucket sizes. (The planner that picks
sizes from observed requests is ``bucket_plan.py``; the memory ledger, ``memory.py``.)

Padding is only correct for functions whose output rows depend only on their own input rows (an MLP, a
transformer block whose attention runs *within* each request): anything that mixes rows across the batch
dimension (batch norm in training mode, attention across the batch, a sum over the batch) would let the
padding rows leak into the results. :meth:`BucketedGraphs.verify` checks this with poison padding.

Example::

    import torch
    from cudagraph_kit.bucket_graphs import capture_buckets

    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    serve = capture_buckets(model, torch.randn(64, 512, device="cuda"))   # buckets 1, 2, 4, 8, 16, ..., 64
    y = serve(torch.randn(37, 512, device="cuda"))   # padded to 40 rows, replayed, sliced back: y has 37 rows
    print(serve.stats)                                # calls per bucket, padded rows, eager overflows

It needs ``torch`` and the kit's ``graphed.py`` beside it.
"""
from __future__ import annotations

import bisect
import contextlib
import importlib.util
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


if __package__:
    from . import graphed  # errors, recovery after a failed capture, the capture stream
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed  # type: ignore[import-not-found, no-redef]

__all__ = ["BucketedGraphs", "BucketStats", "BucketOverflowWarning", "capture_buckets", "ladder"]


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
    (:class:`BucketStats`), ``capture_log`` (per bucket: size, seconds, pool id; with ``measure_memory=True``
    also ``pool_growth_bytes``, what the capture added to reserved memory), ``static_inputs``,
    ``static_outputs``, ``dim``, ``pad_value``.
    """

    def __init__(self, fn, sizes, dim, pad_value, overflow, mode, no_grad, clone_outputs, measure_memory=False):
        self.fn = fn
        self.sizes = list(sizes)
        self.dim = dim
        self.pad_value = pad_value
        self.overflow = overflow
        self.mode = mode
        self.no_grad = no_grad
        self.clone_outputs = clone_outputs
        self.measure_memory = measure_memory
        self.graphs: dict = {}
        self.guard = None  # graphed.guard.Guard: what the graphs read, checked before every replay
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
                    f"output {i} has {graphed.describe_tensor(o)} for a bucket of {b} rows along dim {self.dim}. "
                    "Bucketing pads rows and slices them off again, so every output needs one row per input row along "
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

    def _capture(self, warmup: int, pool, check_weights: bool = False):
        device = self.static_inputs[0].device
        stream = graphed.capture_stream(device)  # the kit's stream rule: warm-up and capture on one stream per GPU
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
                calls = max(warmup, 1)  # at least one: it checks the outputs' shapes
                for i in range(calls):
                    # the first bucket's last warm-up call is watched (no extra call): what does fn really read?
                    watch = graphed.guard.watch_reads(skip=tuple(views) + tuple(self.static_inputs),
                                                      force_eager=calls > 1) \
                        if check_weights and self.guard is None and i == calls - 1 else contextlib.nullcontext()
                    with watch as reads:
                        out = self.fn(*views)
                    if reads is not None:
                        self.guard = graphed.guard.Guard(self.fn, reads.tensors) or None
                leaves = self._check_outputs(out, b)
            torch.cuda.current_stream(device).wait_stream(stream)
            if not self.static_outputs:  # allocated on the stream that replays and reads them
                self._init_outputs(leaves)
            del out, leaves
            if self.measure_memory:  # empty the cache so the reserved-memory delta below is this capture's alone
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                reserved = torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            try:
                with grad(), graphed.graph_capture(graph, pool=self.pool, stream=stream):
                    out = self.fn(*views)
                    leaves = _flatten(out)[0]
                    for i, buf in enumerate(self.static_outputs):
                        buf.narrow(self.dim, 0, b).copy_(leaves[i])
                    del out, leaves  # their memory goes back to the pool, for the next (smaller) bucket to reuse
            except Exception as exc:
                del graph
                graphed.recover_from_failed_capture(device)
                err = graphed.CaptureError.from_exception(exc)  # .cause, .fix, .original as everywhere in the kit
                with torch.cuda.stream(stream):
                    err = graphed.confirm_host_sync(err, self.fn, views, self.no_grad)
                err.args = (f"bucket of {b} rows: " + str(err),)
                raise err from exc
            self.graphs[b] = graph
            entry = {"size": b, "seconds": time.perf_counter() - t0, "pool": tuple(graph.pool())}
            if self.measure_memory:
                torch.cuda.synchronize(device)
                entry["pool_growth_bytes"] = torch.cuda.memory_reserved(device) - reserved
            self.capture_log.append(entry)

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
                    f"{str(dtype).replace('torch.', '')} on {device}, got {graphed.describe_tensor(a)}. Only the size "
                    f"along dim {d} may vary; nothing was copied or replayed. Fix: convert it (.to(device, dtype)) or "
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
        if self.guard is not None:  # before any copy: a stale graph touches nothing
            self.guard.check()
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
        inputs = ", ".join(graphed.describe_tensor(t) for t in self.static_inputs)
        return (f"BucketedGraphs({getattr(self.fn, '__name__', type(self.fn).__name__)}, mode={self.mode!r}, "
                f"{len(self.sizes)} buckets {s}, {pool}, inputs=[{inputs}])")


def capture_buckets(fn: Callable[..., Any], *sample_args: torch.Tensor, sizes: Sequence[int] | None = None,
                    max_size: int | None = None, dim: int = 0, pool="shared", pad_value: float | None = 0.0,
                    warmup: int = 3, overflow: str = "eager", no_grad: bool = True, clone_outputs: bool = False,
                    eager_fallback: bool = False, measure_memory: bool = False,
                    check_weights: bool = True) -> BucketedGraphs:
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
    - ``measure_memory``: record in ``capture_log`` what each bucket's capture added to reserved memory
      (``pool_growth_bytes``). That needs an empty allocator cache before each capture, so it synchronizes and
      calls ``torch.cuda.empty_cache()`` once per bucket; off by default, the kit adds no such call of its own.
      (``torch.cuda.graph`` itself synchronizes and empties the cache as each capture begins, in every PyTorch
      release the kit supports: that part is PyTorch's.)
    - ``check_weights``: the first bucket's last warm-up call (no extra call: ``fn`` runs ``warmup`` times per bucket,
      at least once) records what ``fn`` really reads, where each tensor is held and the modules' train/eval mode
      (``guard.py``, as :func:`graphed.capture` does); a replaced or re-typed tensor (``model.half()``,
      ``model.weight = ...``) or a module in the other mode raises ``StaleGraphError`` instead of replaying stale or
      released memory, or the other mode. The guard is ``serve.guard``; ``guard.weights_fixed(serve)`` checks once
      per block instead.

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
        raise graphed.NoCudaError(graphed.NO_CUDA_MESSAGE)
    if cuda:
        for i, a in enumerate(sample_args):
            if not a.is_cuda:
                raise ValueError(f"sample argument {i} is on {a.device}. A CUDA graph can only read GPU memory. "
                                 "Fix: move it to the GPU before capturing, e.g. x.cuda().")
    mode = "graph" if cuda else "eager"
    if not isinstance(measure_memory, bool):
        raise TypeError(f"measure_memory must be True or False, got {measure_memory!r}.")
    bg = BucketedGraphs(fn, sizes, dim, pad_value, overflow, mode, no_grad, clone_outputs, measure_memory)
    bg._init_buffers(sample_args)
    if mode == "graph":
        bg._capture(warmup, pool, check_weights)
    else:
        for b in reversed(sizes):  # validate every bucket's outputs once, as a capture would
            bg._run_eager_bucket(b)
    return bg
