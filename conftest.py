# The kit's pytest plugin for nbval (its options, the notebooks' small sizes, a results folder of the session):
# the one line a project built on the kit adds to the conftest.py at its root, too (README, "The kit in your own
# project"). Here at the root, so `python -m pytest notebooks/` and `python -m pytest -p no:nbval` get it as well.
pytest_plugins = ["cudagraph_kit.course.running.nbval_plugin"]


import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def _awaiting_gpu_run() -> dict:
    spec = importlib.util.spec_from_file_location("awaiting_gpu_run", Path(__file__).parent / "tests" /
                                                  "awaiting_gpu_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AWAITING_GPU_RUN


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A committed notebook whose GPU recording is owed (tests/awaiting_gpu_run.py) holds older code than its source
    and the library: nbval skips it until reproduce records it again (its source runs in tests/test_nb_NN.py)."""
    awaiting = _awaiting_gpu_run()
    stale = set()
    for item in items:
        if type(item).__name__ == "IPyNbCell" and hasattr(item, "options") and Path(str(item.fspath)).stem in awaiting:
            item.options["check"] = False
            item.add_marker(pytest.mark.skip(reason="awaits its GPU recording (tests/awaiting_gpu_run.py): the "
                                                    "committed notebook holds older code; tests/test_nb_NN.py runs "
                                                    "its source"))
            stale.add(Path(str(item.fspath)).name)
    config.stash[_STALE] = sorted(stale)


_STALE = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stale = config.stash.get(_STALE, [])
    if stale:
        terminalreporter.write_line(f"nbval: {', '.join(stale)} await their GPU recording (tests/awaiting_gpu_run.py): "
                                    "nbval skipped them; tests/test_nb_NN.py runs their sources")
