"""A memory ledger for CUDA graphs: what a block of code added, and what each graph and pool holds.

- :class:`MemoryLedger`: ``measure(label)`` records memory before and after a ``with`` block; ``record(label, obj)``
  reads the pools of the graphs an object holds (a ``capture()`` result, ``capture_buckets``, a
  ``capture_train_step`` step, a ``torch.cuda.CUDAGraph``, or a list of them); ``table()`` shows it all in MiB.
- :func:`pool_usage`: memory per allocator pool; :func:`graph_pools`: the pools an object's graphs use.

Example::

    import torch
    from cudagraph_kit.graphed import capture
    from cudagraph_kit.memory import MemoryLedger

    ledger = MemoryLedger()
    with ledger.measure("gelu graph"):
        g = capture(torch.nn.functional.gelu, torch.randn(1 << 20, device="cuda"))
    ledger.record("gelu graph", g)
    print(ledger.table())

It needs only ``torch`` (pandas for the table).
"""
from __future__ import annotations

import contextlib
import time

import torch

__all__ = ["MemoryLedger", "pool_usage", "graph_pools"]

MiB = 2 ** 20


# ------------------------------------------------------------------------------------------------ ledger
def pool_usage(device=None) -> dict:
    """Memory per allocator pool, from ``torch.cuda.memory_snapshot()``: ``{pool_id: {"reserved", "allocated",
    "segments"}}`` in bytes. Pool ``(0, 0)`` is the allocator's default pool; every other id is a CUDA graph's
    private or shared pool. Empty without CUDA.

    Example::

        for pool, use in pool_usage().items():
            print(pool, use["reserved"] / 2**20, "MiB reserved")
    """
    if not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    usage: dict = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", index) != index:
            continue
        pid = tuple(seg.get("segment_pool_id", (0, 0)))
        u = usage.setdefault(pid, {"reserved": 0, "allocated": 0, "segments": 0})
        u["reserved"] += seg["total_size"]
        u["allocated"] += seg["allocated_size"]
        u["segments"] += 1
    return usage


def _graphs_and_buffers(obj) -> tuple[list, list]:
    """The CUDA graphs an object holds and its static tensors that live outside the graphs' pools."""
    if isinstance(obj, torch.cuda.CUDAGraph):
        return [obj], []
    if hasattr(obj, "graphs") and hasattr(obj, "static_outputs"):     # capture_buckets
        return list(obj.graphs.values()), list(obj.static_inputs) + list(obj.static_outputs)
    if hasattr(obj, "static_batch") and hasattr(obj, "graph"):   # capture_train_step
        return ([obj.graph] if obj.graph is not None else []), list(obj.static_batch)
    if hasattr(obj, "static_inputs") and hasattr(obj, "graph"):  # capture()
        return ([obj.graph] if obj.graph is not None else []), list(obj.static_inputs)
    if isinstance(obj, (list, tuple)):
        graphs, bufs = [], []
        for o in obj:
            g, b = _graphs_and_buffers(o)
            graphs += g
            bufs += b
        return graphs, bufs
    if isinstance(obj, dict):
        return _graphs_and_buffers(list(obj.values()))
    raise TypeError(f"cannot find CUDA graphs in a {type(obj).__name__}; pass a capture() result, a "
                    "BucketedGraphs, a capture_train_step step, a torch.cuda.CUDAGraph, or a list of them.")


