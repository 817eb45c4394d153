"""Execute the kit's notebooks headless (jupytext source -> papermill) and refresh their results.

Every notebook lives in ``notebooks/`` as a jupytext ``py:percent`` file (the source of truth) next to the
executed ``.ipynb`` that carries the outputs of a real GPU run.

Example::

    from cudagraph_kit.reproduce import execute_notebook
    execute_notebook("notebooks/01_gelu.py", "/tmp/01_gelu.ipynb", parameters={"SMOKE": True})
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"


def notebook_sources(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources (``NN_*.py``) in reading order."""
    return sorted(p for p in Path(notebooks_dir).glob("[0-9][0-9]_*.py"))


def to_ipynb(source: Path, target: Path) -> Path:
    """Write the jupytext ``source`` as a notebook at ``target`` (Python 3 kernel, GPU runtime for Colab)."""
    import jupytext

    nb = jupytext.read(Path(source))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["accelerator"] = "GPU"  # Colab: open with a GPU runtime
    nb.metadata.setdefault("colab", {})["gpuType"] = "T4"
    nb.metadata.pop("jupytext", None)
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(nb, target)
    return target


def execute_notebook(source, output, parameters: dict | None = None, results_dir=None,
                     timeout_s: int | None = None) -> Path:
    """Execute one notebook source with papermill; return the executed ``.ipynb``.

    ``results_dir`` (if given) is where the notebook's ``results.save`` writes (``CGK_RESULTS_DIR``).
    The notebook runs with ``notebooks/`` as its working directory and the project on ``PYTHONPATH``.
    """
    import papermill

    source, output = Path(source), Path(output)
    unexecuted = output.with_name(output.stem + ".input.ipynb")
    to_ipynb(source, unexecuted)
    saved = {k: os.environ.get(k) for k in ("CGK_RESULTS_DIR", "PYTHONPATH")}
    try:
        if results_dir is not None:
            os.environ["CGK_RESULTS_DIR"] = str(results_dir)
        paths = [str(PROJECT_ROOT)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        papermill.execute_notebook(
            str(unexecuted), str(output), parameters=parameters or {}, cwd=str(source.parent),
            kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        unexecuted.unlink(missing_ok=True)
    return output


def reproduce(names: list[str] | None = None, out_dir=None, smoke: bool = False) -> list[Path]:
    """Run every notebook (or those whose name starts with one of ``names``) and report progress.

    With CUDA, executed notebooks replace ``notebooks/*.ipynb`` and results refresh ``figures/``.
    Without CUDA, nothing committed is touched: executed copies and CPU results go to ``build/``
    (or ``out_dir``), and the notebooks show the recorded GPU results from ``figures/``.
    """
    import torch

    on_gpu = torch.cuda.is_available()
    sources = [s for s in notebook_sources() if not names or any(s.stem.startswith(n) for n in names)]
    if not sources:
        raise SystemExit(f"no notebook matches {names!r}; available: {[s.stem for s in notebook_sources()]}")
    if out_dir is None:
        out_dir = NOTEBOOKS_DIR if on_gpu and not smoke else PROJECT_ROOT / "build" / "notebooks"
    out_dir = Path(out_dir)
    results_dir = None if on_gpu and not smoke else PROJECT_ROOT / "build" / "figures"
    where = "figures/" if results_dir is None else str(results_dir)
    print(f"reproduce: {len(sources)} notebook(s) on {'CUDA: ' + torch.cuda.get_device_name(0) if on_gpu else 'CPU (no CUDA)'}; "
          f"executed notebooks -> {out_dir}, results -> {where}", flush=True)
    if not on_gpu:
        print("reproduce: CUDA graphs need an NVIDIA GPU; the notebooks run their CPU part and show the "
              "recorded GPU results from figures/ (left untouched).", flush=True)
    done = []
    for i, src in enumerate(sources, 1):
        t0 = time.perf_counter()
        print(f"[{i}/{len(sources)}] {src.name} ...", flush=True)
        params = {"SMOKE": True} if smoke else {}
        done.append(execute_notebook(src, out_dir / f"{src.stem}.ipynb", params, results_dir))
        print(f"[{i}/{len(sources)}] {src.name} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return done


if __name__ == "__main__":  # pragma: no cover
    reproduce(sys.argv[1:])
