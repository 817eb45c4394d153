"""Which Python values a function can reach, and the line of your code that changed one.

A CUDA graph replays the values it read at capture; this is the watch that :func:`check.check_capturable` and
:func:`verification.verify` share to find the values that change.

- :func:`watch_for` lists getters for everything a function reaches: closure cells, globals it names, default
  arguments, attributes of the objects it holds (and of their classes), items of its containers, optimizer
  hyper-parameters, and the same through every helper function or method of yours that it can call.
- :class:`ChangeTracer` (a ``sys.settrace`` tracer) names the line after which a watched value changed.
- :class:`TensorState` saves the tensor state a function reaches and puts it back in place.

Example::

    import torch
    from cudagraph_kit.state_watch import watch_for

    step = {"n": 0}
    def fn(x):
        step["n"] += 1
        return x * step["n"]

    watch = watch_for(fn)
    before = watch.snapshot(); fn(torch.ones(2)); after = watch.snapshot()
    print({k: (before[k], after[k]) for k in after if after[k] != before[k]})   # {"step['n']": (0, 1)}

It needs only ``torch``; ``check.py`` and ``verification.py`` import it.
"""
from __future__ import annotations

import collections
import copy
import functools
import linecache
import math
import os
import sys
import sysconfig
import types

import torch

__all__ = ["watch_for", "StateWatch", "ChangeTracer", "TensorState", "PYTHON_STATE_FIX", "KIT_FILES"]

PYTHON_STATE_FIX = ("a graph replays the value it read at capture: keep values that change in GPU tensors "
                    "updated in place (a tensor lr with capturable=True, a step counter as a tensor), or "
                    "capture again when they change")

# the kit's own files (check.py and verification.py add theirs when they load): their frames are never "your code"
KIT_FILES = {os.path.abspath(__file__)}


# ------------------------------------------------------------------------------------ where in user code
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # <stdin>, <string>: the user's code
        return True
    f = os.path.abspath(filename)
    if f.startswith(TORCH_DIR) or f in KIT_FILES:
        return False
    if f.startswith(_STDLIB) and "site-packages" not in f and "dist-packages" not in f:
        return False
    return True


def user_frame(frame):
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def describe_frame(frame) -> tuple:
    """("file:line (function)", source line) of a frame."""
    if frame is None:
        return "?", ""
    code = frame.f_code
    return location(code.co_filename, frame.f_lineno, code.co_name)


def location(filename: str, lineno: int, func: str = "") -> tuple:
    name, sep = filename, ":"
    if "ipykernel_" in filename or filename.startswith("<ipython-input"):
        name, sep = "cell", ", line "  # a notebook cell: "cell, line 2" (the line number is the cell's)
    elif not filename.startswith("<"):
        try:
            rel = os.path.relpath(filename)
            name = rel if not rel.startswith("..") else os.path.basename(filename)
        except ValueError:
            name = os.path.basename(filename)
    where = f"{name}{sep}{lineno}" + (f" ({func})" if func and func != "<module>" else "")
    return where, linecache.getline(filename, lineno).strip()


def definition_of(fn) -> tuple:
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
    return location(code.co_filename, code.co_firstlineno, code.co_name)


def name_of(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({name_of(fn.func)})"
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


# ---------------------------------------------------------------------------------- Python state watching
_SCALARS = (int, float, bool, str, complex, type(None))


def is_scalar(v) -> bool:
    if isinstance(v, _SCALARS):
        return True
    return isinstance(v, tuple) and len(v) <= 8 and all(isinstance(x, _SCALARS) for x in v)


def same(a, b) -> bool:
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
    return is_user_file(filename) and "site-packages" not in filename and "dist-packages" not in filename


_SCHEDULER = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler


def _library_object(obj) -> bool:
    if isinstance(obj, _SCHEDULER):
        return False
    return _library_class(type(obj))


class StateWatch:
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
        if is_scalar(value):
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
                or is_scalar(obj):
            return
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            self.add_callable(label, obj, depth + 1)  # a helper it can call: what that reaches counts too
            return
        self.seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            self.optimizers[id(obj)] = obj
            for i, group in enumerate(obj.param_groups):
                for k, v in group.items():
                    if k != "params" and is_scalar(v):
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
                shown = repr(k) if is_scalar(k) else f"<{type(k).__name__}>"  # no tensor repr (a GPU read)
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
            self.add_object(label or name_of(fn), fn, depth)
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
            if is_scalar(value):
                self._add(f"closure variable '{name}'", lambda c=cell: c.cell_contents)
            else:
                self._member(name, value, lambda c=cell: c.cell_contents, depth)
        for i, value in enumerate(fn.__defaults__ or ()):
            if not is_scalar(value):
                self._member(f"{code.co_name}.__defaults__[{i}]", value, lambda f=fn, i=i: f.__defaults__[i], depth)
        g = fn.__globals__
        names = _global_names(code)
        for name in names:
            if name not in g:
                continue
            value = g[name]
            if is_scalar(value):
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


class ChangeTracer:
    """sys.settrace tracer that attributes each change of a watched value to the line of user code that ran
    just before it was seen changed."""

    def __init__(self, watch: StateWatch):
        self.watch = watch
        self.last = watch.snapshot()
        self.prev_line = {}
        self.where = {}  # label -> (where, code)

    def _check(self, frame):
        if not self.watch.getters:
            return
        now = self.watch.snapshot()
        for k, v in now.items():
            if k not in self.where and not same(v, self.last.get(k)):
                line = self.prev_line.get(id(frame), frame.f_lineno)
                self.where[k] = location(frame.f_code.co_filename, line, frame.f_code.co_name)
        self.last = now

    def global_trace(self, frame, event, arg):
        if event != "call" or not is_user_file(frame.f_code.co_filename):
            return None
        return self.local_trace

    def local_trace(self, frame, event, arg):
        if event in ("line", "return"):
            self._check(frame)
            self.prev_line[id(frame)] = frame.f_lineno
            if event == "return":
                self.prev_line.pop(id(frame), None)
        return self.local_trace


def watch_for(fn, args=()) -> StateWatch:
    """A :class:`StateWatch` of everything ``fn`` (a function, method, partial, module or callable object) and
    its non-tensor arguments can reach."""
    watch = StateWatch()
    watch.add_callable("", fn)
    if not isinstance(fn, (types.FunctionType, types.MethodType, functools.partial)):
        watch.add_object(name_of(fn), fn)
        forward = getattr(type(fn), "forward", None) or getattr(type(fn), "__call__", None)
        if isinstance(forward, types.FunctionType):
            watch.add_callable(f"{name_of(fn)}.forward", forward)
    for i, a in enumerate(args):
        if isinstance(a, (torch.nn.Module, torch.optim.Optimizer)):
            watch.add_object(f"args[{i}]", a)
    return watch


class TensorState:
    """The tensor state a function can reach (module parameters, gradients and buffers, optimizer state, tensors
    it holds), saved now and put back in place by :meth:`restore` (the same tensors are written, so a graph that
    reads them keeps working)."""

    def __init__(self, watch: StateWatch, extra=()):
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
