"""Test-session setup: nbval options, a results folder of its own, the GPU-test stamp, and a guard that no test
run changes the recorded results in figures/."""
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from cudagraph_kit.course.reproduce import FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT, execute_notebook

HAS_CUDA = torch.cuda.is_available()
NBVAL_SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")
NBVAL_CELL_TIMEOUT_S = 900
_session = {}


def configure_nbval(config):
    """nbval: lax mode (only cells marked # NBVAL_CHECK_OUTPUT are compared) unless --nbval (strict) or
    --nbval-lax was given, the sanitizer, a cell timeout. Set here rather than in addopts, so that `--nbval`
    means strict and `-p no:nbval` still works."""
    if not config.pluginmanager.hasplugin("nbval"):
        return
    opt = config.option
    if not (opt.nbval or opt.nbval_lax):
        opt.nbval_lax = True
    if opt.nbval_sanitize_with is None:
        opt.nbval_sanitize_with = str(NBVAL_SANITIZE)
    if not any(a.startswith("--nbval-cell-timeout") for a in config.invocation_params.args):
        opt.nbval_cell_timeout = NBVAL_CELL_TIMEOUT_S


def pytest_configure(config):
    configure_nbval(config)
    # Notebooks executed by nbval inherit this environment: small sizes unless the caller chose otherwise,
    # and their results.save() goes to a folder of this session (never figures/, never build/).
    os.environ.setdefault("CGK_SMOKE", "1")
    if not os.environ.get("CGK_RESULTS_DIR"):
        _session["results_dir"] = tempfile.mkdtemp(prefix="cgk-test-results-")
        os.environ["CGK_RESULTS_DIR"] = _session["results_dir"]


def pytest_unconfigure(config):
    folder = _session.pop("results_dir", None)
    if folder:
        os.environ.pop("CGK_RESULTS_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


def _git(*args):
    try:
        done = subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def pytest_report_header(config):
    """Stamp the log (the GPU test log included) with the commit and the software it ran on."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    device = (f"{torch.cuda.get_device_name(0)} (capability {'.'.join(map(str, torch.cuda.get_device_capability(0)))})"
              if HAS_CUDA else "no CUDA device (GPU tests skipped)")
    return [f"cudagraph-kit commit {commit or 'unknown (not a git checkout)'}"
            f"{' + uncommitted changes' if dirty else ''}",
            f"PyTorch {torch.__version__}, CUDA {torch.version.cuda or '-'}, Python {platform.python_version()}, "
            f"device: {device}"]


def figures_snapshot(folder: Path = FIGURES_DIR) -> dict:
    """{relative path: sha1} of every file under the recorded results folder."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def figures_changes(before: dict, after: dict) -> list:
    """The files added, removed or changed between two snapshots."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def pytest_sessionstart(session):
    _session["figures"] = figures_snapshot()


def pytest_sessionfinish(session, exitstatus):
    """No test run may touch the recorded results: fail the run if anything under figures/ changed."""
    if "figures" not in _session:
        return
    changed = figures_changes(_session.pop("figures"), figures_snapshot())
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"this test run changed the recorded results under {FIGURES_DIR}: {', '.join(changed)}. "
                   "Tests must write elsewhere (CGK_RESULTS_DIR / results_dir); restore them with "
                   "git checkout -- figures/")
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def run_notebook(tmp_path):
    """Execute ``notebooks/<stem>.py`` with papermill; return the folder its results were saved in.

    Usage: ``results_dir = run_notebook("01_gelu", SMOKE=True)``; the notebook's ``results.save(STEM, ...)``
    lands in ``results_dir`` (= ``tmp/results/<stem>``), and the executed notebook in ``tmp/<stem>.ipynb``.
    A failing cell raises (papermill); the fixture also checks that the results were saved there.
    """
    def run(stem, **parameters):
        execute_notebook(NOTEBOOKS_DIR / f"{stem}.py", tmp_path / f"{stem}.ipynb", parameters,
                         results_dir=tmp_path / "results", timeout_s=900)
        folder = tmp_path / "results" / stem
        assert (folder / "results.csv").is_file(), f"{stem} saved no results.csv under {folder}"
        return folder
    return run
