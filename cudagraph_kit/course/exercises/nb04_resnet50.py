"""Checks for notebook 04's exercises (ResNet-50); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb04_resnet50 import predicted_speedup_at
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo, max_abs_diff, table_rows)

__all__ = ['predicted_speedup_at', 'check_batch_prediction', 'check_clip_norms', 'BOUNDS']


BOUNDS = ("launch-bound", "GPU-bound")


def predicted_speedup_at(batch, sweep) -> float:
    """Notebook 04's section-1 model at ``batch``: ``max(kernels × launch_us, floor) / floor``, where ``launch_us``
    is the eager host time per kernel (Python, dispatcher, ATen and the launch call, not the launch alone), with
    the floor and the kernels per call interpolated linearly between the measured batch sizes of ``sweep``
    (``curve[dtype]``: ``"eager"`` and ``"graph"`` rows indexed by batch, and ``"launch_us"``)."""
    import numpy as np

    e, g = sweep["eager"], sweep["graph"]
    floor = float(np.interp(batch, g.index.to_numpy(dtype=float), g["floor_us"].to_numpy(dtype=float)))
    kernels = float(np.interp(batch, e.index.to_numpy(dtype=float), e["kernels_per_call"].to_numpy(dtype=float)))
    return max(kernels * sweep["launch_us"], floor) / floor


@exercise("04_resnet50", 1, "predict, then measure, a batch size between two of the sweep", "cpu+gpu")
@check("04.1")
def check_batch_prediction(report, new_batch, predicted_speedup, new_graph, new_table, bound, sweep,
                           sweep_batches):
    """``new_batch``: a batch size not in ``sweep_batches`` (``INFER_BATCHES``), between two of them on a GPU;
    ``predicted_speedup``: :func:`predicted_speedup_at` from ``sweep`` (``curve[dtype]``) before measuring;
    ``new_graph``: ``capture(infer, x)`` at that batch; ``new_table``: ``compare`` of eager vs ``new_graph``;
    ``bound``: "launch-bound" or "GPU-bound" at that batch, from ``new_table``."""
    import math

    import torch

    if is_todo(new_batch):
        report.todo("new_batch: a batch size the sweep did not measure")
        return
    batches = sorted(sweep_batches)
    if not isinstance(new_batch, int) or new_batch < 1 or new_batch in batches:
        report.off(f"new_batch = {new_batch!r}: pick a positive int that INFER_BATCHES {batches} does not have")
        return
    if cuda() and not batches[0] < new_batch < batches[-1]:
        report.off(f"new_batch = {new_batch} lies outside the sweep ({batches[0]}..{batches[-1]}); the prediction "
                   "interpolates between two measured sizes", "e.g. 48, between 32 and 64.")
        return
    if is_todo(new_graph):
        report.todo("new_graph = capture(infer, x, eager_fallback=True) with x = image_batch(new_batch, dtype)")
    elif not hasattr(new_graph, "static_inputs") or not hasattr(new_graph, "fn"):
        report.off(f"new_graph is a {type(new_graph).__name__}, not what capture() returns")
        return
    elif new_graph.static_inputs[0].shape[0] != new_batch:
        report.off(f"new_graph was captured at batch {new_graph.static_inputs[0].shape[0]}, not {new_batch}")
        return
    else:
        x = torch.randn_like(new_graph.static_inputs[0])
        out, ref = new_graph(x).float(), new_graph.fn(x).float()
        diff = max_abs_diff(out, ref)
        if not (bool(torch.isfinite(ref).all()) and diff <= 1e-2 * ref.abs().max().item() + 1e-3):
            report.off(f"new_graph differs from eager on a fresh input by {diff:.3g}",
                       "capture the same infer function that the eager row times.")
            return
        report.right(f"correct before fast: the graph at batch {new_batch} matches eager on a fresh input "
                     f"(max |diff| {diff:.2g})")
    rows = table_rows(report, new_table, ["cuda graph*"],
                      todo="new_table = compare({'eager': infer, GRAPH_INFER: new_graph}, x, case=..., "
                           "samples=SAMPLES, calls=CALLS)",
                      missing="no row named 'cuda graph ...' (GRAPH_INFER) in the table",
                      hint="compare({'eager': infer, GRAPH_INFER: new_graph}, x, ...).")
    if rows is None:
        return
    (graph,) = rows
    if not cuda():
        report.right("the table has eager first and the graph row (both eager on this CPU)")
        report.needs_gpu("the prediction, the floor and launch- or GPU-bound need an NVIDIA GPU")
        return
    if graph["executed_as"] != "cuda graph":
        report.off(f"the graph row ran as {graph['executed_as']}", "time new_graph itself, captured on the GPU.")
        return
    want = predicted_speedup_at(new_batch, sweep)
    if is_todo(predicted_speedup):
        report.todo("predicted_speedup: max(kernels x launch_us, floor) / floor, interpolated at new_batch")
    elif not (isinstance(predicted_speedup, (int, float)) and math.isfinite(predicted_speedup)
              and abs(predicted_speedup - want) <= 0.02 * want):
        report.off(f"predicted_speedup = {predicted_speedup!r}, but the model of section 1 gives {want:.2f}x",
                   "floor and kernels per call: numpy.interp(new_batch, batches, values) over the sweep's graph "
                   "floor_us and eager kernels_per_call; launch_us = curve[dtype]['launch_us'].")
    else:
        report.right(f"your prediction follows section 1's host-time model: {want:.2f}x")
    eager = new_table.iloc[0]
    launches = float(eager["kernels_per_call"]) * sweep["launch_us"]
    actual = "launch-bound" if launches > graph["floor_us"] else "GPU-bound"
    if is_todo(bound):
        report.todo('bound: "launch-bound" or "GPU-bound" at new_batch (kernels x launch_us against the floor)')
    elif bound not in BOUNDS:
        report.off(f'bound must be "launch-bound" or "GPU-bound", got {bound!r}')
    elif bound != actual:
        report.off(f'you answered "{bound}", but your table says "{actual}": {eager["kernels_per_call"]:.0f} kernels x '
                   f'{sweep["launch_us"]:.1f} µs = {launches / 1e3:.2f} ms of launches against a floor of '
                   f'{graph["floor_us"] / 1e3:.2f} ms', "compare the eager row's launches with the graph row's floor.")
    else:
        report.right(f'"{bound}": {launches / 1e3:.2f} ms of launches against a floor of {graph["floor_us"] / 1e3:.2f} ms')
    report.note(f"batch {new_batch}: predicted {want:.2f}x, measured {graph['speedup']:.2f}x (quartiles "
                f"{graph['speedup_lo']:.2f}-{graph['speedup_hi']:.2f}); the graph runs at {graph['vs_floor']:.2f}x its "
                "floor. Where the two differ, eager is neither purely launch- nor purely GPU-bound: the CPU's launches "
                "and the GPU's work overlap only partly")


@exercise("04_resnet50", 2, "how often clipping acts, eager and graphed", "cpu+gpu")
@check("04.2")
def check_clip_norms(report, norms_eager, norms_graphed, clipped_fraction, max_norm, steps):
    """``norms_eager``: ``clip_grad_norm_``'s return value at each step of one epoch of the section-4 loop;
    ``norms_graphed``: ``step.grad_norm`` after each step of the graphed loop; ``clipped_fraction``: the share of
    graphed steps whose norm exceeds ``max_norm``; ``steps``: steps per epoch."""
    import torch

    if is_todo(norms_eager) or is_todo(norms_graphed):
        report.todo("record norms_eager and norms_graphed over one epoch of each loop")
        return
    lists = {"norms_eager": norms_eager, "norms_graphed": norms_graphed}
    for name, values in lists.items():
        if not isinstance(values, (list, tuple)) or len(values) != steps:
            report.off(f"{name} has {len(values) if hasattr(values, '__len__') else '?'} entries; one epoch has "
                       f"{steps} steps", "append one norm per step, for every batch of one epoch.")
            return
    tensors = [t for t in norms_graphed if isinstance(t, torch.Tensor)]
    shared = len({t.data_ptr() for t in tensors}) < len(tensors) if tensors else False
    e = torch.tensor([float(v) for v in norms_eager], dtype=torch.float64)
    g = torch.tensor([float(v) for v in norms_graphed], dtype=torch.float64)
    if shared:
        report.off("several entries of norms_graphed are one and the same tensor: each replay writes the new norm "
                   "into the memory of the last one, so they all hold the latest value",
                   "keep a copy after each step: step.grad_norm.clone() (or float(...) once the epoch is over).")
        return
    if not bool(torch.isfinite(e).all() and torch.isfinite(g).all()) or (e <= 0).any():
        report.off("some norms are not finite or not positive", "the norm clip_grad_norm_ returns, before clipping.")
        return
    rel = ((g - e).abs() / e).max().item()
    if rel > 2e-2:
        report.off(f"the graphed loop's norms differ from the eager loop's by up to {rel:.1%}",
                   "same seed and loader (small_cnn(), digits_loader(seed=1)), same schedule; record "
                   "clip_grad_norm_'s return value in the eager loop and step.grad_norm in the graphed one.")
        return
    if not cuda():
        report.right(f"the two loops give the same {steps} norms (max relative difference {rel:.1g})")
        report.needs_gpu("on a CPU both loops are eager; that the graph clips like eager shows on an NVIDIA GPU")
    else:
        report.right(f"the graph clips as the eager loop does: the norms before clipping agree within {rel:.1g} "
                     f"over {steps} steps")
    want = float((g > max_norm).double().mean())
    if is_todo(clipped_fraction):
        report.todo("clipped_fraction: the share of graphed steps whose norm is above max_norm")
    elif abs(float(clipped_fraction) - want) > 1e-9:
        report.off(f"clipped_fraction = {float(clipped_fraction):.3f}, but {int((g > max_norm).sum())} of {steps} "
                   f"norms are above {max_norm}: {want:.3f}")
    else:
        report.right(f"clipping acted on {int((g > max_norm).sum())} of {steps} steps ({want:.0%}); the largest norm "
                     f"was {g.max().item():.2f}, the smallest {g.min().item():.2f}")
