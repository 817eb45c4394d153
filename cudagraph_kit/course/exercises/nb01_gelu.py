"""Checks for notebook 01's exercises (GELU); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb01_gelu import check_fused_gelu
"""
from __future__ import annotations

from .checking import (COMPARE_COLUMNS, _fmt_numel, _graph_row, check, crossover_of, cuda, exercise, gelu_reference, is_todo, max_abs_diff, row, table_problem, table_rows, torch_calls)

__all__ = ['check_fused_gelu', 'check_fp16_sweep', 'check_host_copies', 'HOST_COPY_WHY']


@exercise("01_gelu", 1, "one fused kernel instead of five", "cpu+gpu")
@check("01.1")
def check_fused_gelu(report, fused_gelu, fused_table, g=..., reference=None):
    """``fused_gelu``: one call to ``torch.nn.functional.gelu``; ``fused_table``: ``compare`` of eager vs its graph
    replay; ``g``: the graph that was timed (``capture(fused_gelu, x)``): the graph part is checked on it, never on a
    row's name; ``reference``: the notebook's ``main_table`` (hand-written GELU) for the side-by-side."""
    import torch

    if is_todo(fused_gelu):
        report.todo("define fused_gelu(x) (replace the ...)")
    else:
        x = torch.randn(2, 3, 16, 16, device="cuda" if cuda() else "cpu")
        out = fused_gelu(x)
        if not isinstance(out, torch.Tensor):
            report.todo(f"fused_gelu(x) returned {type(out).__name__}, not a tensor: its body is still the placeholder")
        else:
            err = max_abs_diff(out, gelu_reference(x)) if out.shape == x.shape else float("inf")
            if err > 1e-5:
                report.off(f"fused_gelu differs from the hand-written GELU by {err:.2g} (shape {tuple(out.shape)})",
                           "torch.nn.functional.gelu(x) with the default approximate='none' is this function; "
                           "approximate='tanh' is an approximation that differs by about 1e-3.")
            else:
                report.right(f"fused_gelu matches the hand-written GELU on fresh data (max |diff| {err:.1e})")
            calls = torch_calls(fused_gelu, x)
            if calls == ["gelu"]:
                report.right("it is one op, torch.nn.functional.gelu: one kernel per call on a GPU instead of five")
            else:
                report.off(f"fused_gelu calls {len(calls)} torch functions ({', '.join(calls)}), not one",
                           "return torch.nn.functional.gelu(x): one fused op.")
    if is_todo(g):
        report.todo("pass the graph you timed: g = capture(fused_gelu, x, eager_fallback=True), then "
                    "check_fused_gelu(fused_gelu, fused_table, g, reference=main_table)")
        return
    if not (hasattr(g, "mode") and callable(getattr(g, "replay", None))):
        report.off(f"g is a {type(g).__name__}, not the graph that capture() returns",
                   "g = capture(fused_gelu, x, eager_fallback=True): the object whose g.replay you timed.")
        return
    if not cuda():   # the table's form can be checked here; what it times cannot: no ✔ for a row's name
        problem = None if is_todo(fused_table) else table_problem(fused_table)
        if is_todo(fused_table):
            report.todo("time it: fused_table = compare({'eager': ..., 'graph replay': g.replay}, case='small', ...)")
        elif problem:
            report.off(problem, "one call: compare({'eager': lambda: fused_gelu(x), 'graph replay': g.replay}, "
                                "case='small', samples=SAMPLES, calls=CALLS).")
        report.needs_gpu(f"nothing was captured here: CUDA graphs need an NVIDIA GPU, so on this CPU g ran fused_gelu "
                         f"eagerly (g.mode == {g.mode!r}) and neither g nor the timing table was checked")
        return
    if g.mode != "graph" or getattr(g, "graph", None) is None:
        report.off(f"g ran eagerly (g.mode == {g.mode!r}): nothing was captured, so its table times eager against "
                   "eager", "capture on a CUDA tensor: g = capture(fused_gelu, inputs['small']); if it falls back, "
                   "the warning names the cause.")
        return
    static_in, static_out = g.static_inputs[0], g.static_outputs
    static_out = static_out[0] if isinstance(static_out, (tuple, list)) else static_out
    g.replay()
    err = max_abs_diff(static_out, gelu_reference(static_in))
    if err > 1e-5:
        report.off(f"replaying g does not compute the GELU of its static input (max |diff| {err:.2g})",
                   "capture fused_gelu itself: g = capture(fused_gelu, x).")
        return
    report.right("g is a captured CUDA graph (g.mode == 'graph'), and a replay computes the GELU")
    rows = table_rows(report, fused_table, ["graph*"],
                      todo="time it: fused_table = compare({'eager': ..., 'graph replay': ...}, case='small', ...)",
                      missing="no row named 'graph ...' in the table",
                      hint="one call: compare({'eager': lambda: fused_gelu(x), 'graph replay': g.replay}, "
                           "case='small', samples=SAMPLES, calls=CALLS) with g = capture(fused_gelu, x, "
                           "eager_fallback=True).")
    if rows is None:
        return
    (graph,) = rows
    if graph["executed_as"] != "cuda graph":
        report.off(f"the '{graph['variant']}' row ran as {graph['executed_as']}, not as a CUDA graph",
                   "time g.replay of g = capture(fused_gelu, x).")
        return
    if abs(graph["kernels_per_call"] - 1) > 0.05:
        report.off(f"the graph replays {graph['kernels_per_call']:g} kernels per call; a graph of fused_gelu holds one",
                   "capture fused_gelu, not the hand-written gelu.")
        return
    report.right(f"the graph replays one kernel per call: {graph['median_us']:.1f} µs, {graph['speedup']:.2f}x eager "
                 f"(quartiles {graph['speedup_lo']:.2f}-{graph['speedup_hi']:.2f})")
    ref = None
    if reference is not None:
        case = str(fused_table["case"].iloc[0])
        ref_rows = reference[reference["case"] == case] if "case" in reference else reference.iloc[0:0]
        ref = row(ref_rows, "graph replay") if len(ref_rows) else None
    if ref is not None:
        if graph["speedup"] < ref["speedup"]:
            why = ("smaller: eager now launches one kernel instead of five, so there is less launch overhead for the "
                   "graph to remove, while the graph launch itself costs the same")
        else:
            why = ("not smaller in this run; compare the eager rows of the two tables: fewer launches should have "
                   "made eager faster")
        report.note(f"hand-written GELU, same tensor: graph {ref['speedup']:.2f}x eager; fused: "
                    f"{graph['speedup']:.2f}x. "
                    f"The speedup is {why}.")


