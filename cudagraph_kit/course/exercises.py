"""Checks for the notebooks' exercises: each says what is right, what is off, and gives a hint.

A learner fills in an exercise cell (every ``...`` is a placeholder that runs without error) and runs the check
cell below it. A check never raises on a wrong answer; it returns a :class:`CheckResult` that prints one line per
thing it looked at:

- ``✔`` right; ``✘`` off, with a hint; ``…`` not done yet (a ``...`` is still there);
- ``⏸`` a part that needs an NVIDIA GPU. On a CPU a check verifies only what is honest there (correctness
  against eager, labels, error messages); timings, floors and kernel counts wait for a GPU run.

Its status is ``correct``, ``CPU part correct`` (everything a CPU can check is right), ``not done yet`` or
``not right yet``; ``result.ok`` is True for the first two.

Adding exercises to a notebook: write its checks in a section of this module (``@exercise(stem, number, title,
runs_on)`` above ``@check(...)``), one ``exercise_<k>`` function per exercise in
``notebooks/solutions/nbNN_<name>.py``, the exercise cells at the end of the notebook, and a test in
``tests/test_exercises.py`` that runs the solution against its check (``EXERCISES`` lists them all).

Example::

    from cudagraph_kit.course.exercises import check_fused_gelu
    check_fused_gelu(fused_gelu, fused_table, reference=main_table)   # in a notebook: prints the result
"""
from __future__ import annotations

import functools
import inspect
import traceback
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["CheckResult", "Report", "check", "exercise", "is_todo", "Exercise", "EXERCISES", "CORRECT",
           "CPU_PART_CORRECT", "NOT_DONE", "NOT_RIGHT"]

CORRECT = "correct"
CPU_PART_CORRECT = "CPU part correct"
NOT_DONE = "not done yet"
NOT_RIGHT = "not right yet"

RIGHT, OFF, TODO, GPU, NOTE = "✔", "✘", "…", "⏸", "·"


@dataclass
class Exercise:
    """One exercise of a notebook: its number, a title, its check and where its solution can be checked.

    ``runs_on``: "cpu" (everything is checked on a CPU), "cpu+gpu" (a CPU checks part of it, a GPU all of it) or
    "gpu" (only a GPU can check it; on a CPU the check says so).
    """
    number: int
    title: str
    check: Callable
    runs_on: str


@dataclass
class CheckResult:
    """What a check found: ``status``, one ``(mark, text)`` line per finding, and ``ok``."""
    exercise: str
    status: str
    lines: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in (CORRECT, CPU_PART_CORRECT)

    @property
    def text(self) -> str:
        return "\n".join(f"  {mark} {line}" for mark, line in self.lines)

    def __repr__(self) -> str:
        return f"Exercise {self.exercise}: {self.status}\n{self.text}"

    __str__ = __repr__


class Report:
    """Collects a check's findings; ``result()`` turns them into a :class:`CheckResult`."""

    def __init__(self, exercise: str):
        self.exercise = exercise
        self.lines: list = []
        self._marks: list = []

    def right(self, text: str) -> None:
        self._add(RIGHT, text)

    def off(self, text: str, hint: str = "") -> None:
        self._add(OFF, text + (f"\n      hint: {hint}" if hint else ""))

    def todo(self, text: str) -> None:
        self._add(TODO, text)

    def needs_gpu(self, text: str) -> None:
        self._add(GPU, text)

    def note(self, text: str) -> None:
        self._add(NOTE, text)

    def _add(self, mark, text):
        self.lines.append((mark, text))
        self._marks.append(mark)

    def result(self) -> CheckResult:
        marks = self._marks
        status = (NOT_RIGHT if OFF in marks else NOT_DONE if TODO in marks
                  else CPU_PART_CORRECT if GPU in marks else CORRECT)
        if not marks:  # a check that looked at nothing must not pass
            status = NOT_DONE
            self.todo("nothing was checked")
        return CheckResult(self.exercise, status, list(self.lines))


def is_todo(value) -> bool:
    """True for the placeholder ``...`` that an exercise cell starts with."""
    return value is Ellipsis


def check(exercise: str):
    """Decorator for a check ``fn(report, *args, **kwargs)``: returns a :class:`CheckResult`.

    It never raises on a wrong answer: an exception from the learner's code (which the check calls) becomes an
    ``✘`` line naming it and where it happened. Calling the check with wrong arguments raises ``TypeError``.
    """
    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs) -> CheckResult:
            report = Report(exercise)
            signature.bind(report, *args, **kwargs)  # a wrong call of the check itself raises TypeError here
            try:
                fn(report, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the learner's code raised: say so instead of crashing
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                report.off(f"running your code raised {type(exc).__name__}: {first[:200]} ({_where(exc)})",
                           "run your cell on its own, read the error, fix it and run the check again.")
            return report.result()
        run.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
        return run
    return wrap


def _where(exc) -> str:
    """The innermost frame of ``exc`` outside torch and this module: most likely the learner's own line."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "/torch/" not in f.filename.replace("\\", "/") and f.filename != __file__]
    f = (own or frames)[-1]
    return f"in {f.name}, line {f.lineno}"


EXERCISES: dict = {}  # notebook stem -> [Exercise, ...], in order; filled by @exercise below


def exercise(stem: str, number: int, title: str, runs_on: str):
    """Register a check as exercise ``number`` of notebook ``stem`` (see :class:`Exercise` for ``runs_on``)."""
    if runs_on not in ("cpu", "cpu+gpu", "gpu"):
        raise ValueError(f"runs_on must be 'cpu', 'cpu+gpu' or 'gpu', got {runs_on!r}")

    def register(fn):
        EXERCISES.setdefault(stem, []).append(Exercise(number, title, fn, runs_on))
        return fn
    return register


# --- helpers shared by the checks ------------------------------------------------------------------

def cuda() -> bool:
    import torch
    return torch.cuda.is_available()


COMPARE_COLUMNS = ("case", "variant", "executed_as", "median_us", "speedup")


def table_problem(df, columns=COMPARE_COLUMNS, baseline="eager"):
    """A sentence saying what is wrong with a ``timing.compare`` table, or None when it looks like one."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        return f"expected the DataFrame that compare() returns, got a {type(df).__name__}"
    missing = [c for c in columns if c not in df.columns]
    if missing:
        return f"the table lacks column(s) {missing}; use the DataFrame compare() returns as it is"
    if len(df) < 2:
        return f"the table has {len(df)} row(s); compare the baseline and your variant(s) in one compare() call"
    if baseline is not None and (df["variant"].iloc[0] != baseline or abs(df["speedup"].iloc[0] - 1.0) > 1e-9):
        return (f"the first row must be the baseline '{baseline}' (speedup 1.0), got '{df['variant'].iloc[0]}'; "
                "put it first in the dict you give compare()")
    return None


def row(df, variant: str):
    """The first row whose variant is ``variant`` (ignoring the ' (eager fallback)' suffix; a name ending in
    ``*`` matches every variant that starts with what comes before it), or None."""
    names = df["variant"].astype(str).str.replace(" (eager fallback)", "", regex=False)
    sel = df[names.str.startswith(variant[:-1])] if variant.endswith("*") else df[names == variant]
    return sel.iloc[0] if len(sel) else None


def table_rows(report, table, variants=(), *, todo: str, missing: str = "", hint: str = "",
               columns=COMPARE_COLUMNS, baseline="eager", ok=None):
    """The check every exercise makes of a ``compare`` table: its rows named ``variants`` (see :func:`row`), as a
    list, or None after one line in ``report``: ``todo`` while the table is the placeholder ``...``, else what
    :func:`table_problem` finds wrong with it, else ``missing`` (a row is absent, or ``ok(rows)`` is False);
    ``hint`` goes with a wrong table.

    Example::

        rows = table_rows(report, table, ["whole-step graph"], todo="table = compare(...)",
                          missing="no 'whole-step graph' row", hint="compare({'eager': ..., ...}, x, y)")
        if rows is None:
            return
        (graph,) = rows
    """
    if is_todo(table):
        report.todo(todo)
        return None
    problem = table_problem(table, columns, baseline)
    rows = [] if problem else [row(table, v) for v in variants]
    if problem or any(r is None for r in rows) or (ok is not None and not ok(rows)):
        report.off(problem or missing, hint)
        return None
    return rows


def max_abs_diff(a, b) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def gelu_reference(x):
    """The notebooks' hand-written GELU, in float32 (the reference the checks compare with)."""
    import torch
    xf = x.float()
    return xf * 0.5 * (1.0 + torch.erf(xf / 1.41421))


def torch_calls(fn, *args) -> list:
    """The names of the torch functions ``fn(*args)`` calls, in order (``torch.overrides.TorchFunctionMode``)."""
    from torch.overrides import TorchFunctionMode

    class _Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with _Record() as rec:
        fn(*args)
    return rec.names


def is_compiled(fn) -> bool:
    """True for a function returned by ``torch.compile`` (it keeps the original as ``_torchdynamo_orig_callable``)."""
    return hasattr(fn, "_torchdynamo_orig_callable")


def crossover_of(sweep, threshold: float = 1.10):
    """Smallest ``numel`` at which the graph row's speedup is below ``threshold`` (None: not reached), as in 01."""
    names = sweep["variant"].astype(str).str.replace(" (eager fallback)", "", regex=False)
    graph = sweep[names.str.startswith("graph")]
    below = graph[graph["speedup"] < threshold]
    return int(below["numel"].min()) if len(below) else None


def _fmt_numel(n) -> str:
    return "not reached in the sweep" if n is None else f"{n:,} elements"


def _graph_row(df):
    return row(df, "graph*")


# === Notebook 01: GELU =========================================================================================

@exercise("01_gelu", 1, "one fused kernel instead of five", "cpu+gpu")
@check("01.1")
def check_fused_gelu(report, fused_gelu, fused_table, reference=None):
    """``fused_gelu``: one call to ``torch.nn.functional.gelu``; ``fused_table``: ``compare`` of eager vs its graph
    replay; ``reference``: the notebook's ``main_table`` (hand-written GELU) for the side-by-side."""
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
    rows = table_rows(report, fused_table, ["graph*"],
                      todo="time it: fused_table = compare({'eager': ..., 'graph replay': ...}, case='small', ...)",
                      missing="no row named 'graph ...' in the table",
                      hint="one call: compare({'eager': lambda: fused_gelu(x), 'graph replay': g.replay}, "
                           "case='small', samples=SAMPLES, calls=CALLS) with g = capture(fused_gelu, x, "
                           "eager_fallback=True).")
    if rows is None:
        return
    (graph,) = rows
    if not cuda():
        report.right("the table has eager as its baseline and a graph row, labelled eager on this CPU")
        report.needs_gpu("the speedup and the kernels per call need an NVIDIA GPU (on a CPU both rows run eagerly)")
        return
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
                   "the smallest numel whose graph row has speedup < 1.10, as section 5 computes it.")
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


