"""Copy the markdown cells of each jupytext source into its executed .ipynb (prose edits need no GPU re-run).

Code cells are never touched: a change to code needs `python -m cudagraph_kit reproduce` on a GPU, and
tests/test_notebook_sources.py fails until that is done.

    python scripts/sync_markdown.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jupytext  # noqa: E402
import nbformat  # noqa: E402

from cudagraph_kit.course.running.reproduce import notebook_sources  # noqa: E402


def main():
    skipped = []
    for source in notebook_sources():
        ipynb = source.with_suffix(".ipynb")
        if not ipynb.exists():
            continue
        executed = nbformat.read(ipynb, as_version=4)
        cells = [c for c in executed.cells if "injected-parameters" not in c.metadata.get("tags", [])]
        src_cells = jupytext.read(source).cells
        if [c.cell_type for c in cells] != [c.cell_type for c in src_cells]:
            print(f"{ipynb.name}: cells were added or removed; re-run reproduce on a GPU instead (skipped)")
            skipped.append(ipynb.name)
            continue
        changed = 0
        for cell, src in zip(cells, src_cells):
            if cell.cell_type == "markdown" and cell.source != src.source:
                cell.source, changed = src.source, changed + 1
        if changed:
            nbformat.write(executed, ipynb)
        print(f"{ipynb.name}: {changed} markdown cell(s) updated")
    if skipped:
        sys.exit(f"not updated (their cells changed; they need a GPU re-run): {', '.join(skipped)}")


if __name__ == "__main__":
    main()
