"""`reproduce` reports like a tool, on the CPU: a forecast only from a recorded run on the same kind of device, a
closing summary (each notebook, its time, where its outputs went, the failing cell, what did not run) and an exit
status that says whether everything succeeded. Real papermill kernels on three tiny notebooks."""
import json
import re

import pytest
import torch

from cudagraph_kit.__main__ import main
from cudagraph_kit.course.running import reproduce as rep

pytestmark = pytest.mark.notebook


@pytest.fixture
def course(tmp_path, monkeypatch):
    """Three notebooks (the second fails in its second cell), and recorded figures/ holding a GPU run's times."""
    nbs, figs = tmp_path / "notebooks", tmp_path / "figures"
    nbs.mkdir()
    figs.mkdir()
    (nbs / "91_alpha.py").write_text("# %%\nx = 1\n\n# %%\nprint('alpha', x)\n")
    (nbs / "92_beta.py").write_text("# %%\ny = 2\n\n# %%\nraise ValueError('beta breaks here')\n")
    (nbs / "93_gamma.py").write_text("# %%\nz = 3\n")
    (figs / "reproduce_times.json").write_text(json.dumps({
        "gpu": "NVIDIA H200", "smoke": False, "date": "2026-11-25",
        "notebooks": {"91_alpha": 75.0, "92_beta": 60.0, "93_gamma": 40.0}}))
    monkeypatch.setattr(rep, "NOTEBOOKS_DIR", nbs)
    monkeypatch.setattr(rep, "FIGURES_DIR", figs)
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return tmp_path


def test_forecast_comes_only_from_the_same_kind_of_device(course):
    src = course / "notebooks" / "91_alpha.py"
    build = course / "build"
    assert rep._forecast(src, "NVIDIA H200", False, build).startswith("a recorded run on NVIDIA H200 took 75 s")
    assert rep._forecast(src, "Tesla T4", False, build) == "no recorded run on Tesla T4 to forecast from"
    assert rep._forecast(src, None, False, build) == "no recorded run on the CPU to forecast from"
    assert "75 s" not in rep._forecast(src, "NVIDIA H200", True, build)  # a --smoke run is not a full one
    build.mkdir()
    (build / "reproduce_times.json").write_text(json.dumps({"gpu": None, "smoke": False, "date": "2026-11-26",
                                                            "notebooks": {"91_alpha": 9.6}}))
    assert rep._forecast(src, None, False, build) == "a recorded run on the CPU took 10 s (2026-11-26)"


def test_a_cpu_run_forecasts_from_no_gpu_run_sums_up_and_exits_non_zero(course, capsys):
    out, results = course / "build" / "notebooks", course / "build" / "figures"
    argv = ["reproduce", "--out", str(out), "--results", str(results)]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 1
    printed = capsys.readouterr().out
    assert "took 75 s" not in printed and "took 60 s" not in printed  # the GPU's times are no forecast here
    assert "91_alpha.py: no recorded run on the CPU to forecast from" in printed
    summary = printed[printed.index("reproduce: summary of run"):]
    assert re.search(r"summary of run \S+: 1 done, 1 FAILED, 1 not run", summary), summary
    assert re.search(rf"91_alpha\s+done\s+\d+ s\s+-> {re.escape(str(out / '91_alpha.ipynb'))}", summary), summary
    staged = course / "staging" / "92_beta" / "92_beta.ipynb"
    assert re.search(rf"92_beta\s+FAILED\s+\d+ s\s+at cell 2/2: raise ValueError\('beta breaks here'\); staged copy "
                     rf"{re.escape(str(staged))}", summary), summary
    assert re.search(r"93_gamma\s+not run$", summary, re.M), summary

    # run again with the notebook fixed: 91_alpha now has a CPU run to forecast from; all succeed, exit status 0
    (course / "notebooks" / "92_beta.py").write_text("# %%\ny = 2\n")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert re.search(r"91_alpha\.py: a recorded run on the CPU took \d+ s \(\d{4}-\d{2}-\d{2}\)", printed), printed
    assert "92_beta.py: no recorded run on the CPU to forecast from" in printed
    assert re.search(r"summary of run \S+: 3 done$", printed, re.M), printed
    for stem in ("91_alpha", "92_beta", "93_gamma"):
        assert (out / f"{stem}.ipynb").is_file()
