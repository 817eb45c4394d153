"""Write the canonical setup cell (scripts/setup_cell.py) into every notebook source (notebooks/NN_*.py), and
point every notebook's Colab badge at the ref that cell clones (its ``REPO_REF``).

The setup cell is the notebook's first code cell, the one that mentions ``google.colab``; it is defined once, in
scripts/setup_cell.py, and tests/test_notebook_sources.py checks that every source carries it unchanged. It stays
short (at most ``MAX_CODE_LINES`` lines of code and ``MAX_LINES`` in all, checked here and by
tests/test_setup_notebook.py): in a fresh Colab runtime it gets the kit once (a shallow clone of ``REPO_REF``,
installed from the clone), then calls ``cudagraph_kit.course.running.setup_notebook.setup``, which does the rest (ref
check, PyTorch check, imports from the clone, clear errors). It is plain Python, no ``!``/``%`` magics, so the .py source and the .ipynb cell are the same text. The
badges open ``.../blob/<REPO_REF>/notebooks/NN_name.ipynb``, so a notebook opened from a badge and the kit its setup
cell clones are the same ref.

    python scripts/sync_setup_cell.py --write           # rewrite the sources
    python scripts/sync_setup_cell.py --write --ipynb   # also put it into each committed executed notebook
    python scripts/sync_setup_cell.py --check           # exit 1 and name the sources that differ

The setup cell prints nothing in a checkout (where ``reproduce`` executes the notebooks), so its code can be
updated in a committed .ipynb without a GPU re-run: ``--ipynb`` rewrites that one cell's code and refuses a
notebook whose setup cell has outputs.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP_CELL = ROOT / "scripts" / "setup_cell.py"
MARK = "# %%"
MAX_CODE_LINES = 6  # the setup cell is read at a glance: the robust part lives in the kit (setup_notebook.setup)
MAX_LINES = 10      # comments included
BADGE_REF = re.compile(r"(https://colab\.research\.google\.com/github/[^/\s)]+/[^/\s)]+/blob/)([^/\s)]+)(/notebooks/)")


def canonical() -> str:
    """The setup cell's code; raises if it has grown past ``MAX_CODE_LINES`` lines of code (or ``MAX_LINES`` in
    all) or uses a notebook magic."""
    text = SETUP_CELL.read_text().strip("\n")
    lines = text.splitlines()
    if len(code_lines(text)) > MAX_CODE_LINES or len(lines) > MAX_LINES:
        raise ValueError(f"{SETUP_CELL} has {len(code_lines(text))} lines of code ({len(lines)} in all), more than "
                         f"{MAX_CODE_LINES} ({MAX_LINES}): move the new part into "
                         "cudagraph_kit/course/running/setup_notebook.py")
    if any(line.lstrip().startswith(("!", "%")) for line in lines):
        raise ValueError(f"{SETUP_CELL} uses a ! or % magic: jupytext would comment it out in the .py source, so "
                         "the source and the notebook would differ (use subprocess)")
    return text


def code_lines(text: str) -> list:
    """The lines of code of a cell: neither blank nor a comment."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


CONSTANTS = re.compile(r'^REPO_URL, REPO_REF = "([^"]+)", "([^"]+)"$', re.M)


def repo_url_and_ref() -> tuple:
    """The repository and the ref the setup cell clones (``REPO_URL``, ``REPO_REF``)."""
    m = CONSTANTS.search(canonical())
    if not m:
        raise ValueError(f'no line REPO_URL, REPO_REF = "...", "..." in {SETUP_CELL}')
    return m.group(1), m.group(2)


def repo_ref() -> str:
    """The ref the setup cell clones (``REPO_REF``), which the Colab badges open too."""
    return repo_url_and_ref()[1]


def with_repository(cell: str, url: str, ref: str | None = None) -> str:
    """``cell`` (the setup cell) cloning ``url`` at ``ref`` (default: its own): for a rehearsal or a test against
    a copy of the repository."""
    return CONSTANTS.sub(lambda m: f'REPO_URL, REPO_REF = "{url}", "{ref or m.group(2)}"', cell)


def with_badge_ref(text: str) -> str:
    """``text`` with every Colab badge opening the notebooks of :func:`repo_ref`."""
    return BADGE_REF.sub(lambda m: m.group(1) + repo_ref() + m.group(3), text)