# === Notebook 02: training step ================================================================================

STEP_PARTS = ("zero_grad", "forward", "loss", "backward", "unscale + inf check", "optimizer.step", "scaler.update")
_EAGER_WITH_SCALER = {"unscale + inf check", "optimizer.step", "scaler.update"}


@exercise("02_train_step", 1, "Adam with fp16 and a GradScaler", "cpu+gpu")
@check("02.1")
def check_amp_adam(report, still_eager, amp_adam_table, max_param_diff, reference=None):
    """``still_eager``: the parts of a step (from ``STEP_PARTS``) that run eagerly with fp16 + GradScaler;
    ``amp_adam_table``: ``compare`` of the eager AMP Adam loop vs the whole-step graph; ``max_param_diff``: graph vs
    eager AMP Adam parameters after the same steps; ``reference``: the notebook's ``amp_timing``."""
    if is_todo(still_eager):
        report.todo(f"still_eager: which of {list(STEP_PARTS)} still run eagerly with fp16 + GradScaler?")
    else:
        parts = {still_eager} if isinstance(still_eager, str) else set(still_eager)
        unknown = parts - set(STEP_PARTS)
        missing, extra = _EAGER_WITH_SCALER - parts, parts - _EAGER_WITH_SCALER - unknown
        if unknown:
            report.off(f"not parts of a step: {sorted(unknown)}; pick from {list(STEP_PARTS)}")
        elif missing or extra:
            report.off(f"still_eager = {sorted(parts)}: " + "; ".join(
                ([f"also eager: {sorted(missing)}"] if missing else [])
                + ([f"inside the graph: {sorted(extra)}"] if extra else [])),
                "read section 7: what does scaler.step need to know before it lets the optimizer step, and where "
                "is that known?")
        else:
            report.right("scaler.step (unscale, inf check on the CPU, then optimizer.step) and scaler.update run "
                         "eagerly after each replay: with Adam that is the whole update, many launches per step")
    if not cuda():
        report.needs_gpu("AMP through a CUDA graph, its parity and its timing need an NVIDIA GPU")
        return
    if is_todo(max_param_diff):
        report.todo("max_param_diff: train the eager AMP Adam loop and the graphed one on the same batches, compare")
    elif not max_param_diff < 1e-4:
        report.off(f"the graphed AMP Adam step ends {max_param_diff:.3g} away from the eager one",
                   "same seed and model copy, same batches, Adam(capturable=True), a GradScaler for each loop.")
    else:
        report.right(f"parity first: graphed and eager AMP Adam agree (max |param diff| {max_param_diff:.2g})")
    rows = table_rows(report, amp_adam_table, ["whole-step graph"],
                      todo="amp_adam_table = compare({'eager': ..., GRAPH: ...}, x, y, case=..., ...)",
                      missing="no 'whole-step graph' row that ran as a CUDA graph",
                      hint="compare({'eager': eager_amp_step(...), GRAPH: capture_train_step(...)}, x, y, case=...).",
                      ok=lambda rows: rows[0]["executed_as"] == "cuda graph")
    if rows is None:
        return
    (graph,) = rows
    text = f"Adam, fp16 + GradScaler: whole-step graph {graph['median_us']:.0f} µs, {graph['speedup']:.2f}x eager"
    ref = None
    if reference is not None and len(reference):
        sel = reference[reference["case"].astype(str).str.contains("fp16")]
        ref = row(sel, "whole-step graph") if len(sel) else None
    if ref is not None:
        text += f" (SGD in section 7: {ref['speedup']:.2f}x)"
    report.right(text)


@exercise("02_train_step", 2, "a learning-rate schedule in a graphed loop", "cpu+gpu")
@check("02.2")
def check_lr_schedule(report, graphed_model, eager_model, optimizer, lrs):
    """``graphed_model``: trained with ``capture_train_step`` and a scheduler; ``eager_model``: the same, eagerly;
    ``optimizer``: the graphed run's optimizer; ``lrs``: the learning rate after each step (floats)."""
    import torch

    if any(is_todo(v) for v in (graphed_model, eager_model, optimizer, lrs)):
        report.todo("fill in graphed_model, eager_model, optimizer and lrs")
        return
    lr = optimizer.param_groups[0]["lr"]
    if not isinstance(lr, torch.Tensor) and isinstance(optimizer, torch.optim.SGD) and not optimizer.defaults.get("fused"):
        report.off(f"the lr is a Python {type(lr).__name__} and plain SGD reads it on the host inside its step: a graph "
                   "keeps the value from capture, so capture_train_step refuses a schedule that changes it",
                   "SGD(..., fused=True), or Adam(..., lr=torch.tensor(1e-3, device=DEVICE), capturable=CUDA): the "
                   "graph then reads the lr from GPU memory at every replay.")
    elif not isinstance(lr, torch.Tensor):
        report.right(f"the lr is a Python {type(lr).__name__}: capture_train_step keeps it in a GPU tensor that the "
                     "graph reads, and copies each new value in before a replay (a hand-written graph would keep "
                     "the value it saw at capture)")
    elif cuda() and lr.device.type != "cuda":
        report.off("the lr tensor is on the CPU; the graph needs it in GPU memory", "torch.tensor(1e-3, device='cuda')")
    else:
        report.right(f"the lr is a {lr.device.type} tensor that the scheduler updates in place")
    values = [float(v) for v in lrs]
    if len(set(values)) < 2:
        report.off(f"the recorded lr never changed ({values[:1]})", "call scheduler.step() after each training step "
                   "and append float(optimizer.param_groups[0]['lr']).")
        return
    report.right(f"the schedule changed the lr {len(set(values)) - 1} time(s), from {values[0]:.3g} to "
                 f"{values[-1]:.3g}")
    diff = max(max_abs_diff(p, q) for p, q in zip(graphed_model.parameters(), eager_model.parameters()))
    if diff > 1e-5:
        report.off(f"the graphed model ends {diff:.3g} away from the eager one: the graph did not follow the schedule",
                   "both runs: same initial model, same batches, the same scheduler stepped after every step.")
    elif not cuda():
        report.right(f"the two runs agree (max |param diff| {diff:.2g}); on a CPU both are eager")
        report.needs_gpu("that the replayed graph follows the schedule shows only on an NVIDIA GPU")
    else:
        report.right(f"the graphed run follows the schedule: parameters match eager (max |diff| {diff:.2g})")


