"""Pictures of a CUDA graph: eager vs graph on one timeline, and the nodes a graph captured.

Depends on torch, matplotlib and the kit's ``graphed.py`` (the stream rule, the recovery after a failed capture and
the profiler session that leaves no residue): copy ``graphed.py`` with this file into a project; :func:`timeline` also
needs ``timing.py`` (the GPU-busy union in its caption).

- ``record(fn, *args)`` runs ``fn`` a few times under ``torch.profiler`` and returns the trace (the Chrome-trace
  dict that ``prof.export_chrome_trace`` writes). ``timeline(trace, ax=...)`` draws it: the host's CUDA runtime
  calls above (``cudaLaunchKernel`` one per kernel, ``cudaGraphLaunch`` one per graph), the GPU's kernels and
  copies below, with the idle gaps between them. ``timelines({"eager": t1, "graph": t2})`` draws several traces
  as panels on one time scale.
- ``graph_nodes(fn, *args)`` captures ``fn`` and returns the graph's nodes and edges: from the graph's own DOT
  dump (``CUDAGraph.debug_dump``) where this PyTorch can write one, else from a profiled replay (the kernels in
  the order they ran). ``draw_graph(nodes)`` draws them, one box per node, labelled by kernel.

Profile only after timing: a profiler session leaves CUPTI attached and slows every later launch in the process
(by a third or more) unless CUPTI is torn down; ``record`` asks for the teardown where CUDA supports it (12.6+),
through ``graphed.profiler_session``, which leaves ``TEARDOWN_CUPTI=1`` set once CUPTI was torn down (every later
session needs it).

Example::

    import torch
    from cudagraph_kit import show
    from cudagraph_kit.graphed import capture

    def gelu(x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.41421))

    x = torch.randn(1, 3, 224, 224, device="cuda")
    g = capture(gelu, x)                            # warm-up and capture on the kit's capture stream
    fig = show.timelines({"eager": show.record(gelu, x), "graph": show.record(g.replay)})
    nodes, edges, source = show.graph_nodes(gelu, x)
    show.draw_graph(nodes, edges, title=f"gelu: {len(nodes)} nodes (from {source})")
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

import torch


if __package__:
    from . import graphed as _graphed
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed as _graphed  # type: ignore[import-not-found, no-redef]
CaptureError = _graphed.CaptureError
capture_stream = _graphed.capture_stream
graph_capture = _graphed.graph_capture
profiler_session = _graphed.profiler_session
recover_from_failed_capture = _graphed.recover_from_failed_capture

__all__ = ["record", "trace_events", "timeline", "timelines", "graph_nodes", "parse_dot", "draw_graph",
           "short_kernel_name", "demangle"]

HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MARK = "show.record"  # the record_function range around the recorded calls
LAUNCH_COLORS = {"graph": "#e6550d", "kernel": "#3182bd", "other": "#bdbdbd"}
GPU_COLORS = {"kernel": "#31a354", "gpu_memcpy": "#756bb1", "gpu_memset": "#756bb1"}
NODE_KINDS = ("KERNEL", "MEMCPY", "MEMSET", "HOST", "EMPTY", "WAIT_EVENT", "EVENT_RECORD", "MEM_ALLOC", "MEM_FREE",
              "CONDITIONAL", "GRAPH", "EXT_SEMAS_SIGNAL", "EXT_SEMAS_WAIT", "BATCH_MEM_OP")


# --------------------------------------------------------------------------------------------------- timeline

def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU: it reads what the GPU ran from torch.profiler. Fix: run it on "
                           "a machine with an NVIDIA GPU (the recorded pictures are PNGs you can show instead).")


def record(fn, *args, calls: int = 5, warmup: int = 3) -> dict:
    """Run ``fn(*args)`` ``calls`` times under ``torch.profiler`` (CPU and CUDA activity); return the trace.

    The trace is the Chrome-trace dict of ``prof.export_chrome_trace`` (``{"traceEvents": [...]}``), which
    ``timeline`` draws; the calls are marked by a ``record_function`` range named ``show.record``, and
    ``trace_events`` keeps what happened inside it. ``fn`` is warmed up ``warmup`` times first, outside the
    profiler. Call it after your timings (see the module docstring).

    Example::

        trace = record(lambda: model(x), calls=3)
        timeline(trace)
    """
    _require_cuda("record")
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    trace = None
    for _attempt in range(3):  # a session that saw no GPU activity at all is tried again
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if hasattr(torch.cuda, "_sleep"):
                # start the session while the GPU is busy (a session that starts on an idle GPU right after another
                # one can record no GPU activity), then wait, so the recorded calls start from an idle GPU
                torch.cuda._sleep(20_000_000)
            with profiler_session(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                torch.cuda.synchronize()
                with record_function(MARK):
                    for _ in range(calls):
                        fn(*args)
                torch.cuda.synchronize()
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        try:
            if trace_events(trace)["gpu"]:
                break
        except ValueError:
            pass
    return trace


def _launch_kind(name: str) -> str:
    if "GraphLaunch" in name:
        return "graph"
    if "LaunchKernel" in name:
        return "kernel"
    return "other"


def trace_events(trace) -> dict:
    """The host runtime calls and the GPU activity of a trace, in µs from the first host launch.

    ``trace`` is a Chrome-trace dict (``record``), the path of a Chrome-trace JSON file, or a finished
    ``torch.profiler.profile`` object. Returns ``{"host": [...], "gpu": [...]}``, each a list of dicts with
    ``name``, ``cat``, ``start`` and ``end`` (µs) and, for host calls, ``kind`` (``"kernel"`` for
    ``cudaLaunchKernel``-like calls, ``"graph"`` for ``cudaGraphLaunch``, else ``"other"``).

    Example::

        ev = trace_events({"traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                            "ts": 10, "dur": 4}]})
        ev["host"][0]["start"], ev["host"][0]["end"]     # (0.0, 4.0)
    """
    if hasattr(trace, "export_chrome_trace"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            trace.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
    elif isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    events = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # record() marks its calls with a range: keep the host calls inside it and the GPU work they launched
    marks = [e for e in events if e.get("name") == MARK and e.get("cat") in ("user_annotation", "cpu_op")]
    window = (float(marks[0]["ts"]), float(marks[0]["ts"]) + float(marks[0]["dur"])) if marks else None
    host, gpu, outside = [], [], set()
    for e in events:
        cat, name = e.get("cat", ""), e.get("name", "")
        item = {"name": name, "cat": cat, "start": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"])}
        if cat in HOST_CATEGORIES:
            if window is None or window[0] <= item["start"] <= window[1]:
                item["kind"] = _launch_kind(name)
                host.append(item)
            else:
                outside.add((e.get("args") or {}).get("correlation", -1))
    for e in events:
        cat, name = e.get("cat", ""), e.get("name", "")
        if cat not in GPU_CATEGORIES or "spin_kernel" in name:
            continue
        if window is not None and (float(e["ts"]) < window[0] or (e.get("args") or {}).get("correlation") in outside):
            continue  # launched outside the recorded calls
        gpu.append({"name": name, "cat": cat, "start": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"])})
    if not host and not gpu:
        raise ValueError("the trace has no CUDA runtime calls and no GPU activity: was it recorded with "
                         "ProfilerActivity.CUDA on a GPU? Fix: record it with show.record(fn, *args).")
    launches = [h["start"] for h in host if h["kind"] != "other"]
    t0 = min(launches or [x["start"] for x in host + gpu])
    for item in host + gpu:
        item["start"] -= t0
        item["end"] -= t0
    return {"host": sorted(host, key=lambda x: x["start"]), "gpu": sorted(gpu, key=lambda x: x["start"])}


def _end_of(ev: dict) -> float:
    launches = [h["end"] for h in ev["host"] if h["kind"] != "other"]
    return max([g["end"] for g in ev["gpu"]] + launches + [0.0])


def timeline(trace, ax=None, title: str | None = None, xmax: float | None = None):
    """Draw one trace: host runtime calls on the upper row, GPU kernels and copies on the lower row.

    ``trace``: anything ``trace_events`` accepts. Launches are coloured by kind (``cudaLaunchKernel`` blue,
    ``cudaGraphLaunch`` orange, other runtime calls such as ``cudaDeviceSynchronize`` grey); white space on the
    GPU row is time the GPU sat idle. ``xmax`` (µs) fixes the time axis so several panels share one scale.
    Returns the axes.

    Example::

        fig, ax = plt.subplots(figsize=(10, 2))
        timeline(record(g.replay), ax=ax, title="graph")
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ev = trace_events(trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.2))
    end = xmax if xmax is not None else _end_of(ev) * 1.02
    rows = {"host": 1.0, "gpu": 0.0}
    for h in ev["host"]:
        ax.broken_barh([(h["start"], max(h["end"] - h["start"], end * 0.001))], (rows["host"] - 0.35, 0.7),
                       facecolors=LAUNCH_COLORS[h["kind"]], edgecolor="none")
    for g in ev["gpu"]:
        ax.broken_barh([(g["start"], max(g["end"] - g["start"], end * 0.001))], (rows["gpu"] - 0.35, 0.7),
                       facecolors=GPU_COLORS.get(g["cat"], "#31a354"), edgecolor="white", linewidth=0.3)
    span = min(_end_of(ev), end)  # this trace's own span: from its first launch to its last activity
    if __package__:
        from . import timing  # only here: the GPU-busy union of the caption
    else:  # this file copied beside timing.py, outside the package: that timing.py, never another on sys.path
        _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("timing")
        if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
            raise ImportError(f"{os.path.basename(__file__)} needs the kit's timing.py from its own folder {_here}, "
                              f"but `import timing` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                              "cudagraph_kit/timing.py beside it, that folder first on sys.path.")
        import timing  # type: ignore[import-not-found, no-redef]
    busy = timing.busy_time([(g["start"], g["end"]) for g in ev["gpu"]], end=span)
    n_kernel = sum(h["kind"] == "kernel" for h in ev["host"] if h["start"] < end)
    n_graph = sum(h["kind"] == "graph" for h in ev["host"] if h["start"] < end)
    ax.set_yticks([rows["gpu"], rows["host"]], ["GPU", "host (CUDA API)"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (µs) from the first launch")
    note = (f"{n_kernel} kernel launches, {n_graph} graph launches; GPU busy {busy:.0f} of {span:.0f} µs "
            f"({busy / span:.0%})" if span > 0 else "")
    ax.set_title(f"{title}: {note}" if title else note, fontsize=10, loc="left")
    ax.legend(handles=[Patch(color=LAUNCH_COLORS["kernel"], label="cudaLaunchKernel"),
                       Patch(color=LAUNCH_COLORS["graph"], label="cudaGraphLaunch"),
                       Patch(color=LAUNCH_COLORS["other"], label="other CUDA API (e.g. synchronize)"),
                       Patch(color=GPU_COLORS["kernel"], label="kernel on the GPU"),
                       Patch(color=GPU_COLORS["gpu_memcpy"], label="copy / memset")],
              fontsize=7, loc="upper center", ncol=5, frameon=False, bbox_to_anchor=(0.5, -0.32))
    return ax


def timelines(traces: dict, title: str | None = None):
    """Draw several traces as stacked panels on one time scale (the longest trace sets it); return the figure.

    Example::

        fig = timelines({"eager": record(gelu, x), "CUDA graph": record(g.replay)})
        fig.savefig("timeline.png")
    """
    import matplotlib.pyplot as plt

    if not traces:
        raise ValueError("timelines needs at least one trace, e.g. {'eager': record(fn, x)}")
    events = {name: trace_events(t) for name, t in traces.items()}
    xmax = max(_end_of(ev) for ev in events.values()) * 1.02
    fig, axes = plt.subplots(len(events), 1, figsize=(11, 2.1 * len(events) + 0.4), sharex=True, squeeze=False)
    for ax, (name, ev) in zip(axes[:, 0], events.items()):
        timeline({"traceEvents": _as_trace(ev)}, ax=ax, title=name, xmax=xmax)
        if ax is not axes[-1, 0]:
            ax.set_xlabel("")
            ax.get_legend().remove()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _as_trace(ev: dict) -> list:
    """Events from ``trace_events`` back in Chrome-trace form (already shifted to start at 0)."""
    return [{"ph": "X", "cat": i["cat"], "name": i["name"], "ts": i["start"], "dur": i["end"] - i["start"]}
            for i in ev["host"] + ev["gpu"]]


# --------------------------------------------------------------------------------------------------- graph nodes

def short_kernel_name(name: str) -> str:
    """A readable label for a demangled CUDA kernel name: the kernel's own name, plus the operation it was
    instantiated for when the template arguments name one.

    Example::

        short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>, "
                          "std::array<char*, 3ul> >(int, at::native::MulFunctor<float>, std::array<char*, 3ul>)")
        # 'vectorized_elementwise_kernel [Mul]'
    """
    s = demangle(name.strip())
    s = re.sub(r"^void\s+", "", s)
    depth, head, cut = 0, [], len(s)
    for i, ch in enumerate(s):  # the part before the argument list (the first '(' outside template brackets)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = s[:cut]
    base, targs = (s.split("<", 1) + [""])[:2]
    base = base.split("::")[-1].strip() or name.strip()[:40]
    found = [(m.start(), m.group(1)) for pattern in _OPERATIONS for m in re.finditer(pattern, targs)]
    detail = max(found)[1].strip("_") if found else None  # the innermost (last) operation named
    if detail and detail != base:
        return f"{base} [{detail}]"
    return base


def demangle(name: str) -> str:
    """A C++ symbol as source text (``_ZN2at6native...`` -> ``void at::native::...``), as far as this PyTorch can.

    Uses PyTorch's own demangler (``torch._C._demangle``) where it has one; otherwise spells out the identifiers
    of the mangled name (``at::native::vectorized_elementwise_kernel<MulFunctor>``), enough for a label.
    The profiler's kernel names are demangled already; a graph's DOT dump has them mangled.
    """
    if not name.startswith("_Z"):
        return name
    core = re.sub(r"<<<.*$", "", name)  # the DOT dump appends the launch configuration
    demangler = getattr(torch._C, "_demangle", None)
    if demangler is not None:
        try:
            text = demangler(core)
            if text and text != core:
                return text
        except Exception:
            pass
    idents, i = [], 0
    while i < len(core):  # <length><identifier> runs of the Itanium mangling
        m = re.match(r"(\d+)", core[i:])
        if m and core[i + len(m.group(1)):i + len(m.group(1)) + int(m.group(1))]:
            start = i + len(m.group(1))
            idents.append(core[start:start + int(m.group(1))])
            i = start + int(m.group(1))
        else:
            i += 1
    if not idents:
        return name
    head = [t for t in idents if "kernel" in t.lower()][:1] or idents[:1]
    rest = [t for t in idents[idents.index(head[0]) + 1:]]
    return "::".join(idents[:idents.index(head[0]) + 1]) + (f"<{', '.join(rest)}>" if rest else "")


# how PyTorch's elementwise kernels name their operation in their template arguments
_OPERATIONS = (r"CUDAFunctor(?:OnSelf|OnOther)?_(\w+)", r"\b(\w+?)Functor\b", r"\b(\w+?)_kernel(?:_cuda|_impl)?\b")


_EDGE = re.compile(r'(?:"([^"]+)"|([\w.]+))\s*->\s*(?:"([^"]+)"|([\w.]+))\s*(?:\[[^\]]*\])?\s*;?')
_NODE = re.compile(r'(?:"([^"]+)"|\b([\w.]+))\s*\[((?:[^\]"]|"(?:[^"\\]|\\.)*")*)\]')
_ATTR = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,;\]]+))')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_dot(text: str):
    """The nodes and edges of a CUDA graph's DOT dump (``CUDAGraph.debug_dump``).

    Returns ``(nodes, edges)``: ``nodes`` a list of dicts with ``id``, ``kind`` (``"kernel"``, ``"memcpy"``,
    ``"memset"``, ``"empty"``, ...), ``label`` (a short name, ``short_kernel_name`` for kernels) and ``raw``
    (the node's full DOT label); ``edges`` a list of ``(from_id, to_id)`` between those nodes.

    Example::

        nodes, edges = parse_dot(Path("graph.dot").read_text())
        [n["label"] for n in nodes if n["kind"] == "kernel"]
    """
    edges, rest = [], text
    for m in _EDGE.finditer(text):
        edges.append((m.group(1) or m.group(2), m.group(3) or m.group(4)))
    rest = _EDGE.sub(" ", text)
    nodes, seen = [], set()
    for m in _NODE.finditer(rest):
        node_id = m.group(1) or m.group(2)
        if node_id in ("graph", "node", "edge", "digraph", "subgraph") or node_id in seen:
            continue
        attrs = {a.group(1): a.group(2) if a.group(2) is not None else a.group(3) for a in _ATTR.finditer(m.group(3))}
        raw = attrs.get("label", "")
        # record labels separate fields with | { } and escape those (and < >) inside text with a backslash
        parts = [_unescape(p).strip() for p in re.split(r"(?<!\\)[|{}]|\n|\\n", raw)]
        parts = [p for p in parts if p]
        raw_text = "\n".join(parts)
        kind = next((k.lower() for k in NODE_KINDS if k in parts or re.search(rf"(?<![\w]){k}(?![\w])", raw_text)),
                    None)
        texts = [p for p in parts if p not in NODE_KINDS]
        func = next((p for p in texts if "::" in p or "kernel" in p.lower()), None) or next(
            (p for p in texts if ("(" in p or "<" in p) and not p.startswith("(")), None)
        if kind is None:
            kind = "kernel" if func else "node"
        label = short_kernel_name(func) if kind == "kernel" and func else kind
        nodes.append({"id": node_id, "kind": kind, "label": label, "raw": raw_text})
        seen.add(node_id)
    known = {n["id"] for n in nodes}
    edges = [(a, b) for a, b in edges if a in known and b in known]
    return nodes, edges


