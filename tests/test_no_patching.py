"""The library patches nothing of PyTorch's (DESIGN.md): checked two ways that do not depend on how a patch is
written.

- Behaviour: the identity of every attribute of ``torch``, ``torch.cuda``, ``torch.Tensor``, ``torch.cuda.Event``
  and ``torch.autocast`` (and ``sys.gettrace``/``sys.getprofile``) is snapshotted before a helper runs and compared
  from inside the user's function while the helper warms up, captures, falls back to eager or steps, and again after.
  Any rebinding shows, whether by ``torch.x = ...``, ``setattr``, ``vars(torch)[...]`` or a C extension.
- Source: no library module assigns to an attribute of torch, or calls ``setattr``/``delattr``/``sys.settrace``, or
  a ``*patch*`` helper on torch, outside the documented instrumentation of ``check_capturable``/``verify``.
"""
import ast
import gc
import os
import sys
import types
from pathlib import Path

import pytest
import torch
import torch._dynamo  # noqa: F401  PyTorch's own first import of it (e.g. by optimizer.step) wraps torch.manual_seed:
#                       imported here, before any snapshot, so that the snapshots see only what the kit does

from cudagraph_kit import capture_buckets, capture_train_step
from cudagraph_kit.graphed import capture
from cudagraph_kit.train_step import GraphedTrainStep
from cudagraph_kit import guard

gpu = pytest.mark.gpu
mse = torch.nn.functional.mse_loss
LIBRARY = Path(__file__).resolve().parent.parent / "cudagraph_kit"

WATCHED = {"torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor, "torch.cuda.Event": torch.cuda.Event,
           "torch.autocast": torch.autocast}


# PyTorch's global module hooks (forward, backward and registration hooks common to all modules)
MODULE_HOOKS = sorted(name for name in vars(torch.nn.modules.module) if name.startswith("_global_")
                      and isinstance(getattr(torch.nn.modules.module, name), dict))


def snapshot() -> dict:
    state = {(name, key): value for name, ns in WATCHED.items() for key, value in list(vars(ns).items())}
    state[("sys", "gettrace")] = sys.gettrace()
    state[("sys", "getprofile")] = sys.getprofile()
    state.update({("sys.modules", name): module for name, module in list(sys.modules.items())})
    return state


def values() -> dict:
    """State compared by value: the environment, the garbage collector, PyTorch's global module hooks. The guard's
    registration hooks (cudagraph_kit.guard._event) are the documented exception while a guarded graph lives, and
    TEARDOWN_CUPTI once the kit has profiled (the README's promise names both)."""
    hooks = {name: tuple(h for h in getattr(torch.nn.modules.module, name).values() if h is not guard._event)
             for name in MODULE_HOOKS}
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    return {"environment": env, "gc": (gc.isenabled(), gc.get_threshold()), "module hooks": hooks}


def differences(before: dict, after: dict) -> list:
    """Entries rebound, removed, or added (other than submodules PyTorch imports lazily, and modules imported anew)."""
    found = [f"{'.'.join(k)} rebound" for k in before if k in after and after[k] is not before[k]]
    found += [f"{'.'.join(k)} removed" for k in before if k not in after]
    found += [f"{'.'.join(k)} added" for k in after if k not in before and not isinstance(after[k], types.ModuleType)]
    return found


def value_differences(before: dict, after: dict) -> list:
    return [f"{key} changed" for key in before if before[key] != after[key]]


class Inspector:
    """Call ``inspect(where)`` from inside a user function: records what differs from the snapshot taken at start."""

    def __init__(self):
        self.before, self.seen, self.calls, self.places = snapshot(), [], 0, set()
        self.values = values()

    def inspect(self, where: str) -> None:
        self.calls += 1
        self.places.add(where)
        self.seen += [f"{where}: {d}" for d in differences(self.before, snapshot())]
        # the kit pauses the garbage collector while it captures (graphed.graph_capture and gc_paused say why;
        # graph_modules pauses it around make_graphed_callables' warm-up too): compared once the helper returned
        now = values()
        if where != "after the helper returned":
            now["gc"] = self.values["gc"]
        self.seen += [f"{where}: {d}" for d in value_differences(self.values, now)]

    def assert_clean(self, min_calls: int) -> None:
        self.inspect("after the helper returned")
        assert self.calls >= min_calls + 1, f"the user function ran only {self.calls - 1} time(s)"
        assert self.seen == [], self.seen


