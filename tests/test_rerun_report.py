"""scripts/rerun_report.py: speedups of a second run inside the first run's intervals, claims keeping verdicts."""
import importlib.util
from pathlib import Path

import pandas as pd

SPEC = importlib.util.spec_from_file_location("rerun_report", Path(__file__).parent.parent / "scripts" / "rerun_report.py")
rerun_report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rerun_report)


def _run(folder, speedups, verdicts):
    d = folder / "01_gelu"
    d.mkdir(parents=True)
    rows = [{"case": "small", "variant": "eager", "executed_as": "eager", "median_us": 50.0, "speedup": 1.0,
             "speedup_lo": 1.0, "speedup_hi": 1.0}]
    rows += [{"case": c, "variant": "graph", "executed_as": "cuda graph", "median_us": 10.0, "speedup": s,
              "speedup_lo": s * 0.9, "speedup_hi": s * 1.1} for c, s in speedups.items()]
    pd.DataFrame(rows).to_csv(d / "results.csv", index=False)
    pd.DataFrame([{"claim": k, "verdict": v} for k, v in verdicts.items()]).to_csv(d / "claims.csv", index=False)


def test_counts_speedups_inside_and_verdicts_kept(tmp_path):
    _run(tmp_path / "a", {"small": 5.0, "large": 1.1}, {"x": "holds", "y": "unclear", "z": "fails"})
    _run(tmp_path / "b", {"small": 5.4, "large": 1.3}, {"x": "holds", "y": "holds", "z": "holds"})
    df = rerun_report.compare_runs(tmp_path / "a", tmp_path / "b")
    r = df.iloc[0]
    assert (r.speedups, r.inside) == (2, 1)  # 5.4 in 4.5-5.5; 1.3 outside 0.99-1.21
    assert (r.claims, r.kept, r.definite_a, r.definite_b, r.opposite) == (3, 1, 2, 3, 1)
    assert "1/2 (50%)" in rerun_report.summary(df) and "1/3 (33%)" in rerun_report.summary(df)
    assert "interval, all notebooks together: 1.22x and 1.22x" in rerun_report.summary(df)   # 1.1 / 0.9
