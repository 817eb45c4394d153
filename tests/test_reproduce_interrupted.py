"""reproduce stops without damage: a failed or interrupted notebook publishes nothing, the committed notebooks
and results stay byte-identical, and --resume finishes the same run. check-figures sees a mix of runs.

The "committed" files here are a stand-in checkout in a temporary folder (notebooks/ and figures/ of three small
notebooks); a simulated GPU makes reproduce write there, as it writes the real ones on a GPU."""
import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import nbformat
import pandas as pd
import pytest
import torch

from cudagraph_kit.course.running import files, runs
from cudagraph_kit.course.measuring import results
from cudagraph_kit.course.running import reproduce as rep
from cudagraph_kit.course.running.paths import git
from cudagraph_kit.__main__ import main

STEMS = ("91_alpha", "92_beta", "93_gamma")


def _snapshot(*folders):
    return {str(p): p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def _df(value):
    return pd.DataFrame({"case": ["c"], "variant": ["eager"], "median_us": [value], "speedup": [1.0]})


def _source(stem, body="x = 1"):
    return f"# %% tags=[\"parameters\"]\nSMOKE = False\n\n# %%\n{body}\n"


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """notebooks/ and figures/ with an older run of three notebooks (plus a stale PNG), on a stand-in GPU."""
    nbs, figs = tmp_path / "notebooks", tmp_path / "figures"
    nbs.mkdir()
    for stem in STEMS:
        (nbs / f"{stem}.py").write_text(_source(stem))
        old = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="old GPU output\n")])])
        nbformat.write(old, nbs / f"{stem}.ipynb")
        results.save(stem, _df(1.0), root=figs, extra_env={"gpu": "Old GPU"})
        (figs / stem / "stale_from_old_run.png").write_bytes(b"old")
    (figs / "reproduce_times.json").write_text(json.dumps({"gpu": "Old GPU", "notebooks": {}, "smoke": False}))
    monkeypatch.setattr(rep, "NOTEBOOKS_DIR", nbs)
    monkeypatch.setattr(rep, "FIGURES_DIR", figs)
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(rep, "run_benchmarks", lambda *a, **k: None)
    monkeypatch.setattr(results, "describe", lambda: {"gpu": "Stand-in GPU", "torch": torch.__version__,
                                                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    return tmp_path


class FakeKernel:
    """Stands in for papermill: writes the executed notebook cell by cell and saves results as a notebook does;
    ``stop`` = (stem, after which step, exception) makes it fail or be interrupted there."""

    STEPS = ("cell 1", "results saved", "cell 3")

    def __init__(self, stop=None):
        self.stop, self.ran = stop, []

    def __call__(self, src, output, params, results_dir, progress=False, run=None, **kernel):
        self.ran.append(src.stem)
        nb = nbformat.v4.new_notebook()
        for step in self.STEPS:
            nb.cells.append(nbformat.v4.new_code_cell(f"# {step}\nstep = {step!r}", outputs=[
                nbformat.v4.new_output("stream", name="stdout", text=f"{src.stem} new run {step}\n")]))
            output.parent.mkdir(parents=True, exist_ok=True)
            if step == "results saved":
                os.environ["CGK_RUN"] = json.dumps(run)
                try:
                    results.save(src.stem, _df(2.0), root=results_dir)
                finally:
                    del os.environ["CGK_RUN"]
            if self.stop and self.stop[:2] == (src.stem, step):
                nb.cells[-1].outputs.append(nbformat.v4.new_output("error", ename="E", evalue="v", traceback=["tb"]))
                nbformat.write(nb, output)  # papermill writes the notebook after every cell
                raise self.stop[2]
            nbformat.write(nb, output)
        return output


def _committed(checkout):
    return _snapshot(checkout / "notebooks", checkout / "figures")


def _run_ids(checkout):
    env = {s: json.loads((checkout / "figures" / s / "env.json").read_text()).get("run", {}).get("id") for s in STEMS}
    nbs = {s: nbformat.read(checkout / "notebooks" / f"{s}.ipynb", as_version=4).metadata.get("cudagraph_kit", {})
           .get("run", {}).get("id") for s in STEMS}
    return env, nbs


@pytest.mark.parametrize("stop", [
    ("91_alpha", "cell 1", KeyboardInterrupt()),          # Ctrl-C in the first notebook's first cell
    ("91_alpha", "results saved", KeyboardInterrupt()),   # after its results were written, before it finished
    ("91_alpha", "cell 3", RuntimeError("a cell failed")),  # a failing cell
], ids=["interrupted-first-cell", "interrupted-after-results", "failed-cell"])
def test_a_stopped_notebook_leaves_the_committed_files_byte_identical(checkout, monkeypatch, capsys, stop):
    before = _committed(checkout)
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel(stop))
    with pytest.raises(rep.RunStopped) as stopped:
        rep.reproduce()
    assert stopped.value.code == (130 if isinstance(stop[2], KeyboardInterrupt) else 1)
    assert _committed(checkout) == before
    err = capsys.readouterr().err
    staged = checkout / "staging" / "91_alpha" / "91_alpha.ipynb"
    what = "was interrupted" if isinstance(stop[2], KeyboardInterrupt) else "failed (RuntimeError)"
    assert f"91_alpha.py {what}; nothing of it was published" in err
    cell = FakeKernel.STEPS.index(stop[1]) + 1
    assert f"its executed copy so far: {staged} (cell {cell}/{cell}: step = {stop[1]!r})" in err
    assert "go on with: python -m cudagraph_kit reproduce (nothing of this run was published yet)" in err


def test_interrupted_at_several_points_then_resumed_gives_one_run(checkout, monkeypatch, capsys,
                                                               sigint_raises_keyboardinterrupt):
    before = _committed(checkout)
    # 1. interrupted in the second notebook, after its results were written: the first is published whole
    kernel = FakeKernel(("92_beta", "results saved", KeyboardInterrupt()))
    monkeypatch.setattr(rep, "execute_notebook", kernel)
    with pytest.raises(rep.RunStopped):
        rep.reproduce()
    assert "go on with: python -m cudagraph_kit reproduce --resume\n" in capsys.readouterr().err
    after = _committed(checkout)
    for stem in ("92_beta", "93_gamma"):
        assert {k: v for k, v in after.items() if stem in k} == {k: v for k, v in before.items() if stem in k}
    env, nbs = _run_ids(checkout)
    run_id = env["91_alpha"]
    assert run_id and nbs["91_alpha"] == run_id and env["92_beta"] is None
    assert not (checkout / "figures" / "91_alpha" / "stale_from_old_run.png").exists()  # replaced whole
    assert (checkout / "figures" / "92_beta" / "stale_from_old_run.png").exists()
    # 2. interrupted (SIGINT) while the third notebook is being published: held back until it is whole
    kernel = FakeKernel()
    monkeypatch.setattr(rep, "execute_notebook", kernel)
    real_replace_folder = files.replace_folder

    def interrupted_mid_publish(new, target):
        real_replace_folder(new, target)
        if target.name == "92_beta":
            signal.raise_signal(signal.SIGINT)  # between the results folder and the notebook
    monkeypatch.setattr(files, "replace_folder", interrupted_mid_publish)
    with pytest.raises(rep.RunStopped) as stopped:
        rep.reproduce(resume=True)
    assert stopped.value.code == 130 and kernel.ran == ["92_beta"]
    env, nbs = _run_ids(checkout)
    assert env["92_beta"] == nbs["92_beta"] == run_id  # results and notebook published together
    assert env["93_gamma"] is None
    monkeypatch.setattr(files, "replace_folder", real_replace_folder)
    # 3. resume finishes the run: only the notebook not yet published runs
    kernel = FakeKernel()
    monkeypatch.setattr(rep, "execute_notebook", kernel)
    capsys.readouterr()
    rep.reproduce(resume=True)
    assert kernel.ran == ["93_gamma"]
    out = capsys.readouterr().out
    assert f"[1/3] 91_alpha.py: published by run {run_id} already; skipped" in out
    env, nbs = _run_ids(checkout)
    assert set(env.values()) == set(nbs.values()) == {run_id}
    report = runs.check_figures(checkout / "figures", checkout / "notebooks")
    assert report.one_run, report.text()
    assert "every result comes from one run" in report.text()
    times = json.loads((checkout / "figures" / "reproduce_times.json").read_text())
    assert times["run"]["id"] == run_id and sorted(times["notebooks"]) == list(STEMS)
    assert times["gpu"] == "Stand-in GPU" and times["run"]["torch"] == torch.__version__
    assert not any(p.name.startswith(".") for p in (checkout / "figures").iterdir()
                   if p.name != ".gitkeep"), "leftover temporary folders"


def test_resume_refuses_to_mix_a_run_with_another_setup(checkout, monkeypatch):
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel(("92_beta", "cell 1", KeyboardInterrupt())))
    with pytest.raises(rep.RunStopped):
        rep.reproduce()
    before = _committed(checkout)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Another GPU")
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    with pytest.raises(SystemExit, match=r"(?s)cannot go on here.*gpu: 'Stand-in GPU' in run .*'Another GPU' now"):
        rep.reproduce(resume=True)
    assert _committed(checkout) == before


