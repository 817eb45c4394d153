"""nbval a project can copy: cudagraph_kit.course.running.nbval_plugin, enabled by one line as the README and CONTRIBUTING.md
say, in a throwaway project of its own (a notebook, the line, `python -m pytest --nbval-lax`): with nbval, with a
changed output, without the flag (no notebook runs, as nbval has it), without nbval installed (it says so and names
the fix); its options; the count of compared cells, the same from the counting script as from nbval's own
collection; the kit's own `python -m pytest` runs its notebooks."""
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

import cudagraph_kit
from cudagraph_kit.course.running import nbval_plugin
from cudagraph_kit.course.running.paths import NOTEBOOKS_DIR, PROJECT_ROOT

try:
    import tomllib
except ImportError:  # Python 3.9/3.10
    import tomli as tomllib

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbval")

PLUGIN = "cudagraph_kit.course.running.nbval_plugin"
# The one line, in each of the two places the docs offer (CONTRIBUTING.md, the workflow's comments, the plugin).
CONFTEST_LINE = f'pytest_plugins = ["{PLUGIN}"]'
PYPROJECT_LINES = f'[tool.pytest.ini_options]\naddopts = "-p {PLUGIN}"'
COMMAND = "python -m pytest --nbval-lax notebooks/"
SUMMARY = re.compile(r"nbval \((?:lax|strict) mode\): the output of (\d+) of (\d+) notebook cells was compared")


def _docs():
    return {"README.md": (PROJECT_ROOT / "README.md").read_text(),
            "CONTRIBUTING.md": (PROJECT_ROOT / "CONTRIBUTING.md").read_text(),
            "ci.yml": (PROJECT_ROOT / ".github" / "workflows" / "ci.yml").read_text(),
            "the plugin's docstring": nbval_plugin.__doc__}


def test_the_docs_give_the_one_line_and_the_command_the_tests_use():
    for name, text in _docs().items():
        flat = re.sub(r"(?m)^#\s?", "", text) if name == "ci.yml" else text
        assert CONFTEST_LINE in flat, f"{name} does not give the conftest.py line {CONFTEST_LINE}"
        assert f'addopts = "-p {PLUGIN}"' in flat, f"{name} does not give the pyproject.toml line"
        assert COMMAND in flat, f"{name} does not give the command {COMMAND}"
    for name, text in _docs().items():  # the old recipe (copy conftest functions) is gone
        assert "configure_nbval` and the `pytest_configure`" not in text, name
    for name in ("README.md", "the plugin's docstring"):  # what to install comes with the recipe
        assert 'pip install "cudagraph-kit[nbval] @ git+https://github.com/cudagraph-kit/cudagraph-kit"' in (
            " ".join(_docs()[name].split())), name
    extra = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["nbval"]
    assert {Requirement(r).name for r in extra} == {"pytest", "nbval"}


def _cell(source, *, out=None, tags=(), number):
    outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)] if out is not None else []
    return nbformat.v4.new_code_cell(source, execution_count=number, outputs=outputs,
                                     metadata={"tags": list(tags)} if tags else {})


def _project(root: Path, where: str) -> Path:
    """A project built on the kit: one committed notebook (outputs as a GPU run left them) and the one line."""
    (root / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A notebook of a project built on the kit"),
        # the parameters cell reads its small sizes from the environment, as the kit's notebooks do
        _cell('import os\nSMOKE = os.environ.get("CGK_SMOKE", "0") == "1"\n'
              'print("small run:", SMOKE, "| results folder set:", bool(os.environ.get("CGK_RESULTS_DIR")))',
              out="small run: True | results folder set: True\n", tags=["parameters", "nbval-check-output"],
              number=1),
        _cell("print(object())", out="<object object at 0x7f3a2c1d9e40>\n", tags=["nbval-check-output"],
              number=2),                                   # the sanitizer masks the address
        _cell("import time\nprint(f'{time.perf_counter():.6f} s')", out="0.500000 s\n", number=3),  # not compared
        _cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)", out="42\n", number=4),  # the comment marks it too
        _cell("total = 6 * 7", tags=["nbval-check-output"], number=5),      # compared: prints nothing
    ]
    nbformat.write(nb, root / "notebooks" / "demo.ipynb")
    pyproject = '[project]\nname = "demo"\nversion = "0.1"\n'
    if where == "pyproject.toml":
        pyproject += "\n" + PYPROJECT_LINES + "\n"
    else:
        (root / "conftest.py").write_text(CONFTEST_LINE + "\n")
    (root / "pyproject.toml").write_text(pyproject)
    return root / "notebooks" / "demo.ipynb"


# Put first on the path of a scratch run, it makes nbval look uninstalled: importing it fails as a missing package
# does (pytest's plugin autoload is off there, as nbval's entry point would otherwise load it).
NO_NBVAL = """import sys
class _NoNbval:
    def find_spec(self, name, path=None, target=None):
        if name == "nbval" or name.startswith("nbval."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoNbval())
"""


