"""Copy the markdown cells of each jupytext source into its executed .ipynb (prose edits need no GPU re-run).

Code cells are never touched: a change to code needs `python -m cudagraph_kit reproduce` on a GPU, and
tests/test_notebook_sources.py fails until that is done.

    python scripts/sync_markdown.py --write   # rewrite the executed notebooks' markdown cells
    python scripts/sync_markdown.py --check   # exit 1 and name the notebooks whose prose differs
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the markdown cells of the executed notebooks")
    mode.add_argument("--check", action="store_true", help="exit 1 if a notebook's prose differs; write nothing")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before the notebook tools load

import jupytext  # noqa: E402
import nbformat  # noqa: E402

from cudagraph_kit.course.running.paths import notebook_sources  # noqa: E402


def main(args: argparse.Namespace):
    skipped, stale = [], []
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
        if changed and args.write:
            nbformat.write(executed, ipynb)
        stale += [ipynb.name] if changed else []
        print(f"{ipynb.name}: {changed} markdown cell(s) {'updated' if args.write else 'differ'}")
    if skipped:
        sys.exit(f"not {'updated' if args.write else 'checked'} (their cells changed; they need a GPU re-run): "
                 f"{', '.join(skipped)}")
    if args.check and stale:
        sys.exit(f"prose differs from the source in: {', '.join(stale)}; run python scripts/sync_markdown.py --write")


if __name__ == "__main__":
    main(ARGS)
