"""Before capture, find what would break or silently corrupt a CUDA graph; after capture, prove it replays
what eager does; and say whether a graph will help at all.

- :func:`check_capturable` runs a function eagerly under inspection (PyTorch's sync debug mode, a
  ``TorchDispatchMode`` that sees every operator, the optimizer step hook) and lists what a graph cannot
  record, each with the line of *your* code that does it: host synchronizations, CPU tensors and pageable
  host copies, data-dependent shapes, side streams not joined back, Python values that change between calls,
  random numbers outside the default CUDA generator, optimizers with ``capturable=False``, autocast with its
  weight-cast cache on.
- :func:`verify` replays a graph against eager on fresh (and poisoned) inputs for a few steps and reports the
  first divergence: the silent failures (a static input rebound instead of copied into, a frozen Python
  number, an output kept across replays). It first runs eager twice on identical inputs: outputs that differ
  there depend on state the graph freezes, and the report says so rather than calling it a mismatch.
- :func:`advise` measures eager time, the GPU-busy floor and kernels per call, and predicts the best speedup
  a graph can reach before anything is captured.
- :func:`explain` turns any capture error into cause, fix and original error.

Example::

    import torch
    from cudagraph_kit.diagnose import check_capturable

    def step(x):
        y = x * 2
        if y.sum().item() > 0:      # a host sync: cannot be captured
            y = y + 1
        return y

    print(check_capturable(step, torch.randn(8, device="cuda")))

This file needs only ``torch`` for ``check_capturable``, ``verify`` and ``explain``; ``advise`` also needs the
kit's ``timing`` module (and pandas).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import linecache
import math
import os
import sys
import sysconfig
import threading
import types
import warnings
from typing import Any, Callable

import torch

try:  # inside cudagraph_kit: one explanation table for every capture path
    from .capture import _GENERIC_CAUSE, CaptureError, diagnose_capture_failure
except ImportError:  # copied into a project: capture.py beside this file is optional
    try:
        from capture import _GENERIC_CAUSE, CaptureError, diagnose_capture_failure
    except ImportError:  # this file copied on its own: explain() gives a generic cause and fix
        CaptureError = diagnose_capture_failure = _GENERIC_CAUSE = None

__all__ = ["check_capturable", "verify", "advise", "explain", "measure_replay_cost", "predict_graph_time",
           "graph_gpu_time", "ReplayCost", "Finding", "CheckReport", "VerifyReport", "Advice", "Explanation"]

# ----------------------------------------------------------------------------------------------- fixes
FIXES = {
    "host sync": "keep it out of the captured function: leave the value on the GPU (return the tensor) and "
                 "read it after the replay, e.g. once every N steps",
    "data-dependent shape": "use a fixed-size form: torch.where(mask, x, 0) or x * mask instead of x[mask], "
                            "masked_fill_ instead of x[mask] = v, pad to a maximum size",
    "CPU tensor": "create it on the GPU once, before capture (torch.tensor(..., device='cuda')), and update it "
                  "in place (.fill_ / .copy_) when it has to change",
    "pageable copy": "copy new data into a static GPU tensor before the replay; inside a graph only a copy from "
                     "pinned memory (x.pin_memory(), non_blocking=True) is allowed, and it re-reads that "
                     "pinned buffer at every replay",
    "side stream": "fork with side.wait_stream(torch.cuda.current_stream()) and join with "
                   "torch.cuda.current_stream().wait_stream(side) before the function returns",
    "Python state": "a graph replays the value it read at capture: keep values that change in GPU tensors "
                    "updated in place (a tensor lr with capturable=True, a step counter as a tensor), or "
                    "capture again when they change",
    "Python argument": "pass tensors only; a Python number is fixed at capture: bind it with functools.partial "
                       "if it never changes, else pass it as a GPU tensor",
    "RNG": "draw from the default CUDA generator (a graph advances it on every replay) and seed once, before "
           "capture, never inside the captured function",
    "optimizer": "construct it with capturable=True (its step count then lives on the GPU)",
    "autocast cache": "use torch.autocast(..., cache_enabled=False) around graphed code, or a weight cast "
                      "cached before capture is replayed after the weights changed",
}


@dataclasses.dataclass
class Finding:
    """One thing that would break or silently corrupt a graph: ``kind``, ``where`` (file:line of your code),
    ``what`` happened, how to ``fix`` it, the source ``code`` line and how many times it was seen."""
    kind: str
    where: str
    what: str
    fix: str
    code: str = ""
    count: int = 1


def _wrap(text: str, width: int) -> list:
    import textwrap
    return textwrap.wrap(text, width) or [""]


class CheckReport:
    """What :func:`check_capturable` found. ``ok`` is True (and it prints "looks capturable") only when
    nothing was found. ``findings`` lists :class:`Finding`; ``notes`` says what could not be checked."""

    def __init__(self, name: str, findings: list, notes: list, calls: int, device: str):
        self.name, self.findings, self.notes, self.calls, self.device = name, findings, notes, calls, device

    @property
    def ok(self) -> bool:
        return not self.findings

    def kinds(self) -> set:
        return {f.kind for f in self.findings}

    def __len__(self):
        return len(self.findings)

    def __iter__(self):
        return iter(self.findings)

    def to_frame(self):
        """The findings as a pandas DataFrame (kind, where, what, fix, code, count)."""
        import pandas as pd
        return pd.DataFrame([dataclasses.asdict(f) for f in self.findings],
                            columns=["kind", "where", "what", "fix", "code", "count"])

    def __str__(self):
        head = f"check_capturable({self.name}), {self.calls} eager call(s) on {self.device}: "
        if self.ok:
            lines = [head + "looks capturable (nothing found)."]
        else:
            lines = [head + f"{len(self.findings)} finding(s); not capturable as it is."]
            w_kind = max(4, max(len(f.kind) for f in self.findings))
            w_where = min(44, max(5, max(len(f.where) for f in self.findings)))
            lines.append(f" #  {'kind':{w_kind}}  {'where':{w_where}}  what")
            for i, f in enumerate(self.findings, 1):
                what = f.what + (f" ({f.count}x)" if f.count > 1 else "")
                wrapped = _wrap(what, 70)
                lines.append(f"{i:2d}  {f.kind:{w_kind}}  {f.where[:w_where]:{w_where}}  {wrapped[0]}")
                pad = " " * (4 + w_kind + 2 + w_where + 2)
                lines += [pad + w for w in wrapped[1:]]
                if f.code:
                    lines.append(pad + "code: " + f.code[:80])
                for j, w in enumerate(_wrap(f.fix, 70)):
                    lines.append(pad + ("fix:  " if j == 0 else "      ") + w)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


# ------------------------------------------------------------------------------------ where in user code
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # <stdin>, <string>: the user's code
        return True
    f = os.path.abspath(filename)
    if f.startswith(_TORCH_DIR) or f == _THIS_FILE or f.startswith(os.path.splitext(_THIS_FILE)[0]):
        return False
    if f.startswith(_STDLIB) and "site-packages" not in f and "dist-packages" not in f:
        return False
    return True


def _user_frame(frame):
    while frame is not None and not _is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _describe_frame(frame) -> tuple:
    """("file:line (function)", source line) of a frame."""
    if frame is None:
        return "?", ""
    code = frame.f_code
    return _location(code.co_filename, frame.f_lineno, code.co_name)


def _location(filename: str, lineno: int, func: str = "") -> tuple:
    name = filename
    if "ipykernel_" in filename or filename.startswith("<ipython-input"):
        name = "cell"  # a notebook cell (the line number is the cell's)
    elif not filename.startswith("<"):
        try:
            rel = os.path.relpath(filename)
            name = rel if not rel.startswith("..") else os.path.basename(filename)
        except ValueError:
            name = os.path.basename(filename)
    where = f"{name}:{lineno}" + (f" ({func})" if func and func != "<module>" else "")
    return where, linecache.getline(filename, lineno).strip()


def _definition_of(fn) -> tuple:
    """Where a callable is defined (for findings that belong to the function as a whole)."""
    target = fn
    if isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, torch.nn.Module):
        target = type(target).forward
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        call = getattr(type(target), "__call__", None)
        code = getattr(call, "__code__", None)
    if code is None:
        return "?", ""
    return _location(code.co_filename, code.co_firstlineno, code.co_name)


def _name_of(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({_name_of(fn.func)})"
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


# ------------------------------------------------------------------------------------------ the recorder
_DATA_DEPENDENT = {"nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique", "_unique", "_unique2",
                   "unique_dim", "unique_consecutive", "unique_dim_consecutive", "bincount"}
_SCALAR_READS = {"_local_scalar_dense": ".item() / float() / int() / bool() reads a tensor's value on the CPU",
                 "is_nonzero": "`if tensor:` reads a tensor's value on the CPU",
                 "equal": "torch.equal returns a Python bool: it reads values on the CPU"}
_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "to"}


def _leaves(obj):
    from torch.utils._pytree import tree_leaves
    return tree_leaves(obj)


def _stream_key(stream) -> int:
    return int(stream.cuda_stream)


class _Recorder:
    """Collects raw observations while the user's function runs; :meth:`findings` turns them into a list."""

    def __init__(self, main_thread_id: int, devices=()):
        self.main = main_thread_id
        self.devices = set(devices)  # CUDA device indices of the arguments
        self.events = {}          # (kind, where, what) -> Finding
        self.order = []
        self.current_op = None
        self.seq = 0
        self.entry_streams = {}   # device index -> stream key at entry
        self.side_uses = {}       # stream key -> dict(first, last, where, code, device)
        self.event_src = {}       # id(event) -> (stream key, seq)
        self.waits = []           # (waiter key, source key, source seq, seq at wait)
        self.optimizers = {}      # id -> optimizer
        self.quiet = False        # inside a patched call that was reported already (ignore what it does)
        self.literals = {}        # 0-dim CPU tensors made from numbers in the code (constants, not state)

    # where: the innermost frame of user code; for other threads (autograd), the main thread's
    def where(self) -> tuple:
        frame = sys._getframe(1)
        if threading.get_ident() != self.main:
            frame = sys._current_frames().get(self.main)
        return _describe_frame(_user_frame(frame))

    def add(self, kind: str, what: str, where: tuple | None = None, fix: str | None = None):
        loc, code = where or self.where()
        key = (kind, loc, what)
        if key in self.events:
            self.events[key].count += 1
            return
        self.events[key] = Finding(kind, loc, what, fix or FIXES[kind], code)
        self.order.append(key)

    # -- operators (from the dispatch mode) ------------------------------------------------------------------
    def op(self, func, args, kwargs):
        self.seq += 1
        if self.quiet:
            return
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        tensors = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        cuda = [t for t in tensors if t.is_cuda]
        cpu = [t for t in tensors if t.device.type == "cpu"]
        printing = self._printing()

        if name in _SCALAR_READS:
            what = _SCALAR_READS[name]
            if printing:
                what = "printing a tensor reads its values on the CPU"
            if cuda:
                self.add("host sync", f"aten.{name}: {what}, which waits for the GPU")
            elif not self._from_torch_internals(("optim", "amp")):
                if torch.cuda.is_available() and self.entry_streams:
                    self.add("CPU tensor", f"aten.{name}: {what} from a CPU tensor: a graph keeps the number "
                             "read at capture")
                else:
                    self.add("host sync", f"aten.{name}: {what}; with CUDA tensors this waits for the GPU")
        elif name in _DATA_DEPENDENT or (name == "repeat_interleave" and kwargs.get("output_size") is None
                                         and any(isinstance(a, torch.Tensor) for a in args[1:2])):
            self.add("data-dependent shape", f"aten.{name}: the output's shape depends on the values, so the "
                     "CPU must wait for the GPU to size it")
        elif name == "index" and self._bool_index(args):
            self.add("data-dependent shape", "x[mask] with a boolean mask: the output's shape depends on the "
                     "mask's values (it runs nonzero and waits for the GPU)")
        elif name in ("index_put", "index_put_", "_index_put_impl_") and self._bool_index(args) \
                and not self._lowers_to_masked_fill(args, kwargs):
            self.add("host sync", "x[mask] = v with a boolean mask runs nonzero, which waits for the GPU",
                     fix="x.masked_fill_(mask, v) or torch.where(mask, v, x): same result, fixed shapes, no sync")

        if name in _COPY_OPS and tensors:
            self._copy(name, args, kwargs, printing)
        elif cuda and cpu:
            for t in cpu:
                if t.dim() == 0 and self.literals.get(id(t)) is t:
                    continue
                if t.dim() == 0:
                    self.add("CPU tensor", f"aten.{name} reads a 0-dim CPU tensor as a number: a graph keeps the "
                             "value it had at capture")
                else:
                    self.add("CPU tensor", f"aten.{name} mixes a CPU tensor of shape {tuple(t.shape)} with CUDA "
                             "tensors")

        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator):
            if gen.device.type == "cuda":
                defaults = getattr(torch.cuda, "default_generators", ())
                if not any(gen is d for d in defaults):
                    self.add("RNG", f"aten.{name} draws from a torch.Generator that is not the default CUDA "
                             "generator: capture fails (or, if registered with the graph, it must stay alive)")
            elif cuda:
                self.add("RNG", f"aten.{name} draws random numbers on the CPU: a graph keeps the numbers drawn "
                         "at capture")

        if cuda and torch.cuda.is_available():
            self._stream_use(cuda[0].device)

    @staticmethod
    def _from_torch_internals(packages) -> bool:
        """True if PyTorch code in one of ``packages`` (e.g. an optimizer's own CPU bookkeeping), not the
        user's code, called the op: a PyTorch frame of those packages lies between the op and user code."""
        prefixes = tuple(os.path.join(_TORCH_DIR, p) + os.sep for p in packages)
        f = sys._getframe(2)
        while f is not None and not _is_user_file(f.f_code.co_filename):
            if os.path.abspath(f.f_code.co_filename).startswith(prefixes):
                return True
            f = f.f_back
        return False

    def _printing(self) -> bool:
        f = sys._getframe(2)
        for _ in range(40):
            if f is None:
                return False
            if f.f_code.co_filename.endswith("_tensor_str.py"):
                return True
            f = f.f_back
        return False

    @staticmethod
    def _bool_index(args) -> bool:
        if len(args) < 2:
            return False
        indices = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)

    def _lowers_to_masked_fill(self, args, kwargs) -> bool:
        """ATen's own fast path (``canDispatchToMaskedFill`` in TensorAdvancedIndexing.cpp): ``x[mask] = v`` with a
        single boolean mask, no accumulate, and a one-element value on the CPU runs ``masked_fill_``: no
        ``nonzero``, no sync. Python numbers arrive as such a value (``lift_fresh``; PyTorch 2.14 sends
        ``x[mask] = 0.0`` here, older releases call ``masked_fill_`` directly). A value that is a tensor of the
        user's stays a candidate for the GPU, where the fast path does not apply."""
        self_, indices = args[0], args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        value = args[2] if len(args) > 2 else kwargs.get("values")
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        masks = [i for i in indices if isinstance(i, torch.Tensor)]
        if accumulate or not isinstance(value, torch.Tensor) or value.numel() != 1 or len(masks) != 1 \
                or masks[0].dtype not in (torch.bool, torch.uint8) or masks[0].device != self_.device:
            return False
        literal = value.dim() == 0 and self.literals.get(id(value)) is value
        return literal or (value.device.type == "cpu" and self_.device.type == "cuda")

    def _copy(self, name, args, kwargs, printing):
        if name in ("_to_copy", "to"):
            src = args[0]
            dst_dev = kwargs.get("device")
            dst_dev = torch.device(dst_dev) if dst_dev is not None else src.device
        else:  # copy_(dst, src), _copy_from(src, dst)
            if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
                return
            dst, src = (args[0], args[1]) if name == "copy_" else (args[1], args[0])
            dst_dev = dst.device
        if src.device.type == "cpu" and dst_dev.type == "cuda":
            if not src.is_pinned():
                self.add("pageable copy", f"a CPU tensor of shape {tuple(src.shape)} in pageable memory is copied to "
                         "the GPU (.to / .cuda / copy_): not allowed during capture")
            elif not kwargs.get("non_blocking", False) and name != "copy_":
                self.add("host sync", "a pinned CPU tensor is copied to the GPU with non_blocking=False, which "
                         "waits for the copy")
        elif src.is_cuda and dst_dev.type == "cpu":
            what = ("printing a CUDA tensor copies it to the CPU and waits for the GPU" if printing else
                    f"aten.{name}: a CUDA tensor of shape {tuple(src.shape)} is copied to the CPU "
                    "(.cpu() / .numpy() / .tolist()), which waits for the GPU")
            self.add("host sync", what)

    # -- streams ------------------------------------------------------------------------------------------
    def _stream_use(self, device):
        idx = device.index if device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(idx)
        key = _stream_key(stream)
        if idx not in self.entry_streams or key == self.entry_streams[idx]:
            return
        use = self.side_uses.get(key)
        if use is None:
            loc, code = self.where()
            self.side_uses[key] = {"first": self.seq, "last": self.seq, "where": (loc, code), "device": idx}
        else:
            use["last"] = self.seq
            use["where"] = self.where()

    def record_event(self, event, stream):
        if stream is not None:
            self.event_src[id(event)] = (_stream_key(stream), self.seq)

    def wait_event(self, event, stream):
        src = self.event_src.get(id(event))
        if src is not None and stream is not None:
            self.waits.append((_stream_key(stream), src[0], src[1], self.seq))

    def stream_findings(self):
        for key, use in self.side_uses.items():
            entry = self.entry_streams.get(use["device"])
            forked = any(w == key and s == entry and at <= use["first"] for w, s, _, at in self.waits)
            joined = any(w == entry and s == key and src_seq >= use["last"] for w, s, src_seq, _ in self.waits)
            if not forked:
                self.add("side stream", "work on another stream starts without waiting for the calling stream: "
                         "during capture it would run once, eagerly, outside the graph (or read unfinished "
                         "inputs)", where=use["where"])
            if not joined:
                self.add("side stream", "work on another stream is not joined back before the function returns: "
                         "capture fails with unjoined work", where=use["where"])

    # -- optimizers, autocast, seeding ------------------------------------------------------------------------
    def optimizer_step(self, optimizer):
        self.optimizers[id(optimizer)] = optimizer
        name = type(optimizer).__name__
        if any("capturable" in g and not g["capturable"] for g in optimizer.param_groups):
            self.add("optimizer", f"{name}.step() with capturable=False keeps its step count on the CPU: "
                     "capture fails, or a replay reuses a stale step count")

    def autocast_enter(self, ac):
        if getattr(ac, "_enabled", False) and getattr(ac, "_cache_enabled", False):
            self.add("autocast cache", f"torch.autocast('{getattr(ac, 'device', '?')}') with cache_enabled=True "
                     "caches casts of the weights")

    def reseed(self, fn_name):
        if self.quiet:
            return
        self.add("RNG", f"{fn_name}() inside the function: a graph cannot reseed (capture fails), and replays "
                 "would never reseed")

    def findings(self) -> list:
        self.stream_findings()
        return [self.events[k] for k in self.order]


