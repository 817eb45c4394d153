"""results save/load round trip, schema errors, and the env description."""
import json

import pandas as pd
import pytest

from cudagraph_kit import describe, env_table, results
from cudagraph_kit.__main__ import main


def test_save_load_round_trip(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame({"case": ["small"], "variant": ["eager"], "median_us": [12.5], "speedup": [1.0],
                       "floor_us": [3.0]})
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    folder = results.save("99_demo", df, figures={"curve": fig}, root=tmp_path)
    assert folder == tmp_path / "99_demo"
    rec = results.load("99_demo", root=tmp_path)
    pd.testing.assert_frame_equal(rec.df, df)
    assert rec.env["notebook"] == "99_demo" and "torch" in rec.env
    assert [p.name for p in rec.pngs] == ["curve.png"]
    assert "Recorded on" in rec.caption
    assert json.loads((folder / "env.json").read_text())["executed_as"] in ("cuda", "cpu (eager only)")


def test_save_rejects_missing_columns(tmp_path):
    with pytest.raises(ValueError, match=r"lack column\(s\) \['speedup'\]"):
        results.save("x", pd.DataFrame({"case": [1], "variant": [1], "median_us": [1]}), root=tmp_path)


def test_load_missing_returns_none_and_show_says_so(tmp_path, capsys):
    assert results.load("nothing", root=tmp_path) is None
    assert results.show_recorded("nothing", root=tmp_path) is None
    assert "No recorded results for nothing" in capsys.readouterr().out


def test_results_root_honours_env_and_never_defaults_to_figures_on_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("CGK_RESULTS_DIR", str(tmp_path))
    assert results.results_root() == tmp_path
    monkeypatch.delenv("CGK_RESULTS_DIR")
    import torch
    if not torch.cuda.is_available():
        assert results.results_root().parts[-2:] == ("build", "figures")


def test_describe_and_cli(capsys):
    info = describe()
    for key in ("gpu", "capability", "bf16", "driver", "torch", "cuda", "cudnn", "cpu", "python", "date"):
        assert key in info
    assert info["bf16"] in (True, False)
    assert "torch" in env_table(info)
    assert main(["env"]) == 0
    assert "python" in capsys.readouterr().out


@pytest.mark.notebook
def test_reproduce_without_cuda_leaves_recorded_gpu_results_alone(tmp_path, capsys):
    import torch
    from cudagraph_kit.reproduce import PROJECT_ROOT
    if torch.cuda.is_available():
        pytest.skip("on a GPU reproduce refreshes figures/ on purpose")
    recorded = PROJECT_ROOT / "figures" / "01_gelu" / "results.csv"
    before = recorded.read_bytes() if recorded.exists() else None
    assert main(["reproduce", "01", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "CUDA graphs need an NVIDIA GPU" in out and "[1/1] 01_gelu.py done" in out
    assert (tmp_path / "01_gelu.ipynb").is_file()
    assert (PROJECT_ROOT / "build" / "figures" / "01_gelu" / "results.csv").is_file()
    assert (recorded.read_bytes() if recorded.exists() else None) == before


def test_readme_results_are_generated_from_recorded_runs():
    import subprocess
    import sys
    from cudagraph_kit.reproduce import PROJECT_ROOT
    r = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "update_readme.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
