"""nbval over a project's committed notebooks, set up by one line: a pytest plugin.

Install pytest and nbval with the kit, its extra ``nbval`` (``pip install "cudagraph-kit[nbval] @
git+https://github.com/cudagraph-kit/cudagraph-kit"``; beside an installed kit, ``pip install pytest nbval``), then
enable the plugin with ONE line, either in the ``conftest.py`` at your project's root (beside ``pyproject.toml``)::

    pytest_plugins = ["cudagraph_kit.course.running.nbval_plugin"]

or in ``pyproject.toml``::

    [tool.pytest.ini_options]
    addopts = "-p cudagraph_kit.course.running.nbval_plugin"

then run ``python -m pytest --nbval-lax notebooks/``. As with nbval itself, the notebooks run when the run asks for
them: ``--nbval-lax`` (or ``--nbval``, strict: every cell compared) on the command line, or in your configuration
(``addopts = "-p cudagraph_kit.course.running.nbval_plugin --nbval-lax"`` runs them on every plain ``python -m pytest``, as
this kit's own pyproject.toml does); ``-p no:nbval`` turns nbval off. The test log's header says which it is. Where
nbval is not installed, the plugin says so in the header and in a warning, naming the fix, and a run that asks for
the notebooks stops with that message instead of passing without them.
Once loaded, and where nbval is installed, it sets:

- **the sanitizer**: :data:`SANITIZE_RULES` (object addresses), written to a file of the session, unless
  ``--nbval-sanitize-with`` was given (nbval reads one file: start yours from ``python -m
  cudagraph_kit.course.running.nbval_plugin --sanitize-config``);
- **the kernel**: the Python that runs pytest (``--nbval-current-env``), unless ``--nbval-kernel-name`` was given;
- **the timeouts**: :data:`CELL_TIMEOUT_S` a cell and :data:`KERNEL_STARTUP_TIMEOUT_S` for a kernel to start,
  unless ``--nbval-cell-timeout`` / ``--nbval-kernel-startup-timeout`` was given;
- **pytest-xdist**: with ``-n N`` and no ``--dist``, each notebook goes whole to one worker (``--dist loadfile``);
  split over workers, a later cell would miss what an earlier one defined;
- **the notebooks' small parameters**: the environment variables their ``parameters`` cells read, from the ini
  option ``nbval_env`` (default ``CGK_SMOKE=1``: the kit's notebooks run small), and ``CGK_RESULTS_DIR`` (where
  ``results.save`` writes) to a folder of the session; a variable already set is left as it is, and each one the
  plugin set is removed when pytest ends.

Options given anywhere count as given: on the command line, in ``addopts`` or in ``PYTEST_ADDOPTS``.

**Which cells are compared.** In lax mode nbval compares only the cells marked for it: the cell tag
``nbval-check-output`` or the comment ``# NBVAL_CHECK_OUTPUT`` (nbval's ``nbval-ignore-output``, ``nbval-skip`` and
``raises-exception`` work as nbval documents); every other cell runs and must not raise. Mark a cell when what it
shows is the same on every device, at every size and in every run (the rule this project follows): published
reference tables, tables and sentences read from committed results that another script recorded, source listings,
exercise prompts, the check of an exercise left undone where it says the same with and without a GPU, a figure's
layout (nbval compares ``<Figure size 1200x420 with 2 Axes>``, never the PNG; a kernel draws nothing under
``MPLBACKEND=Agg``, so run ``%matplotlib inline`` first, as the kit's setup cell does), and cells that print nothing
(they must stay silent: a new warning fails). Never mark a cell that shows a timing, a size, the device, a path or a
count of what ran. At the end of a run the plugin says how many cells were compared; ``python -m
cudagraph_kit.course.running.nbval_plugin --list notebooks/*.ipynb`` counts and names them without running anything.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

__all__ = ["SANITIZE_RULES", "CELL_TIMEOUT_S", "KERNEL_STARTUP_TIMEOUT_S", "NOTEBOOK_ENV", "configure_nbval",
           "compared_cells", "main"]

CELL_TIMEOUT_S = 900
KERNEL_STARTUP_TIMEOUT_S = 180
NOTEBOOK_ENV = ("CGK_SMOKE=1",)  # the default of the ini option nbval_env
RESULTS_ENV = "CGK_RESULTS_DIR"

SANITIZE_RULES = """\
# nbval sanitizers (cudagraph_kit.course.running.nbval_plugin), applied to both the committed and the fresh output of
# every compared cell. Compared cells print nothing that depends on the device, the sizes or the timing, so the
# only rule needed is for what can differ between two runs of the same code on the same data: object addresses
# in a repr. Rules must never touch prose (a GPU-name rule once turned "needs an NVIDIA GPU" into "needs an
# GPU"), so each one matches only text that cannot be a word.
[object-addresses]
regex: \\b0x[0-9a-fA-F]{6,16}\\b
replace: 0xADDRESS
"""

_STATE = pytest.StashKey[dict]()
_COUNTS = pytest.StashKey[dict]()
INSTALL = 'pip install pytest nbval (the kit\'s extra "nbval" names both: "cudagraph-kit[nbval]")'
MODE_FLAGS = ("--nbval", "--nbval-lax")


def nbval_installed() -> bool:
    """True if nbval can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("nbval") is not None
    except (ImportError, ValueError):
        return False