def test_the_snapshot_sees_setattr_and_dict_rebinding():
    """The detector itself: a patch made either way shows, and undoing it clears it."""
    watch = Inspector()
    original = torch.cuda.manual_seed
    setattr(torch.cuda, "manual_seed", lambda *a: None)
    try:
        watch.inspect("setattr")
    finally:
        torch.cuda.manual_seed = original
    original_repr = torch.Tensor.__repr__
    torch.Tensor.__repr__ = lambda self, *a, **k: "patched"
    try:
        watch.inspect("class attribute")
    finally:
        torch.Tensor.__repr__ = original_repr
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        watch.inspect("tracer")
    finally:
        sys.settrace(previous)
    assert watch.seen == ["setattr: torch.cuda.manual_seed rebound", "class attribute: torch.Tensor.__repr__ rebound",
                          "tracer: sys.gettrace rebound"]
    watch.seen = []
    watch.assert_clean(min_calls=3)


def test_the_snapshot_sees_environment_gc_and_module_hooks():
    watch = Inspector()
    os.environ["CGK_TEST_MARK"] = "1"
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    gc.disable()
    try:
        watch.inspect("after the helper returned")
    finally:
        del os.environ["CGK_TEST_MARK"]
        handle.remove()
        gc.enable()
    assert watch.seen == [f"after the helper returned: {what} changed" for what in ("environment", "gc", "module hooks")]
    watch.seen = []
    watch.assert_clean(min_calls=1)


def test_the_guards_hooks_live_with_a_guarded_graph_and_go_with_the_last():
    """A train step (graph mode, stand-in capture) holds a guard: its three registration hooks are installed while it
    lives and removed with it; nothing else of the process changes."""
    gc.collect()
    watch = Inspector()
    assert guard.hooks_installed() == 0

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    step = GraphedTrainStep(model, opt, mse, (x, y), warmup=1, amp_dtype=None, scaler=None, clone_loss=True,
                            mode="graph", capture=stand_in_capture)
    for _ in range(3):
        step(x, y)
    assert step.guard is not None and guard.hooks_installed() == 3
    hooks = [h for name in MODULE_HOOKS for h in getattr(torch.nn.modules.module, name).values()]
    assert hooks.count(guard._event) == 3
    del step
    gc.collect()
    assert guard.hooks_installed() == 0
    watch.assert_clean(min_calls=0)


def test_capture_with_eager_fallback_patches_nothing():
    watch = Inspector()

    def fn(x):
        watch.inspect("capture's call")
        return torch.relu(x) * 2

    g = capture(fn, torch.randn(4, 3), eager_fallback=True)
    g(torch.randn(4, 3))
    watch.assert_clean(min_calls=2)


def test_capture_buckets_with_eager_fallback_patches_nothing():
    watch = Inspector()

    def fn(x):
        watch.inspect("capture_buckets' call")
        return x * 2

    serve = capture_buckets(fn, torch.randn(4, 3), sizes=[2, 4], eager_fallback=True)
    serve(torch.randn(3, 3))
    watch.assert_clean(min_calls=1)


def stand_in_capture(work, pool, device):
    """A CPU stand-in for the train step's capture: runs the work, and again on each replay."""
    out = work()

    class Graph:
        def replay(self):
            work()
    return Graph(), out


def _watched_loss(watch, where):
    def loss_fn(out, target):
        watch.inspect(where)
        return mse(out, target)
    return loss_fn


def test_train_step_eager_fallback_patches_nothing():
    watch = Inspector()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    step = capture_train_step(model, opt, _watched_loss(watch, "eager step"), (x, y), warmup=1, eager_fallback=True)
    for _ in range(3):
        step(x, y)
    watch.assert_clean(min_calls=3)


def test_train_step_warm_up_capture_and_replay_patch_nothing():
    """Graph mode on the CPU with a stand-in capture: the kit's reseed watch runs around each warm-up step, the
    capture and the replays run the step again; none of it rebinds anything."""
    watch = Inspector()

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    step = GraphedTrainStep(model, opt, _watched_loss(watch, "graph-mode step"), (x, y), warmup=2, amp_dtype=None,
                            scaler=None, clone_loss=True, mode="graph", capture=stand_in_capture)
    for _ in range(4):  # two warm-ups, the capture, a replay
        step(x, y)
    step(x[:3], y[:3])  # a short batch: eager fallback after capture
    assert step.state == "captured" and step.eager_steps == 1
    watch.assert_clean(min_calls=6)


