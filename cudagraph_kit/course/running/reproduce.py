"""Execute the kit's notebooks headless (jupytext source -> papermill) and refresh their results.

Every notebook lives in ``notebooks/`` of a source checkout as a jupytext ``py:percent`` file (the source of
truth) next to the executed ``.ipynb`` that carries the outputs of a real GPU run. ``reproduce`` runs each one
into a staging folder and publishes it (executed copy and results together) only when it finished without
error, so an interrupted or failed run never leaves a half-executed notebook or a half-written results folder.

Example::

    from cudagraph_kit.course.running.reproduce import execute_notebook
    execute_notebook("notebooks/01_gelu.py", "/tmp/01_gelu.ipynb", parameters={"SMOKE": True},
                     results_dir="/tmp/results", progress=True)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

from .paths import (FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT, notebook_sources, repository_url,  # noqa: F401
                    require_checkout)

ENGINE_NAME = "cudagraph-kit"  # papermill's nbclient engine plus a line per cell (registered below)


def to_ipynb(source: Path, target: Path) -> Path:
    """Write the jupytext ``source`` as a notebook at ``target`` (Python 3 kernel, GPU runtime for Colab)."""
    import jupytext

    nb = jupytext.read(Path(source))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["accelerator"] = "GPU"  # Colab: open with a GPU runtime
    nb.metadata.setdefault("colab", {})["gpuType"] = "T4"
    nb.metadata.pop("jupytext", None)  # no pairing: saving a notebook never rewrites another file
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}.{os.getpid()}.tmp.ipynb")
    try:
        jupytext.write(nb, partial)
        os.replace(partial, target)  # whole or not at all
    finally:
        partial.unlink(missing_ok=True)
    return target


# ------------------------------------------------------------------------------------------------ execution
def _kernel_config():
    """Kernel-manager settings for papermill: encrypted kernel transport where jupyter_client offers it.

    ipykernel 7 logs "Kernel is running over TCP without encryption" at every kernel start unless the kernel
    manager provisions CurveZMQ keys, which recent jupyter_client does with ``transport_encryption="auto"``
    for kernels whose kernelspec declares ``supported_encryption: curve`` (ipykernel 7's does). Versions
    without that policy setting are left alone (older ipykernels do not warn).
    """
    from traitlets.config import Config
    config = Config()
    try:
        import zmq
        from jupyter_client.manager import KernelManager
    except ImportError:
        return config
    trait = KernelManager.class_traits().get("transport_encryption")
    if trait is not None and "auto" in (getattr(trait, "values", None) or ()) and zmq.has("curve"):
        config.KernelManager.transport_encryption = "auto"
    return config


def _register_engine() -> None:
    from papermill.engines import NBClientEngine, papermill_engines

    class CellProgressEngine(NBClientEngine):
        """papermill's nbclient engine that calls ``on_cell_start(cell)`` before each cell runs."""

        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, on_cell_start=None, **kwargs):
            if on_cell_start is not None:
                start = nb_man.cell_start

                def cell_start(cell, cell_index=None, **kw):
                    on_cell_start(cell)
                    return start(cell, cell_index, **kw)
                nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register(ENGINE_NAME, CellProgressEngine)


def _first_line(source: str, width: int = 64) -> str:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    text = lines[0] if lines else "(comments only)"
    return text if len(text) <= width else text[:width - 3] + "..."


def recorded_durations(executed_ipynb: Path) -> dict:
    """Seconds per code cell (keyed by the cell's source) and in total, from a notebook papermill executed."""
    try:
        nb = json.loads(Path(executed_ipynb).read_text())
    except (OSError, ValueError):
        return {}
    durations = {}
    for cell in nb.get("cells", []):
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell.get("cell_type") == "code" and seconds is not None:
            durations["".join(cell["source"])] = float(seconds)
    total = nb.get("metadata", {}).get("papermill", {}).get("duration")
    if total is not None:
        durations[None] = float(total)
    return durations


