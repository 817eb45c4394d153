"""results: save/load, where recorded and fresh results live (never the same folder); env; the command line;
reproduce's choices, messages and output files."""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from cudagraph_kit import describe, env_table
from cudagraph_kit.course.measuring import results
from cudagraph_kit.course.running import reproduce as rep
from cudagraph_kit.__main__ import main
from cudagraph_kit.course.running.reproduce import FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT

FAKE_ENV = {"gpu": "Stand-in GPU", "driver": "1.0", "torch": "x", "cuda": "12.0", "date": "today"}


def _df():
    return pd.DataFrame({"case": ["small"], "variant": ["eager"], "median_us": [12.5], "speedup": [1.0],
                         "floor_us": [3.0]})


def _layout(root, with_figures=True):
    """A minimal source checkout (what results looks for) under ``root``."""
    for name in ("cudagraph_kit", "notebooks") + (("figures",) if with_figures else ()):
        (root / name).mkdir(parents=True)
    return root


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_save_load_round_trip(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    folder = results.save("99_demo", _df(), figures={"curve": fig}, root=tmp_path, extra_env={"note_x": 7})
    assert folder == tmp_path / "99_demo"
    rec = results.load("99_demo", root=tmp_path)
    pd.testing.assert_frame_equal(rec.df, _df())
    saved = json.loads((folder / "env.json").read_text())
    assert saved["notebook"] == "99_demo" and saved["torch"] == torch.__version__ and saved["note_x"] == 7
    assert saved["executed_as"] == ("cuda" if torch.cuda.is_available() else "cpu (eager only)")
    assert rec.env == saved
    assert [p.name for p in rec.pngs] == ["curve.png"]
    assert (folder / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    where = saved["gpu"] or "CPU only (no CUDA)"
    assert rec.caption.startswith(f"Recorded on {where} (driver ") and f"PyTorch {torch.__version__}" in rec.caption


def test_save_rejects_missing_columns(tmp_path):
    with pytest.raises(ValueError, match=r"lack column\(s\) \['speedup'\]"):
        results.save("x", pd.DataFrame({"case": [1], "variant": [1], "median_us": [1]}), root=tmp_path)
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_show_recorded_displays_the_recorded_run(tmp_path, capsys):
    results.save("99_demo", _df(), root=tmp_path)
    rec = results.show_recorded("99_demo", root=tmp_path)  # no IPython display here: prints caption and table
    out = capsys.readouterr().out
    assert rec is not None and out.startswith(rec.caption) and "12.5" in out


def test_show_recorded_says_where_it_looked(tmp_path, capsys, monkeypatch):
    assert results.show_recorded("nothing", root=tmp_path) is None
    assert f"nothing under {tmp_path / 'nothing'}" in capsys.readouterr().out
    # outside any checkout (a pip-installed kit, a copied notebook): it says so and where the results are
    monkeypatch.setattr(results, "_PACKAGE_PARENT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert results.recorded_root() is None and results.load("01_gelu") is None
    assert results.show_recorded("01_gelu") is None
    out = capsys.readouterr().out
    assert "no source checkout found" in out and str(tmp_path) in out and rep.repository_url() in out


def test_fresh_results_never_default_to_the_recorded_figures(monkeypatch, tmp_path):
    monkeypatch.setenv("CGK_RESULTS_DIR", str(tmp_path / "chosen"))
    assert results.results_root() == tmp_path / "chosen"
    monkeypatch.delenv("CGK_RESULTS_DIR")
    for cuda in (False, True):  # with or without a GPU
        monkeypatch.setattr(results, "has_cuda", lambda: cuda)
        assert results.results_root() == PROJECT_ROOT / "build" / "figures"
        assert results.recorded_root() == FIGURES_DIR
    # outside a checkout: a folder of its own in the working directory
    monkeypatch.setattr(results, "_PACKAGE_PARENT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert results.results_root() == tmp_path / "cudagraph-kit-results"


def test_simulated_gpu_run_saves_beside_figures_and_leaves_them_untouched(monkeypatch, tmp_path):
    """A GPU learner/test run (has_cuda True) in a checkout: save() writes build/figures, never figures/."""
    checkout = _layout(tmp_path / "checkout")
    shutil.copytree(FIGURES_DIR / "01_gelu", checkout / "figures" / "01_gelu")
    before = _snapshot(checkout / "figures")
    monkeypatch.setattr(results, "_PACKAGE_PARENT", checkout)
    monkeypatch.setattr(results, "has_cuda", lambda: True)
    monkeypatch.setattr(results, "describe", lambda: dict(FAKE_ENV))
    monkeypatch.delenv("CGK_RESULTS_DIR", raising=False)
    folder = results.save("01_gelu", _df())
    assert folder == checkout / "build" / "figures" / "01_gelu"
    assert json.loads((folder / "env.json").read_text())["executed_as"] == "cuda"
    assert _snapshot(checkout / "figures") == before
    recorded = results.load("01_gelu")  # "recorded" still means the committed run, not the one just made
    assert recorded.dir == checkout / "figures" / "01_gelu" and len(recorded.df) > 1


def test_colab_clone_layout_is_found_from_its_notebooks_folder(monkeypatch, tmp_path):
    """A kit installed elsewhere, working directory = <clone>/notebooks (what Colab's setup cell does)."""
    clone = _layout(tmp_path / "cudagraph-kit")
    shutil.copytree(FIGURES_DIR / "01_gelu", clone / "figures" / "01_gelu")
    monkeypatch.setattr(results, "_PACKAGE_PARENT", tmp_path / "site-packages")
    monkeypatch.chdir(clone / "notebooks")
    monkeypatch.delenv("CGK_RESULTS_DIR", raising=False)
    assert results.recorded_root() == clone / "figures"
    assert results.results_root() == clone / "build" / "figures"
    assert results.load("01_gelu").dir == clone / "figures" / "01_gelu"


def test_reproduce_writes_figures_only_when_recording_on_a_gpu(monkeypatch, tmp_path, capsys):
    """Simulated GPU: `reproduce` publishes into figures/ and notebooks/ only without --smoke; each notebook runs
    into the staging folder first. Nothing is executed here (a stand-in kernel) and nothing is published."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(rep, "execute_notebook", lambda src, out, params, results_dir, **kw: calls.append(
        (src.stem, out, params, results_dir, kw["run"]["gpu"])) or out)
    monkeypatch.setattr(rep, "_stamp_run", lambda *a: None)
    published = []
    monkeypatch.setattr(rep, "_publish", lambda stem, nb, res, out_dir, results_dir, run, seconds, **versions:
                        published.append((stem, out_dir, results_dir, run["smoke"])))
    rep.reproduce(["01"], smoke=True)
    rep.reproduce(["01"])
    rep.reproduce(["01"], out_dir=tmp_path / "nb", results_dir=tmp_path / "res")
    staged = (tmp_path / "staging" / "01_gelu" / "01_gelu.ipynb", tmp_path / "staging" / "01_gelu" / "results")
    assert calls == [("01_gelu", staged[0], {"SMOKE": True}, staged[1], "Stand-in GPU"),
                     ("01_gelu", staged[0], {}, staged[1], "Stand-in GPU"),
                     ("01_gelu", staged[0], {}, staged[1], "Stand-in GPU")]
    assert published == [("01_gelu", PROJECT_ROOT / "build" / "notebooks", PROJECT_ROOT / "build" / "figures", True),
                         ("01_gelu", NOTEBOOKS_DIR, FIGURES_DIR, False), ("01_gelu", tmp_path / "nb", tmp_path / "res",
                                                                          False)]
    out = capsys.readouterr().out
    assert out.count("on CUDA: Stand-in GPU") == 3 and "small sizes (--smoke)" in out


def test_describe_and_cli(capsys):
    info = describe()
    assert list(info)[:10] == ["gpu", "capability", "bf16", "gpu_memory_gib", "driver", "torch", "cuda", "cudnn",
                               "cpu", "cpu_count"]
    assert info["torch"] == torch.__version__ and info["python"] == platform.python_version()
    assert info["bf16"] is (torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 0))
    assert (info["gpu"] is None) == (not torch.cuda.is_available())
    table = env_table(info).splitlines()
    assert len(table) == len(info)
    assert re.fullmatch(rf"torch\s+{re.escape(torch.__version__)}", next(l for l in table if l.startswith("torch ")))
    assert main(["env"]) == 0
    printed = capsys.readouterr().out
    assert re.search(rf"(?m)^python\s+{re.escape(platform.python_version())}$", printed)


def test_a_regular_pip_install_elsewhere_works_and_says_what_needs_the_checkout(tmp_path):
    """`pip install .` (not editable) into a virtual environment, used from a project that is not this checkout:
    the helpers import from the installed copy, `env` runs, and what needs the checkout says so clearly."""
    from test_colab_setup import _kernel_venv

    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(PROJECT_ROOT / "cudagraph_kit", src / "cudagraph_kit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # LICENSE: pyproject's license-files
        shutil.copy(PROJECT_ROOT / name, src / name)
    venv = _kernel_venv(tmp_path / "venv")  # sees this environment's packages (torch, pip); installs into its own
    python = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    installed = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps",
                                str(src)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    work = tmp_path / "other-project"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CGK_RESULTS_DIR", "VIRTUAL_ENV")}

    def run(*args):
        return subprocess.run([python, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    helper = run("-c", "import cudagraph_kit; from cudagraph_kit.graphed import capture; "
                       "from cudagraph_kit.timing import compare; from cudagraph_kit import capture_buckets; "
                       "print(cudagraph_kit.__file__); print(capture.__module__, compare.__module__); "
                       "print(cudagraph_kit.__version__, capture_buckets.__module__)")
    assert helper.returncode == 0, helper.stderr
    where = Path(helper.stdout.splitlines()[0]).resolve()
    assert venv.resolve() in where.parents and PROJECT_ROOT not in where.parents  # the installed copy, not the checkout
    assert helper.stdout.splitlines()[1] == "cudagraph_kit.graphed cudagraph_kit.timing"
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
        import tomli as tomllib
    version = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert helper.stdout.splitlines()[2] == f"{version} cudagraph_kit.bucket_graphs"  # from the installed metadata
    shown = run("-m", "cudagraph_kit", "env")
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"(?m)^torch\s+{re.escape(torch.__version__)}$", shown.stdout)
    for command in (["reproduce"], ["lab", "--no-browser"], ["check-figures"]):
        done = run("-m", "cudagraph_kit", *command)
        assert done.returncode == 1, (command, done.stdout + done.stderr)
        assert "The notebooks live in a source checkout" in done.stderr, (command, done.stderr)
        assert f"git clone {rep.repository_url()} cudagraph-kit" in done.stderr
        assert str(where.parent) in done.stderr  # it ran the installed copy, and says where that is
        assert "Traceback" not in done.stderr and "no notebook matches" not in done.stderr
        # it points at what a learner runs there, never at the maintainers' recording command
        assert "python -m cudagraph_kit lab" in done.stderr and "python -m cudagraph_kit reproduce --smoke" in done.stderr
        assert not re.search(r"cudagraph_kit reproduce\s*$", done.stderr, re.M), done.stderr
    recorded = run("-c", "from cudagraph_kit.course.measuring import results; results.show_recorded('01_gelu')")
    assert recorded.returncode == 0 and "no source checkout found" in recorded.stdout, recorded.stderr
    assert not list(work.iterdir())  # nothing written into the user's project


@pytest.mark.notebook
def test_reproduce_without_cuda_leaves_recorded_results_alone_and_reports_progress(tmp_path, capfd):
    if torch.cuda.is_available():
        pytest.skip("on a GPU reproduce refreshes figures/ on purpose")
    before = _snapshot(FIGURES_DIR)
    committed = (NOTEBOOKS_DIR / "01_gelu.ipynb").read_bytes()
    assert main(["reproduce", "01", "--out", str(tmp_path / "nb"), "--results", str(tmp_path / "res")]) == 0
    out, err = capfd.readouterr()
    assert "CUDA graphs need an NVIDIA GPU" in out and "[1/1] 01_gelu.py done" in out
    # said before it starts: a GPU run's time is no forecast for a CPU run (tests/test_reproduce_report.py)
    assert "[1/1] 01_gelu.py: no recorded run on the CPU to forecast from" in out
    assert "on the recorded run]" not in out  # nor are the GPU run's cell times
    cells = re.findall(r"(?m)^    cell +(\d+)/(\d+)  ", out)  # one line per code cell as it starts
    assert cells and [int(n) for n, _ in cells] == list(range(1, int(cells[0][1]) + 1))
    assert "without encryption" not in out + err  # the kernel's transport is encrypted, so no TCP warning
    executed = (tmp_path / "nb" / "01_gelu.ipynb").read_text()
    assert str(PROJECT_ROOT) not in executed and "input_path" not in executed  # no machine paths
    saved = pd.read_csv(tmp_path / "res" / "01_gelu" / "results.csv")
    assert (saved.executed_as == "eager").all()
    assert _snapshot(FIGURES_DIR) == before and (NOTEBOOKS_DIR / "01_gelu.ipynb").read_bytes() == committed


def test_strip_machine_paths_rewrites_outputs_and_metadata():
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text=f"saved to {PROJECT_ROOT}/figures/01_gelu\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": f"{rep.sysconfig.get_paths()['purelib']}/torch/x.py"}),
        nbformat.v4.new_output("error", ename="E", evalue="v", traceback=[f"File {PROJECT_ROOT}/a.py"]),
    ])])
    nb.metadata["papermill"] = {"input_path": "/abs/in.ipynb", "output_path": "/abs/out.ipynb", "duration": 3.0}
    rep.strip_machine_paths(nb)
    outs = nb.cells[0].outputs
    assert outs[0].text == "saved to <checkout>/figures/01_gelu\n"
    assert outs[1].data["text/plain"] == "<site-packages>/torch/x.py"
    assert outs[2].traceback == ["File <checkout>/a.py"]
    assert nb.metadata["papermill"] == {"duration": 3.0}


def test_readme_results_are_generated_from_recorded_runs():
    r = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "update_readme.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_figures_guard_notices_added_changed_and_removed_files(tmp_path):
    """The session guard in conftest (a test run must leave figures/ as it found it) sees every kind of change."""
    import conftest
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.csv").write_text("x\n")
    (tmp_path / "a" / "env.json").write_text("{}\n")
    before = conftest.figures_snapshot(tmp_path)
    assert conftest.figures_changes(before, conftest.figures_snapshot(tmp_path)) == []
    (tmp_path / "a" / "results.csv").write_text("y\n")
    (tmp_path / "a" / "env.json").unlink()
    (tmp_path / "b.png").write_bytes(b"png")
    assert conftest.figures_changes(before, conftest.figures_snapshot(tmp_path)) == ["a/env.json", "a/results.csv",
                                                                                      "b.png"]