def _make_mode(recorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Inspector(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                recorder.op(func, args, kwargs)
            except Exception:  # the inspection must never break the user's function
                pass
            recorder.current_op = func
            try:
                out = func(*args, **kwargs)
            finally:
                recorder.current_op = None
            if getattr(func, "overloadpacket", None) is not None and \
                    func.overloadpacket.__name__ in ("scalar_tensor", "lift_fresh", "lift_fresh_copy"):
                recorder.literals[id(out)] = out  # a number written in the code (0.0, torch.tensor(3.0)): constant
            return out

    return _Inspector()


@contextlib.contextmanager
def _patched(obj, name, wrapper_factory):
    original = getattr(obj, name)
    setattr(obj, name, wrapper_factory(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


@contextlib.contextmanager
def _instrumented(recorder):
    """Everything that observes the function: sync debug mode, warnings, hooks, patched join/seed calls."""
    cuda = torch.cuda.is_available()
    stack = contextlib.ExitStack()
    with stack:
        # optimizer.step() of any optimizer
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: recorder.optimizer_step(opt))
        stack.callback(handle.remove)
        # autocast regions entered inside the function
        autocast_cls = torch.amp.autocast_mode.autocast

        def enter_factory(original):
            def __enter__(self):
                recorder.autocast_enter(self)
                return original(self)
            return __enter__
        stack.enter_context(_patched(autocast_cls, "__enter__", enter_factory))
        # reseeding
        for module, name in ((torch, "manual_seed"), (torch, "seed"), (torch.cuda, "manual_seed"),
                             (torch.cuda, "manual_seed_all"), (torch.cuda, "set_rng_state")):
            def seed_factory(original, label=f"{module.__name__}.{name}"):
                @functools.wraps(original)
                def seeded(*a, **k):
                    recorder.reseed(label)
                    outer, recorder.quiet = recorder.quiet, True
                    try:
                        return original(*a, **k)
                    finally:
                        recorder.quiet = outer
                return seeded
            stack.enter_context(_patched(module, name, seed_factory))
        # printing a tensor (print, repr, str): reads its values on the CPU
        def repr_factory(original):
            @functools.wraps(original)
            def __repr__(self, *a, **k):
                if recorder.quiet:
                    return original(self, *a, **k)
                device = "GPU" if self.is_cuda else self.device.type.upper()
                recorder.add("host sync", f"printing a {device} tensor reads its values on the CPU"
                             + (", which waits for the GPU" if self.is_cuda else "; a GPU tensor would make the CPU "
                                "wait for the GPU"),
                             fix="print after the replay (or every N steps), from the graph's output")
                outer, recorder.quiet = recorder.quiet, True
                try:
                    return original(self, *a, **k)
                finally:
                    recorder.quiet = outer
            return __repr__
        stack.enter_context(_patched(torch.Tensor, "__repr__", repr_factory))
        if cuda:
            # an explicit device synchronize (sync debug mode does not report it everywhere)
            def sync_factory(original):
                @functools.wraps(original)
                def synchronize(*a, **k):
                    recorder.add("host sync", "torch.cuda.synchronize() waits for the whole GPU")
                    outer, recorder.quiet = recorder.quiet, True  # silences the sync warning it causes
                    try:
                        return original(*a, **k)
                    finally:
                        recorder.quiet = outer
                return synchronize
            stack.enter_context(_patched(torch.cuda, "synchronize", sync_factory))
            # forks and joins between streams go through Event.record / Event.wait
            def record_factory(original):
                def record(self, stream=None):
                    recorder.record_event(self, stream if stream is not None else torch.cuda.current_stream())
                    return original(self, stream)
                return record

            def wait_factory(original):
                def wait(self, stream=None):
                    recorder.wait_event(self, stream if stream is not None else torch.cuda.current_stream())
                    return original(self, stream)
                return wait
            stack.enter_context(_patched(torch.cuda.Event, "record", record_factory))
            stack.enter_context(_patched(torch.cuda.Event, "wait", wait_factory))
            for i in recorder.devices | {torch.cuda.current_device()}:
                recorder.entry_streams[i] = _stream_key(torch.cuda.current_stream(i))
            # host synchronizations: PyTorch warns on each one in sync debug mode
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, previous)
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("always", message=".*synchronizing CUDA operation")
        show_original = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if "synchronizing CUDA operation" in str(message):
                if recorder.quiet:  # inside torch.cuda.synchronize / a seeding call: already reported
                    return
                op = recorder.current_op
                if op is not None:
                    name = op.overloadpacket.__name__ if hasattr(op, "overloadpacket") else str(op)
                    if name not in _SCALAR_READS and name not in _COPY_OPS and name not in _DATA_DEPENDENT \
                            and name not in ("index", "index_put", "index_put_", "_index_put_impl_"):
                        recorder.add("host sync", f"aten.{name} synchronizes with the GPU (sync debug mode)")
                else:
                    recorder.add("host sync", "a synchronizing CUDA call (torch.cuda.synchronize, stream or event "
                                 "synchronize, or a blocking copy) waits for the GPU")
                return
            show_original(message, category, filename, lineno, file, line)
        warnings.showwarning = showwarning
        yield


# ---------------------------------------------------------------------------------- Python state watching
_SCALARS = (int, float, bool, str, complex, type(None))


def _is_scalar(v) -> bool:
    if isinstance(v, _SCALARS):
        return True
    return isinstance(v, tuple) and len(v) <= 8 and all(isinstance(x, _SCALARS) for x in v)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return a is b


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))  # parameters, buffers, hooks, training: not Python state
_LIBRARY_ROOTS = ("torch", "numpy", "pandas", "typing", "collections", "functools", "threading", "logging",
                  "builtins", "abc", "enum", "weakref")