def nbval_missing(pluginmanager) -> str | None:
    """Why nbval will not run in this session, in words, or None where it is loaded (or will be)."""
    if not nbval_installed():
        return f"nbval is not installed, so no notebook is checked. Fix: {INSTALL}"
    if pluginmanager.is_blocked("nbval"):
        return "nbval is turned off (-p no:nbval): no notebook is checked"
    return None


def _given(config, *flags) -> bool:
    """True if any of ``flags`` was given: on the command line, in the ini file's addopts or in PYTEST_ADDOPTS."""
    args = [*config.invocation_params.args, *config.getini("addopts"),
            *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    return any(a == f or a.startswith(f + "=") for a in map(str, args) for f in flags)


def pytest_addoption(parser, pluginmanager):
    if nbval_missing(pluginmanager):  # nbval's own flags, so a run that asks for it hears why it cannot
        group = parser.getgroup("nbval", "Jupyter notebook validation (nbval is not loaded)")
        for flag in MODE_FLAGS:
            group.addoption(flag, action="store_true", dest=flag[2:].replace("-", "_"),
                            help=f"run the notebooks (needs nbval: {INSTALL})")
    parser.addini("nbval_env", type="linelist", default=list(NOTEBOOK_ENV),
                  help="NAME=VALUE lines: environment variables the notebooks' parameters cells read, set for "
                       "the test session unless already set (cudagraph_kit.course.running.nbval_plugin; default "
                       "CGK_SMOKE=1)")


def configure_nbval(config, folder: Path) -> None:
    """nbval's options for lax runs over committed notebooks (see the module's docstring); the sanitizer file is
    written to ``folder``. Nothing is set where nbval is not loaded (``-p no:nbval``)."""
    if not config.pluginmanager.hasplugin("nbval"):
        return
    opt = config.option
    if opt.nbval_sanitize_with is None:
        rules = Path(folder) / "nbval_sanitize.cfg"
        rules.write_text(SANITIZE_RULES)
        opt.nbval_sanitize_with = str(rules)
    if not (opt.nbval_kernel_name or opt.nbval_current_env or getattr(opt, "current_env", False)):
        opt.nbval_current_env = True
    if not _given(config, "--nbval-cell-timeout"):
        opt.nbval_cell_timeout = CELL_TIMEOUT_S
    if not _given(config, "--nbval-kernel-startup-timeout"):
        opt.nbval_kernel_startup_timeout = KERNEL_STARTUP_TIMEOUT_S
    # pytest-xdist: `-n N` alone means --dist load, which hands cells of one notebook to different workers
    if getattr(opt, "dist", "no") == "load" and not _given(config, "--dist", "-d"):
        opt.dist = "loadfile"


def _notebook_env(config) -> dict:
    """{name: value} from the ini option nbval_env (NAME=VALUE lines)."""
    env = {}
    for line in config.getini("nbval_env"):
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise pytest.UsageError(f"nbval_env: {line!r} is not NAME=VALUE")
        env[name.strip()] = value.strip()
    return env


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    env = _notebook_env(config)
    state = {"env": [], "folders": []}
    config.stash[_STATE] = state
    # where the notebooks' results.save() writes: a folder of the session, never figures/ or build/
    if not os.environ.get(RESULTS_ENV) and RESULTS_ENV not in env:
        state["folders"].append(tempfile.mkdtemp(prefix="cgk-test-results-"))
        env[RESULTS_ENV] = state["folders"][-1]
    for name, value in env.items():  # a variable already set (the caller's choice) stays as it is
        if name not in os.environ or (name == RESULTS_ENV and not os.environ[name]):
            os.environ[name] = value
            state["env"].append(name)
    if config.pluginmanager.hasplugin("nbval"):
        state["folders"].append(tempfile.mkdtemp(prefix="cgk-nbval-"))
        configure_nbval(config, Path(state["folders"][-1]))
        return
    missing = nbval_missing(config.pluginmanager) or (
        "nbval is installed but not loaded (PYTEST_DISABLE_PLUGIN_AUTOLOAD?), so no notebook is checked. Fix: "
        "add -p nbval")
    asked = [flag for flag in MODE_FLAGS if getattr(config.option, flag[2:].replace("-", "_"), False)]
    if asked and not config.pluginmanager.is_blocked("nbval"):
        raise pytest.UsageError(f"{' '.join(asked)} asks for the notebooks, but {missing}")
    if not config.pluginmanager.is_blocked("nbval"):
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"{__name__}: {missing}"), stacklevel=2)


