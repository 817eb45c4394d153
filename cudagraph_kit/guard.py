"""What must not change between a CUDA graph's capture and its replays: the tensors the graph really read, and the
train/eval mode of the modules that hold them.

A CUDA graph replays fixed addresses. Replace a weight the graph read (``model.weight = nn.Parameter(...)``, a new
submodule, a rebound global), or re-type it (``model.half()``, ``model.to(...)``, ``w.data = w.data.t()``), and every
replay silently keeps reading the old memory: old weights, or memory that was released. Switch ``model.eval()`` after
a capture in training mode and every replay still runs training-mode dropout. A :class:`Guard` refuses such a replay
with :class:`StaleGraphError` instead.

How it knows what to watch, without guessing from source code:

1. **What the function reads**: the last warm-up call runs under a ``TorchFunctionMode`` (:func:`watch_reads`) that
   sees every tensor reaching a PyTorch function (no extra call: the function runs as often as the warm-up says).
   The tensors that existed before the call (the call's own arguments aside) are what the graph reads from outside:
   parameters, buffers, constants, caches, optimizer state. A ``torch.compile`` function runs its original Python code
   for that call (``torch.compiler.set_stance("force_eager")``, PyTorch 2.6+), which reads the same tensors.
2. **Where each is held**, by object identity: a search from the captured callable (a module, a bound method's object,
   a ``functools.partial``'s arguments, closure cells, default arguments, ``__wrapped__``, the globals its code loads,
   object attributes, lists, tuples and dicts, several levels deep) records each holder on a shortest path to a read
   tensor as "this container, this key, this object" (:func:`locate`). Two roots of one class, two closures of one
   factory, a dict keyed by tensors: each holder is its own object, so nothing collides. A label
   (``Runner.model.0.weight``) is built only for a message. Holders on no such path are never recorded. Whether code
   is PyTorch's own (not searched) is decided by the file its code lives in, not by ``__module__``.
3. **The check** (:meth:`Guard.check`, before every call or replay), split by what PyTorch reports by itself:

   - *every call*: the holders no event reports that lead to a read tensor through other objects (object
     attributes, globals, closure cells, default arguments, list items, plain dicts, ``optimizer.state`` and
     ``param_groups`` themselves), re-read by identity; the train/eval flag of the outermost modules on the paths;
     whether a hook reported one of this guard's module entries; whether a read tensor, or its storage, was freed.
     On a model held by modules alone that is a few comparisons, whatever its size.
   - *when an event fires*: PyTorch's global registration hooks (``register_module_parameter_registration_hook`` and
     its two siblings; installed with the first guard, removed with the last) report every parameter, buffer and
     submodule set through ``setattr`` anywhere in the process. Each report is ``(module, name)``; the guard looks
     only at the reports since its last check, so an unrelated module built elsewhere costs a set lookup per report.
     A report on one of its own module entries (``model.fc = ...``, ``model[0] = ...``) starts a full check on that
     call, and so does a freed read tensor or storage: ``.half()``, ``.to()`` or ``.data = ...`` free the old memory
     where nothing else holds it, and a tensor that only plain holders hold (a cache object's buffers, a global) is
     held weakly by the guard, so replacing it there frees it.
   - *a full check*: every recorded holder re-read by identity (no new search), the address, strides, shape and
     dtype of every read tensor, the mode of every module on the paths. It runs every ``FULL_CHECK_EVERY`` calls
     (256; ``guard.full_check_every`` per guard; inside a :func:`weights_fixed` block, at its end when one fell due)
     and with ``check(full=True)``. A holder replaced by one that leads to the same read tensors
     (``optimizer.load_state_dict`` of the same state) is no change: the guard then records the new holders.

What no event reports is therefore seen by the next full check, at most ``FULL_CHECK_EVERY - 1`` replays later
(tested in ``tests/test_guard.py``): a new layout at the same address (``w.data = w.data.t()`` or ``w.data[:k]`` on
the same storage), ``.half()`` or ``.to()`` while something else keeps the old storage alive, a tensor replaced in a
plain holder while something else keeps the old one alive, a direct ``module._parameters[...] = ...`` or ``del
module.weight`` (no hook runs), what an optimizer's state dicts hold, and the mode of an inner module switched alone
(``model.encoder.eval()``). A full check costs host time in proportion to the tensors and holders (the README's
cost line and ``docs/RESULTS.md`` give the measured figures); set ``guard.full_check_every = 1`` where a full check
on every call is worth it.

What a guard cannot see: a tensor whose holder the search cannot reach (a C++ object, ``__slots__``, a container
of more than ``MAX_ITEMS`` items, more than ``MAX_DEPTH`` steps away): its address is still checked every call and
its layout by the full check, its replacement there is not.

Example::

    import torch
    from cudagraph_kit.guard import Guard, watch_reads

    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    with watch_reads(skip=(x,)) as reads:
        model(x)                                  # the last warm-up call, watched
    guard = Guard(model, reads.tensors)           # model.weight and model.bias, held in model._parameters
    guard.check()                                 # before each replay: passes
    model.half()
    guard.check()   # StaleGraphError: Linear.weight has new storage: float32 ... at capture, now float16 ...

This file needs only ``torch``; ``graphed.py`` imports it, so copy both.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import itertools
import operator
import os
import sys
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["StaleGraphError", "stale", "Guard", "watch_reads", "ReadWatch", "locate", "Record", "weights_fixed",
           "STALE_FIX", "MAX_DEPTH", "MAX_ITEMS", "FULL_CHECK_EVERY"]

MAX_DEPTH = 12     # steps from the callable that the holder search follows
MAX_ITEMS = 10_000  # containers with more items than this are not searched


class StaleGraphError(RuntimeError):
    """Raised before a replay when something the graph read at capture was replaced, re-typed or changed since:
    nothing was copied or replayed. ``cause`` and ``fix`` hold the two parts of the message."""

    cause: str = ""
    fix: str = ""


STALE_FIX = ("capture again after changing the model; to change weights without capturing again, copy the new values "
             "into the tensors the graph reads, in place: model.load_state_dict(state_dict) or, under "
             "torch.no_grad(), param.copy_(new_value)")


def stale(cause: str, fix: str = STALE_FIX) -> StaleGraphError:
    """The kit's one error for "this graph would replay on something that changed": ``stale("w was replaced")``."""
    err = StaleGraphError(f"{cause}. Fix: {fix}.")
    err.cause, err.fix = cause, fix
    return err