def _warm_up_and_capture(fn, args, graph):
    """Warm ``fn`` up and capture it into ``graph`` on the kit's capture stream (``graphed.capture_stream``); a failed
    capture leaves the process working and raises ``CaptureError`` (cause, fix, original error)."""
    side = capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    try:
        with graph_capture(graph, stream=side):
            out = fn(*args)
    except Exception as exc:
        recover_from_failed_capture()
        raise CaptureError.from_exception(exc) from exc
    torch.cuda.synchronize()
    return out


def _dot_of(fn, args) -> str | None:
    """DOT text of ``fn``'s captured graph, or None where this PyTorch cannot dump it.

    The dump needs the captured graph (``cudaGraph_t``) to outlive the capture: ``CUDAGraph(keep_graph=True)``
    where PyTorch has it (``enable_debug_mode()`` alone no longer keeps it there), ``enable_debug_mode()`` in older
    versions. Where neither keeps it, ``debug_dump`` writes nothing (with a warning) and this returns None.
    """
    if not hasattr(torch.cuda.CUDAGraph, "debug_dump"):
        return None
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # older PyTorch: no keep_graph; debug mode keeps the graph there
        graph = torch.cuda.CUDAGraph()
    if hasattr(graph, "enable_debug_mode"):
        graph.enable_debug_mode()
    _warm_up_and_capture(fn, args, graph)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.dot"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "DEBUG: calling debug_dump()" and the like
                graph.debug_dump(str(path))  # some versions need the cuda-bindings package and raise without it
        except Exception:
            return None
        text = path.read_text() if path.is_file() else ""
    return text if "->" in text or "[" in text else None