def _this_gpu():
    """The name of this machine's first GPU, None without CUDA."""
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def cell_records(source: Path, gpu, smoke: bool, out_dir=None) -> dict:
    """Seconds per cell (by source) on the newest recorded run of this notebook of the same kind: the same GPU (None:
    the CPU) and size. Looked for in the executed copy a previous ``reproduce`` left in ``out_dir`` (a CPU or
    --smoke run's build/notebooks), then in the committed notebook (a full GPU run). {} when neither matches: a
    time on another device or size would mislead (the watchdog's limits, the per-cell notes)."""
    source = Path(source)
    candidates = [Path(out_dir) / f"{source.stem}.ipynb"] if out_dir is not None else []
    candidates.append(source.with_suffix(".ipynb"))
    for path in dict.fromkeys(candidates):
        try:
            meta = json.loads(path.read_text()).get("metadata", {})
        except (OSError, ValueError):
            continue
        run = (meta.get("cudagraph_kit") or {}).get("run")
        if run is not None:
            same = run.get("gpu") == gpu and bool(run.get("smoke")) == bool(smoke)
        else:  # executed before runs were named: a committed GPU run at full size
            same = gpu is not None and not smoke and recorded_device(path) == gpu
        if same:
            return recorded_durations(path)
    return {}


def _cell_printer(code_cells: int, recorded: dict):
    count = [0]

    def on_cell_start(cell):
        if cell.cell_type != "code":
            return
        count[0] += 1
        took = recorded.get(cell.source)
        note = f"   [{took:.0f} s on the recorded run]" if took is not None and took >= 1 else ""
        print(f"    cell {count[0]:>2}/{code_cells}  {_first_line(cell.source)}{note}", flush=True)
    return on_cell_start


def _path_replacements() -> list:
    pairs = [(str(PROJECT_ROOT), "<checkout>")]
    for key in ("purelib", "platlib"):
        pairs.append((sysconfig.get_paths()[key], "<site-packages>"))
    pairs.append((str(Path.home()) + os.sep, "~" + os.sep))
    return sorted(set(pairs), key=lambda p: -len(p[0]))


def strip_machine_paths(nb) -> None:
    """Remove this machine's absolute paths from an executed notebook (in place): papermill's input/output
    paths, and the checkout, site-packages and home folders in outputs (printed paths, warnings, tracebacks)."""
    nb.metadata.get("papermill", {}).pop("input_path", None)
    nb.metadata.get("papermill", {}).pop("output_path", None)
    pairs = _path_replacements()

    def clean(text):
        if isinstance(text, list):
            return [clean(t) for t in text]
        if not isinstance(text, str):
            return text
        for old, new in pairs:
            text = text.replace(old, new)
        return text

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = clean(out["text"])
            if "traceback" in out:
                out["traceback"] = clean(out["traceback"])
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/"):
                    out["data"][mime] = clean(value)


