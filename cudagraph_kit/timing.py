"""Trustworthy timings: variants timed round-robin in one window, budgets by time, medians with their spread,
speedups as the median of per-round ratios, and the GPU-busy floor read from the profiler after all timings.

Two things make GPU timings lie, and this module guards against both:

- **Drift.** A shared host's speed drifts by a third within minutes. Host-bound (eager) times move with it; graph
  replays barely do. So ``compare`` times its variants round-robin, one sample of each per round with the order
  rotated, and reports each speedup as the median of the per-round ratios with their quartiles: two variants are
  always compared within the same few milliseconds.
- **Profiler residue.** A ``torch.profiler`` session leaves CUPTI attached, and every later kernel launch in the
  process is slower (a third or more) unless CUPTI is torn down. So ``compare`` measures floors only after all
  its timings, and ``gpu_time`` asks for the teardown (``TEARDOWN_CUPTI=1``, honoured by the profiler from CUDA
  12.6; ``graphed.profiler_session``), so that timings taken after it stay clean. The variable stays set once
  the kit has profiled: with CUPTI torn down, every later session needs it (the docstring there says why).

The **floor** (``floor_us``) is the time the GPU spends running a graph's kernels and copies per call: the union
of their intervals in a ``torch.profiler`` trace of graph replays. It is given for rows that ran entirely as CUDA
graph replays (plus copies, and the two RNG-state fills PyTorch launches before replaying a graph that draws random
numbers) only: the profiler records kernels launched one by one from Python longer than they run (up to several
times for small kernels), so the busy time of an eager row, or of a row that launches more kernels outside its
graphs (``eager_kernels_per_call``), is no floor. ``kernels_per_call`` and ``copies_per_call`` are counted
for every row.

Example::

    from cudagraph_kit.timing import compare
    df = compare({"eager": lambda: gelu(x), "graph": g.replay}, case="small")
    print(df[["variant", "median_us", "speedup", "speedup_lo", "speedup_hi", "floor_us", "vs_floor", "note"]])

To use this file in a project of yours, copy the kit's ``graphed.py`` with it (its profiler sessions go through
``graphed.profiler_session``).
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch


if __package__:
    from . import graphed as _graphed
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed as _graphed  # type: ignore[import-not-found, no-redef]
profiler_session = _graphed.profiler_session

__all__ = ["Timing", "GpuTime", "timeit", "gpu_time", "device_time", "compare", "busy_time", "NOISY_SPREAD"]

NOISY_SPREAD = 0.10  # a variant whose IQR exceeds this fraction of its median gets a note in the table


def busy_time(intervals, end=None) -> float:
    """How long the GPU was busy: the length of the union of ``(start, end)`` intervals (a profile's kernels and
    copies, which overlap), each clipped at ``end`` if given. ``busy_time([(0, 10), (5, 15), (20, 30)])`` -> 25.
    Used by :func:`gpu_time` (the floor) and ``show`` (a timeline's caption)."""
    total, start, stop = 0.0, None, None
    for s, e in sorted((s, e if end is None else min(e, end)) for s, e in intervals if end is None or s < end):
        if stop is None or s > stop:
            total += 0.0 if stop is None else stop - start
            start, stop = s, e
        else:
            stop = max(stop, e)
    return total + (0.0 if stop is None else stop - start)



@dataclass
class Timing:
    """Per-call times in microseconds: one entry of ``samples_us`` per sample of ``calls`` calls."""
    median_us: float
    iqr_us: float
    min_us: float
    max_us: float
    samples_us: list = field(repr=False)
    clock: str
    event_median_us: float | None = None
    calls: int = 0
    units_per_call: int = 1


@dataclass
class GpuTime:
    """What the GPU did per call, from profiler records: busy time (union of activity intervals) and counts."""
    busy_us: float
    kernels: float
    copies: float
    graph_launches: float
    eager_launches: float = 0.0  # kernels launched one by one from the host (not from a graph), per call
    top: list = field(repr=False, default_factory=list)


def _units(fn, units_per_call):
    if units_per_call is not None:
        return units_per_call
    owner = getattr(fn, "__self__", fn)  # a bound method such as g.replay counts like g
    return getattr(owner, "calls_per_graph", 1)


def _quartiles(xs):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


_RETIMES = 2  # extra batches _calls_for may time after its warm-up when two batches disagree


def _calls_for(fn, args, sample_ms: float, warmup_ms: float) -> int:
    """Warm ``fn`` up for about ``warmup_ms`` (at least 2 calls) and return the calls that fill ``sample_ms``.

    The count comes from the last batch of calls, once two batches in a row agree on the time per call (within
    1.5x). A capture, a compile or an autotune inside a batch makes it disagree with the next, so up to two
    more batches are timed: a one-off in the estimate would pick one call per sample, and a one-call sample
    adds the synchronize to a fast call.
    """
    n, spent, previous, retimes = 1, 0.0, None, 0
    while True:
        _sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        _sync()
        dt = time.perf_counter() - t0
        spent += dt
        per_call = dt / n
        steady = previous is not None and max(per_call, previous) <= 1.5 * min(per_call, previous)
        if spent * 1e3 >= warmup_ms and n >= 2:
            if steady or retimes == _RETIMES:
                break
            retimes += 1
        previous = per_call
        n = min(n * 2, 1_000_000)
    return max(1, min(100_000, round(sample_ms * 1e-3 / per_call)))


class _Sampler:
    """Takes one timed sample of ``calls`` calls: host clock with a synchronize, and CUDA events on the same span."""

    def __init__(self, fn, args, calls, units):
        self.fn, self.args, self.calls, self.units = fn, args, calls, units
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.wall, self.events = [], []

    def sample(self):
        fn, args = self.fn, self.args
        _sync()
        if self.cuda:
            self.start.record()
        t0 = time.perf_counter()
        for _ in range(self.calls):
            fn(*args)
        if self.cuda:
            self.end.record()
        _sync()
        t1 = time.perf_counter()
        n = self.calls * self.units
        self.wall.append((t1 - t0) * 1e6 / n)
        if self.cuda:
            self.events.append(self.start.elapsed_time(self.end) * 1e3 / n)

    def timing(self) -> Timing:
        q1, q3 = _quartiles(self.wall)
        return Timing(median_us=statistics.median(self.wall), iqr_us=q3 - q1, min_us=min(self.wall),
                      max_us=max(self.wall), samples_us=list(self.wall),
                      clock="wall+sync" if self.cuda else "wall (CPU)",
                      event_median_us=statistics.median(self.events) if self.events else None,
                      calls=self.calls, units_per_call=self.units)


def timeit(fn, *args, calls: int | None = None, samples: int = 7, warmup: int | None = None,
           sample_ms: float = 20.0, warmup_ms: float = 50.0, units_per_call: int | None = None) -> Timing:
    """Time ``fn(*args)``: the median per-call time over ``samples`` samples.

    Each sample is ``calls`` back-to-back calls between two synchronizes (CUDA events time the same span:
    ``event_median_us``). With ``calls=None`` the calls per sample are chosen so that a sample lasts about
    ``sample_ms``, after a warm-up of about ``warmup_ms`` (or exactly ``warmup`` calls when given).
    ``units_per_call`` divides the time (default: ``fn.calls_per_graph`` for a graph holding several calls).

    Example::

        t = timeit(torch.relu, x)
        print(f"{t.median_us:.1f} µs ± {t.iqr_us:.1f} (IQR) over {t.calls} calls per sample")
    """
    if (calls is not None and calls < 1) or samples < 1:
        raise ValueError(f"calls and samples must be >= 1, got calls={calls}, samples={samples}.")
    units = _units(fn, units_per_call)
    if warmup is not None:
        for _ in range(warmup):
            fn(*args)
    if calls is None:
        calls = _calls_for(fn, args, sample_ms, warmup_ms if warmup is None else 0.0)
    sampler = _Sampler(fn, args, calls, units)
    for _ in range(samples):
        sampler.sample()
    return sampler.timing()


def _profile(fn, args, calls):
    from torch.profiler import ProfilerActivity, profile

    if hasattr(torch.cuda, "_sleep"):
        # Keep the GPU busy while the session starts: the calls then queue up behind this spin kernel and run
        # back to back. (Seen on an H100 with CUPTI teardown on: a session that starts on an idle GPU right after
        # another session can record no GPU activity at all.)
        torch.cuda._sleep(20_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the profiler's notes on event cycles; irrelevant here
        # Without CUPTI teardown, CUPTI stays attached after the session and slows every later launch in the process.
        with profiler_session(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
        return prof.events()


def gpu_time(fn, *args, calls: int = 20, warmup: int = 3, units_per_call: int | None = None) -> GpuTime | None:
    """GPU-busy time and kernel/copy counts per call, read from ``torch.profiler`` (None without CUDA).

    Busy time is the union of the intervals in which a kernel, memcpy or memset ran. For graph replays that is
    the floor a graph can approach; kernels launched one by one from Python are recorded longer than they run,
    so their busy time is no floor (``compare`` leaves it out). ``graph_launches`` counts ``cudaGraphLaunch``
    calls, so a table can say truthfully whether a variant ran as a graph. Call it after your timings: see the
    module docstring on profiler residue.

    Example::

        g = gpu_time(graphed.replay)
        print(g.kernels, "kernels,", g.busy_us, "µs busy per call")
    """
    if not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType

    units = _units(fn, units_per_call)
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    events = None
    for _attempt in range(2):  # a session that saw no GPU activity at all is tried once more
        events = _profile(fn, args, calls)
        if any(e.device_type == DeviceType.CUDA for e in events):
            break
    intervals, kernels, copies, launches, eager = [], 0, 0, 0, 0
    per_name = defaultdict(float)
    for e in events:
        if e.device_type == DeviceType.CUDA:
            if "spin_kernel" in e.name:  # our own _sleep
                continue
            intervals.append((e.time_range.start, e.time_range.end))
            per_name[e.name] += e.time_range.elapsed_us()
            if e.name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
        elif "GraphLaunch" in e.name:
            launches += 1
        elif e.name.startswith(_KERNEL_LAUNCH_CALLS):
            eager += 1
    n = calls * units
    top = sorted(((k, v / n) for k, v in per_name.items()), key=lambda kv: -kv[1])[:5]
    return GpuTime(busy_us=busy_time(intervals) / n, kernels=kernels / n, copies=copies / n,
                   graph_launches=launches / calls, eager_launches=eager / n, top=top)


_KERNEL_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")  # name prefixes


_SPIN_CYCLES_PER_US: dict = {}


def _spin_cycles_per_us() -> float:
    dev = torch.cuda.current_device()
    if dev not in _SPIN_CYCLES_PER_US:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(5_000_000)
        end.record()
        torch.cuda.synchronize()
        _SPIN_CYCLES_PER_US[dev] = 5_000_000 / (start.elapsed_time(end) * 1e3)
    return _SPIN_CYCLES_PER_US[dev]


def device_time(fn, *args, calls: int = 10, host_us: float | None = None) -> tuple[float, bool] | None:
    """GPU time per call with the calls queued back to back, from CUDA events (no profiler): ``(us, queued)``.

    A spin kernel holds the GPU while the host launches ``calls`` calls behind it, so the events measure how long
    the GPU needs for them without waiting on the host. ``queued`` is False when the host was still launching after
    the spin ended (then the time includes some host waiting and is an upper bound). For work launched kernel by
    kernel this includes the GPU's own gap between queued kernels (about a microsecond each); it is what a graph
    of the same kernels can approach, not the profiler's busy time. None without CUDA.

    Example::

        us, queued = device_time(lambda: gelu(x))
    """
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_sleep"):
        return None
    if host_us is None:
        host_us = timeit(fn, *args, samples=3).median_us
    fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int((2.0 * calls * host_us + 1000.0) * _spin_cycles_per_us()))
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    queued = not start.query()  # the GPU had not reached the calls when the host finished launching them
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, queued


def _executed_as(fn, gpu: GpuTime | None) -> str:
    owner = getattr(fn, "__self__", fn)
    mode = getattr(owner, "mode", None)
    if mode == "eager" or not torch.cuda.is_available():
        return "eager"
    if gpu is not None:
        return "cuda graph" if gpu.graph_launches > 0 else "eager"
    if mode == "graph" or isinstance(owner, torch.cuda.CUDAGraph):
        return "cuda graph"
    return "unknown"


def _notes(t: Timing, floor_us: float, gpu: GpuTime | None, executed_as: str, pure_graph: bool) -> str:
    notes = []
    if t.median_us > 0 and t.iqr_us > NOISY_SPREAD * t.median_us:
        notes.append(f"noisy: IQR {100 * t.iqr_us / t.median_us:.0f}% of median")
    if floor_us == floor_us and t.median_us < floor_us:  # not NaN, and below
        notes.append(f"median {100 * (1 - t.median_us / floor_us):.1f}% below floor: the floor is profiled in a "
                     "separate run, so it carries that run's spread")
    if gpu is not None and executed_as == "cuda graph" and gpu.kernels + gpu.copies == 0:
        notes.append("profiler saw no GPU work: floor not measured")
    if gpu is not None and executed_as == "cuda graph" and not pure_graph:
        notes.append(f"part eager ({gpu.eager_launches:.0f} kernels/call launched outside graphs): no floor")
    return "; ".join(notes)


def compare(variants: dict, *args, case: str = "", calls: int | None = None, samples: int = 15,
            warmup: int | None = None, sample_ms: float = 20.0, floor: bool = True):
    """Time each ``{name: fn}`` (called as ``fn(*args)``) round-robin and return a pandas DataFrame, one row each.

    The first variant is the baseline. Every variant is warmed up, then ``samples`` rounds are taken: each round
    times one sample of every variant, in an order rotated by one each round, so slow drift of the host hits all
    variants alike. With ``calls=None`` each variant gets as many calls per sample as fill about ``sample_ms``.
    Floors and kernel counts are read from the profiler only after all timings.

    Columns: case, variant, executed_as ("cuda graph" when the profiler saw a cudaGraphLaunch, else "eager"),
    median_us, iqr_us, min_us, max_us, spread_pct (IQR / median), speedup (median over rounds of baseline sample /
    variant sample), speedup_lo, speedup_hi (quartiles of those ratios), event_median_us (CUDA events around the
    same calls), floor_us (GPU-busy time per call, rows that ran entirely as graph replays only), kernels_per_call,
    copies_per_call (memcpy and memset), eager_kernels_per_call (kernels launched outside any graph), vs_floor (median / floor), note (noisy spread, median below floor, ...), calls, clock.
    A variant named "...graph..." that ran eagerly becomes "<name> (eager fallback)".

    Example::

        df = compare({"eager": lambda: f(x), "graph": g.replay}, case="small")
    """
    import pandas as pd

    if not variants:
        raise ValueError("compare() needs at least one {name: callable}.")
    if samples < 1 or (calls is not None and calls < 1):
        raise ValueError(f"calls and samples must be >= 1, got calls={calls}, samples={samples}.")
    names = list(variants)
    samplers = {}
    for name in names:  # warm-up and calibration, one variant after the other
        fn = variants[name]
        if warmup is not None:
            for _ in range(warmup):
                fn(*args)
        n = calls if calls is not None else _calls_for(fn, args, sample_ms, 50.0 if warmup is None else 0.0)
        samplers[name] = _Sampler(fn, args, n, _units(fn, None))
    for r in range(samples):  # round-robin, order rotated each round
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samplers[name].sample()
    timings = {name: s.timing() for name, s in samplers.items()}
    gpus = {name: gpu_time(variants[name], *args, calls=_profile_calls(timings[name]), warmup=1) if floor else None
            for name in names}

    base = timings[names[0]].samples_us
    rows = []
    for name in names:
        t, g, fn = timings[name], gpus[name], variants[name]
        executed_as = _executed_as(fn, g)
        ratios = [b / v for b, v in zip(base, t.samples_us)]
        lo, hi = _quartiles(ratios)
        # A replay of a graph that draws random numbers first fills two RNG-state tensors (seed and offset) with
        # two small kernels of PyTorch's own (CUDAGeneratorState::replay_prologue): part of the replay, allowed.
        pure_graph = (g is not None and executed_as == "cuda graph"
                      and g.eager_launches * t.units_per_call <= 2 * g.graph_launches)
        floor_us = g.busy_us if pure_graph and g.kernels + g.copies > 0 else float("nan")
        label = f"{name} (eager fallback)" if executed_as == "eager" and "graph" in name.lower() else name
        rows.append({
            "case": case, "variant": label, "executed_as": executed_as,
            "median_us": t.median_us, "iqr_us": t.iqr_us, "min_us": t.min_us, "max_us": t.max_us,
            "spread_pct": 100 * t.iqr_us / t.median_us if t.median_us else float("nan"),
            "speedup": statistics.median(ratios), "speedup_lo": lo, "speedup_hi": hi,
            "event_median_us": t.event_median_us if t.event_median_us is not None else float("nan"),
            "floor_us": floor_us,
            "kernels_per_call": g.kernels if g else float("nan"),
            "copies_per_call": g.copies if g else float("nan"),
            "eager_kernels_per_call": g.eager_launches if g else float("nan"),
            "vs_floor": t.median_us / floor_us if floor_us == floor_us else float("nan"),
            "note": _notes(t, floor_us, g, executed_as, pure_graph),
            "calls": t.calls, "clock": t.clock,
        })
    return pd.DataFrame(rows)


def _profile_calls(t: Timing) -> int:
    """Enough calls for stable counts, few enough that a profiled run of slow work stays short (~0.2 s)."""
    return int(max(3, min(50, 2e5 / max(t.median_us * t.units_per_call, 1.0))))