def test_resume_without_a_named_run_says_to_start_one(checkout, monkeypatch):
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    with pytest.raises(SystemExit, match="names no run to go on with"):
        rep.reproduce(resume=True)


def test_check_figures_reports_a_mix_of_runs(checkout, monkeypatch, capsys):
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    rep.reproduce(["91"])  # one notebook refreshed: figures/ now holds a new run and an old one
    report = runs.check_figures(checkout / "figures", checkout / "notebooks")
    assert not report.one_run
    new_run = report.group_of("91_alpha").run
    assert new_run["gpu"] == "Stand-in GPU" and report.group_of("92_beta").run is None
    text = report.text()
    assert "MIXES RESULTS: 2 group(s) of results, 1 named run(s) and 1 group(s) that name no run" in text
    assert f"- run {new_run['id']} (Stand-in GPU, PyTorch {torch.__version__}" in text and ": 91_alpha" in text
    assert "- no run id recorded (Old GPU" in text and "92_beta, 93_gamma" in text
    # a notebook published by one run beside results of another is caught too
    nb = nbformat.read(checkout / "notebooks" / "92_beta.ipynb", as_version=4)
    nb.metadata["cudagraph_kit"] = {"run": new_run}
    nbformat.write(nb, checkout / "notebooks" / "92_beta.ipynb")
    report = runs.check_figures(checkout / "figures", checkout / "notebooks")
    assert f"92_beta: notebook from run {new_run['id']}, results from run (none named)" in report.text()
    # two named runs on different GPUs: the command line says so and exits 1
    env_path = checkout / "figures" / "92_beta" / "env.json"
    env = json.loads(env_path.read_text())
    env["run"] = dict(new_run, id="20990101T000000Z-other", gpu="Another GPU")
    env_path.write_text(json.dumps(env))
    assert main(["check-figures", "--figures", str(checkout / "figures")]) == 1
    out = capsys.readouterr().out
    assert "run 20990101T000000Z-other" in out and f"run {new_run['id']}" in out
    # one run everywhere: exit 0
    for stem in ("92_beta", "93_gamma"):
        env_path = checkout / "figures" / stem / "env.json"
        env_path.write_text(json.dumps(dict(json.loads(env_path.read_text()), run=new_run)))
    assert main(["check-figures", "--figures", str(checkout / "figures")]) == 0
    assert "every result comes from one run" in capsys.readouterr().out


