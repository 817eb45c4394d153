"""Capture a whole training step (forward, loss, backward, clipping, optimizer step) as one CUDA graph.

``capture_train_step`` returns a small state machine. Every call is exactly one real training step (or one
micro-batch of it, with ``accumulate``) on the batch it is given, so a loop that uses it trains like the eager
loop it replaces:

1. ``warmup`` optimizer steps run eagerly on the side stream the graph is then captured on (the kit's
   ``capture_stream``: lazy initialisation, cuBLAS handles, optimizer state), each window starting with
   ``optimizer.zero_grad(set_to_none=True)``;
2. the next call: ``zero_grad(set_to_none=True)``, then forward + loss + backward (+ clipping) +
   ``optimizer.step()`` are captured into one ``torch.cuda.CUDAGraph`` over static batch buffers, then replayed
   once (capturing records the work, it does not run it);
3. every later call: copy the batch into the static buffers and replay. No ``zero_grad`` is needed: the
   captured backward writes fresh gradients into the same ``.grad`` tensors each replay.

What a real loop needs, and how the graph gets it:

- **LR schedules.** Any ``torch.optim.lr_scheduler`` keeps working: the step keeps each param group's LR in a
  GPU tensor that the captured optimizer step reads, and copies ``group["lr"]`` into it before each replay
  (only when it changed). This needs an optimizer that reads a tensor LR on the GPU: ``Adam``/``AdamW`` with
  ``capturable=True`` (or ``fused=True``) and ``SGD`` with ``fused=True``. Others (plain ``SGD``) read the LR
  as a Python number, frozen at capture: an attached scheduler, or an LR (or other hyper-parameter) changed
  after capture, is refused with an error naming the fix, never silently ignored.
- **Momentum schedules.** ``OneCycleLR`` and ``CyclicLR`` with ``cycle_momentum=True`` change Adam's beta1 (or
  SGD's momentum) every step. Where this PyTorch's step path reads that value as a GPU tensor (found by probing
  a throw-away optimizer, e.g. ``Adam/AdamW(capturable=True, foreach=False)``), it is kept in a GPU tensor and
  refreshed before each replay like the LR; elsewhere the schedule is refused before anything runs, naming the
  reason and the fix.
- **Gradient clipping.** ``max_grad_norm=`` clips with ``torch.nn.utils.clip_grad_norm_(...,
  error_if_nonfinite=False)`` inside the graph (no host synchronization); ``step.grad_norm`` is the total norm
  before clipping, a GPU tensor.
- **Gradient accumulation.** ``accumulate=k``: each call is one micro-batch, ``backward`` of ``loss / k``, and
  every k-th call also clips and steps. One graph per position in the window (first: writes fresh gradients;
  middle: adds to them; last: adds, clips and steps), captured on first use in one memory pool.
- **AMP.** ``amp_dtype=torch.bfloat16``, or ``torch.float16`` with a ``GradScaler``: the graph captures forward
  and ``scaler.scale(loss).backward()``; ``scaler.unscale_`` (when clipping), the clipping, ``scaler.step`` and
  ``scaler.update`` run eagerly after the replay. With a plain optimizer ``scaler.step`` reads the inf/NaN flag on
  the CPU (``.item()``), which a graph cannot do; a fused optimizer (``fused=True``) takes the flag as a GPU tensor
  instead, and PyTorch's own tests capture that ``scaler.step``, but the kit keeps one path for both.

A batch whose shape was never captured (the short last batch of an epoch) runs an eager step instead, on the
same parameters, gradients and optimizer state, and the graph keeps working afterwards.

Example::

    import torch
    from cudagraph_kit.train_step import capture_train_step

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)   # capturable=True for Adam/AdamW
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    x, y = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")
    step = capture_train_step(model, opt, torch.nn.functional.mse_loss, (x, y), max_grad_norm=1.0)
    for xb, yb in loader:                      # each batch: (inputs..., target), on the GPU
        loss = step(xb, yb)                    # one training step; loss is a GPU tensor (no sync)
        sched.step()                           # the next replay trains with the new LR
    print(loss.item())                         # read losses when you need them, not every step

What the graph fixes at capture time: the batch shapes, dtypes and device; optimizer hyper-parameters other
than the LR and a refreshed beta1/momentum (checked before every replay); the model's train/eval mode; the code path
(no data-dependent Python control flow); the tensors it trains. Dropout still draws new masks each replay. Before
every replay the step checks that the optimizer's param groups hold the parameters they held at capture, that no
parameter's ``requires_grad`` changed, and that the model's parameters and buffers and the optimizer's state tensors
are the ones captured, at the same addresses (``optimizer.add_param_group``, ``model.half()``, a parameter assigned
anew, ``optimizer.load_state_dict`` after capture): otherwise it raises ``StaleGraphError`` naming what changed,
before running anything. In-place updates (``model.load_state_dict``, ``param.copy_``) pass.

To use this file in a project of yours, copy the kit's ``graphed.py`` with it (only ``torch`` is needed).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import operator
import weakref
import os
from typing import Callable, Sequence

import torch


if __package__:
    from . import graphed as _graphed  # errors, recovery after a failed capture, the capture stream
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed as _graphed  # type: ignore[import-not-found, no-redef]
CaptureError = _graphed.CaptureError
NoCudaError = _graphed.NoCudaError
capture_stream = _graphed.capture_stream
graph_capture = _graphed.graph_capture
recover_from_failed_capture = _graphed.recover_from_failed_capture
reseed_error = _graphed.reseed_error
reseeding_calls = _graphed.reseeding_calls
describe_tensor = _graphed.describe_tensor
no_cuda_message = _graphed.no_cuda_message
guard = _graphed.guard  # what the graphs read, checked before every replay (guard.py, beside graphed.py)
StaleGraphError = guard.StaleGraphError

__all__ = ["capture_train_step", "GraphedTrainStep", "NoCudaError", "CaptureError", "cuda_graph_capture"]

_NO_CUDA = no_cuda_message("run on a machine (or Colab runtime) with a CUDA GPU, or pass eager_fallback=True to run "
                           "plain eager training steps (step.mode is then 'eager', never 'graph').")
_DEVICE_LR_FIX = ("use an optimizer that reads a tensor LR on the GPU inside the graph: torch.optim.SGD(..., "
                  "fused=True) or torch.optim.Adam/AdamW(..., capturable=True)")



def _check_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Raise if the optimizer's step cannot be captured (Adam/AdamW & co. need capturable=True)."""
    # Read per param group, as the optimizer's step does (its capture check reads every group's "capturable"):
    # the defaults only seed groups added later, and groups may have been switched to capturable=True.
    name = type(optimizer).__name__
    off = [i for i, g in enumerate(optimizer.param_groups) if "capturable" in g and not g["capturable"]]
    if off:
        which = "it was constructed with capturable=False" if len(off) == len(optimizer.param_groups) else \
            f"param group(s) {off} have capturable=False"
        raise ValueError(
            f"{name}: {which}, so its step() keeps the step count on the CPU and cannot be captured in a CUDA "
            f"graph (replays would reuse a stale step count). Fix: construct it with capturable=True, e.g. "
            f"torch.optim.{name}(model.parameters(), lr=..., capturable=True), or set "
            f"group['capturable'] = True in every param group before the first step.")


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


