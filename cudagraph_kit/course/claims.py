"""A notebook's comparative sentences, computed instead of typed: each claim is a verdict on an interval.

Every sentence of the kind "A is faster than B", "stops paying at", "wins", "within x" is a ``Claim``: a stable id,
the interval it rests on (a prediction interval from ``cudagraph_kit.intervals``), the threshold, and the
sentence to print for each verdict; ``unclear`` says "no clear difference" with the interval unless the claim
gives its own sentence. The notebook prints ``claim.statement`` and saves every claim with
``save_claims`` to ``<results folder>/<stem>/claims.csv`` (columns claim, statement, verdict, lo, hi, above).
Markdown cells quote a claim by id as ``{claim:ID}``; ``quoted_claims`` finds those, and the tests check that
every quoted id exists in the notebook's saved claims.

A claim about a graph whose graph side ran as an eager fallback (no GPU: ``capture(..., eager_fallback=True)``
gives ``mode == "eager"``, ``compare`` labels the row ``executed_as == "eager"``) compares eager with eager.
Build it with ``eager_fallback=True``: its verdict is then ``"eager fallback"`` and its sentence says so, never
"holds" or "fails" about a graph that was not built. ``faster(...)`` builds the common claim "A is faster than
B" with plain sentences that say which way the interval points.

Example::

    from cudagraph_kit.course.claims import Claim, faster, save_claims
    c = Claim("graph_beats_eager_small", lo=5.2, hi=7.0, above=1.0,
              holds="the graph is faster than eager on the small GELU ({lo:.1f}-{hi:.1f}x)",
              fails="the graph takes at least as long as eager on the small GELU ({lo:.2f}-{hi:.2f}x)")
    print(c.statement)          # the sentence as rendered from the verdict
    save_claims("01_gelu", [c])
    no_gpu = not torch.cuda.is_available()
    c = faster("replay_beats_eager_large", 1.12, 1.78, "large: the graph replay", eager_fallback=no_gpu)
    print(f"[{c.verdict}] {c.statement}")   # on a CPU: [eager fallback] ..., no verdict about a graph
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..intervals import verdict

__all__ = ["Claim", "faster", "save_claims", "load_claims", "quoted_claims", "CLAIMS_FILE", "CLAIM_COLUMNS",
           "EAGER_FALLBACK"]

CLAIMS_FILE = "claims.csv"
CLAIM_COLUMNS = ["claim", "statement", "verdict", "lo", "hi", "above"]
_ID = re.compile(r"^[a-z0-9_]+$")
_QUOTE = re.compile(r"\{claim:([a-z0-9_]+)\}")
EAGER_FALLBACK = "eager fallback"  # the verdict of a claim about a graph that ran eagerly (no GPU)


@dataclass(frozen=True)
class Claim:
    """One comparative sentence. ``lo``/``hi``: the interval (e.g. a speedup's prediction interval); ``above``: the
    threshold the claim asserts it clears. ``holds``/``fails``/``unclear``: the sentence for each verdict, format
    strings that may use {lo}, {hi}, {above}. ``eager_fallback``: the claim is about a graph, and its graph side
    ran eagerly (no GPU): the verdict is ``"eager fallback"`` and the sentence says no verdict about a graph."""
    claim: str
    lo: float
    hi: float
    holds: str
    fails: str
    above: float = 1.0
    unclear: str = "no clear difference (the interval {lo:.3g}-{hi:.3g} straddles {above:g})"
    eager_fallback: bool = False

    def __post_init__(self):
        if not _ID.match(self.claim):
            raise ValueError(f"a claim id is lower-case letters, digits and _ (it is quoted in prose as "
                             f"{{claim:ID}}), got {self.claim!r}.")

    @property
    def verdict(self) -> str:
        return EAGER_FALLBACK if self.eager_fallback else verdict(self.lo, self.hi, self.above)

    @property
    def statement(self) -> str:
        measured = self.lo == self.lo and self.hi == self.hi
        if self.eager_fallback:
            interval = f"{self.lo:.3g}-{self.hi:.3g}" if measured else "not measured"
            return (f"{self.claim}: eager vs eager (no GPU: the graph side ran eagerly; interval {interval}), "
                    "no verdict about a graph")
        if not measured:
            return "no clear difference (not measured in two or more windows)"
        template = {"holds": self.holds, "fails": self.fails, "unclear": self.unclear}[self.verdict]
        return template.format(lo=self.lo, hi=self.hi, above=self.above)

    def row(self) -> dict:
        return {"claim": self.claim, "statement": self.statement, "verdict": self.verdict, "lo": self.lo,
                "hi": self.hi, "above": self.above}


def faster(claim_id: str, lo: float, hi: float, subject: str, than: str = "eager", above: float = 1.0,
           interval: str = "90% prediction interval", eager_fallback: bool = False) -> Claim:
    """The claim "``subject`` is faster than ``than``" on a speedup interval (``than``'s time / ``subject``'s),
    with plain sentences: each says which way the interval points, none negates "faster". ``above`` > 1 asks for
    more than that margin (1.10: more than 10% faster).

    Example::

        c = faster("replay_beats_eager_small", 4.1, 9.4, "small: the graph replay")
        c.statement   # 'small: the graph replay is faster than eager (4.10-9.40x, 90% prediction interval)'
        faster("x", 0.8, 0.95, "the compiled forward").statement
        # 'the compiled forward takes at least as long as eager (0.80-0.95x, 90% prediction interval)'
    """
    if not above >= 1.0:
        raise ValueError(f"faster() needs a threshold of at least 1 (a speedup to clear), got above={above}. For "
                         "'at most x slower', swap the two sides and build the claim on the inverse ratio.")
    ratio = f"{{lo:.2f}}-{{hi:.2f}}x, {interval}"
    if above == 1.0:
        holds = f"{subject} is faster than {than} ({ratio})"
        fails = f"{subject} takes at least as long as {than} ({ratio})"
    else:
        margin = f"{100 * (above - 1):.0f}%"
        holds = f"{subject} is more than {margin} faster than {than} ({ratio})"
        fails = f"{subject} is at most {margin} faster than {than} ({ratio})"
    unclear = (f"{subject} against {than}: no clear difference (the interval {{lo:.2f}}-{{hi:.2f}}x straddles "
               f"{above:g}x)")
    return Claim(claim_id, lo=lo, hi=hi, holds=holds, fails=fails, above=above, unclear=unclear,
                 eager_fallback=eager_fallback)


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
