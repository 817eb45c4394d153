"""The notebooks' setup cell and the kit function it calls (cudagraph_kit.course.running.setup_notebook.setup): the cell is
short and the same in every notebook; outside Colab it is silent and offline; in Colab ``setup`` clones, checks the
ref, installs and moves into the clone (clone and install mocked here), and every failure says its cause and fix.
The whole Colab path, for real, is exercised by tests/test_colab_setup.py."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jupytext
import pytest
import torch

from cudagraph_kit.course.running import setup_notebook as sn
from cudagraph_kit.course.running.paths import PROJECT_ROOT, git, notebook_sources

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import sync_setup_cell  # noqa: E402

SOURCES = notebook_sources()
URL, REF = "https://github.com/cudagraph-kit/cudagraph-kit", "main"


# ------------------------------------------------------------------------------------------------ the cell
def test_the_setup_cell_reads_at_a_glance():
    """At most 6 lines of code (10 in all); it gets the kit once: one clone at the ref, installed from that clone
    (no second download: no `pip install git+...`); the rest is `setup`'s."""
    cell = sync_setup_cell.canonical()
    lines = cell.splitlines()
    code = sync_setup_cell.code_lines(cell)
    assert len(code) <= sync_setup_cell.MAX_CODE_LINES == 6 and len(lines) <= sync_setup_cell.MAX_LINES == 10, cell
    assert sync_setup_cell.code_lines("# a comment\n\n    # another\nx = 1\n") == ["x = 1"]
    assert not [line for line in lines if line.lstrip().startswith(("!", "%"))], "plain Python: no notebook magics"
    assert 'import_module("cudagraph_kit.course.running.setup_notebook").setup(REPO_URL, REPO_REF)' in cell
    # the names the notebooks' later cells use from it
    assert "import importlib.util, os, subprocess, sys" in cell and "from pathlib import Path" in cell
    assert cell.count("git clone") == 1 and "git+" not in cell and "./cudagraph-kit" in cell
    assert "If this fails: REPO_REF must name a branch or tag of REPO_URL" in cell  # the failure says what to do
    compile(cell, "setup cell", "exec")  # the .py source is valid Python too


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_every_notebook_opens_with_the_short_setup_cell(source):
    """The first code cell of the source and of the committed notebook is the canonical cell, at most 6 lines of
    code, and the executed notebook shows no output for it (a checkout's run is silent)."""
    first = next(c for c in jupytext.read(source).cells if c.cell_type == "code")
    assert first.source == sync_setup_cell.canonical()
    assert len(sync_setup_cell.code_lines(first.source)) <= 6
    ipynb = source.with_suffix(".ipynb")
    if ipynb.is_file():
        cell = next(c for c in json.loads(ipynb.read_text())["cells"] if c["cell_type"] == "code")
        assert "".join(cell["source"]) == sync_setup_cell.canonical()
        assert cell.get("outputs") == []


def test_outside_colab_the_cell_is_silent_offline_and_uses_this_checkout(tmp_path):
    """Run the cell as a notebook in notebooks/ would (a checkout, CI, papermill, nbval): no output, no network
    (sockets refused), no git or pip (subprocesses refused), ``checkout`` is this checkout and the kit is its own."""
    guard = textwrap.dedent("""
        import socket, subprocess
        def refuse(*args, **kwargs):
            raise AssertionError(f"the setup cell reached out: {args!r}")
        socket.socket.connect = refuse
        popen = subprocess.Popen.__init__
        def no_git_no_pip(self, args, *rest, **kwargs):
            words = [str(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
            if any(w.rsplit("/", 1)[-1] in ("git", "pip", "pip3") or w == "pip" for w in words):
                refuse(args)
            popen(self, args, *rest, **kwargs)
        subprocess.Popen.__init__ = no_git_no_pip
    """)
    probe = "import cudagraph_kit; print(checkout, cudagraph_kit.__file__, sep='\\n', file=open(OUT, 'w'))"
    out = tmp_path / "probe.txt"
    code = f"{guard}\nOUT = {str(out)!r}\n{sync_setup_cell.canonical()}\n{probe}\n"
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT / "notebooks", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "" and done.stderr == ""
    assert out.read_text().splitlines() == [str(PROJECT_ROOT), str(PROJECT_ROOT / "cudagraph_kit" / "__init__.py")]


