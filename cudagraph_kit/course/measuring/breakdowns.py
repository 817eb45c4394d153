"""Notebook 03's figure and its appendix study (where the time of one call goes), kept out of the lesson's cells.

``plot_times`` draws the notebook's timing table, one panel per case. ``gpu_breakdown`` and ``cpu_breakdown`` are
the appendix: what the GPU does per call and which CUDA runtime calls the CPU makes (``torch.profiler``), and
where the CPU time of a call goes by part of PyTorch (``cProfile``). Both profile, so run them after every timing:
a profiler session slows the launches that come after it in the process.

Example::

    from cudagraph_kit.course.nb03_parts import cpu_breakdown, plot_times
    fig = plot_times(df, f"Time per call on {gpu}")          # df: notebook 03's results table
    cpu_breakdown(compiled, x)                              # the shares of one call's CPU time (GPU only)
"""
from __future__ import annotations

import re
from collections import defaultdict

__all__ = ["plot_times", "runtime_calls", "gpu_breakdown", "cpu_breakdown"]

COLORS = {"cuda graph": "tab:green", "eager": "tab:blue"}


def plot_times(df, title: str):
    """One panel per case of ``df`` (columns case, variant, executed_as, median_us, median_pi_lo/hi, floor_us):
    bars coloured by how the variant ran, the 90% prediction interval of its time as a whisker, the GPU-busy floor
    as a tick. Returns the figure.

    Example::

        fig = plot_times(df, "Time per call on an H100")
    """
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(df["case"]))
    sizes = df.groupby("case", sort=False).size()
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 0.36 * sizes.sum() + 1.2 * len(cases) + 0.8),
                             gridspec_kw={"height_ratios": [sizes[c] for c in cases]}, squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        d = df[df["case"] == case].iloc[::-1]
        y = list(range(len(d)))
        ax.barh(y, d["median_us"], color=[COLORS.get(e, "tab:gray") for e in d["executed_as"]], height=0.7)
        if {"median_pi_lo", "median_pi_hi"} <= set(d.columns) and d["median_pi_lo"].notna().any():
            ax.errorbar(d["median_us"], y, fmt="none", ecolor="black", elinewidth=0.8, capsize=2,
                        xerr=[(d["median_us"] - d["median_pi_lo"]).clip(lower=0).fillna(0),
                              (d["median_pi_hi"] - d["median_us"]).clip(lower=0).fillna(0)])
        if "floor_us" in d and d["floor_us"].notna().any():
            ax.scatter(d["floor_us"], y, marker="|", s=250, color="black", zorder=3)
        ax.set_yticks(y, [v.replace(" (eager fallback)", "") for v in d["variant"]], fontsize=8)
        top = d["median_pi_hi"].max() if "median_pi_hi" in d else float("nan")
        top = max(d["median_us"].max(), top) if top == top else d["median_us"].max()
        ax.set_xlim(0, top * 1.25)  # room for the value labels inside the axes
        for yi, v in zip(y, d["median_us"]):
            ax.text(v + top * 0.01, yi + 0.25, f"{v:.1f}", va="center", fontsize=7)
        shape = f" ({d['shape'].iloc[0]})" if "shape" in d else ""
        ax.set(xlabel="time per call (µs)")
        ax.set_title(f"{case}{shape}", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()] + [
        plt.Line2D([], [], marker="|", color="black", ls="", markersize=12)]
    fig.legend(handles, ["ran as a CUDA graph", "eager launches", "GPU-busy floor"], loc="upper right", fontsize=8,
               ncol=3, bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return fig


def _short_kernel(name: str) -> str:
    """A kernel's readable name (``show.short_kernel_name``); a cuBLAS GEMM as its tile shape."""
    from ..show import short_kernel_name

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

    from ..timing import gpu_time

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