@exercise("02_train_step", 3, "short batches and what they cost", "cpu+gpu")
@check("02.3")
def check_short_batches(report, short_batches, predicted_eager_steps, short_step, extra_us, timing,
                        case="MLP 32x128x256x16, SGD"):
    """``short_batches``: batches of several sizes; ``predicted_eager_steps``: counted from their sizes before
    running; ``short_step``: the ``capture_train_step`` they all ran through; ``extra_us``: eager steps × (eager −
    graph µs) from ``timing``, row ``case``."""
    if any(is_todo(v) for v in (short_step, short_batches)):
        report.todo("build short_batches and run them through a new capture_train_step, short_step")
        return
    step, batches = short_step, short_batches
    sizes = [tuple(b[0].shape) for b in batches]
    captured = tuple(step.static_batch[0].shape)
    other = sum(s != captured for s in sizes)
    if len(set(sizes)) < 3:
        report.off(f"the batches have {len(set(sizes))} distinct shape(s); the exercise asks for several sizes",
                   "e.g. epochs of datasets whose size is not a multiple of the batch size (drop_last=False).")
    if step.eager_steps != other:
        report.off(f"step.eager_steps is {step.eager_steps}, but {other} of your {len(batches)} batches differ from "
                   f"the captured shape {captured}", "run every batch of `batches` through this step, once.")
    else:
        report.right(f"{other} of {len(batches)} batches ran eagerly: exactly those whose shape is not {captured}")
    if is_todo(predicted_eager_steps):
        report.todo("predicted_eager_steps: count them from the sizes before you run")
    elif predicted_eager_steps != other:
        report.off(f"you predicted {predicted_eager_steps} eager steps; {other} batches differ from the captured shape",
                   "only the shape of the sample batch is captured; warm-up steps are not eager fallbacks.")
    else:
        report.right("your prediction was right")
    if is_todo(extra_us):
        report.todo("extra_us: eager steps × (eager µs − graph µs) from the timing table")
        return
    sel = timing[timing["case"] == case]
    e, g = (row(sel, v) for v in ("eager", "whole-step graph")) if len(sel) else (None, None)
    if e is None or g is None:
        report.off(f"the timing table has no eager and whole-step graph rows for case {case!r}")
        return
    expected = other * (e["median_us"] - g["median_us"])
    if abs(extra_us - expected) > max(1.0, 0.02 * abs(expected)):
        report.off(f"extra_us = {extra_us:.1f}, but {other} × ({e['median_us']:.1f} − {g['median_us']:.1f}) µs = "
                   f"{expected:.1f} µs", f"use the median_us of the eager and whole-step graph rows of {case!r}.")
    elif not cuda():
        report.right(f"extra_us = {extra_us:.1f} µs from the table's CPU times")
        report.needs_gpu("on a CPU both rows are eager, so the difference is noise; the GPU run gives the real cost")
    else:
        report.right(f"the short batches cost {extra_us:.0f} µs more than graph replays would "
                     f"({e['median_us'] / g['median_us']:.1f}x a graphed step each); drop_last=True, or one graph "
                     "per batch size, avoids it")


# === Notebook 03: jit.script / torch.compile ====================================================================

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


# === Notebook 05: pitfalls =====================================================================================

def _first_finding(report) -> str:
    """``kind at where: code`` of a ``check_capturable`` report's first finding."""
    f = report.findings[0]
    return f"{f.kind} at {f.where}" + (f" ({f.code.strip()[:80]})" if f.code else "")


def _check_learners_verify(report, verified, what, hint):
    """The learner's own ``verify`` report: a ``VerifyReport`` that passed."""
    from ..diagnose import VerifyReport

    if is_todo(verified):
        report.todo(f"{what}: run verify(...) on your graph and keep its report")
    elif not isinstance(verified, VerifyReport):
        report.off(f"{what} is a {type(verified).__name__}, not the report verify() returns")
    elif not verified.ok:
        first = str(verified).splitlines()[0]
        report.off(f"your verify() finds a divergence: {first[:200]}", hint)
    else:
        report.right(f"your verify() passes: {str(verified).splitlines()[0]}")


@exercise("05_pitfalls", 1, "a step counter that a graph replays", "cpu+gpu")
@check("05.1")
def check_step_counter(report, ScaledByStepFixed, counter_verify):  # noqa: N803 - the notebook's class name
    """``ScaledByStepFixed``: section 5's ``ScaledByStep`` (``self.lin = Linear(16, 16)``; call k returns
    ``lin(x) / k``) with its counter in a tensor updated in place; ``counter_verify``: ``verify`` of a captured
    instance against an eager copy of it (GPU)."""
    import copy

    import torch

    from ..capture import capture
    from ..diagnose import check_capturable, verify

    cls, device, done = ScaledByStepFixed, "cuda" if cuda() else "cpu", False
    if is_todo(cls):
        report.todo("write the class ScaledByStepFixed")
    elif not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        report.off(f"ScaledByStepFixed is a {type(cls).__name__}; pass the class, a torch.nn.Module subclass")
    elif cls.forward is torch.nn.Module.forward:
        report.todo("ScaledByStepFixed has no forward yet: its body is still the placeholder")
    else:
        done = _check_counter_class(report, cls, device, check_capturable)
    if not cuda():
        report.needs_gpu("capturing it, and verify() against eager, need an NVIDIA GPU")
        return
    same_copy_hint = ("the eager reference must be a copy of its own: every call, graph or eager, advances the "
                      "counter. reference = copy.deepcopy(model) before the capture, then verify(g, reference, x, "
                      "state=[(model, reference)]) starts both from the same count and compares them after each step.")
    _check_learners_verify(report, counter_verify, "counter_verify", same_copy_hint)
    if not done:
        return
    torch.manual_seed(0)
    model = cls().to(device)
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16, device=device)
    g = capture(model, x)
    mine = verify(g, reference, x, steps=3, state=[(model, reference)])
    if mine.ok:
        report.right("captured, each replay divides by the current count: verify() against an eager copy passes "
                     "on 3 steps")
    else:
        report.off(f"a graph of a fresh ScaledByStepFixed diverges from eager: {str(mine).splitlines()[0][:200]}",
                   "the counter must live in GPU memory (a buffer, moved by .to(DEVICE)) and change in place.")


def _check_counter_class(report, cls, device, check_capturable) -> bool:
    """Everything a CPU can check of the class; True when all of it is right."""
    import torch

    torch.manual_seed(0)
    m = cls().to(device)
    lin = getattr(m, "lin", None)
    if not isinstance(lin, torch.nn.Linear) or (lin.in_features, lin.out_features) != (16, 16):
        report.off("ScaledByStepFixed has no self.lin = torch.nn.Linear(16, 16)", "keep ScaledByStep's layer.")
        return False
    buffers = dict(m.named_buffers())
    before = {n: (b.data_ptr(), b.detach().clone()) for n, b in buffers.items()}
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        outs = [m(x) for _ in range(3)]
        base = m.lin(x)
    if not all(isinstance(o, torch.Tensor) and o.shape == base.shape for o in outs):
        report.off(f"ScaledByStepFixed()(x) returned {type(outs[0]).__name__}, not a tensor of shape "
                   f"{tuple(base.shape)}", "return self.lin(x) / the counter.")
        return False
    err = max(max_abs_diff(o, base / k) for k, o in enumerate(outs, 1))
    if not err <= 1e-5:
        got = [round(float((base / o).flatten()[0]), 3) for o in outs]
        report.off(f"calls 1, 2, 3 divide lin(x) by {got}, not by 1, 2, 3 as ScaledByStep does eagerly",
                   "start the counter at 0 and add 1 before dividing, as ScaledByStep does.")
        return False
    report.right("eagerly it does what ScaledByStep does: call k returns lin(x) / k")
    found = check_capturable(cls().to(device), torch.randn(4, 16, device=device))
    if not found.ok:
        report.off(f"check_capturable still finds {len(found.findings)} problem(s): {_first_finding(found)}",
                   "a Python number is frozen at capture; keep the counter in a tensor: "
                   "self.register_buffer('step', torch.zeros(())) and self.step.add_(1).")
        return False
    now = dict(m.named_buffers())
    moved = [n for n, (ptr, _) in before.items() if n in now and now[n].data_ptr() != ptr]
    changed = [n for n, (_, v) in before.items() if n in now and not torch.equal(now[n].detach(), v)]
    loose = [k for k, v in vars(m).items() if isinstance(v, torch.Tensor)]
    if moved:
        report.off(f"the buffer {moved[0]!r} is a new tensor after each call: a graph keeps reading the memory it "
                   "captured, so its count would never move", f"update it in place: self.{moved[0]}.add_(1), "
                   f"not self.{moved[0]} = self.{moved[0]} + 1.")
    elif not changed:
        report.off("no buffer of the module changes when it is called" + (
            f"; the counter {loose[0]!r} is a plain tensor attribute" if loose else ""),
            "register the counter as a buffer, self.register_buffer('step', torch.zeros(())): .to(DEVICE) then "
            "moves it to the GPU with the model, and it is saved in state_dict().")
    else:
        report.right(f"check_capturable finds nothing, and the count lives in the buffer {changed[0]!r}, updated "
                     "in place")
        return True
    return False


