"""Where the time of a call goes, taken apart.

An eager training step's parts, each timed with ``measure`` (notebook 02's appendix); what the GPU does per call,
which CUDA runtime calls the CPU makes (``torch.profiler``) and where the CPU time goes by part of PyTorch
(``cProfile``; notebook 03's appendix); eager time as kernels x host time per kernel against the GPU-busy floor
(notebook 04's inference sweep); the top matmul kernels of a recorded decode-step study and where a recorded decode loop's time went (notebook
08).

The profiling ones profile, so run them after every timing: a profiler session slows the launches that come after
it in the process.

Example::

    from cudagraph_kit.course.measuring.breakdowns import breakdown, cpu_breakdown, step_parts
    parts = step_parts(model, lambda ps: torch.optim.SGD(ps, lr=0.1), loss_fn, x, y)   # {part: fn(x, y)}
    breakdown(measure({"MLP": parts}), "MLP")             # µs, kernels and share of the step, per part
    cpu_breakdown(compiled, x)                            # the shares of one call's CPU time (GPU only)
"""
from __future__ import annotations

import copy
import re
from collections import defaultdict
from pathlib import Path

__all__ = ["FB", "PARTS", "step_parts", "breakdown", "runtime_calls", "gpu_breakdown", "cpu_breakdown",
           "host_time_model", "inference_curves", "kernel_table", "decode_loop_reading"]


# notebook 02: the parts of an eager training step
FB = "zero_grad + forward + loss + backward"
PARTS = ("whole eager step", "zero_grad", "forward + loss", FB, "optimizer.step() alone")


def step_parts(base, make_opt, loss_fn, x, y) -> dict:
    """One callable ``fn(x, y)`` per part of an eager training step (``PARTS``), each on its own copy of ``base``
    with its own optimizer (``make_opt(params)``), gradients and optimizer state already there."""
    parts = {}
    for name in PARTS:
        m = copy.deepcopy(base)
        o = make_opt(m.parameters())
        loss_fn(m(x), y).backward()
        o.step()
        if name == "whole eager step":
            def fn(x, y, m=m, o=o):
                o.zero_grad(set_to_none=True)
                loss_fn(m(x), y).backward()
                o.step()
        elif name == "zero_grad":
            def fn(x, y, o=o):
                o.zero_grad(set_to_none=True)
        elif name == "forward + loss":
            def fn(x, y, m=m):
                return loss_fn(m(x), y)
        elif name == FB:
            def fn(x, y, m=m, o=o):
                o.zero_grad(set_to_none=True)
                loss_fn(m(x), y).backward()
        else:
            def fn(x, y, o=o):
                o.step()
        parts[name] = fn
    return parts


def _by_window(m, case, plus, minus=()):
    """Median over the windows of ``m`` (a ``Measured``) of: the ``plus`` parts' medians minus the ``minus``
    parts', window by window (a difference of two noisy medians: it can come out negative)."""
    import statistics

    values = []
    for f in m.windows:
        us = f[f.case == case].set_index("variant").median_us
        values.append(sum(us[v] for v in plus) - sum(us[v] for v in minus))
    return float(statistics.median(values))


def breakdown(m, case):
    """The parts of ``case``'s eager step: µs (median over windows), kernels (from the profiler, GPU only), µs per
    kernel and share of the whole step; backward and optimizer.step() by difference."""
    import pandas as pd

    kern = m.table[m.table.case == case].set_index("variant").get("kernels_per_call")
    k = (lambda v: float(kern[v])) if kern is not None else (lambda v: float("nan"))  # noqa: E731
    rows = {
        "zero_grad": (["zero_grad"], [], k("zero_grad")),
        "forward + loss": (["forward + loss"], [], k("forward + loss")),
        "backward (by difference)": ([FB], ["forward + loss", "zero_grad"], k(FB) - k("forward + loss")),
        "optimizer.step() (by difference)": (["whole eager step"], [FB], k("whole eager step") - k(FB)),
        "optimizer.step() (timed alone)": (["optimizer.step() alone"], [], k("optimizer.step() alone")),
        "whole eager step": (["whole eager step"], [], k("whole eager step")),
    }
    whole = _by_window(m, case, ["whole eager step"])
    out = []
    for part, (plus, minus, kernels) in rows.items():
        us = _by_window(m, case, plus, minus)
        out.append({"part": part, "µs": us, "kernels": kernels,
                    "µs per kernel": us / kernels if kernels == kernels and kernels > 0 else float("nan"),
                    "share of the step": us / whole})
    return pd.DataFrame(out)


