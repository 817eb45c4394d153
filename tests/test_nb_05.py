"""Notebook 05 executed by papermill (small, on whatever machine runs the tests); assertions on what it recorded."""
import json
import math
import re

import pandas as pd
import pytest
import torch

from cudagraph_kit.advice import ABOUT, expected_effect

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
        # advise: six predictions made before capture, each beside the speedup measured in windows after it
        adv = df[df.case.str.startswith("advise: ")]
        assert len(adv) == 6 and (adv.speedup > 0).all() and (adv.measured_speedup > 0).all()
        assert (adv.prediction == "before capture").all() and (adv.variant == "predicted (this run)").all()
        assert (adv.speedup == adv.advise_speedup).all()  # the headline uses advise's own prediction
        fitted = df[df.case.str.startswith("advise fitted: ")]  # from notebooks 01-04's records: kept apart
        assert (fitted.prediction == "fitted after the fact").all() and fitted.variant.str.startswith("fitted (").all()
        timed = df[df.case.str.startswith("measured: ")]
        assert set(timed.case) == {"measured: " + c.removeprefix("advise: ") for c in adv.case}
        firsts = timed.groupby("case", sort=False).first()
        assert (firsts.variant == "eager").all() and (firsts.speedup == 1.0).all()
        graphs = timed[timed.variant != "eager"]
        assert len(graphs) == 6 and (graphs.executed_as == "cuda graph").all()  # measure(): one window each
        assert (graphs.windows == 2).all() and (graphs.window_speedups.str.count(";") == 1).all()
        assert ((graphs.speedup_lo <= graphs.speedup * (1 + 1e-9)) & (graphs.speedup <= graphs.speedup_hi * (1 + 1e-9))).all()
        for r in adv.itertuples():  # the row carries the interval of the timing it was checked against
            g = graphs[graphs.case == "measured: " + r.case.removeprefix("advise: ")].iloc[0]
            assert (r.measured_speedup, r.measured_speedup_lo, r.measured_speedup_hi) == pytest.approx(
                (g.speedup, g.speedup_lo, g.speedup_hi))
        two = df[df.case.str.startswith("two captures: ")]
        assert set(two.case) >= {"two captures: keep everything", "two captures: drop"}
        assert (folder / "pool_memory.png").is_file() and (folder / "advise.png").is_file()
        assert env["gpu"]
    else:  # honest labels: nothing ran as a graph, GPU-only checks are not claimed
        assert (df.executed_as == "eager (checks only)").all()
        assert not df.case.str.startswith(("advise", "measured: ", "memory:")).any()  # nothing timed or predicted
        assert recovered.empty  # nothing was captured, so nothing is claimed about recovering
        gpu_only = pitfalls[~pitfalls.case.str.contains("|".join(map(re.escape, CPU_HONEST)))]
        assert gpu_only.detected.isna().all()
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
    check_claims(folder, df, env, gpu=torch.cuda.is_available())


def _closeness_interval(p, lo, hi):
    """The range of min(p/m, m/p) for m in lo..hi (the interval of an advise_within claim)."""
    ends = [min(p / m, m / p) for m in (lo, hi)]
    return min(ends), (1.0 if lo <= p <= hi else max(ends))


def check_claims(folder, df, env, gpu):
    """claims.csv: the expected ids, each verdict the one its interval implies, each interval from the data."""
    assert env["windows"] == 2 and env["samples_per_window"] >= 1
    claims = pd.read_csv(folder / "claims.csv")
    assert list(claims.columns) == ["claim", "statement", "verdict", "lo", "hi", "above"]
    cases = {"gelu_small": "GELU small", "gelu_large": "GELU large", "mlp_small_sgd": "MLP 32x128x256x16, SGD",
             "mlp_small_adam": "MLP 32x128x256x16, Adam(capturable)", "mlp_large_sgd": "MLP 640x4096x2048x1024, SGD",
             "mlp_large_adam": "MLP 640x4096x2048x1024, Adam(capturable)"}
    if not gpu:  # the claims all compare GPU measurements: a CPU run makes none
        assert claims.empty
        return
    assert set(claims.claim) == ({"shared_pool_saves_memory", "advise_within_1_5x_all"}
                                 | {f"advise_within_1_5x_{k}" for k in cases} | {f"advise_words_{k}" for k in cases})
    for c in claims.itertuples():  # the printed sentence is the one of the verdict its interval implies
        known = not (math.isnan(c.lo) or math.isnan(c.hi))
        expected = "unclear" if not known else "holds" if c.lo > c.above else "fails" if c.hi <= c.above else "unclear"
        assert c.verdict == expected, c
        assert not re.search(r"\b(holds|fails|nan)\b", c.statement.lower()), c  # plain words, no verdict labels
        if c.claim.startswith("advise_within_1_5x_") and c.claim != "advise_within_1_5x_all":
            assert ("partly within" in c.statement) == (expected == "unclear"), c
    by_id = claims.set_index("claim")
    # memory: one measurement of each, so the interval is the ratio itself
    mem = df[df.case.str.startswith("memory:")].set_index("variant").reserved_mib.astype(float)
    ratio = mem["private pool per graph"] / mem["one shared pool"]
    assert (by_id.loc["shared_pool_saves_memory", "lo"], by_id.loc["shared_pool_saves_memory", "hi"]) == pytest.approx(
        (ratio, ratio))
    # advise: each claim's interval comes from advise's prediction and the measured speedup's prediction interval
    for key, case in cases.items():
        r = df[df.case == f"advise: {case}"].iloc[0]
        c = by_id.loc[f"advise_within_1_5x_{key}"]
        assert c.above == pytest.approx(1 / 1.5)
        assert (c.lo, c.hi) == pytest.approx(_closeness_interval(r.speedup, r.measured_speedup_lo,
                                                                 r.measured_speedup_hi))
        # advise's words: the band its predicted speedup names, against the measured interval
        w = by_id.loc[f"advise_words_{key}"]
        effect = expected_effect(r.speedup)
        lo, hi = r.measured_speedup_lo, r.measured_speedup_hi
        expected = {"faster": ((lo, hi), ABOUT), "slower": ((1 / hi, 1 / lo), ABOUT),
                    "about as fast": (_closeness_interval(1.0, lo, hi), 1 / ABOUT)}[effect]
        assert ((w.lo, w.hi), w.above) == (pytest.approx(expected[0]), pytest.approx(expected[1])), (key, effect)
    per_case = by_id.loc[[f"advise_within_1_5x_{k}" for k in cases]]
    overall = by_id.loc["advise_within_1_5x_all"]
    assert (overall.lo, overall.hi) == pytest.approx((per_case.lo.min(), per_case.hi.min()))
    assert overall.verdict == ("holds" if (per_case.verdict == "holds").all() else
                               "fails" if (per_case.verdict == "fails").any() else "unclear")
