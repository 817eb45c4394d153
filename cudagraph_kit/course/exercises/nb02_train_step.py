"""Checks for notebook 02's exercises (training step); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb02_train_step import check_amp_adam
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo, max_abs_diff, row, table_rows)

__all__ = ['check_amp_adam', 'check_lr_schedule', 'check_short_batches', 'STEP_PARTS']


STEP_PARTS = ("zero_grad", "forward", "loss", "backward", "unscale + inf check", "optimizer.step", "scaler.update")
_EAGER_WITH_SCALER = {"unscale + inf check", "optimizer.step", "scaler.update"}
_NOT_RUN = "zero_grad"  # neither eager nor in the graph after capture (train_step.py, GraphedTrainStep._capture)
_NOT_RUN_WHY = ("zero_grad is not run at all after capture, neither eagerly nor inside the graph: capture_train_step "
                "sets the gradients to None once, just before capturing, so the captured backward allocates them and "
                "each replay writes fresh gradients into the same .grad tensors (only warm-up steps and eager steps "
                "on other shapes call zero_grad)")


# one concrete next step per misplaced part: which call, which argument, why (train_step.py, GraphedTrainStep)
_PART_HINTS = {
    "zero_grad": "zero_grad: see section 2, point 3 of the recipe (set_to_none=True once, right before capture).",
    "forward": "forward: capture_train_step(..., amp_dtype=torch.float16) runs the model under "
               "torch.autocast(cache_enabled=False) inside the graph, so the forward replays.",
    "loss": "loss: loss_fn(model(x), y) is captured with the forward, so it replays too.",
    "backward": "backward: the graph captures scaler.scale(loss).backward(); the scale is a tensor on the GPU, so "
                "the multiply and the whole backward replay. Only what comes after the backward runs eagerly.",
    "unscale + inf check": "unscale + inf check: scaler.step(opt) first unscales the gradients and looks for "
                           "inf/NaN. With Adam(capturable=True) (not fused) that answer is read on the CPU, which a "
                           "capture forbids, so the kit calls scaler.step(opt) eagerly after each replay.",
    "optimizer.step": "optimizer.step: scaler.step(opt) calls opt.step() only when no gradient was inf, a choice "
                      "made on the CPU after the check, so the optimizer step runs inside scaler.step, eagerly.",
    "scaler.update": "scaler.update: scaler.update() sets the next scale from what scaler.step found (halve it "
                     "after an inf, grow it after many clean steps); it runs after scaler.step, so eagerly too.",
}


@exercise("02_train_step", 1, "Adam with fp16 and a GradScaler", "cpu+gpu")
@check("02.1")
def check_amp_adam(report, still_eager, amp_adam_table, max_param_diff, reference=None):
    """``still_eager``: the parts of a step (from ``STEP_PARTS``) that run eagerly with fp16 + GradScaler;
    ``amp_adam_table``: ``compare`` of the eager AMP Adam loop vs the whole-step graph; ``max_param_diff``: graph vs
    eager AMP Adam parameters after the same steps; ``reference``: the notebook's ``amp_timing``."""
    if is_todo(still_eager):
        report.todo(f"still_eager: which of {list(STEP_PARTS)} still run eagerly with fp16 + GradScaler?")
    else:
        parts = {still_eager} if isinstance(still_eager, str) else set(still_eager)
        unknown = parts - set(STEP_PARTS)
        missing, extra = _EAGER_WITH_SCALER - parts, parts - _EAGER_WITH_SCALER - unknown
        not_run = extra & {_NOT_RUN}
        if unknown:
            report.off(f"not parts of a step: {sorted(unknown)}; pick from {list(STEP_PARTS)}")
        elif missing or extra:
            report.off(f"still_eager = {sorted(parts)}: " + "; ".join(
                ([f"also eager: {sorted(missing)}"] if missing else [])
                + ([f"inside the graph: {sorted(extra - not_run)}"] if extra - not_run else [])
                + ([_NOT_RUN_WHY] if not_run else [])),
                " ".join(_PART_HINTS[p] for p in STEP_PARTS if p in missing | extra))
        else:
            report.right("scaler.step (unscale, inf check on the CPU, then optimizer.step) and scaler.update run "
                         "eagerly after each replay: with Adam that is the whole update, many launches per step")
    if not cuda():
        report.needs_gpu("AMP through a CUDA graph, its parity and its timing need an NVIDIA GPU")
        return
    if is_todo(max_param_diff):
        report.todo("max_param_diff: train the eager AMP Adam loop and the graphed one on the same batches, compare")
    elif not max_param_diff < 1e-4:
        report.off(f"the graphed AMP Adam step ends {max_param_diff:.3g} away from the eager one",
                   "same seed and model copy, same batches, Adam(capturable=True), a GradScaler for each loop.")
    else:
        report.right(f"parity first: graphed and eager AMP Adam agree (max |param diff| {max_param_diff:.2g})")
    rows = table_rows(report, amp_adam_table, ["whole-step graph"],
                      todo="amp_adam_table = compare({'eager': ..., GRAPH: ...}, x, y, case=..., ...)",
                      missing="no 'whole-step graph' row that ran as a CUDA graph",
                      hint="compare({'eager': eager_amp_step(...), GRAPH: capture_train_step(...)}, x, y, case=...).",
                      ok=lambda rows: rows[0]["executed_as"] == "cuda graph")
    if rows is None:
        return
    (graph,) = rows
    text = f"Adam, fp16 + GradScaler: whole-step graph {graph['median_us']:.0f} µs, {graph['speedup']:.2f}x eager"
    ref = None
    if reference is not None and len(reference):
        sel = reference[reference["case"].astype(str).str.contains("fp16")]
        ref = row(sel, "whole-step graph") if len(sel) else None
    if ref is not None:
        text += f" (SGD in section 6: {ref['speedup']:.2f}x)"
    report.right(text)


