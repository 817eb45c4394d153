"""Where a rerun will land: prediction intervals from several timing windows, and the verdict they support.

One window's quartiles say how much that window wobbled, not where the next run will land: on a shared GPU host,
eager (host-bound) times move by 0.5-2x between runs while graph replays hardly move. And the min-max of ``n``
runs holds one more run only ``(n-1)/(n+1)`` of the time (half the time for three). So a speedup worth quoting
is measured in several windows separated in time (or in several processes), and published with a *prediction
interval*: the range that one more window, taken the same way, falls in with the stated probability. It is
computed on logarithms (speedups are ratios), with Student's t for the few windows one can afford.

A comparison is then a **verdict**, not a reading: ``holds`` when the whole interval clears the threshold,
``fails`` when the whole interval is on the other side, ``unclear`` when it straddles it (say "no clear
difference").

Example::

    from cudagraph_kit.timing import compare
    from cudagraph_kit.intervals import combine_windows, verdict
    windows = [compare({"eager": eager, "graph": g.replay}, case="small") for _ in range(5)]  # minutes apart
    table = combine_windows(windows)            # one row per (case, variant): speedup, speedup_pi_lo/hi
    row = table.set_index("variant").loc["graph"]
    print(verdict(row.speedup_pi_lo, row.speedup_pi_hi, above=1.0))   # 'holds': the graph is faster

Needs only the standard library (and pandas for ``combine_windows``); Student's t quantiles come from SciPy
where it is installed, else from the standard library to the same digits.
"""
from __future__ import annotations

import math
import statistics

__all__ = ["prediction_interval", "verdict", "combine_windows", "ratio_across_windows", "stops_clearing", "LEVEL"]

LEVEL = 0.90  # the default: one more window lands inside 9 times out of 10

LEVELS = (0.90, 0.95)  # the two-sided levels offered


def _t_quantile(level: float, df: int) -> float:
    """Student's t quantile for a two-sided ``level`` (0.90 -> t(0.95, df)): SciPy's ``t.ppf`` where SciPy is
    installed, else the same number from :func:`_t_ppf` (the standard library alone)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {list(LEVELS)}, got {level}.")
    if df < 1 or int(df) != df:
        raise ValueError(f"Student's t needs a whole number of degrees of freedom >= 1, got {df}.")
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return _t_ppf(0.5 + level / 2, int(df))
    return float(student_t.ppf(0.5 + level / 2, int(df)))


def _t_ppf(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom, to double precision: the
    root of ``P(T > t) = 1 - q``, where ``P(T > t) = I_x(df/2, 1/2) / 2`` at ``x = df / (df + t^2)`` (the
    regularized incomplete beta), found by bisection on ``t``."""
    if not 0.5 < q < 1:
        raise ValueError(f"_t_ppf takes 0.5 < q < 1, got {q}.")
    if df == 1:
        return math.tan(math.pi * (q - 0.5))            # Cauchy
    if df == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))  # closed form
    tail = 2 * (1 - q)

    def upper(t):  # 2 * P(T > t)
        return _betainc(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t))

    lo, hi = 0.0, 1.0
    while upper(hi) > tail:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if upper(mid) > tail else (lo, mid)
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float, one_minus_x: float) -> float:
    """The regularized incomplete beta ``I_x(a, b)`` (``1 - x`` passed apart, so that x near 1 keeps its digits):
    the continued fraction of Numerical Recipes (``betacf``, modified Lentz), on the side where it converges."""
    if x <= 0:
        return 0.0
    if one_minus_x <= 0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log(one_minus_x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, one_minus_x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    return h


def prediction_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """The range one more value, measured like ``values`` (one per window or process), falls in with
    probability ``level``: ``exp(mean ± t * sd * sqrt(1 + 1/n))`` of the logarithms. Needs two or more positive
    values; with fewer it returns ``(nan, nan)``, which every verdict reads as ``unclear``.

    Example::

        lo, hi = prediction_interval([6.1, 6.8, 5.4])     # speedups of three windows
    """
    xs = [float(v) for v in values if v == v]  # drop NaN
    if any(v <= 0 for v in xs):
        raise ValueError(f"prediction_interval takes positive values (times or speedups), got {sorted(xs)[:3]}...")
    if len(xs) < 2:
        return float("nan"), float("nan")
    logs = [math.log(v) for v in xs]
    n = len(logs)
    half = _t_quantile(level, n - 1) * statistics.stdev(logs) * math.sqrt(1 + 1 / n)
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)


