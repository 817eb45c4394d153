"""The front door, as a new user meets it: the ref the Colab badges open exists, `--version`, `lab` as root in a
container, the README's first screen in its order with its numbers rendered from figures/, and the recipe it
shows (run on a GPU)."""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cudagraph_kit.course.running import reproduce as rep

try:
    import tomllib
except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import sync_setup_cell  # noqa: E402

BADGE_REF = re.compile(r"colab\.research\.google\.com/github/[^/\s)]+/[^/\s)]+/blob/([^/\s)]+)/notebooks/")


def ref_exists(ref: str, repo: Path = ROOT):
    """The git object name ``ref`` resolves to in ``repo`` (a local branch or tag, or a remote-tracking branch of
    origin, as in CI's clone), or None."""
    for name in (ref, f"refs/tags/{ref}", f"refs/remotes/origin/{ref}"):
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def test_the_ref_the_badges_and_the_setup_cell_name_exists_in_this_repository():
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: no refs to look for")
    ref = sync_setup_cell.repo_ref()
    badge_refs = {m for path in [ROOT / "README.md", *sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))]
                  for m in BADGE_REF.findall(path.read_text())}
    assert badge_refs == {ref}, f"the Colab badges open {badge_refs}, the setup cell clones {ref!r}"
    assert ref_exists(ref), (
        f"the Colab badges and the setup cell name {ref!r}, which this repository does not hold (no branch, tag or "
        f"origin/{ref}): Colab would fail to open or clone it. Create it (CONTRIBUTING.md, Releases) or set "
        "REPO_REF in scripts/setup_cell.py to a ref that exists, then run "
        "python scripts/sync_setup_cell.py --write --ipynb")
    assert ref_exists("no-such-ref-cgk-0.0.0") is None  # the check can say no