@exercise("02_train_step", 2, "a learning-rate schedule in a graphed loop", "cpu+gpu")
@check("02.2")
def check_lr_schedule(report, graphed_model, eager_model, optimizer, lrs):
    """``graphed_model``: trained with ``capture_train_step`` and a scheduler; ``eager_model``: the same, eagerly;
    ``optimizer``: the graphed run's optimizer; ``lrs``: the learning rate after each step (floats)."""
    import torch

    if any(is_todo(v) for v in (graphed_model, eager_model, optimizer, lrs)):
        report.todo("fill in graphed_model, eager_model, optimizer and lrs")
        return
    lr = optimizer.param_groups[0]["lr"]
    if not isinstance(lr, torch.Tensor) and isinstance(optimizer, torch.optim.SGD) and not optimizer.defaults.get("fused"):
        report.off(f"the lr is a Python {type(lr).__name__} and plain SGD reads it on the host inside its step: a graph "
                   "keeps the value from capture, so capture_train_step refuses a schedule that changes it",
                   "SGD(..., fused=True), or Adam(..., lr=torch.tensor(1e-3, device=DEVICE), capturable=CUDA): the "
                   "graph then reads the lr from GPU memory at every replay.")
    elif not isinstance(lr, torch.Tensor):
        report.right(f"the lr is a Python {type(lr).__name__}: capture_train_step keeps it in a GPU tensor that the "
                     "graph reads, and copies each new value in before a replay (a hand-written graph would keep "
                     "the value it saw at capture)")
    elif cuda() and lr.device.type != "cuda":
        report.off("the lr tensor is on the CPU; the graph needs it in GPU memory", "torch.tensor(1e-3, device='cuda')")
    else:
        report.right(f"the lr is a {lr.device.type} tensor that the scheduler updates in place")
    values = [float(v) for v in lrs]
    if len(set(values)) < 2:
        report.off(f"the recorded lr never changed ({values[:1]})", "call scheduler.step() after each training step "
                   "and append float(optimizer.param_groups[0]['lr']).")
        return
    report.right(f"the schedule changed the lr {len(set(values)) - 1} time(s), from {values[0]:.3g} to "
                 f"{values[-1]:.3g}")
    diff = max(max_abs_diff(p, q) for p, q in zip(graphed_model.parameters(), eager_model.parameters()))
    if diff > 1e-5:
        report.off(f"the graphed model ends {diff:.3g} away from the eager one: the graph did not follow the schedule",
                   "both runs: same initial model, same batches, the same scheduler stepped after every step.")
    elif not cuda():
        report.right(f"the two runs agree (max |param diff| {diff:.2g}); on a CPU both are eager")
        report.needs_gpu("that the replayed graph follows the schedule shows only on an NVIDIA GPU")
    else:
        report.right(f"the graphed run follows the schedule: parameters match eager (max |diff| {diff:.2g})")