def _pytest(cwd: Path, *args, command=tuple(COMMAND.split()[3:]), without_nbval=False):
    """`python -m pytest ARGS` in ``cwd`` as a user starts it: none of this session's CGK_/PYTEST_ variables, the
    kit under test importable; by default the documented command (``--nbval-lax notebooks/``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CGK_", "PYTEST_"))}
    kit = str(Path(cudagraph_kit.__file__).resolve().parents[1])
    paths = [kit, env.get("PYTHONPATH")]
    if without_nbval:
        hide = cwd.parent / "hide-nbval"
        hide.mkdir(exist_ok=True)
        (hide / "sitecustomize.py").write_text(NO_NBVAL)
        paths.insert(0, str(hide))
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    done = subprocess.run([sys.executable, "-m", "pytest", *command, *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_a_project_without_the_flag_runs_no_notebook_and_says_how_to_ask(tmp_path):
    """As nbval has it: a plain `python -m pytest` runs the project's tests, not its notebooks (no kernel starts);
    the log's header says how to ask for them."""
    _project(tmp_path / "project", "conftest.py")
    (tmp_path / "project" / "test_unit.py").write_text("def test_unit():\n    assert True\n")
    rc, log = _pytest(tmp_path / "project", command=())
    assert rc == 0 and "1 passed" in log, log
    assert "demo.ipynb" not in log and "nbval (lax mode)" not in log, log
    assert "no notebook runs unless asked: --nbval-lax" in log, log


def test_without_nbval_the_plugin_says_so_and_names_the_fix(tmp_path):
    """nbval hidden: a plain run passes its tests and warns, naming what to install; a run that asks for the
    notebooks stops with that message (exit 4, a usage error) instead of passing without them."""
    _project(tmp_path / "project", "conftest.py")
    (tmp_path / "project" / "test_unit.py").write_text("def test_unit():\n    assert True\n")
    rc, log = _pytest(tmp_path / "project", command=(), without_nbval=True)
    assert rc == 0 and "1 passed" in log, log
    fix = "nbval is not installed, so no notebook is checked. Fix: pip install pytest nbval"
    assert log.count(fix) >= 2, log  # in the header and in the warnings summary
    assert "PytestConfigWarning" in log, log
    rc, log = _pytest(tmp_path / "project", without_nbval=True)  # the documented command: --nbval-lax notebooks/
    assert rc == 4, log
    assert f"--nbval-lax asks for the notebooks, but {fix}" in log, log
    assert "passed" not in log, log


@pytest.mark.parametrize("where", ["conftest.py", "pyproject.toml"])
def test_a_project_gets_nbval_from_one_line(tmp_path, where):
    notebook = _project(tmp_path / "project", where)
    rc, log = _pytest(tmp_path / "project")
    assert rc == 0, log
    assert "5 passed" in log, log
    assert SUMMARY.search(log).groups() == ("4", "5"), log  # cells 0, 1, 3, 4 compared; cell 2 only ran
    if where == "conftest.py":
        return
    # a changed output fails where it is compared, and only there
    nb = nbformat.read(notebook, as_version=4)
    nb.cells[4].outputs[0].text = "43\n"
    nbformat.write(nb, notebook)
    rc, log = _pytest(tmp_path / "project")
    assert rc == 1, log
    assert "FAILED notebooks/demo.ipynb::Cell 3" in log and "Cell outputs differ" in log, log
    assert "1 failed, 4 passed" in log, log


class _PluginManager:
    def __init__(self, has_nbval):
        self.has_nbval = has_nbval

    def hasplugin(self, name):
        return self.has_nbval

    def is_blocked(self, name):
        return not self.has_nbval  # as with -p no:nbval


def _config(has_nbval=True, argv=(), addopts=(), ini=None, **option):
    opt = SimpleNamespace(nbval=False, nbval_lax=False, nbval_sanitize_with=None, nbval_current_env=False,
                          nbval_kernel_name=None, nbval_cell_timeout=2000, nbval_kernel_startup_timeout=60,
                          dist="no")
    opt.__dict__.update(option)
    values = {"addopts": list(addopts), "nbval_env": list(nbval_plugin.NOTEBOOK_ENV), **(ini or {})}
    return SimpleNamespace(option=opt, pluginmanager=_PluginManager(has_nbval), getini=values.__getitem__,
                           invocation_params=SimpleNamespace(args=list(argv)), stash=pytest.Stash())