# notebook 03: one call, on the GPU and on the CPU
def _short_kernel(name: str) -> str:
    """A kernel's readable name (``show.short_kernel_name``); a cuBLAS GEMM as its tile shape."""
    from ...show import short_kernel_name

    tile = re.search(r"tilesize(\d+x\d+x\d+)", name)
    if "gemm" in name and tile:
        return f"cuBLAS gemm {tile.group(1)}"
    short = short_kernel_name(name)
    return short if len(short) <= 40 else short[:39] + "…"


def _top_kernels(top, n: int = 3) -> str:
    """The ``n`` largest kernels by GPU time per call, kernels of the same short name added up ("name 2x 2.8")."""
    totals, counts = defaultdict(float), defaultdict(int)
    for name, us in top:
        short = _short_kernel(name)
        totals[short] += us
        counts[short] += 1
    best = sorted(totals, key=totals.get, reverse=True)[:n]
    return "; ".join(f"{k} {f'{counts[k]}x ' if counts[k] > 1 else ''}{totals[k]:.1f}" for k in best)


def runtime_calls(fn, x, calls: int = 50) -> str:
    """The CUDA runtime and driver API calls the CPU makes per call of ``fn(x)`` (launches, copies, graph
    launches), read with ``torch.profiler``; calls made fewer than once every two calls are left out."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
    counts = defaultdict(int)
    for e in prof.events():
        if (e.device_type == DeviceType.CPU and e.name.startswith("cu")
                and not any(k in e.name for k in ("GetDevice", "IsCapturing"))):
            counts[e.name] += 1
    return ", ".join(f"{k} {v / calls:g}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v >= calls / 2)


def gpu_breakdown(named):
    """``named``: ``(case, variant, fn, x)`` tuples. One row each: the GPU-busy time per call, the three largest
    kernels and the CUDA runtime calls per call (GPU only)."""
    import pandas as pd

    from ...timing import gpu_time

    rows = []
    for case, name, fn, x in named:
        g = gpu_time(fn, x)
        rows.append({"case": case, "variant": name, "GPU busy µs": getattr(g, "busy_us", float("nan")),
                     "GPU work per call (µs)": _top_kernels(getattr(g, "top", [])),
                     "CUDA runtime calls per call": runtime_calls(fn, x)})
    return pd.DataFrame(rows)


_PARTS = (("torch/_dynamo", "Dynamo: frame entry + guards"), ("torch/_functorch", "AOTAutograd runtime wrappers"),
          ("cudagraph_trees", "CUDA graph trees bookkeeping"), ("torch/_inductor", "Inductor compiled-code wrapper"),
          ("cudagraph_kit", "cudagraph_kit (GraphedCallable)"))


def _part(filename: str, funcname: str) -> str:
    """The part of PyTorch (or of the kit) a cProfile entry belongs to."""
    if filename == "~":  # C functions called from Python
        return ("C++: graph replay (launch)" if "replay" in funcname else "C++: copies (launch)" if "copy" in funcname
                else "C++: other calls (tensor bookkeeping, ...)")
    f = filename.replace("\\", "/")
    for key, label in _PARTS:
        if key in f:
            return label
    if "site-packages/torch/" in f:
        return "other torch Python (torch/" + f.rsplit("site-packages/torch/", 1)[1].split("/")[0] + ")"
    if "/lib/python" in f and "site-packages" not in f:
        return "Python standard library"
    return "this notebook / other"


def cpu_breakdown(fn, x, calls: int = 2000):
    """Where the CPU time of ``fn(x)`` goes, by part of PyTorch, from ``cProfile`` over ``calls`` calls. cProfile
    slows Python down: read the shares, not the absolute µs. Parts under 1% are left out."""
    import cProfile
    import pstats

    import pandas as pd
    import torch

    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(x)
    prof.disable()
    torch.cuda.synchronize()
    per = defaultdict(float)
    for (filename, _line, funcname), (_cc, _nc, tottime, _ct, _callers) in pstats.Stats(prof).stats.items():
        per[_part(filename, funcname)] += tottime
    total = sum(per.values())
    return pd.DataFrame([{"where": k, "µs/call (under cProfile)": v / calls * 1e6, "share": f"{v / total:.0%}"}
                         for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v / total >= 0.01])


# notebook 04: eager time as kernels x host time, against the floor
def host_time_model(eager, graph):
    """Section 1's model of an eager forward: ``max(kernels x host time per kernel, floor)``. ``eager`` and
    ``graph`` are the sweep's rows indexed by batch (median_us, median_pi_lo/hi, kernels_per_call; floor_us on the
    graph rows). The host time per kernel is estimated at the smallest batch (where eager is most host-bound):
    eager time / kernels, with the interval of the eager time. Returns ``(host_us, (lo, hi), table)``; NaN where
    the profiler counted no kernels (no GPU)."""
    import pandas as pd

    b0 = eager.index.min()
    k0 = eager.kernels_per_call[b0] if "kernels_per_call" in eager else float("nan")
    ok = pd.notna(k0) and k0 > 0
    host = eager.median_us[b0] / k0 if ok else float("nan")
    span = (eager.median_pi_lo[b0] / k0, eager.median_pi_hi[b0] / k0) if ok else (float("nan"),) * 2
    kernels = eager.kernels_per_call if "kernels_per_call" in eager else pd.Series(float("nan"), eager.index)
    floor = graph.floor_us if "floor_us" in graph else pd.Series(float("nan"), graph.index)
    line = kernels * host
    model = pd.concat([line, floor], axis=1).max(axis=1, skipna=False)
    table = pd.DataFrame({"kernels": kernels, "kernels x host (ms)": line / 1e3, "graph floor (ms)": floor / 1e3,
                          "model (ms)": model / 1e3, "eager measured (ms)": eager.median_us / 1e3,
                          "measured / model": eager.median_us / model, "graph (ms)": graph.median_us / 1e3,
                          "graph / floor": graph.median_us / floor}).round(3)
    table["bound"] = ["launch-bound" if lv > fv else "GPU-bound" if fv == fv else "-" for lv, fv in zip(line, floor)]
    return host, span, table


def inference_curves(inference, pays: float) -> dict:
    """Per dtype of the inference table (columns dtype, batch, variant, ...): the eager and graph rows by batch, the
    host-time model (:func:`host_time_model`; ``launch_us`` is the name exercise 1 reads: the eager host time per
    kernel, not the launch alone) and the batch from which the graph stops paying (None where it never does)."""
    curve = {}
    for dname in dict.fromkeys(inference.dtype):
        rows = inference[inference.dtype == dname].sort_values("batch")
        e, g = rows[rows.variant == "eager"].set_index("batch"), rows[rows.variant != "eager"].set_index("batch")
        host_us, host_span, host_table = host_time_model(e, g)
        stop_at = next((b for b in g.index if (g.speedup_hi.loc[b:] <= pays).all()), None)
        curve[dname] = {"eager": e, "graph": g, "host_us": host_us, "launch_us": host_us, "span": host_span,
                        "model": host_table, "stop": stop_at}
    return curve


# notebook 08: the recorded decode-step kernels
def _matmul_kernel(name: str) -> str:
    """A cuBLAS kernel's family and tile shape, e.g. 'gemm 32x128x8' (the full names run to 200 characters)."""
    tile = re.search(r"tilesize(\d+x\d+x\d+)", name)
    return ("gemv" if "gemv" in name else "gemm") + (f" {tile.group(1)}" if tile else "")