@exercise("02_train_step", 3, "short batches and what they cost", "cpu+gpu")
@check("02.3")
def check_short_batches(report, short_batches, predicted_eager_steps, short_step, extra_us, timing,
                        case="MLP 32x128x256x16, SGD"):
    """``short_batches``: batches of several sizes; ``predicted_eager_steps``: counted from their sizes before
    running; ``short_step``: the ``capture_train_step`` they all ran through; ``extra_us``: eager steps × (eager −
    graph µs) from ``timing``, row ``case``."""
    if any(is_todo(v) for v in (short_step, short_batches)):
        report.todo("build short_batches and run them through a new capture_train_step, short_step")
        return
    step, batches = short_step, short_batches
    sizes = [tuple(b[0].shape) for b in batches]
    captured = tuple(step.static_batch[0].shape)
    other = sum(s != captured for s in sizes)
    if len(set(sizes)) < 3:
        report.off(f"the batches have {len(set(sizes))} distinct shape(s); the exercise asks for several sizes",
                   "e.g. epochs of datasets whose size is not a multiple of the batch size (drop_last=False).")
    if step.eager_steps != other:
        report.off(f"step.eager_steps is {step.eager_steps}, but {other} of your {len(batches)} batches differ from "
                   f"the captured shape {captured}", "run every batch of `batches` through this step, once.")
    else:
        report.right(f"{other} of {len(batches)} batches ran eagerly: exactly those whose shape is not {captured}")
    if is_todo(predicted_eager_steps):
        report.todo("predicted_eager_steps: count them from the sizes before you run")
    elif predicted_eager_steps != other:
        report.off(f"you predicted {predicted_eager_steps} eager steps; {other} batches differ from the captured shape",
                   "only the shape of the sample batch is captured; warm-up steps are not eager fallbacks.")
    else:
        report.right("your prediction was right")
    if is_todo(extra_us):
        report.todo("extra_us: eager steps × (eager µs − graph µs) from the timing table")
        return
    sel = timing[timing["case"] == case]
    e, g = (row(sel, v) for v in ("eager", "whole-step graph")) if len(sel) else (None, None)
    if e is None or g is None:
        report.off(f"the timing table has no eager and whole-step graph rows for case {case!r}")
        return
    expected = other * (e["median_us"] - g["median_us"])
    if abs(extra_us - expected) > max(1.0, 0.02 * abs(expected)):
        report.off(f"extra_us = {extra_us:.1f}, but {other} × ({e['median_us']:.1f} − {g['median_us']:.1f}) µs = "
                   f"{expected:.1f} µs", f"use the median_us of the eager and whole-step graph rows of {case!r}.")
    elif not cuda():
        report.right(f"extra_us = {extra_us:.1f} µs from the table's CPU times")
        report.needs_gpu("on a CPU both rows are eager, so the difference is noise; the GPU run gives the real cost")
    else:
        report.right(f"the short batches cost {extra_us:.0f} µs more than graph replays would "
                     f"({e['median_us'] / g['median_us']:.1f}x a graphed step each); drop_last=True, or one graph "
                     "per batch size, avoids it")