def execute_notebook(source, output, parameters: dict | None = None, results_dir=None,
                     timeout_s: int | None = None, progress: bool = False, run: dict | None = None,
                     recorded: dict | None = None, limits=None, kernel_settings: dict | None = None) -> Path:
    """Execute one notebook source with papermill; return the executed ``.ipynb`` (machine paths stripped).

    ``results_dir`` (if given) is where the notebook's ``results.save`` writes (``CGK_RESULTS_DIR``).
    The notebook runs with its folder as the working directory and the project on ``PYTHONPATH``.
    ``progress=True`` prints a line as each code cell starts, with its time on the recorded run. ``run`` (from
    ``reproduce``) is recorded in the ``env.json`` of each result the notebook saves (``CGK_RUN``).

    Every cell is watched (:mod:`.watchdog`): past its stall limit every thread's Python stack in the kernel goes to
    stderr (and to ``<output stem>.stacks.txt``); past its stop limit the cell is stopped and
    :class:`~.watchdog.CellStalled` says which cell, its recorded time and where the stacks are. The limits come
    from ``recorded`` (seconds per cell source; default: the committed notebook's, if it ran on this GPU) and
    ``limits`` (a :class:`~.watchdog.CellLimits`); ``timeout_s`` caps every cell's stop limit.
    ``kernel_settings`` go to the kernel hook (:mod:`.kernel_hook`: a GPU memory cap, a peak-memory record).
    """
    import nbformat
    import papermill
    from nbclient.exceptions import CellTimeoutError

    from .watchdog import CellWatch

    source, output = Path(source), Path(output)
    unexecuted = output.with_name(output.stem + ".input.ipynb")
    to_ipynb(source, unexecuted)
    if recorded is None:
        committed = source.with_suffix(".ipynb")
        on = recorded_device(committed)
        recorded = recorded_durations(committed) if on is not None and on == _this_gpu() else {}
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(unexecuted, as_version=4).cells)
    code_cells += 1 if parameters else 0  # papermill adds a cell with the injected parameters
    stacks = output.with_name(output.stem + ".stacks.txt")
    watch = CellWatch(output.with_name(f".{output.stem}.kernel"), stacks, recorded, limits, code_cells,
                      kernel_settings, cap_s=timeout_s)
    printer = _cell_printer(code_cells, recorded) if progress else None

    def on_cell_start(cell):
        watch.on_cell_start(cell)
        if printer is not None:
            printer(cell)
    hook_env = watch.environment()
    saved = {k: os.environ.get(k) for k in ("CGK_RESULTS_DIR", "PYTHONPATH", "CGK_RUN", *hook_env)}
    try:
        if results_dir is not None:
            os.environ["CGK_RESULTS_DIR"] = str(results_dir)
        if run is not None:
            os.environ["CGK_RUN"] = json.dumps(run)
        os.environ.update(hook_env)  # the kernel's IPython startup file installs the hook
        paths = [str(PROJECT_ROOT)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        _register_engine()
        with watch:
            try:
                papermill.execute_notebook(
                    str(unexecuted), str(output), parameters=parameters or {}, cwd=str(source.parent),
                    kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
                    engine_name=ENGINE_NAME, config=_kernel_config(), on_cell_start=on_cell_start,
                    timeout_func=watch.timeout_func, on_cell_executed=watch.on_cell_executed,
                    kernel_manager_class=watch.kernel_manager_class(),
                )
            except CellTimeoutError as exc:
                stalled = watch.stalled()
                if stalled is None:
                    raise
                raise stalled from exc
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        unexecuted.unlink(missing_ok=True)
        shutil.rmtree(watch.folder, ignore_errors=True)
        if stacks.is_file() and stacks.stat().st_size == 0:
            stacks.unlink()  # no cell stalled
        if output.is_file():  # also after a failed cell: papermill saved the notebook with its error
            nb = nbformat.read(output, as_version=4)
            strip_machine_paths(nb)
            nbformat.write(nb, output)
    return output


def _slow_cells(executed_ipynb: Path, min_s: float = 5.0) -> list:
    """(seconds, section heading, first code line) of the cells that took at least ``min_s``, slowest first."""
    try:
        nb = json.loads(Path(executed_ipynb).read_text())
    except (OSError, ValueError):
        return []
    heading, slow = "", []
    for cell in nb.get("cells", []):
        text = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            heading = next((ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("#")), heading)
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell.get("cell_type") == "code" and seconds is not None and seconds >= min_s:
            slow.append((float(seconds), heading, _first_line(text, 40)))
    return sorted(slow, reverse=True)


def recorded_device(executed_ipynb: Path):
    """The GPU an executed notebook ran on (its run record, else its results' env.json); None if unknown or CPU."""
    try:
        meta = json.loads(Path(executed_ipynb).read_text()).get("metadata", {})
    except (OSError, ValueError):
        return None
    gpu = (meta.get("cudagraph_kit", {}).get("run") or {}).get("gpu")
    if gpu is None and (FIGURES_DIR / Path(executed_ipynb).stem / "env.json").is_file():
        gpu = json.loads((FIGURES_DIR / Path(executed_ipynb).stem / "env.json").read_text()).get("gpu")
    return gpu


def _time_records(results_dir) -> list:
    """Every ``reproduce_times*.json`` of the recorded figures/ and of ``results_dir`` (a CPU run's build/figures)."""
    paths = sorted(FIGURES_DIR.glob("reproduce_times*.json"))
    if results_dir is not None and Path(results_dir).resolve() != FIGURES_DIR.resolve():
        paths += sorted(Path(results_dir).glob("reproduce_times*.json"))
    records = []
    for path in paths:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def _forecast(src: Path, gpu=None, smoke: bool = False, results_dir=None) -> str:
    """How long this notebook took on a recorded run on the same kind of device (``gpu``, None for the CPU) and
    size, and its slowest cells there; said before it starts. No such run: no forecast (another device's time
    would mislead: a CPU run is not a GPU run)."""
    device = gpu or "the CPU"
    same = [r for r in _time_records(results_dir) if r.get("gpu") == gpu and bool(r.get("smoke")) == smoke
            and r.get("notebooks", {}).get(src.stem) is not None]
    if not same:
        return f"no recorded run on {device}{' at --smoke size' if smoke else ''} to forecast from"
    newest = max(same, key=lambda r: str(r.get("date", "")))
    text = f"a recorded run on {device} took {newest['notebooks'][src.stem]:.0f} s ({newest.get('date', 'undated')})"
    committed = src.with_suffix(".ipynb")
    if gpu is not None and not smoke and recorded_device(committed) == gpu:
        slow = _slow_cells(committed)[:3]
        if slow:
            text += "; slowest: " + "; ".join(f"{s:.0f} s in '{h}' (`{code}`)" for s, h, code in slow)
    return text


STAGING_DIR = PROJECT_ROOT / "build" / "reproduce"  # scratch: a notebook's executed copy and results until published
TIMES_FILE = "reproduce_times.json"  # in the results folder: the run's id and per-notebook wall times
# A --smoke run's record lives beside the full run's, so that `reproduce --smoke 01` (into build/figures, where a CPU
# run's full-size record also lives) never wipes the record the next full run forecasts from.
SMOKE_TIMES_FILE = "reproduce_times_smoke.json"


def times_file(results_dir, smoke: bool) -> Path:
    """The record of the run in ``results_dir``: ``reproduce_times.json`` (full size) or ``_smoke.json``."""
    return Path(results_dir) / (SMOKE_TIMES_FILE if smoke else TIMES_FILE)


class RunStopped(SystemExit):
    """A notebook failed or the run was interrupted: nothing of that notebook was published (exit status 1 or 130)."""


def _resume_point(results_dir: Path, now: dict) -> tuple[dict, dict]:
    """The run recorded in ``<results_dir>/reproduce_times.json`` and its published notebooks' times, if this
    machine and code can go on with it; else a clear stop that says what differs."""
    from .runs import setup_differences

    path = times_file(results_dir, now.get("smoke"))
    data = json.loads(path.read_text()) if path.is_file() else {}
    legacy = results_dir / TIMES_FILE  # a --smoke run recorded before smoke runs had a file of their own
    if not data and now.get("smoke") and legacy.is_file():
        older = json.loads(legacy.read_text())
        if (older.get("run") or {}).get("smoke"):
            path, data = legacy, older
    run = data.get("run")
    if not run:
        raise SystemExit(f"reproduce --resume: {path} names no run to go on with (no `reproduce` has published a "
                         "notebook there since runs were named). Fix: start a run without --resume.")
    differ = setup_differences(run, now)
    if differ:
        raise SystemExit(f"reproduce --resume: run {run['id']} cannot go on here, its results would mix with "
                         "different ones:\n  " + "\n  ".join(differ) + "\nFix: start a new run without --resume "
                         "(or go back to that run's code, GPU and PyTorch).")
    return run, dict(data.get("notebooks", {}))


def _failing_cell(executed: Path) -> str:
    """'cell N/M: <first code line>' of the cell that failed or was running when the run stopped."""
    try:
        nb = json.loads(Path(executed).read_text())
    except (OSError, ValueError):
        return "no executed copy was written"
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    failed = next((i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.get("outputs", []))
                   or c.get("metadata", {}).get("papermill", {}).get("exception")), None)
    if failed is None:
        failed = next((i for i, c in enumerate(code) if c.get("metadata", {}).get("papermill", {}).get("status")
                       in ("running", "pending")), None)
    if failed is None:
        return f"{len(code)} code cells, none marked as failed"
    return f"cell {failed + 1}/{len(code)}: {_first_line(''.join(code[failed].get('source', '')))}"