def _reads_lr_on_device(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    """True when this optimizer's captured step reads ``group["lr"]`` from a GPU tensor (not a host number).

    Adam/AdamW with capturable=True (foreach and single-tensor paths: ``_foreach_div_``/``mul_`` by the LR
    tensor) or fused=True (the fused kernel's tensor-LR overload), and SGD with fused=True (same). SGD's foreach
    and for-loop paths pass the LR as ``alpha=-lr``, a host number: a tensor LR would be read with ``.item()``.
    """
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return bool(group.get("capturable") or group.get("fused"))
    if isinstance(optimizer, torch.optim.SGD):
        return bool(group.get("fused"))
    return False


def cuda_graph_capture(work: Callable[[], object], pool, device: torch.device):
    """Capture ``work()`` into a new ``torch.cuda.CUDAGraph``; return ``(graph, what work returned)``.

    The one place where ``GraphedTrainStep`` touches CUDA graphs (its ``capture=`` argument): tests pass a
    stand-in that records ``work`` and runs it again on ``replay()``, to check the state machine on a CPU.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), graph_capture(graph, pool=pool, stream=capture_stream(device)):
        out = work()
    return graph, out


class GraphedTrainStep:
    """One training step (or micro-batch) per call: eager warm-up, then captured graphs replayed per batch.

    Build it with :func:`capture_train_step`; call it as ``loss = step(*inputs, target)``.

    Attributes:
        mode: ``"graph"`` (CUDA graph once captured) or ``"eager"`` (``eager_fallback`` without CUDA).
        state: ``"warmup"`` until the graph is captured, then ``"captured"`` (stays ``"warmup"`` in eager mode,
            where nothing is ever captured).
        eager_steps: how many calls ran eagerly because their batch shape differs from ``sample_batch``
            (counted in both modes, so a CPU run reports what a GPU run would do).
        graph: the ``torch.cuda.CUDAGraph`` of a window's first call (with ``accumulate=1`` the only graph;
            None before capture and in eager mode); ``graphs`` has all of them by position.
        static_batch: the tensors each batch is copied into (inputs..., target).
        static_loss: the loss tensor the last replayed graph wrote (None before capture).
        grad_norm: total gradient norm before clipping at the last optimizer step (with ``max_grad_norm``;
            a GPU tensor that later replays may overwrite: clone it to keep it), else None.
        warmup_steps: optimizer steps run so far as warm-up; ``optimizer_steps``: all optimizer steps so far.
        replays: graph replays so far.
        hyperparameters: per param group, the hyper-parameters the captured step reads from GPU tensors and
            those it froze at capture (see the property).
    """

    def __init__(self, model, optimizer, loss_fn, sample_batch, *, warmup, amp_dtype, scaler, clone_loss, mode,
                 max_grad_norm=None, accumulate=1, capture=cuda_graph_capture):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.warmup = warmup
        self.amp_dtype = amp_dtype
        self.scaler = scaler
        self.clone_loss = clone_loss
        self.mode = mode
        self.max_grad_norm = max_grad_norm
        self.accumulate = accumulate
        self.state = "warmup"
        self.eager_steps = 0
        self.warmup_steps = 0
        self.optimizer_steps = 0
        self.replays = 0
        self.graphs = {}            # "first"/"middle"/"last" (or "step" when accumulate == 1) -> CUDAGraph
        self._captured = {}         # same keys -> (graph, static loss, static grad norm or None)
        self._micro = 0             # position of the next call in its accumulation window
        self._pool = None
        self._capture_fn = capture
        self._lr_tensors = []       # per param group: the GPU tensor the captured step reads as its LR, or None
        self._lr_copied = []        # per param group: the host value last copied into that tensor
        self._frozen = []           # per param group: {key: value} the graph froze (checked before replays)
        self._live = []             # per param group: {"betas" or "momentum": GPU tensor the step reads}
        self._live_copied = []      # per param group: the host values last copied into those tensors
        self._frozen_why = []       # per param group: {key: why this PyTorch cannot read it on the GPU}
        self._warmup_reseeds = []   # reseeds seen in warm-up steps (a graph cannot replay them): reseeding_calls
        self._offset_history = []   # did each warm-up step advance the generator (a same-seed reseed's trace)
        self.guard = None           # after capture: what the graphs read (guard.Guard), checked before every replay
        self._reads = []            # what the last warm-up step read (guard.watch_reads), for the guard
        self._group_sizes = []      # after capture: how many params each param group had
        self._requires_grad = []    # after capture: requires_grad of each of _params
        self.static_loss = None
        self.grad_norm = None
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        self.static_batch = tuple(t.detach().clone() for t in sample_batch)
        self.device = self.static_batch[0].device
        cuda = mode == "graph" and self.device.type == "cuda"
        self._side_stream = capture_stream(self.device) if cuda else None  # warm-ups run where the capture will

    @property
    def hyperparameters(self) -> list:
        """Per param group, how the captured optimizer step gets its numeric hyper-parameters:
        ``{"on_gpu": {name: GPU tensor}, "frozen": {name: value}}``. ``on_gpu`` holds the tensors the graph reads,
        refreshed from the param group before each replay: ``"lr"``, and ``"betas"`` (beta1) or ``"momentum"``
        where this PyTorch's step reads them on the GPU. ``frozen`` holds the values fixed at capture; changing
        one raises before the next replay. Empty before the capture, in eager mode, and with a GradScaler (its
        optimizer step runs eagerly after each replay).

        Example::

            step.hyperparameters[0]["on_gpu"]   # {'lr': tensor(0.1000, device='cuda:0')} for SGD(fused=True)
        """
        return [{"on_gpu": {**({"lr": lr} if lr is not None else {}), **live}, "frozen": dict(frozen)}
                for lr, live, frozen in zip(self._lr_tensors, self._live, self._frozen)]

    @property
    def graph(self):
        entry = self._captured.get("step") or self._captured.get("first")
        return entry[0] if entry else None

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
        scaled = loss / self.accumulate if self.accumulate > 1 else loss  # the mean over the window's batches
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss

    def _clip(self):
        # error_if_nonfinite=False: the check would read the norm on the CPU (a sync, illegal in a graph)
        return torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm, error_if_nonfinite=False)

    def _clip_and_step(self):
        """Clipping and the optimizer step, eagerly (warm-up, short batches, and the scaler's part)."""
        if self.scaler is not None:
            if self.max_grad_norm is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
                self.grad_norm = self._clip()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return
        if self.max_grad_norm is not None:
            self.grad_norm = self._clip()
        self.optimizer.step()

    def _eager_step(self, batch, first: bool, last: bool, set_to_none: bool):
        if first:
            self.optimizer.zero_grad(set_to_none=set_to_none)
        loss = self._forward_backward(batch)
        if last:
            self._clip_and_step()
        return loss.detach()

    def _captured_work(self, first: bool, last: bool):
        """What one graph records: forward + backward, and at a window's end clipping + optimizer step."""
        loss = self._forward_backward(self.static_batch)
        norm = None
        if last and self.scaler is None:
            if self.max_grad_norm is not None:
                norm = self._clip()
            swapped = []  # the step reads the LR (and beta1/momentum) from GPU tensors that replays refresh
            for group, lr, live in zip(self.optimizer.param_groups, self._lr_tensors, self._live):
                if lr is not None and group["lr"] is not lr:
                    swapped.append((group, "lr", group["lr"]))
                    group["lr"] = lr
                for key, tensor in live.items():
                    swapped.append((group, key, group[key]))
                    group[key] = (tensor, *group["betas"][1:]) if key == "betas" else tensor
            try:
                self.optimizer.step()
            finally:
                for group, key, value in reversed(swapped):
                    group[key] = value
        return loss.detach(), norm

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
                    f"batch element {i}: expected {describe_tensor(s)} (like sample_batch), got {describe_tensor(b)}. "
                    "Nothing was run. Fix: convert it first, e.g. x.to(device, dtype, non_blocking=True).")
            same_shape = same_shape and b.shape == s.shape
        return same_shape

    # -- the state machine ------------------------------------------------------------------------------------
    def __call__(self, *batch):
        """Run one training step (one micro-batch with ``accumulate``) on ``batch`` = (inputs..., target).

        Returns the loss of this batch (a detached GPU tensor; not divided by ``accumulate``).
        """
        fits = self._check(batch)
        first, last = self._micro == 0, self._micro == self.accumulate - 1
        if self.mode == "eager":
            self.eager_steps += not fits
            loss = self._eager_step(batch, first, last, set_to_none=True)
        elif not fits:
            loss = self._eager_fallback(batch, first, last)
        elif self.state == "warmup" and (self.warmup_steps < self.warmup or not first):
            loss = self._warmup_step(batch, first, last)
        else:
            loss = self._replay(batch, first, last)
        self._micro = (self._micro + 1) % self.accumulate
        self.optimizer_steps += last
        return loss

    def _side(self):
        if self._side_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._side_stream)

    def _warmup_step(self, batch, first, last):
        if self._side_stream is not None:
            self._side_stream.wait_stream(torch.cuda.current_stream(self.device))
        # the last warm-up call is watched: what does the step really read? (force_eager: a compiled model runs its
        # Python code for that call, after the earlier warm-ups compiled it; with warmup=1 it runs as compiled)
        watch = guard.watch_reads(skip=batch, force_eager=self.warmup > 1) \
            if last and self.warmup_steps == self.warmup - 1 else contextlib.nullcontext()
        with self._side(), reseeding_calls(self.device, history=self._offset_history) as reseeds, watch as reads:
            loss = self._eager_step(batch, first, last, set_to_none=True)
        if reads is not None:  # the warm-up's .grad tensors are dropped before the capture: not what replays read
            grads = {id(p.grad) for p in self._params if p.grad is not None}
            self._reads = [t for t in reads.tensors if id(t) not in grads]
        if self._side_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._side_stream)
        self._warmup_reseeds += reseeds  # the step reseeds inside: refused when it comes to capture
        self.warmup_steps += last
        return loss

    def _eager_fallback(self, batch, first, last):
        # After capture the parameters' .grad tensors are the graph's static gradient buffers: replays write
        # into exactly those addresses. zero_grad(set_to_none=True) would drop them, the eager backward would
        # allocate new .grad tensors, and the optimizer would read those while every later replay keeps
        # writing the old, now orphaned buffers: training would silently stop. Zeroing in place keeps them.
        self.eager_steps += 1
        return self._eager_step(batch, first, last, set_to_none=self.state == "warmup")

    def _position(self, first, last) -> str:
        if self.accumulate == 1:
            return "step"
        return "first" if first else "last" if last else "middle"

    def _replay(self, batch, first, last):
        key = self._position(first, last)
        steps = last and self.scaler is None  # this graph contains the optimizer step
        if self.state == "captured":
            self._check_still_captured()
            if steps:
                self._refuse_frozen_changes()
        for b, s in zip(batch, self.static_batch):
            if b is not s:
                s.copy_(b)
        if key not in self._captured:
            self._capture(key, first, last)
        graph, loss, norm = self._captured[key]
        if steps:
            self._copy_lrs()
        graph.replay()
        self.replays += 1
        if last:
            if self.scaler is not None:  # unscale/clip/inf-check/step and the scale update stay eager
                self._clip_and_step()
            else:
                self.grad_norm = norm
        self.static_loss = loss
        return loss.clone() if self.clone_loss else loss

    def _record_captured(self):
        """At the first capture: the guard over what the graphs read (the last warm-up step's reads, held by the
        model, loss function, optimizer or scaler) and the ``.grad`` tensors the captured backward writes into."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        # each group's first .grad is checked before every replay (zero_grad() drops a whole group's); the others are
        # held weakly: dropping or replacing one releases the graph's gradient, an event that makes the guard look
        firsts = {id(g["params"][0]) for g in self.optimizer.param_groups if g["params"]}
        grads = [("attr", p, "grad", p.grad, f"model.{names.get(id(p), f'parameter {i}')}.grad") if id(p) in firsts
                 else ("weakattr", p, "grad", weakref.ref(p.grad), f"model.{names.get(id(p), f'parameter {i}')}.grad")
                 for i, p in enumerate(self._params) if p.grad is not None]
        roots = {"model": self.model, "optimizer": self.optimizer, "loss_fn": self.loss_fn, "scaler": self.scaler}
        self.guard = guard.Guard(roots, self._reads, extra=grads)
        self._reads = []
        self._group_sizes = [len(g["params"]) for g in self.optimizer.param_groups]
        self._requires_grad = list(map(_requires_grad, self._params))

    def _check_still_captured(self):
        """Refuse to replay when a tensor the graphs read or write, or one of its holders, changed since the capture
        (the guard: parameters, buffers, optimizer state, ``.grad``), or the optimizer's groups or a parameter's
        requires_grad changed."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._group_sizes) or any(len(g["params"]) != n for g, n in zip(groups, self._group_sizes)):
            raise guard.stale(
                f"the optimizer's param groups changed after capture ({len(self._group_sizes)} group(s) of "
                f"{self._group_sizes} parameter(s) then, {len(groups)} of {[len(g['params']) for g in groups]} now: "
                "optimizer.add_param_group, or a group's 'params' changed). The captured step updates only the "
                "parameters it had at capture, so the others would never be trained. Nothing was run",
                "add every param group before capture_train_step, or capture a new step after changing them")
        if list(map(_requires_grad, self._params)) != self._requires_grad:
            names = {id(p): n for n, p in self.model.named_parameters()}
            changed = [names.get(id(p), f"parameter {i}") for i, (p, a) in
                       enumerate(zip(self._params, self._requires_grad)) if p.requires_grad != a]
            raise guard.stale(
                f"requires_grad changed after capture for {', '.join(changed[:3])}"
                f"{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}: the captured backward computes "
                "gradients only for the parameters that required them at capture (a layer unfrozen since would "
                "never train, one frozen since would keep training). Nothing was run",
                "capture a new step after freezing or unfreezing layers")
        try:
            self.guard.check()
        except StaleGraphError as exc:
            grads = [c for c in self.guard.changes() if ".grad " in c]
            if grads:  # the habitual optimizer.zero_grad() (set_to_none) left in the loop
                raise guard.stale(
                    f"a parameter's .grad is no longer the tensor the graph writes into ({grads[0]}; was "
                    "optimizer.zero_grad() or model.zero_grad() called, or .grad reassigned, after capture?). Nothing "
                    "was run", "remove zero_grad() from the loop: each replay overwrites the gradients by itself") \
                    from None
            raise guard.stale(exc.cause, "capture a new step (capture_train_step) after changing the model or "
                              "loading a checkpoint (optimizer.load_state_dict makes new state tensors: load it before "
                              "capturing); to change weights without capturing again, copy them in place: "
                              "model.load_state_dict(state_dict), or param.copy_(new_value) under torch.no_grad()") \
                from None

    # -- learning rate and other hyper-parameters --------------------------------------------------------------
    def _prepare_hyperparameters(self):
        """Before capturing the step: a GPU tensor per group for the LR where the optimizer can read one, and for
        beta1 (Adam & co.) or momentum (SGD) where this PyTorch's step path reads a tensor one on the GPU (probed);
        every other hyper-parameter is frozen and checked before each replay."""
        _refuse_scheduled_host_lr(self.optimizer)
        self._lr_tensors, self._lr_copied, self._frozen = [], [], []
        self._live, self._live_copied, self._frozen_why = [], [], []
        for group in self.optimizer.param_groups:
            lr = group["lr"]
            frozen = {k: group[k] for k in self.optimizer.defaults
                      if k not in ("lr", "params") and k in group and _is_number(group[k])}
            if not _reads_lr_on_device(self.optimizer, group):
                frozen["lr"] = _host_value(lr)
                self._lr_tensors.append(None)
            elif isinstance(lr, torch.Tensor) and lr.device == self.device and lr.dtype == torch.float32:
                self._lr_tensors.append(lr)  # the user's own GPU LR tensor: schedulers update it in place
            else:
                self._lr_tensors.append(torch.tensor(_host_value(lr), dtype=torch.float32, device=self.device))
            live, why = {}, {}
            for key in _CYCLED:
                if key not in frozen:
                    continue
                works, reason = _reads_on_device(self.optimizer, group, key, self.device,
                                                 self._lr_tensors[-1] is not None)
                if works:
                    live[key] = torch.tensor(_cycled_value(group, key), dtype=torch.float32, device=self.device)
                    frozen.pop(key)
                    if key == "betas":
                        frozen["betas[1:]"] = tuple(group["betas"][1:])  # beta2 stays a number
                else:
                    why[key] = reason
            self._lr_copied.append(None)
            self._frozen.append(frozen)
            self._live.append(live)
            self._live_copied.append({k: _cycled_value(group, k) for k in live})
            self._frozen_why.append(why)

    def _copy_lrs(self):
        """Copy each group's current LR (and beta1/momentum) into the GPU tensor the graph reads, when changed."""
        for i, (group, lr) in enumerate(zip(self.optimizer.param_groups, self._lr_tensors)):
            value = group["lr"]
            for key, tensor in self._live[i].items():
                now = _cycled_value(group, key)
                if isinstance(now, torch.Tensor) and now.device.type != "cpu":
                    tensor.copy_(now)
                elif now != self._live_copied[i][key]:
                    tensor.fill_(_host_value(now))
                    self._live_copied[i][key] = now
            if lr is None or value is lr:
                continue
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                lr.copy_(value)  # a GPU tensor of its own: copy on the device, no sync
                continue
            value = _host_value(value)
            if value != self._lr_copied[i]:
                lr.fill_(value)
                self._lr_copied[i] = value

    def _refuse_frozen_changes(self):
        """A hyper-parameter the graph froze at capture changed since: StaleGraphError, like every other change."""
        name = type(self.optimizer).__name__
        for i, (group, frozen) in enumerate(zip(self.optimizer.param_groups, self._frozen)):
            for key, value in frozen.items():
                now = _host_value(group[key]) if key == "lr" else \
                    tuple(group["betas"][1:]) if key == "betas[1:]" else group[key]
                if now == value:
                    continue
                if key == "lr":
                    raise guard.stale(
                        f"param group {i}'s LR changed from {value:g} to {now:g} after capture, but {name} "
                        f"{'(fused=False) ' if name == 'SGD' else ''}reads the LR as a Python number that the "
                        f"CUDA graph froze at capture: replays would keep training with {value:g}. Nothing was run",
                        f"{_DEVICE_LR_FIX}; the step then copies each new LR into the graph")
                if key in self._frozen_why[i]:
                    why = _cycled_unsupported(self.optimizer, group, key, self.device, self._frozen_why[i][key])
                    text, _, fix = why.partition(" Fix: ")
                    raise guard.stale(
                        f"param group {i}'s {key!r} changed from {value} to {now} after capture (a scheduler with "
                        f"cycle_momentum=True?), but the CUDA graph froze it: {text} Nothing was run",
                        fix.rstrip("."))
                raise guard.stale(
                    f"param group {i}'s {key!r} changed from {value} to {now} after capture, but the CUDA graph "
                    f"froze it at capture (only the LR, and beta1 or momentum where the optimizer reads them on "
                    f"the GPU, are refreshed before replays). Nothing was run",
                    f"keep {key!r} fixed while the graph trains, or capture a new step after changing it")

    # -- capture ------------------------------------------------------------------------------------------------
    def _capture(self, key, first, last):
        where = (f"capturing the training step ({key}) failed; nothing was trained by this call and the "
                 "process keeps working. ")
        if self._warmup_reseeds:  # a graph cannot replay a reseed: refuse before capturing anything
            raise _reseed_failure(self._warmup_reseeds, "the warm-up steps", where)
        if last and self.scaler is None and not self._frozen:
            self._prepare_hyperparameters()
        if not self._captured:
            self._params = [p for g in self.optimizer.param_groups for p in g["params"]]  # groups added in warm-up
            # Grads set to None before the first capture, so the captured backward allocates them from the
            # graph's private memory pool and each replay refills them (no zero_grad needed inside the graph).
            # Graphs captured later (accumulate > 1) find them allocated and add to them in place.
            self.optimizer.zero_grad(set_to_none=True)
        work = functools.partial(self._captured_work, first, last)
        try:
            # a reseed inside is refused by PyTorch itself (set_current_seed during capture): from_exception says so
            graph, (loss, norm) = self._capture_fn(work, self._pool, self.device)
        except Exception as exc:
            if self.device.type == "cuda":
                recover_from_failed_capture(self.device)
            err = CaptureError.from_exception(exc)  # the kit's error: .cause, .fix, .original as everywhere
            err.args = (where + str(err),)
            raise err from exc
        if self._pool is None and hasattr(graph, "pool"):
            self._pool = graph.pool()  # later graphs (accumulate > 1) share this graph's memory pool
        self._captured[key] = (graph, loss, norm)
        self.graphs[key] = graph
        if self.state == "warmup":
            self._record_captured()
            self.state = "captured"

    def __repr__(self):
        acc = f", accumulate={self.accumulate}" if self.accumulate > 1 else ""
        return (f"GraphedTrainStep(mode={self.mode!r}, state={self.state!r}, warmup_steps={self.warmup_steps}, "
                f"eager_steps={self.eager_steps}, replays={self.replays}{acc}, "
                f"batch=[{', '.join(describe_tensor(s) for s in self.static_batch)}])")


