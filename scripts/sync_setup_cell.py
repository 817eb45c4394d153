"""Write the canonical setup cell (scripts/setup_cell.py) into every notebook source (notebooks/NN_*.py).

The setup cell is the code cell that mentions ``google.colab``; it is defined once, here, and
tests/test_notebook_sources.py checks that every source carries it unchanged.

    python scripts/sync_setup_cell.py           # rewrite the sources
    python scripts/sync_setup_cell.py --check   # exit 1 and name the sources that differ
    python scripts/sync_setup_cell.py --ipynb   # also put it into each committed executed notebook

The setup cell prints nothing in a checkout (where ``reproduce`` executes the notebooks), so its code can be
updated in a committed .ipynb without a GPU re-run: ``--ipynb`` rewrites that one cell's code and refuses a
notebook whose setup cell has outputs.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP_CELL = ROOT / "scripts" / "setup_cell.py"
MARK = "# %%"


def canonical() -> str:
    return SETUP_CELL.read_text().strip("\n")


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
    found = [i for i, c in enumerate(chunks) if c.startswith(MARK) and "[markdown]" not in c.splitlines()[0]
             and "google.colab" in c]
    if len(found) != 1:
        raise ValueError(f"expected exactly one code cell mentioning google.colab, found {len(found)}")
    return found[0]


def setup_cell_of(source: Path) -> str:
    """The setup cell's code in a notebook source (without its ``# %%`` line)."""
    chunks = split_cells(source.read_text())
    body = chunks[setup_cell_index(chunks)].split("\n", 1)[1]
    return body.strip("\n")


def sync(source: Path) -> bool:
    """Put the canonical cell into ``source``; True if the file changed."""
    text = source.read_text()
    chunks = split_cells(text)
    i = setup_cell_index(chunks)
    header = chunks[i].split("\n", 1)[0]
    chunks[i] = f"{header}\n{canonical()}\n\n"
    new = "".join(chunks)
    if new != text:
        source.write_text(new)
    return new != text


def sync_ipynb(ipynb: Path) -> bool:
    """Put the canonical cell into the setup cell of an executed notebook; True if it changed."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "google.colab" in c.source]
    if len(cells) != 1:
        raise ValueError(f"{ipynb.name}: expected exactly one setup cell, found {len(cells)}")
    cell = cells[0]
    if cell.source == canonical():
        return False
    if cell.get("outputs"):
        raise ValueError(f"{ipynb.name}: its setup cell has outputs; re-run the notebook instead")
    cell.source = canonical()
    nbformat.write(nb, ipynb)
    return True


def main(argv):
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    if "--check" in argv:
        stale = [s.name for s in sources if setup_cell_of(s) != canonical()]
        if stale:
            sys.exit(f"setup cell differs from scripts/setup_cell.py in: {', '.join(stale)}; "
                     "run python scripts/sync_setup_cell.py")
        print(f"{len(sources)} notebook source(s) carry the canonical setup cell")
        return
    for source in sources:
        print(f"{source.name}: {'updated' if sync(source) else 'already canonical'}")
        ipynb = source.with_suffix(".ipynb")
        if "--ipynb" in argv and ipynb.is_file():
            print(f"{ipynb.name}: {'updated' if sync_ipynb(ipynb) else 'already canonical'}")


if __name__ == "__main__":
    main(sys.argv[1:])