def _clip_reference(x, max_norm=1.0):
    """The section-1-style clip with a host read, in float64: the values a fixed version must give."""
    xd = x.double()
    norm = xd.norm().item()
    return (xd * (max_norm / norm) if norm > max_norm else xd).to(x.dtype)


@exercise("05_pitfalls", 2, "clipping without reading the norm on the CPU", "cpu+gpu")
@check("05.2")
def check_clip_without_sync(report, clip_to_norm_fixed, clip_verify):
    """``clip_to_norm_fixed(x, max_norm=1.0)``: ``clip_to_norm`` (scale ``x`` down to norm ``max_norm`` when it
    is larger) without a host read; ``clip_verify``: ``verify`` of its graph against it (GPU)."""
    import torch

    from ..capture import capture
    from ..diagnose import check_capturable

    fn, device = clip_to_norm_fixed, "cuda" if cuda() else "cpu"
    torch.manual_seed(0)
    big = torch.randn(256, device=device) + 2.0            # norm about 36: scaled down
    small = big * (0.5 / big.norm())                       # norm 0.5: left as it is
    cases = {"an input of norm above max_norm": big, "an input of norm below max_norm": small}
    done = not is_todo(fn)
    if not done:
        report.todo("write clip_to_norm_fixed(x, max_norm=1.0)")
    else:
        outs = {name: fn(x) for name, x in cases.items()}
        if any(not isinstance(o, torch.Tensor) for o in outs.values()):
            report.todo("clip_to_norm_fixed(x) returned no tensor: its body is still the placeholder")
            done = False
        else:
            for name, x in cases.items():
                want, got = _clip_reference(x), outs[name]
                if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
                    report.off(f"on {name} it differs from clip_to_norm (max |diff| {max_abs_diff(got, want):.2g})",
                               "scale by min(1, max_norm / norm): x * torch.clamp(max_norm / (x.norm() + 1e-6), "
                               "max=1.0) gives both cases without an if.")
                    done = False
                    break
            if done:
                report.right("it gives clip_to_norm's values above and below max_norm")
                found = check_capturable(fn, big)
                if not found.ok:
                    report.off(f"check_capturable finds {len(found.findings)} problem(s): {_first_finding(found)}",
                               "no .item(), float(), or if on a tensor: the GPU must decide, with torch.clamp or "
                               "torch.where.")
                    done = False
                else:
                    report.right("check_capturable finds nothing to stop a capture")
    if not cuda():
        report.needs_gpu("capturing it, and verify() against eager, need an NVIDIA GPU")
        return
    _check_learners_verify(report, clip_verify, "clip_verify",
                           "g = capture(clip_to_norm_fixed, X); clip_verify = verify(g, clip_to_norm_fixed, X).")
    if not done:
        return
    g = capture(fn, big)
    errs = {name: max_abs_diff(g(x), _clip_reference(x)) for name, x in cases.items()}
    bad = [name for name, e in errs.items() if not e <= 1e-4 * max(1.0, float(cases[name].abs().max()))]
    if bad:
        report.off(f"one graph, captured on a large input, is wrong on {bad[0]} (max |diff| {errs[bad[0]]:.2g})",
                   "the decision must be made on the GPU at every replay, not in Python at capture.")
    else:
        report.right("one graph, captured on a large input, clips large inputs and leaves small ones alone: "
                     "the decision runs on the GPU at every replay")


# === Notebook 04: ResNet-50 ====================================================================================

BOUNDS = ("launch-bound", "GPU-bound")


def predicted_speedup_at(batch, sweep) -> float:
    """Notebook 04's section-1 model at ``batch``: ``max(kernels × launch_us, floor) / floor``, where ``launch_us``
    is the eager host time per kernel (Python, dispatcher, ATen and the launch call, not the launch alone), with
    the floor and the kernels per call interpolated linearly between the measured batch sizes of ``sweep``
    (``curve[dtype]``: ``"eager"`` and ``"graph"`` rows indexed by batch, and ``"launch_us"``)."""
    import numpy as np

    e, g = sweep["eager"], sweep["graph"]
    floor = float(np.interp(batch, g.index.to_numpy(dtype=float), g["floor_us"].to_numpy(dtype=float)))
    kernels = float(np.interp(batch, e.index.to_numpy(dtype=float), e["kernels_per_call"].to_numpy(dtype=float)))
    return max(kernels * sweep["launch_us"], floor) / floor


@exercise("04_resnet50", 1, "predict, then measure, a batch size between two of the sweep", "cpu+gpu")
@check("04.1")
def check_batch_prediction(report, new_batch, predicted_speedup, new_graph, new_table, bound, sweep,
                           sweep_batches):
    """``new_batch``: a batch size not in ``sweep_batches`` (``INFER_BATCHES``), between two of them on a GPU;
    ``predicted_speedup``: :func:`predicted_speedup_at` from ``sweep`` (``curve[dtype]``) before measuring;
    ``new_graph``: ``capture(infer, x)`` at that batch; ``new_table``: ``compare`` of eager vs ``new_graph``;
    ``bound``: "launch-bound" or "GPU-bound" at that batch, from ``new_table``."""
    import math

    import torch

    if is_todo(new_batch):
        report.todo("new_batch: a batch size the sweep did not measure")
        return
    batches = sorted(sweep_batches)
    if not isinstance(new_batch, int) or new_batch < 1 or new_batch in batches:
        report.off(f"new_batch = {new_batch!r}: pick a positive int that INFER_BATCHES {batches} does not have")
        return
    if cuda() and not batches[0] < new_batch < batches[-1]:
        report.off(f"new_batch = {new_batch} lies outside the sweep ({batches[0]}..{batches[-1]}); the prediction "
                   "interpolates between two measured sizes", "e.g. 48, between 32 and 64.")
        return
    if is_todo(new_graph):
        report.todo("new_graph = capture(infer, x, eager_fallback=True) with x = image_batch(new_batch, dtype)")
    elif not hasattr(new_graph, "static_inputs") or not hasattr(new_graph, "fn"):
        report.off(f"new_graph is a {type(new_graph).__name__}, not what capture() returns")
        return
    elif new_graph.static_inputs[0].shape[0] != new_batch:
        report.off(f"new_graph was captured at batch {new_graph.static_inputs[0].shape[0]}, not {new_batch}")
        return
    else:
        x = torch.randn_like(new_graph.static_inputs[0])
        out, ref = new_graph(x).float(), new_graph.fn(x).float()
        diff = max_abs_diff(out, ref)
        if not (bool(torch.isfinite(ref).all()) and diff <= 1e-2 * ref.abs().max().item() + 1e-3):
            report.off(f"new_graph differs from eager on a fresh input by {diff:.3g}",
                       "capture the same infer function that the eager row times.")
            return
        report.right(f"correct before fast: the graph at batch {new_batch} matches eager on a fresh input "
                     f"(max |diff| {diff:.2g})")
    rows = table_rows(report, new_table, ["cuda graph*"],
                      todo="new_table = compare({'eager': infer, GRAPH_INFER: new_graph}, x, case=..., "
                           "samples=SAMPLES, calls=CALLS)",
                      missing="no row named 'cuda graph ...' (GRAPH_INFER) in the table",
                      hint="compare({'eager': infer, GRAPH_INFER: new_graph}, x, ...).")
    if rows is None:
        return
    (graph,) = rows
    if not cuda():
        report.right("the table has eager first and the graph row (both eager on this CPU)")
        report.needs_gpu("the prediction, the floor and launch- or GPU-bound need an NVIDIA GPU")
        return
    if graph["executed_as"] != "cuda graph":
        report.off(f"the graph row ran as {graph['executed_as']}", "time new_graph itself, captured on the GPU.")
        return
    want = predicted_speedup_at(new_batch, sweep)
    if is_todo(predicted_speedup):
        report.todo("predicted_speedup: max(kernels x launch_us, floor) / floor, interpolated at new_batch")
    elif not (isinstance(predicted_speedup, (int, float)) and math.isfinite(predicted_speedup)
              and abs(predicted_speedup - want) <= 0.02 * want):
        report.off(f"predicted_speedup = {predicted_speedup!r}, but the model of section 1 gives {want:.2f}x",
                   "floor and kernels per call: numpy.interp(new_batch, batches, values) over the sweep's graph "
                   "floor_us and eager kernels_per_call; launch_us = curve[dtype]['launch_us'].")
    else:
        report.right(f"your prediction follows section 1's host-time model: {want:.2f}x")
    eager = new_table.iloc[0]
    launches = float(eager["kernels_per_call"]) * sweep["launch_us"]
    actual = "launch-bound" if launches > graph["floor_us"] else "GPU-bound"
    if is_todo(bound):
        report.todo('bound: "launch-bound" or "GPU-bound" at new_batch (kernels x launch_us against the floor)')
    elif bound not in BOUNDS:
        report.off(f'bound must be "launch-bound" or "GPU-bound", got {bound!r}')
    elif bound != actual:
        report.off(f'you answered "{bound}", but your table says "{actual}": {eager["kernels_per_call"]:.0f} kernels x '
                   f'{sweep["launch_us"]:.1f} µs = {launches / 1e3:.2f} ms of launches against a floor of '
                   f'{graph["floor_us"] / 1e3:.2f} ms', "compare the eager row's launches with the graph row's floor.")
    else:
        report.right(f'"{bound}": {launches / 1e3:.2f} ms of launches against a floor of {graph["floor_us"] / 1e3:.2f} ms')
    report.note(f"batch {new_batch}: predicted {want:.2f}x, measured {graph['speedup']:.2f}x (quartiles "
                f"{graph['speedup_lo']:.2f}-{graph['speedup_hi']:.2f}); the graph runs at {graph['vs_floor']:.2f}x its "
                "floor. Where the two differ, eager is neither purely launch- nor purely GPU-bound: the CPU's launches "
                "and the GPU's work overlap only partly")