_requires_grad = operator.attrgetter("requires_grad")


def _reseed_failure(calls: list, during: str, where: str) -> Exception:
    err = reseed_error(calls, during)
    err.args = (where + str(err),)
    return err


# Hyper-parameters that schedulers with cycle_momentum=True change each step (OneCycleLR, CyclicLR): Adam-like
# optimizers' beta1 (group["betas"][0]) and SGD-like optimizers' momentum.
_CYCLED = ("betas", "momentum")


def _cycled_value(group: dict, key: str):
    return group["betas"][0] if key == "betas" else group[key]


def _reads_on_device(optimizer, group: dict, key: str, device, lr_on_device: bool = True) -> tuple:
    """``(True, "")`` if this optimizer's step, with this group's options, reads a GPU tensor ``key`` (beta1 or
    momentum) on the device, with no host read; else ``(False, why)``.

    Feature detection rather than a version table: a throw-away optimizer of the same class, with the group's
    options, on one small parameter on ``device``, takes two steps with that hyper-parameter (and the LR, when
    the kit feeds it one) as a GPU tensor, under a dispatch mode that watches for host reads
    (``aten._local_scalar_dense``, behind ``.item()``, ``float()`` and ``if tensor``).
    """
    import inspect
    from torch.utils._python_dispatch import TorchDispatchMode

    accepted = inspect.signature(type(optimizer).__init__).parameters
    options = {k: v for k, v in group.items() if k != "params" and k in accepted}
    dtype = group["params"][0].dtype if group["params"] else torch.float32
    reads = []

    class HostReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(func, "overloadpacket", None) is torch.ops.aten._local_scalar_dense:
                reads.append(func)
            return func(*args, **(kwargs or {}))

    try:
        param = torch.zeros(4, device=device, dtype=dtype, requires_grad=True)
        probe = type(optimizer)([param], **options)
        probe_group = probe.param_groups[0]
        value = torch.tensor(_cycled_value(group, key), dtype=torch.float32, device=device)
        probe_group[key] = (value, *group["betas"][1:]) if key == "betas" else value
        if lr_on_device:
            probe_group["lr"] = torch.tensor(_host_value(group["lr"]), dtype=torch.float32, device=device)
        param.grad = torch.ones_like(param)
        with HostReads():
            probe.step()
            probe.step()
    except Exception as exc:  # this path refuses a tensor there
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if reads:
        return False, f"it reads the value on the host ({len(reads)} .item() call(s) per two steps)"
    return True, ""


