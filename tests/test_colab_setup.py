"""The notebooks' setup cell as Colab runs it: a notebook opened outside any checkout, google.colab loaded.

The test builds a local git repository from this working tree (the "GitHub" of the test) holding the ref that the
Colab badges and the setup cell name (``REPO_REF`` of scripts/setup_cell.py, unchanged: the cell clones its own
default), fakes the ``google.colab`` module (loaded at kernel start, as Colab does), and executes notebook 01
(SMOKE) from an empty folder in a kernel of its own virtual environment, which cannot import the kit (so the
cell's clone and install run, and the install lands there, never in the environment running the tests). The
notebook's setup cell names the local repository instead of GitHub (``REPO_URL`` only; its ``REPO_REF`` stays). It
then checks what the cell did: one shallow clone of that ref, installed from that clone (the kit fetched once),
then ``setup`` imported the kit from the clone, moved the working directory into the clone's notebooks/, showed
the recorded GPU results from the clone, and kept fresh results apart from them; a restarted kernel reuses all of
it; a changed ``REPO_REF`` stops with the cause and the fix. That the ref exists in this repository itself is checked
by tests/test_front_door.py; ``setup``'s clone errors one by one by tests/test_setup_notebook.py.

The installs are the cell's own, as in Colab: ``--no-deps`` (Colab's PyTorch stays) with pip's build isolation, so
the build gets pyproject's setuptools floor from the package index; the test skips, saying so, where no such
setuptools can be had.
"""
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import sync_setup_cell  # noqa: E402

from cudagraph_kit.course.running.paths import git
from cudagraph_kit.course.running.reproduce import NOTEBOOKS_DIR, PROJECT_ROOT, _kernel_config, to_ipynb

pytestmark = pytest.mark.notebook
MARKER = "2000-01-01 (the test's clone)"
KERNEL = "cgk-colab-test"


def _kernel_venv(venv: Path) -> Path:
    """A virtual environment of its own that sees every package of the environment running the tests.

    ``venv --system-site-packages`` would see the *base* interpreter's packages only, not those of a virtual
    environment the tests run in (so no ipykernel there). A ``.pth`` file listing this interpreter's
    site-packages works the same in a venv, in the system Python and in CI; pip still installs into the new one.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    paths = {p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()}
    purelib = subprocess.run([str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "_parent_environment.pth").write_text("\n".join(sorted(paths)) + "\n")
    return venv


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A local 'remote' repository and a fake google.colab, loaded at kernel start."""
    base = tmp_path_factory.mktemp("colab")
    remote = base / "remote"
    remote.mkdir()
    for name in ("cudagraph_kit", "notebooks", "figures"):
        shutil.copytree(PROJECT_ROOT / name, remote / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "requirements.txt", "LICENSE"):
        shutil.copy(PROJECT_ROOT / name, remote / name)
    env_json = remote / "figures" / "01_gelu" / "env.json"
    env = json.loads(env_json.read_text())
    env["date"] = MARKER  # shows up in show_recorded's caption only if the recorded results came from the clone
    env_json.write_text(json.dumps(env, indent=2) + "\n")
    git(remote, "init", "-q", "-b", sync_setup_cell.repo_ref(), check=True)  # the ref the badges and the cell name
    git(remote, "add", "-A", check=True)
    git(remote, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "snapshot",
        check=True)

    fake = base / "fake"
    (fake / "google" / "colab").mkdir(parents=True)  # no google/__init__.py: google stays a namespace package
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module in tests."""\n')
    startup = base / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)  # Colab's kernel has loaded google.colab before the first cell runs
    (startup / "00-colab.py").write_text("import google.colab  # noqa: F401\n")
    return {"base": base, "remote": remote, "fake": fake, "ipython": base / "ipython"}


@pytest.fixture
def runtime(colab, tmp_path):
    """A fresh Colab stand-in: a kernel in a virtual environment of its own, without the kit."""
    venv = _kernel_venv(tmp_path / "venv")
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    kernels = tmp_path / "jupyter" / "kernels" / KERNEL
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab stand-in", "language": "python", "metadata": {"supported_encryption": ["curve"]}}))
    return {**colab, "venv": venv, "python": python, "jupyter": tmp_path / "jupyter"}


def _setuptools_for_the_build(tmp):
    """None if pip can get a setuptools that meets pyproject's build floor (what build isolation installs), else why."""
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
        import tomli as tomllib
    requires = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    floor = next(r for r in requires if r.startswith("setuptools"))
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", floor, "-d", str(tmp)],
                         capture_output=True, text=True, timeout=300)
    return None if got.returncode == 0 else f"pip cannot get {floor} for the build: {got.stderr.strip()[-300:]}"