class RunSummary:
    """What a ``reproduce`` run did, notebook by notebook, printed at its end (also when it stopped)::

        reproduce: summary of run 20261125T042649Z-...: 1 done, 1 failed, 1 not run
          01_gelu             done      77 s  -> notebooks/01_gelu.ipynb, figures/01_gelu/
          02_train_step       FAILED    12 s  at cell 5/40: loss = step(x); staged copy build/reproduce/...
          03_jit_compile      not run
    """

    def __init__(self, run_id: str):
        self.run_id, self.rows = run_id, []

    def add(self, stem: str, status: str, seconds=None, where: str = "") -> None:
        self.rows.append((stem, status, seconds, where))

    def text(self) -> str:
        counts = {}
        for _, status, _, _ in self.rows:
            counts[status] = counts.get(status, 0) + 1
        head = f"reproduce: summary of run {self.run_id}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
        width = max([len(r[0]) for r in self.rows] + [8])
        lines = [f"  {stem:<{width}}  {status:<9} {'' if s is None else f'{s:.0f} s':>6}  {where}".rstrip()
                 for stem, status, s, where in self.rows]
        return "\n".join([head, *lines])

    def print(self) -> None:
        print(self.text(), flush=True)


def _stopped(src: Path, staged: Path, exc: BaseException, committed: list, resume_hint: str) -> RunStopped:
    interrupted = isinstance(exc, KeyboardInterrupt)
    what = "was interrupted" if interrupted else "stalled" if hasattr(exc, "cell_text") else \
        f"failed ({type(exc).__name__})"
    kept = ", ".join(str(p) for p in committed)
    cell = getattr(exc, "cell_text", None) or _failing_cell(staged)  # a stalled cell names itself
    print(f"reproduce: {src.name} {what}; nothing of it was published: {kept} are as they were.\n"
          f"reproduce: its executed copy so far: {staged} ({cell})\n"
          f"reproduce: go on with: {resume_hint}", file=sys.stderr, flush=True)
    return RunStopped(130 if interrupted else 1)


def _publish(stem: str, staged_nb: Path | None, staged_results: Path, out_dir: Path, results_dir: Path,
             run: dict, seconds: float, key: str = "notebooks", versions: str = "") -> None:
    """Move a finished notebook's executed copy and results into place, all at once (interrupts held back):
    each results folder replaces its old one whole, then the notebook, then the run's record of what is done.
    ``versions`` (the text of :func:`runs.versions_text`) goes into each results folder as ``versions.txt``."""
    from .files import interrupts_deferred, move_file, replace_folder, write_text_atomic
    from .runs import VERSIONS_FILE

    folders = sorted(p for p in staged_results.iterdir() if p.is_dir()) if staged_results.is_dir() else []
    for folder in folders if versions else []:
        (folder / VERSIONS_FILE).write_text(versions)
    times_path = times_file(results_dir, run.get("smoke"))
    data = json.loads(times_path.read_text()) if times_path.is_file() else {}
    legacy = results_dir / TIMES_FILE
    if not data and run.get("smoke") and legacy.is_file():  # a --smoke run begun before it had a file of its own
        data = json.loads(legacy.read_text())
    if (data.get("run") or {}).get("id") != run["id"]:  # a new run: its record starts afresh
        data = {}
    data.update({"gpu": run["gpu"], "smoke": run["smoke"], "date": run["started"][:10], "run": run})
    data.setdefault(key, {})[stem] = seconds
    with interrupts_deferred():
        for folder in folders:
            replace_folder(folder, results_dir / folder.name)
        if staged_nb is not None:
            move_file(staged_nb, out_dir / f"{stem}.ipynb")
        write_text_atomic(times_path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _stamp_run(executed: Path, run: dict) -> None:
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    nb.metadata["cudagraph_kit"] = {"run": run}
    nbformat.write(nb, executed)


def reproduce(names: list[str] | None = None, out_dir=None, smoke: bool = False, results_dir=None,
              resume: bool = False, limits=None, kernel: dict | None = None, benchmarks: bool = True,
              constraints: str | None = None, command: str | None = None,
              summary: RunSummary | None = None) -> list[Path]:
    """Run every notebook (or those whose name starts with one of ``names``) and report progress per cell.

    With CUDA (and not ``smoke``), executed notebooks replace ``notebooks/*.ipynb`` and results refresh the
    recorded ``figures/``: the only run that writes there, and it says so. Otherwise nothing committed is
    touched: executed copies go to ``build/notebooks`` (or ``out_dir``) and results to ``build/figures``
    (or ``results_dir``); the notebooks show the recorded GPU results from ``figures/``.

    Each notebook runs into ``build/reproduce/<name>/`` first. Only when it finished without error are its
    executed copy and results moved into place, all at once, each results folder replacing the old one whole.
    A failed or interrupted notebook leaves the published files as they were: ``reproduce`` says so, points to
    the staged copy and its failing cell, and stops with status 1 (130 when interrupted). The run (commit, GPU,
    PyTorch, date) is recorded in each ``env.json``, each notebook's metadata and ``reproduce_times.json``
    (``reproduce_times_smoke.json`` for a --smoke run, so it never replaces a full run's record);
    ``resume=True`` goes on with that run, skipping the notebooks it already published.

    Every cell is watched (:mod:`.watchdog`, ``limits``): a cell far past its time on a recorded run of the same
    kind gets every thread's Python stack written into the log; past its stop limit the run stops with a message
    naming the cell (status "STALLED" in the summary). For the Colab rehearsal (:mod:`.colab_rehearsal`):
    ``kernel`` holds settings for every kernel's hook (:mod:`.kernel_hook`; ``stats_dir`` gives each notebook a
    ``<stats_dir>/<name>.json`` of its kernel's peak memory), ``constraints`` names the limits the run ran under
    (recorded in the run: ``--resume`` goes on only under the same), ``benchmarks=False`` skips the benchmarks,
    ``command`` (with its options) replaces ``python -m cudagraph_kit reproduce`` in the "go on with" hint, and
    ``summary`` (a :class:`RunSummary`) receives the rows.
    """
    require_checkout()
    import torch

    from .runs import installed_versions, new_run, versions_text

    on_gpu = torch.cuda.is_available()
    sources = [s for s in notebook_sources(NOTEBOOKS_DIR) if not names or any(s.stem.startswith(n) for n in names)]
    if not sources:
        available = [s.stem for s in notebook_sources(NOTEBOOKS_DIR)]
        raise SystemExit(f"no notebook matches {names!r}; available: {available}")
    recording = on_gpu and not smoke
    given_out, given_results = out_dir, results_dir
    if out_dir is None:
        out_dir = NOTEBOOKS_DIR if recording else PROJECT_ROOT / "build" / "notebooks"
    if results_dir is None:
        results_dir = FIGURES_DIR if recording else PROJECT_ROOT / "build" / "figures"
    out_dir, results_dir = Path(out_dir), Path(results_dir)
    gpu = torch.cuda.get_device_name(0) if on_gpu else None
    run = new_run(PROJECT_ROOT, gpu, smoke, constraints=constraints)
    done_before = {}
    if resume:
        run, done_before = _resume_point(results_dir, run)
    device = "CUDA: " + gpu if on_gpu else "CPU (no CUDA)"
    print(f"reproduce: {len(sources)} notebook(s) on {device}{', small sizes (--smoke)' if smoke else ''}; "
          f"executed notebooks -> {out_dir}, results -> {results_dir}", flush=True)
    print(f"reproduce: run {run['id']}" + (f" (going on: {len(done_before)} notebook(s) published before)"
                                            if resume else ""), flush=True)
    installed = installed_versions()  # this job's, written beside each results folder it publishes
    installed["torch"] = torch.__version__  # the torch that runs (two overlapping installs can disagree)
    versions = versions_text(run, installed)
    print("reproduce: versions: " + ", ".join(f"{k} {v or '-'}" for k, v in installed.items())
          + f", Python {sys.version.split()[0]}; each results folder gets them in versions.txt", flush=True)
    if not on_gpu:
        print("reproduce: CUDA graphs need an NVIDIA GPU; the notebooks run their CPU part and show the "
              "recorded GPU results from figures/ (left untouched).", flush=True)
    from .watchdog import CellLimits, CellStalled
    limits = limits or CellLimits()
    print(f"reproduce: every cell is watched: {limits.describe()}", flush=True)
    again = " ".join([command, *(names or [])]) if command else " ".join(
        ["python -m cudagraph_kit reproduce", *(names or []), *(["--smoke"] if smoke else []),
         *([f"--out {out_dir}"] if given_out is not None else []),
         *([f"--results {results_dir}"] if given_results is not None else [])])

    def hint():  # --resume once this run has published something to go on from
        return again + " --resume" if resume or done else again + " (nothing of this run was published yet)"
    done = []
    summary = summary if summary is not None else RunSummary(run["id"])
    summary.run_id = run["id"]
    _sigterm_as_interrupt()
    try:
        for i, src in enumerate(sources, 1):
            if src.stem in done_before:
                print(f"[{i}/{len(sources)}] {src.name}: published by run {run['id']} already; skipped", flush=True)
                done.append(out_dir / f"{src.stem}.ipynb")
                summary.add(src.stem, "skipped", where=f"published before by this run: {out_dir / src.name}")
                continue
            t0 = time.perf_counter()
            print(f"[{i}/{len(sources)}] {src.name}: {_forecast(src, gpu, smoke, results_dir)}", flush=True)
            stage = STAGING_DIR / src.stem
            if stage.exists():
                shutil.rmtree(stage)  # reproduce's own scratch from an earlier try of this notebook
            staged_nb, staged_results = stage / f"{src.stem}.ipynb", stage / "results"
            params = {"SMOKE": True} if smoke else {}
            settings = dict(kernel or {})
            if settings.get("stats_dir"):
                Path(settings["stats_dir"]).mkdir(parents=True, exist_ok=True)
                settings["stats"] = str(Path(settings.pop("stats_dir")) / f"{src.stem}.json")
                Path(settings["stats"]).unlink(missing_ok=True)  # an earlier try's figures are not this one's
            try:
                execute_notebook(src, staged_nb, params, staged_results, progress=True, run=run,
                                 recorded=cell_records(src, gpu, smoke, out_dir), limits=limits,
                                 kernel_settings=settings)
            except BaseException as exc:  # noqa: BLE001 -- a failed cell, Ctrl-C, SIGTERM: publish nothing, say so
                if isinstance(exc, CellStalled):
                    print(f"reproduce: {src.name}: {exc}", file=sys.stderr, flush=True)
                stopped = _stopped(src, staged_nb, exc, [out_dir / f"{src.stem}.ipynb", results_dir / src.stem],
                                   hint())
                if isinstance(exc, CellStalled):
                    summary.add(src.stem, "STALLED", time.perf_counter() - t0,
                                f"{exc.short()}; staged copy {staged_nb}")
                else:
                    summary.add(src.stem, "stopped" if isinstance(exc, KeyboardInterrupt) else "FAILED",
                                time.perf_counter() - t0, f"at {_failing_cell(staged_nb)}; staged copy {staged_nb}")
                for later in sources[i:]:
                    summary.add(later.stem, "not run")
                summary.print()
                raise stopped from exc
            _stamp_run(staged_nb, run)
            seconds = round(time.perf_counter() - t0, 1)
            folders = sorted(p.name for p in staged_results.iterdir() if p.is_dir()) if staged_results.is_dir() else []
            _publish(src.stem, staged_nb, staged_results, out_dir, results_dir, run, seconds, versions=versions)
            summary.add(src.stem, "done", seconds, "-> " + ", ".join(
                [str(out_dir / f"{src.stem}.ipynb")] + [f"{results_dir / f}{os.sep}" for f in folders]))
            shutil.rmtree(stage, ignore_errors=True)
            done.append(out_dir / f"{src.stem}.ipynb")
            print(f"[{i}/{len(sources)}] {src.name} done in {seconds:.0f} s; published to {out_dir} and "
                  f"{results_dir}", flush=True)
        if benchmarks and on_gpu and not smoke and (not names or "00" in names):
            run_benchmarks(results_dir, run, hint(), versions=versions)
    except KeyboardInterrupt as exc:  # between two notebooks, or while one was being published (held back)
        print(f"reproduce: interrupted; what run {run['id']} published so far is whole, nothing of the rest was "
              f"published.\nreproduce: go on with: {hint()}", file=sys.stderr, flush=True)
        listed = {row[0] for row in summary.rows}
        for later in sources:
            if later.stem not in listed:
                summary.add(later.stem, "not run")
        summary.print()
        raise RunStopped(130) from exc
    finally:
        _restore_sigterm()
    summary.print()
    return done


def _sigterm_as_interrupt():
    """Until :func:`_restore_sigterm`: SIGTERM (a job's time limit, a closed session) stops the run the way
    Ctrl-C does, so the kernel is shut down and the message says what was kept."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    _SAVED_SIGTERM.append(signal.signal(signal.SIGTERM, interrupt))


def _restore_sigterm():
    import signal
    while _SAVED_SIGTERM:
        signal.signal(signal.SIGTERM, _SAVED_SIGTERM.pop())


_SAVED_SIGTERM: list = []


BENCHMARKS = {"bench_overhead.py": "00_overhead", "crosscheck.py": "00_crosscheck"}  # scripts/ -> results folder


def run_benchmarks(results_dir, run: dict | None = None, resume_hint: str = "", versions: str = "") -> None:
    """Run the overhead benchmark and the kit-vs-plain-PyTorch cross-check (GPU only) and publish their results
    into ``results_dir`` the way notebooks are (staged, then moved in whole; nothing on failure).

    They run after the notebooks so that the cross-check can set its numbers beside the notebooks' of the same
    run: their staging folder starts with a copy of the results published so far.
    """
    import subprocess

    results_dir = Path(results_dir)
    times = json.loads((results_dir / TIMES_FILE).read_text()) if (results_dir / TIMES_FILE).is_file() else {}
    done_before = times.get("benchmarks", {}) if run is not None and (times.get("run") or {}).get("id") == run["id"] \
        else {}
    for script, stem in BENCHMARKS.items():
        if script in done_before:
            print(f"[bench] scripts/{script}: published by this run already; skipped", flush=True)
            continue
        stage = STAGING_DIR / stem
        if stage.exists():
            shutil.rmtree(stage)
        staged_results = stage / "results"
        staged_results.mkdir(parents=True)
        for folder in results_dir.iterdir() if results_dir.is_dir() else []:
            if folder.is_dir() and not folder.name.startswith("."):  # what the cross-check compares with
                shutil.copytree(folder, staged_results / folder.name)
        from .runs import tree_digest
        seeded = {p.name: tree_digest(p) for p in staged_results.iterdir()}
        env = dict(os.environ, CGK_RESULTS_DIR=str(staged_results), PYTHONUNBUFFERED="1")
        if run is not None:
            env["CGK_RUN"] = json.dumps(run)
        print(f"[bench] scripts/{script} ...", flush=True)
        t0 = time.perf_counter()
        try:
            subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / script)], env=env, check=True)
        except BaseException as exc:  # noqa: BLE001
            print(f"reproduce: scripts/{script} {'was interrupted' if isinstance(exc, KeyboardInterrupt) else 'failed'}"
                  f"; nothing of it was published: {results_dir / stem} is as it was. Staged: {staged_results}\n"
                  f"reproduce: go on with: {resume_hint}", file=sys.stderr, flush=True)
            raise RunStopped(130 if isinstance(exc, KeyboardInterrupt) else 1) from exc
        for name, digest in seeded.items():  # publish only what the benchmark wrote
            if tree_digest(staged_results / name) == digest:
                shutil.rmtree(staged_results / name)
        seconds = round(time.perf_counter() - t0, 1)
        if run is not None:
            _publish(script, None, staged_results, results_dir, results_dir, run, seconds, key="benchmarks",
                     versions=versions)
        else:
            from .files import interrupts_deferred, replace_folder
            with interrupts_deferred():
                for folder in sorted(p for p in staged_results.iterdir() if p.is_dir()):
                    replace_folder(folder, results_dir / folder.name)
        shutil.rmtree(stage, ignore_errors=True)
        print(f"[bench] scripts/{script} done in {seconds:.0f} s", flush=True)


# ------------------------------------------------------------------------------------------------ JupyterLab
def lab_copies(dest=None) -> Path:
    """Working copies of the notebooks for JupyterLab in ``build/lab`` (ignored by git), so a learner's runs
    and saves never touch the committed notebooks. Existing copies are kept (delete one for a fresh one); a
    new copy is written whole or not at all, so an interrupted ``lab`` never leaves half a notebook behind."""
    from .files import copy_file_atomic

    require_checkout()
    dest = Path(dest) if dest is not None else PROJECT_ROOT / "build" / "lab"
    dest.mkdir(parents=True, exist_ok=True)
    for src in notebook_sources(NOTEBOOKS_DIR):
        target = dest / f"{src.stem}.ipynb"
        if target.exists():
            print(f"kept your working copy {target}")
        elif src.with_suffix(".ipynb").is_file():
            copy_file_atomic(src.with_suffix(".ipynb"), target)  # with the recorded GPU outputs
        else:
            to_ipynb(src, target)
    return dest


def running_as_root() -> bool:
    """True for the root user on POSIX (containers, Colab); False elsewhere (and on Windows)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def lab(dest=None, start: bool = True, extra_args=()):
    """Open JupyterLab on working copies of the notebooks (see :func:`lab_copies`).

    ``extra_args`` go to ``jupyter lab`` as they are (e.g. ``["--no-browser", "--port", "8889"]``); as root,
    ``--allow-root`` is added (JupyterLab exits 1 as root without it). Returns
    JupyterLab's exit status, or with ``start=False`` the command it would run::

        lab("build/lab", start=False)   # [python, "-m", "jupyterlab", "--ServerApp.root_dir=build/lab"]
    """
    folder = lab_copies(dest)
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}", *extra_args]
    as_root = running_as_root() and "--allow-root" not in extra_args
    if as_root:  # containers and Colab run as root; JupyterLab refuses to start there without it
        command.append("--allow-root")
    if not start:
        return command
    import importlib.util
    if importlib.util.find_spec("jupyterlab") is None:
        raise SystemExit("JupyterLab is not installed. Fix: pip install -r requirements.txt (it lists jupyterlab).")
    print(f"JupyterLab on {folder} (working copies; the committed notebooks/ stay as recorded)", flush=True)
    if as_root:
        print("Running as root (a container or Colab): passing --allow-root to jupyter lab, which refuses to start "
              "as root without it.", flush=True)
    return _run_forwarding_signals(command)


def _run_forwarding_signals(command) -> int:
    """Run ``command`` and return its exit status. A SIGTERM or SIGHUP sent to this process (``kill PID``, a closed
    terminal, a test's ``terminate()``) is passed on to it, so JupyterLab never outlives the ``lab`` command; Ctrl+C
    reaches it anyway (same process group), and this process waits while it asks to confirm. The previous signal
    handlers are put back after."""
    import signal
    import subprocess
    import threading

    child = subprocess.Popen(command)
    forwarded = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {}
    if threading.current_thread() is threading.main_thread():   # signal handlers can be set in the main thread only
        previous = {s: signal.signal(s, lambda signum, frame: child.send_signal(signum)) for s in forwarded}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:   # JupyterLab got the same Ctrl+C: wait for it to stop (or to go on)
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":  # pragma: no cover
    reproduce(sys.argv[1:])