def _cycled_unsupported(optimizer, group: dict, key: str, device, why: str) -> str:
    """Why a scheduled beta1/momentum cannot reach the graph on this PyTorch, and the fix."""
    name = type(optimizer).__name__
    what = "beta1 (betas[0])" if key == "betas" else "momentum"
    options = ", ".join(f"{k}={group[k]}" for k in ("foreach", "fused", "capturable") if k in group)
    text = (f"{name}'s step with this param group's options ({options}) cannot read a GPU tensor {what} on "
            f"PyTorch {torch.__version__} ({why}).")
    fixes = []
    if key == "betas":
        alternative = dict(group, foreach=False, fused=False if "fused" in group else None, capturable=True)
        alternative = {k: v for k, v in alternative.items() if v is not None or k != "fused"}
        if (group.get("foreach") is not False or group.get("fused")) and \
                _reads_on_device(optimizer, alternative, key, device)[0]:
            fixes.append(f"construct it with foreach=False, capturable=True (its single-tensor step reads a tensor "
                         f"beta1 on the GPU on this PyTorch)")
        else:
            fixes.append("use PyTorch 2.6 or newer, whose Adam/AdamW take Tensor betas (pytorch/pytorch#134171), "
                         "and construct the optimizer with foreach=False, capturable=True: that step reads a tensor "
                         "beta1 on the GPU (the foreach and fused steps read it on the host)")
    else:
        fixes.append(f"this PyTorch's {name} reads momentum on the host in every step path it has (a tensor "
                     f"momentum needs a PyTorch whose {name} reads it on the GPU); use Adam/AdamW(capturable=True, "
                     "foreach=False), whose beta1 the graph can refresh")
    fixes.append("or keep it fixed: OneCycleLR/CyclicLR(..., cycle_momentum=False)")
    return text + " Fix: " + "; ".join(fixes) + "."


