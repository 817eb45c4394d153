"""Capture a whole training step (forward, loss, backward, optimizer step) as one CUDA graph.

``capture_train_step`` returns a small state machine. Every call is exactly one real training step on the
batch it is given, so a loop that uses it trains like the eager loop it replaces:

1. ``warmup`` calls: ordinary eager steps on a side stream (lazy initialisation, cuBLAS handles, optimizer
   state), each after ``optimizer.zero_grad(set_to_none=True)``;
2. the next call: ``zero_grad(set_to_none=True)``, then forward + loss + backward + ``optimizer.step()`` are
   captured into one ``torch.cuda.CUDAGraph`` over static batch buffers, then replayed once (capturing
   records the work, it does not run it);
3. every later call: copy the batch into the static buffers and replay. No ``zero_grad`` is needed: the
   captured backward writes fresh gradients into the same ``.grad`` tensors each replay.

A batch whose shape was never captured (the short last batch of an epoch) runs an eager step instead, on the
same parameters, gradients and optimizer state, and the graph keeps working afterwards.

Example::

    import torch
    from cudagraph_kit.train_step import capture_train_step

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)   # capturable=True for Adam/AdamW
    x, y = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")
    step = capture_train_step(model, opt, torch.nn.functional.mse_loss, (x, y))
    for xb, yb in loader:                      # each batch: (inputs..., target), on the GPU
        loss = step(xb, yb)                    # one training step; loss is a GPU tensor (no sync)
    print(loss.item())                         # read losses when you need them, not every step

What the graph fixes at capture time: the batch shapes, dtypes and device; the learning rate and other
optimizer hyper-parameters that are Python numbers (an LR scheduler that changes ``group["lr"]`` has no
effect on replays unless the lr is a tensor updated in place); the model's train/eval mode; the code path
(no data-dependent Python control flow). Dropout still draws new masks each replay.

This file stands alone (only ``torch`` is needed) so it can be copied into a project.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch

try:  # inside cudagraph_kit: share the kit's error type
    from .capture import NoCudaError
except ImportError:  # copied on its own
    class NoCudaError(RuntimeError):
        """Raised when a CUDA graph is asked for on a machine without a usable CUDA GPU."""

__all__ = ["capture_train_step", "GraphedTrainStep", "NoCudaError"]

_NO_CUDA = (
    "CUDA graphs need an NVIDIA GPU, and torch.cuda.is_available() is False here. Fix: run on a machine "
    "(or Colab runtime) with a CUDA GPU, or pass eager_fallback=True to run plain eager training steps "
    "(step.mode is then 'eager', never 'graph')."
)


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


def _check_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Raise if the optimizer's step cannot be captured (Adam/AdamW & co. need capturable=True)."""
    name = type(optimizer).__name__
    groups = [g for g in optimizer.param_groups if "capturable" in g]
    if "capturable" in optimizer.defaults or groups:
        if optimizer.defaults.get("capturable") is False or any(not g["capturable"] for g in groups):
            raise ValueError(
                f"{name} was constructed with capturable=False, so its step() keeps the step count on the CPU "
                f"and cannot be captured in a CUDA graph (replays would reuse a stale step count). "
                f"Fix: construct it with capturable=True, e.g. torch.optim.{name}(model.parameters(), "
                f"lr=..., capturable=True).")


def _check_amp(amp_dtype, scaler, device: torch.device) -> None:
    if amp_dtype is None:
        return
    if amp_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"amp_dtype must be None, torch.float16 or torch.bfloat16, got {amp_dtype}.")
    if amp_dtype == torch.float16 and scaler is None:
        raise ValueError(
            "amp_dtype=torch.float16 needs a gradient scaler, or small gradients underflow to zero. Fix: pass "
            "scaler=torch.amp.GradScaler('cuda'); the graph captures forward + scaler.scale(loss).backward() "
            "and scaler.step(optimizer) + scaler.update() run eagerly after each replay.")
    if amp_dtype == torch.bfloat16 and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            raise ValueError(
                f"amp_dtype=torch.bfloat16 needs a GPU with compute capability 8.0 or newer (Ampere+); "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}. Fix: on pre-Ampere GPUs such as the "
                f"T4 or V100 use amp_dtype=torch.float16 with scaler=torch.amp.GradScaler('cuda').")


