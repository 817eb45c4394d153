"""Before capture, find what would break or silently corrupt a CUDA graph, with the line of your code.

:func:`check_capturable` runs a function eagerly under inspection (PyTorch's sync debug mode, a
``TorchDispatchMode`` that sees every operator, the optimizer step hook) and lists what a graph cannot record,
each with the line of *your* code that does it: host synchronizations, CPU tensors and pageable host copies,
data-dependent shapes, side streams not joined back, Python values that change between calls, random numbers
outside the default CUDA generator, optimizers with ``capturable=False``, autocast with its weight-cast cache on.

What it instruments, only while the checked calls run (all of it put back when they return or raise): a
``TorchDispatchMode``; ``torch.cuda.set_sync_debug_mode("warn")`` with a ``warnings.catch_warnings`` block whose
``warnings.showwarning`` records the sync warnings; an optimizer step pre-hook; and wrappers set on
``torch.manual_seed``, ``torch.seed``, ``torch.cuda.manual_seed``, ``torch.cuda.manual_seed_all``,
``torch.cuda.set_rng_state``, ``torch.Tensor.__repr__``, ``torch.cuda.synchronize``, ``torch.cuda.Event.record`` and
``.wait``, and ``torch.autocast.__enter__``. These are process-wide: another thread calling them meanwhile is
seen (and reported) too. During each call it also replaces ``sys.settrace`` with its own tracer, so a debugger's
breakpoints and coverage measurement inside the checked calls are lost (they resume afterwards). It is a
diagnostic that runs the function a few times slowly: run it once, never inside a serving or training loop.

Example::

    import torch
    from cudagraph_kit.check import check_capturable

    def step(x):
        y = x * 2
        if y.sum().item() > 0:      # a host sync: cannot be captured
            y = y + 1
        return y

    print(check_capturable(step, torch.randn(8, device="cuda")))

It needs ``torch`` and the kit's ``state_watch.py`` beside it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import sys
import threading
import warnings
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves


if __package__:
    from . import state_watch as sw  # the Python-state watch, shared with verification.py
else:  # this file copied beside state_watch.py, outside the package: that state_watch.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("state_watch")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's state_watch.py from its own folder {_here}, "
                          f"but `import state_watch` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/state_watch.py beside it, that folder first on sys.path.")
    import state_watch as sw  # type: ignore[import-not-found, no-redef]
sw.KIT_FILES.add(os.path.abspath(__file__))

__all__ = ["check_capturable", "CheckReport", "Finding", "FIXES"]

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
    "Python state": sw.PYTHON_STATE_FIX,
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


# ------------------------------------------------------------------------------------------ the recorder
_DATA_DEPENDENT = {"nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique", "_unique", "_unique2",
                   "unique_dim", "unique_consecutive", "unique_dim_consecutive", "bincount"}
_SCALAR_READS = {"_local_scalar_dense": ".item() / float() / int() / bool() reads a tensor's value on the CPU",
                 "is_nonzero": "`if tensor:` reads a tensor's value on the CPU",
                 "equal": "torch.equal returns a Python bool: it reads values on the CPU"}
_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "to"}


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
        return sw.describe_frame(sw.user_frame(frame))

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
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
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
        prefixes = tuple(os.path.join(sw.TORCH_DIR, p) + os.sep for p in packages)
        f = sys._getframe(2)
        while f is not None and not sw.is_user_file(f.f_code.co_filename):
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
            with warnings.catch_warnings():
                # PyTorch's notice (once per process) that the mode "is a prototype feature and does not yet detect all
                # synchronizing operations": the recorder also watches the usual ones itself (scalar reads, printing,
                # synchronize calls, blocking copies), so the notice tells a caller of check_capturable nothing.
                # Only this message is silenced, only around this call.
                warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
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
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in tree_leaves(out)]


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
    autocast, RNG seeding); the report says so. While it runs it instruments PyTorch process-wide and takes over
    ``sys.settrace`` (the module docstring lists what, all of it put back afterwards).

    Example::

        report = check_capturable(train_step, x, y)
        print(report)            # a short table: kind, where (file:line), what, fix
        assert report.ok, report
    """
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}.")
    cuda_tensors = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor) and a.is_cuda]
    recorder = _Recorder(threading.get_ident(), {t.device.index for t in cuda_tensors if t.device.index is not None})
    entry_where = sw.describe_frame(sw.user_frame(sys._getframe(1)))
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) and sw.is_scalar(a):
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

    watch = sw.watch_for(fn, args)
    perturbed = _perturbed(args) if calls >= 2 else None

    history = {}          # label -> list of values seen
    recurring = set()     # labels whose value changed during a call after the first
    shapes = []
    tracer = sw.ChangeTracer(watch)
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
                if not sw.same(history[k][-1], v):
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
            loc = tracer.where.get(label, sw.definition_of(fn))
            changed.setdefault(loc, []).append(f"{label} ({shown})")
    for loc, items in changed.items():
        listed = "; ".join(items[:3]) + (f"; and {len(items) - 3} more" if len(items) > 3 else "")
        recorder.add("Python state", f"changed during the calls: {listed}. A replay keeps the values read at "
                     "capture and repeats no Python side effect", where=loc)
    if len(shapes) >= 2 and any(s != shapes[0] for s in shapes[1:]):
        dd = [recorder.events[k] for k in recorder.order if k[0] == "data-dependent shape"]
        loc = (dd[0].where, dd[0].code) if dd else sw.definition_of(fn)
        recorder.add("data-dependent shape", f"the output shapes change with the input values "
                     f"({shapes[0]} vs {shapes[1]}): a graph replays the shapes it captured", where=loc)
    elif calls >= 2 and perturbed is not None and not any(isinstance(a, torch.Tensor) for a in args):
        notes.append("no tensor arguments: output shapes could not be compared across input values")
    return CheckReport(sw.name_of(fn), recorder.findings(), notes, len(shapes), device)


def _autocast_on(device: str) -> bool:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    try:
        return torch.is_autocast_enabled(kind)
    except TypeError:  # older PyTorch
        return torch.is_autocast_enabled() if kind == "cuda" else torch.is_autocast_cpu_enabled()