def _refuse_cycled_momentum(optimizer: torch.optim.Optimizer, device) -> None:
    """Raise before anything runs if a scheduler cycles beta1/momentum (OneCycleLR, CyclicLR with
    cycle_momentum=True: they add "max_momentum" to each group) that the graph would freeze."""
    for i, group in enumerate(optimizer.param_groups):
        if "max_momentum" not in group:
            continue
        key = "betas" if "betas" in group else "momentum"
        if key not in group or not _is_number(group[key]):
            continue
        works, why = _reads_on_device(optimizer, group, key, device, _reads_lr_on_device(optimizer, group))
        if not works:
            raise ValueError(
                "a scheduler with cycle_momentum=True (OneCycleLR or CyclicLR) changes param group "
                f"{i}'s {'beta1' if key == 'betas' else 'momentum'} every step, but a CUDA graph would freeze it: "
                + _cycled_unsupported(optimizer, group, key, device, why))


def _refuse_scheduled_host_lr(optimizer: torch.optim.Optimizer) -> None:
    """Raise if an LR scheduler drives an optimizer whose captured step would freeze the LR."""
    step = optimizer.step  # LRScheduler.__init__ wraps it and marks the wrapper
    if not (getattr(step, "_wrapped_by_lr_sched", False) or getattr(step, "_with_counter", False)):
        return
    for group in optimizer.param_groups:
        if not _reads_lr_on_device(optimizer, group):
            name = type(optimizer).__name__
            raise ValueError(
                f"an LR scheduler is attached to this {name}, but {name}"
                f"{' (fused=False)' if name == 'SGD' else ''} reads the LR as a Python number, which a CUDA graph "
                f"freezes at its capture value ({_host_value(group['lr']):g}): the schedule would have no effect "
                f"on replays. Fix: {_DEVICE_LR_FIX}.")


