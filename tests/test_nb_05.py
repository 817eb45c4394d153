"""Notebook 05 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook

PITFALLS = [".item() / print", "rebinding a static input", "keeping an output", "a changing shape",
            "Python counter", "Python state reached", "learning rate", "random numbers", "warm-up not on a side stream",
            "another thread", "private pool", "reduce-overhead", "what it reads was freed"]
CPU_HONEST = [".item() / print", "a changing shape", "Python counter", "Python state reached", "learning rate",
              "random numbers"]


def test_pitfalls_notebook_records_what_it_found(run_notebook):
    folder = run_notebook("05_pitfalls", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    assert {"case", "variant", "median_us", "speedup", "executed_as", "detected", "found_by", "fix"} <= set(df.columns)
    pitfalls = df[df.case.str.startswith("pitfall: ")]
    for name in PITFALLS:  # every pitfall has its row, with what finds it and the fix
        row = pitfalls[pitfalls.case.str.contains(name, regex=False)]
        assert len(row) == 1, name
        assert row.found_by.iloc[0] and row.fix.iloc[0]
        assert row.variant.iloc[0].startswith(("raises", "silently", "warns", "wastes"))
    # the checks that are honest on a CPU found their pitfall on any machine
    for name in CPU_HONEST:
        row = pitfalls[pitfalls.case.str.contains(name, regex=False)]
        assert str(row.detected.iloc[0]) == "True", (name, row.seen.iloc[0])
    recovered = pitfalls.process_still_works.dropna().astype(str)
    if torch.cuda.is_available():
        assert len(recovered) >= 5 and (recovered == "True").all()  # after each failure: eager + fresh capture OK
        assert (pitfalls.detected.astype(str) == "True").all(), pitfalls[["case", "seen", "detected"]]
        mem = df[df.case.str.startswith("memory:")].set_index("variant").reserved_mib
        assert mem["one shared pool"] < mem["private pool per graph"]
        adv = df[df.case.str.startswith("advise: ")]
        assert len(adv) >= 6 and (adv.speedup > 0).all() and (adv.measured_speedup > 0).all()
        two = df[df.case.str.startswith("two captures: ")]
        assert set(two.case) >= {"two captures: keep everything", "two captures: drop"}
        assert (folder / "pool_memory.png").is_file() and (folder / "advise.png").is_file()
        assert env["gpu"]
    else:  # honest labels: nothing ran as a graph, GPU-only checks are not claimed
        assert (df.executed_as == "eager (checks only)").all()
        assert recovered.empty  # nothing was captured, so nothing is claimed about recovering
        gpu_only = pitfalls[~pitfalls.case.str.contains("|".join(map(__import__("re").escape, CPU_HONEST)))]
        assert gpu_only.detected.isna().all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
