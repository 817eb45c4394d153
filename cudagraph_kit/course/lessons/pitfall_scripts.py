"""The pitfall experiments that need a Python process of their own, and the helper that runs one.

Some pitfalls end the CUDA context (an illegal memory access poisons every later CUDA call of the process), some
need a process that has done nothing on the GPU yet, and a compile can take long or hang. Each experiment here is
a plain function: it takes string arguments (they travel on a command line), runs on the GPU and reports a dict
as one JSON line with ``emit``, at its end while everything it made is still alive (an experiment that may crash
also emits what it found before the risky step). ``run_isolated`` runs one in a fresh ``sys.executable`` with a
time limit and returns the dict emitted last, with the process's exit code: a crash or a hang comes back as
data, never as an exception. Notebook 05 shows and runs these experiments; ``tests/test_pitfalls_gpu.py``
asserts on the very same dicts.

Example::

    from cudagraph_kit.course.lessons.pitfall_scripts import WARMUP_VARIANTS, run_isolated, warmup_stream
    for variant in WARMUP_VARIANTS:
        r = run_isolated(warmup_stream, variant)          # one fresh process each
        print(r["exit code"], r.get("capture"), r.get("AccumulateGrad warning"))

Only the standard library is needed to import this file; the experiments need ``torch`` and an NVIDIA GPU, and
``failed_capture_then_recovery`` also needs the kit itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["run_isolated", "emit", "failed_capture_then_recovery", "warmup_stream", "background_thread_allocates",
           "reduce_overhead_pitfalls", "two_captures", "docs_recipe_capture", "WARMUP_VARIANTS",
           "CAPTURE_ERROR_MODES", "TWO_CAPTURE_VARIANTS"]

# The child: load the experiment's file as a module (no package needed), call the function with the command-line
# arguments; the function reports by printing JSON lines (emit).
_CHILD = """
import importlib.util, sys
path, name, args = sys.argv[1], sys.argv[2], sys.argv[3:]
spec = importlib.util.spec_from_file_location("isolated_experiment", path)
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
getattr(module, name)(*args)
"""


def emit(result: dict) -> None:
    """Report ``result`` from an experiment: one JSON line on stdout, flushed at once so that it survives a crash.
    ``run_isolated`` returns the line emitted last."""
    print(json.dumps(result), flush=True)


def _last_json(stdout) -> dict:
    if isinstance(stdout, bytes):  # TimeoutExpired may carry bytes even with text=True
        stdout = stdout.decode(errors="replace")
    for line in reversed((stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


def run_isolated(experiment, *args, timeout: float = 120) -> dict:
    """Run ``experiment(*args)`` in a fresh Python process; return the dict it emitted last, plus ``"exit code"``.

    ``experiment`` is a function defined at the top level of a file (those of this module, or your own that
    reports with :func:`emit`, or prints a JSON line starting with ``{``); the child imports that file (its
    top-level code runs) and calls the function with ``args`` as strings. Never raises for what happens in the
    child: ``"exit code"`` is 0, the process's non-zero code (negative: killed by that signal), or
    ``"killed after N s"`` past ``timeout``; on a non-zero code or a timeout ``"stderr"`` holds the last line of
    its error output (``"timed out"``), and the dict holds only what was emitted before (empty if nothing). The
    folder holding the kit is put on the child's ``PYTHONPATH``.

    Example::

        r = run_isolated(two_captures, "drop", timeout=300)
        r["exit code"], r.get("replay of graph 1"), r.get("graph 1 memory")
    """
    name = getattr(experiment, "__name__", None)
    path = getattr(getattr(experiment, "__code__", None), "co_filename", None)
    if not callable(experiment) or not path or not Path(path).is_file() or name == "<lambda>" \
            or "<locals>" in getattr(experiment, "__qualname__", ""):
        raise TypeError(f"run_isolated needs a function defined at the top level of a file, got {experiment!r}: "
                        "the fresh process imports that file and calls the function by its name. Fix: define it "
                        "with def at the top level of a .py file (not a lambda, a nested function or a string)")
    kit = Path(__file__).resolve().parents[2]                # cudagraph_kit/course/lessons/ -> cudagraph_kit/
    kit_root = str(kit.parent) if kit.name == "cudagraph_kit" else None   # so the child can import the kit
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [kit_root, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-c", _CHILD, str(Path(path).resolve()), name, *map(str, args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = _last_json(e.stdout)
        out.update({"exit code": f"killed after {timeout} s", "stderr": "timed out"})
        return out
    out = _last_json(done.stdout)
    out["exit code"] = done.returncode
    if done.returncode:
        out["stderr"] = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return out


# ------------------------------------------------------------------------------------------------ the experiments
def failed_capture_then_recovery(kind: str) -> None:
    """Capture a function with one capture-breaking mistake (``kind``), then check the process still works.

    Kinds: item, print, boolean_mask, cpu_copy, pageable_copy, custom_generator, manual_seed, synchronize,
    unjoined_stream, adam_capturable_false. Emits ``kind``, ``raised`` (the exception's type name or None),
    ``cause`` (the kit's ``explain``) and ``message`` (the error's text), then ``eager_ok`` and ``graph_ok``: eager
    work and a fresh capture afterwards, both compared with the CPU.
    """
    import torch

    from cudagraph_kit import explain
    from cudagraph_kit.graphed import capture

    def gelu(t):
        return t * 0.5 * (1.0 + torch.erf(t / 1.41421))

    side = torch.cuda.Stream()
    gen = torch.Generator(device="cuda")

    def unjoined(t):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = t * 2
        return y                                    # no current_stream().wait_stream(side)

    lin = torch.nn.Linear(64, 64).cuda()
    adam = torch.optim.Adam(lin.parameters(), lr=1e-3)   # capturable=False

    def adam_step(t):
        adam.zero_grad(set_to_none=False)
        lin(t).square().mean().backward()
        adam.step()
        return t

    kinds = {
        "item": lambda t: t * t.sum().item(),
        "print": lambda t: (print(t), t * 2)[1],
        "boolean_mask": lambda t: t[t > 0] * 2,
        "cpu_copy": lambda t: t.cpu() * 2,
        "pageable_copy": lambda t: t + torch.ones(t.shape).cuda(),
        "custom_generator": lambda t: t + torch.randn(t.shape, device="cuda", generator=gen),
        "manual_seed": lambda t: (torch.manual_seed(0), t * 2)[1],
        "synchronize": lambda t: (torch.cuda.synchronize(), t * 2)[1],
        "unjoined_stream": unjoined,
        "adam_capturable_false": adam_step,
    }
    x = torch.randn(8, 64, device="cuda")
    out = {"kind": kind}
    try:
        capture(kinds[kind], x, no_grad=kind != "adam_capturable_false")
        out["raised"] = None
    except Exception as e:
        out["raised"] = type(e).__name__
        out["cause"] = explain(e).cause
        out["message"] = str(e)[:600]
    # the same process keeps working: eager work, then a fresh capture, both checked against the CPU
    new = torch.randn(8, 64, device="cuda")
    eager_ok = torch.allclose(gelu(new).cpu(), gelu(new.cpu()), atol=1e-6)
    g = capture(gelu, x)
    graph_ok = torch.allclose(g(new).cpu(), gelu(new.cpu()), atol=1e-6)
    torch.cuda.synchronize()
    out.update(eager_ok=eager_ok, graph_ok=graph_ok)
    emit(out)


WARMUP_VARIANTS = ("default stream, loss kept", "side stream, loss kept", "side stream, loss deleted")


def warmup_stream(variant: str) -> None:
    """The docs recipe for a training step, warmed up on the default or a side stream (one of ``WARMUP_VARIANTS``).

    Emits ``variant``, ``capture`` ("ok" or the error), ``AccumulateGrad warning`` (did PyTorch warn that the
    AccumulateGrad node's stream does not match) and ``eager works after``.
    """
    import warnings

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    out = {"variant": variant}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(torch.cuda.current_stream() if variant.startswith("default") else side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(model(x), y)   # `loss` keeps the last autograd graph alive
                loss.backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        if variant.endswith("deleted"):
            del loss                                              # drop the warm-up's autograd graph
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(graph):
                static_loss = torch.nn.functional.mse_loss(model(x), y)
                static_loss.backward()
                opt.step()
            graph.replay()
            torch.cuda.synchronize()
            out["capture"] = "ok"
        except Exception as e:
            out["capture"] = f"{type(e).__name__}: {str(e)[:200]}"
    out["AccumulateGrad warning"] = any("AccumulateGrad" in str(w.message) for w in caught)
    torch.cuda.synchronize()
    out["eager works after"] = bool(torch.isfinite(model(x)).all())
    emit(out)


CAPTURE_ERROR_MODES = ("global", "thread_local")


def background_thread_allocates(mode: str) -> None:
    """A background thread allocates 300 MiB on the GPU while the main thread captures with ``capture_error_mode=mode``
    (one of ``CAPTURE_ERROR_MODES``).

    Emits ``mode``, ``thread`` ("ok" or its error), ``capture`` ("ok" or the error), ``correct`` (the replay's
    result, when it captured) and ``eager works after``.
    """
    import threading

    import torch

    x = torch.randn(1024, device="cuda")
    started, finished, result, capturing = threading.Event(), threading.Event(), {"mode": mode}, [False]

    def background():                      # e.g. a data-loading thread that allocates GPU memory
        started.wait(30)
        try:
            torch.empty(300 * 2**20, dtype=torch.uint8, device="cuda")   # a new cudaMalloc
            result["thread"] = "ok"
        except Exception as e:
            result["thread"] = f"{type(e).__name__}: {str(e)[:150]}"
        finished.set()

    def fn(t):
        y = t * 2
        if capturing[0]:                   # let the thread run while the capture is under way
            started.set()
            finished.wait(30)
        return y + 1

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x)
    torch.cuda.current_stream().wait_stream(side)
    threading.Thread(target=background, daemon=True).start()
    capturing[0] = True
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            out = fn(x)
        graph.replay()
        torch.cuda.synchronize()
        result["capture"] = "ok"
        result["correct"] = bool(torch.allclose(out, x * 2 + 1))
    except Exception as e:
        result["capture"] = f"{type(e).__name__}: {str(e)[:150]}"
    torch.cuda.synchronize()
    result["eager works after"] = bool(torch.allclose((x * 2 + 1).cpu(), x.cpu() * 2 + 1))
    emit(result)


def reduce_overhead_pitfalls() -> None:
    """``torch.compile(mode="reduce-overhead")``: regions it cannot graph, and an output kept across calls.

    Emits ``skips`` (``counters["inductor"]["cudagraph_skips"]``), ``messages`` (the "skipping cudagraphs" log
    lines), ``old output`` (what reading a kept output after the next call gives) and ``clone keeps it``.
    """
    import inspect
    import logging

    import torch
    from torch._dynamo.utils import counters

    messages = []

    class Collect(logging.Handler):
        def emit(self, rec):
            if "skipping cudagraphs" in rec.getMessage():
                messages.append(rec.getMessage().strip().splitlines()[0][:200])

    for name in ("torch", "torch._inductor"):       # torch's loggers may not propagate further up
        logging.getLogger(name).addHandler(Collect())
    params = inspect.signature(torch._logging.set_logs).parameters
    torch._logging.set_logs(**{a: True for a in ("cudagraphs", "perf_hints") if a in params})

    def with_cpu_tensor(x, c):
        return x * 2, c + 1                          # c lives on the CPU

    def mutates_input(x, buf):
        buf.add_(x)                                  # writes into an input
        return x * 2

    f1 = torch.compile(with_cpu_tensor, mode="reduce-overhead")
    f2 = torch.compile(mutates_input, mode="reduce-overhead")
    x, c, buf = torch.randn(64, device="cuda"), torch.randn(64), torch.zeros(64, device="cuda")
    for _ in range(3):
        f1(x, c)
        f2(x, buf)
    out = {"skips": counters["inductor"]["cudagraph_skips"], "messages": list(dict.fromkeys(messages))}

    f3 = torch.compile(lambda t: t * 2 + 1, mode="reduce-overhead")
    x1, x2 = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            f3(x1)
        y1 = f3(x1)
        f3(x2)                                       # a new run: y1's memory may now hold this one
        try:
            kept = (y1 + 0).cpu()
            out["old output"] = ("silently holds the next call's values" if torch.allclose(kept, (x2 * 2 + 1).cpu())
                                 else "intact" if torch.allclose(kept, (x1 * 2 + 1).cpu()) else "other values")
        except RuntimeError as e:
            out["old output"] = "RuntimeError: " + str(e).strip().splitlines()[0][:200]
        y1 = f3(x1).clone()                          # the fix: clone what you keep
        f3(x2)
        out["clone keeps it"] = bool(torch.allclose(y1, x1 * 2 + 1))
    emit(out)


def docs_recipe_capture(model, opt, x, y):
    """The PyTorch docs recipe for a whole training step (MSE loss): warm up on a side stream, grads to None, capture
    forward + backward + optimizer step. Returns ``(graph, static_loss)``; copy new data into ``x`` and ``y``, then
    ``graph.replay()``. Runs in the caller's process (notebook 05 and the GPU tests use it directly).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return graph, loss


TWO_CAPTURE_VARIANTS = ("keep everything", "drop", "drop, replay right after capture",
                        "drop, empty_cache, no second capture", "same model and optimizer twice")


def span_state(segments, ptr: int, size: int) -> str:
    """Where every byte of ``[ptr, ptr + size)`` lies now, from ``torch.cuda.memory_snapshot()``'s ``segments``:
    "allocated", "free in cache", "returned to the driver" (in no segment), or, where the span crosses blocks of
    different states, "partly X and partly Y" (in address order, bytes outside every segment last). A tensor placed by
    its first byte alone can look cached while its end already lies in memory handed back to the driver.

    Example::

        span_state([{"address": 0, "total_size": 8, "blocks": [{"size": 8, "state": "inactive"}]}], 4, 8)
        # 'partly free in cache and partly returned to the driver'
    """
    states, covered, end = [], 0, ptr + size
    for seg in sorted(segments, key=lambda seg: seg["address"]):
        addr = seg["address"]
        if addr >= end or addr + seg["total_size"] <= ptr:
            continue
        for block in seg["blocks"]:
            lo, hi = max(addr, ptr), min(addr + block["size"], end)
            if lo < hi:
                covered += hi - lo
                states.append("allocated" if block["state"] == "active_allocated" else "free in cache")
            addr += block["size"]
    if covered < size:
        states.append("returned to the driver")
    states = list(dict.fromkeys(states))
    return states[0] if len(states) == 1 else "partly " + " and partly ".join(states)


def two_captures(variant: str) -> None:
    """The docs recipe for a training step (``docs_recipe_capture``; a 640x4096->2048->1024 MLP with dropout,
    ``Adam(capturable=True)``) captured twice, then the first graph replayed; ``variant`` (one of
    ``TWO_CAPTURE_VARIANTS``) says what happens to the first model, optimizer and inputs in between.

    Emits ``variant`` and ``graph 1 memory``: counts of "<kind>: <state>", where each tensor the first graph reads
    lies just before its replay, its whole span (kind: inputs, parameters, gradients, optimizer state; state:
    :func:`span_state`), emitted before the replay so that it survives a crash; then ``replay of graph 1`` ("ok" or
    the error) and ``loss finite``.
    """
    import torch

    N, D_IN, H, D_OUT = 640, 4096, 2048, 1024

    def build_and_capture(seed, model=None, opt=None, replay_now=False):
        torch.manual_seed(seed)
        if model is None:
            model = torch.nn.Sequential(torch.nn.Linear(D_IN, H), torch.nn.Dropout(0.2),
                                        torch.nn.Linear(H, D_OUT), torch.nn.Dropout(0.1)).cuda()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
        x, y = torch.randn(N, D_IN, device="cuda"), torch.randn(N, D_OUT, device="cuda")
        graph, loss = docs_recipe_capture(model, opt, x, y)
        if replay_now:
            graph.replay()
        tensors = {"inputs": [x, y], "parameters": list(model.parameters()),
                   "gradients": [p.grad for p in model.parameters()],
                   "optimizer state": [v for s in opt.state.values() for v in s.values()]}
        spans = {k: [(t.data_ptr(), t.untyped_storage().nbytes()) for t in v] for k, v in tensors.items()}
        return graph, loss, spans, (model, opt, x, y)

    def where_now(spans):
        segments = torch.cuda.memory_snapshot()
        counts = {}
        for kind, items in spans.items():
            for ptr, size in items:
                state = span_state(segments, ptr, size)
                counts[f"{kind}: {state}"] = counts.get(f"{kind}: {state}", 0) + 1
        return counts

    g1, loss1, spans1, owner1 = build_and_capture(0, replay_now=variant == "drop, replay right after capture")
    out = {"variant": variant}
    if variant == "same model and optimizer twice":
        g2, loss2, spans2, owner2 = build_and_capture(1, model=owner1[0], opt=owner1[1])
    else:
        if variant != "keep everything":
            del owner1                   # the first model, optimizer and inputs go out of scope
        if variant == "drop, empty_cache, no second capture":
            torch.cuda.empty_cache()
        else:
            g2, loss2, spans2, owner2 = build_and_capture(1)
    out["graph 1 memory"] = where_now(spans1)
    emit(out)                            # recorded even if the replay kills the process
    try:
        g1.replay()
        torch.cuda.synchronize()
        out["replay of graph 1"] = "ok"
        out["loss finite"] = bool(torch.isfinite(loss1).all())
    except Exception as e:
        out["replay of graph 1"] = f"{type(e).__name__}: {str(e)[:160]}"
    emit(out)