def _nodes_from_replay(fn, args):
    """The kernels and copies of one replay, in the order they ran (profiler), chained in that order."""
    from torch.profiler import ProfilerActivity, profile

    graph = torch.cuda.CUDAGraph()
    _warm_up_and_capture(fn, args, graph)
    graph.replay()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with profiler_session(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
    ev = trace_events(prof)
    nodes = []
    for i, g in enumerate(ev["gpu"]):
        kind = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}.get(g["cat"], "kernel")
        nodes.append({"id": f"node_{i}", "kind": kind, "label": short_kernel_name(g["name"]) if kind == "kernel"
                      else kind, "raw": g["name"]})
    edges = [(a["id"], b["id"]) for a, b in zip(nodes, nodes[1:])]
    return nodes, edges


def graph_nodes(fn, *args):
    """Capture ``fn(*args)`` (warm-up and capture on the kit's capture stream) and return its nodes.

    Returns ``(nodes, edges, source)`` as ``parse_dot`` does; ``source`` is ``"dot"`` when the nodes and their
    dependencies come from the graph's DOT dump (``CUDAGraph.enable_debug_mode`` + ``debug_dump``), or
    ``"profiler"`` when this PyTorch cannot dump one: then the nodes are the kernels and copies of one profiled
    replay, chained in the order they ran (the order, not the dependencies).

    Example::

        nodes, edges, source = graph_nodes(gelu, x)
        print(source, [n["label"] for n in nodes])
        draw_graph(nodes, edges)
    """
    _require_cuda("graph_nodes")
    text = _dot_of(fn, args)
    if text is not None:
        nodes, edges = parse_dot(text)
        if nodes:
            return nodes, edges, "dot"
    nodes, edges = _nodes_from_replay(fn, args)
    return nodes, edges, "profiler"