@exercise("01_gelu", 2, "the size sweep in float16", "cpu+gpu")
@check("01.2")
def check_fp16_sweep(report, sweep16, crossover16, answer, reference_sweep=None):
    """``sweep16``: the section-5 sweep in float16 with a ``dtype`` column; ``crossover16``: its crossover (None if
    not reached); ``answer``: "larger", "smaller" or "same" (where the crossover moved); ``reference_sweep``: the
    notebook's float32 ``sweep``."""
    if table_rows(report, sweep16, columns=COMPARE_COLUMNS + ("numel", "dtype"), baseline=None,
                  todo="run the sweep in float16: sweep16 = pd.concat([...], ignore_index=True) with a 'dtype' "
                       "column",
                  hint="build sweep16 like section 5 (one compare per size, df['numel'] = n), add "
                       "df['dtype'] = 'float16', then pd.concat(...).") is None:
        return
    dtypes = set(sweep16["dtype"].astype(str).str.replace("torch.", "", regex=False))
    if dtypes != {"float16"}:
        report.off(f"the dtype column says {sorted(dtypes)}, not float16",
                   "create each input with torch.randn(n, device=DEVICE, dtype=torch.float16).")
        return
    bad = [int(n) for n, g in sweep16.groupby("numel", sort=False)
           if g["variant"].iloc[0] != "eager" or _graph_row(g) is None]
    if bad or sweep16["numel"].nunique() < 3:
        report.off(f"each size needs its own compare() with 'eager' first and a 'graph replay' row, over at least "
                   f"3 sizes (problem at {bad or 'the number of sizes'})",
                   "loop over the sizes of section 5, as there.")
        return
    mine = crossover_of(sweep16)
    if is_todo(crossover16):
        report.todo("set crossover16 (the smallest size where the graph is less than 10% faster; None if never)")
    elif crossover16 != mine:
        report.off(f"crossover16 = {crossover16!r}, but your table says {_fmt_numel(mine)}",
                   "the smallest numel whose graph row has speedup < 1.10 (one point per size; section 5 reads "
                   "it from intervals).")
    else:
        report.right(f"crossover16 agrees with your table: {_fmt_numel(mine)}")
    if is_todo(answer):
        report.todo('answer: did the crossover move to "larger" or "smaller" tensors, or stay the "same"?')
        return
    if answer not in ("larger", "smaller", "same"):
        report.off(f'answer must be "larger", "smaller" or "same", got {answer!r}')
        return
    if not cuda():
        report.right("the float16 sweep ran and agrees with itself; on this CPU every row is eager")
        report.needs_gpu("whether the crossover moves, and the floors that explain it, need an NVIDIA GPU")
        return
    graph_rows = sweep16[sweep16["variant"].str.startswith("graph")]
    if not (graph_rows["executed_as"] == "cuda graph").all():
        report.off("some graph rows ran eagerly", "capture each size with capture(gelu, x) on the GPU.")
        return
    if reference_sweep is None:
        report.todo("pass reference_sweep=sweep (the float32 sweep of section 5) to compare the two")
        return
    ref = crossover_of(reference_sweep)
    inf = float("inf")
    c16, c32 = (inf if mine is None else mine), (inf if ref is None else ref)
    moved = "larger" if c16 > c32 else "smaller" if c16 < c32 else "same"
    if answer != moved:
        report.off(f'you answered "{answer}", but your tables say "{moved}": float32 {_fmt_numel(ref)}, '
                   f"float16 {_fmt_numel(mine)}", "read both crossovers (None means beyond the largest size).")
    else:
        report.right(f'"{answer}" is what your tables say: float32 {_fmt_numel(ref)}, float16 {_fmt_numel(mine)}')
    common = sorted(set(sweep16["numel"]) & set(reference_sweep["numel"]))
    if common and common[-1] >= 2 ** 22:
        n = common[-1]
        f16 = _graph_row(sweep16[sweep16["numel"] == n])["floor_us"]
        f32 = _graph_row(reference_sweep[reference_sweep["numel"] == n])["floor_us"]
        if f16 < 0.8 * f32:
            report.right(f"at {n:,} elements the float16 floor is {f16:.1f} µs against {f32:.1f} µs in float32: half "
                         "the bytes, less GPU time per call, so launches stay the bottleneck up to larger tensors")
        else:
            report.off(f"at {n:,} elements the float16 floor ({f16:.1f} µs) is not clearly below float32's "
                       f"({f32:.1f} µs), although it moves half the bytes", "check that every input is float16.")
    else:
        report.note("the sweep stops below 4 M elements, where the floor is the kernels' fixed cost rather than memory "
                    "traffic; extend it (SWEEP_MAX_EXP) to see float16 halve the floor")


