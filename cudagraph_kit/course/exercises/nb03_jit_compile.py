"""Checks for notebook 03's exercises (jit.script / torch.compile); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb03_jit_compile import check_compiled_calls_per_graph
"""
from __future__ import annotations

from .checking import (COMPARE_COLUMNS, check, cuda, exercise, gelu_reference, is_compiled, is_todo, max_abs_diff, row, table_rows)

__all__ = ['check_compiled_calls_per_graph', 'check_mlp_depth', 'check_clone_cost', 'check_max_autotune']


@exercise("03_jit_compile", 1, "ten compiled calls in one graph", "cpu+gpu")
@check("03.1")
def check_compiled_calls_per_graph(report, g10, table):
    """``g10``: ``capture(compiled, x, calls_per_graph=10, ...)``; ``table``: ``compare`` with rows "eager",
    "compiled graph, 1 call" and "compiled graph, 10 calls"."""
    import torch

    if is_todo(g10):
        report.todo("g10 = capture(compiled, x, calls_per_graph=10, eager_fallback=True)")
    elif getattr(g10, "calls_per_graph", None) != 10:
        report.off(f"g10 holds {getattr(g10, 'calls_per_graph', '?')} call(s) per graph, not 10",
                   "capture(..., calls_per_graph=10)")
    elif not is_compiled(g10.fn):
        report.off("g10 captured a function that torch.compile did not make", "capture `compiled`, not `gelu`.")
    else:
        x = torch.randn_like(g10.static_inputs[0])
        err = max_abs_diff(g10(x), gelu_reference(x))
        if err > 1e-4:
            report.off(f"g10(x) differs from eager GELU by {err:.2g}")
        else:
            report.right(f"g10 runs the compiled GELU 10 times per call and matches eager (max |diff| {err:.1e})")
    rows = table_rows(report, table, ["compiled graph, 1 call", "compiled graph, 10 calls"],
                      todo="time them in one compare() with rows 'eager', 'compiled graph, 1 call' and "
                           "'compiled graph, 10 calls'",
                      missing="the table needs rows named 'compiled graph, 1 call' and 'compiled graph, 10 calls'",
                      hint="one compare() with eager first; time g1.replay and g10.replay (input in place).")
    if rows is None:
        return
    one, ten = rows
    if not cuda():
        report.right("eager first, both graph rows present (eager on this CPU)")
        report.needs_gpu("time per call against the floor needs an NVIDIA GPU")
        return
    if one["executed_as"] != "cuda graph" or ten["executed_as"] != "cuda graph":
        report.off("a graph row ran eagerly", "capture on the GPU, without eager_fallback mattering there.")
        return
    if abs(ten["kernels_per_call"] - 1) > 0.05:
        report.off(f"the 10-call graph runs {ten['kernels_per_call']:g} kernels per call; the compiled GELU is one")
        return
    report.right(f"1 call per graph: {one['median_us']:.2f} µs ({one['vs_floor']:.2f}x its floor); "
                 f"10 calls per graph: "
                 f"{ten['median_us']:.2f} µs ({ten['vs_floor']:.2f}x its floor of {ten['floor_us']:.2f} µs)")


