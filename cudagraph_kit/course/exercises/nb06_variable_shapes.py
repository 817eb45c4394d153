"""Checks for notebook 06's exercises (variable shapes); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb06_variable_shapes import check_uniform_plan
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo)

__all__ = ['check_uniform_plan', 'check_batch_mixing', 'MIXING_WHY']


def _padded_sizes(sizes, max_rows):
    """Request sizes up to ``max_rows`` that are not bucket sizes (so they get padded)."""
    return [n for n in range(1, max_rows + 1) if n not in set(sizes)]


def _max_verify(serve, sizes):
    """The largest ``serve.verify`` difference over requests of each size in ``sizes`` (NaN padding)."""
    import torch

    row_shape = tuple(serve.static_inputs[0].shape[1:])
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for n in sizes:
        x = torch.randn((n, *row_shape), generator=gen).to(serve.static_inputs[0])
        worst = max(worst, serve.verify(x))
    return worst


@exercise("06_variable_shapes", 1, "buckets for uniform traffic", "cpu+gpu")
@check("06.1")
def check_uniform_plan(report, uniform_sizes, uniform_plan, moved, serve_uniform, max_rows, skewed_sizes,
                       reference=None):
    """``uniform_sizes``: request sizes drawn uniformly from 1..``max_rows``; ``uniform_plan``: ``plan_buckets``
    on them with at most as many graphs as ``ladder(max_rows)``; ``moved``: "larger", "smaller" or "same" (where
    the buckets went, against a plan of as many graphs on ``skewed_sizes``); ``serve_uniform``:
    ``capture_buckets`` of the plan; ``reference``: the default ladder's ``BucketedGraphs`` (memory, GPU)."""
    import statistics

    from ...bucket_graphs import ladder
    from ...bucket_plan import evaluate_buckets, plan_buckets

    if is_todo(uniform_sizes):
        report.todo("uniform_sizes: HISTORY sizes drawn uniformly from 1..MAX_ROWS")
        return
    sizes = list(uniform_sizes)
    if len(sizes) < 100 or not all(isinstance(s, int) and 1 <= s <= max_rows for s in sizes):
        report.off(f"uniform_sizes must be at least 100 ints in 1..{max_rows}",
                   "torch.randint(1, MAX_ROWS + 1, (HISTORY,), generator=...).tolist()")
        return
    upper = sum(s > max_rows / 2 for s in sizes) / len(sizes)
    if not 0.4 <= upper <= 0.6:
        report.off(f"{upper:.0%} of uniform_sizes lie above MAX_ROWS / 2; uniform traffic puts about half there",
                   "draw every size from 1..MAX_ROWS with equal chance (torch.randint), not from parts.draw_sizes "
                   "(skewed small).")
        return
    report.right(f"{len(sizes)} sizes, {upper:.0%} of them above {max_rows // 2}: uniform traffic")
    if is_todo(uniform_plan):
        report.todo("uniform_plan = plan_buckets(uniform_sizes, max_graphs=len(ladder(MAX_ROWS)), max_size=MAX_ROWS)")
        return
    default = ladder(max_rows)
    if not hasattr(uniform_plan, "sizes") or not hasattr(uniform_plan, "pad_fraction"):
        report.off(f"uniform_plan is a {type(uniform_plan).__name__}, not the BucketPlan plan_buckets returns")
        return
    k = uniform_plan.n_graphs
    if uniform_plan.sizes[-1] != max_rows or k > len(default):
        report.off(f"the plan has {k} buckets ending at {uniform_plan.sizes[-1]}; it needs at most {len(default)} "
                   f"(the default ladder's count) and its largest at {max_rows}", "max_graphs=len(ladder(MAX_ROWS)), "
                   "max_size=MAX_ROWS.")
        return
    best = plan_buckets(sizes, max_graphs=k, max_size=max_rows)
    mine = evaluate_buckets(sizes, uniform_plan.sizes)["pad_fraction"]
    if mine > best.pad_fraction + 1e-9:
        report.off(f"on uniform_sizes your buckets pad {mine:.1%} of the rows; the planner reaches {best.pad_fraction:.1%}"
                   f" with {k}", "plan on uniform_sizes, not on history_sizes.")
        return
    ladder_pad = evaluate_buckets(sizes, default)["pad_fraction"]
    report.right(f"planned for uniform traffic: {k} buckets {uniform_plan.sizes}, {mine:.1%} of the rows padded "
                 f"against {ladder_pad:.1%} for the default ladder {default}")
    skewed = plan_buckets(list(skewed_sizes), max_graphs=k, max_size=max_rows)
    a, b = statistics.mean(uniform_plan.sizes), statistics.mean(skewed.sizes)
    actual = "larger" if a > b else "smaller" if a < b else "same"
    if is_todo(moved):
        report.todo('moved: "larger", "smaller" or "same" against the plan of as many graphs on history_sizes')
    elif moved not in ("larger", "smaller", "same"):
        report.off(f'moved must be "larger", "smaller" or "same", got {moved!r}')
    elif moved != actual:
        report.off(f'you answered "{moved}", but the buckets planned on history_sizes are {skewed.sizes} (mean '
                   f'{b:.1f}) and yours {uniform_plan.sizes} (mean {a:.1f})',
                   "plan_buckets(history_sizes, max_graphs=..., max_size=MAX_ROWS) gives the skewed plan.")
    else:
        report.right(f'"{moved}": on skewed traffic the planner puts its buckets among the many small requests '
                     f"({skewed.sizes}); uniform traffic spreads them out ({uniform_plan.sizes})")
    if is_todo(serve_uniform):
        report.todo("serve_uniform = capture_buckets(mlp, sample, sizes=uniform_plan.sizes, eager_fallback=True)")
        return
    if list(getattr(serve_uniform, "sizes", [])) != list(uniform_plan.sizes):
        report.off(f"serve_uniform has buckets {getattr(serve_uniform, 'sizes', None)}, not the plan's "
                   f"{uniform_plan.sizes}", "capture_buckets(..., sizes=uniform_plan.sizes)")
        return
    padded = _padded_sizes(serve_uniform.sizes, max_rows)
    worst = _max_verify(serve_uniform, padded)
    if not worst < 1e-4:
        report.off(f"with NaN padding a request differs from eager by {worst:g}: the padding leaked into real rows")
        return
    report.right(f"correct before fast: requests of all {len(padded)} padded sizes match eager with NaN in the "
                 f"padding (max |diff| {worst:.1e})")
    if not cuda():
        report.needs_gpu("on a CPU the buckets run eagerly; their graphs and the memory they hold need an NVIDIA GPU")
        return
    if serve_uniform.mode != "graph" or serve_uniform.pool is None:
        report.off("serve_uniform did not capture graphs into one shared pool", "capture_buckets(..., pool='shared'), "
                   "the default, on the GPU.")
        return
    from ...memory import MemoryLedger
    ledger = MemoryLedger()
    held = ledger.record("uniform plan", serve_uniform)["held"] / 2 ** 20
    text = f"{k} graphs in one shared pool, holding {held:.1f} MiB"
    if reference is not None:
        text += f" (the default ladder: {ledger.record('default ladder', reference)['held'] / 2 ** 20:.1f} MiB)"
    report.right(text)