@exercise("04_resnet50", 2, "how often clipping acts, eager and graphed", "cpu+gpu")
@check("04.2")
def check_clip_norms(report, norms_eager, norms_graphed, clipped_fraction, max_norm, steps):
    """``norms_eager``: ``clip_grad_norm_``'s return value at each step of one epoch of the section-4 loop;
    ``norms_graphed``: ``step.grad_norm`` after each step of the graphed loop; ``clipped_fraction``: the share of
    graphed steps whose norm exceeds ``max_norm``; ``steps``: steps per epoch."""
    import torch

    if is_todo(norms_eager) or is_todo(norms_graphed):
        report.todo("record norms_eager and norms_graphed over one epoch of each loop")
        return
    lists = {"norms_eager": norms_eager, "norms_graphed": norms_graphed}
    for name, values in lists.items():
        if not isinstance(values, (list, tuple)) or len(values) != steps:
            report.off(f"{name} has {len(values) if hasattr(values, '__len__') else '?'} entries; one epoch has "
                       f"{steps} steps", "append one norm per step, for every batch of one epoch.")
            return
    tensors = [t for t in norms_graphed if isinstance(t, torch.Tensor)]
    shared = len({t.data_ptr() for t in tensors}) < len(tensors) if tensors else False
    e = torch.tensor([float(v) for v in norms_eager], dtype=torch.float64)
    g = torch.tensor([float(v) for v in norms_graphed], dtype=torch.float64)
    if shared:
        report.off("several entries of norms_graphed are one and the same tensor: each replay writes the new norm "
                   "into the memory of the last one, so they all hold the latest value",
                   "keep a copy after each step: step.grad_norm.clone() (or float(...) once the epoch is over).")
        return
    if not bool(torch.isfinite(e).all() and torch.isfinite(g).all()) or (e <= 0).any():
        report.off("some norms are not finite or not positive", "the norm clip_grad_norm_ returns, before clipping.")
        return
    rel = ((g - e).abs() / e).max().item()
    if rel > 2e-2:
        report.off(f"the graphed loop's norms differ from the eager loop's by up to {rel:.1%}",
                   "same seed and loader (small_cnn(), digits_loader(seed=1)), same schedule; record "
                   "clip_grad_norm_'s return value in the eager loop and step.grad_norm in the graphed one.")
        return
    if not cuda():
        report.right(f"the two loops give the same {steps} norms (max relative difference {rel:.1g})")
        report.needs_gpu("on a CPU both loops are eager; that the graph clips like eager shows on an NVIDIA GPU")
    else:
        report.right(f"the graph clips as the eager loop does: the norms before clipping agree within {rel:.1g} "
                     f"over {steps} steps")
    want = float((g > max_norm).double().mean())
    if is_todo(clipped_fraction):
        report.todo("clipped_fraction: the share of graphed steps whose norm is above max_norm")
    elif abs(float(clipped_fraction) - want) > 1e-9:
        report.off(f"clipped_fraction = {float(clipped_fraction):.3f}, but {int((g > max_norm).sum())} of {steps} "
                   f"norms are above {max_norm}: {want:.3f}")
    else:
        report.right(f"clipping acted on {int((g > max_norm).sum())} of {steps} steps ({want:.0%}); the largest norm "
                     f"was {g.max().item():.2f}, the smallest {g.min().item():.2f}")


# === Notebook 06: variable shapes ==============================================================================

def _padded_sizes(sizes, max_rows):
    """Request sizes up to ``max_rows`` that are not bucket sizes (so they get padded)."""
    return [n for n in range(1, max_rows + 1) if n not in set(sizes)]


def _max_verify(serve, sizes):
    """The largest ``serve.verify`` difference over requests of each size in ``sizes`` (NaN padding)."""
    import torch

    row_shape = tuple(serve.static_inputs[0].shape[1:])
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for n in sizes:
        x = torch.randn((n, *row_shape), generator=gen).to(serve.static_inputs[0])
        worst = max(worst, serve.verify(x))
    return worst