def _library_class(cls) -> bool:
    """A class of PyTorch, the standard library or another package whose internals are not the user's state
    (modules, optimizers and LR schedulers are handled on their own)."""
    name = getattr(cls, "__module__", "") or ""
    root = name.split(".")[0]
    if root in _LIBRARY_ROOTS or root in getattr(sys, "stdlib_module_names", ()):
        return True
    path = getattr(sys.modules.get(name), "__file__", None) or ""
    return bool(path) and not _is_own_code(path)


def _is_own_code(filename: str) -> bool:
    """Code of the user's project (not PyTorch, the standard library or an installed package)."""
    return _is_user_file(filename) and "site-packages" not in filename and "dist-packages" not in filename


_SCHEDULER = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler


def _library_object(obj) -> bool:
    if isinstance(obj, _SCHEDULER):
        return False
    return _library_class(type(obj))


class _StateWatch:
    """Getters for the Python values a function can reach: closure cells, referenced globals, default arguments,
    attributes of the objects it holds or is bound to (and of their classes), items of containers, optimizer
    hyper-parameters, and the same for every helper function or method it can call. Tensors, modules and
    optimizers met on the way are kept too (``verify`` restores their state between calls).

    A mutable container is watched through its length and its items; an object through its attributes.
    """

    LIMIT = 3000     # getters at most
    DEPTH = 4        # links followed from the function
    ITEMS = 64       # items of one container

    def __init__(self):
        self.getters = {}
        self.seen = set()
        self.tensors = {}      # id -> (label, tensor)
        self.modules = {}      # id -> module
        self.optimizers = {}   # id -> optimizer

    def _add(self, label, getter):
        if len(self.getters) < self.LIMIT and label not in self.getters:
            self.getters[label] = getter

    def _member(self, label, value, getter, depth):
        """A value found at ``label``: watch it if it is a number, follow it if it holds more."""
        if _is_scalar(value):
            self._add(label, getter)
        elif isinstance(value, torch.Tensor):
            self.tensors.setdefault(id(value), (label, value))
        elif isinstance(value, types.ModuleType):
            return
        else:
            self.add_object(label, value, depth + 1)

    def add_object(self, label, obj, depth=0):
        if depth > self.DEPTH or id(obj) in self.seen or len(self.getters) >= self.LIMIT:
            return
        if isinstance(obj, torch.Tensor):
            self.tensors.setdefault(id(obj), (label, obj))
            return
        if isinstance(obj, (types.ModuleType, types.BuiltinFunctionType, types.CodeType, types.FrameType)) \
                or _is_scalar(obj):
            return
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            self.add_callable(label, obj, depth + 1)  # a helper it can call: what that reaches counts too
            return
        self.seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            self.optimizers[id(obj)] = obj
            for i, group in enumerate(obj.param_groups):
                for k, v in group.items():
                    if k != "params" and _is_scalar(v):
                        self._add(f"{label}.param_groups[{i}]['{k}']", lambda g=group, k=k: g.get(k))
            return
        if isinstance(obj, torch.nn.Module):
            for mname, m in obj.named_modules():
                self.modules[id(m)] = m
                self.seen.add(id(m))
                for k, v in list(vars(m).items()):
                    if k.startswith("__") or k in _MODULE_INTERNALS:
                        continue
                    path = f"{label}.{mname}.{k}" if mname else f"{label}.{k}"
                    self._member(path, v, lambda m=m, k=k: getattr(m, k, None), depth)
                self._add_class(f"{label}.{mname}" if mname else label, type(m), depth)
            return
        if isinstance(obj, functools.partial):
            self.add_callable(label, obj.func, depth + 1)
            for i, a in enumerate(obj.args):
                self._member(f"{label}.args[{i}]", a, lambda p=obj, i=i: p.args[i], depth)
            for k, a in obj.keywords.items():
                self._member(f"{label}.keywords['{k}']", a, lambda p=obj, k=k: p.keywords.get(k), depth)
            return
        if isinstance(obj, type):
            self._add_class(label, obj, depth, seen_ok=True)
            return
        if isinstance(obj, dict):
            self._add(f"len({label})", lambda d=obj: len(d))
            for k in list(obj)[:self.ITEMS]:
                shown = repr(k) if _is_scalar(k) else f"<{type(k).__name__}>"  # no tensor repr (a GPU read)
                self._member(f"{label}[{shown}]", obj[k], lambda d=obj, k=k: d.get(k), depth)
            return
        if isinstance(obj, (list, tuple, collections.deque)):
            if not isinstance(obj, tuple):
                self._add(f"len({label})", lambda s=obj: len(s))
            for i, v in enumerate(list(obj)[:self.ITEMS]):
                self._member(f"{label}[{i}]", v, lambda s=obj, i=i: s[i] if i < len(s) else None, depth)
            return
        if isinstance(obj, (set, frozenset)):
            if isinstance(obj, set):
                self._add(f"len({label})", lambda s=obj: len(s))
            return
        if _library_object(obj):
            return
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            for k, v in list(attrs.items())[:self.LIMIT]:
                if not k.startswith("__"):
                    self._member(f"{label}.{k}", v, lambda o=obj, k=k: getattr(o, k, None), depth)
        self._add_class(f"{label}.__class__", type(obj), depth)

    def _add_class(self, label, cls, depth, seen_ok=False):
        """Class attributes of a user-defined class (and the helper methods it defines)."""
        if depth > self.DEPTH or (id(cls) in self.seen and not seen_ok) or _library_class(cls):
            return
        self.seen.add(id(cls))
        for klass in cls.__mro__:
            if klass is object or _library_class(klass):
                continue
            for k, v in list(vars(klass).items()):
                if k.startswith("__"):
                    continue
                name = f"{klass.__name__}.{k}"
                if isinstance(v, (staticmethod, classmethod)):
                    v = v.__func__
                if isinstance(v, types.FunctionType):
                    self.add_callable(name, v, depth + 1)
                elif isinstance(v, (property, types.MemberDescriptorType, types.GetSetDescriptorType)):
                    continue
                else:
                    self._member(name, v, lambda c=klass, k=k: vars(c).get(k), depth)

    def add_callable(self, label, fn, depth=0):
        if depth > self.DEPTH:
            return
        if isinstance(fn, types.MethodType):
            self.add_object(f"{label}.__self__" if label else "self", fn.__self__, depth)
            fn = fn.__func__
        if isinstance(fn, functools.partial) or isinstance(fn, torch.nn.Module):
            self.add_object(label or _name_of(fn), fn, depth)
            return
        if not isinstance(fn, types.FunctionType):
            if hasattr(fn, "__dict__") and not isinstance(fn, type):
                self.add_object(label or type(fn).__name__, fn, depth)
            return
        if id(fn) in self.seen or not _is_own_code(fn.__code__.co_filename):
            return
        self.seen.add(id(fn))
        code = fn.__code__
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if _is_scalar(value):
                self._add(f"closure variable '{name}'", lambda c=cell: c.cell_contents)
            else:
                self._member(name, value, lambda c=cell: c.cell_contents, depth)
        for i, value in enumerate(fn.__defaults__ or ()):
            if not _is_scalar(value):
                self._member(f"{code.co_name}.__defaults__[{i}]", value, lambda f=fn, i=i: f.__defaults__[i], depth)
        g = fn.__globals__
        names = _global_names(code)
        for name in names:
            if name not in g:
                continue
            value = g[name]
            if _is_scalar(value):
                self._add(f"global '{name}'", lambda g=g, n=name: g.get(n))
            elif isinstance(value, types.ModuleType):
                self._add_module_attributes(name, value, names, depth)
            else:
                self._member(name, value, lambda g=g, n=name: g.get(n), depth)

    def _add_module_attributes(self, label, module, names, depth):
        """``cfg.step`` where ``cfg`` is a module of the user's: the attributes the code names."""
        path = getattr(module, "__file__", None) or ""
        if not path or not _is_own_code(path):
            return
        for name in names:
            if name in vars(module):
                self._member(f"{label}.{name}", vars(module)[name],
                             lambda m=module, n=name: getattr(m, n, None), depth)

    def snapshot(self) -> dict:
        out = {}
        for label, get in self.getters.items():
            try:
                out[label] = copy.copy(get())
            except Exception:
                out[label] = None
        return out