def kernel_table(folder):
    """The recorded batch-16 study (``scripts/probes/probe_decode_kernels.py``) in ``folder``: each batch's and variant's top
    matmul kernel with its time per step and the step's GPU-busy time, and one sentence; ``(None, why)`` if absent."""
    import pandas as pd

    folder = Path(folder)
    if not (folder / "decode_kernels.csv").is_file():
        return None, (f"not recorded ({folder / 'decode_kernels.csv'} is missing): on a GPU, run\n"
                      "    python scripts/probes/probe_decode_kernels.py --out figures/08_decode_kernels")
    kernels, steps = pd.read_csv(folder / "decode_kernels.csv"), pd.read_csv(folder / "decode_steps.csv")
    gemm = kernels[kernels.name.str.contains("gemm|gemv", case=False)].copy()
    gemm["kernel"] = gemm.name.map(_matmul_kernel)
    top = gemm.sort_values("total_us", ascending=False).groupby(["variant", "batch"]).head(1)
    table = top.merge(steps, on=["variant", "batch"]).sort_values(["batch", "variant"])
    busy, batch, name = "GPU busy (µs/step)", "batch (sequences)", "top matmul kernel (cuBLAS)"   # units
    table = table[["batch", "variant", "kernel", "total_us", "busy_us"]].rename(
        columns={"batch": batch, "kernel": name, "total_us": "top matmul (µs/step)", "busy_us": busy}
    ).reset_index(drop=True)
    graph = table[table.variant == "graph"].set_index(batch)
    slow = graph[busy].idxmax()
    later = graph[graph.index > slow]
    if not len(later):
        return table, ""
    fast = later[busy].idxmin()
    same = (table.groupby(batch)[name].nunique() == 1).all()
    return table, (f"Batch {slow} keeps the GPU busy {graph.loc[slow, busy]:.0f} µs per step and batch "
                   f"{fast} {graph.loc[fast, busy]:.0f} µs; their top matmul kernels are "
                   f"{graph.loc[slow, name]} and {graph.loc[fast, name]}. Eager and the graph run "
                   f"{'the same' if same else 'different'} top kernels at each batch.")


