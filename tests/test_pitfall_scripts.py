"""CPU: run_isolated runs a function in a fresh process and returns what it reported; a crash, a signal or a hang
comes back as data (exit code, last stderr line, what was emitted before), never as an exception."""
import importlib.util
import signal
import sys
import textwrap
import time

import pytest
import torch

from cudagraph_kit.course.lessons.pitfall_scripts import TWO_CAPTURE_VARIANTS, run_isolated, two_captures

CHILDREN = textwrap.dedent('''
    import json, os, signal, sys, time

    def emit(result):
        print(json.dumps(result), flush=True)

    def reports(a, b):
        print("some other output")
        emit({"args": [a, b], "python": sys.executable})

    def fails_after_emitting():
        emit({"stage": "before the failure"})
        raise RuntimeError("an illegal memory access was encountered (simulated)")

    def killed_by_a_signal():
        emit({"stage": "before the signal"})
        os.kill(os.getpid(), signal.SIGKILL)

    def hangs():
        emit({"stage": "started"})
        time.sleep(600)

    def reports_nothing():
        print("{not json")
''')


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    path = tmp_path_factory.mktemp("children") / "children.py"
    path.write_text(CHILDREN)
    spec = importlib.util.spec_from_file_location("children", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_returns_what_the_function_emitted_with_exit_code_zero(children):
    r = run_isolated(children.reports, "x", 3)
    assert r == {"args": ["x", "3"], "python": sys.executable, "exit code": 0}  # arguments arrive as strings


def test_a_failure_returns_what_was_emitted_before_with_the_error(children):
    r = run_isolated(children.fails_after_emitting)
    assert r["stage"] == "before the failure" and r["exit code"] == 1
    assert r["stderr"] == "RuntimeError: an illegal memory access was encountered (simulated)"


def test_a_process_killed_by_a_signal_is_reported(children):
    r = run_isolated(children.killed_by_a_signal)
    assert r["stage"] == "before the signal" and r["exit code"] == -signal.SIGKILL


def test_a_hang_is_killed_after_the_timeout(children):
    start = time.perf_counter()
    r = run_isolated(children.hangs, timeout=3)
    assert time.perf_counter() - start < 60
    assert r == {"stage": "started", "exit code": "killed after 3 s", "stderr": "timed out"}


def test_no_valid_json_gives_an_empty_result(children):
    assert run_isolated(children.reports_nothing) == {"exit code": 0}


@pytest.mark.parametrize("bad", [lambda: None, print, "two_captures"], ids=["lambda", "builtin", "name"])
def test_refuses_what_a_fresh_process_cannot_load(bad):
    with pytest.raises(TypeError, match="top level of a file"):
        run_isolated(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a GPU experiment reports without a GPU")
def test_a_gpu_experiment_without_cuda_fails_as_data():
    r = run_isolated(two_captures, TWO_CAPTURE_VARIANTS[0], timeout=300)
    assert r["exit code"] not in (0, None) and "graph 1 memory" not in r
    assert r["stderr"] and "ModuleNotFoundError" not in r["stderr"], r


def test_two_captures_places_each_tensor_by_its_whole_span():
    """A tensor is "allocated" or "free in cache" only if every byte is; one that runs past its segment's end into
    memory handed back to the driver says so, which a first-byte reading missed (notebook 05, "Going further" F)."""
    from cudagraph_kit.course.lessons.pitfall_scripts import span_state
    segments = [{"address": 1000, "total_size": 300, "blocks": [{"size": 100, "state": "active_allocated"},
                                                                 {"size": 200, "state": "inactive"}]},
                {"address": 2000, "total_size": 100, "blocks": [{"size": 100, "state": "active_allocated"}]}]
    assert span_state(segments, 1000, 100) == "allocated"
    assert span_state(segments, 1100, 200) == "free in cache"
    assert span_state(segments, 1050, 100) == "partly allocated and partly free in cache"
    assert span_state(segments, 1200, 200) == "partly free in cache and partly returned to the driver"  # past the end
    assert span_state(segments, 1500, 10) == "returned to the driver"
    assert span_state(segments, 1950, 100) == "partly allocated and partly returned to the driver"