@gpu
def test_gpu_helpers_patch_nothing_while_warming_up_and_capturing():
    from cudagraph_kit import graph_modules, show
    torch.cuda.init()   # CUDA's lazy initialisation (torch.cuda._initialized, ...) is PyTorch's, not the kit's
    watch = Inspector()
    lin = torch.nn.Linear(8, 8).cuda()

    def fn(x):
        watch.inspect("capturing" if torch.cuda.is_current_stream_capturing() else "warming up")
        return lin(x).relu()

    x = torch.randn(4, 8, device="cuda")
    g = capture(fn, x)
    g(x)
    capture_buckets(fn, x, sizes=[2, 4])
    model = torch.nn.Linear(8, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = capture_train_step(model, opt, _watched_loss(watch, "train step"), (x, torch.randn(4, 2, device="cuda")),
                              warmup=2)
    for _ in range(4):
        step(x, torch.randn(4, 2, device="cuda"))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, t):
            watch.inspect("graph_modules")
            return self.lin(t)

    graph_modules(Block().cuda(), (torch.randn(4, 8, device="cuda", requires_grad=True),))
    show.graph_nodes(fn, x)
    assert {"warming up", "capturing", "train step", "graph_modules"} <= watch.places
    watch.assert_clean(min_calls=12)


# ------------------------------------------------------------------------------------------------- the source
# Functions allowed to rebind or trace, with the reason (each documented in its public function's docstring).
ALLOWED = {
    "_patched": "check_capturable's instrumentation (Tensor.__repr__, synchronize, Event.record/wait, "
                "autocast.__enter__, the seeding calls), restored when the check returns",
    "_instrumented": "check_capturable's instrumentation, restored when the check returns",
    "check_capturable": "its own sys.settrace tracer during each checked call, the previous one restored after",
    "_repeat_eagerly": "verify's sys.settrace tracer during each compared call, the previous one restored after",
}
REBINDING_CALLS = {"setattr", "delattr", "object.__setattr__", "object.__delattr__", "sys.settrace", "sys.setprofile",
                   "threading.settrace", "threading.setprofile"}


def _rooted_at_torch(node) -> bool:
    """``torch``, ``torch.a.b``, ``torch.a[...]``, ``vars(torch.a)``, ``getattr(torch, "a")``, ``torch.a.__dict__``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            node = node.args[0] if name in ("vars", "getattr") and node.args else node.func
        else:
            node = node.value
    return isinstance(node, ast.Name) and node.id == "torch"


def rebinding_sites(source: str) -> list:
    """(function, line, code) of each place that assigns into torch or calls something that rebinds or traces."""
    sites = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            targets = child.targets if isinstance(child, ast.Assign) else (
                [child.target] if isinstance(child, (ast.AugAssign, ast.AnnAssign)) else [])
            if any(isinstance(t, (ast.Attribute, ast.Subscript)) and _rooted_at_torch(t) for t in targets):
                sites.append((function, child.lineno, ast.unparse(child)[:80]))
            if isinstance(child, ast.Call):
                name = ast.unparse(child.func)
                patches_torch = "patch" in name.lower() and child.args and _rooted_at_torch(child.args[0])
                if name in REBINDING_CALLS or patches_torch:
                    sites.append((function, child.lineno, ast.unparse(child)[:80]))
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return sites


def test_the_source_scan_sees_every_way_of_rebinding():
    code = ("import torch, sys\n"
            "def f(g):\n"
            "    torch.cuda.manual_seed = g\n"
            "    setattr(torch.cuda, 'seed', g)\n"
            "    vars(torch)['seed'] = g\n"
            "    torch.Tensor.__dict__['x'] = g\n"
            "    _monkeypatch(torch.cuda.Event, 'record', g)\n"
            "    sys.settrace(g)\n"
            "    obj = torch.cuda\n"
            "    setattr(obj, 'synchronize', g)\n")
    assert [line for _, line, _ in rebinding_sites(code)] == [3, 4, 5, 6, 7, 8, 10]


def test_no_library_module_rebinds_anything_of_torch():
    found = []
    for path in sorted(LIBRARY.glob("*.py")):  # the library; the course (cudagraph_kit/course/) is not
        found += [f"{path.name}:{line} in {function}(): {text}" for function, line, text in
                  rebinding_sites(path.read_text()) if function not in ALLOWED]
    assert found == [], found
