"""A notebook's code budget, read from its py:percent source: code lines in the lesson (outside the setup cell,
the parameters cell, the exercises and the appendix), in the appendix and in the exercises, and the longest code
cell of the lesson. The budget (docs in DESIGN): about 400 lesson code lines, no code cell over about 40 lines.

A code line is a non-blank line that is not a comment. The exercises start at the heading "## Exercises"; the
appendix at a heading starting "## Appendix".

Usage::

    python scripts/notebook_budget.py                 # every notebook, one row each
    python scripts/notebook_budget.py notebooks/01_gelu.py
"""
from __future__ import annotations

import re
import sys
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


def budget(path: Path) -> dict:
    part, setup_seen = "lesson", False
    counts = {"lesson": 0, "appendix": 0, "exercises": 0, "setup": 0}
    longest = (0, "")
    for kind, lines in cells(path):
        if kind == "markdown":
            text = "\n".join(lines)
            if re.search(r"^# ## Exercises", text, re.M):
                part = "exercises"
            elif re.search(r"^# ## Appendix", text, re.M):
                part = "appendix"
            continue
        n = code_lines(lines)
        if kind == "parameters" or not setup_seen:
            setup_seen = True
            counts["setup"] += n
            continue
        counts[part] += n
        if part == "lesson" and n > longest[0]:
            first = next((s for s in lines if s.strip() and not s.startswith("#")), "")
            longest = (n, first.strip()[:60])
    return {"notebook": path.stem, **counts, "longest_cell": longest[0], "longest_starts": longest[1]}


def main(argv=None) -> int:
    paths = [Path(a) for a in (argv or sys.argv[1:])] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    print(f"{'notebook':22} {'lesson':>6} {'appendix':>8} {'exercises':>9} {'longest':>7}  longest cell starts")
    for p in paths:
        b = budget(p)
        print(f"{b['notebook']:22} {b['lesson']:>6} {b['appendix']:>8} {b['exercises']:>9} {b['longest_cell']:>7}  "
              f"{b['longest_starts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