def pytest_report_header(config):
    """One line: whether this run checks notebooks, and how to ask where it does not."""
    if not config.pluginmanager.hasplugin("nbval"):
        return f"{__name__}: {nbval_missing(config.pluginmanager) or 'nbval is installed but not loaded: add -p nbval'}"
    if config.option.nbval or config.option.nbval_lax:
        return f"{__name__}: nbval in {'strict' if config.option.nbval else 'lax'} mode over the notebooks collected"
    return f"{__name__}: nbval is loaded; no notebook runs unless asked: --nbval-lax (or in addopts)"


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for name in state["env"]:
        os.environ.pop(name, None)
    for folder in state["folders"]:
        shutil.rmtree(folder, ignore_errors=True)


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "options")


def pytest_collection_modifyitems(config, items):
    counts = {}
    for item in items:
        if _is_nbval_cell(item):
            name = item.parent.nodeid
            compared, total = counts.get(name, (0, 0))
            check = (item.options["check"] and not item.options["skip"]
                     and item.cell.get("execution_count") is not None)
            counts[name] = (compared + bool(check), total + 1)
    config.stash[_COUNTS] = counts


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = config.stash.get(_COUNTS, None)
    if not counts:
        return
    compared = sum(c for c, _ in counts.values())
    total = sum(t for _, t in counts.values())
    mode = "strict" if config.option.nbval else "lax"
    terminalreporter.write_line(
        f"nbval ({mode} mode): the output of {compared} of {total} notebook cells was compared; the others only "
        f"ran ({', '.join(f'{name} {c}/{t}' for name, (c, t) in sorted(counts.items()))})")


def compared_cells(path, strict: bool = False) -> tuple[list[tuple[int, str]], int]:
    """The code cells of the notebook ``path`` whose output nbval compares, as ``[(cell number, first line)]``,
    and the number of code cells. Decided by nbval's own reading of the markers (tags, then comments), so the
    count is the one a lax (or, with ``strict``, a strict) run makes."""
    import nbformat
    from nbval.plugin import find_comment_markers, find_metadata_tags

    nb = nbformat.read(str(path), as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    found = []
    for number, cell in enumerate(code):
        options = dict(find_metadata_tags(cell.metadata))
        options.update(find_comment_markers(cell.source))
        if options.get("check", strict) and not options.get("skip") and cell.get("execution_count") is not None:
            found.append((number, (cell.source.strip().splitlines() or [""])[0]))
    return found, len(code)


def main(argv=None) -> int:
    """``python -m cudagraph_kit.course.running.nbval_plugin [--list] NOTEBOOK...``: how many cells nbval compares."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph_kit.course.running.nbval_plugin",
                                     description="Count the notebook cells whose output nbval compares (lax mode).")
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--list", action="store_true", help="name each compared cell")
    parser.add_argument("--sanitize-config", action="store_true", help="print the sanitizer rules the plugin uses")
    args = parser.parse_args(argv)
    if args.sanitize_config:
        sys.stdout.write(SANITIZE_RULES)
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook")
    compared = total = 0
    for path in args.notebooks:
        cells, n = compared_cells(path)
        compared, total = compared + len(cells), total + n
        print(f"{path.name}: {len(cells)} of {n} code cells compared")
        if args.list:
            for number, first in cells:
                print(f"    Cell {number}: {first[:100]}")
    print(f"total: {compared} of {total} code cells compared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