@exercise("06_variable_shapes", 1, "buckets for uniform traffic", "cpu+gpu")
@check("06.1")
def check_uniform_plan(report, uniform_sizes, uniform_plan, moved, serve_uniform, max_rows, skewed_sizes,
                       reference=None):
    """``uniform_sizes``: request sizes drawn uniformly from 1..``max_rows``; ``uniform_plan``: ``plan_buckets``
    on them with at most as many graphs as ``ladder(max_rows)``; ``moved``: "larger", "smaller" or "same" (where
    the buckets went, against a plan of as many graphs on ``skewed_sizes``); ``serve_uniform``:
    ``capture_buckets`` of the plan; ``reference``: the default ladder's ``BucketedGraphs`` (memory, GPU)."""
    import statistics

    from ..buckets import evaluate_buckets, ladder, plan_buckets

    if is_todo(uniform_sizes):
        report.todo("uniform_sizes: HISTORY sizes drawn uniformly from 1..MAX_ROWS")
        return
    sizes = list(uniform_sizes)
    if len(sizes) < 100 or not all(isinstance(s, int) and 1 <= s <= max_rows for s in sizes):
        report.off(f"uniform_sizes must be at least 100 ints in 1..{max_rows}",
                   "torch.randint(1, MAX_ROWS + 1, (HISTORY,), generator=...).tolist()")
        return
    upper = sum(s > max_rows / 2 for s in sizes) / len(sizes)
    if not 0.4 <= upper <= 0.6:
        report.off(f"{upper:.0%} of uniform_sizes lie above MAX_ROWS / 2; uniform traffic puts about half there",
                   "draw every size from 1..MAX_ROWS with equal chance (torch.randint), not from draw_sizes.")
        return
    report.right(f"{len(sizes)} sizes, {upper:.0%} of them above {max_rows // 2}: uniform traffic")
    if is_todo(uniform_plan):
        report.todo("uniform_plan = plan_buckets(uniform_sizes, max_graphs=len(ladder(MAX_ROWS)), max_size=MAX_ROWS)")
        return
    default = ladder(max_rows)
    if not hasattr(uniform_plan, "sizes") or not hasattr(uniform_plan, "pad_fraction"):
        report.off(f"uniform_plan is a {type(uniform_plan).__name__}, not the BucketPlan plan_buckets returns")
        return
    k = uniform_plan.n_graphs
    if uniform_plan.sizes[-1] != max_rows or k > len(default):
        report.off(f"the plan has {k} buckets ending at {uniform_plan.sizes[-1]}; it needs at most {len(default)} "
                   f"(the default ladder's count) and its largest at {max_rows}", "max_graphs=len(ladder(MAX_ROWS)), "
                   "max_size=MAX_ROWS.")
        return
    best = plan_buckets(sizes, max_graphs=k, max_size=max_rows)
    mine = evaluate_buckets(sizes, uniform_plan.sizes)["pad_fraction"]
    if mine > best.pad_fraction + 1e-9:
        report.off(f"on uniform_sizes your buckets pad {mine:.1%} of the rows; the planner reaches {best.pad_fraction:.1%}"
                   f" with {k}", "plan on uniform_sizes, not on history_sizes.")
        return
    ladder_pad = evaluate_buckets(sizes, default)["pad_fraction"]
    report.right(f"planned for uniform traffic: {k} buckets {uniform_plan.sizes}, {mine:.1%} of the rows padded "
                 f"against {ladder_pad:.1%} for the default ladder {default}")
    skewed = plan_buckets(list(skewed_sizes), max_graphs=k, max_size=max_rows)
    a, b = statistics.mean(uniform_plan.sizes), statistics.mean(skewed.sizes)
    actual = "larger" if a > b else "smaller" if a < b else "same"
    if is_todo(moved):
        report.todo('moved: "larger", "smaller" or "same" against the plan of as many graphs on history_sizes')
    elif moved not in ("larger", "smaller", "same"):
        report.off(f'moved must be "larger", "smaller" or "same", got {moved!r}')
    elif moved != actual:
        report.off(f'you answered "{moved}", but the buckets planned on history_sizes are {skewed.sizes} (mean '
                   f'{b:.1f}) and yours {uniform_plan.sizes} (mean {a:.1f})',
                   "plan_buckets(history_sizes, max_graphs=..., max_size=MAX_ROWS) gives the skewed plan.")
    else:
        report.right(f'"{moved}": on skewed traffic the planner puts its buckets among the many small requests '
                     f"({skewed.sizes}); uniform traffic spreads them out ({uniform_plan.sizes})")
    if is_todo(serve_uniform):
        report.todo("serve_uniform = capture_buckets(mlp, sample, sizes=uniform_plan.sizes, eager_fallback=True)")
        return
    if list(getattr(serve_uniform, "sizes", [])) != list(uniform_plan.sizes):
        report.off(f"serve_uniform has buckets {getattr(serve_uniform, 'sizes', None)}, not the plan's "
                   f"{uniform_plan.sizes}", "capture_buckets(..., sizes=uniform_plan.sizes)")
        return
    padded = _padded_sizes(serve_uniform.sizes, max_rows)
    worst = _max_verify(serve_uniform, padded)
    if not worst < 1e-4:
        report.off(f"with NaN padding a request differs from eager by {worst:g}: the padding leaked into real rows")
        return
    report.right(f"correct before fast: requests of all {len(padded)} padded sizes match eager with NaN in the "
                 f"padding (max |diff| {worst:.1e})")
    if not cuda():
        report.needs_gpu("on a CPU the buckets run eagerly; their graphs and the memory they hold need an NVIDIA GPU")
        return
    if serve_uniform.mode != "graph" or serve_uniform.pool is None:
        report.off("serve_uniform did not capture graphs into one shared pool", "capture_buckets(..., pool='shared'), "
                   "the default, on the GPU.")
        return
    from ..buckets import MemoryLedger
    ledger = MemoryLedger()
    held = ledger.record("uniform plan", serve_uniform)["held"] / 2 ** 20
    text = f"{k} graphs in one shared pool, holding {held:.1f} MiB"
    if reference is not None:
        text += f" (the default ladder: {ledger.record('default ladder', reference)['held'] / 2 ** 20:.1f} MiB)"
    report.right(text)


MIXING_WHY = {
    "a": "Attention cannot take NaN as input, so verify fails for any model with attention.",
    "b": "Each real row's output is now a weighted sum over all rows of the bucket, padding rows included: whatever "
         "the padding holds (zeros, an earlier request's rows, NaN) changes the real rows, so the answer depends on "
         "the bucket a request lands in, not on the request alone.",
    "c": "The buckets were captured for another sequence length, so the replay reads the wrong shape.",
}


@exercise("06_variable_shapes", 2, "a block whose rows see each other", "cpu")
@check("06.2")
def check_batch_mixing(report, BatchMixingBlock, mixing_leak, why, d_block, heads, sample):  # noqa: N803
    """``BatchMixingBlock``: section 2's ``Block`` with attention across the requests (the batch dim);
    ``mixing_leak``: ``verify`` of its buckets on a padded request; ``why``: "a", "b" or "c" (``MIXING_WHY``);
    ``d_block``, ``heads``: the block's sizes; ``sample``: a request-like tensor of the block's rows."""
    import math

    import torch

    from ..buckets import capture_buckets

    if is_todo(BatchMixingBlock):
        report.todo("write the class BatchMixingBlock")
    elif not (isinstance(BatchMixingBlock, type) and issubclass(BatchMixingBlock, torch.nn.Module)):
        report.off(f"BatchMixingBlock is a {type(BatchMixingBlock).__name__}; pass the class")
    elif "forward" not in vars(BatchMixingBlock):
        report.todo("BatchMixingBlock has no forward of its own yet: its body is still the placeholder")
    else:
        torch.manual_seed(0)
        model = BatchMixingBlock(d_block, heads).to(sample.device).eval()
        x = sample[:5].clone()
        with torch.no_grad():
            out = model(x)
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                report.todo(f"BatchMixingBlock()(x) returned {type(out).__name__}"
                            + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else "")
                            + f"; a block returns its input's shape {tuple(x.shape)}")
                model = None
            else:
                y = x.clone()
                y[-1] = torch.randn(y[-1].shape, generator=torch.Generator().manual_seed(1)).to(y)  # the last only
                changed = (model(y)[:-1] - out[:-1]).abs().max().item()
                if changed <= 1e-5 * out.abs().max().item():  # rounding at most: the rows do not mix
                    report.off("changing one request leaves the others' outputs unchanged: its rows still do not "
                               "see each other", "let attention run over dim 0: e.g. transpose(0, 1) before and after "
                               "Block.forward, so the requests become the sequence.")
                    model = None
                else:
                    report.right(f"changing one request changes the others' outputs (by up to {changed:.2g}): "
                                 "attention now runs across the requests")
        if model is not None:
            serve = capture_buckets(model, sample, eager_fallback=True)
            leak = _max_verify(serve, [n for n in _padded_sizes(serve.sizes, sample.shape[0])][:3])
            if math.isinf(leak):
                report.right("verify reports inf: NaN in the padding reached the real rows")
            else:
                report.off(f"verify on its buckets reports {leak:g}, not inf")
    if is_todo(mixing_leak):
        report.todo("mixing_leak: capture_buckets(model, sample, eager_fallback=True).verify(x) for a padded x")
    elif not (isinstance(mixing_leak, float) and math.isinf(mixing_leak)):
        report.off(f"mixing_leak = {mixing_leak!r}; verify of the mixing block on a padded request reports inf",
                   "x must have a size that is not a bucket (e.g. 3 rows), so that there is padding to poison.")
    else:
        report.right("your verify() call reports inf too")
    if is_todo(why):
        report.todo('why: "a", "b" or "c" (MIXING_WHY)')
    elif why != "b":
        report.off(f'"{why}" is not it: {MIXING_WHY.get(why, "not one of a, b, c")}',
                   "what does each real row's output depend on, once attention runs over the requests?")
    else:
        report.right("b: the padding becomes part of every request's answer; only functions whose rows never see "
                     "each other may be padded")


# === Notebook 07: data parallel ================================================================================

def _rank_spread(steps) -> dict:
    """{variant: (rank_median_spread_us, step_rank_diff_p99_us)} from per-step, per-rank times, as the script
    computes them (``cudagraph_kit.ddp.jitter_summary``)."""
    from ..ddp import jitter_summary

    table = jitter_summary(steps)
    return {v: (r, p) for v, r, p in zip(table["variant"], table["rank_median_spread_us"],
                                          table["step_rank_diff_p99_us"])}


