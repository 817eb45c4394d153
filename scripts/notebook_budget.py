"""A notebook's budget, read from its py:percent source: the prose words and code lines of its *core* (everything
before "Going further" and the exercises, the setup and parameters cells aside), of its "Going further" part
(an "## Appendix" heading counts as one too) and of its exercises, and the core's longest code cell.

The budget (DESIGN.md): a careful learner reads a core in 45 minutes at most: about 1,500 prose words and 200 code
lines (01: 1,200 and 150), no code cell over about 40 lines. A core over budget is flagged with "over".

A code line is a non-blank line that is not a comment. A prose word is a whitespace-separated token of a markdown
cell, link addresses left out. The core ends at the first heading that starts "## Going further", "## Exercises"
or "## Appendix".

Usage::

    python scripts/notebook_budget.py                 # every notebook, one row each
    python scripts/notebook_budget.py notebooks/01_gelu.py
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL = re.compile(r"^# %%(.*)$")


def cells(path: Path) -> list[tuple[str, list[str]]]:
    """``(kind, lines)`` per cell: kind "markdown", "parameters" or "code"."""
    out, kind, lines = [], None, []
    for line in path.read_text().splitlines():
        m = CELL.match(line)
        if m:
            if kind is not None:
                out.append((kind, lines))
            header = m.group(1)
            kind = "markdown" if "[markdown]" in header else "parameters" if "parameters" in header else "code"
            lines = []
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        out.append((kind, lines))
    return out


def code_lines(lines) -> int:
    return sum(1 for s in lines if s.strip() and not s.strip().startswith("#"))


LIMITS = {"01_gelu": (1200, 150)}   # (prose words, code lines) of a core; others: DEFAULT_LIMIT
DEFAULT_LIMIT = (1500, 200)
LONGEST_CELL = 40
LINK = re.compile(r"\]\([^)]*\)")


def prose_words(lines) -> int:
    text = "\n".join(re.sub(r"^#+\s*", "", s[2:] if s.startswith("# ") else s.lstrip("#")) for s in lines)
    return len(LINK.sub("]", text).split())   # heading marks and link addresses are no words


def budget(path: Path) -> dict:
    part, setup_seen = "core", False
    code = {"core": 0, "further": 0, "exercises": 0, "setup": 0}
    words = {"core": 0, "further": 0, "exercises": 0}
    longest = (0, "")
    for kind, lines in cells(path):
        if kind == "markdown":
            text = "\n".join(lines)
            if re.search(r"^# ## Exercises", text, re.M):
                part = "exercises"
            elif re.search(r"^# ## (Going further|Appendix)", text, re.M):
                part = "further"
            words[part] += prose_words(lines)
            continue
        n = code_lines(lines)
        if kind == "parameters" or not setup_seen:
            setup_seen = True
            code["setup"] += n
            continue
        code[part] += n
        if part == "core" and n > longest[0]:
            first = next((s for s in lines if s.strip() and not s.startswith("#")), "")
            longest = (n, first.strip()[:60])
    max_words, max_code = LIMITS.get(path.stem, DEFAULT_LIMIT)
    over = words["core"] > max_words * 1.05 or code["core"] > max_code * 1.05 or longest[0] > LONGEST_CELL
    return {"notebook": path.stem, "core_words": words["core"], "core_code": code["core"],
            "further_words": words["further"], "further_code": code["further"], "exercise_words": words["exercises"],
            "exercise_code": code["exercises"], "longest_cell": longest[0], "longest_starts": longest[1],
            "limit": f"{max_words}/{max_code}", "over": over}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path, help="notebook sources (default: every notebooks/NN_*.py)")
    paths = ap.parse_args(argv).sources or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    import pandas as pd

    rows = [{"notebook": b["notebook"], "core words/code": f"{b['core_words']}/{b['core_code']}", "limit": b["limit"],
             "further": f"{b['further_words']}/{b['further_code']}",
             "exercises": f"{b['exercise_words']}/{b['exercise_code']}", "longest": b["longest_cell"],
             "": "over" if b["over"] else ""} for b in map(budget, paths)]
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