class GraphedTrainStep:
    """One training step per call: eager warm-up, then one captured graph replayed for each batch.

    Build it with :func:`capture_train_step`; call it as ``loss = step(*inputs, target)``.

    Attributes:
        mode: ``"graph"`` (CUDA graph once captured) or ``"eager"`` (``eager_fallback`` without CUDA).
        state: ``"warmup"`` until the graph is captured, then ``"captured"`` (stays ``"warmup"`` in eager mode,
            where nothing is ever captured).
        eager_steps: how many steps ran eagerly because their batch shape differs from ``sample_batch``
            (counted in both modes, so a CPU run reports what a GPU run would do).
        graph: the ``torch.cuda.CUDAGraph`` (None before capture and in eager mode).
        static_batch: the tensors each batch is copied into (inputs..., target).
        static_loss: the loss tensor the graph writes on each replay (None before capture).
        warmup_steps: steps run so far as warm-up.
    """

    def __init__(self, model, optimizer, loss_fn, sample_batch, *, warmup, amp_dtype, scaler, clone_loss, mode):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.warmup = warmup
        self.amp_dtype = amp_dtype
        self.scaler = scaler
        self.clone_loss = clone_loss
        self.mode = mode
        self.state = "warmup"
        self.eager_steps = 0
        self.warmup_steps = 0
        self.graph = None
        self._static_grads = []
        self.static_loss = None
        self.static_batch = tuple(t.detach().clone() for t in sample_batch)
        self.device = self.static_batch[0].device
        self._side_stream = torch.cuda.Stream(self.device) if mode == "graph" else None

    # -- the pieces of a step ------------------------------------------------------------------------------
    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: a cached weight cast made during capture would be baked into the graph and
        # reused by every replay although the weights change each step.
        return torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=False)

    def _forward_backward(self, batch):
        *inputs, target = batch
        with self._autocast():
            loss = self.loss_fn(self.model(*inputs), target)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss

    def _optimizer_step(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def _eager_step(self, batch, set_to_none: bool):
        self.optimizer.zero_grad(set_to_none=set_to_none)
        loss = self._forward_backward(batch)
        self._optimizer_step()
        return loss.detach()

    # -- validation -----------------------------------------------------------------------------------------
    def _check(self, batch) -> bool:
        """Validate a batch; True when it has the captured shapes (graph-able), False for other shapes."""
        if len(batch) != len(self.static_batch):
            raise TypeError(
                f"this step was built for batches of {len(self.static_batch)} tensor(s) (inputs..., target), "
                f"got {len(batch)}. Fix: call it as step(*inputs, target), like sample_batch.")
        same_shape = True
        for i, (b, s) in enumerate(zip(batch, self.static_batch)):
            if not isinstance(b, torch.Tensor) or b.dtype != s.dtype or b.device != s.device:
                raise ValueError(
                    f"batch element {i}: expected {_describe(s)} (like sample_batch), got {_describe(b)}. "
                    "Nothing was run. Fix: convert it first, e.g. x.to(device, dtype, non_blocking=True).")
            same_shape = same_shape and b.shape == s.shape
        return same_shape

    # -- the state machine ------------------------------------------------------------------------------------
    def __call__(self, *batch):
        """Run one training step on ``batch`` = (inputs..., target); return the loss (a detached tensor)."""
        fits = self._check(batch)
        if self.mode == "eager":
            self.eager_steps += not fits
            return self._eager_step(batch, set_to_none=True)
        if not fits:
            return self._eager_fallback(batch)
        if self.state == "warmup" and self.warmup_steps < self.warmup:
            return self._warmup_step(batch)
        if self.state == "warmup":
            self._capture(batch)
        else:
            self._check_grads_still_static()
            for b, s in zip(batch, self.static_batch):
                if b is not s:
                    s.copy_(b)
            self.graph.replay()
        if self.scaler is not None:  # the unscale/inf-check/step and scale update stay eager
            self._optimizer_step()
        return self.static_loss.clone() if self.clone_loss else self.static_loss

    def _warmup_step(self, batch):
        side = self._side_stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            loss = self._eager_step(batch, set_to_none=True)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.warmup_steps += 1
        return loss

    def _eager_fallback(self, batch):
        # After capture the parameters' .grad tensors are the graph's static gradient buffers: replays write
        # into exactly those addresses. zero_grad(set_to_none=True) would drop them, the eager backward would
        # allocate new .grad tensors, and the optimizer would read those while every later replay keeps
        # writing the old, now orphaned buffers: training would silently stop. Zeroing in place keeps them.
        self.eager_steps += 1
        return self._eager_step(batch, set_to_none=self.state == "warmup")

    def _check_grads_still_static(self):
        # The graph writes gradients into the .grad tensors that existed at capture. If they were replaced
        # (typically by an habitual optimizer.zero_grad(), which sets them to None), the optimizer would step
        # on stale or missing gradients and training would silently stop: refuse instead.
        for p, g in self._static_grads:
            if p.grad is not g:
                raise RuntimeError(
                    "a parameter's .grad is no longer the tensor the graph writes into (was optimizer.zero_grad() "
                    "or model.zero_grad() called, or .grad reassigned, after capture?). Nothing was run. Fix: "
                    "remove zero_grad() from the loop: each replay overwrites the gradients by itself.")

    def _capture(self, batch):
        for b, s in zip(batch, self.static_batch):
            s.copy_(b)
        # Grads set to None before capture, so the captured backward allocates them from the graph's
        # private memory pool and each replay refills them (no zero_grad needed inside the graph).
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph):
                loss = self._forward_backward(self.static_batch)
                if self.scaler is None:
                    self.optimizer.step()
        except Exception as exc:
            torch.cuda.synchronize(self.device)
            raise RuntimeError(
                f"capturing the training step failed: {type(exc).__name__}: {exc}\nCommon causes: a CPU "
                "synchronization in the model or loss (.item(), .cpu(), print of a CUDA tensor, boolean-mask "
                "indexing), data-dependent shapes, or CPU tensors. Fix: run one eager step under "
                "torch.cuda.set_sync_debug_mode('error') to find the line.") from exc
        self.graph = graph
        self._static_grads = [(p, p.grad) for g in self.optimizer.param_groups for p in g["params"]]
        self.static_loss = loss.detach()
        self.state = "captured"
        graph.replay()  # capture only recorded the work; this runs this call's training step

    def __repr__(self):
        return (f"GraphedTrainStep(mode={self.mode!r}, state={self.state!r}, warmup_steps={self.warmup_steps}, "
                f"eager_steps={self.eager_steps}, batch=[{', '.join(_describe(s) for s in self.static_batch)}])")