def split_cells(text: str) -> list:
    """The jupytext py:percent text as chunks, each starting at a ``# %%`` line (the first is the header)."""
    chunks, current = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith(MARK) and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    chunks.append("".join(current))
    return chunks


def setup_cell_index(chunks: list) -> int:
    """The index of the setup cell's chunk: the first code cell, the only one that mentions google.colab."""
    code = [i for i, c in enumerate(chunks) if c.startswith(MARK) and "[markdown]" not in c.splitlines()[0]]
    found = [i for i in code if "google.colab" in chunks[i]]
    if len(found) != 1:
        raise ValueError(f"expected exactly one code cell mentioning google.colab, found {len(found)}")
    if found[0] != code[0]:
        raise ValueError("the setup cell (the code cell mentioning google.colab) is not the first code cell")
    return found[0]


def setup_cell_of(source: Path) -> str:
    """The setup cell's code in a notebook source (without its ``# %%`` line)."""
    chunks = split_cells(source.read_text())
    body = chunks[setup_cell_index(chunks)].split("\n", 1)[1]
    return body.strip("\n")


def sync(source: Path) -> bool:
    """Put the canonical cell into ``source``; True if the file changed. The blank lines after the cell stay."""
    text = source.read_text()
    chunks = split_cells(text)
    i = setup_cell_index(chunks)
    header = chunks[i].split("\n", 1)[0]
    gap = "\n" * max(2, len(chunks[i]) - len(chunks[i].rstrip("\n")))
    chunks[i] = f"{header}\n{canonical()}{gap}"
    new = with_badge_ref("".join(chunks))
    if new != text:
        source.write_text(new)
    return new != text


def _source(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def _lines(text: str) -> list:
    """A cell source as the notebook JSON stores it: its lines, each with its newline."""
    return text.splitlines(keepends=True)


def sync_ipynb(ipynb: Path) -> bool:
    """Put the canonical cell and the badges' ref into an executed notebook; True if it changed.

    The JSON is edited in place (the setup cell's source, the badges' links) and written back in the layout Jupyter
    and nbformat write (one-space indent), so every other cell, output and metadata stays byte for byte."""
    import json

    raw = ipynb.read_text(encoding="utf-8")
    nb = json.loads(raw)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    cells = [c for c in code if "google.colab" in _source(c)]
    if len(cells) != 1:
        raise ValueError(f"{ipynb.name}: expected exactly one setup cell, found {len(cells)}")
    if cells[0] is not code[0]:
        raise ValueError(f"{ipynb.name}: the setup cell is not the first code cell")
    cell, changed = cells[0], False
    if _source(cell) != canonical():
        if cell.get("outputs"):
            raise ValueError(f"{ipynb.name}: its setup cell has outputs; re-run the notebook instead")
        cell["source"], changed = _lines(canonical()), True
    for md in (c for c in nb["cells"] if c["cell_type"] == "markdown"):
        if with_badge_ref(_source(md)) != _source(md):
            md["source"], changed = _lines(with_badge_ref(_source(md))), True
    if changed:
        ipynb.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the setup cell and the badges in the sources")
    mode.add_argument("--check", action="store_true", help="exit 1 if a source differs; write nothing")
    ap.add_argument("--ipynb", action="store_true", help="with --write: the committed executed notebooks too")
    args = ap.parse_args(argv)
    if args.ipynb and not args.write:
        ap.error("--ipynb goes with --write")
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    if args.check:
        stale = [s.name for s in sources if setup_cell_of(s) != canonical()
                 or with_badge_ref(s.read_text()) != s.read_text()]
        if stale:
            sys.exit(f"setup cell or Colab badge differs from scripts/setup_cell.py in: {', '.join(stale)}; "
                     "run python scripts/sync_setup_cell.py --write --ipynb")
        print(f"{len(sources)} notebook source(s) carry the canonical setup cell")
        return
    for source in sources:
        print(f"{source.name}: {'updated' if sync(source) else 'already canonical'}")
        ipynb = source.with_suffix(".ipynb")
        if args.ipynb and ipynb.is_file():
            print(f"{ipynb.name}: {'updated' if sync_ipynb(ipynb) else 'already canonical'}")


if __name__ == "__main__":
    main()