def _is_number(v) -> bool:
    if isinstance(v, tuple):
        return all(_is_number(x) for x in v)
    return isinstance(v, (bool, int, float))


def _host_value(v):
    """A group's LR as a Python number (a CPU tensor is read without a GPU sync)."""
    return v.item() if isinstance(v, torch.Tensor) else v


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
                       eager_fallback: bool = False, max_grad_norm: float | None = None,
                       accumulate: int = 1) -> GraphedTrainStep:
    """Make a training step that is captured as one CUDA graph after ``warmup`` eager steps.

    The step computes ``loss = loss_fn(model(*inputs), target)``, backward, optionally
    ``clip_grad_norm_`` and ``optimizer.step()`` for a batch ``(inputs..., target)``. Nothing runs until the
    first call; each call is one real training step (one micro-batch with ``accumulate``).

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
        max_grad_norm: clip the gradients' total 2-norm to this value before each optimizer step, with
            ``torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=False)`` (inside the graph; with a
            ``scaler``, eagerly after ``scaler.unscale_``). ``step.grad_norm`` holds the norm before clipping.
        accumulate: micro-batches per optimizer step: each call backpropagates ``loss / accumulate`` and every
            ``accumulate``-th call also clips and steps (``warmup`` counts optimizer steps).

    Optimizers: SGD (with or without momentum), Adam/AdamW constructed with ``capturable=True``; an optimizer
    whose ``capturable`` option is False raises ``ValueError``. LR schedulers need an optimizer that reads a
    tensor LR on the GPU: Adam/AdamW(capturable=True) or SGD(fused=True); a scheduler attached to another
    optimizer, or a frozen hyper-parameter changed after capture, raises an error naming the fix. A scheduler
    with ``cycle_momentum=True`` (OneCycleLR, CyclicLR) needs a step path that reads beta1/momentum as a GPU
    tensor (probed; e.g. Adam/AdamW(capturable=True, foreach=False)), else it is refused up front.

    Example::

        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1000, cycle_momentum=False)
        step = capture_train_step(model, opt, torch.nn.MSELoss(), (x, y), max_grad_norm=1.0)
        losses = []
        for xb, yb in batches:
            losses.append(step(xb, yb))                    # GPU tensors; no sync per step
            sched.step()
        print(torch.stack(losses).tolist())
    """
    if isinstance(sample_batch, torch.Tensor):
        raise TypeError(
            f"sample_batch is a single tensor ({describe_tensor(sample_batch)}); it must be a tuple (inputs..., target) "
            "like the batches the step is called with (a tensor would be split into its rows). Fix: pass "
            "sample_batch=(x, y).")
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
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an int >= 1 (micro-batches per optimizer step), got {accumulate!r}.")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be None (no clipping) or a number > 0, got {max_grad_norm!r}.")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    devices = {p.device for p in params} | {t.device for t in batch}
    on_cuda = torch.cuda.is_available() and all(d.type == "cuda" for d in devices) and len(devices) == 1

    if not on_cuda and eager_fallback:
        _check_amp(amp_dtype, scaler, batch[0].device)
        return GraphedTrainStep(model, optimizer, loss_fn, batch, warmup=warmup, amp_dtype=amp_dtype,
                                scaler=scaler, clone_loss=clone_loss, mode="eager", max_grad_norm=max_grad_norm,
                                accumulate=accumulate)
    _check_capturable(optimizer)
    if scaler is None:  # with a scaler the optimizer step runs eagerly and reads the LR as usual
        _refuse_scheduled_host_lr(optimizer)
    if not torch.cuda.is_available():
        raise NoCudaError(_NO_CUDA)
    if not on_cuda:
        raise ValueError(
            "the model's parameters and every sample_batch tensor must be on one CUDA device, got "
            f"{sorted(map(str, devices))}. Fix: model.cuda() and batch tensors .cuda() before capture_train_step.")
    if scaler is None:  # OneCycleLR/CyclicLR(cycle_momentum=True): can the graph refresh beta1 / momentum?
        _refuse_cycled_momentum(optimizer, batch[0].device)
    _check_amp(amp_dtype, scaler, batch[0].device)
    return GraphedTrainStep(model, optimizer, loss_fn, batch, warmup=warmup, amp_dtype=amp_dtype, scaler=scaler,
                            clone_loss=clone_loss, mode="graph", max_grad_norm=max_grad_norm,
                            accumulate=accumulate)
