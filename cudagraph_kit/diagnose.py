"""The kit's diagnostics under their old name, for code that imports ``cudagraph_kit.diagnose``.

Each tool now lives in a module of its own (copy that one, not this file, into a project):
``check.py`` (:func:`check_capturable`, before capture), ``verify.py`` (:func:`verify`, a graph against eager),
``advise.py`` (:func:`advise`, will a graph help?), and :func:`explain` in ``capture.py``.

Example::

    from cudagraph_kit.diagnose import check_capturable, verify, advise, explain
"""
from .advise import Advice, ReplayCost, advise, graph_gpu_time, measure_replay_cost, predict_graph_time
from .capture import Explanation, explain
from .check import CheckReport, Finding, check_capturable
from .verify import VerifyReport, verify

__all__ = ["check_capturable", "verify", "advise", "explain", "measure_replay_cost", "predict_graph_time",
           "graph_gpu_time", "ReplayCost", "Finding", "CheckReport", "VerifyReport", "Advice", "Explanation"]
