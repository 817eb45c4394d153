"""A notebook's budget, read from its py:percent source: the prose words and code lines of its *core* (everything
before "Going further" and the exercises, the setup and parameters cells aside), of its "Going further" part
(an "## Appendix" heading counts as one too) and of its exercises, and the core's longest code cell.

The budget (DESIGN.md): a careful learner reads a core in 45 minutes at most: about 1,500 prose words and 200 code
lines (01: 1,200 and 150), no code cell over about 40 lines, and it prints at most about 800 words and 4 tables
(printed output costs a learner as much as prose). A core over budget is flagged with "over".

Printed output is read from the executed notebook beside the source (``NN_name.ipynb``, the committed GPU run, or
``--executed DIR`` for another run): the words of every stream, text and markdown output of the core's code cells
(a table's words counted from its plain-text form, an image as none), and its tables (an HTML or markdown table).

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
OUTPUT_WORDS, OUTPUT_TABLES = 800, 4
LINK = re.compile(r"\]\([^)]*\)")


def prose_words(lines) -> int:
    text = "\n".join(re.sub(r"^#+\s*", "", s[2:] if s.startswith("# ") else s.lstrip("#")) for s in lines)
    return len(LINK.sub("]", text).split())   # heading marks and link addresses are no words


def _part_of(markdown: str, part: str) -> str:
    if re.search(r"^#* ?## Exercises", markdown, re.M):
        return "exercises"
    if re.search(r"^#* ?## (Going further|Appendix)", markdown, re.M):
        return "further"
    return part


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def printed(ipynb: Path) -> dict:
    """What the core's code cells of an executed notebook printed: ``{"words": N, "tables": N}``."""
    import json

    part, setup_seen, words, tables = "core", False, 0, 0
    for cell in json.loads(ipynb.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            part = _part_of(_text(cell["source"]), part)
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "parameters" in tags or "injected-parameters" in tags or not setup_seen:
            setup_seen = setup_seen or cell["cell_type"] == "code"
            continue
        if part != "core":
            continue
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                words += len(_text(out.get("text")).split())
                continue
            data = out.get("data", {})
            html, markdown = _text(data.get("text/html")), _text(data.get("text/markdown"))
            if "<table" in html or re.search(r"^\|[-:| ]+\|$", markdown, re.M):
                tables += 1
            if "image/png" in data or "image/svg+xml" in data:
                continue
            words += len((markdown or _text(data.get("text/plain"))).split())
    return {"words": words, "tables": tables}


def budget(path: Path, executed: Path | None = None) -> dict:
    part, setup_seen = "core", False
    code = {"core": 0, "further": 0, "exercises": 0, "setup": 0}
    words = {"core": 0, "further": 0, "exercises": 0}
    longest = (0, "")
    for kind, lines in cells(path):
        if kind == "markdown":
            part = _part_of("\n".join(lines), part)
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
    ipynb = (executed / path.with_suffix(".ipynb").name) if executed else path.with_suffix(".ipynb")
    out = printed(ipynb) if ipynb.exists() else {"words": None, "tables": None}
    over = (words["core"] > max_words * 1.05 or code["core"] > max_code * 1.05 or longest[0] > LONGEST_CELL
            or (out["words"] or 0) > OUTPUT_WORDS * 1.05 or (out["tables"] or 0) > OUTPUT_TABLES)
    return {"output_words": out["words"], "output_tables": out["tables"],"notebook": path.stem, "core_words": words["core"], "core_code": code["core"],
            "further_words": words["further"], "further_code": code["further"], "exercise_words": words["exercises"],
            "exercise_code": code["exercises"], "longest_cell": longest[0], "longest_starts": longest[1],
            "limit": f"{max_words}/{max_code}", "over": over}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path, help="notebook sources (default: every notebooks/NN_*.py)")
    ap.add_argument("--executed", type=Path, help="a folder of executed notebooks to count printed output from "
                                                  "(default: the .ipynb beside each source)")
    args = ap.parse_args(argv)
    paths = args.sources or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    import pandas as pd

    rows = [{"notebook": b["notebook"], "core words/code": f"{b['core_words']}/{b['core_code']}", "limit": b["limit"],
             "further": f"{b['further_words']}/{b['further_code']}",
             "exercises": f"{b['exercise_words']}/{b['exercise_code']}", "longest": b["longest_cell"],
             "printed words/tables": f"{b['output_words']}/{b['output_tables']}",
             "": "over" if b["over"] else ""} for b in (budget(p, args.executed) for p in paths)]
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
