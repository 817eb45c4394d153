"""The `benchmark` marker: benchmark tests stay out of every run that does not ask for them (so `pytest -m gpu`
gates on real defects only), run with `-m benchmark` or by node id, and write their figures where they are told,
never under figures/."""
import json
import os
import subprocess
import sys
import time

import pytest

from cudagraph_kit import timeit
from cudagraph_kit.course.running.reproduce import PROJECT_ROOT

SELF = "tests/test_benchmark_marker.py"
REPORTING = f"{SELF}::test_a_benchmark_reports_its_figure"


def pytest_run(*args):
    """A pytest run in a fresh process from the project root; returns (exit code, stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    env.pop("CGK_BENCHMARK_DIR", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:nbval", "-p", "no:xdist", *args],
                          cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.benchmark
def test_a_benchmark_reports_its_figure(benchmark_report):
    """A benchmark on any machine (run by the test below, by node id): a 2 ms sleep, reported, not gated."""
    t = timeit(time.sleep, 0.002, calls=3, samples=3, warmup=0)
    path = benchmark_report(sleep_2ms_median_us=t.median_us)
    assert path.is_file()


@pytest.mark.parametrize("options, reporting_selected, code", [
    ([], False, 0), (["-m", "gpu"], False, 5), (["-m", "not gpu"], False, 0),
    (["-m", "benchmark"], True, 0), (["-m", "not benchmark"], False, 0),
], ids=["plain", "gpu", "not-gpu", "benchmark", "not-benchmark"])
def test_benchmarks_run_only_when_the_mark_expression_names_them(options, reporting_selected, code):
    """Collected from this file (no GPU test here: `-m gpu` selects nothing, exit code 5)."""
    exit_code, out = pytest_run("--collect-only", "-q", SELF, *options)
    assert exit_code == code, out
    assert (REPORTING in out) == reporting_selected, out
    assert (f"{SELF}::test_a_benchmark_folder_under_figures_is_refused" in out) == (options[-1:] != ["benchmark"]
                                                                                   and options[-1:] != ["gpu"]), out


def test_a_benchmark_named_by_node_id_runs_and_writes_its_json_where_told(tmp_path):
    code, out = pytest_run("-q", "-s", REPORTING, "--benchmark-dir", str(tmp_path / "bench"))
    assert code == 0, out
    (written,) = (tmp_path / "bench").glob("*.json")
    record = json.loads(written.read_text())
    assert record["test"] == REPORTING and record["torch"] and record["date"]
    assert 1900 < record["figures"]["sleep_2ms_median_us"] < 50_000, record  # sleep(2 ms) takes at least 2 ms
    assert f"BENCHMARK {REPORTING}" in out and str(written) in out


def test_a_benchmark_folder_under_figures_is_refused():
    code, out = pytest_run("-q", REPORTING, "--benchmark-dir", str(PROJECT_ROOT / "figures" / "bench"))
    assert code == 4 and "no test run writes there" in out and "build/benchmarks" in out, out
    assert not (PROJECT_ROOT / "figures" / "bench").exists()
