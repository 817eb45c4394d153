"""Each experiment's verdicts: the claims a notebook states about one measurement, built from what ``measure``
returned. A notebook passes one of these functions to ``measure(..., verdicts=...)`` and shows the table and its
sentences with ``m.show()``; it builds no claim list of its own. The sentences and their rules are in
``claims.py``; this module says which comparisons each experiment makes.

Example::

    from cudagraph_kit.course import verdicts
    from cudagraph_kit.course.measure import measure
    m = measure({"small": {...}, "large": {...}}, verdicts=verdicts.gelu_headline)
    m.show()          # the short table, then "small: graph replay is 6.80-9.14x faster than eager", ...
"""
from __future__ import annotations

import re

from .claims import speedup, stops_paying, versus, within_floor
from .measure import ran_eagerly

__all__ = ["gelu_headline", "gelu_sweep", "sweep_points", "gelu_calls_per_graph", "SWEEP_THRESHOLD",
           "FLOOR_FACTOR"]

SWEEP_THRESHOLD = 1.10   # "stops paying": the graph saves at most 10%
FLOOR_FACTOR = 1.3       # "near the floor": within 1.3x of the GPU-busy time


def gelu_headline(m) -> list:
    """Notebook 01, section 5: the graph against eager on the small and the large tensor, replay and ``g(x)``."""
    return [speedup(m, "replay_beats_eager_small", "small", "graph replay"),
            speedup(m, "copy_replay_beats_eager_small", "small", "graph copy+replay"),
            speedup(m, "replay_beats_eager_large", "large", "graph replay"),
            speedup(m, "replay_saves_10pct_large", "large", "graph replay", above=SWEEP_THRESHOLD)]


def sweep_points(m):
    """A size sweep's table (cases named ``"sweep 2^E"``) with a ``numel`` column, and its crossover: the
    smallest size from which every graph interval lies at or below :data:`SWEEP_THRESHOLD` (None where there is
    none, or where the graph ran eagerly)."""
    from ..intervals import stops_clearing

    table = m.table.copy()
    table["numel"] = [2 ** int(re.search(r"\^(\d+)", c).group(1)) for c in table.case]
    graph = table[table.variant != "eager"]
    if any(ran_eagerly(graph)):
        return table, None
    points = list(zip(graph.numel, graph.speedup_lo, graph.speedup_hi))
    return table, stops_clearing(points, above=SWEEP_THRESHOLD)["from"]


def gelu_sweep(m) -> list:
    """Notebook 01, section 6: from which tensor size the graph replay stops paying."""
    table, _ = sweep_points(m)
    graph = table[table.variant != "eager"]
    return [stops_paying("graph_stops_paying", list(zip(graph.numel, graph.speedup_lo, graph.speedup_hi)),
                         SWEEP_THRESHOLD, "the graph replay in the size sweep", " elements",
                         eager_fallback=any(ran_eagerly(graph)))]


def gelu_calls_per_graph(m) -> list:
    """Notebook 01, section 7: more calls per graph against fewer, and the most calls against the floor. The case
    is the table's first; its graph variants are named ``"graph, K calls/graph"``."""
    case = str(m.table.case.iloc[0])
    ks = sorted(int(re.search(r"(\d+) calls/graph", v).group(1)) for v in m.table.variant if "calls/graph" in v)
    few, many = ks[0], ks[-1]
    return [versus(m, "more_calls_per_graph_faster", (case, f"graph, {many} calls/graph"),
                   (case, f"graph, {few} calls/graph"), subject=f"small: {many} calls per graph",
                   than=f"{few} per graph"),
            within_floor(m, "many_calls_near_floor", case, f"graph, {many} calls/graph", FLOOR_FACTOR,
                         subject=f"small: {many} calls per graph")]
