"""The command line: plain-text help, lab's options passed on to JupyterLab and its exit status, notebooks listed
once in JupyterLab, lab copies written whole."""
import subprocess
import sys
import time

import pytest

from cudagraph_kit.__main__ import main
from cudagraph_kit.course.running import reproduce as rep
from cudagraph_kit.course.running.paths import NOTEBOOKS_DIR, notebook_sources


def test_help_is_plain_text(capsys):
    for argv in (["--help"], ["reproduce", "--help"], ["lab", "--help"], ["check-figures", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: python -m cudagraph_kit")
        for markup in ("``", ":func:", ":data:", "::", ".. "):
            assert markup not in out, (argv, markup)
    main_help = subprocess.run([sys.executable, "-m", "cudagraph_kit", "--help"], capture_output=True, text=True,
                               cwd=rep.PROJECT_ROOT).stdout
    for command in ("env", "reproduce", "check-figures", "lab"):
        assert f"\n    {command}" in main_help


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []], ids=["version", "help", "bare"])
def test_version_and_help_answer_without_importing_torch(argv):
    """`python -m cudagraph_kit --version`, `--help` and a bare run import no torch (its import alone takes seconds):
    `-X importtime` lists every module the run imported. The run's time is printed, not bounded."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cudagraph_kit", *argv], capture_output=True,
                          text=True, timeout=120, cwd=rep.PROJECT_ROOT)
    seconds = time.perf_counter() - started
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "cudagraph_kit" in imported and "argparse" in imported, done.stderr[-2000:]  # the listing works
    assert not {m for m in imported if m.split(".")[0] == "torch"}, f"{argv}: imported torch"
    assert done.returncode == (2 if not argv else 0), done.stdout + done.stderr[-2000:]
    print(f"python -m cudagraph_kit {' '.join(argv)}: {seconds:.2f} s")


def test_only_lab_takes_options_it_does_not_know(capsys):
    with pytest.raises(SystemExit) as done:
        main(["reproduce", "--no-browser"])
    assert done.value.code == 2 and "unrecognized arguments: --no-browser" in capsys.readouterr().err


def test_lab_passes_its_unknown_options_to_jupyterlab_and_returns_its_status(tmp_path, monkeypatch):
    ran = []

    class FakeJupyterLab:   # what lab starts (and waits for): records the command, exits with status 3
        def __init__(self, command):
            ran.append(command)

        def wait(self):
            return 3

        def send_signal(self, signum):
            raise AssertionError("no signal was sent in this test")
    monkeypatch.setattr(subprocess, "Popen", FakeJupyterLab)
    status = main(["lab", "--no-browser", "--port", "8889", "--dir", str(tmp_path / "lab"), "--ip=0.0.0.0",
                   "--allow-root"])
    assert status == 3
    assert ran == [[sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={tmp_path / 'lab'}", "--no-browser",
                    "--port", "8889", "--ip=0.0.0.0", "--allow-root"]]


def test_lab_exits_non_zero_when_jupyterlab_fails(tmp_path):
    pytest.importorskip("jupyterlab")
    done = subprocess.run([sys.executable, "-m", "cudagraph_kit", "lab", "--dir", str(tmp_path / "lab"),
                           "--no-browser", "--port", "not-a-port"], capture_output=True, text=True, timeout=120,
                          cwd=rep.PROJECT_ROOT)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "not-a-port" in done.stdout + done.stderr


def test_jupyterlab_lists_each_notebook_once():
    """jupytext's contents manager (what JupyterLab uses with jupytext installed) on notebooks/: each notebook is
    a notebook once (its executed .ipynb); its .py source is a text file."""
    cm_class = pytest.importorskip("jupytext").TextFileContentsManager
    listing = cm_class(root_dir=str(NOTEBOOKS_DIR)).get("", content=True)["content"]
    notebooks = sorted(e["name"] for e in listing if e["type"] == "notebook")
    assert notebooks == sorted(f"{s.stem}.ipynb" for s in notebook_sources() if s.with_suffix(".ipynb").is_file())
    assert {e["name"]: e["type"] for e in listing}[notebook_sources()[0].name] == "file"
    # from the repository root too (jupyter lab in the checkout)
    root_listing = cm_class(root_dir=str(rep.PROJECT_ROOT)).get("notebooks", content=True)["content"]
    assert sorted(e["name"] for e in root_listing if e["type"] == "notebook") == notebooks


def test_an_interrupted_lab_copy_leaves_no_half_notebook(tmp_path, monkeypatch):
    """Ctrl-C while `lab` copies a notebook: no partial copy that a later `lab` would keep as the learner's work."""
    calls = []

    def interrupted_copy(src, dst, *a, **k):
        calls.append(dst)
        with open(dst, "wb") as f:
            f.write(open(src, "rb").read()[:100])  # half written
        raise KeyboardInterrupt
    import shutil
    monkeypatch.setattr(shutil, "copyfile", interrupted_copy)
    with pytest.raises(KeyboardInterrupt):
        rep.lab_copies(tmp_path / "lab")
    assert calls and not list((tmp_path / "lab").iterdir())  # neither a half copy nor its temporary file