PROBE = "import cudagraph_kit, os; print(cudagraph_kit.__file__); print(os.getcwd())"


def _colab_env(colab, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(colab["jupyter"]))
    monkeypatch.setenv("IPYTHONDIR", str(colab["ipython"]))  # its startup file loads google.colab
    monkeypatch.setenv("PYTHONPATH", str(colab["fake"]))  # google.colab importable; no checkout on the path
    monkeypatch.delenv("CGK_RESULTS_DIR", raising=False)  # the defaults are under test


def _cloning(cell: str, colab, ref=None, url=None) -> str:
    """The setup cell, cloning the test's repository (or ``url``) at its own ref (or ``ref``)."""
    assert sync_setup_cell.CONSTANTS.search(cell), cell
    return sync_setup_cell.with_repository(cell, url or colab["remote"].as_uri(), ref)


def _run_as_colab(colab, monkeypatch, workdir, ref=None, url=None):
    """Execute notebook 01 (SMOKE) from ``workdir`` as Colab would, with a last cell printing where the kit was
    imported from and the working folder; return the executed notebook."""
    import papermill

    workdir.mkdir()
    notebook = to_ipynb(NOTEBOOKS_DIR / "01_gelu.py", workdir / "01_gelu.ipynb")
    probed = nbformat.read(notebook, as_version=4)
    setup = next(c for c in probed.cells if c.cell_type == "code")
    setup.source = _cloning(setup.source, colab, ref, url)
    probed.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(probed, notebook)
    _colab_env(colab, monkeypatch)
    out = workdir / "01_gelu.out.ipynb"
    try:
        papermill.execute_notebook(str(notebook), str(out), parameters={"SMOKE": True}, cwd=str(workdir),
                                   kernel_name=KERNEL, progress_bar=False, execution_timeout=600,
                                   config=_kernel_config())
    finally:
        assert out.is_file()
    return nbformat.read(out, as_version=4)


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", ""))
            parts.extend(v for k, v in o.get("data", {}).items() if k.startswith("text/"))
            parts.append(o.get("evalue", ""))
    return "\n".join(parts)


def _kernel_finds_the_kit(colab, monkeypatch, workdir) -> bool:
    """Whether the test's kernel could import cudagraph_kit before the setup cell ran (it must not: a fresh Colab
    runtime has no kit, and the cell's first step is to install it)."""
    _colab_env(colab, monkeypatch)
    done = subprocess.run([str(colab["python"]), "-c", "import importlib.util as u; print(u.find_spec('cudagraph_kit'))"],
                          cwd=workdir, capture_output=True, text=True, check=True)
    return done.stdout.strip() != "None"