def _global_names(code) -> list:
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_names(const)))
    return list(names)


class _ChangeTracer:
    """sys.settrace tracer that attributes each change of a watched value to the line of user code that ran
    just before it was seen changed."""

    def __init__(self, watch: _StateWatch):
        self.watch = watch
        self.last = watch.snapshot()
        self.prev_line = {}
        self.where = {}  # label -> (where, code)

    def _check(self, frame):
        if not self.watch.getters:
            return
        now = self.watch.snapshot()
        for k, v in now.items():
            if k not in self.where and not _same(v, self.last.get(k)):
                line = self.prev_line.get(id(frame), frame.f_lineno)
                self.where[k] = _location(frame.f_code.co_filename, line, frame.f_code.co_name)
        self.last = now

    def global_trace(self, frame, event, arg):
        if event != "call" or not _is_user_file(frame.f_code.co_filename):
            return None
        return self.local_trace

    def local_trace(self, frame, event, arg):
        if event in ("line", "return"):
            self._check(frame)
            self.prev_line[id(frame)] = frame.f_lineno
            if event == "return":
                self.prev_line.pop(id(frame), None)
        return self.local_trace


def _watch_for(fn, args=()) -> _StateWatch:
    """A :class:`_StateWatch` of everything ``fn`` (a function, method, partial, module or callable object) and
    its non-tensor arguments can reach."""
    watch = _StateWatch()
    watch.add_callable("", fn)
    if not isinstance(fn, (types.FunctionType, types.MethodType, functools.partial)):
        watch.add_object(_name_of(fn), fn)
        forward = getattr(type(fn), "forward", None) or getattr(type(fn), "__call__", None)
        if isinstance(forward, types.FunctionType):
            watch.add_callable(f"{_name_of(fn)}.forward", forward)
    for i, a in enumerate(args):
        if isinstance(a, (torch.nn.Module, torch.optim.Optimizer)):
            watch.add_object(f"args[{i}]", a)
    return watch