def verdict(lo: float, hi: float, above: float = 1.0) -> str:
    """``holds`` if the interval ``[lo, hi]`` lies above ``above``, ``fails`` if it lies at or below it,
    ``unclear`` if it straddles it or is unknown (NaN)."""
    if not (lo == lo and hi == hi):
        return "unclear"
    if lo > hi:
        raise ValueError(f"an interval needs lo <= hi, got [{lo}, {hi}].")
    if lo > above:
        return "holds"
    if hi <= above:
        return "fails"
    return "unclear"


# compare() columns that describe one window's own spread: they say nothing about a rerun, so they are not carried
_WITHIN_WINDOW = ("iqr_us", "min_us", "max_us", "spread_pct", "speedup_lo", "speedup_hi", "note", "calls", "clock")


def combine_windows(frames, level: float = LEVEL):
    """Several ``compare()`` tables of the same variants (one per window) → one row per (case, variant).

    Columns: case, variant, windows, median_us (median of the windows' medians), median_pi_lo/hi, speedup (median
    of the windows' speedups), speedup_pi_lo/hi (prediction intervals, ``level``), and ``speedup_lo``/``speedup_hi``
    set to that prediction interval (so a saved table publishes it), window_speedups (the values, ";"-joined),
    event_median_us (median of the windows'), vs_floor (median_us / floor_us), and every other column
    (executed_as, floor_us, kernel counts, your own columns) from the first window that has a value (an
    ``executed_as`` of "unknown", from a window without the profiler, is no value): time
    ``floor=True`` (the profiler) in the last window only, after all timings. One window's own spread (iqr_us,
    quartiles, notes) is dropped.
    """
    import pandas as pd

    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        raise ValueError("combine_windows needs at least one compare() table.")
    for f in frames:
        missing = {"case", "variant", "median_us", "speedup"} - set(f.columns)
        if missing:
            raise ValueError(f"combine_windows takes compare() tables; this one lacks {sorted(missing)}.")
    keys = list(dict.fromkeys(zip(frames[0].case, frames[0].variant)))
    carried = [c for c in dict.fromkeys(c for f in frames for c in f.columns)
               if c not in ("case", "variant", "median_us", "speedup", "event_median_us", "vs_floor")
               and c not in _WITHIN_WINDOW]
    rows = []
    for case, variant in keys:
        picked = [f[(f.case == case) & (f.variant == variant)] for f in frames]
        picked = [p.iloc[0] for p in picked if len(p)]
        medians = [p.median_us for p in picked]
        speedups = [p.speedup for p in picked]
        m_lo, m_hi = prediction_interval(medians, level)
        s_lo, s_hi = prediction_interval(speedups, level)
        row = {"case": case, "variant": variant, "windows": len(picked),
               "median_us": statistics.median(medians), "median_pi_lo": m_lo, "median_pi_hi": m_hi,
               "speedup": statistics.median(speedups), "speedup_pi_lo": s_lo, "speedup_pi_hi": s_hi,
               "speedup_lo": s_lo, "speedup_hi": s_hi,
               "window_speedups": ";".join(f"{s:.4g}" for s in speedups)}
        events = [p.event_median_us for p in picked if not _missing(p.get("event_median_us"))]
        if events:
            row["event_median_us"] = statistics.median(events)
        for c in carried:
            values = [p[c] for p in picked if c in p.index and not _missing(p[c])]
            row[c] = values[0] if values else next((p[c] for p in picked if c in p.index), None)  # NaN stays NaN
        floor = row.get("floor_us")
        if floor is not None and not _missing(floor) and floor > 0:
            row["vs_floor"] = row["median_us"] / floor
        elif any("vs_floor" in f.columns for f in frames):
            row["vs_floor"] = float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def ratio_across_windows(frames, a, b, level: float = LEVEL) -> dict:
    """How many times slower ``a`` is than ``b`` (``a``'s median / ``b``'s), window by window, with the prediction
    interval of that ratio: the way to compare two variants neither of which is the baseline (fp16 against bf16,
    SGD against Adam). ``a`` and ``b`` are ``(case, variant)`` pairs found in each of ``frames`` (the per-window
    ``compare()`` tables, before ``combine_windows``); time both in the same ``compare()`` call when you can, so
    each window's ratio comes from interleaved rounds.

    Returns ``{"ratio": median of the windows' ratios, "lo", "hi": the interval, "windows": n, "values": [...]}``;
    ``ratio > 1`` means ``a`` is slower, i.e. ``b`` is faster by that factor.

    Example::

        r = ratio_across_windows(windows, ("bs64", "fp32 graph"), ("bs64", "bf16 graph"))
        verdict(r["lo"], r["hi"], above=1.0)     # 'holds': bf16 is faster than fp32 at batch 64
    """
    values = []
    for f in frames:
        if f is None or not len(f):
            continue
        rows = [f[(f.case == case) & (f.variant == variant)] for case, variant in (a, b)]
        if all(len(r) for r in rows):
            ta, tb = float(rows[0].median_us.iloc[0]), float(rows[1].median_us.iloc[0])
            if ta > 0 and tb > 0:
                values.append(ta / tb)
    if not values:
        raise ValueError(f"ratio_across_windows found {a} and {b} together in none of the {len(frames)} tables; "
                         f"pass the per-window compare() tables and (case, variant) pairs they contain.")
    lo, hi = prediction_interval(values, level)
    return {"ratio": statistics.median(values), "lo": lo, "hi": hi, "windows": len(values), "values": values}


