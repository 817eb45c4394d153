"""How the notebooks' exercises are checked: each check says what is right, what is off, and gives a hint.

A learner fills in an exercise cell (every ``...`` is a placeholder that runs without error) and runs the check
cell below it. A check never raises on a wrong answer; it returns a :class:`CheckResult` that prints one line per
thing it looked at:

- ``✔`` right; ``✘`` off, with a hint; ``…`` not done yet (a ``...`` is still there);
- ``⏸`` a part that needs an NVIDIA GPU. On a CPU a check verifies only what is honest there (correctness
  against eager, labels, error messages); timings, floors and kernel counts wait for a GPU run.

Its status is ``correct``, ``CPU part correct`` (everything a CPU can check is right), ``not done yet`` or
``not right yet``; ``result.ok`` is True for the first two.

Adding exercises to a notebook: write its checks in that notebook's module beside this one (``nbNN_<name>.py``, the
name of its solutions file: ``@exercise(stem, number, title, runs_on)`` above ``@check(...)``), one
``exercise_<k>`` function per exercise in ``notebooks/solutions/nbNN_<name>.py``, the exercise cells at the end of
the notebook, and a test in ``tests/test_exercises.py`` that runs the solution against its check (``EXERCISES``
lists them all).

Example::

    from cudagraph_kit.course.exercises.nb01_gelu import check_fused_gelu
    check_fused_gelu(fused_gelu, fused_table, reference=main_table)   # in a notebook: prints the result
"""
from __future__ import annotations

import functools
import inspect
import traceback
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["CheckResult", "Report", "check", "exercise", "is_todo", "Exercise", "EXERCISES", "CORRECT",
           "CPU_PART_CORRECT", "NOT_DONE", "NOT_RIGHT", "NOTEBOOK_MODULES", "load_all"]

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
    """Smallest ``numel`` at which the graph row's speedup is below ``threshold`` (None: not reached): the point
    estimate 01's exercise 2 asks for."""
    names = sweep["variant"].astype(str).str.replace(" (eager fallback)", "", regex=False)
    graph = sweep[names.str.startswith("graph")]
    below = graph[graph["speedup"] < threshold]
    return int(below["numel"].min()) if len(below) else None


def _fmt_numel(n) -> str:
    return "not reached in the sweep" if n is None else f"{n:,} elements"


def _graph_row(df):
    return row(df, "graph*")


NOTEBOOK_MODULES = [f"cudagraph_kit.course.exercises.{name}" for name in (  # one per notebook's checks
    "nb01_gelu", "nb02_train_step", "nb03_jit_compile", "nb04_resnet50",
    "nb05_pitfalls", "nb06_variable_shapes", "nb07_data_parallel", "nb08_llm_decode")]


def load_all() -> list:
    """Import every notebook's checks (``nb01_gelu`` ... ``nb08_llm_decode``), which fills ``EXERCISES``; returns
    the modules."""
    import importlib
    return [importlib.import_module(name) for name in NOTEBOOK_MODULES]