def test_the_committed_figures_are_reported_with_their_runs():
    """The committed figures/: every notebook's results come from one run (`check-figures` passes); the results
    recorded apart from it (no run id, no notebook's folder) are listed as such, each with its GPU and date."""
    report = runs.check_figures()
    folders = sorted(p.parent.name for p in rep.FIGURES_DIR.glob("*/env.json"))
    assert sorted(f for g in [*report.groups, *report.apart] for f in g.folders) == folders
    text = report.text()
    for g in [*report.groups, *report.apart]:
        assert f"- {g.label}: {', '.join(g.folders)}" in text
    notebooks = {p.stem for p in rep.notebook_sources(rep.NOTEBOOKS_DIR)}
    for g in report.apart:
        assert g.run is None and not set(g.folders) & notebooks, g.folders
    assert report.one_run, text
    assert main(["check-figures"]) == 0


def test_results_without_a_run_id_count_only_where_they_belong_to_a_notebook(checkout, monkeypatch):
    """A probe's folder (no run id, no notebook) is reported apart; a notebook's folder without a run id mixes."""
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    rep.reproduce()
    probe = checkout / "figures" / "09_probe"
    probe.mkdir()
    (probe / "env.json").write_text(json.dumps({"gpu": "Probe GPU", "torch": "2.0", "date": "2020-01-01"}))
    report = runs.check_figures(checkout / "figures", checkout / "notebooks")
    assert report.one_run and [g.folders for g in report.apart] == [["09_probe"]], report.text()
    assert "Recorded apart from any run" in report.text() and "Probe GPU" in report.text()
    env_path = checkout / "figures" / "92_beta" / "env.json"
    env_path.write_text(json.dumps({k: v for k, v in json.loads(env_path.read_text()).items() if k != "run"}))
    report = runs.check_figures(checkout / "figures", checkout / "notebooks")
    assert not report.one_run and report.group_of("92_beta") in report.groups, report.text()


