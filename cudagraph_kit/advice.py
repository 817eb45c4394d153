"""Will a CUDA graph help? :func:`advise` measures before anything is captured.

It times a function eagerly, counts its kernels with the profiler, measures the GPU time of its calls queued
back to back (the floor a graph cannot go below), takes off the launch gaps a graph removes and predicts the best
speedup a graph can reach. :func:`measure_replay_cost` measures what a replay costs on this GPU and host.

Example::

    import torch
    from cudagraph_kit.advice import advise

    x = torch.randn(1, 3, 224, 224, device="cuda")
    print(advise(torch.nn.functional.gelu, x))   # eager µs, floor µs, kernels, best graph µs, speedup up to N x

It needs ``torch`` and the kit's ``timing.py`` beside it (and pandas).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves


if __package__:
    from . import timing  # timings, GPU time queued back to back, the profiler's kernel counts
else:  # this file copied beside timing.py, outside the package: that timing.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("timing")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's timing.py from its own folder {_here}, "
                          f"but `import timing` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/timing.py beside it, that folder first on sys.path.")
    import timing  # type: ignore[import-not-found, no-redef]

__all__ = ["advise", "Advice", "measure_replay_cost", "ReplayCost", "predict_graph_time", "graph_gpu_time",
           "expected_effect", "ABOUT", "CLEARLY"]


# ------------------------------------------------------------------------------------------------- advise
@dataclasses.dataclass
class ReplayCost:
    """What a CUDA graph replay costs on this GPU and host, from tiny graphs of one-element kernels (µs).

    - ``launch_us``: host time of one replay of a one-node graph (what a tiny graph costs at least);
    - ``graph_node_us``, ``graph_start_us``: GPU time of a replay = ``start + nodes * node`` for tiny nodes;
    - ``eager_node_us``, ``eager_start_us``: the same kernels launched one by one and queued back to back.

    ``gap_saved_us`` (eager node minus graph node) is what a graph saves per kernel on the GPU side: kernels
    launched one by one leave a gap of about a microsecond between them even when they are queued; inside a
    graph the next node starts sooner.
    """
    launch_us: float
    graph_node_us: float
    graph_start_us: float
    eager_node_us: float
    eager_start_us: float

    @property
    def gap_saved_us(self) -> float:
        return max(self.eager_node_us - self.graph_node_us, 0.0)


@dataclasses.dataclass
class Advice:
    """What :func:`advise` measured and predicts (times in µs per call).

    ``floor_us`` is the GPU time of the eager calls queued back to back; ``graph_gpu_us`` the GPU time the same
    kernels can take in a graph (the floor less the launch gaps a graph removes); ``graph_us`` the best time per
    call: the larger of that and the host's cost of one replay. ``speedup`` is ``eager_us / graph_us``, the best a
    graph can reach; ``speedup_if_no_gap_saved`` the same with the eager floor kept whole. ``verdict`` puts the
    prediction in words, and ``effect`` is their direction (:func:`expected_effect`: "faster", "about as fast"
    within ``ABOUT`` x of eager either way, "slower"), the thing a measured speedup can confirm or contradict.
    """
    device: str
    eager_us: float = float("nan")
    floor_us: float = float("nan")
    kernels_per_call: float = float("nan")
    graph_gpu_us: float = float("nan")
    launch_us: float = float("nan")
    graph_us: float = float("nan")
    speedup: float = float("nan")
    speedup_if_no_gap_saved: float = float("nan")
    verdict: str = ""

    @property
    def effect(self) -> str:
        return expected_effect(self.speedup)

    def __str__(self):
        if math.isnan(self.eager_us):
            return f"advise: {self.verdict}"
        return (f"advise on {self.device}: eager {self.eager_us:.1f} µs/call, GPU time back to back "
                f"{self.floor_us:.1f} µs, {self.kernels_per_call:.0f} kernels/call; in a graph about "
                f"{self.graph_gpu_us:.1f} µs of GPU time, a replay costs the host {self.launch_us:.1f} µs -> best "
                f"graph {self.graph_us:.1f} µs, speedup up to {self.speedup:.2f}x "
                f"({self.speedup_if_no_gap_saved:.2f}x if no launch gap is saved). {self.verdict}")

    __repr__ = __str__


def predict_graph_time(gpu_us: float, nodes: float, cost: ReplayCost) -> float:
    """The least time per call a graph can take: its GPU time, at least ``nodes`` tiny nodes' worth, and at least
    the host's cost of one replay.

    Example::

        predict_graph_time(6.9, 5, measure_replay_cost())   # GPU-bound: 6.9; a 1-node graph: the launch cost
    """
    return max(gpu_us, cost.graph_start_us + nodes * cost.graph_node_us, cost.launch_us)


def graph_gpu_time(eager_gpu_us: float, nodes: float, cost: ReplayCost) -> float:
    """GPU time of ``nodes`` kernels replayed from a graph, from their GPU time queued back to back eagerly: the
    launch gaps a graph removes (``cost.gap_saved_us`` each) come off, the graph's own start goes on.

    Example::

        graph_gpu_time(12.4, 5, measure_replay_cost())   # about 7.6 µs on an H100 for five small kernels
    """
    return max(eager_gpu_us - nodes * cost.gap_saved_us + cost.graph_start_us - cost.eager_start_us, 0.0)


ABOUT = 1.1   # a predicted speedup within this factor of 1 either way (1/1.1 to 1.1) reads "about as fast"
CLEARLY = 1.5  # from this predicted speedup on, "a graph should help"; between ABOUT and it, "helps a little"


def expected_effect(speedup: float, about: float = ABOUT) -> str:
    """Which way :func:`advise`'s words point for a predicted speedup: ``"faster"`` above ``about``,
    ``"slower"`` below ``1 / about``, ``"about as fast"`` in between, ``"unknown"`` for NaN. The words of an
    :class:`Advice` (its ``verdict``) follow this, so a measured speedup can be checked against them.

    Example::

        expected_effect(1.06)   # 'about as fast': within 1.1x of eager either way
        expected_effect(1.8)    # 'faster'
    """
    if not speedup == speedup:
        return "unknown"
    if speedup > about:
        return "faster"
    if speedup < 1 / about:
        return "slower"
    return "about as fast"


def _verdict(speedup: float) -> str:
    """advise's words for a predicted best speedup; their direction is :func:`expected_effect`'s."""
    effect = expected_effect(speedup)
    if effect == "unknown":
        return "No prediction: a time was not measured."
    if effect == "faster":
        if speedup >= CLEARLY:
            return f"Launch-bound: a graph should help (a predicted speedup of {CLEARLY:g}x or more)."
        return (f"Partly launch-bound: a graph should help a little (a predicted speedup between {ABOUT:g}x and "
                f"{CLEARLY:g}x).")
    if effect == "slower":
        return (f"A graph should be slower than eager: its predicted time per call is above eager's (a predicted "
                f"speedup below {1 / ABOUT:.2f}x).")
    return (f"GPU-bound: eager is already near the floor; a graph should run about as fast as eager (a predicted "
            f"speedup within {ABOUT:g}x of eager either way, {1 / ABOUT:.2f}x-{ABOUT:g}x).")


_REPLAY_COST: dict = {}


def measure_replay_cost(device=None, nodes: tuple = (1, 33)) -> ReplayCost:
    """The :class:`ReplayCost` of this GPU and host, measured on the spot with chains of ``nodes`` one-element
    kernels, as graphs and eagerly (cached per device). Needs CUDA.

    Example::

        cost = measure_replay_cost()
        print(cost.launch_us, cost.graph_node_us, cost.gap_saved_us)
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measuring graph replay cost needs an NVIDIA GPU; torch.cuda.is_available() is False.")
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if (idx, nodes) in _REPLAY_COST:
        return _REPLAY_COST[(idx, nodes)]
    lo, hi = min(nodes), max(nodes)
    with torch.cuda.device(idx):
        x = torch.zeros(1, device=dev)

        def chain(k):
            def run():
                for _ in range(k):
                    x.add_(1.0)
            return run

        graphs = {}
        for k in (lo, hi):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                chain(1)()
            torch.cuda.current_stream().wait_stream(side)
            graphs[k] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[k]):
                chain(k)()
        # the host's cost of a replay: a one-node graph's replay is bound by the host, not the GPU
        launch = timing.timeit(graphs[lo].replay).median_us
        graph_gpu = {k: timing.device_time(graphs[k].replay, calls=10)[0] for k in (lo, hi)}
        eager_gpu = {k: timing.device_time(chain(k), calls=10)[0] for k in (lo, hi)}
        del graphs
    graph_node = max((graph_gpu[hi] - graph_gpu[lo]) / (hi - lo), 0.0)
    eager_node = max((eager_gpu[hi] - eager_gpu[lo]) / (hi - lo), 0.0)
    cost = ReplayCost(launch_us=float(launch), graph_node_us=graph_node,
                      graph_start_us=max(graph_gpu[lo] - lo * graph_node, 0.0), eager_node_us=eager_node,
                      eager_start_us=max(eager_gpu[lo] - lo * eager_node, 0.0))
    _REPLAY_COST[(idx, nodes)] = cost
    return cost