@exercise("07_data_parallel", 1, "the spread across ranks, from the raw step times", "cpu")
@check("07.1")
def check_rank_spread(report, rank_spread, local_steps):
    """``rank_spread``: ``{variant: (slowest minus fastest rank's median µs, p99 over steps of the slowest minus
    the fastest rank's step µs)}`` computed from ``local_steps`` (section 4: case, variant, rank, step, step_us)."""
    import numpy as np

    if is_todo(rank_spread):
        report.todo("rank_spread: {variant: (median spread, per-step p99 spread)} from local_steps")
        return
    want = _rank_spread(local_steps)
    if not isinstance(rank_spread, dict) or set(rank_spread) != set(want):
        report.off(f"rank_spread needs one entry per variant of local_steps, {sorted(want)}; got "
                   f"{sorted(rank_spread) if isinstance(rank_spread, dict) else type(rank_spread).__name__}",
                   "group local_steps by variant.")
        return
    ok = True
    for variant, (med, p99) in want.items():
        got = rank_spread[variant]
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            report.off(f"rank_spread[{variant!r}] must be a pair (median spread, per-step p99 spread)")
            return
        if not np.isclose(float(got[0]), med, rtol=1e-6, atol=1e-6):
            ok = False
            report.off(f"{variant}: the spread of the ranks' medians is {med:.1f} µs, you have {float(got[0]):.1f}",
                       "the median step time of each rank (groupby('rank').step_us.median()), then max - min.")
        if not np.isclose(float(got[1]), p99, rtol=1e-6, atol=1e-6):
            ok = False
            report.off(f"{variant}: the p99 over steps of (slowest - fastest rank) is {p99:.1f} µs, you have "
                       f"{float(got[1]):.1f}", "pivot to one column per rank (pivot_table(index='step', "
                       "columns='rank', values='step_us')), max - min per row, then its 0.99 quantile "
                       "(linear interpolation, the pandas default).")
    if ok:
        parts = [f"{v}: medians {m:.0f} µs apart, per step up to {p:.0f} µs at the p99" for v, (m, p) in want.items()]
        report.right("your numbers are the script's: " + "; ".join(parts))
        if len(want) > 1 and "eager" in want:
            graph = next((v for v in want if v != "eager"), None)
            report.note(f"eager to {graph}: the per-step spread went from {want['eager'][1]:.0f} to "
                        f"{want[graph][1]:.0f} µs at the p99; every step of DDP waits for its slowest rank")


@exercise("07_data_parallel", 2, "what a loss.item() per step costs a graphed DDP step", "cpu+gpu")
@check("07.2")
def check_item_per_step(report, item_table, item_cost_us, keeps_lead):
    """``item_table``: ``compare`` of rows "eager", "whole-step graph" and "whole-step graph + loss.item()" (one
    process, a DDP model); ``item_cost_us``: the last two medians' difference; ``keeps_lead``: whether the graph
    with a ``loss.item()`` per step is still faster than eager (its speedup > 1)."""
    rows = table_rows(report, item_table, ["whole-step graph", "whole-step graph + loss.item()"],
                      todo="item_table = compare({'eager': ..., 'whole-step graph': step, "
                           "'whole-step graph + loss.item()': ...}, x, y, ...)",
                      missing="the table needs rows 'whole-step graph' and 'whole-step graph + loss.item()'",
                      hint="one compare() with eager first.")
    if rows is None:
        return
    graph, synced = rows
    diff = synced["median_us"] - graph["median_us"]
    if is_todo(item_cost_us):
        report.todo("item_cost_us: the '+ loss.item()' row's median_us minus the 'whole-step graph' row's")
    elif abs(float(item_cost_us) - diff) > max(0.05, 0.02 * abs(diff)):
        report.off(f"item_cost_us = {float(item_cost_us):.1f}, but the table says {diff:.1f} µs")
    else:
        report.right(f"item_cost_us agrees with the table: {diff:.1f} µs")
    if not cuda():
        report.needs_gpu("on a CPU every row is eager DDP (gloo); the graph and what a synchronize costs it need "
                         "an NVIDIA GPU")
        return
    if graph["executed_as"] != "cuda graph" or synced["executed_as"] != "cuda graph":
        report.off("a 'whole-step graph' row did not run as a CUDA graph",
                   "time the step from capture_train_step on a DDP model built with ddp_for_graphs, on the GPU.")
        return
    lead = bool(synced["speedup"] > 1)
    if is_todo(keeps_lead):
        report.todo("keeps_lead: is the '+ loss.item()' row still faster than eager (speedup > 1)?")
    elif bool(keeps_lead) != lead:
        report.off(f"keeps_lead = {keeps_lead}, but that row's speedup is {synced['speedup']:.2f}")
    else:
        report.right(f"with a loss.item() per step the graph runs at {synced['speedup']:.2f}x eager, against "
                     f"{graph['speedup']:.2f}x without: the synchronize costs {diff:.1f} µs a step, because the CPU "
                     "can no longer queue the next replay while the GPU runs this one")


# === Notebook 08: LLM decoding ================================================================================

@exercise("08_llm_decode", 1, "buckets for the serving loop, and what a padding row costs", "cpu+gpu")
@check("08.1")
def check_decode_buckets(report, few_buckets, serve_few, few_tokens, pad_fraction, history, observed, max_batch,
                         eager_tokens):
    """``few_buckets``: ``plan_buckets(history, max_graphs=4, max_size=max_batch)``; ``serve_few``: its
    ``capture_buckets`` of the decode step; ``few_tokens``: ``{request id: tokens}`` recorded by the serving loop
    through ``serve_few``; ``pad_fraction``: the share of padding rows on ``observed`` (the stream's batch sizes);
    ``eager_tokens``: the eager loop's record."""
    from ..buckets import evaluate_buckets, plan_buckets

    if is_todo(few_buckets):
        report.todo("few_buckets = plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)")
        return
    if not hasattr(few_buckets, "sizes") or not hasattr(few_buckets, "n_graphs"):
        report.off(f"few_buckets is a {type(few_buckets).__name__}, not the BucketPlan plan_buckets returns")
        return
    if few_buckets.n_graphs > 4 or few_buckets.sizes[-1] != max_batch:
        report.off(f"the plan has {few_buckets.n_graphs} buckets {few_buckets.sizes}; it needs at most 4, the largest "
                   f"at {max_batch}", "plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)")
        return
    best = plan_buckets(list(history), max_graphs=4, max_size=max_batch)
    mine = evaluate_buckets(list(history), few_buckets.sizes)["pad_fraction"]
    if mine > best.pad_fraction + 1e-9:
        report.off(f"on the history your buckets pad {mine:.1%} of the rows; the planner reaches {best.pad_fraction:.1%}",
                   "plan on `history`, the earlier stream's batch sizes.")
        return
    report.right(f"4 buckets {few_buckets.sizes}: {mine:.1%} of the rows padded on the history")
    if is_todo(pad_fraction):
        report.todo('pad_fraction = evaluate_buckets(observed, few_buckets.sizes)["pad_fraction"]')
    else:
        want = evaluate_buckets(list(observed), few_buckets.sizes)["pad_fraction"]
        if not isinstance(pad_fraction, (int, float)) or abs(float(pad_fraction) - want) > 1e-9:
            report.off(f"pad_fraction = {pad_fraction!r}, but on this stream the buckets pad {want:.4f} of the rows",
                       "evaluate_buckets on `observed` (this stream), not on the history.")
        else:
            report.right(f"on this stream {want:.1%} of the computed rows are padding")
    if is_todo(serve_few):
        report.todo("serve_few = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=few_buckets.sizes, "
                    "eager_fallback=True)")
        return
    if list(getattr(serve_few, "sizes", [])) != list(few_buckets.sizes):
        report.off(f"serve_few has buckets {getattr(serve_few, 'sizes', None)}, not the plan's {few_buckets.sizes}",
                   "capture_buckets(..., sizes=few_buckets.sizes)")
        return
    if is_todo(few_tokens):
        report.todo("few_tokens: a dict passed as serve(serve_few, stream, record=few_tokens)")
        return
    if not isinstance(few_tokens, dict) or not few_tokens:
        report.off("few_tokens must be the dict that serve(..., record=...) filled", "few_tokens = {}; "
                   "serve(serve_few, stream, record=few_tokens)")
        return
    same = sum(few_tokens.get(rid) == toks for rid, toks in eager_tokens.items())
    if same != len(eager_tokens):
        report.off(f"{len(eager_tokens) - same} of {len(eager_tokens)} requests decoded differently from eager",
                   "padding rows must only ever write cache rows no request uses: keep the active requests in rows "
                   "0..n-1 (serve does) and pad with token 0 at position 0.")
        return
    report.right(f"all {same} requests decoded exactly as eager through {few_buckets.n_graphs} buckets")
    if not cuda():
        report.needs_gpu("on a CPU the buckets run eagerly; their graphs and shared pool need an NVIDIA GPU")
        return
    if serve_few.mode != "graph" or serve_few.pool is None:
        report.off("serve_few did not capture graphs into one shared pool", "capture_buckets(..., pool='shared'), the "
                   "default, on the GPU.")
        return
    report.right(f"{few_buckets.n_graphs} graphs in one shared pool, captured in {serve_few.capture_seconds:.2f} s")