def test_readme_says_which_results_come_from_which_run():
    """Every results folder docs/RESULTS.md shows is listed under its run in its provenance paragraph."""
    readme = (rep.PROJECT_ROOT / "docs" / "RESULTS.md").read_text()
    section = readme.split("<!-- results:start -->", 1)[1].split("<!-- results:end -->", 1)[0]
    report = runs.check_figures()
    assert "**Where these results come from.**" in section
    shown = sorted({f for f in (p.parent.name for p in rep.FIGURES_DIR.glob("*/env.json"))
                    if f"figures/{f}/" in section or f"(notebook {f[:2]}" in section or f in section})
    assert shown
    for folder in shown:
        group = report.group_of(folder)
        assert group is not None
        line = next((ln for ln in section.splitlines() if ln.startswith("- ") and group.label in ln), None)
        assert line is not None and f"`{folder}`" in line, (folder, group.label)
    if not report.one_run:
        assert f"come from {len(report.groups)} " in section


def test_a_real_failing_notebook_publishes_nothing(checkout, monkeypatch, capsys):
    """papermill and a kernel on the CPU: the second cell saves results, the third raises."""
    (checkout / "notebooks" / "91_alpha.py").write_text(textwrap.dedent('''\
        # %% tags=["parameters"]
        SMOKE = False

        # %%
        import pandas as pd
        from cudagraph_kit.course.measuring import results
        results.save("91_alpha", pd.DataFrame({"case": ["c"], "variant": ["eager"], "median_us": [2.0],
                                               "speedup": [1.0]}))

        # %%
        raise RuntimeError("deliberately failing cell")

        # %%
        print("never reached")
        '''))
    before = _committed(checkout)
    with pytest.raises(rep.RunStopped) as stopped:
        rep.reproduce(["91"])
    assert stopped.value.code == 1
    assert _committed(checkout) == before
    err = capsys.readouterr().err
    staged = checkout / "staging" / "91_alpha" / "91_alpha.ipynb"
    assert f"its executed copy so far: {staged} (cell 3/4: raise RuntimeError(\"deliberately failing cell\"))" in err
    assert (checkout / "staging" / "91_alpha" / "results" / "91_alpha" / "results.csv").is_file()  # staged only
    # the fix, then --resume: the run goes on and publishes
    (checkout / "notebooks" / "91_alpha.py").write_text(
        (checkout / "notebooks" / "91_alpha.py").read_text().replace('raise RuntimeError("deliberately failing cell")',
                                                                     'print("fixed")'))
    with pytest.raises(SystemExit, match="names no run"):  # nothing of that run was published: nothing to go on with
        rep.reproduce(["91"], resume=True)
    rep.reproduce(["91"])
    env = json.loads((checkout / "figures" / "91_alpha" / "env.json").read_text())
    assert env["run"]["gpu"] == "Stand-in GPU"
    assert env["run"]["commit"] == git(rep.PROJECT_ROOT, "rev-parse", "HEAD")
    assert "fixed" in (checkout / "notebooks" / "91_alpha.ipynb").read_text()


DRIVER = '''
import signal, sys, torch
# Ctrl-C as in a terminal, however the test run was started: a background job (`cmd &` in a script) inherits
# SIGINT as ignored, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from cudagraph_kit.course.running import reproduce as rep
root = Path(sys.argv[1])
rep.NOTEBOOKS_DIR, rep.FIGURES_DIR, rep.STAGING_DIR = root / "notebooks", root / "figures", root / "staging"
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "Stand-in GPU"
sys.exit(__import__("cudagraph_kit.__main__", fromlist=["main"]).main(["reproduce", "91"]))
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_real_notebook_interrupted_midway_publishes_nothing(checkout, sig):
    """`timeout -s INT` (or a job's SIGTERM) while a real kernel runs the second cell of a notebook."""
    (checkout / "notebooks" / "91_alpha.py").write_text(
        '# %% tags=["parameters"]\nSMOKE = False\n\n# %%\nprint("started", flush=True)\n\n# %%\nimport time\n'
        'time.sleep(60)\n\n# %%\nprint("never reached")\n')
    before = _committed(checkout)
    (checkout / "driver.py").write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(rep.PROJECT_ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(checkout / "driver.py"), str(checkout)], cwd=checkout, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 120
    while "cell  3/4" not in seen and time.monotonic() < deadline:  # the sleeping cell has started
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert "cell  3/4" in seen, seen + proc.stderr.read()
    time.sleep(2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + out + err
    assert "91_alpha.py was interrupted; nothing of it was published" in err
    assert "(cell 3/4: import time)" in err, err
    assert _committed(checkout) == before


FAKE_BENCHMARK = '''
import os, sys
import pandas as pd
from cudagraph_kit.course.measuring import results
seen = results.load("91_alpha", root=results.results_root())  # the notebooks' results it compares with
results.save("00_fake_bench", pd.DataFrame({"case": ["c"], "variant": ["v"], "speedup": [1.0],
                                            "median_us": [float(seen.df.median_us.iloc[0]) if seen else -1.0]}))