# ------------------------------------------------------------------------------------------------ PyTorch
def test_minimum_torch_is_pyprojects_requirement():
    assert sn.minimum_torch(PROJECT_ROOT) == "2.3"
    assert '"torch>=2.3"' in (PROJECT_ROOT / "pyproject.toml").read_text()


def test_an_older_torch_is_refused_with_the_version_needed_and_the_fix():
    with pytest.raises(RuntimeError) as exc:
        sn.check_torch(PROJECT_ROOT, found="2.1.2+cu121")
    message = str(exc.value)
    assert "needs PyTorch 2.3 or newer" in message and "2.1.2+cu121" in message and 'pip install --upgrade "torch>=2.3"' in message
    assert sn.check_torch(PROJECT_ROOT, found="2.3.0") == "2.3.0"
    assert sn.check_torch(PROJECT_ROOT, found="2.11.0+cu130") == "2.11.0+cu130"  # 11 > 3, not "11" < "3"
    assert sn.check_torch(PROJECT_ROOT) == torch.__version__  # the running one passes


# ------------------------------------------------------------------------------------------------ outside Colab
def _no_subprocess(monkeypatch):
    monkeypatch.setattr(sn.subprocess, "run", lambda *a, **k: pytest.fail(f"setup ran a command: {a}"))


def test_in_a_checkout_it_prints_nothing_stays_put_and_puts_the_checkout_on_the_path(capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(PROJECT_ROOT)])
    _no_subprocess(monkeypatch)
    monkeypatch.chdir(PROJECT_ROOT / "notebooks")
    assert sn.setup(URL, REF, colab=False) == PROJECT_ROOT
    assert capsys.readouterr().out == ""
    assert os.getcwd() == str(PROJECT_ROOT / "notebooks") and sys.path[0] == str(PROJECT_ROOT)
    assert sn.setup(URL, REF, colab=False) == PROJECT_ROOT  # run twice: nothing more
    assert sys.path.count(str(PROJECT_ROOT)) == 1 and capsys.readouterr().out == ""


def test_outside_a_checkout_it_says_where_the_notebooks_are(capsys, monkeypatch, tmp_path):
    _no_subprocess(monkeypatch)
    assert sn.setup(URL, REF, colab=False, cwd=tmp_path) is None
    assert "No checkout of cudagraph-kit found" in capsys.readouterr().out


