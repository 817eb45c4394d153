"""The notebooks' setup cell as Colab runs it: a notebook opened outside any checkout, google.colab importable.

The test builds a local git repository from this working tree (the "GitHub" of the test) holding the ref that the
Colab badges and the setup cell name (``REPO_REF`` of scripts/setup_cell.py, unchanged: the cell clones its own
default), fakes the ``google.colab`` module, and executes notebook 01 (SMOKE) from an empty folder in a kernel of
its own virtual environment (so the cell's ``pip install`` lands there, never in the environment running the
tests). It then checks what the cell did: a shallow clone of that ref, an editable install of that clone, the
kit imported from it, the working directory moved into the clone's notebooks/, the recorded GPU results shown
from the clone, and fresh results kept apart from them. That the ref exists in this repository itself is checked
by tests/test_front_door.py.

The install is the cell's own, as in Colab: ``--no-deps`` (Colab's PyTorch stays) with pip's build isolation, so
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

from cudagraph_kit.course.reproduce import NOTEBOOKS_DIR, PROJECT_ROOT, _kernel_config, to_ipynb

pytestmark = pytest.mark.notebook
MARKER = "2000-01-01 (the test's clone)"
KERNEL = "cgk-colab-test"


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


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
    """A local 'remote' repository, a fake google.colab, and a kernel in a virtual environment of its own."""
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
    _git("init", "-q", "-b", sync_setup_cell.repo_ref(), cwd=remote)  # the ref the badges and the cell name
    _git("add", "-A", cwd=remote)
    _git("-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "snapshot", cwd=remote)

    fake = base / "fake"
    (fake / "google" / "colab").mkdir(parents=True)  # no google/__init__.py: google stays a namespace package
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module in tests."""\n')

    venv = _kernel_venv(base / "venv")
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    kernels = base / "jupyter" / "kernels" / KERNEL
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab stand-in", "language": "python", "metadata": {"supported_encryption": ["curve"]}}))
    return {"base": base, "remote": remote, "fake": fake, "venv": venv, "jupyter": base / "jupyter"}


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


def _run_as_colab(colab, monkeypatch, workdir, ref=None, url=None):
    """Execute notebook 01 (SMOKE) from ``workdir`` as Colab would; return the executed notebook."""
    import papermill

    workdir.mkdir()
    notebook = to_ipynb(NOTEBOOKS_DIR / "01_gelu.py", workdir / "01_gelu.ipynb")
    monkeypatch.setenv("JUPYTER_PATH", str(colab["jupyter"]))
    monkeypatch.setenv("PYTHONPATH", str(colab["fake"]))  # google.colab importable; no checkout on the path
    monkeypatch.setenv("CGK_REPO_URL", url or colab["remote"].as_uri())
    if ref is None:
        monkeypatch.delenv("CGK_REPO_REF", raising=False)  # the cell's own default, the badges' ref
    else:
        monkeypatch.setenv("CGK_REPO_REF", ref)
    monkeypatch.delenv("CGK_RESULTS_DIR", raising=False)  # the defaults are under test
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


def test_notebook_in_colab_clones_installs_and_shows_the_recorded_results(colab, monkeypatch):
    missing = _setuptools_for_the_build(colab["base"] / "setuptools")
    if missing:
        pytest.skip(missing)
    workdir = colab["base"] / "content"
    nb = _run_as_colab(colab, monkeypatch, workdir)
    clone = workdir / "cudagraph-kit"
    text = _text(nb)
    ref = sync_setup_cell.repo_ref()

    # a shallow clone of the badges' ref, made by the setup cell
    assert f"cudagraph-kit ({ref}) in {clone}, installed; working in {clone / 'notebooks'}" in text
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=clone, capture_output=True, text=True)
    assert branch.stdout.strip() == ref
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=clone, capture_output=True,
                             text=True)
    assert shallow.stdout.strip() == "true"
    # installed into the kernel's environment, editable, from the clone (the environment running the tests untouched)
    direct_url = next(colab["venv"].glob("lib/python*/site-packages/cudagraph_kit-*.dist-info/direct_url.json"))
    info = json.loads(direct_url.read_text())
    assert info["dir_info"].get("editable") is True and info["url"] == clone.as_uri()
    # the recorded GPU results were shown, from the clone's figures/
    assert "Recorded on NVIDIA" in text and MARKER in text
    assert "No recorded results" not in text
    # this run (CPU, eager only) saved its fresh results beside, never into, the recorded ones
    fresh = clone / "build" / "figures" / "01_gelu"
    assert (fresh / "results.csv").is_file() and json.loads((fresh / "env.json").read_text())["date"] != MARKER
    for name in ("results.csv", "env.json"):
        assert (clone / "figures" / "01_gelu" / name).read_bytes() == (colab["remote"] / "figures" / "01_gelu" / name).read_bytes()

    # run again in a fresh kernel (a restarted Colab session): the clone and the install are reused, and the
    # kit imports from the clone
    import papermill
    installed_at = direct_url.stat().st_mtime_ns
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout
    setup = next(c for c in nbformat.read(workdir / "01_gelu.ipynb", as_version=4).cells if "google.colab" in c.source)
    probe = nbformat.v4.new_notebook(cells=[setup, nbformat.v4.new_code_cell(
        "import cudagraph_kit, os; print(cudagraph_kit.__file__); print(os.getcwd())")])
    probe.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Colab stand-in", "language": "python"}
    nbformat.write(probe, workdir / "again.ipynb")
    again = papermill.execute_notebook(str(workdir / "again.ipynb"), str(workdir / "again.out.ipynb"),
                                       cwd=str(workdir), kernel_name=KERNEL, progress_bar=False, config=_kernel_config())
    printed = again.cells[1].outputs[0].text.splitlines()
    assert printed == [str(clone / "cudagraph_kit" / "__init__.py"), str(clone / "notebooks")]
    assert direct_url.stat().st_mtime_ns == installed_at, "pip ran again although the clone was installed"
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout == head


@pytest.mark.parametrize("case", ["missing-ref", "unreachable"])
def test_failed_clone_says_why_and_what_to_do(colab, monkeypatch, case):
    import papermill

    bad = {"missing-ref": {"ref": "no-such-branch"},
           "unreachable": {"url": (colab["base"] / "no-such-repository").as_uri()}}[case]
    with pytest.raises(papermill.PapermillExecutionError) as failed:
        _run_as_colab(colab, monkeypatch, colab["base"] / f"content-{case}", **bad)
    message = str(failed.value)
    assert "RuntimeError" in message and "setup failed" in message and "git clone" in message
    assert "Why and what to do" in message and "run this cell again" in message
    if case == "missing-ref":
        assert "no-such-branch" in message and "not found" in message  # git's own words, not a bare exit status
        assert "has no branch or tag 'no-such-branch'" in message and "Colab badge" in message
    else:
        assert "could not reach the repository" in message and "internet access" in message