if os.environ.get("CGK_FAKE_BENCH_FAILS"):
    sys.exit(3)
'''


def test_benchmarks_publish_their_results_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """The benchmarks after the notebooks (GPU only) run into the staging folder too, seeded with the results
    published so far (the cross-check compares with them); a failing one publishes nothing."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "scripts" / "fake_bench.py").write_text(FAKE_BENCHMARK)
    figs = tmp_path / "figures"
    results.save("91_alpha", _df(5.0), root=figs)
    results.save("00_fake_bench", _df(9.0), root=figs)
    (figs / "00_fake_bench" / "stale.png").write_bytes(b"old")
    monkeypatch.setattr(rep, "PROJECT_ROOT", project)
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(rep, "BENCHMARKS", {"fake_bench.py": "00_fake_bench"})
    monkeypatch.setenv("PYTHONPATH", str(rep.FIGURES_DIR.parent))  # the kit, for the script
    run = runs.new_run(rep.FIGURES_DIR.parent, "Stand-in GPU", smoke=False)
    before = _snapshot(figs)
    monkeypatch.setenv("CGK_FAKE_BENCH_FAILS", "1")
    with pytest.raises(rep.RunStopped) as stopped:
        rep.run_benchmarks(figs, run, "python -m cudagraph_kit reproduce --resume")
    assert stopped.value.code == 1 and _snapshot(figs) == before
    assert "scripts/fake_bench.py failed; nothing of it was published" in capsys.readouterr().err
    monkeypatch.delenv("CGK_FAKE_BENCH_FAILS")
    rep.run_benchmarks(figs, run)
    published = results.load("00_fake_bench", root=figs)
    assert published.df.median_us.iloc[0] == 5.0  # it read the notebook's published result
    assert published.env["run"]["id"] == run["id"] and not (figs / "00_fake_bench" / "stale.png").exists()
    assert _snapshot(figs / "91_alpha") == {k: v for k, v in before.items() if "91_alpha" in k}
    times = json.loads((figs / "reproduce_times.json").read_text())
    assert times["run"]["id"] == run["id"] and list(times["benchmarks"]) == ["fake_bench.py"]
    rep.run_benchmarks(figs, run)  # resumed: done already
    assert "scripts/fake_bench.py: published by this run already; skipped" in capsys.readouterr().out


def test_each_published_results_folder_holds_the_versions_the_run_had(checkout, monkeypatch, capsys):
    """`versions.txt` beside each results folder a run publishes: a requirements file of its versions (torch as it
    runs, the index of its build, a package it lacked named in a comment), headed by the run; installable by pip's
    own parser."""
    from importlib import metadata

    real_version = metadata.version

    def version(name):  # transformers missing from this run, numpy at a version of its own
        if name == "transformers":
            raise metadata.PackageNotFoundError(name)
        return "1.2.3" if name == "numpy" else real_version(name)
    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    rep.reproduce(["91", "92"])
    run_id = json.loads((checkout / "figures" / "91_alpha" / "env.json").read_text())["run"]["id"]
    for stem in ("91_alpha", "92_beta"):
        text = (checkout / "figures" / stem / "versions.txt").read_text()
        assert f"reproduce run {run_id} ran on (Stand-in GPU; Python {platform.python_version()}" in text, text
        assert f"\ntorch=={torch.__version__}\n" in text and "\nnumpy==1.2.3\n" in text, text
        assert "# transformers: not installed in this run" in text, text
        if "+" in torch.__version__:
            index = f"--extra-index-url https://download.pytorch.org/whl/{torch.__version__.split('+')[1]}\n"
            assert index in text
        from packaging.requirements import Requirement
        pins = [Requirement(line) for line in text.splitlines() if line and not line.startswith(("#", "--"))]
        assert {r.name for r in pins} >= {"torch", "numpy", "pandas", "matplotlib"}
        assert all(str(r.specifier).startswith("==") for r in pins)
    assert not (checkout / "figures" / "93_gamma" / "versions.txt").exists()  # not published by this run
    assert "reproduce: versions: torch" in capsys.readouterr().out
    assert not (rep.PROJECT_ROOT / "figures" / "91_alpha").exists()  # the checkout's own figures/ untouched
