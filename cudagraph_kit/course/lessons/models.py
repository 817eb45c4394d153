"""The small models, data and eager baselines the lessons train, kept out of the lessons' cells.

Notebook 02's two-layer network with dropout, its optimizers, its regression batches (with a short last batch per
epoch) and the eager steps a graph is compared with (05 times them too); notebook 03's deeper MLP; notebook 06's
MLP. Everything lands on the GPU where there is one. Notebook 04's image models are in ``vision.py``, notebook 08's
language model in ``tiny_llm.py``.

Example::

    from cudagraph_kit.course.lessons.models import make_batches, make_model, make_opt, loss_fn
    model = make_model(128, 256, 16)                        # Linear, Dropout, Linear, Dropout
    opt = make_opt("Adam(capturable)", model.parameters())  # capturable=True on a GPU
    batches = make_batches(44, 32, 128, 16)                 # epochs of 10 batches of 32 and one of 8
"""
from __future__ import annotations

import contextlib
import copy
import math
import warnings

import torch

__all__ = ["SEED", "loss_fn", "default_device", "make_model", "make_opt", "make_batches", "eager_step",
           "detached_eager_step", "eager_amp_step", "amp_pair", "mlp_stack", "make_mlp", "StreamWarningNote",
           "ACCUMULATE_GRAD_STREAM_WARNING"]

SEED = 0
loss_fn = torch.nn.MSELoss()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_model(d_in, h, d_out, dropout=True, seed=SEED, device=None):
    """``Linear(d_in, h)``, ``Dropout(0.2)``, ``Linear(h, d_out)``, ``Dropout(0.1)`` (no dropout layers with
    ``dropout=False``), initialised from ``seed``."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(d_in, h), torch.nn.Dropout(0.2), torch.nn.Linear(h, d_out), torch.nn.Dropout(0.1)]
    if not dropout:
        layers = [m for m in layers if not isinstance(m, torch.nn.Dropout)]
    return torch.nn.Sequential(*layers).to(device or default_device())


def make_opt(name, params):
    """``"SGD"`` (lr 0.1), ``"SGD(fused=True)"`` (one fused kernel per step; with a GradScaler it checks for inf
    on the GPU) or ``"Adam(capturable)"`` (lr 1e-3; ``capturable=True`` on a GPU keeps its step count there, so
    its update can be captured; PyTorch's default implementation for CUDA tensors, foreach)."""
    if name == "SGD":
        return torch.optim.SGD(params, lr=0.1)
    if name == "SGD(fused=True)":
        return torch.optim.SGD(params, lr=0.1, fused=True)
    return torch.optim.Adam(params, lr=1e-3, capturable=torch.cuda.is_available())


def make_batches(n_steps, n, d_in, d_out, seed=1, per_epoch=10, short=8, device=None):
    """``n_steps`` (x, y) batches of a learnable regression task (a fixed random "teacher" plus noise): epochs of
    ``per_epoch`` full batches of ``n`` rows and one short batch of ``short`` rows, as a data loader without
    ``drop_last`` produces."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(d_in, d_out, generator=g) / math.sqrt(d_in)
    device = device or default_device()
    batches = []
    while len(batches) < n_steps:
        rows = n if (len(batches) + 1) % (per_epoch + 1) else short
        x = torch.randn(rows, d_in, generator=g)
        y = x @ teacher + 0.1 * torch.randn(rows, d_out, generator=g)
        batches.append((x.to(device), y.to(device)))
    return batches


def eager_step(model, opt, forward=None):
    """The ordinary eager training step, as a function of a batch: zero_grad, forward, loss, backward, step.
    ``forward``: what runs the model, if not ``model`` itself (e.g. ``torch.compile(model, mode="reduce-overhead")``;
    each step then starts with ``torch.compiler.cudagraph_mark_step_begin()``, a new iteration for its graphs)."""
    def run(x, y):
        if forward is not None:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn((forward or model)(x), y)
        loss.backward()
        opt.step()
        return loss
    return run


def detached_eager_step(model, opt):
    """``eager_step`` whose ``step(x, y)`` returns the loss detached, as a graph's step does (notebook 05)."""
    step = eager_step(model, opt)
    return lambda x, y: step(x, y).detach()


def eager_amp_step(model, opt, dtype, scaler):
    """The eager mixed-precision step: the forward under ``torch.autocast``; with a ``GradScaler``, the scaled
    backward, ``scaler.step`` and ``scaler.update``."""
    def run(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()
    return run


def amp_pair(base, opt_name, dtype, use_scaler, sample):
    """The eager AMP step and the graphed one (``capture_train_step(..., amp_dtype=dtype, scaler=...)``), each on
    its own copy of ``base`` with its own optimizer and scaler: ``(ref, eager_step, test, graphed_step)``."""
    from ... import capture_train_step

    ref, test = copy.deepcopy(base), copy.deepcopy(base)
    scaler = (lambda: torch.amp.GradScaler("cuda")) if use_scaler else (lambda: None)
    return (ref, eager_amp_step(ref, make_opt(opt_name, ref.parameters()), dtype, scaler()), test,
            capture_train_step(test, make_opt(opt_name, test.parameters()), loss_fn, sample, amp_dtype=dtype,
                               scaler=scaler()))


def mlp_stack(layers: int, width: int, seed: int, device=None):
    """``layers`` x (``Linear(width, width)`` + ``ReLU``), weights drawn after ``torch.manual_seed(seed)``: many
    short kernels per call, so a small batch is launch-bound (notebook 03, section 6)."""
    torch.manual_seed(seed)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks).to(device or default_device())


def make_mlp(d, h):
    """Four linear layers with GELU between them: each output row depends on its own input row alone."""
    from torch import nn

    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, h), nn.GELU(),
                         nn.Linear(h, d))


ACCUMULATE_GRAD_STREAM_WARNING = "AccumulateGrad node's stream does not match"   # autograd's, once per process


class StreamWarningNote:
    """Where autograd's ``AccumulateGrad`` stream warning came from (notebook 02, "Going further" H explains it:
    ``make_graphed_callables`` creates the parameters' accumulate nodes on its side stream). ``watch(where, case)``
    keeps that one warning out of a cell's output and notes the first place it came from in ``raised_by``
    (``[where, case]``; autograd raises it once per process); every other warning is shown as usual.

    Example::

        note = StreamWarningNote()
        with note.watch("section 5's make_graphed_callables rows", "MLP 32x128x256x16, SGD"):
            partial = graph_modules(model, (x,))
        note.raised_by   # None, or ["section 5's make_graphed_callables rows", "MLP 32x128x256x16, SGD"]
    """

    def __init__(self):
        self.raised_by = None

    @contextlib.contextmanager
    def watch(self, where: str, case: str):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield self
        for w in caught:
            if ACCUMULATE_GRAD_STREAM_WARNING in str(w.message):
                self.raised_by = self.raised_by or [where, case]
            else:   # any other warning: shown as usual
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