def decode_loop_reading(folder) -> str:
    """What ``scripts/probes/probe_decode_loop.py`` recorded in ``folder``, in plain sentences (notebook 08, "Going
    further" C): each variant's time per token against ``reduce-overhead`` (the median of per-round ratios and their
    range), whether the host or the GPU set the pace, and one kit call taken apart on the host."""
    import json

    import pandas as pd

    folder = Path(folder)
    if not (folder / "summary.csv").is_file():
        return (f"not recorded ({folder / 'summary.csv'} is missing): on a GPU, run\n"
                "    python scripts/probes/probe_decode_loop.py --out figures/08_decode_loop")
    summary, env = pd.read_csv(folder / "summary.csv"), json.loads((folder / "env.json").read_text())
    parts = pd.read_csv(folder / "host_parts.csv").set_index("part").host_us_per_call
    lines = [f"{env.get('gpu')}, {str(env.get('date', ''))[:10]}, {env.get('rounds')} rounds of whole generations of "
             f"{env.get('tokens')} tokens, round-robin; each variant's time against reduce-overhead's (median of the "
             "per-round ratios, lowest-highest):"]
    for variant, rows in summary[summary.variant != "reduce-overhead"].groupby("variant", sort=False):
        lines.append(f"- {variant}: " + "; ".join(
            f"batch {r.batch} {r.ratio_median:.2f}x ({r.ratio_min:.2f}-{r.ratio_max:.2f}x)" for r in rows.itertuples()))
    first = summary[summary.batch == summary.batch.min()].set_index("variant")
    kit = first.loc["compile + kit graph per bucket"]
    pace = ("before the GPU finished: the loop waits for the GPU, so host time saved per call does not shorten it"
            if kit.host_ms < kit.ms else "after the GPU: the host sets the loop's pace")
    lines.append(f"At batch {summary.batch.min()} the host issued a whole generation through the kit's graphs in "
                 f"{kit.host_ms:.1f} ms of its {kit.ms:.1f} ms, {pace}.")
    copy = parts.get("copy 2 inputs in", float("nan"))
    lines.append(f"One kit call costs the host {parts['whole kit call']:.0f} µs: copying the two inputs in "
                 f"{copy:.0f} µs, the guard {parts['guard.check()']:.1f} µs, the replay {parts['replay']:.1f} µs; one "
                 f"reduce-overhead call {parts['reduce-overhead call']:.0f} µs.")
    return "\n".join(lines)
