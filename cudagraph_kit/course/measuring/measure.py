"""Time a notebook's variants one way everywhere: ``measure`` runs them over timing windows and returns a short
table with intervals and, given ``verdicts``, the experiment's verdict sentences (``verdicts.py`` beside it), so a
notebook makes one call per experiment and shows both with ``results.show(m, stem)``. Also here: what a measured
table is read for (each row's window medians, what a variant ran as, several measurements joined into one) and
``Runs``, a timed variant that says what it replays.

One policy for every notebook:

- every case is timed in each of ``windows`` windows, ``pause_s`` apart, with ``cudagraph_kit.compare`` (its
  round-robin rounds inside a window);
- the profiler (floors, kernel counts, "ran as") runs once, in the **last** window, after that window's timings;
- the windows are combined with ``cudagraph_kit.intervals.combine_windows``: each speedup is the median of the
  windows' speedups with its 90% prediction interval (where one more window lands 9 times out of 10).

More, shorter windows give narrower intervals in the same time than a few long ones: the interval's width grows
with Student's t for n - 1 degrees of freedom times sqrt(1 + 1/n), which is 3.4 for 3 windows and 2.0 for 8
(``scripts/interval_design.py`` shows it on recorded windows).

Example::

    from cudagraph_kit.course.measuring.measure import measure
    m = measure({"small": {"eager": lambda: f(x), "graph": g.replay}}, windows=8)
    results.show(m, "01_gelu")                  # the short table, then the verdicts (given ``verdicts=``)
    m.short()                                   # variant, time, speedup with its interval, floor
    lo, hi = m.interval("small", "graph")       # the graph's speedup over eager, 90% prediction interval
    m.ratio(("small", "graph"), ("small", "eager"))   # any two rows, window by window
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...intervals import combine_windows, ratio_across_windows
from ...timing import compare

__all__ = ["measure", "Measured", "SHORT_COLUMNS", "is_eager_fallback", "ran_eagerly", "window_medians", "Runs",
           "step_mode", "profiled_mode", "with_window_medians", "per_batch", "joined", "cuda_cleanup"]

SHORT_COLUMNS = ["case", "variant", "ran as", "median (µs)", "speedup", "90% interval", "floor (µs)"]


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def is_eager_fallback(label: str, cuda: bool | None = None) -> bool:
    """True when a row labelled ``label`` stands for a graph that was not built: ``compare`` marks such rows
    "(eager fallback)"; without CUDA, any variant named for a graph or reduce-overhead ran eagerly too."""
    if cuda is None:
        cuda = _cuda()
    label = str(label)
    return "(eager fallback)" in label or (not cuda and ("graph" in label.lower() or "reduce-overhead" in label))


def ran_eagerly(table, cuda: bool | None = None) -> list:
    """Per row of a timing table: True for a graph that ran eagerly (its variant or its ``executed_as`` says so),
    a row whose speedup would compare eager with eager, so tables show none. ``cuda``: whether the table was
    measured with CUDA (default: whether this process has it; a recorded GPU run's table: True)."""
    ran_as = table["executed_as"] if "executed_as" in table else table.variant
    return [is_eager_fallback(v, cuda) or is_eager_fallback(r, cuda) for v, r in zip(table.variant, ran_as)]


class _Covers:
    """What ``Measured.part`` keeps, in the shape ``verdicts.covers`` gives a verdicts function: ``cases`` and
    ``claims``, each with a ``search`` method (so ``results.show`` reads the same part of a recorded run)."""

    class _Test:
        def __init__(self, test):
            self.search = lambda name: test(str(name))

    def __init__(self, cases, claims):
        self.cases, self.claims = self._Test(cases), self._Test(claims)


@dataclass
class Measured:
    """What ``measure`` returns: the combined ``table`` (one row per case and variant, every column of
    ``combine_windows``), the per-window ``windows`` tables it came from, and the ``claims`` its ``verdicts``
    function built (kept as ``verdicts``: it names the experiment's cases and claims, ``verdicts.covers``)."""
    table: object
    windows: list = field(default_factory=list)
    claims: list = field(default_factory=list)
    verdicts: object = None

    def row(self, case: str, variant: str):
        """The combined row of ``variant`` in ``case``; the variant may be named without its "(eager fallback)"
        suffix. A clear KeyError lists what there is."""
        t = self.table
        rows = t[(t.case == case) & ((t.variant == variant) | (t.variant == f"{variant} (eager fallback)"))]
        if not len(rows):
            have = sorted(set(zip(t.case, t.variant)))
            raise KeyError(f"no row ({case!r}, {variant!r}) in this measurement; it has {have}.")
        return rows.iloc[0]

    def label(self, case: str, variant: str) -> str:
        """The variant's label as timed (with "(eager fallback)" where the graph ran eagerly)."""
        return str(self.row(case, variant).variant)

    def interval(self, case: str, variant: str) -> tuple[float, float]:
        """The 90% prediction interval of ``variant``'s speedup over its case's first variant."""
        r = self.row(case, variant)
        return float(r.speedup_pi_lo), float(r.speedup_pi_hi)

    def ratio(self, slow: tuple, fast: tuple) -> dict:
        """How many times faster ``fast`` is than ``slow`` (``(case, variant)`` pairs), window by window: the
        ``ratio_across_windows`` dict (ratio, lo, hi, windows, values)."""
        slow = (slow[0], self.label(*slow))
        fast = (fast[0], self.label(*fast))
        return ratio_across_windows(self.windows, slow, fast)

    def part(self, cases=None, claims=None) -> "Measured":
        """The part of this measurement a notebook's core shows (``results.show(m.part(...), stem)``): the rows of
        the ``cases`` whose names match (a regular expression, searched) and the ``claims`` named (a list of ids, in
        that order, or a regular expression). Without a GPU ``show`` reads the same selection from the recorded run.
        "Going further" shows the whole ``m``.

        Example::

            results.show(m.part(cases=r", SGD$", claims=["graph_beats_eager_small_sgd"]), "02_train_step")
        """
        import re

        t = self.table
        keep_case = (lambda c: True) if cases is None else (lambda c: bool(re.search(cases, str(c))))
        keep_claim = ((lambda i: True) if claims is None else (lambda i: bool(re.search(claims, str(i))))
                      if isinstance(claims, str) else (lambda i: i in set(claims)))
        said = [c for c in self.claims if keep_claim(c.claim)]
        if claims is not None and not isinstance(claims, str):
            said = [c for i in claims for c in said if c.claim == i]
        builder = self.verdicts
        whole = getattr(builder, "cases", None), getattr(builder, "claims", None)
        shown = _Covers(lambda c: (whole[0] is None or bool(whole[0].search(c))) and keep_case(c),
                        lambda i: (whole[1] is None or bool(whole[1].search(i))) and keep_claim(i))
        return Measured(t[[keep_case(c) for c in t.case]].reset_index(drop=True), self.windows, said, shown)

    def short(self, cases=None, cuda: bool | None = None):
        """The table a reader needs: case, variant, what it ran as, median time, speedup, its interval and the
        GPU-busy floor (graph rows on a GPU), rounded for display. The baseline row says "baseline"; a graph that
        ran eagerly (no GPU, or its capture fell back) shows no speedup: it would compare eager with eager. A
        column with nothing to show in any row (the floor on a CPU) is left out. ``cuda``: as in ``ran_eagerly``."""
        import pandas as pd

        t = self.table if cases is None else self.table[self.table.case.isin(list(cases))]
        eager = ran_eagerly(t, cuda)
        first = ~t.case.duplicated()   # each case's first row is its baseline
        values = [t.case, t.variant, t.get("executed_as", pd.Series(["-"] * len(t), index=t.index)),
                  t.median_us.round(1),
                  ["baseline" if b else "-" if e else f"{s:.2f}x" for s, e, b in zip(t.speedup, eager, first)],
                  ["" if b else "ran eagerly" if e else f"{lo:.2f}-{hi:.2f}x" if lo == lo and hi == hi else "-"
                   for lo, hi, e, b in zip(t.speedup_pi_lo, t.speedup_pi_hi, eager, first)],
                  [f"{v:.1f}" if v == v else "-" for v in t.floor_us] if "floor_us" in t else "-"]
        out = pd.DataFrame(dict(zip(SHORT_COLUMNS, values))).reset_index(drop=True)
        empty = [c for c in out.columns if out[c].isna().all() or out[c].astype(str).isin(["-", "", "nan"]).all()]
        return out.drop(columns=empty)


def window_medians(frames, case, variant, fmt: str = ".10g") -> str:
    """One row's median time in each window (``Measured.windows``), ";"-joined, "nan" where a window lacks the row:
    what a saved table needs to recompute a ratio between two of its rows window by window."""
    return ";".join(f"{float(f[(f.case == case) & (f.variant == variant)].median_us.iloc[0]):{fmt}}"
                    if ((f.case == case) & (f.variant == variant)).any() else "nan" for f in frames)


def _case_parts(spec):
    """``{name: fn}`` or ``(variants, args)`` or ``(variants, args, options)`` → (variants, args, options)."""
    if isinstance(spec, dict):
        return spec, (), {}
    if isinstance(spec, tuple) and 2 <= len(spec) <= 3 and isinstance(spec[0], dict):
        return spec[0], tuple(spec[1]), dict(spec[2]) if len(spec) == 3 else {}
    raise TypeError("each case is {name: fn}, (variants, args) or (variants, args, options) with options passed "
                    f"to compare (calls, samples, sample_ms, warmup); got {type(spec).__name__}.")


def measure(cases: dict, *, windows: int = 8, samples: int = 3, calls: int | None = None, pause_s: float = 1.0,
            sample_ms: float = 20.0, warmup: int | None = None, floor: bool = True, before_window=None, progress="line",
            verdicts=None, sleep=time.sleep) -> Measured:
    """Time ``cases`` (``{case: {variant: fn}}``; the first variant of a case is its baseline) in ``windows``
    windows, ``pause_s`` apart, and return a ``Measured``.

    ``samples``, ``calls``, ``sample_ms``, ``warmup``: passed to ``compare`` (a case given as ``(variants, args,
    options)`` overrides them; ``warmup=None`` warms each variant up for about 50 ms in the first window and for two
    calls in the later ones, which follow it with everything already compiled and captured). ``floor``: read GPU floors and kernel counts with the profiler, in the last window only.
    ``before_window(w)``: called before window ``w`` (0-based), e.g. to reset a cache. ``progress``: ``"line"`` prints
    one short line that grows as the windows finish ("timing 8 windows: 1 2 3 4 5 6 7 8, 41 s"); a callable is
    called once per window with that window's speedups ("window 3/8: bs1 graph 5.10x, ..."); ``None``: silent.
    ``verdicts(m)``: builds the experiment's claims from the result (a function of ``verdicts.py``); they land
    in ``m.claims`` and ``results.show(m, stem)`` prints their sentences under the table.

    Example::

        m = measure({"bs1": {"eager": step, "graph": g.replay}}, windows=8, samples=2)
        m.short()
    """
    if windows < 1:
        raise ValueError(f"measure needs at least one window, got windows={windows}; use 2 or more for intervals.")
    if not cases:
        raise ValueError("measure needs at least one case: {case: {variant: fn}}.")
    import pandas as pd

    parts = {case: _case_parts(spec) for case, spec in cases.items()}
    baselines = {case: next(iter(variants)) for case, (variants, _, _) in parts.items()}
    frames, start = [], time.perf_counter()
    if progress == "line":
        print(f"timing {windows} window{'s' * (windows > 1)}:", end="", flush=True)
    for w in range(windows):
        if w:
            sleep(pause_s)
        if before_window is not None:
            before_window(w)
        last = w == windows - 1
        tables = []
        for case, (variants, args, options) in parts.items():
            warm = warmup if warmup is not None or w == 0 else 2
            opts = {"calls": calls, "samples": samples, "sample_ms": sample_ms, "warmup": warm, **options}
            tables.append(compare(variants, *args, case=case, floor=floor and last, **opts))
        frames.append(pd.concat(tables, ignore_index=True))
        if progress == "line":
            print(f" {w + 1}" + (f", {time.perf_counter() - start:.0f} s" if last else ""), end="\n" if last else "",
                  flush=True)
        elif progress is not None:
            parts_shown = [f"{r.case} {r.variant} {r.speedup:.2f}x" for r in frames[-1].itertuples()
                           if r.variant != baselines[r.case]]
            shown = ", ".join(parts_shown[:4]) + (f" (+{len(parts_shown) - 4} more)" if len(parts_shown) > 4 else "")
            progress(f"window {w + 1}/{windows}: {shown}")
    m = Measured(combine_windows(frames), frames, verdicts=verdicts)
    if verdicts is not None:
        m.claims = list(verdicts(m))
    return m


class Runs:
    """``fn()`` as a timed variant that says what it replays: ``mode`` is "eager", or that of ``graphs`` (a kit
    capture or ``BucketedGraphs``: "graph", or "eager" where it fell back), so ``compare`` labels the row
    truthfully in windows without the profiler. Example: ``Runs(lambda: serve(graphs, stream), graphs)``."""

    def __init__(self, fn, graphs="eager"):
        self.fn = fn
        self.mode = graphs if isinstance(graphs, str) else getattr(graphs, "mode", None)

    def __call__(self):
        return self.fn()


def step_mode(m, case: str, variant: str) -> str:
    """What ``variant`` ran as in ``case`` of a profiled ``Measured`` ``m`` (the decode step's), as a ``Runs`` mode:
    "graph" where the profiler saw graph launches, else "eager" (also where the row is missing). A whole generation
    of that step then needs no profiler of its own to say what it ran as."""
    try:
        return "graph" if m.row(case, variant).executed_as == "cuda graph" else "eager"
    except KeyError:
        return "eager"


def profiled_mode(fn) -> str:
    """Call ``fn()`` once under the profiler (after one warm call) and return "graph" if it launched a CUDA graph,
    else "eager"; "eager" without CUDA. For a variant whose graphs are made inside it (``generate`` compiled by
    ``transformers``): one profiled call of graph replays is cheap, unlike profiling eager generations."""
    from ...timing import gpu_time

    g = gpu_time(fn, calls=1, warmup=1)
    return "graph" if g is not None and g.graph_launches > 0 else "eager"


def with_window_medians(m):
    """``m.table`` (a ``Measured``) with each row's per-window medians, ";"-joined (``window_medians_us``), so a
    saved table lets anyone recompute a ratio between two of its rows window by window."""
    t = m.table.copy()
    t["window_medians_us"] = [window_medians(m.windows, c, v, ".6g") for c, v in zip(t.case, t.variant)]
    return t


def per_batch(m, case_of: dict, tokens_per_row: int = 1):
    """``with_window_medians(m)`` with a ``batch`` column (``case_of``: {batch: case}) and ``tokens_per_s``: every
    row of the batch makes ``tokens_per_row`` tokens per timed call. Example: ``per_batch(m_gen, GEN_CASE, 32)``."""
    df = with_window_medians(m)
    df["batch"] = df.case.map({c: b for b, c in case_of.items()})
    df["tokens_per_s"] = df.batch * tokens_per_row / (df.median_us * 1e-6)
    return df


def joined(measured: list, verdicts):
    """One ``Measured`` from several (cases timed in groups, a smaller GPU's way): their tables and their windows
    joined, and the claims of ``verdicts`` built on the whole."""
    import pandas as pd

    m = Measured(pd.concat([m.table for m in measured], ignore_index=True),
                 [pd.concat(ws, ignore_index=True) for ws in zip(*(m.windows for m in measured))], verdicts=verdicts)
    m.claims = verdicts(m)
    return m


def cuda_cleanup() -> None:
    """Between experiments on a GPU: wait for it and hand the allocator's cached memory back."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