class _TensorState:
    """The tensor state a function can reach (module parameters, gradients and buffers, optimizer state, tensors
    it holds), saved now and put back in place by :meth:`restore` (the same tensors are written, so a graph that
    reads them keeps working)."""

    def __init__(self, watch: _StateWatch, extra=()):
        tensors = {id(t): t for _, t in watch.tensors.values()}
        self.grads = {}
        for m in list(watch.modules.values()) + [e for e in extra if isinstance(e, torch.nn.Module)]:
            for t in list(m.parameters()) + list(m.buffers()):
                tensors[id(t)] = t
        for e in extra:
            if isinstance(e, torch.Tensor):
                tensors[id(e)] = e
        optimizers = list(watch.optimizers.values()) + [e for e in extra if isinstance(e, torch.optim.Optimizer)]
        for opt in optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    tensors[id(p)] = p
        tensors = {k: t for k, t in tensors.items() if not (hasattr(t, "is_inference") and t.is_inference())}
        self.saved = [(t, t.detach().clone()) for t in tensors.values()]
        self.grads = [(t, None if t.grad is None else t.grad.detach().clone()) for t in tensors.values()
                      if t.requires_grad and t.is_leaf]
        self.optimizers = [(opt, {p: {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                                      for k, v in st.items()} for p, st in opt.state.items()})
                           for opt in {id(o): o for o in optimizers}.values()]

    def restore(self):
        with torch.no_grad():
            for t, v in self.saved:
                t.copy_(v)
            for t, g in self.grads:
                if g is None:
                    t.grad = None
                elif t.grad is None or t.grad.shape != g.shape:
                    t.grad = g.clone()
                else:
                    t.grad.copy_(g)
            for opt, state in self.optimizers:
                for p in [p for p in opt.state if p not in state]:
                    del opt.state[p]  # state created after the save (a first optimizer step)
                for p, st in state.items():
                    now = opt.state[p]
                    for k, v in st.items():
                        if isinstance(v, torch.Tensor) and isinstance(now.get(k), torch.Tensor) \
                                and now[k].shape == v.shape:
                            now[k].copy_(v)
                        else:
                            now[k] = v.clone() if isinstance(v, torch.Tensor) else v


# -------------------------------------------------------------------------------------- check_capturable
def _perturbed(args, seed: int = 1234):
    """Tensors like ``args`` (same shapes, dtypes, devices, value ranges) with other values."""
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor) or a.numel() == 0:
            out.append(a)
            continue
        g = torch.Generator(device=a.device).manual_seed(seed)
        with torch.no_grad():
            if a.dtype == torch.bool:
                new = torch.randint(0, 2, a.shape, generator=g, device=a.device).bool()
            elif a.is_floating_point() or a.is_complex():
                noise = torch.randn(a.shape, generator=g, device=a.device, dtype=torch.float32)
                base = a.detach().float()
                std = torch.nan_to_num(base.std(), nan=0.0) if a.numel() > 1 else torch.zeros((), device=a.device)
                std = torch.where(std > 0, std, torch.ones_like(std))  # a constant input still gets new values
                new = (base.mean() + noise * std).to(a.dtype)
            else:
                lo, hi = int(a.min()), int(a.max())
                new = torch.randint(lo, hi + 1, a.shape, generator=g, device=a.device, dtype=a.dtype)
        out.append(new.requires_grad_(a.requires_grad) if a.requires_grad and new.is_floating_point() else new)
    return tuple(out)


def _shapes(out) -> list:
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in _leaves(out)]