# -- 1. what a call reads ----------------------------------------------------------------------------------------
_METADATA = {"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "is_leaf", "grad_fn",
             "names", "size", "dim", "stride", "numel", "ndimension", "element_size", "is_contiguous",
             "data_ptr", "get_device", "is_floating_point", "is_complex", "storage_offset", "nelement"}


def _metadata_only(func) -> bool:
    """A function that reads a tensor's metadata, not its memory (``t.shape``, ``t.dim()``)."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", "")
    return name in _METADATA


class ReadWatch(TorchFunctionMode):
    """The tensors that reach PyTorch functions inside the block and existed before it (see :func:`watch_reads`)."""

    def __init__(self, skip=()):
        super().__init__()
        self.skip = {id(t) for t in skip}
        self._read: dict = {}   # id -> tensor, in first-read order
        self._made: dict = {}   # id -> weakref of a tensor some function returned inside the block

    @property
    def tensors(self) -> list:
        """The tensors read, in the order first read."""
        return list(self._read.values())

    def _forget(self, key, _ref):
        self._made.pop(key, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _metadata_only(func):
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    key = id(t)
                    if key not in self._made and key not in self._read and key not in self.skip:
                        self._read[key] = t
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = id(t)
                if key not in self._read and key not in self._made:
                    self._made[key] = weakref.ref(t, functools.partial(self._forget, key))
        return out


@contextlib.contextmanager
def watch_reads(skip=(), force_eager: bool = True):
    """Watch which existing tensors the code in the block reads; ``skip``: tensors to leave out (the call's inputs).

    With ``force_eager`` (the default) the block runs eagerly: compiled functions run their Python code (PyTorch
    2.6+), so what it reads is what the compiled code reads, and no compiled code is rebuilt for the watch.
    Metadata reads (``t.shape``) do not count. The watch records; it changes nothing.

    Example::

        with watch_reads(skip=(x,)) as reads:
            model(x)
        reads.tensors      # [model.weight, model.bias]
    """
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    eager = stance("force_eager") if stance is not None and force_eager else contextlib.nullcontext()
    watch = ReadWatch(skip)
    with eager, watch:
        yield watch


# -- 2. where each read tensor is held -----------------------------------------------------------------------------
# A holder is recorded as an entry ``(kind, container, key, expected, path)``: "container[key] is expected", read by
# kind: "dict" (dict.get; a module's _parameters, _buffers, _modules and __dict__, an object's __dict__, a function's
# globals, a plain dict, a tensor-keyed dict such as optimizer.state), "item" (a list index), "cell" (a closure cell's
# contents), "attr" (getattr: a function's defaults, ``__wrapped__``; the train step's ``param.grad``). ``path`` is how
# the entry was reached from the roots: ``(root index, step, step, ...)``, each step ``(how, key)``; it names the entry
# in a message and is followed again from the roots when a holder changed. Identity decides everything; a path is
# never compared as text.
_TORCH_KINDS = (torch.nn.Module, torch.optim.Optimizer)
_LEAF_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size,
               types.ModuleType, type, torch.Generator)
_MODULE_OWN = frozenset(vars(torch.nn.Module()))  # a module's own bookkeeping attributes
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def _grad_scaler_types() -> tuple:
    found = []
    for where in ("torch.amp", "torch.cuda.amp"):
        try:
            found.append(__import__(where, fromlist=["GradScaler"]).GradScaler)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


_SEARCHED_TORCH = _TORCH_KINDS + _grad_scaler_types()


@functools.lru_cache(maxsize=4096)
def _torch_file(filename: str) -> bool:
    return os.path.realpath(filename).startswith(_TORCH_DIR)


def _torch_own_function(fn) -> bool:
    """PyTorch's own code, decided by where the code lives (a wrapper may copy ``__module__`` from torch's class)."""
    code = getattr(fn, "__code__", None)
    return code is not None and _torch_file(code.co_filename)


def _torch_own_class(cls) -> bool:
    module = sys.modules.get(cls.__module__ or "")
    where = getattr(module, "__file__", None)
    return where is not None and _torch_file(where) if module is not None else \
        (cls.__module__ or "").startswith("torch.")


def _loaded_globals(code) -> set:
    """The global names a code object (and the code nested in it) loads; attribute names are not globals."""
    names, codes = set(), [code]
    while codes:
        c = codes.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.add(ins.argval)
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _searchable(obj) -> bool:
    if isinstance(obj, _LEAF_TYPES) or isinstance(obj, (torch.Tensor, Guard, weakref.ref)):
        return False
    if isinstance(obj, (dict, list, tuple, functools.partial, types.MethodType, types.FunctionType)):
        return True
    if isinstance(obj, _SEARCHED_TORCH):
        return True
    return isinstance(getattr(obj, "__dict__", None), dict) and type(obj).__module__ != "builtins" \
        and not _torch_own_class(type(obj))


def _edges(obj):
    """``(kind, container, key, child, step, event)`` for what ``obj`` holds: tensors, and what :func:`_searchable`
    lets the search enter. kind None: fixed (a tuple item, a bound method's object). ``event``: PyTorch's module
    registration hooks fire when this entry is set through ``setattr``."""
    if isinstance(obj, torch.nn.Module):
        for how in _MODULE_DICTS:
            owner = obj.__dict__[how]
            for key, child in owner.items():
                if child is not None:
                    yield "dict", owner, key, child, (how, key), True
        own = obj.__dict__
        for key, child in own.items():
            if key not in _MODULE_OWN and (isinstance(child, torch.Tensor) or _searchable(child)):
                yield "dict", own, key, child, ("attr", key), False
    elif isinstance(obj, dict):
        if len(obj) > MAX_ITEMS:
            return
        for key, child in obj.items():
            if isinstance(child, torch.Tensor) or _searchable(child):
                yield "dict", obj, key, child, ("key", key), False
    elif isinstance(obj, (list, tuple)):
        if len(obj) > MAX_ITEMS:
            return
        kind = "item" if isinstance(obj, list) else None
        for i, child in enumerate(obj):
            if isinstance(child, torch.Tensor) or _searchable(child):
                yield kind, obj, i, child, ("item", i), False
    elif isinstance(obj, functools.partial):
        yield None, obj, "func", obj.func, ("partial", "func"), False
        yield None, obj, "args", obj.args, ("partial", "args"), False
        yield None, obj, "keywords", obj.keywords, ("partial", "keywords"), False
    elif isinstance(obj, types.MethodType):
        yield None, obj, "__self__", obj.__self__, ("method", "__self__"), False
        yield None, obj, "__func__", obj.__func__, ("method", "__func__"), False
    elif isinstance(obj, types.FunctionType):
        wrapped = obj.__dict__.get("__wrapped__")  # functools.wraps keeps it there: decorators, torch.compile(fn)
        if wrapped is not None:
            yield "dict", obj.__dict__, "__wrapped__", wrapped, ("fn", "__wrapped__"), False
        if _torch_own_function(obj):
            return  # PyTorch's own functions hold nothing of the caller's but what they wrap
        for var, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                child = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield "cell", cell, var, child, ("cell", var), False
        if obj.__defaults__:
            yield "attr", obj, "__defaults__", obj.__defaults__, ("fn", "__defaults__"), False
        if obj.__kwdefaults__:
            yield "attr", obj, "__kwdefaults__", obj.__kwdefaults__, ("fn", "__kwdefaults__"), False
        scope = obj.__globals__
        for var in sorted(_loaded_globals(obj.__code__)):
            if var in scope:
                yield "dict", scope, var, scope[var], ("global", var), False
    elif isinstance(getattr(obj, "__dict__", None), dict):  # a class's is a read-only mappingproxy: not followed
        own = obj.__dict__
        for key, child in own.items():
            if isinstance(child, torch.Tensor) or _searchable(child):
                yield "dict", own, key, child, ("attr", key), False
        call = getattr(type(obj), "__call__", None)
        if isinstance(call, types.FunctionType):
            yield None, type(obj), "__call__", call, ("call", "__call__"), False


def _children(obj):
    for edge in _edges(obj):
        if isinstance(edge[3], torch.Tensor) or _searchable(edge[3]):
            yield edge


def _read(kind, container, key):
    """What ``container[key]`` holds now, read as the entry's kind says (None when it is gone)."""
    if kind == "dict":
        return container.get(key)
    if kind == "item":
        return container[key] if key < len(container) else None
    if kind == "cell":
        try:
            return container.cell_contents
        except ValueError:
            return None
    return getattr(container, key, None)   # "attr"


def _step(obj, step):
    """Follow one step of a path from ``obj`` as it is now (None when the step leads nowhere)."""
    how, key = step
    if how in _MODULE_DICTS:
        return obj.__dict__.get(how, {}).get(key) if isinstance(obj, torch.nn.Module) else None
    if how == "attr":
        own = getattr(obj, "__dict__", None)
        return own.get(key) if isinstance(own, dict) else None
    if how == "key":
        return obj.get(key) if isinstance(obj, dict) else None
    if how == "item":
        return obj[key] if isinstance(obj, (list, tuple)) and key < len(obj) else None
    if how == "cell":
        code, cells = getattr(obj, "__code__", None), getattr(obj, "__closure__", None) or ()
        if code is None or key not in code.co_freevars:
            return None
        try:
            return cells[code.co_freevars.index(key)].cell_contents
        except ValueError:
            return None
    if how == "global":
        return getattr(obj, "__globals__", {}).get(key)
    if how == "call":
        return getattr(type(obj), "__call__", None)
    return getattr(obj, key, None)   # "partial", "method", "fn"


def _root_labels(roots) -> list:
    """``[(label, root)]``: a dict's keys, else each root's type or function name, numbered where two collide."""
    if isinstance(roots, dict):
        return [(str(label), obj) for label, obj in roots.items()]
    roots = list(roots) if isinstance(roots, (tuple, list)) else [roots]
    names = [type(r).__name__ if isinstance(r, torch.nn.Module) else
             getattr(r, "__qualname__", None) or getattr(r, "__name__", None) or type(r).__name__ for r in roots]
    return [(f"{n} #{i + 1}" if names.count(n) > 1 else n, r) for i, (n, r) in enumerate(zip(names, roots))]


def _label(path, objects: dict, roots: list, names: dict) -> str:
    """A readable name for a path (messages only): ``Runner.model.0.weight``, ``optimizer.state[model.0.weight]``."""
    label = roots[path[0]][0]
    for i, (how, key) in enumerate(path[1:], start=1):
        parent = objects.get(path[:i])
        if how in _MODULE_DICTS or how == "attr":
            label += f".{key}"
        elif how == "key":
            label += f"[{names.get(id(key), 'a tensor')}]" if isinstance(key, torch.Tensor) else f"[{key!r}]"
        elif how == "item":
            label += f"[{key}]"
        elif how == "method" and key == "__self__":
            label = type(objects.get(path[:i + 1])).__name__
        elif how in ("cell", "global"):
            label = key
        elif how == "fn" and key in ("__defaults__", "__kwdefaults__"):
            label = f"{getattr(parent, '__name__', 'the function')}'s {'default' if key == '__defaults__' else 'keyword default'} arguments"
        elif how == "partial" and key != "func":
            label += f" {key}"
    return label


class Record:
    """Where a callable's read tensors are held, found by a breadth-first search from its roots (see :func:`locate`).

    ``entries``: the holders on a shortest path to a read tensor, ``(kind, container, key, expected, path, event,
    cold, weak)`` (``expected`` a weak reference where ``weak``: a tensor only plain holders hold); ``path_of``: one
    path per placed tensor (by id); ``objects``: what each recorded path led to, tensors aside; ``modules``: the
    modules on those paths (their train/eval mode is part of what a graph captured); ``watched``: ``(id(module),
    name)`` of every entry PyTorch's registration hooks report; ``weak``: the ids of the weakly held tensors."""

    def __init__(self, roots, targets):
        self.roots = _root_labels(roots)
        self.names = {}
        for label, obj in self.roots:
            if isinstance(obj, torch.nn.Module):
                for name, t in list(obj.named_parameters()) + list(obj.named_buffers()):
                    self.names.setdefault(id(t), f"{label}.{name}")
        wanted = {id(t) for t in targets}
        path_of, seen, depth_of, in_edges = {}, {}, {}, {}
        frontier = []
        for i, (_, root) in enumerate(self.roots):
            if root is not None and id(root) not in seen:
                seen[id(root)], path_of[id(root)], depth_of[id(root)] = root, (i,), 0
                frontier.append(root)
        cold: set = set()   # what an optimizer's state and param groups hold (see Guard: checked on the schedule)
        depth = 0
        while frontier and depth < MAX_DEPTH:
            nxt = []
            for obj in frontier:
                for kind, container, key, child, step, event in _children(obj):
                    if id(child) not in seen:
                        seen[id(child)], depth_of[id(child)] = child, depth + 1
                        path_of[id(child)] = path_of[id(obj)] + (step,)
                        if id(obj) in cold or (isinstance(obj, torch.optim.Optimizer) and key in ("state",
                                                                                              "param_groups")):
                            cold.add(id(child))
                        if not isinstance(child, torch.Tensor):
                            nxt.append(child)
                    if depth_of[id(child)] == depth + 1:
                        in_edges.setdefault(id(child), []).append((id(obj), kind, container, key, child, step, event))
            frontier, depth = nxt, depth + 1
        useful, stack = set(), [i for i in wanted if i in seen]
        while stack:   # the read tensors found, and what lies on a shortest path to one
            node = stack.pop()
            if node not in useful:
                useful.add(node)
                stack.extend(parent for parent, *_ in in_edges.get(node, ()))
        self.entries, self.objects, self.watched, done = [], {}, set(), set()
        for child_id in useful:
            for parent, kind, container, key, child, step, event in in_edges.get(child_id, ()):
                if parent not in useful or (kind, id(container), key) in done:
                    continue
                done.add((kind, id(container), key))
                path = path_of[parent] + (step,)
                if not isinstance(child, torch.Tensor):
                    self.objects[path] = child
                self.objects[path_of[parent]] = seen[parent]
                if kind is not None:
                    self.entries.append([kind, container, key, child, path, event, parent in cold, False])
                    if event:
                        self.watched.add((parent, key))
        # a read tensor that only plain holders hold (object attributes, lists, dicts, cells, globals) is held weakly:
        # replaced there and dropped, it is freed, and its release starts a full check (see Guard)
        in_module = {id(e[3]) for e in self.entries if e[5] and isinstance(e[3], torch.Tensor)}
        for e in self.entries:
            if isinstance(e[3], torch.Tensor) and id(e[3]) not in in_module:
                e[3], e[7] = weakref.ref(e[3]), True
        self.entries = [tuple(e) for e in self.entries]
        self.weak = {id(e[3]()) for e in self.entries if e[7]}
        self.path_of = {i: path_of[i] for i in wanted if i in path_of}
        # the read tensors each holder on the paths leads to (by id): a holder replaced by one that leads to other
        # tensors is a change, even where another path still reaches the old ones
        self.below: dict = {}
        for target in self.path_of:
            stack, met = [target], set()
            while stack:
                node = stack.pop()
                if node not in met:
                    met.add(node)
                    self.below.setdefault(node, set()).add(target)
                    stack.extend(parent for parent, *_ in in_edges.get(node, ()) if parent in useful)
        self.modules = [seen[i] for i in useful if isinstance(seen[i], torch.nn.Module)]
        self.top_modules = [m for m in self.modules if not any(isinstance(seen[p], torch.nn.Module)
                                                               for p, *_ in in_edges.get(id(m), ()))]

    def label(self, path) -> str:
        return _label(path, self.objects, self.roots, self.names)

    def label_of(self, t) -> str | None:
        path = self.path_of.get(id(t))
        return None if path is None else self.label(path)

    def follow(self, path):
        """What ``path`` leads to now, from the roots (None where a step leads nowhere)."""
        obj = self.roots[path[0]][1]
        for step in path[1:]:
            if obj is None:
                return None
            obj = _step(obj, step)
        return obj


def locate(roots, targets) -> Record:
    """Where each of ``targets`` (tensors) is held, searched from ``roots`` (an object, a list of them, or
    ``{label: object}``): a :class:`Record` of every holder on a shortest path to a target.

    Example::

        rec = locate([runner.step], [runner.model[0].weight])
        rec.label_of(runner.model[0].weight)     # 'Runner.model.0.weight'
    """
    return Record(roots, targets)


# -- 3. the check --------------------------------------------------------------------------------------------------
# PyTorch's global module registration hooks report every parameter, buffer and submodule set through setattr, in any
# module of the process: each report is logged as (id(module), name), and a guard looks only at the reports since its
# last check, so an unrelated module built elsewhere costs a set lookup per report, never a walk over the model.
_EVENTS = [0]        # reports so far
_LOG: list = []      # the latest reports, (id(module), name); _LOG[0] is report number _LOG_START[0]
_LOG_START = [0]
_LOG_MAX = 4096
_HOOK_HANDLES: list = []
_LIVE_GUARDS = [0]
_data_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride
_shape_dtype = operator.attrgetter("shape", "dtype")
# calls between two full checks (see the module docstring). A full check costs 100-180 µs of host time on 96 tensors
# (an H200's host, figures/00_overhead/checks.csv: about 1.9 µs a tensor): every 256 calls that is under 1 µs a call
FULL_CHECK_EVERY = 256


def _event(module, name, _value):
    """A parameter, buffer or submodule is being set on ``module``: log it (returns None, so the value is kept). Not
    while ``torch.compile`` traces a function that registers modules (``self.layers[:n]`` builds a new ``ModuleList``):
    traced, the log would become a Dynamo guard that fails on every later call, recompiling until the recompile limit
    sends the function back to eager. Code that runs outside tracing is still logged."""
    if _tracing():
        return
    _LOG.append((id(module), name))
    _EVENTS[0] += 1
    if len(_LOG) > _LOG_MAX:
        drop = _LOG_MAX // 2
        del _LOG[:drop]
        _LOG_START[0] += drop


_tracing = getattr(torch.compiler, "is_compiling", None) or (lambda: False)   # torch.compiler.is_compiling: 2.3+


def _registration_hooks() -> list:
    found = []
    for name in ("register_module_parameter_registration_hook", "register_module_buffer_registration_hook",
                 "register_module_module_registration_hook"):
        register = getattr(torch.nn.modules.module, name, None)
        if register is not None:
            found.append(register)
    return found


def _acquire_hooks() -> bool:
    """Install the registration hooks with the first live guard; False where this PyTorch lacks them."""
    registers = _registration_hooks()
    if len(registers) < 3:
        return False
    if _LIVE_GUARDS[0] == 0:
        _HOOK_HANDLES.extend(register(_event) for register in registers)
    _LIVE_GUARDS[0] += 1
    return True


def _release_hooks() -> None:
    _LIVE_GUARDS[0] -= 1
    if _LIVE_GUARDS[0] == 0:
        while _HOOK_HANDLES:
            _HOOK_HANDLES.pop().remove()


def hooks_installed() -> int:
    """How many global hooks the live guards hold (0 once every guard is gone)."""
    return len(_HOOK_HANDLES)


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


class _Holders:
    """Entries ``(kind, container, key, expected, ...)`` read in one C-level pass per kind: ``changed()`` is True when
    one of them holds another object than recorded (or can no longer be read)."""

    def __init__(self, entries):
        by = {kind: [e for e in entries if e[0] == kind] for kind in ("dict", "item", "cell", "attr")}
        self.dict_owners, self.dict_keys = [e[1] for e in by["dict"]], [e[2] for e in by["dict"]]
        self.item_lists, self.item_indices = [e[1] for e in by["item"]], [e[2] for e in by["item"]]
        self.cells = [e[1] for e in by["cell"]]
        self.attr_objects, self.attr_names = [e[1] for e in by["attr"]], [e[2] for e in by["attr"]]
        self.nones = [None] * len(by["attr"])
        self.expected = [id(_expected(e)) for kind in ("dict", "item", "cell", "attr") for e in by[kind]]
        self.only_dicts = len(by["dict"]) == len(self.expected)

    def quick(self, loose: list, loose_ptrs: list):
        """A function that is True when a holder of these entries, or the address of a ``loose`` tensor, changed:
        made once per recording, what it reads bound as locals (the per-call part of :meth:`Guard.check`)."""
        try:
            held = list(self._now())
        except (IndexError, ValueError):
            held = None
        if held is None or list(map(id, held)) != self.expected:
            return lambda: True   # already changed: the next check looks at everything
        if not loose and self.only_dicts and len(held) <= 2:   # one or two holders: the common case
            if not held:
                return lambda: False
            (d1, k1, e1), (d2, k2, e2) = (list(zip(self.dict_owners, self.dict_keys, held)) * 2)[:2]
            return lambda: d1.get(k1) is not e1 or d2.get(k2) is not e2
        if not loose and len(held) <= 4:   # a few holders (a wrapper's closure, a bound method): one test each
            t1, t2, t3, t4 = (self._tests(held) + [_false] * 3)[:4]

            def few():
                try:
                    return t1() or t2() or t3() or t4()
                except (IndexError, ValueError):   # a shorter list, an emptied cell
                    return True
            return few
        now, is_not = self._now, operator.is_not

        def changed():
            try:
                if any(map(is_not, now(), held)):
                    return True
            except (IndexError, ValueError):
                return True
            return bool(loose) and list(map(_data_ptr, loose)) != loose_ptrs
        return changed

    def _tests(self, held: list) -> list:
        """One function per entry, True when it no longer holds its object (in the order of ``expected``)."""
        held = iter(held)
        return ([(lambda d=d, k=k, e=next(held): d.get(k) is not e) for d, k in zip(self.dict_owners, self.dict_keys)]
                + [(lambda c=c, i=i, e=next(held): c[i] is not e) for c, i in zip(self.item_lists, self.item_indices)]
                + [(lambda c=c, e=next(held): c.cell_contents is not e) for c in self.cells]
                + [(lambda o=o, n=n, e=next(held): getattr(o, n, None) is not e)
                   for o, n in zip(self.attr_objects, self.attr_names)])

    def _now(self):
        """What every entry holds now, in the order of ``expected`` (an iterator)."""
        return itertools.chain(map(dict.get, self.dict_owners, self.dict_keys),
                               map(operator.getitem, self.item_lists, self.item_indices),
                               map(_cell_contents, self.cells),
                               map(getattr, self.attr_objects, self.attr_names, self.nones))

    def changed(self) -> bool:
        if self.only_dicts:   # the common case: one map
            return list(map(id, map(dict.get, self.dict_owners, self.dict_keys))) != self.expected
        try:
            now = (list(map(id, map(dict.get, self.dict_owners, self.dict_keys)))
                   + list(map(id, map(operator.getitem, self.item_lists, self.item_indices)))
                   + list(map(id, map(_cell_contents, self.cells)))
                   + list(map(id, map(getattr, self.attr_objects, self.attr_names, self.nones))))
        except (IndexError, ValueError):   # a shorter list, an emptied cell
            return True
        return now != self.expected


_cell_contents = operator.attrgetter("cell_contents")


def _false() -> bool:
    return False


def _expected(entry):
    """What an entry held at the recording (None once a weakly held tensor was freed)."""
    return entry[3]() if len(entry) > 7 and entry[7] else entry[3]


def _layout(t) -> tuple:
    return t.data_ptr(), t.stride(), tuple(t.shape), t.dtype, t.device


class Guard:
    """What a graph read and where each tensor is held, checked before every replay (see the module docstring).

    ``Guard(roots, tensors)``: ``roots`` is the captured callable (or a tuple or dict of what it reaches: model,
    optimizer, loss function); ``tensors`` what it read (:func:`watch_reads`). ``extra`` adds ``(kind, container,
    key, expected, label)`` entries the caller knows of (the train step's ``param.grad``; kind "attr", or "weakattr"
    with a weak reference as ``expected``). ``check_mode``: the train/eval mode of the modules on the paths is part
    of what must not change (``graph_modules`` turns it off: ``make_graphed_callables`` runs such a call eagerly).
    The guard keeps alive the read tensors modules hold; one that only plain holders hold is held weakly (replaced
    and dropped there, it is freed, which starts a full check). ``len(guard)``: how many tensors it watches;
    ``guard.unplaced``: the read tensors the search could not place, described.

    Example::

        guard = Guard(model, reads.tensors)
        guard.check()              # before each replay; raises StaleGraphError naming what changed
    """

    def __init__(self, roots, tensors, extra=(), check_mode: bool = True):
        self.roots = roots
        tensors = [t for t in tensors if isinstance(t, torch.Tensor) and _has_storage(t)]
        self.check_mode = check_mode
        self._extra = list(extra)
        self._layouts = list(map(_layout, tensors))
        self._ptrs, self._strides = list(map(_data_ptr, tensors)), list(map(_stride, tensors))
        self._shapes = list(map(_shape_dtype, tensors))
        self._ids = list(map(id, tensors))
        self.full_check_every = FULL_CHECK_EVERY
        self._held = 0
        self._released: list = []   # filled when a read tensor, or its storage, is freed (.half(), .to(), replaced)
        self._finalizers = []
        self._hooked = _acquire_hooks()
        weakref.finalize(self, _cleanup, self._hooked, self._finalizers)
        record = Record(roots, tensors)
        # the guard keeps alive what modules hold (their hooks report a replacement) and what the search could not
        # place; a tensor only plain holders hold is held weakly, so that replacing it there frees it
        self._refs = [weakref.ref(t) if id(t) in record.weak else t for t in tensors]
        self._any_weak = any(type(r) is weakref.ref for r in self._refs)
        watched = tensors + [e[3]() for e in self._extra if e[0] == "weakattr" and e[3]() is not None]
        for t in watched:
            objects = [t.untyped_storage()] + ([t] if id(t) in record.weak else [])
            for obj in objects:
                try:
                    fin = weakref.finalize(obj, self._released.append, 1)
                except (RuntimeError, TypeError, AttributeError):
                    continue
                fin.atexit = False
                self._finalizers.append(fin)
        self._record(record)

    @property
    def tensors(self) -> list:
        """The read tensors, in the order first read (None for a weakly held one that was freed)."""
        if not self._any_weak:
            return list(self._refs)
        return [r() if type(r) is weakref.ref else r for r in self._refs]

    def _record(self, record: Record) -> None:
        """Keep a record and the flat lists the checks read (one C-level pass per kind of holder)."""
        self.record = record
        self.unplaced = [f"a {_describe(t)} tensor held outside the search" for t in self.tensors
                         if t is not None and id(t) not in record.path_of]
        extra = [("attr", c, key, e, None, False, False) for k, c, key, e, _ in self._extra if k == "attr"]
        # every call: the holders no hook reports (object attributes, globals, closure cells, defaults, lists, plain
        # dicts, optimizer.state itself); a module's parameters, buffers and submodules when a hook reports them;
        # what optimizer.state and param_groups hold on the schedule
        # a module's mode is its __dict__["training"]: read with the dicts (the outermost modules' every call)
        self._modes = [(m, m.training) for m in record.modules] if self.check_mode else []
        top = [("dict", m.__dict__, "training", m.training) for m in record.top_modules] if self.check_mode else []
        every = [("dict", m.__dict__, "training", was) for m, was in self._modes]
        self._hot = _Holders([e for e in record.entries if not e[5] and not e[6] and not e[7]] + extra + top)
        self._all = _Holders(record.entries + extra + every)
        self._watched = record.watched
        # unplaced tensors: their address every call (nothing else can tell of their replacement)
        self._loose = [t for t in self.tensors if t is not None and id(t) not in record.path_of]
        self._loose_ptrs = list(map(_data_ptr, self._loose))
        self._quick = self._hot.quick(self._loose, self._loose_ptrs)
        self._events = _EVENTS[0]
        self._countdown = self.full_check_every

    def __len__(self) -> int:
        return len(self._refs)

    def __bool__(self) -> bool:
        return bool(self._refs or self.record.entries or self._extra)

    def check(self, full: bool = False) -> None:
        """Raise :class:`StaleGraphError` if a read tensor, one of its holders or a module's train/eval mode changed
        since the recording. Per call it looks only at what no event reports; see the module docstring for what is
        checked when. Inside :func:`weights_fixed` it only counts the call. ``full=True`` checks everything now."""
        self._countdown -= 1
        if self._held and not full:
            return   # inside weights_fixed(): its exit checks (and runs the full check when one is due)
        if (full or self._countdown <= 0 or self._released or (_EVENTS[0] != self._events and self._reported())
                or self._quick()):
            found = self.changes()
            if found:
                self._countdown = 0   # a stale graph stays refused: the next call checks in full again
                raise self.error(found)

    def _reported(self) -> bool:
        """Did a hook report one of this guard's module entries since the last check? (Then a full check runs.)"""
        start, seen = _LOG_START[0], self._events
        self._events = _EVENTS[0]
        if seen < start:
            return True   # more reports than the log keeps: look at everything
        watched = self._watched
        return any(report in watched for report in _LOG[seen - start:])

    def changes(self, refresh: bool = True) -> list:
        """What changed since the recording, one sentence each (empty when nothing did): every holder re-read by
        identity, every tensor's address and layout, every module's mode. A holder replaced by one that leads to
        the same tensors along the same paths (``optimizer.load_state_dict`` of the same state) is no change: the
        guard then records the new holders (``refresh``)."""
        rec, found, moved = self.record, [], []
        differ = self._all.changed()   # every holder, and every module's mode (its __dict__["training"])
        if differ:
            moved = [e for e in rec.entries if _read(e[0], e[1], e[2]) is not _expected(e)]
            found += self._replaced(moved)
        for kind, container, key, expected, label in self._extra:
            now = _read("attr", container, key)
            if kind == "weakattr":
                expected = expected()
            if now is not expected or expected is None:
                found.append(f"{label} was {'removed' if now is None else 'replaced by another ' + _describe(now)} "
                             f"(the graph reads and writes the "
                             f"{_describe(expected) if expected is not None else 'tensor'} it held at capture)")
        ts = self.tensors
        freed = [i for i, t in enumerate(ts) if t is None]   # weakly held, freed: replaced or removed there
        for i in freed:
            path, was = rec.path_of.get(self._ids[i]), self._layouts[i]
            found.append(f"{rec.label(path) if path else 'a tensor'} was replaced or removed: the shape {was[2]} "
                         f"{str(was[3]).replace('torch.', '')} tensor the graph reads was freed")
        if freed:
            return found
        same = (list(map(_data_ptr, ts)) == self._ptrs and list(map(_stride, ts)) == self._strides
                and list(map(_shape_dtype, ts)) == self._shapes)
        for t, was in zip(ts, self._layouts if not same else ()):
            now = _layout(t)
            if now != was:
                label = rec.label_of(t) or f"a {_describe(t)} tensor held outside the search"
                what = "new storage" if now[0] != was[0] else "a new layout at the same address"
                found.append(f"{label} has {what}: shape {was[2]} {str(was[3]).replace('torch.', '')} on {was[4]}, "
                             f"strides {was[1]} at capture, now {_describe(t)}, strides {now[1]} (.half(), .to(), "
                             ".float() or .data = ... changed it; the graph reads the old memory as it was laid out "
                             "then)")
        if found:
            return found
        changed_mode = [(m, was) for m, was in self._modes if m.training != was] if differ else []
        if changed_mode:
            m, was = changed_mode[0]
            name = next((rec.label(p) for p, o in rec.objects.items() if o is m), type(m).__name__)
            return [f"mode: {name} is in {'eval' if was else 'training'} mode now, and the graph was captured in "
                    f"{'training' if was else 'eval'} mode (it would replay {'training' if was else 'eval'}-mode "
                    "dropout and batch-norm statistics)"
                    + (f"; {len(changed_mode) - 1} more module(s) changed mode" if len(changed_mode) > 1 else "")]
        new = Record(self.roots, ts) if moved else None
        if moved:
            found = self._led_elsewhere(moved, new)
            if found:
                return found
        self._released.clear()
        if moved and refresh:
            self._record(new)
        else:
            self._events, self._countdown = _EVENTS[0], self.full_check_every
        return []

    def _led_elsewhere(self, moved: list, new: Record) -> list:
        """Sentences for the replaced holders that now lead to other read tensors than at the recording (``new``: a
        record of the objects as they are now). A holder replaced by an equivalent one leads to the same tensors."""
        rec, found = self.record, []
        for e in moved:
            was = _expected(e)
            if isinstance(was, torch.Tensor) or was is None:
                continue   # a replaced or freed read tensor is reported with the layouts
            now = _read(e[0], e[1], e[2])
            led = rec.below.get(id(was), set())
            if new.below.get(id(now), set()) != led:
                what = f"now holds another {type(now).__name__}" if now is not None else "was removed"
                found.append(f"{rec.label(e[4])} {what} (the graph reads the {len(led)} tensor(s) the old one led to)")
        return found

    def _replaced(self, moved: list) -> list:
        """Sentences for the holders that changed, or none when every read tensor is still where each of its
        recorded paths leads (a holder replaced by an equivalent one)."""
        rec, found, reported = self.record, [], set()
        for t in self.tensors:
            if t is None:
                continue   # freed: reported with the layouts
            path = rec.path_of.get(id(t))
            if path is None or rec.follow(path) is t:
                continue
            # the first step along the path whose object is no longer the recorded one
            for i in range(2, len(path) + 1):
                was, now = rec.objects.get(path[:i]), rec.follow(path[:i])
                if now is not was:
                    break
            top = path[:i]
            if i < len(path):
                if top not in reported:
                    reported.add(top)
                    what = f"now holds another {type(now).__name__}" if now is not None else "was removed"
                    found.append(f"{rec.label(top)} {what}: {rec.label(path)} is no longer the tensor the graph "
                                 f"reads ({_describe(t)})")
            elif now is None:
                found.append(f"{rec.label(path)} was removed (the graph reads the {_describe(t)} it held at capture)")
            else:
                found.append(f"{rec.label(path)} was replaced by another "
                             f"{'tensor' if isinstance(now, torch.Tensor) else type(now).__name__} ({_describe(now)}; "
                             f"the graph reads the one it held at capture, {_describe(t)})")
        return found

    def error(self, found: list | None = None) -> StaleGraphError:
        found = found or self.changes(refresh=False) or ["a recorded tensor changed"]
        if found[0].startswith("mode: "):
            return stale(f"{found[0][len('mode: '):]}; nothing was copied or replayed",
                         "call the graph with its modules in the mode they had at capture (model.train() or "
                         "model.eval()), or capture one graph per mode")
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        return stale(f"something the CUDA graph read at capture changed: {shown}. Replaying would silently use the "
                     "old tensors, or memory that was released; nothing was copied or replayed")

    def __repr__(self):
        return f"Guard({len(self)} tensors, {len(self.record.entries)} holders, {len(self.unplaced)} unplaced)"


def _has_storage(t) -> bool:
    try:
        t.data_ptr()
        return True
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage of its own
        return False


def _cleanup(hooked: bool, finalizers: list) -> None:
    for fin in finalizers:
        fin.detach()
    if hooked:
        _release_hooks()


def _guard_of(obj):
    if obj is None or isinstance(obj, Guard):
        return obj
    return getattr(obj, "guard", None)


@contextlib.contextmanager
def weights_fixed(*graphed):
    """A block where you promise that no weight the graphs read changes: each graph's guard checks on entry and on exit
    (as on any call), and the calls between skip the check (for a decode loop: once per ``generate`` or block of
    tokens). The calls inside still count toward the schedule of full checks, which the exit check runs when due.

    ``graphed``: what the kit returned (``GraphedCallable``, ``BucketedGraphs``, ``GraphedTrainStep``) or
    :class:`Guard` objects. A change inside the block that an event reports (a weight replaced, re-typed or moved)
    raises :class:`StaleGraphError` at its end, and the error says that the calls after the change replayed on the
    old tensors; what no event reports shows at the next full check, as outside a block.

    Example::

        with weights_fixed(step):
            for _ in range(32):
                logits = step(tokens)
    """
    guards = [g for g in map(_guard_of, graphed) if g is not None]
    for g in guards:
        g.check()
    for g in guards:
        g._held += 1
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for g in guards:
            g._held -= 1
        if not failed:
            for g in guards:
                try:
                    g.check()
                except StaleGraphError as err:
                    err.cause = ("inside weights_fixed(), " + err.cause.replace("; nothing was copied or replayed", "")
                                 + "; the calls made after that change in the block replayed on the old tensors")
                    err.args = (f"{err.cause}. Fix: {err.fix}.",)
                    raise
