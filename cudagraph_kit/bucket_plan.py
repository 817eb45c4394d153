"""Choose bucket sizes for variable shapes: :func:`plan_buckets` from the request sizes you observed.

- :func:`plan_buckets` -> :class:`BucketPlan`: the sizes that minimise the expected padded work (or padded time,
  given measured costs) under a limit on graphs and/or memory; :func:`evaluate_buckets` scores any sizes.
- :func:`measure_bucket_costs` gives the planner the GPU time of each size, measured on a
  ``capture_buckets(...)`` result (``bucket_graphs.py``); :func:`interpolate` turns a few measured points into a cost.

Example::

    from cudagraph_kit.bucket_plan import plan_buckets, evaluate_buckets

    plan = plan_buckets([3, 5, 5, 9, 30, 31], max_graphs=3)
    print(plan.sizes, evaluate_buckets([3, 5, 9], plan.sizes)["pad_fraction"])

It needs ``torch`` and numpy; :func:`measure_bucket_costs` also needs the kit's ``timing.py`` beside it.
"""
from __future__ import annotations

import bisect
import importlib.util
import os
import statistics
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import torch


__all__ = ["BucketPlan", "plan_buckets", "evaluate_buckets", "interpolate", "measure_bucket_costs", "BucketCosts"]

MiB = 2 ** 20


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
    upper_bounds: tuple = ()  # sizes whose median includes host waiting (the host outran every spin): upper bounds


def measure_bucket_costs(serve, *sample_args: torch.Tensor, sizes: Iterable[int] | None = None,
                         rounds: int = 5, calls: int = 10) -> dict:
    """What a request of each size costs a busy server: ``{size: µs}``, for :func:`plan_buckets`' ``cost``.

    When requests queue up behind each other, a bucket costs its **GPU time**; the wall time of one request alone
    is mostly the host's work for small buckets and hides how the GPU time grows with the rows. So each size is
    served ``calls`` times queued behind a spin kernel and timed with CUDA events (``timing.device_time``),
    round-robin over the sizes for ``rounds`` rounds (slow drift hits every size alike); the median per size is
    returned as a :class:`BucketCosts`. A measurement where the host was still launching when the spin ended
    (``device_time``'s ``queued`` is False) is taken again behind a longer spin; sizes where that never worked are
    in ``upper_bounds``, with a warning. Its ``pad_us`` is what a padded request costs on top of its bucket: the
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
    if __package__:
        from . import timing  # only here: the planner itself needs no timing.py
    else:  # this file copied beside timing.py, outside the package: that timing.py, never another on sys.path
        _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("timing")
        if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
            raise ImportError(f"{os.path.basename(__file__)} needs the kit's timing.py from its own folder {_here}, "
                              f"but `import timing` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                              "cudagraph_kit/timing.py beside it, that folder first on sys.path.")
        import timing  # type: ignore[import-not-found, no-redef]
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
    times, waited = {k: [] for k in keys}, Counter()
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            for spin_for in (host[k], 4 * host[k], 16 * host[k]):  # a longer spin when the host outran it
                us, queued = timing.device_time(fns[k], calls=calls, host_us=spin_for)
                if queued:
                    break
            times[k].append(us)
            waited[k] += not queued
    med = {k: float(statistics.median(t)) for k, t in times.items()}
    costs.update({b: med[b] for b in sizes})
    costs.upper_bounds = tuple(b for b in sizes if 2 * waited[b] >= rounds)
    if costs.upper_bounds:
        warnings.warn(f"measure_bucket_costs: for sizes {list(costs.upper_bounds)} the host was still launching the "
                      "calls when the GPU reached them, even behind a 16x longer spin, so their cost includes host "
                      "waiting (an upper bound). Fix: measure again on a quieter machine.", stacklevel=2)
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