def test_options_leave_the_mode_to_the_project(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)

    def configured(**kw):
        config = _config(**kw)
        nbval_plugin.configure_nbval(config, tmp_path)
        return config.option

    unasked = configured()  # no --nbval/--nbval-lax: nbval runs no notebook (its convention); the rest is set
    assert not unasked.nbval_lax and not unasked.nbval and unasked.nbval_current_env
    lax = configured(nbval_lax=True)
    assert lax.nbval_lax and not lax.nbval and lax.nbval_current_env
    assert Path(lax.nbval_sanitize_with).read_text() == nbval_plugin.SANITIZE_RULES
    assert (lax.nbval_cell_timeout, lax.nbval_kernel_startup_timeout) == (
        nbval_plugin.CELL_TIMEOUT_S, nbval_plugin.KERNEL_STARTUP_TIMEOUT_S)
    strict = configured(nbval=True)
    assert strict.nbval and not strict.nbval_lax
    assert configured(nbval_sanitize_with="mine.cfg").nbval_sanitize_with == "mine.cfg"
    named = configured(nbval_kernel_name="python3")
    assert named.nbval_kernel_name == "python3" and not named.nbval_current_env
    # a timeout given anywhere stays: command line, addopts, PYTEST_ADDOPTS
    assert configured(argv=["--nbval-cell-timeout=5"], nbval_cell_timeout=5.0).nbval_cell_timeout == 5.0
    assert configured(addopts=["--nbval-cell-timeout", "7"], nbval_cell_timeout=7.0).nbval_cell_timeout == 7.0
    monkeypatch.setenv("PYTEST_ADDOPTS", "--nbval-kernel-startup-timeout=9")
    assert configured(nbval_kernel_startup_timeout=9.0).nbval_kernel_startup_timeout == 9.0
    # pytest-xdist: `-n N` alone (dist "load") keeps each notebook on one worker; a --dist given stays
    assert configured(dist="load").dist == "loadfile"
    assert configured(dist="load", argv=["--dist", "load"]).dist == "load"
    untouched = configured(has_nbval=False, nbval_lax=True)  # -p no:nbval: nothing of nbval is set (or needed)
    assert untouched.nbval_sanitize_with is None and not untouched.nbval_current_env


def test_environment_is_set_for_the_notebooks_and_put_back(monkeypatch):
    for name in ("CGK_SMOKE", "CGK_RESULTS_DIR", "DEMO_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEMO_STEPS", "5")  # set by the caller: left as it is
    config = _config(has_nbval=False, ini={"nbval_env": ["CGK_SMOKE=1", "DEMO_SIZE = 64", "DEMO_STEPS=2"]})
    nbval_plugin.pytest_configure(config)
    results = Path(os.environ["CGK_RESULTS_DIR"])
    assert (os.environ["CGK_SMOKE"], os.environ["DEMO_SIZE"], os.environ["DEMO_STEPS"]) == ("1", "64", "5")
    assert results.is_dir()
    nbval_plugin.pytest_unconfigure(config)
    assert not {"CGK_SMOKE", "CGK_RESULTS_DIR", "DEMO_SIZE"} & set(os.environ) and os.environ["DEMO_STEPS"] == "5"
    assert not results.exists()
    with pytest.raises(pytest.UsageError, match="NAME=VALUE"):
        nbval_plugin.pytest_configure(_config(ini={"nbval_env": ["CGK_SMOKE"]}))


def test_the_count_of_compared_cells_is_the_one_nbval_collects():
    """The counting script (`python -m cudagraph_kit.course.running.nbval_plugin notebooks/*.ipynb`) and the summary
    line of a real nbval collection over the committed notebooks name the same cells. The collection runs as the
    README's `python -m pytest` does, on notebooks/ alone: the kit's own configuration (pyproject.toml's addopts,
    the root conftest.py) asks for nbval, with no option added here."""
    notebooks = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    counted = {p.name: nbval_plugin.compared_cells(p) for p in notebooks}
    for name, (cells, total) in counted.items():
        print(f"{name}: {len(cells)} of {total} compared: {', '.join(f'Cell {n}' for n, _ in cells)}")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "notebooks"],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    m = SUMMARY.search(done.stdout)
    assert m, done.stdout
    # a notebook awaiting its GPU recording (tests/awaiting_gpu_run.py) is skipped: it holds older code (the root
    # conftest.py)
    from awaiting_gpu_run import AWAITING_GPU_RUN
    total = sum(t for _, t in counted.values())
    marked = sum(len(c) for c, _ in counted.values())
    now = sum(len(c) for name, (c, _) in counted.items() if Path(name).stem not in AWAITING_GPU_RUN)
    assert (int(m[1]), int(m[2])) == (now, total)
    script = subprocess.run([sys.executable, "-m", PLUGIN, *map(str, notebooks)], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert script.returncode == 0 and f"total: {marked} of {total} code cells compared" in script.stdout, script


def test_compared_cells_reads_tags_comments_and_unrun_cells_as_nbval_does(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell("a = 1", tags=["nbval-check-output"], number=1),
                _cell("# NBVAL_CHECK_OUTPUT\nprint(a)", out="1\n", number=2),
                _cell("print(2)", out="2\n", number=3),
                _cell("# NBVAL_IGNORE_OUTPUT\nprint(3)", out="3\n", tags=["nbval-check-output"], number=4),
                _cell("print(4)", tags=["nbval-check-output", "nbval-skip"], number=5),
                _cell("print(5)", tags=["nbval-check-output"], number=None)]  # never run: nbval compares nothing
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert nbval_plugin.compared_cells(path) == ([(0, "a = 1"), (1, "# NBVAL_CHECK_OUTPUT")], 6)
    assert [n for n, _ in nbval_plugin.compared_cells(path, strict=True)[0]] == [0, 1, 2]
