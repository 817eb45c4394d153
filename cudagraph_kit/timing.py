"""Trustworthy timings: warm-up, synchronize, many calls per sample, several samples, median and spread.

``timeit`` measures the end-to-end time per call (host clock around N calls plus a synchronize, and CUDA
events around the same region when a GPU is present). ``gpu_time`` reads ``torch.profiler`` to find how long
the GPU was actually busy per call and how many kernels it ran: the floor a CUDA graph can approach.
``compare`` puts several variants side by side in a pandas DataFrame.

Example::

    from cudagraph_kit.timing import compare
    df = compare({"eager": lambda: gelu(x), "graph": g.replay}, case="small")
    print(df[["variant", "median_us", "speedup", "floor_us", "vs_floor"]])
"""
from __future__ import annotations

import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import torch

__all__ = ["Timing", "GpuTime", "timeit", "gpu_time", "compare"]


@dataclass
class Timing:
    """Per-call times in microseconds over ``samples`` samples of ``calls`` calls each."""
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


def timeit(fn, *args, calls: int = 100, samples: int = 7, warmup: int = 10, units_per_call: int | None = None) -> Timing:
    """Time ``fn(*args)``: median per-call time over ``samples`` samples of ``calls`` calls.

    Each sample starts after a synchronize and ends with one, so queued GPU work is counted. With CUDA the
    same region is also timed with CUDA events (``event_median_us``). ``units_per_call`` divides the time
    (default: ``fn.calls_per_graph`` for a graph holding several calls, else 1).

    Example::

        t = timeit(torch.relu, x, calls=1000)
        print(f"{t.median_us:.1f} µs ± {t.iqr_us:.1f} (IQR), clock={t.clock}")
    """
    if calls < 1 or samples < 1:
        raise ValueError(f"calls and samples must be >= 1, got calls={calls}, samples={samples}.")
    units = _units(fn, units_per_call)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn(*args)
    sync()
    wall, events = [], []
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(samples):
        if cuda:
            start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        if cuda:
            end.record()
        sync()
        t1 = time.perf_counter()
        wall.append((t1 - t0) * 1e6 / (calls * units))
        if cuda:
            events.append(start.elapsed_time(end) * 1e3 / (calls * units))
    q1, q3 = _quartiles(wall)
    return Timing(
        median_us=statistics.median(wall), iqr_us=q3 - q1, min_us=min(wall), max_us=max(wall),
        samples_us=wall, clock="wall+sync" if cuda else "wall (CPU)",
        event_median_us=statistics.median(events) if events else None, calls=calls, units_per_call=units,
    )


def _busy_union(intervals):
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def gpu_time(fn, *args, calls: int = 20, warmup: int = 3, units_per_call: int | None = None) -> GpuTime | None:
    """GPU-busy time and kernel count per call, read from ``torch.profiler`` (None without CUDA).

    Busy time is the union of the intervals in which a kernel, memcpy or memset ran: the floor that
    removing all launch overhead (a CUDA graph) could approach. ``graph_launches`` counts cudaGraphLaunch
    calls, so a table can say truthfully whether a variant ran as a graph.

    Example::

        g = gpu_time(lambda: gelu(x))
        print(g.kernels, "kernels,", g.busy_us, "µs busy per call")
    """
    if not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    units = _units(fn, units_per_call)
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the profiler's notes on event cycles; irrelevant here
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
        events = prof.events()
    intervals, kernels, copies, launches = [], 0, 0, 0
    per_name = defaultdict(float)
    for e in events:
        if e.device_type == DeviceType.CUDA:
            intervals.append((e.time_range.start, e.time_range.end))
            per_name[e.name] += e.time_range.elapsed_us()
            if e.name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
        elif "GraphLaunch" in e.name:
            launches += 1
    n = calls * units
    top = sorted(((k, v / n) for k, v in per_name.items()), key=lambda kv: -kv[1])[:5]
    return GpuTime(busy_us=_busy_union(intervals) / n, kernels=kernels / n, copies=copies / n,
                   graph_launches=launches / calls, top=top)


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


def compare(variants: dict, *args, case: str = "", calls: int = 100, samples: int = 7, warmup: int = 10,
            floor: bool = True):
    """Time each ``{name: fn}`` (called as ``fn(*args)``) and return a pandas DataFrame, one row per variant.

    Columns: case, variant, executed_as, median_us (host clock), iqr_us, min_us, max_us, event_median_us (CUDA
    events around the same calls), speedup (first variant's median
    over this one's), floor_us (GPU-busy per call), kernels_per_call, copies_per_call (memcpy/memset),
    vs_floor (median / floor), clock.
    ``executed_as`` comes from the profiler (a cudaGraphLaunch was seen or not), never from the name; a
    variant named "...graph..." that ran eagerly (no GPU, or an eager fallback) becomes "<name> (eager fallback)".

    Example::

        df = compare({"eager": lambda: f(x), "graph": g.replay}, case="small", calls=1000)
    """
    import pandas as pd

    if not variants:
        raise ValueError("compare() needs at least one {name: callable}.")
    rows = []
    for name, fn in variants.items():
        t = timeit(fn, *args, calls=calls, samples=samples, warmup=warmup)
        g = gpu_time(fn, *args, calls=min(calls, 50), warmup=1) if floor else None
        executed_as = _executed_as(fn, g)
        # never let an eager run carry a graph's name unqualified
        label = f"{name} (eager fallback)" if executed_as == "eager" and "graph" in name.lower() else name
        rows.append({
            "case": case, "variant": label, "executed_as": executed_as,
            "median_us": t.median_us, "iqr_us": t.iqr_us, "min_us": t.min_us, "max_us": t.max_us,
            "event_median_us": t.event_median_us if t.event_median_us is not None else float("nan"),
            "floor_us": g.busy_us if g else float("nan"), "kernels_per_call": g.kernels if g else float("nan"),
            "copies_per_call": g.copies if g else float("nan"),
            "clock": t.clock,
        })
    df = pd.DataFrame(rows)
    df.insert(df.columns.get_loc("median_us") + 1, "speedup", df["median_us"].iloc[0] / df["median_us"])
    df["vs_floor"] = df["median_us"] / df["floor_us"]
    return df