@exercise("03_jit_compile", 2, "how deep before reduce-overhead wins", "cpu+gpu")
@check("03.2")
def check_mlp_depth(report, make_mlp, depth_table, ro_wins_from):
    """``make_mlp(layers, width)``: the section-6 MLP; ``depth_table``: one ``compare`` per depth with a ``layers``
    column and rows "eager", "torch.compile", "reduce-overhead + mark_step_begin"; ``ro_wins_from``: the smallest
    depth where reduce-overhead beats both (None if none)."""
    import torch

    if is_todo(make_mlp):
        report.todo("write make_mlp(layers, width)")
    else:
        m = make_mlp(3, 16)
        kinds = [type(mod).__name__ for mod in m] if isinstance(m, torch.nn.Sequential) else []
        linears = [mod for mod in m if isinstance(mod, torch.nn.Linear)] if kinds else []
        if m is None:
            report.todo("make_mlp(3, 16) returned None: its body is still the placeholder")
        elif kinds != ["Linear", "ReLU"] * 3 or any((l.in_features, l.out_features) != (16, 16) for l in linears):
            report.off(f"make_mlp(3, 16) gives {kinds or type(m).__name__}; expected 3 x (Linear(16, 16), ReLU)",
                       "like section 6: layers += [Linear(width, width), ReLU()], then Sequential(*layers).")
        elif any(p.requires_grad for p in m.parameters()):
            report.off("its parameters require grad; this is inference", "call .requires_grad_(False), as section 6")
        else:
            report.right("make_mlp builds the section-6 model at any depth")
    if not cuda():
        report.needs_gpu("the depth sweep times reduce-overhead, which builds CUDA graphs: it needs an NVIDIA GPU")
        return
    if table_rows(report, depth_table, columns=COMPARE_COLUMNS + ("layers",), baseline=None,
                  todo="depth_table: one compare() per depth, with df['layers'] = layers, then pd.concat") is None:
        return
    wins, depths = None, sorted(depth_table["layers"].unique())
    for n in depths:
        d = depth_table[depth_table["layers"] == n]
        e, c, r = (row(d, v) for v in ("eager", "torch.compile", "reduce-overhead + mark_step_begin"))
        if d["variant"].iloc[0] != "eager" or c is None or r is None or r["executed_as"] != "cuda graph":
            report.off(f"at {n} layers the compare() needs 'eager' first, 'torch.compile' and "
                       "'reduce-overhead + mark_step_begin' (run as a CUDA graph)")
            return
        if wins is None and r["speedup"] > 1 and r["median_us"] < c["median_us"]:
            wins = int(n)
    if len(depths) < 3:
        report.off(f"only {len(depths)} depth(s); try at least 3 (e.g. 2, 4, 8, 16)")
    if is_todo(ro_wins_from):
        report.todo("ro_wins_from: the smallest depth where reduce-overhead beats eager and torch.compile "
                    "(None if none)")
    elif ro_wins_from != wins:
        report.off(f"ro_wins_from = {ro_wins_from!r}, but your table says {wins!r}",
                   "reduce-overhead must beat eager (speedup > 1) and torch.compile (lower median_us).")
    else:
        report.right(f"reduce-overhead beats eager and torch.compile from {wins} layers on" if wins else
                     "in your table reduce-overhead never beats both eager and torch.compile")


@exercise("03_jit_compile", 3, "what keeping reduce-overhead outputs costs", "cpu+gpu")
@check("03.3")
def check_clone_cost(report, keep_output, clone_table, clone_cost_us, x):
    """``keep_output(x)``: returns an output that survives the next call; ``clone_table``: ``compare`` with rows
    "eager", "reduce-overhead, y = f(x)", "reduce-overhead, y = f(x).clone()"; ``clone_cost_us``: the difference of
    the last two medians; ``x``: the input the compiled function was compiled for."""
    if is_todo(keep_output):
        report.todo("keep_output(x): call the compiled GELU and return an output you may keep")
    else:
        _check_kept_output(report, keep_output, x)
    if not cuda():
        report.needs_gpu("reduce-overhead's graphs, and what a clone costs per call, need an NVIDIA GPU")
        return
    rows = table_rows(report, clone_table, ["reduce-overhead, y = f(x)", "reduce-overhead, y = f(x).clone()"],
                      todo="clone_table = compare({'eager': ..., 'reduce-overhead, y = f(x)': ..., "
                           "'reduce-overhead, y = f(x).clone()': ...}, x, ...)",
                      missing="the table needs rows 'reduce-overhead, y = f(x)' and "
                              "'reduce-overhead, y = f(x).clone()'")
    if rows is None:
        return
    plain, cloned = rows
    if plain["executed_as"] != "cuda graph" or cloned["executed_as"] != "cuda graph":
        report.off("a reduce-overhead row did not run as a CUDA graph",
                   "call torch.compiler.cudagraph_mark_step_begin() before each call (with_mark_step).")
        return
    launches = lambda r: r["kernels_per_call"] + r["copies_per_call"]  # noqa: E731
    if launches(cloned) < launches(plain) + 0.9:
        report.off("the clone row launches no more work than the plain one: is it cloning?")
        return
    diff = cloned["median_us"] - plain["median_us"]
    if is_todo(clone_cost_us):
        report.todo("clone_cost_us: the clone row's median_us minus the plain row's")
    elif abs(clone_cost_us - diff) > max(0.05, 0.02 * abs(diff)):
        report.off(f"clone_cost_us = {clone_cost_us:.2f}, but the table says {diff:.2f} µs")
    else:
        report.right(f"keeping the output costs {diff:.2f} µs per call on '{clone_table['case'].iloc[0]}' "
                     f"({launches(cloned) - launches(plain):g} more copy or kernel per call)")