def stops_clearing(points, above: float) -> dict:
    """Where a sweep stops clearing a threshold, read from verdicts, never from point estimates.

    ``points``: ``(x, lo, hi)`` per sweep point (e.g. size, speedup_lo, speedup_hi), in any order. Returns
    ``{"from": x, "unclear_before": x2}``: ``from`` is the smallest x from which every interval lies at or below
    ``above`` (verdict ``fails`` there and at every larger x; None if the largest point does not fail), and
    ``unclear_before`` the point just below ``from`` when its interval straddles ``above`` (no verdict there;
    else None).

    Example::

        stops_clearing([(2**20, 1.5, 2.0), (2**22, 0.9, 1.4), (2**24, 1.0, 1.05)], above=1.10)
        # {'from': 16777216, 'unclear_before': 4194304}
    """
    pts = sorted((float(x), lo, hi) for x, lo, hi in points)
    verdicts = [verdict(lo, hi, above) for _, lo, hi in pts]
    start = len(pts)
    while start and verdicts[start - 1] == "fails":
        start -= 1
    if start == len(pts):
        return {"from": None, "unclear_before": None}
    before = pts[start - 1][0] if start and verdicts[start - 1] == "unclear" else None
    as_int = lambda x: int(x) if x is not None and float(x).is_integer() else x  # noqa: E731
    return {"from": as_int(pts[start][0]), "unclear_before": as_int(before)}


def _missing(value) -> bool:
    """No value: None, NaN, or compare()'s "unknown" executed_as of a window timed without the profiler."""
    return value is None or (isinstance(value, float) and value != value) or (isinstance(value, str) and value == "unknown")