TIE_WHY = {
    "a": "The static cache is wrong in bfloat16: it writes keys and values at the wrong positions.",
    "b": "At that step the two best logits were closer than bfloat16 rounding moves them: the cached decode and the "
         "full recompute sum in different orders (grouped queries over the cache vs the whole sequence), round "
         "differently, and a near tie falls the other way; from there on the two texts differ.",
    "c": "bfloat16 cannot hold token ids above 256, so argmax returns a wrong id.",
}


@exercise("08_llm_decode", 2, "bfloat16 and near ties", "cpu")
@check("08.2")
def check_low_precision_ties(report, bf16_tokens, bf16_reference, bf16_divergence, tie_why, prompt, cfg, seed,
                             new_tokens):
    """``bf16_tokens``/``bf16_reference``: greedy tokens of the bfloat16 model with the static cache and without a
    cache, on ``prompt``; ``bf16_divergence``: ``first_divergence`` of the two with their logits; ``tie_why``: "a",
    "b" or "c" (``TIE_WHY``). ``cfg``, ``seed``, ``new_tokens``: the notebook's model and generation length."""
    import math

    import torch

    from .tiny_llm import StaticKVCache, TinyLLM, first_divergence, greedy_generate, greedy_generate_no_cache

    if is_todo(bf16_tokens) or is_todo(bf16_reference):
        report.todo("bf16_tokens and bf16_reference: greedy_generate / greedy_generate_no_cache on the bfloat16 model")
        return
    shape = (prompt.shape[0], new_tokens)
    for name, t in (("bf16_tokens", bf16_tokens), ("bf16_reference", bf16_reference)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            report.off(f"{name} must be a tensor of shape {shape} (one row per prompt, NEW_TOKENS tokens), got "
                       f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            return
    with torch.no_grad():
        model = TinyLLM(cfg, seed=seed, device=prompt.device, dtype=torch.bfloat16).eval()
        cache = StaticKVCache(cfg, prompt.shape[0], prompt.shape[1] + new_tokens, device=prompt.device,
                              dtype=torch.bfloat16)
        mine_l, ref_l = [], []
        want = greedy_generate(model, cache, prompt, new_tokens, logits_out=mine_l)
        want_ref = greedy_generate_no_cache(model, prompt, new_tokens, logits_out=ref_l)
    if not torch.equal(bf16_tokens.cpu(), want.cpu()) or not torch.equal(bf16_reference.cpu(), want_ref.cpu()):
        report.off("your tokens are not those of the bfloat16 model built from the notebook's seed",
                   "TinyLLM(CFG, seed=SEED, device=DEVICE, dtype=torch.bfloat16) and a StaticKVCache of the same "
                   "dtype; greedy_generate(model, cache, prompts[MAX_BATCH], NEW_TOKENS).")
        return
    truth = first_divergence(want, want_ref, mine_l, ref_l)
    report.right(f"bfloat16 tokens reproduced; with the static cache and without it they are "
                 f"{'identical' if truth['equal'] else 'different'}")
    if is_todo(bf16_divergence):
        report.todo("bf16_divergence = first_divergence(bf16_tokens, bf16_reference, logits, reference logits)")
        return
    if not isinstance(bf16_divergence, dict) or bf16_divergence.get("equal") != truth["equal"] or \
            bf16_divergence.get("first_step") != truth["first_step"]:
        report.off(f"bf16_divergence says {bf16_divergence!r}; the tokens first differ at step {truth['first_step']}",
                   "first_divergence(bf16_tokens, bf16_reference, <its logits_out>, <the reference's logits_out>)")
        return
    if truth["equal"]:
        report.note("no divergence on this run's prompts: the question below is about what happens when there is one")
    else:
        m, d = bf16_divergence.get("margin", math.nan), bf16_divergence.get("logit_diff", math.nan)
        if not (isinstance(m, float) and isinstance(d, float)) or math.isnan(m) or math.isnan(d):
            report.off("bf16_divergence has no margin and logit_diff: pass both logits lists to first_divergence")
            return
        report.right(f"first difference at step {truth['first_step']}: eager's two best logits {m:.3g} apart, the two "
                     f"computations' logits up to {d:.3g} apart ({'a near tie' if d >= m else 'not a near tie'})")
    if is_todo(tie_why):
        report.todo('tie_why: "a", "b" or "c" (TIE_WHY)')
    elif tie_why != "b":
        report.off(f'"{tie_why}" is not it: {TIE_WHY.get(tie_why, "not one of a, b, c")}',
                   "compare the margin with logit_diff: what decided the token?")
    else:
        report.right("b: rounding decides near ties; compare low-precision variants with a logit tolerance, and "
                     "expect their texts to part at near ties")


@exercise("08_llm_decode", 3, "four tokens per replay, stopping on the GPU", "cpu+gpu")
@check("08.3")
def check_k_step_decode(report, k4_block, k4_graph, k4_tokens, model, cache, prompt, stop_token, new_tokens,
                        pad_token=0):
    """``k4_block(tokens, pos, done, stop) -> (b, 4)``: four greedy decode steps that update their state in place;
    ``k4_graph``: the kit's ``capture`` of it; ``k4_tokens``: ``generate_blocks`` through ``k4_graph`` for
    ``prompt`` with ``stop_token``. ``model``/``cache``: the notebook's (the check decodes one step per token on
    them for the reference)."""
    import torch

    from .decode import decode_state, generate_blocks, stop_after
    from .tiny_llm import greedy_generate

    if is_todo(k4_block):
        report.todo("k4_block: def k4_block(tokens, pos, done, stop): four steps of decode_step, in place")
        return
    with torch.no_grad():
        want = stop_after(greedy_generate(model, cache, prompt, new_tokens), stop_token, pad_token)
        first = model.prefill(prompt, cache).argmax(-1)
        state = decode_state(first, prompt.shape[1], stop_token)
        try:
            block = k4_block(*state)
        except Exception as exc:  # noqa: BLE001 - a learner's function: report, never raise
            report.off(f"k4_block(tokens, pos, done, stop) raised {type(exc).__name__}: {exc}")
            return
    if not isinstance(block, torch.Tensor) or tuple(block.shape) != (prompt.shape[0], 4):
        report.off(f"k4_block must return the block's tokens, shape {(prompt.shape[0], 4)}, got "
                   f"{tuple(block.shape) if isinstance(block, torch.Tensor) else type(block).__name__}",
                   "torch.stack(the four argmax tokens, dim=1)")
        return
    hint = "each step: nxt = decode_step(tokens, pos).argmax(-1).masked_fill(done, PAD); then done |= nxt == stop"
    if not torch.equal(block.cpu(), want[:, 1:5].cpu()):
        report.off("the block's tokens are not the next four greedy tokens (pad after the stop token)", hint)
        return
    if not (state[1] == prompt.shape[1] + 4).all() or not torch.equal(state[0], block[:, -1]):
        report.off("the state did not move on: after the block, tokens must hold its last tokens and pos the next "
                   "position", "update in place (tokens.copy_(nxt), pos.add_(1), done.logical_or_(...)): a graph "
                   "replays on the same tensors, so an update by rebinding a name is lost")
        return
    with torch.no_grad():
        state = decode_state(first, prompt.shape[1], stop_token)
        eager = generate_blocks(lambda: k4_block(*state), state, first, new_tokens, 4, pad_token)
    if not torch.equal(eager.cpu(), want.cpu()):
        report.off("run block after block, the tokens are not the next greedy tokens with pad after the stop token",
                   hint)
        return
    report.right("four greedy tokens per call, the state updated in place, stopped rows padded")
    if is_todo(k4_graph) or is_todo(k4_tokens):
        report.todo("k4_graph = capture(...) of k4_block, and k4_tokens = generate_blocks(k4_graph.replay, ...)")
        return
    if not hasattr(k4_graph, "replay") or not hasattr(k4_graph, "static_inputs"):
        report.off(f"k4_graph is a {type(k4_graph).__name__}, not what capture() returns")
        return
    if not isinstance(k4_tokens, torch.Tensor) or not torch.equal(k4_tokens.cpu(), want.cpu()):
        report.off("k4_tokens differ from one step per token with the same stop rule",
                   "load_state(k4_graph.static_inputs, decode_state(first, PROMPT_LEN, stop_token)) before "
                   "generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)")
        return
    report.right(f"{new_tokens} tokens per sequence through the captured block, identical to one step per token")
    if not cuda():
        report.needs_gpu("on a CPU the block ran eagerly; capturing it in one graph needs an NVIDIA GPU")
    elif getattr(k4_graph, "mode", None) != "graph":
        report.off("k4_graph ran eagerly", "capture(...) on the GPU, without a failure")
    else:
        report.right("one CUDA graph replay per four tokens")