HOST_COPY_WHY = {
    "a": "Pinned memory lives on the GPU, so a replay never reads the host.",
    "b": "The GPU's copy engine reads pinned (page-locked) host memory directly, by DMA, whenever the graph's copy "
         "runs, so each replay reads what the buffer holds at that moment. Pageable memory has no such guarantee: "
         "the driver stages it through a pinned buffer of its own, with a CPU copy, at the time of the call.",
    "c": "Pageable memory is slower to read, so PyTorch refuses it for speed.",
}


@exercise("01_gelu", 3, "the kit's error for a wrong input, and host memory in a graph", "cpu+gpu")
@check("01.3")
def check_host_copies(report, kit_message, host_copy_capture, why):
    """``kit_message``: the text of the kit's error for a tensor the graph was not captured for; ``host_copy_capture``:
    a function ``(pinned) -> {"captured", "error", "replay_reads_new_values"}``; ``why``: "a", "b" or "c"
    (``HOST_COPY_WHY``)."""
    import torch

    if is_todo(kit_message):
        report.todo("kit_message: call g(...) with a tensor it was not captured for and keep str(exc)")
    elif not isinstance(kit_message, str) or "captured for" not in kit_message or "Fix:" not in kit_message:
        report.off(f"kit_message is not the kit's error text (got {str(kit_message)[:80]!r})",
                   "try: g(bad) except ValueError as exc: kit_message = str(exc)")
    elif cuda() and "on cpu" not in kit_message:
        report.off("that error is about another mismatch; on a GPU pass a CPU tensor: g(x.cpu())")
    else:
        report.right("the kit refused the tensor before touching the graph: " + kit_message.split(". ")[0])
    if is_todo(why):
        report.todo('why: "a", "b" or "c" (see HOST_COPY_WHY)')
    elif why != "b":
        report.off(f'"{why}" is not it: {HOST_COPY_WHY.get(why, "not one of a, b, c")}',
                   "a graph stores addresses; what must be true of host memory for a copy engine to read it at "
                   "replay time, without the CPU?")
    else:
        report.right("b: the copy engine reads pinned memory by DMA at replay; the graph keeps only its address, so "
                     "keep the pinned tensor alive as long as the graph")
    if is_todo(host_copy_capture):
        report.todo("write host_copy_capture(pinned) (needs an NVIDIA GPU to run)")
        return
    if not cuda():
        report.needs_gpu("capturing a host-to-device copy needs an NVIDIA GPU")
        return
    pinned = host_copy_capture(True)
    if not isinstance(pinned, dict) or not {"captured", "replay_reads_new_values"} <= set(pinned):
        report.todo("host_copy_capture(True) must return a dict with 'captured', 'error', 'replay_reads_new_values'")
        return
    if not pinned["captured"]:
        report.off(f"the pinned copy did not capture: {str(pinned.get('error'))[:200]}",
                   "allocate x_host with pin_memory=True before the capture and copy with "
                   "static.copy_(x_host, non_blocking=True): a blocking copy synchronizes, which a capture forbids.")
    elif pinned["replay_reads_new_values"] is not True:
        report.off("after writing new values into the pinned x_host, the replay did not produce gelu(new values)",
                   "x_host.copy_(new) after the capture, then graph.replay(), torch.cuda.synchronize(), compare.")
    else:
        report.right("pinned: captured, and a replay reads the values written into x_host after the capture")
    pageable = host_copy_capture(False)
    if not isinstance(pageable, dict) or "captured" not in pageable:
        report.todo("host_copy_capture(False) must return the same dict")
    elif not pageable["captured"]:
        first = str(pageable.get("error") or "").strip().splitlines()
        report.right(f"pageable: PyTorch {torch.__version__} refused it during capture: "
                     f"{first[0][:160] if first else '(no message)'}")
    else:
        report.note(f"pageable: PyTorch {torch.__version__} captured it without complaint. The graph then holds a raw "
                    "address of pageable memory that nothing keeps valid; newer PyTorch versions refuse this copy "
                    "during capture and ask for pinned memory")