def test_notebook_in_colab_clones_installs_and_shows_the_recorded_results(runtime, monkeypatch):
    colab = runtime
    missing = _setuptools_for_the_build(colab["base"] / "setuptools")
    if missing:
        pytest.skip(missing)
    workdir = colab["base"] / "content"
    assert not _kernel_finds_the_kit(colab, monkeypatch, colab["base"]), "the stand-in runtime already has the kit"
    nb = _run_as_colab(colab, monkeypatch, workdir)
    clone = workdir / "cudagraph-kit"
    text = _text(nb)
    ref = sync_setup_cell.repo_ref()

    # one shallow clone of the badges' ref, made by the cell, installed from it; setup found both
    assert f"cudagraph-kit ({ref}) in {clone}, installed; working in {clone / 'notebooks'}" in text
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=clone, capture_output=True, text=True)
    assert branch.stdout.strip() == ref
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=clone, capture_output=True,
                             text=True)
    assert shallow.stdout.strip() == "true"
    # installed into the kernel's environment from the clone, once (the environment running the tests untouched)
    (direct_url,) = colab["venv"].glob("lib/python*/site-packages/cudagraph_kit-*.dist-info/direct_url.json")
    info = json.loads(direct_url.read_text())
    assert info["url"] == clone.as_uri() and "vcs_info" not in info  # from the clone's folder, not from git+URL
    # in this same kernel, every cell after the setup cell imported the kit from the clone
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    assert last.splitlines() == [str(clone / "cudagraph_kit" / "__init__.py"),   # one stream message or two: the
                                 str(clone / "notebooks")]                       # kernel may send each print apart
    # the recorded GPU results were shown, from the clone's figures/
    assert "Recorded on NVIDIA" in text and MARKER in text
    assert "No recorded results" not in text
    # this run (CPU, eager only) saved its fresh results beside, never into, the recorded ones
    fresh = clone / "build" / "figures" / "01_gelu"
    assert (fresh / "results.csv").is_file() and json.loads((fresh / "env.json").read_text())["date"] != MARKER
    for name in ("results.csv", "env.json"):
        assert (clone / "figures" / "01_gelu" / name).read_bytes() == (colab["remote"] / "figures" / "01_gelu" / name).read_bytes()

    # run again in a fresh kernel (a restarted Colab session): the clone and the install are reused (no pip, no
    # git), and the kit imports from the clone
    import papermill
    installed_at = direct_url.stat().st_mtime_ns
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout
    setup = next(c for c in nbformat.read(workdir / "01_gelu.ipynb", as_version=4).cells if "google.colab" in c.source)
    probe = nbformat.v4.new_notebook(cells=[setup, nbformat.v4.new_code_cell(PROBE)])
    probe.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Colab stand-in", "language": "python"}
    nbformat.write(probe, workdir / "again.ipynb")
    again = papermill.execute_notebook(str(workdir / "again.ipynb"), str(workdir / "again.out.ipynb"),
                                       cwd=str(workdir), kernel_name=KERNEL, progress_bar=False, config=_kernel_config())
    assert f"cudagraph-kit ({ref}) in {clone}, installed" in _text(again)
    printed = "".join(o.get("text", "") for o in again.cells[1].outputs if o.get("output_type") == "stream").splitlines()
    assert printed == [str(clone / "cudagraph_kit" / "__init__.py"), str(clone / "notebooks")]
    assert direct_url.stat().st_mtime_ns == installed_at, "pip ran again although the clone was installed"
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout == head

    # REPO_REF changed after the clone was made: setup stops, naming what the clone holds and both fixes
    changed = nbformat.read(workdir / "again.ipynb", as_version=4)
    changed.cells[0].source = _cloning(changed.cells[0].source, colab, ref="no-such-branch")
    nbformat.write(changed, workdir / "again.ipynb")
    with pytest.raises(papermill.PapermillExecutionError) as failed:
        papermill.execute_notebook(str(workdir / "again.ipynb"), str(workdir / "changed.out.ipynb"),
                                   cwd=str(workdir), kernel_name=KERNEL, progress_bar=False, config=_kernel_config())
    message = str(failed.value)
    assert "RuntimeError" in message and f"holds '{ref}', but this notebook asks for 'no-such-branch'" in message
    assert f"rm -rf {clone}" in message and "Restart session" in message and f'REPO_REF = "{ref}"' in message
    assert direct_url.stat().st_mtime_ns == installed_at


@pytest.mark.parametrize("case", ["missing-ref", "unreachable"])
def test_a_fresh_runtime_that_cannot_install_the_kit_stops_at_the_install(runtime, monkeypatch, case):
    """Before the kit is there nothing of it can explain a failure: the cell stops at its clone, whose command names
    the repository and the ref, and the traceback shows the cell's comment on what to check (git's own output goes
    to the runtime's log, not to the notebook); nothing is cloned or installed."""
    import papermill

    colab = runtime
    assert not _kernel_finds_the_kit(colab, monkeypatch, colab["base"])
    bad = {"missing-ref": {"ref": "no-such-branch"},
           "unreachable": {"url": (colab["base"] / "no-such-repository").as_uri()}}[case]
    workdir = colab["base"] / f"content-{case}"
    with pytest.raises(papermill.PapermillExecutionError) as failed:
        _run_as_colab(colab, monkeypatch, workdir, **bad)
    message = str(failed.value)
    url = bad.get("url", colab["remote"].as_uri())
    ref = bad.get("ref", sync_setup_cell.repo_ref())
    assert "CalledProcessError" in message and f"git clone -q --depth 1 -b {ref} {url} cudagraph-kit" in message
    assert "If this fails: REPO_REF must name a branch or tag of REPO_URL" in message
    assert "internet access" in message
    assert not (workdir / "cudagraph-kit").exists()
    assert not list(colab["venv"].glob("lib/python*/site-packages/cudagraph_kit*")), "installed nothing"