def graph_pools(obj) -> list:
    """The distinct memory-pool ids of the graphs in ``obj`` (see :func:`_graphs_and_buffers` for what it reads)."""
    graphs, _ = _graphs_and_buffers(obj)
    return list(dict.fromkeys(tuple(g.pool()) for g in graphs))


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.data_ptr(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


class MemoryLedger:
    """A ledger of GPU memory: before/after any block of code, and per graph and pool.

    ``measure(label)`` records reserved and allocated memory (``torch.cuda.memory_reserved/allocated``), the
    device memory in use (``torch.cuda.mem_get_info``: it also sees what the allocator does not, such as
    graphs' own executables) and the growth of every graph pool, before and after the block.
    ``record(label, obj)`` reads the pools of the graphs that ``obj`` holds (a ``capture()`` result, a
    :class:`BucketedGraphs`, a ``capture_train_step`` step, a ``CUDAGraph``, or a list of them) from
    ``torch.cuda.memory_snapshot()``: bytes reserved and in use per pool, whether the pool is shared, and the
    static buffers kept outside the pools. ``table()`` returns all rows as a DataFrame (MiB).

    Example::

        ledger = MemoryLedger()
        with ledger.measure("buckets, shared pool"):
            serve = capture_buckets(model, sample)
        ledger.record("buckets, shared pool", serve)
        print(ledger.table())
    """

    def __init__(self, device=None):
        self.cuda = torch.cuda.is_available()
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu"))
        self.rows: list = []

    def snapshot(self) -> dict:
        """Reserved, allocated and device-used bytes now, and :func:`pool_usage` (empty dict without CUDA)."""
        if not self.cuda:
            return {}
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return {"reserved": torch.cuda.memory_reserved(self.device),
                "allocated": torch.cuda.memory_allocated(self.device),
                "device_used": total - free, "pools": pool_usage(self.device)}

    @contextlib.contextmanager
    def measure(self, label: str, note: str = ""):
        """Record memory before and after the ``with`` block (deltas in the ledger's table)."""
        before = self.snapshot()
        row = {"label": label, "kind": "before/after", "note": note}
        t0 = time.perf_counter()
        try:
            yield row
        finally:
            row["seconds"] = time.perf_counter() - t0
            after = self.snapshot()
            if before:
                pools_b, pools_a = before["pools"], after["pools"]
                growth = {p: a["reserved"] - pools_b.get(p, {}).get("reserved", 0)
                          for p, a in pools_a.items() if p != (0, 0)}
                row.update({
                    "reserved_before": before["reserved"], "reserved_after": after["reserved"],
                    "reserved_delta": after["reserved"] - before["reserved"],
                    "allocated_delta": after["allocated"] - before["allocated"],
                    "device_used_delta": after["device_used"] - before["device_used"],
                    "graph_pool_growth": sum(max(g, 0) for g in growth.values()),
                    "new_pools": len(set(pools_a) - set(pools_b)),
                })
            self.rows.append(row)

    def record(self, label: str, obj, note: str = "") -> dict:
        """Read the memory of the graphs in ``obj`` now; returns (and keeps) one row of the table."""
        graphs, buffers = _graphs_and_buffers(obj)
        pools = list(dict.fromkeys(tuple(g.pool()) for g in graphs))
        row = {"label": label, "kind": "graphs", "note": note, "graphs": len(graphs), "pools": len(pools),
               "pool_sharing": ("shared" if len(pools) < len(graphs) else "private") if graphs else "-",
               "buffers": _nbytes(buffers)}
        if self.cuda:
            usage = pool_usage(self.device)
            row["pool_reserved"] = sum(usage.get(p, {}).get("reserved", 0) for p in pools)
            row["pool_allocated"] = sum(usage.get(p, {}).get("allocated", 0) for p in pools)
            row["held"] = row["pool_reserved"] + row["buffers"]
        else:
            row["note"] = (note + "; " if note else "") + "no CUDA: nothing captured, no GPU memory held"
        self.rows.append(row)
        return row

    def table(self):
        """All rows as a pandas DataFrame, byte counts in MiB (columns ending in ``_mib``)."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        for col in list(df.columns):
            if col in ("reserved_before", "reserved_after", "reserved_delta", "allocated_delta",
                       "device_used_delta", "graph_pool_growth", "buffers", "pool_reserved", "pool_allocated",
                       "held"):
                df[col + "_mib"] = df[col] / MiB
                df = df.drop(columns=col)
        return df