def _check_kept_output(report, keep_output, x):
    """Call ``keep_output`` twice; the first output must still hold f(x1) after the second call."""
    import torch

    x1, x2 = torch.randn_like(x), torch.randn_like(x)
    y1 = keep_output(x1)
    keep_output(x2)
    if not isinstance(y1, torch.Tensor):
        report.todo(f"keep_output(x) returned {type(y1).__name__}, not a tensor: its body is still the placeholder")
        return
    try:
        err = max_abs_diff(y1, gelu_reference(x1))  # reads y1
    except Exception as exc:  # noqa: BLE001 - CUDA graph trees raise when a stale output is read
        report.off(f"reading the first output after the next call failed: {str(exc).splitlines()[0][:160]}",
                   "the next replay writes into the memory of the previous output: return f(x).clone().")
        return
    if err > 1e-4:
        report.off(f"the first output no longer holds f(x1) after the next call (off by {err:.2g})",
                   "the next replay overwrote it: return f(x).clone().")
    else:
        report.right("the first output still holds f(x1) after the next call")


@exercise("03_jit_compile", 4, "max-autotune-no-cudagraphs against the default mode", "cpu+gpu")
@check("03.4")
def check_max_autotune(report, autotuned, autotune_table, x):
    """``autotuned``: ``torch.compile(..., mode="max-autotune-no-cudagraphs")``; ``autotune_table``: ``compare`` with
    rows "eager", "torch.compile + graph, input in place", "max-autotune + graph, input in place"."""
    if is_todo(autotuned):
        report.todo('autotuned = torch.compile(fresh(gelu), mode="max-autotune-no-cudagraphs", dynamic=False)')
    elif not is_compiled(autotuned):
        report.off("autotuned is not a function returned by torch.compile")
    else:
        err = max_abs_diff(autotuned(x), gelu_reference(x))
        if err > 1e-4:
            report.off(f"autotuned differs from eager GELU by {err:.2g}")
        else:
            report.right(f"autotuned matches eager GELU (max |diff| {err:.1e})")
    if not cuda():
        report.needs_gpu("floors come from graph replays on an NVIDIA GPU")
        return
    rows = table_rows(report, autotune_table,
                      ["torch.compile + graph, input in place", "max-autotune + graph, input in place"],
                      todo="autotune_table: one compare() with eager and a graph (input in place) of each compiled "
                           "GELU",
                      missing="the table needs both '... + graph, input in place' rows, run as CUDA graphs (a floor "
                              "is measured for graph rows only)",
                      hint="capture each compiled function and time g.replay.",
                      ok=lambda rows: all(r["floor_us"] == r["floor_us"] for r in rows))  # NaN: not a graph row
    if rows is None:
        return
    a, b = rows
    report.right(f"floors: default mode {a['floor_us']:.2f} µs, max-autotune-no-cudagraphs {b['floor_us']:.2f} µs "
                 f"({b['floor_us'] / a['floor_us']:.2f}x); kernels per call {a['kernels_per_call']:g} and "
                 f"{b['kernels_per_call']:g}")
