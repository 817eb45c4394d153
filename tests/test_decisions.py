"""docs/DECISIONS.md and docs/decision_chart.png: generated from the recorded results, current, and honest about
what is not recorded."""
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("decision_chart", ROOT / "scripts" / "decision_chart.py")
chart = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chart)


def test_decisions_are_current_linked_and_drawn():
    assert chart.main(["--check"]) == 0, "run python scripts/decision_chart.py --write"
    assert chart.PNG.is_file() and chart.PNG.stat().st_size > 20_000
    readme = (ROOT / "README.md").read_text()
    assert "docs/DECISIONS.md" in readme and "docs/CHEATSHEET.md" in readme


def test_every_tool_branch_links_the_notebook_that_measures_it():
    text = chart.DOC.read_text()
    for tool, notebook in [("No graph", "01_gelu.ipynb"), ("Buckets", "06_variable_shapes.ipynb"),
                           ("A whole-step graph", "02_train_step.ipynb"),
                           ('`torch.compile(mode="reduce-overhead")`', "03_jit_compile.ipynb"),
                           ("Partial capture", "02_train_step.ipynb")]:
        line = next(l for l in text.splitlines() if "→" in l and l.split("→", 1)[1].strip().startswith(tool))
        assert notebook in line, f"the {tool!r} branch does not link {notebook}"
        assert (ROOT / "notebooks" / notebook).is_file()
    assert "notebook 08" in text


def test_numbers_come_from_the_recorded_csvs_with_the_gpu_named():
    """Read from the recorded CSVs and env.json files here, not through the chart script's own facts()."""
    text = chart.DOC.read_text()
    figures = ROOT / "figures"
    for folder, where, column in [
        ("02_train_step", {"case": "MLP 32x128x256x16, SGD", "variant": "whole-step graph"}, "speedup"),
        ("06_variable_shapes", {"case": "MLP", "variant": "planned"}, "speedup"),
        ("03_jit_compile", {"case": "small", "variant": "reduce-overhead, naive (y = f(x))",
                            "phase": "1: before mark_step_begin"}, "speedup"),
    ]:
        df = pd.read_csv(figures / folder / "results.csv")
        rows = df[(df[list(where)] == pd.Series(where)).all(axis=1)]
        assert len(rows) == 1, (folder, where, len(rows))
        assert f"{rows[column].iloc[0]:.2f}x" in text, (folder, where, rows[column].iloc[0])
        gpu = json.loads((figures / folder / "env.json").read_text())["gpu"]
        assert gpu and gpu in text, (folder, gpu)
    crossover = json.loads((figures / "01_gelu" / "env.json").read_text())["crossover_numel"]
    assert f"{int(crossover):,}" in text


def test_without_recorded_results_the_branches_are_questions_without_numbers(tmp_path):
    shutil.copytree(ROOT / "figures" / "02_train_step", tmp_path / "02_train_step")  # only 02 is recorded
    text = chart.markdown(chart.facts(tmp_path))
    lines = {l.split("→")[1][:30]: l for l in text.splitlines() if "→" in l and "question" not in l}
    numbered = [l for l in lines.values() if re.search(r"\d\.\d\dx", l)]
    assert len(numbered) == 2 and all("02_train_step" in l for l in numbered)  # whole step and partial, from 02
    assert text.count("no result yet; measure it on your GPU") == 5  # 01 (twice), 08, 06, 03
    chart.draw(chart.facts(tmp_path), tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 10_000