def advise(fn: Callable, *args, cost: ReplayCost | None = None, samples: int = 7) -> Advice:
    """Will a CUDA graph help ``fn(*args)``? Measure before capturing anything.

    Times ``fn`` eagerly (median per call), counts kernels and copies per call with the profiler, measures the
    GPU time of the calls queued back to back (``timing.device_time``, the eager floor), takes off the launch gaps
    a graph removes (:func:`graph_gpu_time`) and predicts the best graph time with :func:`predict_graph_time`: a
    graph removes launches, not GPU work. ``cost`` (a :class:`ReplayCost`) is measured on the spot with tiny
    graphs unless given. Without CUDA it says so and measures nothing.

    Example::

        print(advise(model, x))     # eager µs, floor µs, kernels, best graph µs, speedup up to N x
    """
    cuda_args = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor) and a.is_cuda]
    if not torch.cuda.is_available():
        return Advice("cpu", verdict="CUDA graphs need an NVIDIA GPU and torch.cuda.is_available() is False: "
                                     "nothing was measured.")
    device = cuda_args[0].device if cuda_args else torch.device("cuda", torch.cuda.current_device())
    df = timing.compare({"eager": fn}, *args, case="advise", samples=samples)
    row = df.iloc[0]
    eager = float(row["median_us"])
    nodes = float(row.get("kernels_per_call", float("nan")))
    # The profiler records kernels launched one by one longer than they run, so the floor here is the GPU time of
    # the calls queued back to back (CUDA events), with few enough calls that the launch queue never fills.
    calls = int(max(1, min(20, 400 // max(nodes, 1.0)))) if nodes == nodes else 5
    # the least of three tries, preferring those where every call was queued before the GPU reached it: anything
    # else on the GPU or a stalled host only ever adds time
    tries = [timing.device_time(fn, *args, calls=calls, host_us=eager) for _ in range(3)]
    floor = min(t for t, queued in tries if queued or not any(q for _, q in tries))
    copies = float(row.get("copies_per_call", 0.0) or 0.0)
    nodes = nodes + (copies if not math.isnan(copies) else 0.0)
    cost = cost if cost is not None else measure_replay_cost(device)
    gpu = graph_gpu_time(floor, nodes, cost)
    graph_us = predict_graph_time(gpu, nodes, cost)
    speedup = eager / graph_us if graph_us > 0 else float("nan")
    plain = predict_graph_time(floor, nodes, cost)
    return Advice(str(device), eager, floor, nodes, gpu, cost.launch_us, graph_us, speedup,
                  eager / plain if plain > 0 else float("nan"), _verdict(speedup))
