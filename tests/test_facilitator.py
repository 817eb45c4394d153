"""docs/FACILITATOR.md: its timings table is generated from measured runs, never typed by hand, and is up to date."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("facilitator_timings", ROOT / "scripts" / "facilitator_timings.py")
timings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timings)


def test_guide_exists_is_linked_and_its_table_is_current():
    assert timings.GUIDE.is_file()
    assert "docs/FACILITATOR.md" in (ROOT / "README.md").read_text()
    assert timings.main(["--check"]) == 0, "run python scripts/facilitator_timings.py --write"


def test_table_comes_from_the_json_runs_and_names_each_gpu(tmp_path):
    run = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-11-21T10:00:00",
           "notebooks": {"01_gelu": 19.4, "02_train_step": 128.0}}
    (tmp_path / "reproduce_times.json").write_text(json.dumps(run))
    block = timings.render(timings.load_runs(tmp_path), ["01_gelu", "02_train_step", "03_jit_compile"])
    assert block.startswith(timings.START) and block.endswith(timings.END)
    assert "NVIDIA H200 (PyTorch 2.11.0+cu130, 2026-11-21)" in block
    assert "| 01_gelu | 19 s |" in block and "| 02_train_step | 2.1 min |" in block
    assert "| 03_jit_compile | not run |" in block
    assert "T4 (Colab's free GPU): not measured yet" in block
    t4 = dict(run, gpu="Tesla T4", notebooks={"01_gelu": 95.0})
    (tmp_path / "reproduce_times_t4.json").write_text(json.dumps(t4))
    block = timings.render(timings.load_runs(tmp_path), ["01_gelu"])
    assert "Tesla T4" in block and "1.6 min" in block and "not measured yet" not in block


def test_without_runs_the_guide_says_nothing_is_measured(tmp_path):
    block = timings.render(timings.load_runs(tmp_path), ["01_gelu"])
    assert "No measured run is recorded yet" in block and "|" not in block


def test_a_malformed_run_is_refused(tmp_path):
    (tmp_path / "reproduce_times.json").write_text(json.dumps({"notebooks": {}}))
    try:
        timings.load_runs(tmp_path)
    except SystemExit as exc:
        assert "needs a 'gpu' name" in str(exc)
    else:
        raise AssertionError("a run without a GPU name was accepted")


def test_the_plan_adds_up_to_three_hours_and_quotes_only_measured_run_times(tmp_path):
    assert sum(minutes for minutes, _, _ in timings.PLAN) == timings.TOTAL_MINUTES == 180
    text = timings.GUIDE.read_text()
    plan = text.split(timings.PLAN_START, 1)[1].split(timings.PLAN_END, 1)[0]
    rows = [l for l in plan.splitlines() if l.startswith("| ") and l[2].isdigit()]
    assert sum(int(r.split("|")[2]) for r in rows[:-1]) == 180 and rows[-1].startswith("| 3:00 |")
    assert sum("Break" in r for r in rows) == 2
    for stem in timings.notebook_stems():  # every notebook has a place in the plan
        assert f"**{stem[:2]}**" in plan, f"notebook {stem} is not in the three-hour plan"
    run = {"gpu": "NVIDIA H200", "notebooks": {"01_gelu": 19.4}}
    block = timings.render_plan([run], [(170, "01", ["01_gelu"]), (10, "02", ["02_train_step"])])
    assert "01: 19 s on NVIDIA H200" in block and "02: not measured" in block
    try:
        timings.render_plan([run], [(100, "too short", [])])
    except SystemExit as exc:
        assert "adds up to 100 minutes" in str(exc)
    else:
        raise AssertionError("a plan that is not three hours was accepted")
    assert "A T4 is not measured" in text