def check_capturable(fn: Callable, *args, calls: int = 2) -> CheckReport:
    """Run ``fn(*args)`` eagerly ``calls`` times under inspection and report what a CUDA graph would break.

    Nothing is captured. The calls are real (a training step trains ``calls`` steps); the second call gets
    inputs with other values (same shapes, dtypes and value ranges) to expose output shapes that depend on
    the data. Each finding names the line of your code responsible.

    Checked with CUDA: host synchronizations (sync debug mode), CPU tensors mixed into GPU work and pageable
    host-to-device copies, data-dependent shapes, streams not forked from / joined back to the calling
    stream, Python values that change between calls however the function reaches them (closure variables and
    globals, attributes of the objects it holds and of their classes, items of its containers, module attributes,
    optimizer hyper-parameters, and all of these through the helper functions and methods it calls; a change
    made by the first call alone, lazy initialisation, is left alone), random numbers outside the default CUDA generator and reseeding, optimizers
    with ``capturable=False``, autocast with its cache on. Without CUDA the same function runs on the CPU and
    only what is meaningful there is checked (Python state, data-dependent ops, value reads, optimizers,
    autocast, RNG seeding); the report says so.

    Example::

        report = check_capturable(train_step, x, y)
        print(report)            # a short table: kind, where (file:line), what, fix
        assert report.ok, report
    """
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}.")
    cuda_tensors = [a for a in _leaves(args) if isinstance(a, torch.Tensor) and a.is_cuda]
    recorder = _Recorder(threading.get_ident(), {t.device.index for t in cuda_tensors if t.device.index is not None})
    entry_where = _describe_frame(_user_frame(sys._getframe(1)))
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) and _is_scalar(a):
            recorder.add("Python argument", f"argument {i} is a Python {type(a).__name__} ({a!r}): a graph keeps "
                         "the value it was captured with", where=entry_where)
    on_cuda = torch.cuda.is_available() and bool(cuda_tensors)
    device = str(cuda_tensors[0].device) if cuda_tensors else "cpu"
    notes = []
    if not on_cuda:
        notes.append("no CUDA tensors: host syncs, device copies and streams need a GPU and were not checked")
    if _autocast_on(device) and torch.is_autocast_cache_enabled():
        recorder.add("autocast cache", "called inside an autocast region with cache_enabled=True",
                     where=entry_where)

    watch = _watch_for(fn, args)
    perturbed = _perturbed(args) if calls >= 2 else None

    history = {}          # label -> list of values seen
    recurring = set()     # labels whose value changed during a call after the first
    shapes = []
    tracer = _ChangeTracer(watch)
    for label, v in tracer.last.items():
        history[label] = [v]
    previous_trace = sys.gettrace()
    with _instrumented(recorder), _make_mode(recorder):
        for call in range(calls):
            call_args = perturbed if (call % 2 == 1 and perturbed is not None) else args
            sys.settrace(tracer.global_trace)
            try:
                out = fn(*call_args)
            except Exception as exc:
                if call == 0:
                    raise
                notes.append(f"call {call + 1} with other input values raised {type(exc).__name__}: {exc}; "
                             "the shape check was skipped")
                break
            finally:
                sys.settrace(previous_trace)
            shapes.append(_shapes(out))
            # optimizers stepped inside fn are watched from now on
            for opt in recorder.optimizers.values():
                before = len(watch.getters)
                watch.add_object(f"{type(opt).__name__}", opt)
                if len(watch.getters) != before:
                    snap = watch.snapshot()
                    for k in watch.getters:
                        if k not in history:
                            history[k] = [snap[k]]
                    tracer.last.update({k: snap[k] for k in snap if k not in tracer.last})
            snap = watch.snapshot()
            for k, v in snap.items():
                history.setdefault(k, [v])
                if not _same(history[k][-1], v):
                    history[k].append(v)
                    if call >= 1 or calls == 1:
                        # what changes on every call; a change made by the first call alone (lazy
                        # initialisation) happens in the warm-up, before a capture, and is left alone
                        recurring.add(k)
        del out
    if on_cuda:
        torch.cuda.synchronize()

    changed = {}  # location -> ["label (a -> b)", ...]
    for label, values in history.items():
        if len(values) > 1 and label in recurring:
            shown = " -> ".join(repr(v) for v in values[:4]) + (" -> ..." if len(values) > 4 else "")
            loc = tracer.where.get(label, _definition_of(fn))
            changed.setdefault(loc, []).append(f"{label} ({shown})")
    for loc, items in changed.items():
        listed = "; ".join(items[:3]) + (f"; and {len(items) - 3} more" if len(items) > 3 else "")
        recorder.add("Python state", f"changed during the calls: {listed}. A replay keeps the values read at "
                     "capture and repeats no Python side effect", where=loc)
    if len(shapes) >= 2 and any(s != shapes[0] for s in shapes[1:]):
        dd = [recorder.events[k] for k in recorder.order if k[0] == "data-dependent shape"]
        loc = (dd[0].where, dd[0].code) if dd else _definition_of(fn)
        recorder.add("data-dependent shape", f"the output shapes change with the input values "
                     f"({shapes[0]} vs {shapes[1]}): a graph replays the shapes it captured", where=loc)
    elif calls >= 2 and perturbed is not None and not any(isinstance(a, torch.Tensor) for a in args):
        notes.append("no tensor arguments: output shapes could not be compared across input values")
    return CheckReport(_name_of(fn), recorder.findings(), notes, len(shapes), device)


def _autocast_on(device: str) -> bool:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    try:
        return torch.is_autocast_enabled(kind)
    except TypeError:  # older PyTorch
        return torch.is_autocast_enabled() if kind == "cuda" else torch.is_autocast_cpu_enabled()


# ------------------------------------------------------------------------------------------------- verify
_TOL = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
        torch.float64: (1e-7, 1e-7)}


def _compare(a, b, rtol=None, atol=None) -> tuple:
    """(equal?, max |a-b|, mismatched elements, what differs) for two tensors."""
    if a.shape != b.shape:
        return False, float("inf"), a.numel(), f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if not (a.is_floating_point() or a.is_complex()):
        bad = int((a != b.to(a.device)).sum())
        diff = float((a.double() - b.to(a.device).double()).abs().max()) if a.numel() else 0.0
        return bad == 0, diff, bad, ""
    r, t = _TOL.get(a.dtype, (1.3e-6, 1e-5))
    r, t = (rtol if rtol is not None else r), (atol if atol is not None else t)
    x, y = a.detach().double(), b.detach().to(a.device).double()
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    nan_bad = nan_x != nan_y
    diff = (x - y).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    same_inf = torch.isinf(x) & torch.isinf(y) & (x == y)
    bad = ((diff > t + r * y.abs().nan_to_num(nan=0.0)) & ~same_inf) | nan_bad
    n_bad = int(bad.sum())
    max_diff = float(diff.masked_fill(same_inf, 0).max()) if a.numel() else 0.0
    if int(nan_bad.sum()):
        max_diff = float("nan")
    return n_bad == 0, max_diff, n_bad, ""


def _tree(out) -> list:
    """(path, leaf) pairs of a nested output."""
    from torch.utils._pytree import tree_flatten_with_path, keystr
    try:
        leaves, _ = tree_flatten_with_path(out)
        return [(keystr(p) or "output", v) for p, v in leaves]
    except Exception:
        return [(f"output[{i}]", v) for i, v in enumerate(_leaves(out))]


def _clone_tree(out):
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else copy.copy(t), out)


def _compare_outputs(got, want, rtol, atol):
    """None if equal, else dict(path, max_abs_diff, mismatched, detail)."""
    g, w = _tree(got), _tree(want)
    if len(g) != len(w):
        return {"path": "output", "max_abs_diff": float("inf"), "mismatched": None,
                "detail": f"{len(g)} output leaves vs {len(w)}"}
    for (path, a), (_, b) in zip(g, w):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            ok, diff, bad, detail = _compare(a, b, rtol, atol)
            if not ok:
                return {"path": path, "max_abs_diff": diff, "mismatched": bad, "numel": a.numel(), "detail": detail}
        elif not _same(a, b):
            return {"path": path, "max_abs_diff": None, "mismatched": 1, "detail": f"{a!r} vs {b!r}"}
    return None


