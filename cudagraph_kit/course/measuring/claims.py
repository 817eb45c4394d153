"""A notebook's comparative sentences, computed instead of typed: each claim is a verdict on an interval.

Every sentence of the kind "A is faster than B", "stops paying at", "wins", "within x" is a ``Claim``: a stable id,
the interval it rests on (a prediction interval from ``cudagraph_kit.intervals``), the threshold, and the
sentence to print for each verdict; ``unclear`` says "no clear difference" with the interval unless the claim
gives its own sentence. The notebook prints ``claim.statement`` and saves every claim with
``save_claims`` to ``<results folder>/<stem>/claims.csv`` (columns claim, statement, verdict, lo, hi, above).
Markdown cells quote a claim by id as ``{claim:ID}``; ``quoted_claims`` finds those, and the tests check that
every quoted id exists in the notebook's saved claims.

Build claims from a ``Measured`` (``measure.measure``): ``speedup`` (a variant against its case's baseline),
``versus`` (any two rows), ``within_floor``, ``best_of``, ``host_bound`` (eager against the GPU-busy floor),
``decode_vs_prefill`` (one speedup against another, window by window); ``stops_paying`` reads a sweep, ``faster``
takes a bare interval, and ``advise_claim`` / ``advise_words_claim`` hold a prediction of ``advise`` against a
measured interval. Each renders one plain sentence that says what was measured and which way the interval
points ("the graph is 5.10-7.30x faster than eager"); ``holds``/``fails``/``unclear`` stay in ``claims.csv``.
``summary(claims)`` shows a notebook's findings as one short table.

A claim about a graph whose graph side ran eagerly (no GPU) compares eager with eager: the builders detect it
from the rows ("(eager fallback)", or no CUDA), its verdict is ``"eager fallback"`` and its sentence says so,
never a verdict about a graph that was not built.

Example::

    from cudagraph_kit.course.measuring.claims import save_claims, speedup, summary
    claims = [speedup(m, "replay_beats_eager_small", "small", "graph replay")]   # m = measure(...)
    summary(claims)                 # 1. small: graph replay is 5.10-7.30x faster than eager
    save_claims(folder, claims)     # claims.csv: claim, statement, verdict, lo, hi, above
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...intervals import verdict

__all__ = ["Claim", "faster", "speedup", "versus", "within_floor", "stops_paying", "best_of", "host_bound",
           "decode_vs_prefill", "WITHIN", "closeness", "advise_claim", "advise_words_claim", "summary", "summary_table",
           "takeaways", "save_claims", "load_claims", "quoted_claims", "CLAIMS_FILE", "CLAIM_COLUMNS", "EAGER_FALLBACK"]

CLAIMS_FILE = "claims.csv"
CLAIM_COLUMNS = ["claim", "statement", "verdict", "lo", "hi", "above"]
_ID = re.compile(r"^[a-z0-9_]+$")
_QUOTE = re.compile(r"\{claim:([a-z0-9_]+)\}")
_TAKEAWAY_QUOTE = re.compile(r"\{([a-z0-9_]+)(:statement)?\}")   # {id}: its interval; {id:statement}: its sentence
_SAME_ENDS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)-\1(?![\d.])")   # an interval whose two ends read alike
EAGER_FALLBACK = "eager fallback"  # the verdict of a claim about a graph that ran eagerly (no GPU)


def _x(v: float, near: float = 1.0) -> str:
    """A ratio for a sentence: 2 decimals below 10, 1 below 100, none above; 3 within 0.5% of ``near`` (a verdict's
    threshold, 1 by default) but not on it, so that an interval that clears its threshold never reads as if it sat on
    it: ``_x(1.004)`` is "1.004", ``_x(1.1018, near=1.1)`` is "1.102"."""
    if abs(v - near) < 0.005 * near and v != near and v < 10:
        return f"{v:.3f}"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _span(lo: float, hi: float, near: float = 1.0) -> str:
    """An interval for a sentence, "1.23-4.56x" (each end as :func:`_x` writes it, ``near`` the verdict's threshold),
    or "?" where it is not measured."""
    return f"{_x(lo, near)}-{_x(hi, near)}x" if lo == lo and hi == hi else "?"


def _near(row: dict) -> float:
    """A claim row's threshold (its ``above``; 1 where an older claims.csv has none)."""
    above = float(row.get("above", 1.0))
    return above if above == above else 1.0


@dataclass(frozen=True)
class Claim:
    """One comparative sentence. ``lo``/``hi``: the interval (e.g. a speedup's prediction interval); ``above``: the
    threshold the claim asserts it clears (``below=True``: the claim asserts the interval lies under it, as in
    "within 1.2x of the floor"). ``holds``/``fails``/``unclear``: the sentence for each verdict, format strings
    that may use {lo}, {hi}, {above}. ``eager_fallback``: the claim is about a graph whose graph side ran
    eagerly (no GPU): the verdict is ``"eager fallback"`` and the sentence says it compares eager with eager;
    ``subject`` names what was compared in that sentence."""
    claim: str
    lo: float
    hi: float
    holds: str
    fails: str
    above: float = 1.0
    unclear: str = "{lo:.3g}-{hi:.3g}: too close to {above:g} to call"
    eager_fallback: bool = False
    below: bool = False
    subject: str = ""

    def __post_init__(self):
        if not _ID.match(self.claim):
            raise ValueError(f"a claim id is lower-case letters, digits and _ (it is quoted in prose as "
                             f"{{claim:ID}}), got {self.claim!r}.")

    @property
    def measured(self) -> bool:
        return self.lo == self.lo and self.hi == self.hi

    @property
    def verdict(self) -> str:
        if self.eager_fallback:
            return EAGER_FALLBACK
        if self.below and self.measured and self.lo > 0:
            return verdict(1 / self.hi, 1 / self.lo, 1 / self.above)
        return verdict(self.lo, self.hi, self.above)

    @property
    def statement(self) -> str:
        what = self.subject or self.claim.replace("_", " ")
        if self.eager_fallback:   # its interval (eager against eager, often absurdly wide) stays in claims.csv
            return (f"{what}: no GPU, so the graph side ran eagerly and this run compares eager with eager"
                    + ("" if self.measured else " (not measured)") + "; the recorded GPU run has the verdict")
        if not self.measured:
            return f"{what}: not measured in two or more windows, so no verdict"
        template = {"holds": self.holds, "fails": self.fails, "unclear": self.unclear}[self.verdict]
        text = template.format(lo=self.lo, hi=self.hi, above=self.above, inv_lo=1 / self.hi if self.hi else
                               float("inf"), inv_hi=1 / self.lo if self.lo else float("inf"))
        return _SAME_ENDS.sub(r"\1", text)   # "1.20-1.20x" (every window alike) reads "1.20x"

    def row(self) -> dict:
        return {"claim": self.claim, "statement": self.statement, "verdict": self.verdict, "lo": self.lo,
                "hi": self.hi, "above": self.above}


def faster(claim_id: str, lo: float, hi: float, subject: str, than: str = "eager", above: float = 1.0,
           eager_fallback: bool = False) -> Claim:
    """The claim "``subject`` is faster than ``than``" on a speedup interval (``than``'s time / ``subject``'s).
    Each sentence says what was measured and which way the interval points; none negates "faster". ``above`` >
    1 asks for more than that margin (1.10: more than 10% faster).

    Example::

        faster("replay_beats_eager_small", 4.1, 9.4, "the graph").statement
        # 'the graph is 4.10-9.40x faster than eager'
        faster("x", 0.8, 0.95, "the compiled forward").statement
        # 'the compiled forward is 1.05-1.25x slower than eager'
    """
    if not above >= 1.0:
        raise ValueError(f"faster() needs a threshold of at least 1 (a speedup to clear), got above={above}. For "
                         "'at most x slower', swap the two sides and build the claim on the inverse ratio.")
    aim = "" if above == 1.0 else f" (aim: more than {100 * (above - 1):.0f}% faster)"
    if eager_fallback:
        return Claim(claim_id, lo=lo, hi=hi, holds="", fails="", above=above, eager_fallback=True,
                     subject=f"{subject} against {than}{aim}")
    span = _span(lo, hi, above) if lo > 0 else "?"
    slower = f"{_x(1 / hi)}-{_x(1 / lo)}x" if lo == lo and hi == hi and lo > 0 else "?"
    if above == 1.0:
        holds = f"{subject} is {span} faster than {than}"
        fails = f"{subject} is {slower} slower than {than}"
    else:
        margin = f"{100 * (above - 1):.0f}%"
        holds = f"{subject} is {span} faster than {than}: more than {margin} faster"
        fails = f"{subject} is {span} as fast as {than}: at most {margin} faster"
    unclear = f"{subject} and {than} are too close to call: {span} as fast"
    if above != 1.0:
        unclear = f"{subject} is {span} as fast as {than}: too close to {above:g}x to call"
    return Claim(claim_id, lo=lo, hi=hi, holds=holds, fails=fails, above=above, unclear=unclear,
                 subject=f"{subject} against {than}")


def _fallback(*labels) -> bool:
    from .measure import is_eager_fallback
    return any(is_eager_fallback(label) for label in labels)


def speedup(m, claim_id: str, case: str, variant: str, subject: str | None = None, than: str | None = None,
            above: float = 1.0) -> Claim:
    """The claim "``variant`` is faster than its case's baseline" from a ``Measured`` (``measure``). A graph that
    ran eagerly (no GPU) gives an eager-fallback claim, never a verdict.

    Example::

        c = speedup(m, "graph_beats_eager_small", "small", "graph replay")
        print(c.statement)    # 'small: graph replay is 5.10-7.30x faster than eager'
    """
    rows = m.table[m.table.case == case]
    base = str(rows.variant.iloc[0]) if len(rows) else "eager"
    label = m.label(case, variant)
    lo, hi = m.interval(case, variant)
    return faster(claim_id, lo, hi, subject or f"{case}: {variant}", than or base, above,
                  eager_fallback=_fallback(label, base))


def versus(m, claim_id: str, fast: tuple, slow: tuple, subject: str | None = None, than: str | None = None,
           above: float = 1.0) -> Claim:
    """The claim "``fast`` is faster than ``slow``" for any two ``(case, variant)`` rows of a ``Measured``, from
    their ratio window by window (A vs B when neither is the baseline).

    Example::

        versus(m, "bf16_beats_fp32", ("bs64", "bf16 graph"), ("bs64", "fp32 graph")).statement
    """
    r = m.ratio(slow, fast)
    return faster(claim_id, r["lo"], r["hi"], subject or f"{fast[0]}: {fast[1]}", than or f"{slow[1]}", above,
                  eager_fallback=_fallback(m.label(*fast), m.label(*slow)))


def within_floor(m, claim_id: str, case: str, variant: str, factor: float, subject: str | None = None) -> Claim:
    """The claim "``variant`` runs within ``factor`` x of its GPU-busy floor": its time's interval over the
    windows divided by the floor the profiler measured. Without a floor (no GPU, or not a pure graph) the claim
    is not measured.

    Example::

        within_floor(m, "graph_near_floor_large", "large", "graph replay", 1.2).statement
        # 'large: graph replay runs within 1.2x of its GPU floor (1.01-1.05x the floor)'
    """
    r = m.row(case, variant)
    floor = float(r.floor_us) if "floor_us" in r.index and r.floor_us == r.floor_us else float("nan")
    lo, hi = float(r.median_pi_lo) / floor, float(r.median_pi_hi) / floor
    subject = subject or f"{case}: {variant}"
    span = _span(lo, hi, factor)
    return Claim(claim_id, lo=lo, hi=hi, above=factor, below=True, subject=subject,
                 eager_fallback=_fallback(str(r.variant)),
                 holds=f"{subject} runs within {factor:g}x of its GPU floor ({span} the floor)",
                 fails=f"{subject} takes {span} its GPU floor: more than {factor:g}x",
                 unclear=f"{subject} takes {span} its GPU floor: too close to {factor:g}x to call")


def stops_paying(claim_id: str, points, above: float, subject: str, unit: str = "",
                 eager_fallback: bool = False) -> Claim:
    """The claim "``subject`` stops paying from some x on": ``points`` are ``(x, lo, hi)`` speedup intervals of a
    sweep; "stops paying" means every interval from x on lies at or below ``above`` (``intervals.stops_clearing``).

    Example::

        stops_paying("graph_stops_paying", [(2**20, 1.5, 2.0), (2**24, 1.0, 1.05)], 1.10, "the graph", " elements")
        # statement: 'the graph stops paying (at most 1.1x) from 16,777,216 elements on'
    """
    from ...intervals import stops_clearing

    pts = sorted((float(x), lo, hi) for x, lo, hi in points)
    if not pts:
        raise ValueError("stops_paying needs the sweep's points as (x, lo, hi).")
    found = stops_clearing(pts, above)
    at = found["from"]
    x, lo, hi = next(p for p in pts if p[0] == float(at)) if at is not None else pts[-1]
    shown = lambda v: f"{int(v):,}" if float(v).is_integer() else f"{v:g}"  # noqa: E731
    span = _span(lo, hi, above)
    # one verdict per sentence: the point just below x, where the interval may straddle ``above``, is not named here
    # verdict: holds when the sweep's interval at x lies at or below ``above`` (checked with below=True)
    return Claim(claim_id, lo=lo, hi=hi, above=above * (1 + 1e-12), below=True, subject=subject,
                 eager_fallback=eager_fallback,
                 holds=f"{subject} stops paying (at most {above:g}x) from {shown(x)}{unit} on",
                 fails=f"{subject} pays at every point measured, up to {shown(x)}{unit} ({span} there)",
                 unclear=f"{subject} at {shown(x)}{unit}: {span}, too close to {above:g}x to call")


def best_of(m, claim_id: str, case: str, variants=None, above: float = 1.0) -> Claim:
    """The claim "the fastest of ``variants`` (default: all in ``case``) beats the runner-up", from their ratio
    window by window.

    Example::

        best_of(m, "fastest_at_bs1", "bs1", ["kit graph", "reduce-overhead", "compile + kit graph"]).statement
    """
    rows = m.table[m.table.case == case]
    names = list(variants) if variants is not None else list(rows.variant)
    ranked = sorted(names, key=lambda v: -float(m.row(case, v).speedup))
    if len(ranked) < 2:
        raise ValueError(f"best_of needs two or more variants of {case!r}, got {ranked}.")
    best, runner = ranked[0], ranked[1]
    return versus(m, claim_id, (case, best), (case, runner), subject=f"{case}: {best} (fastest)", than=runner,
                  above=above)


def host_bound(m, claim_id: str, case: str, floor_us: float):
    """The claim "eager is host-bound in ``case``": eager's time interval over the GPU-busy ``floor_us`` of the
    step is above 2x, so the GPU sits idle most of each eager step."""
    eager = m.row(case, "eager")
    lo, hi = eager.median_pi_lo / floor_us, eager.median_pi_hi / floor_us
    times = f"an eager step takes {_span(lo, hi, 2.0)} the GPU's busy time"   # as a takeaway quotes it: one rounding
    return Claim(claim_id, lo=lo, hi=hi, above=2.0,
                 subject=f"{case}: eager against the floor",
                 holds=f"{case}: {times}: host-bound, the GPU sits idle most of each step",
                 fails=f"{case}: {times}: at most 2x, so not host-bound by this test",
                 unclear=f"{case}: {times}: too close to 2x to call")


def decode_vs_prefill(m, claim_id: str, decode: tuple, prefill: tuple, what: str, eager_fallback: bool):
    """The claim "a graph buys a decode step more than it buys prefill": the decode row's speedup over the prefill
    row's, window by window (``decode`` and ``prefill`` are (case, variant) of ``m``; ``what`` names the decode
    step in the sentence, e.g. "a decode step at batch 64")."""
    from ...intervals import prediction_interval

    ratios = [float(d) / float(p) for d, p in zip(m.row(*decode).window_speedups.split(";"),
                                                  m.row(*prefill).window_speedups.split(";"))]
    lo, hi = prediction_interval(ratios)
    gains = f"a graph's speedup on {what} is {{lo:.2f}}-{{hi:.2f}}x its speedup on prefill"
    return Claim(claim_id, lo=lo, hi=hi, eager_fallback=eager_fallback,
                 subject="a graph's speedup on a decode step against prefill's", holds=gains,
                 fails=f"a graph's speedup on prefill is {{inv_lo:.2f}}-{{inv_hi:.2f}}x its speedup on {what}",
                 unclear=gains + ": too close to call")


WITHIN = 1.5  # advise's prediction is "within" when it lies within this factor of the measured speedup


def closeness(p, m):
    """1 when the prediction ``p`` equals the measurement ``m``, 1/x when one is x times the other."""
    return min(p / m, m / p)


def advise_claim(claim_id, case, predicted, lo, hi, within=WITHIN, eager_fallback=False) -> Claim:
    """The claim "advise's prediction ``predicted`` lies within ``within`` x of the measured speedup", whose 90%
    prediction interval is ``lo``-``hi``. The claim's interval is the range of ``closeness(predicted, m)`` for m in
    lo..hi; it holds above 1/within (the whole measured interval within the factor), fails when none of it is."""
    said = f"advise predicted {predicted:.2f}x before capture; the measured speedup is {lo:.2f}-{hi:.2f}x"
    if not (lo == lo and hi == hi and 0 < lo <= hi and predicted > 0):
        return Claim(claim_id, lo=float("nan"), hi=float("nan"), above=1 / within, holds="", fails="",
                     eager_fallback=eager_fallback, subject=f"{case}: advise's prediction")
    ends = (closeness(predicted, lo), closeness(predicted, hi))
    c_lo, c_hi = min(ends), (1.0 if lo <= predicted <= hi else max(ends))
    said = said.replace("{", "{{").replace("}", "}}")
    return Claim(claim_id, lo=c_lo, hi=c_hi, above=1 / within, eager_fallback=eager_fallback,
                 subject=f"{case}: advise's prediction",
                 holds=f"{case}: {said}, all of it within {within:g}x of the prediction",
                 fails=f"{case}: {said}, all of it more than {within:g}x away from the prediction",
                 unclear=f"{case}: {said}, partly within {within:g}x of the prediction and partly beyond")


def advise_words_claim(claim_id, case, predicted, lo, hi, about=None, eager_fallback=False) -> Claim:
    """The claim "the measured speedup went the way advise's words said": advise calls a predicted speedup above
    ``about`` (``advice.ABOUT``, 1.1) "faster", below ``1 / about`` "slower" and in between "about as fast"
    (``advice.expected_effect``). The claim holds when the whole measured 90% interval ``lo``-``hi`` lies in the band
    the words named, fails when none of it does, and is unclear when it straddles the band's edge. So, unlike the
    within-1.5x claim, it fails when advise says "about as fast" and a graph is measured clearly faster.

    Its interval, on one scale per kind of words so that it is checked against ``above`` like any claim: "faster":
    the measured speedup itself (above ``about``); "slower": how many times slower, 1/hi to 1/lo (above ``about``);
    "about as fast": the range of ``min(m, 1/m)`` for m in lo..hi (above ``1 / about``: within the band).

    Example::

        advise_words_claim("advise_words_gelu_large", "GELU large", 1.06, 1.15, 1.20).verdict  # 'fails'
    """
    from ...advice import ABOUT, expected_effect

    about = ABOUT if about is None else about
    effect = expected_effect(predicted, about)
    subject = f"{case}: advise's words"
    known = lo == lo and hi == hi and 0 < lo <= hi and effect != "unknown"
    if not known:
        return Claim(claim_id, lo=float("nan"), hi=float("nan"), above=about, holds="", fails="",
                     eager_fallback=eager_fallback, subject=subject)
    told = {"faster": "faster than eager", "slower": "slower than eager", "about as fast": "about as fast as eager"}
    band = {"faster": f"more than {about:g}x faster", "slower": f"more than {about:g}x slower",
            "about as fast": f"within {about:g}x of eager either way"}[effect]
    said = (f"{case}: advise predicted {predicted:.2f}x and said a graph would be {told[effect]} (its words for "
            f"{band}); the measured speedup is {lo:.2f}-{hi:.2f}x")
    said = said.replace("{", "{{").replace("}", "}}")
    if effect == "faster":
        c_lo, c_hi, above = lo, hi, about
        outside = f"none of it {band}"
    elif effect == "slower":
        c_lo, c_hi, above = 1 / hi, 1 / lo, about
        outside = f"none of it {band}"
    else:
        ends = (closeness(1.0, lo), closeness(1.0, hi))
        c_lo, c_hi, above = min(ends), (1.0 if lo <= 1.0 <= hi else max(ends)), 1 / about
        outside = f"all of it more than {about:g}x " + ("faster" if lo > 1.0 else "slower")
    return Claim(claim_id, lo=c_lo, hi=c_hi, above=above, eager_fallback=eager_fallback, subject=subject,
                 holds=f"{said}, all of it {band}, as the words said",
                 fails=f"{said}, {outside}: the words were wrong",
                 unclear=f"{said}, partly {band} and partly not: too close to the edge to call")


def _rows(claims) -> dict:
    """``{claim id: row}`` from Claims or from a ``claims.csv`` DataFrame (``load_claims``)."""
    if hasattr(claims, "to_dict"):
        return {r["claim"]: r for r in claims.to_dict("records")}
    return {c.claim: c.row() for c in claims}


def takeaways(lines, claims, missing: str = "raise") -> list[str]:
    """A notebook's closing takeaways, with their numbers rendered from ``claims`` (Claims, or the DataFrame of a
    recorded ``claims.csv``). Each line is plain words that quote claims by id: ``{id}`` becomes the claim's
    interval ("6.80-9.14x"), ``{id:statement}`` its sentence. Write a line as "lesson: evidence". A line whose
    quoted claims do not all hold keeps its lesson (the words before the first quote, up to their last ": " or
    ". ") and states what was measured as a finding: "lesson. Measured: <each quoted claim's sentence>.", so a
    takeaway never says more than its run found (a lesson of fewer than four words is left out). A line
    quoting a claim the run did not make raises ``KeyError`` (a misspelt id), or with ``missing="skip"`` is left out
    (a notebook whose runs make different claims: no compiler, no ``transformers``).

    Example::

        takeaways(["A graph made the small GELU {replay_beats_eager_small} faster than eager."], claims)
        # ['A graph made the small GELU 6.80-9.14x faster than eager.']
    """
    rows = _rows(claims)
    out = []
    for line in lines:
        ids = [m.group(1) for m in _TAKEAWAY_QUOTE.finditer(line)]
        absent = [i for i in ids if i not in rows]
        if absent and missing == "skip":
            continue
        if absent:
            raise KeyError(f"takeaway quotes claim(s) {absent} that this run has not made; it has {sorted(rows)}.")
        if all(rows[i]["verdict"] == "holds" for i in ids):
            span = lambda r: _SAME_ENDS.sub(r"\1", _span(r["lo"], r["hi"], _near(r)))  # noqa: E731
            out.append(_TAKEAWAY_QUOTE.sub(lambda m: str(rows[m.group(1)]["statement"]) if m.group(2)
                                           else span(rows[m.group(1)]), line))
        else:
            found = "Measured: " + "; ".join(str(rows[i]["statement"]) for i in dict.fromkeys(ids)) + "."
            lesson = _lesson(line)
            out.append(f"{lesson}. {found}" if lesson else found)
    return out


def _lesson(line: str) -> str:
    """The lesson of a takeaway line: its words before the first quoted claim, up to their last ": " or ". " (""
    where that leaves fewer than four words)."""
    first = _TAKEAWAY_QUOTE.search(line)
    head = line[:first.start()] if first else line
    cut = max(head.rfind(": "), head.rfind(". "))
    lesson = head[:cut].strip() if cut >= 0 else ""
    return lesson if len(lesson.split()) >= 4 else ""


def summary_table(claims):
    """The findings as a DataFrame: one plain sentence per claim, numbered from 1."""
    import pandas as pd

    return pd.DataFrame({"finding": [c.statement for c in claims]}, index=range(1, len(claims) + 1))


def summary(claims, headlines=None) -> None:
    """Show a notebook's findings as one short table: one plain sentence per claim (``holds``/``fails`` stay in
    ``claims.csv``). Markdown in a notebook, numbered lines elsewhere; ``summary_table`` returns the DataFrame.
    ``headlines``: the ids of the claims to show (those this run measured), in the order given; a last line
    counts the others, which are in ``claims.csv``.

    Example::

        summary(claims, ["graph_beats_eager_small", "fusion_beats_graph_small"])
    """
    claims = list(claims)
    shown = claims if headlines is None else [c for h in headlines for c in claims if c.claim == h]
    df = summary_table(shown)
    rest = len(claims) - len(shown)
    more = f"`claims.csv` has this run's {rest} other verdict{'s' * (rest > 1)}." if rest else ""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            lines = ["| | finding |", "|---|---|"] + [f"| {i} | {s.replace('|', '/')} |" for i, s in
                                                      df.finding.items()]
            display(Markdown("\n".join(lines) + (f"\n\n{more}" if more else "")))
            return
    except ImportError:
        pass
    for i, s in df.finding.items():
        print(f"{i}. {s}")
    if more:
        print(more.replace("`", ""))


def save_claims(folder, claims) -> Path:
    """Write ``claims.csv`` into ``folder`` (a notebook's results folder, as returned by ``results.save``), one row
    per claim; ids must be unique. Returns the file's path."""
    import pandas as pd

    claims = list(claims)
    ids = [c.claim for c in claims]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"claim ids must be unique in a notebook; repeated: {dupes}.")
    path = Path(folder) / CLAIMS_FILE
    pd.DataFrame([c.row() for c in claims], columns=CLAIM_COLUMNS).to_csv(path, index=False)
    return path


def load_claims(folder):
    """The claims a results folder holds (a DataFrame with CLAIM_COLUMNS), or None if it has none."""
    import pandas as pd

    path = Path(folder) / CLAIMS_FILE
    return pd.read_csv(path) if path.is_file() else None


def quoted_claims(text: str) -> list[str]:
    """The claim ids a piece of prose quotes as ``{claim:ID}``, in order."""
    return _QUOTE.findall(text)