def test_version_prints_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run([sys.executable, "-m", "cudagraph_kit", "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cudagraph-kit {version}"


def test_the_package_loads_its_names_on_first_use():
    """`import cudagraph_kit` imports no torch; every name of `__all__` and `dir()` resolves; the names people type
    give the functions (`cgk.capture(f, x)`, `from cudagraph_kit import capture, verify, advise, ...`), each module
    stays importable under its own name, and importing a module never rebinds a function's name."""
    code = """if True:
        import sys, types
        import cudagraph_kit as k
        assert "torch" not in sys.modules, "import cudagraph_kit imported torch"
        names = dir(k)
        assert set(k.__all__) <= set(names) and {"capture", "advise", "verify", "show", "__version__"} <= set(names)
        for name in k.__all__:
            assert not isinstance(getattr(k, name), types.ModuleType), name
        for name in ("graphed", "advice", "verification", "check", "timing", "bucket_graphs", "guard"):
            assert isinstance(getattr(k, name), types.ModuleType), name
        from cudagraph_kit import capture, verify, advise, capture_train_step, graph_modules, capture_buckets
        for f in (capture, verify, advise, capture_train_step, graph_modules, capture_buckets):
            assert callable(f) and not isinstance(f, types.ModuleType), f
        import cudagraph_kit.graphed as g, cudagraph_kit.verification, cudagraph_kit.advice
        assert k.capture is g.capture is capture and g.GraphedCallable is k.GraphedCallable
        assert k.verify is cudagraph_kit.verification.verify and k.advise is cudagraph_kit.advice.advise
        import pkgutil
        modules = {m.name for m in pkgutil.iter_modules(k.__path__)}
        assert not modules & set(k.__all__), modules & set(k.__all__)   # no module shares a name with a function
        try:
            k.no_such_name
            raise AssertionError("no AttributeError")
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        print("OK")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr[-3000:]


def test_lab_adds_allow_root_only_as_root(tmp_path, monkeypatch):
    for root, given in [(True, []), (False, []), (True, ["--allow-root"])]:
        monkeypatch.setattr(rep, "running_as_root", lambda root=root: root)
        command = rep.lab(tmp_path / "lab", start=False, extra_args=["--no-browser", *given])
        assert command.count("--allow-root") == (1 if root else 0), (root, given, command)
        assert command[:4] == [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={tmp_path / 'lab'}"]
    assert "--allow-root" in subprocess.run([sys.executable, "-m", "cudagraph_kit", "lab", "--help"], cwd=ROOT,
                                            capture_output=True, text=True, timeout=120).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _still_answering(port: int, seconds: float) -> bool:
    """True if a server keeps accepting connections on ``port`` for ``seconds``; False once it refuses one."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass
        except OSError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.5)


def test_lab_starts_headless_as_it_is_run_here_and_answers_on_its_api(tmp_path):
    """`python -m cudagraph_kit lab --no-browser --port N` as the README shows it; this machine runs the tests as
    root (like a container or Colab), where JupyterLab exits 1 unless given --allow-root."""
    import importlib.util
    if importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("jupyterlab is not installed here (pip install -r requirements.txt lists it)")
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    log = open(tmp_path / "lab.log", "w+")
    lab = subprocess.Popen([sys.executable, "-m", "cudagraph_kit", "lab", "--dir", str(tmp_path / "lab"),
                            "--no-browser", "--port", str(port), "--ip", "127.0.0.1"],
                           cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        status, deadline = None, time.monotonic() + 120
        while status is None and time.monotonic() < deadline and lab.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=5) as answer:
                    status = answer.status
            except OSError:
                time.sleep(0.5)
        log.seek(0)
        printed = log.read()
        assert status == 200, f"no answer from JupyterLab's /api (exit {lab.poll()}):\n{printed[-3000:]}"
        if rep.running_as_root():
            assert "passing --allow-root" in printed
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait()
        log.close()
    # JupyterLab went with the lab command: terminating the command stops the server (no orphan left answering)
    assert not _still_answering(port, seconds=15), (
        f"JupyterLab still answers on port {port} after the lab command was terminated: it was left running")


# ------------------------------------------------------------------------------------------------ the README
def _sections(text):
    return [m.group(1) for m in re.finditer(r"(?m)^## (.+)$", text)]


def test_readme_first_screen_teaches_in_order_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 170, "the README is for a five-minute read: move detail to docs/"
    order = ["What a CUDA graph removes", "The recipe, in plain PyTorch", "Start here", "Headline numbers",
             "The two commands"]
    sections = _sections(readme)
    assert sections[:len(order)] == order, sections
    recipe = readme.split("## The recipe, in plain PyTorch", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    for call in ("torch.cuda.graph(", "torch.cuda.Stream()", ".copy_(", ".replay()"):
        assert call in recipe, f"the README's recipe lacks {call}"
    assert "cudagraph_kit" not in recipe, "the first recipe is plain PyTorch"
    commands = readme.split("## The two commands", 1)[1]
    assert "pip install -r requirements.txt -e . && python -m pytest" in commands  # what .ci/run calls the test command
    assert "maintainers with a GPU" in commands and "python -m cudagraph_kit reproduce" in commands
    assert "docs/RESULTS.md" in readme and "CONTRIBUTING.md" in readme


def test_readme_times_and_numbers_are_rendered_from_figures():
    import update_readme

    readme = (ROOT / "README.md").read_text()
    block = readme.split(update_readme.START_HERE[0], 1)[1].split(update_readme.START_HERE[1], 1)[0]
    for source in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        took = update_readme.notebook_time(source.stem)
        assert took is not None, f"no recorded time for {source.stem} in figures/reproduce_times*.json"
        row = next(line for line in block.splitlines() if f"notebooks/{source.stem}.ipynb)" in line)
        assert f"{update_readme._duration(took[0])} on an {took[1]} ({took[2]})" in row
    headline = readme.split(update_readme.HEADLINE[0], 1)[1].split(update_readme.HEADLINE[1], 1)[0]
    assert headline.count("x (") >= 3 and "What the kit costs" in headline
    assert update_readme.rendered()[update_readme.README] == readme, "run python scripts/update_readme.py --write"


def test_the_readme_quotes_notebook_02s_own_headline_row():
    """Notebook 02's takeaways quote its headline claim first (the small MLP with SGD); the README's 02 line quotes
    the row behind that claim, with the claim's own interval, and the large MLP with the same optimizer."""
    import update_readme

    from cudagraph_kit.course.measuring.claims import load_claims

    source = (ROOT / "notebooks" / "02_train_step.py").read_text()
    takeaways = source.split("TAKEAWAYS = [", 1)[1].split("\n]", 1)[0]
    named = re.search(r"\{(\w+)(?::statement)?\}", takeaways)
    assert named and named[1] == next(iter(update_readme.STEP_HEADLINE)), "the README quotes 02's headline first"
    claims = load_claims(ROOT / "figures" / "02_train_step").set_index("claim")
    headline = (ROOT / "README.md").read_text().split(update_readme.HEADLINE[0], 1)[1]
    line = next(x for x in headline.splitlines() if "notebook 02" in x)
    assert "SGD" in line and "Adam" not in line
    for claim_id in update_readme.STEP_HEADLINE:
        c = claims.loc[claim_id]
        assert f"({c.lo:.2f}-{c.hi:.2f}x)" in line, (claim_id, line)


def test_a_dirty_run_id_is_explained_where_it_appears():
    import update_readme

    assert update_readme.dirty_note([{"run": {"id": "20261125T203140Z-fb9bf35d"}}, {}]) == ""
    assert update_readme.dirty_note([{"run": {"id": "20261125T203140Z-fb9bf35d-dirty"}}]) == update_readme.DIRTY_NOTE
    for name in ("README.md", "docs/RESULTS.md"):
        text = (ROOT / name).read_text()
        if "-dirty" in text:
            assert update_readme.DIRTY_NOTE in text, name


def test_the_kit_cost_is_one_figure_from_one_table():
    """What the kit costs comes from figures/00_overhead alone; the cross-check's kit-call rows (a comparison of
    two timing methods, whose medians and ratio disagree) are not shown as a cost anywhere."""
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for text in (readme, results):
        assert text.count("**What the kit costs**") == 1
        assert "| GELU small | kit g(x)" not in text
    assert "bench_overhead.py" in readme.split("What the kit costs", 1)[1].split("\n\n", 1)[0]


@pytest.mark.gpu
def test_the_readme_recipe_runs_and_is_correct():
    readme = (ROOT / "README.md").read_text()
    recipe = readme.split("## The recipe, in plain PyTorch", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(recipe, "README recipe", "exec"), namespace)  # asserts its own result against eager
    assert namespace["g"].__class__.__name__ == "CUDAGraph"