def _state_tensors(obj) -> list:
    """(name, tensor) pairs of a module (parameters, buffers), an optimizer (state) or a tensor."""
    if isinstance(obj, torch.Tensor):
        return [("tensor", obj)]
    if isinstance(obj, torch.nn.Module):
        return list(obj.named_parameters()) + list(obj.named_buffers())
    if isinstance(obj, torch.optim.Optimizer):
        out = []
        params = [p for g in obj.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            for k, v in sorted(obj.state.get(p, {}).items()):
                if isinstance(v, torch.Tensor):
                    out.append((f"state[{i}]['{k}']", v))
        for i, g in enumerate(obj.param_groups):
            for k, v in g.items():
                if k != "params" and isinstance(v, torch.Tensor):
                    out.append((f"param_groups[{i}]['{k}']", v))
        return out
    raise TypeError(f"state pairs hold modules, optimizers or tensors, got {type(obj).__name__}.")


def _sync_state(src, dst):
    """Make ``dst`` (the eager reference) start from ``src``'s (the graph's) current state."""
    with torch.no_grad():
        if isinstance(src, torch.optim.Optimizer):
            dst.load_state_dict(copy.deepcopy(src.state_dict()))
            return
        for (n, a), (_, b) in zip(_state_tensors(src), _state_tensors(dst)):
            b.copy_(a)


def _fresh_like(t, step: int, gen, poison: bool):
    if not isinstance(t, torch.Tensor):
        return t
    if poison and (t.is_floating_point() or t.is_complex()):
        return torch.full_like(t, float("nan"))
    if t.dtype == torch.bool:
        new = torch.randint(0, 2, t.shape, generator=gen).bool()
    elif t.is_floating_point() or t.is_complex():
        new = torch.randn(t.shape, generator=gen, dtype=torch.float32)
    else:
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
        new = torch.randint(lo, hi + 1, t.shape, generator=gen, dtype=torch.int64)
    return new.to(device=t.device, dtype=t.dtype)


def _rng_state(devices):
    return torch.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in devices}


