"""Variable shapes under their old name, for code that imports ``cudagraph_kit.buckets``.

Each part now lives in a module of its own (copy that one, not this file, into a project):
``bucket_graphs.py`` (:func:`capture_buckets`, one graph per bucket size, and :func:`ladder`), ``bucket_plan.py``
(:func:`plan_buckets`, :func:`evaluate_buckets`, :func:`measure_bucket_costs`) and ``memory.py``
(:class:`MemoryLedger`, :func:`pool_usage`: memory per graph and pool, for every helper of the kit).

Example::

    from cudagraph_kit.buckets import capture_buckets, plan_buckets, MemoryLedger
"""
from .bucket_graphs import BucketedGraphs, BucketOverflowWarning, BucketStats, capture_buckets, ladder
from .bucket_plan import BucketCosts, BucketPlan, evaluate_buckets, interpolate, measure_bucket_costs, plan_buckets
from .memory import MemoryLedger, graph_pools, pool_usage

__all__ = [
    "BucketedGraphs", "BucketStats", "BucketOverflowWarning", "capture_buckets", "ladder",
    "BucketPlan", "plan_buckets", "evaluate_buckets", "interpolate", "measure_bucket_costs", "BucketCosts",
    "MemoryLedger", "pool_usage", "graph_pools",
]