MIXING_WHY = {
    "a": "Attention cannot take NaN as input, so verify fails for any model with attention.",
    "b": "Each real row's output is now a weighted sum over all rows of the bucket, padding rows included: whatever "
         "the padding holds (zeros, an earlier request's rows, NaN) changes the real rows, so the answer depends on "
         "the bucket a request lands in, not on the request alone.",
    "c": "The buckets were captured for another sequence length, so the replay reads the wrong shape.",
}


@exercise("06_variable_shapes", 2, "a block whose rows see each other", "cpu")
@check("06.2")
def check_batch_mixing(report, BatchMixingBlock, mixing_leak, why, d_block, heads, sample):  # noqa: N803
    """``BatchMixingBlock``: section 2's ``Block`` with attention across the requests (the batch dim);
    ``mixing_leak``: ``verify`` of its buckets on a padded request; ``why``: "a", "b" or "c" (``MIXING_WHY``);
    ``d_block``, ``heads``: the block's sizes; ``sample``: a request-like tensor of the block's rows."""
    import math

    import torch

    from ...bucket_graphs import capture_buckets

    if is_todo(BatchMixingBlock):
        report.todo("write the class BatchMixingBlock")
    elif not (isinstance(BatchMixingBlock, type) and issubclass(BatchMixingBlock, torch.nn.Module)):
        report.off(f"BatchMixingBlock is a {type(BatchMixingBlock).__name__}; pass the class")
    elif "forward" not in vars(BatchMixingBlock):
        report.todo("BatchMixingBlock has no forward of its own yet: its body is still the placeholder")
    else:
        torch.manual_seed(0)
        model = BatchMixingBlock(d_block, heads).to(sample.device).eval()
        x = sample[:5].clone()
        with torch.no_grad():
            out = model(x)
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                report.todo(f"BatchMixingBlock()(x) returned {type(out).__name__}"
                            + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else "")
                            + f"; a block returns its input's shape {tuple(x.shape)}")
                model = None
            else:
                y = x.clone()
                y[-1] = torch.randn(y[-1].shape, generator=torch.Generator().manual_seed(1)).to(y)  # the last only
                changed = (model(y)[:-1] - out[:-1]).abs().max().item()
                if changed <= 1e-5 * out.abs().max().item():  # rounding at most: the rows do not mix
                    report.off("changing one request leaves the others' outputs unchanged: its rows still do not "
                               "see each other", "let attention run over dim 0: e.g. transpose(0, 1) before and after "
                               "Block.forward, so the requests become the sequence.")
                    model = None
                else:
                    report.right(f"changing one request changes the others' outputs (by up to {changed:.2g}): "
                                 "attention now runs across the requests")
        if model is not None:
            serve = capture_buckets(model, sample, eager_fallback=True)
            leak = _max_verify(serve, [n for n in _padded_sizes(serve.sizes, sample.shape[0])][:3])
            if math.isinf(leak):
                report.right("verify reports inf: NaN in the padding reached the real rows")
            else:
                report.off(f"verify on its buckets reports {leak:g}, not inf")
    if is_todo(mixing_leak):
        report.todo("mixing_leak: capture_buckets(model, sample, eager_fallback=True).verify(x) for a padded x")
    elif not (isinstance(mixing_leak, float) and math.isinf(mixing_leak)):
        report.off(f"mixing_leak = {mixing_leak!r}; verify of the mixing block on a padded request reports inf",
                   "x must have a size that is not a bucket (e.g. 3 rows), so that there is padding to poison.")
    else:
        report.right("your verify() call reports inf too")
    if is_todo(why):
        report.todo('why: "a", "b" or "c" (MIXING_WHY)')
    elif why != "b":
        report.off(f'"{why}" is not it: {MIXING_WHY.get(why, "not one of a, b, c")}',
                   "what does each real row's output depend on, once attention runs over the requests?")
    else:
        report.right("b: the padding becomes part of every request's answer; only functions whose rows never see "
                     "each other may be padded")
