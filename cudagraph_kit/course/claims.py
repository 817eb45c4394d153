"""A notebook's comparative sentences, computed instead of typed: each claim is a verdict on an interval.

Every sentence of the kind "A is faster than B", "stops paying at", "wins", "within x" is a ``Claim``: a stable id,
the interval it rests on (a prediction interval from ``cudagraph_kit.intervals``), the threshold, and the
sentence to print for each verdict; ``unclear`` says "no clear difference" with the interval unless the claim
gives its own sentence. The notebook prints ``claim.statement`` and saves every claim with
``save_claims`` to ``<results folder>/<stem>/claims.csv`` (columns claim, statement, verdict, lo, hi, above).
Markdown cells quote a claim by id as ``{claim:ID}``; ``quoted_claims`` finds those, and the tests check that
every quoted id exists in the notebook's saved claims.

Example::

    from cudagraph_kit.course.claims import Claim, save_claims
    c = Claim("graph_beats_eager_small", lo=5.2, hi=7.0, above=1.0,
              holds="the graph is faster than eager on the small GELU ({lo:.1f}-{hi:.1f}x)",
              fails="the graph is no faster than eager on the small GELU ({lo:.2f}-{hi:.2f}x)")
    print(c.statement)          # the sentence as rendered from the verdict
    save_claims("01_gelu", [c])
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..intervals import verdict

__all__ = ["Claim", "save_claims", "load_claims", "quoted_claims", "CLAIMS_FILE", "CLAIM_COLUMNS"]

CLAIMS_FILE = "claims.csv"
CLAIM_COLUMNS = ["claim", "statement", "verdict", "lo", "hi", "above"]
_ID = re.compile(r"^[a-z0-9_]+$")
_QUOTE = re.compile(r"\{claim:([a-z0-9_]+)\}")


@dataclass(frozen=True)
class Claim:
    """One comparative sentence. ``lo``/``hi``: the interval (e.g. a speedup's prediction interval); ``above``: the
    threshold the claim asserts it clears. ``holds``/``fails``/``unclear``: the sentence for each verdict, format
    strings that may use {lo}, {hi}, {above}."""
    claim: str
    lo: float
    hi: float
    holds: str
    fails: str
    above: float = 1.0
    unclear: str = "no clear difference (the interval {lo:.3g}-{hi:.3g} straddles {above:g})"

    def __post_init__(self):
        if not _ID.match(self.claim):
            raise ValueError(f"a claim id is lower-case letters, digits and _ (it is quoted in prose as "
                             f"{{claim:ID}}), got {self.claim!r}.")

    @property
    def verdict(self) -> str:
        return verdict(self.lo, self.hi, self.above)

    @property
    def statement(self) -> str:
        if not (self.lo == self.lo and self.hi == self.hi):
            return "no clear difference (not measured in two or more windows)"
        template = {"holds": self.holds, "fails": self.fails, "unclear": self.unclear}[self.verdict]
        return template.format(lo=self.lo, hi=self.hi, above=self.above)

    def row(self) -> dict:
        return {"claim": self.claim, "statement": self.statement, "verdict": self.verdict, "lo": self.lo,
                "hi": self.hi, "above": self.above}


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