def test_colab_is_the_runtime_that_loaded_google_colab(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert not sn.in_colab()
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    assert sn.in_colab()


# ------------------------------------------------------------------------------------------------ Colab, mocked
def _fake_checkout(dest: Path) -> Path:
    for name in ("cudagraph_kit", "notebooks", "figures"):
        (dest / name).mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_in_colab_it_clones_installs_and_works_in_the_clone_once(capsys, monkeypatch, tmp_path):
    calls = {"clone": [], "pip": [], "use": []}
    installed = set()

    def clone(url, ref, dest):
        calls["clone"].append((url, ref, dest))
        return _fake_checkout(dest)

    def run_step(*command):
        calls["pip"].append(command)
        installed.add(Path(command[-1]))

    monkeypatch.setattr(sn, "clone", clone)
    monkeypatch.setattr(sn, "run_step", run_step)
    monkeypatch.setattr(sn, "_installed_from", lambda checkout: Path(checkout) in installed)
    monkeypatch.setattr(sn, "use_kit_from", lambda checkout: calls["use"].append(checkout))  # not this process's kit
    monkeypatch.chdir(tmp_path)
    clone_dir = (tmp_path / "cudagraph-kit").resolve()

    assert sn.setup(URL, "v9.9.9", colab=True) == clone_dir
    assert calls["clone"] == [(URL, "v9.9.9", clone_dir)]
    assert calls["pip"] == [(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", str(clone_dir))]
    assert calls["use"] == [clone_dir] and Path.cwd() == clone_dir / "notebooks"
    said = capsys.readouterr().out
    assert said == (f"cudagraph-kit (v9.9.9) in {clone_dir}, installed; working in {clone_dir / 'notebooks'}; "
                    f"PyTorch {torch.__version__}\n")

    # the cell run again (from the clone's notebooks/): the clone and the install are reused
    assert sn.setup(URL, "v9.9.9", colab=True) == clone_dir
    assert len(calls["clone"]) == 1 and len(calls["pip"]) == 1 and Path.cwd() == clone_dir / "notebooks"
    assert capsys.readouterr().out == said


def test_a_deleted_working_folder_is_named_with_the_fix(monkeypatch):
    def gone(cls):
        raise FileNotFoundError("cwd")
    monkeypatch.setattr(sn.Path, "cwd", classmethod(gone))
    with pytest.raises(RuntimeError, match=r"working folder no longer exists.*Restart session"):
        sn.setup(URL, REF, colab=True)


# ------------------------------------------------------------------------------------------------ clone errors
GIT_SAYS = {
    "missing-ref": ("warning: Could not find remote branch v0.9.9 to clone.\n"
                    "fatal: Remote branch v0.9.9 not found in upstream origin",
                    ["no branch or tag 'v0.9.9'", "Colab badge", 'REPO_REF = "main"']),
    "no-repository": ("remote: Repository not found.\n"
                      "fatal: repository 'https://github.com/cudagraph-kit/cudagraph-kit/' not found",
                      ["no public repository at https://github.com/cudagraph-kit/cudagraph-kit", "check REPO_URL"]),
    "asks-for-login": ("fatal: could not read Username for 'https://github.com': terminal prompts disabled",
                       ["no public repository at", "check REPO_URL"]),
    "offline": ("fatal: unable to access 'https://github.com/cudagraph-kit/cudagraph-kit/': Could not resolve "
                "host: github.com", ["could not reach https://github.com/cudagraph-kit/cudagraph-kit",
                                     "internet access"]),
}


@pytest.mark.parametrize("case", sorted(GIT_SAYS))
def test_a_failed_clone_says_why_and_what_to_do(monkeypatch, tmp_path, case):
    stderr, expected = GIT_SAYS[case]
    seen = []

    def git(command, **kwargs):
        seen.append((command, kwargs.get("env", {}).get("GIT_TERMINAL_PROMPT")))
        return subprocess.CompletedProcess(command, 128, "", stderr + "\n")

    monkeypatch.setattr(sn.subprocess, "run", git)
    ref = "v0.9.9"
    with pytest.raises(RuntimeError) as failed:
        sn.clone(URL, ref, tmp_path / "cudagraph-kit")
    message = str(failed.value)
    assert seen == [(["git", "clone", "--quiet", "--depth", "1", "--branch", ref, URL,
                      str(tmp_path / "cudagraph-kit")], "0")]  # shallow, that ref; never waits for a password
    assert message.startswith(f"setup failed: git clone --branch {ref} {URL}\n")
    assert stderr in message, "git's own words are shown"
    assert "Why and what to do: " in message and message.endswith("then run this cell again.")
    for words in expected:
        assert words in message


def test_without_git_it_says_to_install_it(monkeypatch, tmp_path):
    def no_git(command, **kwargs):
        raise FileNotFoundError(command[0])
    monkeypatch.setattr(sn.subprocess, "run", no_git)
    with pytest.raises(RuntimeError, match=r"git is not installed.*apt-get install -y git.*run this cell again"):
        sn.clone(URL, REF, tmp_path / "cudagraph-kit")


def test_a_failed_step_shows_the_commands_own_error():
    with pytest.raises(RuntimeError, match=r"setup failed \(exit 2\).*no-such-file"):
        sn.run_step(sys.executable, str(Path("no-such-file.py")))


# ------------------------------------------------------------------------------------------------ the ref check
@pytest.fixture
def remote(tmp_path):
    """A local repository with a branch ``main`` and a tag ``v1`` on an older commit."""
    repo = tmp_path / "remote"
    repo.mkdir()

    def commit(*args):
        git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", *args, check=True)
    commit("init", "-q", "-b", "main")
    (repo / "f").write_text("1")
    commit("add", "f")
    commit("commit", "-qm", "one")
    commit("tag", "v1")
    (repo / "f").write_text("2")
    commit("commit", "-qam", "two")
    return repo.as_uri()


def test_a_clone_of_a_branch_or_a_tag_passes_the_ref_check(remote, tmp_path):
    for ref in ("main", "v1"):
        checkout = sn.clone(remote, ref, tmp_path / ref)
        assert subprocess.run(["git", "-C", str(checkout), "rev-parse", "--is-shallow-repository"],
                              capture_output=True, text=True).stdout.strip() == "true"
        sn.check_ref(checkout, ref)


def test_a_clone_of_another_ref_is_named_with_both_fixes(remote, tmp_path):
    checkout = sn.clone(remote, "main", tmp_path / "cudagraph-kit")
    with pytest.raises(RuntimeError) as failed:
        sn.check_ref(checkout, "v1")
    message = str(failed.value)
    assert f"{checkout} holds 'main', but this notebook asks for 'v1' (REPO_REF)" in message
    assert f"`!rm -rf {checkout}`" in message and "Restart session" in message and 'REPO_REF = "main"' in message
    tag = sn.clone(remote, "v1", tmp_path / "tag")
    with pytest.raises(RuntimeError, match=r"holds 'v1', but this notebook asks for 'main'"):
        sn.check_ref(tag, "main")


def test_a_missing_ref_for_real(remote, tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)Remote branch no-such-branch not found.*no branch or tag 'no-such-br"):
        sn.clone(remote, "no-such-branch", tmp_path / "cudagraph-kit")
    assert not (tmp_path / "cudagraph-kit").exists()


def test_an_unfinished_clone_is_named_and_a_plain_folder_is_left_alone(tmp_path):
    unfinished = tmp_path / "cudagraph-kit"
    subprocess.run(["git", "init", "-q", str(unfinished)], check=True)
    with pytest.raises(RuntimeError, match=r"unfinished clone.*rm -rf"):
        sn.check_ref(unfinished, "main")
    sn.check_ref(_fake_checkout(tmp_path / "plain"), "main")  # no .git: a checkout the user made, not checked


# ------------------------------------------------------------------------------------------------ which kit loads
def test_a_kit_loaded_from_elsewhere_is_found():
    here = type(sys)("cudagraph_kit")
    here.__file__ = str(PROJECT_ROOT / "cudagraph_kit" / "__init__.py")
    there = type(sys)("cudagraph_kit")
    there.__file__ = "/usr/lib/python3/site-packages/cudagraph_kit/__init__.py"
    other = {"numpy": sys}
    assert sn.stale_kit_modules(PROJECT_ROOT, {**other, "cudagraph_kit": here, "cudagraph_kit.course": sys}) == []
    assert sn.stale_kit_modules(PROJECT_ROOT, other) == []
    assert sorted(sn.stale_kit_modules(PROJECT_ROOT, {**other, "cudagraph_kit": there, "cudagraph_kit.course": sys,
                                                       "cudagraph_kit_extra": sys})) == ["cudagraph_kit",
                                                                                          "cudagraph_kit.course"]


def test_after_setup_the_notebook_imports_the_checkouts_kit(tmp_path):
    """What happens in Colab after the first step installed a copy of the kit (and anywhere another copy loads
    first): ``use_kit_from`` makes later imports load the checkout's kit. In a process of its own."""
    shutil.copytree(PROJECT_ROOT / "cudagraph_kit", tmp_path / "copy" / "cudagraph_kit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent(f"""
        import cudagraph_kit.course.running.setup_notebook as sn
        print(sn.__file__)
        sn.use_kit_from({str(PROJECT_ROOT)!r})
        import cudagraph_kit.course.running.setup_notebook, cudagraph_kit.course.running.paths
        print(cudagraph_kit.course.running.setup_notebook.__file__)
        print(cudagraph_kit.course.running.paths.PROJECT_ROOT)
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "copy")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first, then, root = done.stdout.splitlines()
    assert first == str(tmp_path / "copy" / "cudagraph_kit" / "course" / "running" / "setup_notebook.py")
    assert then == str(PROJECT_ROOT / "cudagraph_kit" / "course" / "running" / "setup_notebook.py")
    assert root == str(PROJECT_ROOT)


# ------------------------------------------------------------------------------------------------ figures
def test_a_kernel_under_mplbackend_agg_still_draws_figures_into_the_notebook(tmp_path):
    """CI sets MPLBACKEND=Agg; a kernel started under it shows no figure, and nbval then misses the figure layouts
    it compares. ``show_figures_inline`` (which ``setup`` calls) switches such a kernel to inline drawing."""
    import nbformat
    from nbclient import NotebookClient
    figure = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()"
    outputs = {}
    for switched in (False, True):
        first = "from cudagraph_kit.course.running.setup_notebook import show_figures_inline\n" + (
            "print(show_figures_inline())" if switched else "print('left as it is')")
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(first), nbformat.v4.new_code_cell(figure)])
        old = os.environ.get("MPLBACKEND")
        os.environ["MPLBACKEND"] = "Agg"
        try:
            NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                           ).execute()
        finally:
            os.environ.pop("MPLBACKEND") if old is None else os.environ.__setitem__("MPLBACKEND", old)
        outputs[switched] = nb.cells
    assert outputs[False][1].outputs == []  # the trouble: Agg draws nothing into the notebook
    assert outputs[True][0].outputs[0]["text"].strip() == "True"
    drawn = [o for o in outputs[True][1].outputs if o["output_type"] == "display_data"]
    assert len(drawn) == 1 and "image/png" in drawn[0]["data"]
    assert drawn[0]["data"]["text/plain"].startswith("<Figure size")


def test_outside_a_kernel_or_without_mplbackend_nothing_is_switched(monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)
    assert sn.show_figures_inline() is False
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert sn.show_figures_inline() is False  # pytest is no Jupyter kernel


def test_the_torch_floor_is_read_as_a_requirement_however_it_is_written(tmp_path):
    """pyproject.toml read with tomllib and the requirement with packaging: spaces, markers, other packages whose
    names contain "torch", and a local or pre-release build of PyTorch compared by its release."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "k"\nversion = "1"\ndependencies = [\n'
                                             '  "torchvision>=0.30", "torch >= 2.4 ; python_version >= \'3.9\'"]\n')
    assert sn.minimum_torch(tmp_path) == "2.4"
    assert sn.check_torch(tmp_path, found="2.4.0a0+git1234") == "2.4.0a0+git1234"
    with pytest.raises(RuntimeError, match=r"needs PyTorch 2.4 or newer; this runtime has 2.3.1\+cu121"):
        sn.check_torch(tmp_path, found="2.3.1+cu121")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "k"\nversion = "1"\ndependencies = ["numpy"]\n')
    assert sn.minimum_torch(tmp_path) is None and sn.minimum_torch(tmp_path / "nowhere") is None
