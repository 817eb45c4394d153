"""Test-session setup: the GPU-test stamp, a guard that no test run changes the recorded results in figures/, and
the benchmark tests (run only when asked for, they report a figure instead of gating the suite). nbval's setup
comes from the kit's plugin, which the conftest.py at the checkout's root loads."""
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cudagraph_kit.course.running.paths import git
from cudagraph_kit.course.running.reproduce import FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT, execute_notebook

# nbval's options and the notebooks' small sizes (CGK_SMOKE=1, CGK_RESULTS_DIR a folder of the session, both
# unless set) come from the kit's plugin, which the conftest.py at the checkout's root loads.

HAS_CUDA = torch.cuda.is_available()
_session = {}


def pytest_addoption(parser):
    parser.addoption("--benchmark-dir", default=os.environ.get("CGK_BENCHMARK_DIR"),
                     help="folder for the figures the benchmark tests report, one JSON per test (default: "
                          "$CGK_BENCHMARK_DIR, else a folder under pytest's temporary directory; never figures/)")


def give_python_a_stdin():
    """Started with stdin closed (`0<&-`), Python has no ``sys.__stdin__``, and pytest's stand-in stdin fails
    when code under test asks it for its encoding (IPython does, as papermill starts a kernel in-process). Give
    Python an empty stdin, as `< /dev/null` would: the tests then run as they do with stdin open."""
    if sys.__stdin__ is None:
        sys.__stdin__ = open(os.devnull)  # noqa: SIM115 -- lives as long as the process, like a real stdin


def pytest_configure(config):
    give_python_a_stdin()
    folder = config.getoption("--benchmark-dir")
    if folder and Path(folder).resolve().is_relative_to(FIGURES_DIR.resolve()):
        raise pytest.UsageError(f"--benchmark-dir {folder} lies under {FIGURES_DIR}, which holds the recorded GPU "
                                "results; no test run writes there. Fix: name a folder elsewhere, e.g. "
                                "build/benchmarks.")


def pytest_report_header(config):
    """Stamp the log (the GPU test log included) with the commit and the software it ran on."""
    commit = git(PROJECT_ROOT, "rev-parse", "--short=12", "HEAD")
    dirty = bool(git(PROJECT_ROOT, "status", "--porcelain", "--untracked-files=no"))
    device = (f"{torch.cuda.get_device_name(0)} (capability {'.'.join(map(str, torch.cuda.get_device_capability(0)))})"
              if HAS_CUDA else "no CUDA device (GPU tests skipped)")
    return [f"cudagraph-kit commit {commit or 'unknown (not a git checkout)'}"
            f"{' + uncommitted changes' if dirty else ''}",
            f"PyTorch {torch.__version__}, CUDA {torch.version.cuda or '-'}, Python {platform.python_version()}, "
            f"device: {device}"]


def figures_snapshot(folder: Path = FIGURES_DIR) -> dict:
    """{relative path: SHA-256} of every file under the recorded results folder (the course's ``file_digests``)."""
    from cudagraph_kit.course.running.runs import file_digests
    return file_digests(folder)


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


def benchmarks_wanted(config, item) -> bool:
    """Benchmark tests run when the -m expression names them (`-m benchmark`, `-m "gpu and benchmark"`) or
    when the test is named on the command line by its node id; every other run leaves them out."""
    named = {a.split("[")[0] for a in config.invocation_params.args if "::" in a}
    return "benchmark" in (config.option.markexpr or "") or any(
        item.nodeid.split("[")[0].endswith(a.split("/tests/")[-1]) for a in named)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    left_out = [item for item in items if item.get_closest_marker("benchmark") and not benchmarks_wanted(config, item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    for item in items:
        if item.get_closest_marker("gpu") and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def benchmark_report(request, tmp_path_factory):
    """Report a benchmark test's figures: print them and write them as JSON to ``<benchmark dir>/<test>.json``.

    Usage: ``benchmark_report(kit_call_after_over_before=1.04, eager_after_over_before=0.98)``; returns the path.
    The folder is ``--benchmark-dir`` (or ``$CGK_BENCHMARK_DIR``), else one under pytest's temporary directory.
    """
    def report(**figures):
        option = request.config.getoption("--benchmark-dir")
        folder = Path(option) if option else tmp_path_factory.getbasetemp() / "benchmarks"
        folder.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
        path = folder / f"{name}.json"
        record = {"test": request.node.nodeid, "device": torch.cuda.get_device_name(0) if HAS_CUDA else None,
                  "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "figures": figures}
        path.write_text(json.dumps(record, indent=1, default=float) + "\n")
        print(f"\nBENCHMARK {request.node.nodeid}: {json.dumps(figures, default=float)} -> {path}")
        return path
    return report


@pytest.fixture
def sigint_raises_keyboardinterrupt():
    """SIGINT raises KeyboardInterrupt in this process for the test's duration, however pytest was started: a
    background job (`cmd &` in a script) inherits SIGINT as ignored, and Python then installs no handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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


class FakeClock:
    """Stands in for time.perf_counter: each call of a variant advances it by that call's cost, deterministically."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t

    def cost(self, seconds_per_call):
        costs = iter(seconds_per_call) if isinstance(seconds_per_call, list) else None

        def call():
            self.t += next(costs) if costs is not None else seconds_per_call
        return call


@pytest.fixture
def clock(monkeypatch):
    """A FakeClock in place of time.perf_counter for the kit's timing (tests of timing and course.measure)."""
    import cudagraph_kit.timing as timing_mod
    fake = FakeClock()
    monkeypatch.setattr(timing_mod.time, "perf_counter", fake.perf_counter)
    return fake