def _layers(nodes, edges) -> dict:
    """Depth of each node: the longest path from a node without predecessors. Iterative (Kahn's order: a node is
    placed once all its predecessors are), so a chain of any length, listed in any order, needs no recursion; a
    cycle (no CUDA graph has one) is broken at its first listed node rather than followed forever."""
    from collections import deque

    ids = [n["id"] for n in nodes]
    succs = {i: [] for i in ids}
    waiting = dict.fromkeys(ids, 0)  # predecessors not yet placed
    for a, b in edges:
        if a in succs and b in succs:
            succs[a].append(b)
            waiting[b] += 1
    depth = dict.fromkeys(ids, 0)
    ready = deque(i for i in ids if not waiting[i])
    placed = set()
    while len(placed) < len(ids):
        if not ready:  # only nodes on or after a cycle left: place the first listed one, at the depth its placed
            # predecessors give
            ready.append(next(i for i in ids if i not in placed))
        node = ready.popleft()
        if node in placed:
            continue
        placed.add(node)
        for b in succs[node]:
            if b in placed:  # an edge back into a broken cycle
                continue
            depth[b] = max(depth[b], depth[node] + 1)
            waiting[b] -= 1
            if waiting[b] == 0:
                ready.append(b)
    return depth


def draw_graph(nodes, edges=(), ax=None, title: str | None = None, max_label: int = 42):
    """Draw a graph's nodes as boxes, top to bottom by dependency, with arrows for the edges; return the axes.

    ``nodes``/``edges`` as returned by ``graph_nodes`` or ``parse_dot``. Nodes at the same depth (no path
    between them: they may run concurrently) sit side by side.

    Example::

        nodes, edges = parse_dot(dot_text)
        draw_graph(nodes, edges, title="my graph")
    """
    import matplotlib.pyplot as plt

    if not nodes:
        raise ValueError("draw_graph got no nodes: did the capture record any work?")
    depth = _layers(nodes, edges)
    by_depth = {}
    for n in nodes:
        by_depth.setdefault(depth[n["id"]], []).append(n)
    width = max(len(v) for v in by_depth.values())
    levels = max(by_depth) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.5, 3.4 * width), 0.75 * levels + 0.8))
    pos = {}
    for lvl, row in by_depth.items():
        for i, n in enumerate(row):
            pos[n["id"]] = (i - (len(row) - 1) / 2, -lvl)
    colors = {"kernel": "#c7e9c0", "memcpy": "#dadaeb", "memset": "#dadaeb"}
    for a, b in edges:
        ax.annotate("", xy=pos[b], xytext=pos[a],
                    arrowprops=dict(arrowstyle="-|>", color="#636363", shrinkA=11, shrinkB=11, lw=1))
    for n in nodes:
        label = n["label"] if len(n["label"]) <= max_label else n["label"][: max_label - 1] + "…"
        ax.text(*pos[n["id"]], label, ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.35", fc=colors.get(n["kind"], "#f0f0f0"), ec="#636363"))
    ax.set_xlim(-width / 2 - 0.1, width / 2 + 0.1)
    ax.set_ylim(-levels + 0.4, 0.6)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax
