"""Execute the kit's notebooks headless (jupytext source -> papermill) and refresh their results.

Every notebook lives in ``notebooks/`` of a source checkout as a jupytext ``py:percent`` file (the source of
truth) next to the executed ``.ipynb`` that carries the outputs of a real GPU run.

Example::

    from cudagraph_kit.course.reproduce import execute_notebook
    execute_notebook("notebooks/01_gelu.py", "/tmp/01_gelu.ipynb", parameters={"SMOKE": True},
                     results_dir="/tmp/results", progress=True)
"""
from __future__ import annotations

import json
import os
import re
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
    jupytext.write(nb, target)
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
                     timeout_s: int | None = None, progress: bool = False) -> Path:
    """Execute one notebook source with papermill; return the executed ``.ipynb`` (machine paths stripped).

    ``results_dir`` (if given) is where the notebook's ``results.save`` writes (``CGK_RESULTS_DIR``).
    The notebook runs with its folder as the working directory and the project on ``PYTHONPATH``.
    ``progress=True`` prints a line as each code cell starts, with its time on the recorded run.
    """
    import nbformat
    import papermill

    source, output = Path(source), Path(output)
    unexecuted = output.with_name(output.stem + ".input.ipynb")
    to_ipynb(source, unexecuted)
    engine_kwargs = {}
    if progress:
        recorded = recorded_durations(source.with_suffix(".ipynb"))
        code_cells = sum(c.cell_type == "code" for c in nbformat.read(unexecuted, as_version=4).cells)
        code_cells += 1 if parameters else 0  # papermill adds a cell with the injected parameters
        engine_kwargs["on_cell_start"] = _cell_printer(code_cells, recorded)
    saved = {k: os.environ.get(k) for k in ("CGK_RESULTS_DIR", "PYTHONPATH")}
    try:
        if results_dir is not None:
            os.environ["CGK_RESULTS_DIR"] = str(results_dir)
        paths = [str(PROJECT_ROOT)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        _register_engine()
        papermill.execute_notebook(
            str(unexecuted), str(output), parameters=parameters or {}, cwd=str(source.parent),
            kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
            engine_name=ENGINE_NAME, config=_kernel_config(), **engine_kwargs,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        unexecuted.unlink(missing_ok=True)
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


def _forecast(src: Path) -> str:
    """What the recorded GPU run of this notebook took, and its slowest cells (said before it starts)."""
    recorded = recorded_durations(src.with_suffix(".ipynb"))
    if None not in recorded:
        return "no recorded run to compare with"
    from .results import load
    rec = load(src.stem)
    where = f" on {rec.env['gpu']}" if rec is not None and rec.env.get("gpu") else ""
    slow = _slow_cells(src.with_suffix(".ipynb"))[:3]
    slow_text = "; slowest: " + "; ".join(f"{s:.0f} s in '{h}' (`{code}`)" for s, h, code in slow) if slow else ""
    return f"the recorded run took {recorded[None]:.0f} s{where}{slow_text}"


def reproduce(names: list[str] | None = None, out_dir=None, smoke: bool = False, results_dir=None) -> list[Path]:
    """Run every notebook (or those whose name starts with one of ``names``) and report progress per cell.

    With CUDA (and not ``smoke``), executed notebooks replace ``notebooks/*.ipynb`` and results refresh the
    recorded ``figures/``: the only run that writes there, and it says so. Otherwise nothing committed is
    touched: executed copies go to ``build/notebooks`` (or ``out_dir``) and results to ``build/figures``
    (or ``results_dir``); the notebooks show the recorded GPU results from ``figures/``.
    """
    require_checkout()
    import torch

    on_gpu = torch.cuda.is_available()
    sources = [s for s in notebook_sources() if not names or any(s.stem.startswith(n) for n in names)]
    if not sources:
        raise SystemExit(f"no notebook matches {names!r}; available: {[s.stem for s in notebook_sources()]}")
    recording = on_gpu and not smoke
    if out_dir is None:
        out_dir = NOTEBOOKS_DIR if recording else PROJECT_ROOT / "build" / "notebooks"
    if results_dir is None:
        results_dir = FIGURES_DIR if recording else PROJECT_ROOT / "build" / "figures"
    out_dir = Path(out_dir)
    device = "CUDA: " + torch.cuda.get_device_name(0) if on_gpu else "CPU (no CUDA)"
    print(f"reproduce: {len(sources)} notebook(s) on {device}{', small sizes (--smoke)' if smoke else ''}; "
          f"executed notebooks -> {out_dir}, results -> {results_dir}", flush=True)
    if not on_gpu:
        print("reproduce: CUDA graphs need an NVIDIA GPU; the notebooks run their CPU part and show the "
              "recorded GPU results from figures/ (left untouched).", flush=True)
    done, seconds = [], {}
    for i, src in enumerate(sources, 1):
        t0 = time.perf_counter()
        print(f"[{i}/{len(sources)}] {src.name}: {_forecast(src)}", flush=True)
        params = {"SMOKE": True} if smoke else {}
        done.append(execute_notebook(src, out_dir / f"{src.stem}.ipynb", params, results_dir, progress=True))
        seconds[src.stem] = round(time.perf_counter() - t0, 1)
        print(f"[{i}/{len(sources)}] {src.name} done in {seconds[src.stem]:.0f} s", flush=True)
    _record_times(Path(results_dir), seconds, torch.cuda.get_device_name(0) if on_gpu else None, smoke)
    if on_gpu and not smoke and (not names or "00" in names):
        run_benchmarks(results_dir)
    return done


BENCHMARKS = ("bench_overhead.py", "crosscheck.py")  # in scripts/; run after the notebooks, on a GPU only


def run_benchmarks(results_dir) -> None:
    """Run the overhead benchmark and the kit-vs-plain-PyTorch cross-check into ``results_dir``.

    They run after the notebooks so that the cross-check can set its numbers beside the notebooks' of the same run.
    """
    import subprocess

    env = dict(os.environ, CGK_RESULTS_DIR=str(results_dir), PYTHONUNBUFFERED="1")
    for script in BENCHMARKS:
        print(f"[bench] scripts/{script} ...", flush=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / script)], env=env, check=True)
        print(f"[bench] scripts/{script} done in {time.perf_counter() - t0:.0f} s", flush=True)


def _record_times(results_dir: Path, seconds: dict, gpu, smoke: bool) -> None:
    """Add this run's per-notebook wall times to ``<results_dir>/reproduce_times.json`` (the facilitator's guide
    quotes them)."""
    path = results_dir / "reproduce_times.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    if data.get("gpu") != gpu or data.get("smoke") != smoke:
        data = {}
    data.update({"gpu": gpu, "smoke": smoke, "date": time.strftime("%Y-%m-%d", time.gmtime())})
    data.setdefault("notebooks", {}).update(seconds)
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------ JupyterLab
def lab_copies(dest=None) -> Path:
    """Working copies of the notebooks for JupyterLab in ``build/lab`` (ignored by git), so a learner's runs
    and saves never touch the committed notebooks. Existing copies are kept (delete one for a fresh one)."""
    require_checkout()
    dest = Path(dest) if dest is not None else PROJECT_ROOT / "build" / "lab"
    dest.mkdir(parents=True, exist_ok=True)
    for src in notebook_sources():
        target = dest / f"{src.stem}.ipynb"
        if target.exists():
            print(f"kept your working copy {target}")
        elif src.with_suffix(".ipynb").is_file():
            shutil.copyfile(src.with_suffix(".ipynb"), target)  # with the recorded GPU outputs
        else:
            to_ipynb(src, target)
    return dest


def lab(dest=None, start: bool = True) -> list[str]:
    """Open JupyterLab on working copies of the notebooks (see :func:`lab_copies`); returns its command."""
    folder = lab_copies(dest)
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    if start:
        import importlib.util
        if importlib.util.find_spec("jupyterlab") is None:
            raise SystemExit("JupyterLab is not installed. Fix: pip install -r requirements.txt (it lists jupyterlab).")
        print(f"JupyterLab on {folder} (working copies; the committed notebooks/ stay as recorded)", flush=True)
        import subprocess
        subprocess.run(command, check=False)
    return command


if __name__ == "__main__":  # pragma: no cover
    reproduce(sys.argv[1:])
