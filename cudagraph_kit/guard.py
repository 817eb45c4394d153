"""What must not change between a CUDA graph's capture and its replays: the tensors the graph really read.

A CUDA graph replays fixed addresses. Replace a weight the graph read (``model.weight = nn.Parameter(...)``, a new
submodule, a rebound global), or re-type it (``model.half()``, ``model.to(...)``, ``w.data = w.data.t()``), and every
replay silently keeps reading the old memory: old weights, or memory that was released. A :class:`Guard` refuses that
replay with :class:`StaleGraphError` instead.

How it knows what to watch, without guessing from source code:

1. **What the function reads**: one eager call runs under a ``TorchFunctionMode`` (:func:`watch_reads`) that sees
   every tensor reaching a PyTorch function. The tensors that existed before the call (the call's own arguments
   aside) are what the graph reads from outside: parameters, buffers, constants, caches, optimizer state. A
   ``torch.compile`` function runs its original Python code for that call (``torch.compiler.set_stance
   ("force_eager")``, PyTorch 2.6+), which reads the same tensors as the compiled code.
2. **Where each is held**: a search from the captured callable (a module, a bound method's object, a
   ``functools.partial``'s arguments, closure cells, default arguments, the globals its code loads, object attributes,
   lists, tuples and dicts, several levels deep) records every holder on a path to a read tensor (:func:`locate`).
   Holders on no such path are never recorded: an unrelated global named like an attribute raises nothing.
3. **Before every replay** (:meth:`Guard.check`): one pass over the address (and, for 2-D and larger, the
   contiguity) of the read tensors a module holds (parameters and buffers: what ``.half()``, ``.to()`` and ``.data = ...`` change), and over the holders
   that PyTorch reports nothing about (object attributes, globals, closure cells, default arguments, lists, a
   module's buffers, optimizer state). A module's parameters and submodules, and the full layout (shape, strides,
   dtype) of every read tensor, are compared again only after an event: PyTorch's global module registration hooks
   (``register_module_parameter_registration_hook`` and its two siblings: installed with the first guard, removed
   with the last) and the release of a read tensor's storage each raise a counter. A holder replaced by one leading
   to the same tensors (``optimizer.load_state_dict`` of the same state) is no change: the guard follows it.
   ``weights_fixed(g)`` checks once per block of calls instead of per call.

What a guard cannot see (tested in ``tests/test_guard.py``):

- a tensor whose holder the search cannot reach (a C++ object, ``__slots__``, a container of more than
  ``MAX_ITEMS`` items, more than ``MAX_DEPTH`` steps away): its address and contiguity are still checked every call,
  its replacement there is not;
- a parameter or submodule written straight into a module's ``_parameters``/``_modules`` dict (bypassing
  ``setattr``, so no hook runs) while the old tensor keeps its storage (PyTorch itself does this in ``Module._apply``
  only under ``torch.__future__.set_overwrite_module_params_on_conversion(True)``): seen at the next event, or by
  ``check(full=True)``;
- between events, a tensor given a new layout at the same address that keeps it contiguous (``w.data =
  w.data[:k]``, ``w.data = w.data.view(...)``), a 1-D tensor given new strides there (``b.data = b.data[::2]``), and
  any new layout of a tensor no module holds (optimizer state, caches): the next event, or ``check(full=True)``,
  compares shapes, strides and dtypes too.

Example::

    import torch
    from cudagraph_kit.guard import Guard, watch_reads

    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    with watch_reads(skip=(x,)) as reads:
        model(x)                                  # one eager call, watched
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
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["StaleGraphError", "stale", "Guard", "watch_reads", "ReadWatch", "locate", "weights_fixed",
           "STALE_FIX", "MAX_DEPTH", "MAX_ITEMS"]

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
# An entry says "container[key] is expected"; its kind says how to read container[key]:
#   "dict" (dict.get), "item" (a list index), "cell" (a closure cell), "attr" (getattr), "values" (the ids of all
#   values of a dict whose keys are tensors, e.g. optimizer.state, read without hashing a tensor).
# Module entries (a module's _parameters and _modules) are re-read after events; every other entry on every call.
_TORCH_KINDS = (torch.nn.Module, torch.optim.Optimizer)
_LEAF_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size,
               types.ModuleType, type, torch.Generator)
_MODULE_OWN = frozenset(vars(torch.nn.Module()))  # a module's own bookkeeping attributes


def _grad_scaler_types() -> tuple:
    found = []
    for where in ("torch.amp", "torch.cuda.amp"):
        try:
            found.append(__import__(where, fromlist=["GradScaler"]).GradScaler)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


_SEARCHED_TORCH = _TORCH_KINDS + _grad_scaler_types()


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
    module = type(obj).__module__ or ""
    return isinstance(getattr(obj, "__dict__", None), dict) and not module.startswith(("torch", "builtins"))


def _children(obj, label: str, names: dict):
    """``(kind, container, key, child, child_label, module_entry)`` for what ``obj`` holds (tensors, and what
    :func:`_searchable` lets the search enter); kind None: fixed."""
    for edge in _edges(obj, label, names):
        child = edge[3]
        if isinstance(child, torch.Tensor) or _searchable(child):
            yield edge


def _edges(obj, label: str, names: dict):
    if isinstance(obj, torch.nn.Module):
        for owner, module_entry in ((obj._parameters, True), (obj._buffers, False), (obj._modules, True)):
            for key, child in owner.items():
                if child is not None:
                    yield "dict", owner, key, child, f"{label}.{key}", module_entry
        for key, child in vars(obj).items():
            if key not in _MODULE_OWN and (isinstance(child, torch.Tensor) or _searchable(child)):
                yield "dict", vars(obj), key, child, f"{label}.{key}", False
    elif isinstance(obj, dict):
        if len(obj) > MAX_ITEMS:
            return
        tensor_keys = any(isinstance(k, torch.Tensor) for k in obj)
        for key, child in obj.items():
            if isinstance(child, torch.Tensor) or _searchable(child):
                shown = f"[{names.get(id(key), 'a tensor')}]" if isinstance(key, torch.Tensor) else f"[{key!r}]"
                yield ("values" if tensor_keys else "dict"), obj, key, child, f"{label}{shown}", False
    elif isinstance(obj, (list, tuple)):
        if len(obj) > MAX_ITEMS:
            return
        kind = "item" if isinstance(obj, list) else None
        for i, child in enumerate(obj):
            if isinstance(child, torch.Tensor) or _searchable(child):
                yield kind, obj, i, child, f"{label}[{i}]", False
    elif isinstance(obj, functools.partial):
        yield None, obj, "func", obj.func, label, False
        yield None, obj, "args", obj.args, f"{label} arguments", False
        yield None, obj, "keywords", obj.keywords, f"{label} keywords", False
    elif isinstance(obj, types.MethodType):
        yield None, obj, "__self__", obj.__self__, type(obj.__self__).__name__, False
        yield None, obj, "__func__", obj.__func__, label, False
    elif isinstance(obj, types.FunctionType):
        if (obj.__module__ or "").split(".")[0] == "torch":
            return  # PyTorch's own functions hold nothing of the caller's
        name = obj.__name__
        for var, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                child = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield "cell", cell, var, child, var, False
        if obj.__defaults__:
            yield "attr", obj, "__defaults__", obj.__defaults__, f"{name}'s default arguments", False
        if obj.__kwdefaults__:
            yield "attr", obj, "__kwdefaults__", obj.__kwdefaults__, f"{name}'s keyword defaults", False
        wrapped = getattr(obj, "__wrapped__", None)  # functools.wraps: decorators, torch.compile(fn)
        if wrapped is not None:
            yield "attr", obj, "__wrapped__", wrapped, name, False
        scope = obj.__globals__
        for var in sorted(_loaded_globals(obj.__code__)):
            if var in scope:
                yield "dict", scope, var, scope[var], var, False
    elif isinstance(getattr(obj, "__dict__", None), dict):  # a class's is a read-only mappingproxy: not followed
        for key, child in vars(obj).items():
            if isinstance(child, torch.Tensor) or _searchable(child):
                yield "dict", vars(obj), key, child, f"{label}.{key}", False
        call = getattr(type(obj), "__call__", None)
        if isinstance(call, types.FunctionType):
            yield None, type(obj), "__call__", call, f"{type(obj).__name__}.__call__", False


def _root_label(obj) -> str:
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    return getattr(obj, "__name__", None) or type(obj).__name__


def _named_roots(roots) -> list:
    if isinstance(roots, dict):
        return [(label, obj) for label, obj in roots.items() if obj is not None]
    roots = list(roots) if isinstance(roots, (tuple, list)) else [roots]
    return [(_root_label(obj), obj) for obj in roots]


def locate(roots, targets) -> tuple:
    """``(entries, labels, in_module, at_label)``: every holder on a path from ``roots`` to a tensor of ``targets``;
    a label per target found (``{id(tensor): "Runner.model.0.weight"}``); the ids of the targets a module holds as a
    parameter or buffer; and what each path label leads to now (``{"Runner.model": model, ...}``). ``roots``: an
    object, a list of them, or ``{label: object}``. An entry is ``(kind, container, key, expected, label,
    module_entry)``; see the module docstring.

    Example::

        entries, labels, _, _ = locate([runner.step], [runner.model[0].weight])
        labels    # {id(w): 'Runner.model.0.weight'}
    """
    named = _named_roots(roots)
    names = {id(t): f"{label}.{name}" for label, obj in named if isinstance(obj, torch.nn.Module)
             for name, t in list(obj.named_parameters()) + list(obj.named_buffers())}
    wanted = {id(t) for t in targets}
    labels: dict = {}       # id(node) -> label of the first path found
    at_label: dict = {}     # label of every path -> the object it leads to
    entries, done, in_module = [], set(), set()
    for root_label, root in named:  # from each root, the shortest paths to each read tensor (no detours via aliases)
        found, seen, in_edges = _search(root_label, root, names, at_label)
        for node, label in found.items():
            labels.setdefault(node, label)
        useful, stack = set(), [i for i in wanted if i in seen]
        while stack:  # the read tensors found, and what lies on a shortest path to one
            node = stack.pop()
            if node in useful:
                continue
            useful.add(node)
            stack.extend(parent for parent, *_ in in_edges.get(node, ()))
        for child_id in useful:
            for parent, kind, container, key, child, label, module_entry in in_edges.get(child_id, ()):
                mark = (kind, id(container), key if kind != "values" else None)
                if kind is None or parent not in useful or mark in done:
                    continue
                done.add(mark)
                expected = tuple(map(id, container.values())) if kind == "values" else child
                entries.append((kind, container, key, expected, label, module_entry))
        in_module |= {i for i in wanted if any(e[1] == "dict" and isinstance(seen.get(e[0]), torch.nn.Module)
                                               for e in in_edges.get(i, ()))}
    return entries, {i: labels[i] for i in wanted if i in labels}, in_module, at_label


def _search(root_label: str, root, names: dict, at_label: dict) -> tuple:
    """A breadth-first search from one root: ``(labels, seen, in_edges)``, where ``in_edges`` keeps, for each object,
    only the edges that reach it by a shortest path (one step deeper than their parent)."""
    at_label.setdefault(root_label, root)
    labels, seen, depth_of = {id(root): root_label}, {id(root): root}, {id(root): 0}
    in_edges: dict = {}     # id(child) -> [(id(parent), kind, container, key, child, label, module_entry)]
    cold: set = set()       # what an optimizer's state and param groups hold: re-read after events only (see Guard)
    frontier, depth = [root], 0
    while frontier and depth < MAX_DEPTH:
        nxt = []
        for obj in frontier:
            for kind, container, key, child, label, module_entry in _children(obj, labels[id(obj)], names):
                if id(obj) in cold:
                    module_entry = True
                elif isinstance(obj, torch.optim.Optimizer) and key in ("state", "param_groups"):
                    cold.add(id(child))
                at_label.setdefault(label, child)
                if id(child) not in seen:
                    seen[id(child)] = child
                    labels[id(child)] = label
                    depth_of[id(child)] = depth + 1
                    if id(obj) in cold:
                        cold.add(id(child))
                    if not isinstance(child, torch.Tensor):
                        nxt.append(child)
                if depth_of[id(child)] == depth + 1:
                    in_edges.setdefault(id(child), []).append(
                        (id(obj), kind, container, key, child, label, module_entry))
        frontier, depth = nxt, depth + 1
    return labels, seen, in_edges


# -- 3. the check --------------------------------------------------------------------------------------------------
_EVENTS = [0]        # raised by module registration hooks and by the release of a read tensor's storage
_HOOK_HANDLES: list = []
_LIVE_GUARDS = [0]
_data_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride
_is_contiguous = torch.Tensor.is_contiguous


def _event(*_args):
    """A module registration or a storage release: raise the counter (returns None, so a registered value is kept).
    Not while ``torch.compile`` traces a function that registers modules (``self.layers[:n]`` builds a new
    ``ModuleList``): traced, the counter would become a Dynamo guard that fails on every later call, recompiling
    until the recompile limit sends the function back to eager. Code that runs outside tracing still counts."""
    if _tracing():
        return
    _EVENTS[0] += 1


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


def _read_entry(kind, container, key):
    """What a cell, attribute or tensor-keyed dict entry holds now (the kinds read one by one)."""
    if kind == "cell":
        try:
            return container.cell_contents
        except ValueError:
            return None
    if kind in ("attr", "weakattr"):
        return getattr(container, key, None)
    return tuple(map(id, container.values()))  # "values"


class Guard:
    """What a graph read and where each tensor is held, checked before every replay (see the module docstring).

    ``Guard(roots, tensors)``: ``roots`` is the captured callable (or a tuple of what it reaches: model, optimizer,
    loss function); ``tensors`` what it read (:func:`watch_reads`). ``extra`` adds ``(kind, container, key, expected,
    label)`` entries the caller knows of (the train step's ``param.grad``). The guard keeps the read tensors alive
    while it lives. ``len(guard)``: how many tensors it watches; ``guard.unplaced``: the labels of read tensors the
    search could not place.

    Example::

        guard = Guard(model, reads.tensors)
        guard.check()              # before each replay; raises StaleGraphError naming what changed
    """

    def __init__(self, roots, tensors, extra=()):
        self.roots = roots
        tensors = [t for t in tensors if isinstance(t, torch.Tensor) and _has_storage(t)]
        entries, labels, in_module, _ = locate(roots, tensors)
        self._extra = list(extra)
        weak = [e for e in self._extra if e[0] == "weakattr"]
        entries += [(kind, container, key, expected, label, kind == "weakattr")
                    for kind, container, key, expected, label in extra]
        self.tensors = tensors
        self.labels = [labels.get(id(t), f"a {_describe(t)} tensor held outside the search") for t in tensors]
        self.unplaced = [label for t, label in zip(tensors, self.labels) if id(t) not in labels]
        self._ptrs = list(map(_data_ptr, tensors))
        self._strides = list(map(_stride, tensors))
        self._specs = [(tuple(t.shape), t.dtype, t.device) for t in tensors]
        # every call: the address and contiguity of the tensors a module holds (and of those the search could not
        # place); the others (optimizer state, caches, grads) are compared in full after an event
        self._hot = [t for t in tensors if id(t) in in_module or id(t) not in labels]
        self._hot_ptrs = list(map(_data_ptr, self._hot))
        self._hot_2d = [t for t in self._hot if t.dim() >= 2]   # a transpose at the same address shows here
        self._hot_contiguous = list(map(_is_contiguous, self._hot_2d))
        self._index(entries)
        self._held = 0
        self._hooked = _acquire_hooks()
        self._events = _EVENTS[0]
        # a read tensor's storage released (.half(), .to(), .data = ...) raises the event counter too
        self._finalizers = []
        for t in tensors + [e[3]() for e in weak if e[3]() is not None]:
            try:
                fin = weakref.finalize(t.untyped_storage(), _event)
            except (RuntimeError, TypeError, AttributeError):
                continue
            fin.atexit = False
            self._finalizers.append(fin)
        weakref.finalize(self, _cleanup, self._hooked, self._finalizers)

    def _index(self, entries) -> None:
        """The entries, and the flat lists the per-call check reads them from (one C-level pass per kind)."""
        self._entries = entries
        every_call = [e for e in entries if not e[5]]
        dicts = [e for e in every_call if e[0] == "dict"]
        attrs = [e for e in every_call if e[0] == "attr"]
        self._dict_owners, self._dict_keys = [e[1] for e in dicts], [e[2] for e in dicts]
        self._dict_ids = list(map(id, (e[3] for e in dicts)))
        self._attr_objects, self._attr_names = [e[1] for e in attrs], [e[2] for e in attrs]
        self._attr_ids = list(map(id, (e[3] for e in attrs)))
        lists = {id(e[1]): e[1] for e in every_call if e[0] == "item"}   # each list whole: one pass over its items
        self._lists = list(lists.values())
        self._list_ids = [list(map(id, lst)) for lst in self._lists]
        self._other = [e for e in every_call if e[0] in ("cell", "values")]

    def _may_have_changed(self) -> bool:
        """The per-call check: True after an event or when something may have changed (``changes`` says what)."""
        return (_EVENTS[0] != self._events or not self._hooked
                or list(map(_data_ptr, self._hot)) != self._hot_ptrs
                or list(map(_is_contiguous, self._hot_2d)) != self._hot_contiguous
                or list(map(id, map(dict.get, self._dict_owners, self._dict_keys))) != self._dict_ids
                or self._rest_fails())

    def _rest_fails(self) -> bool:
        """Attributes, whole lists, closure cells and tensor-keyed dicts (few in most graphs)."""
        return ((self._attr_objects and list(map(id, map(getattr, self._attr_objects, self._attr_names)))
                 != self._attr_ids)
                or (self._lists and [list(map(id, lst)) for lst in self._lists] != self._list_ids)
                or (self._other and any(_changed(e) for e in self._other)))

    def __len__(self) -> int:
        return len(self.tensors)

    def __bool__(self) -> bool:
        return bool(self.tensors or self._entries)

    def check(self, full: bool = False) -> None:
        """Raise :class:`StaleGraphError` if a read tensor or one of its holders changed since the recording.
        Inside :func:`weights_fixed` it returns at once. ``full=True`` also re-reads every module entry and
        compares shapes and dtypes."""
        if self._held and not full:
            return
        if full or self._may_have_changed():
            found = self.changes()
            if found:
                raise self.error(found)
            self._events = _EVENTS[0]

    def changes(self, refresh: bool = True) -> list:
        """What changed since the recording, one sentence each (empty when nothing did). A holder replaced by one
        that leads to the same tensors (``optimizer.load_state_dict`` of the same state) is no change: the guard
        then follows the new holders (``refresh``)."""
        found = []
        entries, _, _, at_label = locate(self.roots, self.tensors)
        missing = object()
        holders, leaves = [], []   # a replaced holder matters only where a tensor below it changed
        extra_labels = {e[4] for e in self._extra}
        for kind, container, key, expected, label, _ in sorted(self._entries, key=lambda e: len(e[4])):
            if kind == "values" or label in extra_labels:
                continue  # a tensor-keyed dict's entries are checked one by one, by label
            now = at_label.get(label, missing)
            if now is not expected:
                (leaves if isinstance(expected, torch.Tensor) else holders).append((label, expected, now))
        reported = set()
        for label, expected, now in leaves:
            top = next(((h, e, n) for h, e, n in holders if label.startswith((h + ".", h + "["))), None)
            if top is not None:
                if top[0] not in reported:
                    reported.add(top[0])
                    what = f"now holds another {type(top[2]).__name__}" if top[2] is not missing else "was removed"
                    found.append(f"{top[0]} {what}: {label} is no longer the tensor the graph reads "
                                 f"({_describe(expected)})")
            elif now is missing or now is None:
                found.append(f"{label} was removed (the graph reads the {_describe(expected)} it held at capture)")
            else:
                found.append(f"{label} was replaced by another {'tensor' if isinstance(now, torch.Tensor) else type(now).__name__} "
                             f"({_describe(now)}; the graph reads the one it held at capture, {_describe(expected)})")
        for kind, container, key, expected, label in self._extra:
            now = _read_entry(kind, container, key)
            if kind == "weakattr":
                expected = expected()
            if now is not expected or expected is None:
                found.append(f"{label} was {'removed' if now is None else 'replaced by another ' + _describe(now)} "
                             f"(the graph reads and writes the "
                             f"{_describe(expected) if expected is not None else 'tensor'} it held at capture)")
        for t, ptr, stride, (shape, dtype, device), label in zip(self.tensors, self._ptrs, self._strides,
                                                                 self._specs, self.labels):
            if t.data_ptr() == ptr and t.stride() == stride and tuple(t.shape) == shape and t.dtype == dtype:
                continue
            was = f"shape {shape} {str(dtype).replace('torch.', '')} on {device}"
            what = "new storage" if t.data_ptr() != ptr else "a new layout at the same address"
            found.append(f"{label} has {what}: {was}, strides {stride} at capture, now {_describe(t)}, strides "
                         f"{t.stride()} (.half(), .to(), .float() or .data = ... changed it; the graph reads the "
                         "old memory as it was laid out then)")
        if not found and refresh:
            self._index(entries + [(k, c, key, e, label, k == "weakattr") for k, c, key, e, label in self._extra])
        return found

    def error(self, found: list | None = None) -> StaleGraphError:
        found = found or self.changes() or ["a recorded tensor changed"]
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        return stale(f"something the CUDA graph read at capture changed: {shown}. Replaying would silently use the "
                     "old tensors, or memory that was released; nothing was copied or replayed")

    def __repr__(self):
        return (f"Guard({len(self.tensors)} tensors, {len(self._entries)} holders, "
                f"{len(self.unplaced)} unplaced)")


def _changed(entry) -> bool:
    kind, container, key, expected, _, _ = entry
    now = _read_entry(kind, container, key)
    return now != expected if kind == "values" else now is not expected


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
    """A block where you promise that no weight the graphs read changes: each graph's guard checks once on entry and
    once on exit instead of before every call (for a decode loop: once per ``generate`` or per block of tokens).

    ``graphed``: what the kit returned (``GraphedCallable``, ``BucketedGraphs``, ``GraphedTrainStep``) or
    :class:`Guard` objects. A change inside the block raises :class:`StaleGraphError` at its end: the calls after the
    change replayed on the old tensors, and the error says so.

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
                if not g._may_have_changed():
                    continue
                found = g.changes()
                if found:
                    err = g.error(found)
                    err.cause = ("inside weights_fixed(), " + err.cause.replace("; nothing was copied or replayed", "")
                                 + "; the calls made after that change in the block replayed on the old tensors")
                    err.args = (f"{err.cause}. Fix: {err.fix}.",)
                    raise err
                g._events = _EVENTS[0]