def _set_rng_state(state):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    for d, s in cuda.items():
        torch.cuda.set_rng_state(s, d)


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` found: ``ok``, the ``first`` divergence (step, where, sizes, likely cause), whether
    the graph returns the same output memory every call (``outputs_reused``), one row per step, and notes."""
    ok: bool
    steps: int
    first: dict | None
    outputs_reused: bool
    rows: list
    notes: list
    frozen_state: dict | None = None  # from the behavioural check: eager itself differs on identical inputs

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)

    def __str__(self):
        if self.ok:
            lines = [f"verify: the graph matches eager on all {self.steps} steps (fresh, poisoned and random inputs)."]
        elif self.first is self.frozen_state:
            f = self.first
            diff = f.get("max_abs_diff")
            lines = [f"verify: {f['what']}: two eager calls on identical inputs (RNG fixed, tensor state put back) "
                     f"give different outputs ({f['path']}"
                     + (f", max difference {diff:.3g}" if isinstance(diff, float) else "") + "), so comparing the "
                     "graph with eager would only show a mismatch.",
                     f"cause: {f['cause']}", f"fix: {FIXES['Python state']}"]
        else:
            f = self.first
            diff = f.get("max_abs_diff")
            lines = [f"verify: DIVERGES at step {f['step']} ({f['inputs']} inputs): {f['what']} differs"
                     + (f", max |graph - eager| = {diff:.3g}" if isinstance(diff, float) else "")
                     + (f", {f['mismatched']} element(s)" if f.get("mismatched") else "")
                     + (f" ({f['detail']})" if f.get("detail") else "") + ".",
                     f"likely cause: {f['hint']}"]
        if self.outputs_reused:
            lines.append("outputs: every call returns the same output memory, so an output you keep is "
                         "overwritten by the next call; clone what you keep (capture(..., clone_outputs=True)).")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _static_buffers(graphed, static_inputs):
    if static_inputs is not None:
        return [t for t in _leaves(static_inputs) if isinstance(t, torch.Tensor)]
    for attr in ("static_inputs", "static_batch"):
        found = getattr(graphed, attr, None)
        if found is not None:
            return [t for t in _leaves(found) if isinstance(t, torch.Tensor)]
    return []


def verify(graphed: Callable, reference: Callable, *sample_args, steps: int = 3, state=None,
           before_step: Callable[[int], Any] | None = None, static_inputs=None, poison: bool = True,
           rtol: float | None = None, atol: float | None = None, seed: int = 0) -> VerifyReport:
    """Call ``graphed`` and its eager ``reference`` on the same fresh inputs for ``steps`` steps; compare.

    Inputs are new tensors like ``sample_args`` at every step (random, and for a stateless function one step
    of NaN: a graph that reads stale memory then disagrees). Before each call the graph's static input
    buffers (``graphed.static_inputs`` / ``.static_batch``, or ``static_inputs=``) are filled with NaN, so a
    graph whose inputs are not copied in is caught. The RNG state is the same for both calls.

    First, a behavioural check: ``reference`` runs eagerly on identical inputs (after one warm-up call) twice,
    with the RNG fixed and the tensor state it reaches (parameters, gradients, buffers, optimizer state) put back
    before each call. If even those outputs differ, the function depends on state that the graph freezes (a
    Python value that changes from call to call): the report says so, with the values seen changing and the
    line, instead of calling it a mismatch (``report.frozen_state``).

    - ``state``: pairs ``[(graph_side, reference_side), ...]`` of modules, optimizers or tensors to compare
      after each step (a training step: the model and the optimizer). The reference side is first set to
      the graph side's current state.
    - ``before_step(i)``: called before step ``i`` (e.g. to step LR schedulers on both sides).

    Returns a :class:`VerifyReport`; ``print`` it. The first divergence names the step, the output or state
    entry, the size of the difference and the likely cause.

    Example::

        g = capture(model, x)
        print(verify(g, lambda x: model(x), x, steps=3))
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    pairs = list(state or [])
    for g_side, r_side in pairs:
        _sync_state(g_side, r_side)
    devices = sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                      for t in _leaves(sample_args) if isinstance(t, torch.Tensor) and t.is_cuda})
    statics = _static_buffers(graphed, static_inputs)
    frozen = _repeat_eagerly(reference, sample_args, devices, [r for _, r in pairs], rtol, atol, seed)
    gen = torch.Generator().manual_seed(seed)
    rows, kept, kept_clones, ref_outputs, notes = [], [], [], [], []
    if frozen is not None and "note" in frozen:
        notes.append(frozen["note"])
        frozen = None
    first = frozen
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        poison_args = poison and not pairs and steps >= 2 and step == 1
        inputs = tuple(_fresh_like(a, step, gen, poison_args) for a in sample_args)
        kind = "NaN" if poison_args else "random"
        if poison:
            with torch.no_grad():
                for s in statics:
                    if s.is_floating_point():
                        s.fill_(float("nan"))
        rng = _rng_state(devices)
        out_g = graphed(*inputs)
        out_g_clone = _clone_tree(out_g)
        _set_rng_state(rng)
        out_r = reference(*inputs)
        out_r = _clone_tree(out_r)
        if devices:
            torch.cuda.synchronize()
        kept.append(out_g)
        kept_clones.append(out_g_clone)
        row = {"step": step, "inputs": kind, "outputs_equal": True, "max_abs_diff": 0.0, "state_equal": True}
        bad = _compare_outputs(out_g_clone, out_r, rtol, atol)
        if bad is not None:
            row.update(outputs_equal=False, max_abs_diff=bad["max_abs_diff"])
            if first is None:
                first = dict(bad, step=step, inputs=kind,
                             what="the output" if bad["path"] == "output" else f"output {bad['path']}",
                             hint=_output_hint(out_g_clone, ref_outputs, statics and poison, rtol, atol))
        for g_side, r_side in pairs:
            for (name, a), (_, b) in zip(_state_tensors(g_side), _state_tensors(r_side)):
                ok, diff, n_bad, detail = _compare(a, b, rtol, atol)
                if not ok:
                    row["state_equal"] = False
                    if first is None:
                        label = type(g_side).__name__
                        first = {"step": step, "inputs": kind, "what": f"{label} {name}", "max_abs_diff": diff,
                                 "mismatched": n_bad, "detail": detail, "hint": _STATE_HINT}
                    break
        ref_outputs.append(out_r)
        rows.append(row)
    reused = _outputs_reused(kept, kept_clones)
    if reused and steps < 2:
        notes.append("one step only: whether outputs are reused across calls was not checked")
    return VerifyReport(first is None, steps, first, reused, rows, notes, frozen)


def _repeat_eagerly(reference, sample_args, devices, extra, rtol, atol, seed) -> dict | None:
    """The behavioural check of :func:`verify`: a warm-up call of ``reference``, then two calls on identical
    inputs with the RNG fixed and the tensor state it reaches put back before each. Outputs that still differ
    come from state that changes from one call to the next and is not a tensor updated in place: a Python value,
    which a graph freezes at capture. Returns None, or what differs and the cause (the values seen changing and
    the line that changed them). Everything it can put back (tensor state, RNG) is put back afterwards."""
    watch = _watch_for(reference, sample_args)
    gen = torch.Generator().manual_seed(seed + 7919)
    inputs = tuple(_fresh_like(a, 0, gen, False) for a in sample_args)

    def call():
        args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in inputs)
        return _clone_tree(reference(*args))

    start = _TensorState(watch, extra)
    rng = _rng_state(devices)
    tracer = _ChangeTracer(watch)
    previous_trace = sys.gettrace()
    outs = []
    try:
        call()  # a warm-up, as before a capture: lazy initialisation happens here, not in the compared calls
        warm = _TensorState(watch, extra)
        before = tracer.last = watch.snapshot()
        for _ in range(2):
            warm.restore()
            _set_rng_state(rng)
            sys.settrace(tracer.global_trace)
            try:
                outs.append(call())
            finally:
                sys.settrace(previous_trace)
        after = watch.snapshot()
    finally:
        start.restore()
        _set_rng_state(rng)
    if devices:
        torch.cuda.synchronize()
    bad = _compare_outputs(outs[1], outs[0], rtol, atol)
    if bad is None:
        return None
    changed = [k for k in after if not _same(after[k], before.get(k))]
    if changed:
        items = []
        for k in changed[:3]:
            loc, code = tracer.where.get(k, ("?", ""))
            items.append(f"{k} ({before.get(k)!r} -> {after[k]!r}), changed at {loc}" + (f": {code}" if code else ""))
        more = f"; and {len(changed) - 3} more" if len(changed) > 3 else ""
        cause = ("a Python value it reads changes on every call: " + "; ".join(items) + more + ". A replay keeps "
                 "the value read at capture")
        what = "depends on state that the graph freezes"
    elif _compare_outputs(outs[1], outs[0], 1e-3, 1e-4) is None:
        # no value seen changing and only a rounding-sized difference: nondeterministic kernels (atomics), not
        # frozen state; the comparison with the graph below uses the usual tolerances
        return {"note": f"two eager calls on identical inputs differ slightly ({bad['path']}, max "
                        f"{bad['max_abs_diff']:.3g}) though no Python value it reaches changed: nondeterministic "
                        "kernels, most likely"}
    else:
        cause = ("something it reads changes from one call to the next, and it is neither a tensor the check "
                 "could put back nor a Python value it could reach (a module-level value in a library, a file, "
                 "the clock): a graph replays what it read at capture. check_capturable(fn, *args) lists what it "
                 "can see")
        what = "depends on state that the graph freezes (not found)"
    return {"step": "before", "inputs": "identical", "what": what, "cause": cause, "hint": cause,
            "path": bad["path"], "max_abs_diff": bad["max_abs_diff"], "mismatched": bad.get("mismatched"),
            "detail": bad.get("detail", ""), "changed": changed}


_STATE_HINT = ("the graph's training state drifts from eager: a Python number frozen at capture (a learning "
               "rate changed by a scheduler, a step counter), gradients the graph no longer sees (zero_grad "
               "with set_to_none=True after capture, .grad replaced), or an optimizer with capturable=False")


def _output_hint(got, ref_outputs, poisoned, rtol, atol) -> str:
    for j in range(len(ref_outputs) - 1, -1, -1):
        if _compare_outputs(got, ref_outputs[j], rtol, atol) is None:
            return (f"the graph computed on step {j}'s inputs: new inputs are not reaching the graph's static "
                    "inputs. Copy them in (static.copy_(new)); rebinding a name (static = new) does not change "
                    "the memory the graph reads")
    leaves = [t for _, t in _tree(got) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if poisoned and any(bool(torch.isnan(t).any()) for t in leaves):
        return ("the graph read its static input buffers, which were poisoned with NaN before the call: new "
                "inputs are not copied into them")
    return ("the graph replays what it recorded at capture: a Python number, flag or CPU tensor read then is "
            "frozen (check_capturable(fn, *args) lists them), or the output was overwritten by another call")


def _outputs_reused(kept, clones) -> bool:
    if len(kept) < 2:
        return False
    ptrs = [[t.data_ptr() for t in _leaves(k) if isinstance(t, torch.Tensor)] for k in kept]
    same_memory = any(p and p == ptrs[-1] for p in ptrs[:-1])
    changed = any(_compare_outputs(k, c, 0.0, 0.0) is not None for k, c in zip(kept[:-1], clones[:-1]))
    return same_memory or changed


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
    graph can reach; ``speedup_if_no_gap_saved`` the same with the eager floor kept whole.
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


def _verdict(speedup: float) -> str:
    if speedup >= 1.5:
        return "Launch-bound: a graph should help."
    if speedup >= 1.1:
        return "Partly launch-bound: a graph helps a little."
    return "GPU-bound: eager is already near the floor; a graph will not help."


_REPLAY_COST: dict = {}


def _timing():
    try:
        from . import timing
    except ImportError:
        import timing  # a copy of the kit's timing.py beside this file
    return timing


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
    timing = _timing()
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
    cuda_args = [a for a in _leaves(args) if isinstance(a, torch.Tensor) and a.is_cuda]
    if not torch.cuda.is_available():
        return Advice("cpu", verdict="CUDA graphs need an NVIDIA GPU and torch.cuda.is_available() is False: "
                                     "nothing was measured.")
    device = cuda_args[0].device if cuda_args else torch.device("cuda", torch.cuda.current_device())
    timing = _timing()
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


# ------------------------------------------------------------------------------------------------ explain
@dataclasses.dataclass
class Explanation:
    """Why a capture (or a kit call) failed: ``cause``, ``fix`` and the ``original`` error text."""
    cause: str
    fix: str
    original: str

    def __str__(self):
        return f"cause: {self.cause}\nfix: {self.fix}\noriginal error: {self.original}"

    __repr__ = __str__


def explain(exc: BaseException) -> Explanation:
    """Cause, fix and original error for an exception from a capture or a kit call.

    The same explanation ``capture``, ``capture_train_step`` and ``graph_modules`` put into their
    ``CaptureError``; for the kit's other errors the message's own "Fix:" part.

    Example::

        try:
            g = capture(fn, x)
        except Exception as e:
            print(explain(e))
    """
    if CaptureError is not None and isinstance(exc, CaptureError) and getattr(exc, "cause", ""):
        return Explanation(exc.cause, exc.fix, exc.original)
    text = f"{type(exc).__name__}: {exc}"
    if diagnose_capture_failure is not None:
        cause, fix, original = diagnose_capture_failure(exc)
        if cause != _GENERIC_CAUSE or "Fix:" not in str(exc):
            return Explanation(cause, fix, original)
    if "Fix:" in str(exc):
        before, _, after = str(exc).partition("Fix:")
        return Explanation(before.strip().rstrip("."), after.strip().split("\n")[0].rstrip("."), text)
    return Explanation("a CUDA graph could not be captured or replayed",
                       "run the function eagerly under cudagraph_kit.diagnose.check_capturable(fn, *args) to find "
                       "the line", text)
