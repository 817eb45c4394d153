"""Markdown tables for the rendered pages (README, docs/RESULTS.md, FACILITATOR.md, ARCHITECTURE.md): one helper,
so no script builds ``| a | b |`` lines by hand. Text tables are pandas' own (``DataFrame.to_string``).

Example::

    from cudagraph_kit.course.running.tables import markdown_table
    print("\\n".join(markdown_table(["variant", "time"], [["eager", "70.9 µs"], ["graph", "9.8 µs"]])))
    # | variant | time |
    # |---|---|
    # | eager | 70.9 µs |
    # | graph | 9.8 µs |
"""
from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(header: Sequence, rows: Iterable[Sequence]) -> list[str]:
    """The lines of a Markdown table: the ``header`` row, the rule, one line per row (each cell through ``str``;
    a ``|`` inside a cell is escaped so it cannot split the cell). Raises ``ValueError`` for a row whose cell count
    differs from the header's."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    header = list(header)
    body = []
    for number, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"row {number} has {len(row)} cells, the header {len(header)}: {row!r}")
        body.append(line(row))
    return [line(header), "|" + "---|" * len(header), *body]