def _check_ddp(model: torch.nn.Module, warmup: int) -> int:
    """PyTorch's rules for capturing a DistributedDataParallel step; returns the warm-up to use (>= 11 for DDP).

    Rule 1 (NCCL async error handling off when the process group is created) is checked: with the value recorded
    by ``cudagraph_kit.ddp`` when it created the group, else with the environment now (a variable changed after
    ``init_process_group`` cannot be detected from Python). Rule 2 (DDP constructed on a side stream) cannot
    be read back from the model: a warning unless ``ddp_for_graphs`` built it. Rule 3: >= 11 eager warm-ups.
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return warmup
    import os
    import warnings

    kit = getattr(model, "_cudagraph_kit", None) or {}  # written by cudagraph_kit.ddp.ddp_for_graphs
    backend = str(torch.distributed.get_backend(model.process_group)).lower()
    on_cuda = any(p.is_cuda for p in model.parameters())
    if on_cuda and "nccl" not in backend:
        raise ValueError(f"this DistributedDataParallel model uses the {backend!r} backend; a CUDA graph can capture "
                         "NCCL collectives only. Fix: init_process_group('nccl') for CUDA models.")
    if "nccl" in backend:
        value = kit.get("async_error_handling_at_init") or os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", os.environ.get("NCCL_ASYNC_ERROR_HANDLING"))
        try:
            off = int(str(value).strip()) == 0  # parsed like PyTorch does (std::stoi)
        except ValueError:
            off = False
        if not off:
            raise RuntimeError(
                "capturing a DistributedDataParallel step needs NCCL's async error handling off when the process "
                "group is created (PyTorch's CUDA-graphs notes, 'Usage with DistributedDataParallel'), but "
                f"TORCH_NCCL_ASYNC_ERROR_HANDLING is {'not set (default: on)' if value is None else repr(value)}. "
                "torchrun sets it to 1 in every worker unless it is set where torchrun starts, and it takes "
                "precedence over the old name NCCL_ASYNC_ERROR_HANDLING; setting it after init_process_group() is "
                "too late (the process group reads it once, when it is created). Nothing was run. Fix: "
                "os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING'] = '0' before torch.distributed.init_process_group(), "
                "or call cudagraph_kit.ddp.setup_distributed_for_graphs() instead of init_process_group().")
    if on_cuda and kit.get("stream") is None:
        warnings.warn(
            "cannot verify that this DistributedDataParallel model was constructed on a side stream, as PyTorch's "
            "CUDA-graphs notes require: DDP keeps each parameter's AccumulateGrad node, and one created on the "
            "default stream makes the captured backward synchronize with the default stream, which invalidates "
            "the capture. Fix: build it with cudagraph_kit.ddp.ddp_for_graphs(model, device_ids=[rank]); if you "
            "built it inside `with torch.cuda.stream(s):`, set model._cudagraph_kit = {'stream': s} to say so.",
            UserWarning, stacklevel=3)
    return max(warmup, 11)


def capture_train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       sample_batch: Sequence[torch.Tensor], *, warmup: int = 3,
                       amp_dtype: torch.dtype | None = None, scaler=None, clone_loss: bool = True,
                       eager_fallback: bool = False) -> GraphedTrainStep:
    """Make a training step that is captured as one CUDA graph after ``warmup`` eager steps.

    The step computes ``loss = loss_fn(model(*inputs), target)``, backward and ``optimizer.step()`` for a
    batch ``(inputs..., target)``. Nothing runs until the first call; each call is one real training step.

    Args:
        sample_batch: a tuple ``(inputs..., target)`` of tensors with the shapes, dtypes and device of the
            batches to graph (its values are not trained on).
        warmup: eager steps (on a side stream) before the capture; at least 1. For a DistributedDataParallel
            model at least 11 (raised automatically), and NCCL's async error handling must have been off when
            the process group was created (checked; see ``cudagraph_kit.ddp``).
        amp_dtype: ``torch.bfloat16`` (Ampere or newer) or ``torch.float16`` (needs ``scaler``) to run the
            forward under ``torch.autocast(cache_enabled=False)``.
        scaler: a ``torch.amp.GradScaler``: the graph captures ``scaler.scale(loss).backward()``; the optimizer
            step goes through ``scaler.step``/``scaler.update`` eagerly after each replay (they check for
            inf/NaN on the CPU, which a graph cannot do).
        clone_loss: return a fresh copy of the loss each call (default). With False the call returns the
            graph's static loss tensor, which the next replay overwrites: a list of those is one tensor N times.
        eager_fallback: without CUDA run plain eager steps (``mode == "eager"``) instead of raising
            ``NoCudaError``.

    Optimizers: SGD (with or without momentum), Adam/AdamW constructed with ``capturable=True``; an optimizer
    whose ``capturable`` option is False raises ``ValueError``.

    Example::

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = capture_train_step(model, opt, torch.nn.MSELoss(), (x, y))
        losses = [step(xb, yb) for xb, yb in batches]          # GPU tensors; no sync per step
        print(torch.stack(losses).tolist())
    """
    batch = tuple(sample_batch)
    if len(batch) < 2:
        raise ValueError(f"sample_batch must be a tuple (inputs..., target) of at least 2 tensors, got {len(batch)}.")
    for i, t in enumerate(batch):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sample_batch element {i} is a {type(t).__name__}, not a tensor. Fix: bind "
                            "non-tensor arguments into the model or loss_fn (functools.partial, a lambda).")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (eager steps that create the optimizer state and initialise "
                         f"cuBLAS before capture), got {warmup}.")
    warmup = _check_ddp(model, warmup)  # DistributedDataParallel: PyTorch's three rules (checked or applied)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    devices = {p.device for p in params} | {t.device for t in batch}
    on_cuda = torch.cuda.is_available() and all(d.type == "cuda" for d in devices) and len(devices) == 1

    if not on_cuda and eager_fallback:
        _check_amp(amp_dtype, scaler, batch[0].device)
        return GraphedTrainStep(model, optimizer, loss_fn, batch, warmup=warmup, amp_dtype=amp_dtype,
                                scaler=scaler, clone_loss=clone_loss, mode="eager")
    _check_capturable(optimizer)
    if not torch.cuda.is_available():
        raise NoCudaError(_NO_CUDA)
    if not on_cuda:
        raise ValueError(
            "the model's parameters and every sample_batch tensor must be on one CUDA device, got "
            f"{sorted(map(str, devices))}. Fix: model.cuda() and batch tensors .cuda() before capture_train_step.")
    _check_amp(amp_dtype, scaler, batch[0].device)
    return GraphedTrainStep(model, optimizer, loss_fn, batch, warmup=warmup, amp_dtype=amp_dtype, scaler=scaler,
                            clone_loss=clone_loss, mode="graph")
