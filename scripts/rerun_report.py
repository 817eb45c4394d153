"""How well a second `reproduce` run lands on the first: speedups inside the first run's published intervals,
and claims that keep their verdict. Both runs must be of the same notebooks on the same GPU kind.

    python scripts/rerun_report.py figures figures/rerun/h200-2026-11-29-run-b   # first run, second run

Per notebook: how many of B's speedups (graphed rows, baseline rows excluded) lie inside A's
speedup_lo..speedup_hi, the median factor by which eager and graph times moved (B / A), and how many claims in
both runs' claims.csv have the same verdict (and how many of those are definite, not "unclear").
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

NOTEBOOKS = ["01_gelu", "02_train_step", "03_jit_compile", "04_resnet50", "05_pitfalls", "06_variable_shapes",
             "08_llm_decode"]


def compare_runs(a: Path, b: Path, notebooks=NOTEBOOKS) -> pd.DataFrame:
    rows, widths = [], {"widths_a": [], "widths_b": []}
    for stem in notebooks:
        if not ((a / stem / "results.csv").is_file() and (b / stem / "results.csv").is_file()):
            continue
        ra, rb = pd.read_csv(a / stem / "results.csv"), pd.read_csv(b / stem / "results.csv")
        key = ["case", "variant"] + (["phase"] if "phase" in ra and "phase" in rb else [])
        m = ra.merge(rb, on=key, suffixes=("_a", "_b"))
        timed = m[m.median_us_a.notna() & m.median_us_b.notna() & (m.median_us_a > 0)]
        moved = timed.median_us_b / timed.median_us_a
        eager = timed.executed_as_a.astype(str).eq("eager") if "executed_as_a" in timed else pd.Series(False, timed.index)
        graded = m[m.speedup_a.notna() & m.speedup_b.notna() & m.speedup_lo_a.notna() & (m.speedup_a != 1.0)]
        inside = ((graded.speedup_lo_a <= graded.speedup_b) & (graded.speedup_b <= graded.speedup_hi_a)).sum()
        for side in "ab":   # an interval's width, hi/lo: 1.5x means hi is 1.5 times lo
            widths[f"widths_{side}"] += list(graded[f"speedup_hi_{side}"] / graded[f"speedup_lo_{side}"])
        row = {"notebook": stem, "speedups": len(graded), "inside": int(inside),
               "eager_moved": statistics.median(moved[eager]) if eager.any() else float("nan"),
               "graph_moved": statistics.median(moved[~eager]) if (~eager).any() else float("nan")}
        ca, cb = a / stem / "claims.csv", b / stem / "claims.csv"
        if ca.is_file() and cb.is_file():
            va = pd.read_csv(ca).set_index("claim").verdict
            vb = pd.read_csv(cb).set_index("claim").verdict
            common = va.index.intersection(vb.index)
            same = va[common] == vb[common]
            row.update(claims=len(common), kept=int(same.sum()),
                       definite_a=int((va[common] != "unclear").sum()), definite_b=int((vb[common] != "unclear").sum()),
                       opposite=int(((va[common] == "holds") & (vb[common] == "fails")).sum()
                                    + ((va[common] == "fails") & (vb[common] == "holds")).sum()))
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs.update(widths)
    return df


def summary(df: pd.DataFrame) -> str:
    s_in, s_n = int(df.inside.sum()), int(df.speedups.sum())
    text = f"speedups of the second run inside the first run's 90% intervals: {s_in}/{s_n} ({s_in / s_n:.0%})"
    if df.attrs.get("widths_a"):
        text += (f"; median width (hi/lo) of a speedup's 90% interval, all notebooks together: "
                 f"{statistics.median(df.attrs['widths_a']):.2f}x and {statistics.median(df.attrs['widths_b']):.2f}x")
    if "claims" in df:
        c = df.dropna(subset=["claims"])
        k, n = int(c.kept.sum()), int(c.claims.sum())
        text += (f"; claims keeping their verdict: {k}/{n} ({k / n:.0%}), definite (not unclear) {int(c.definite_a.sum())} "
                 f"and {int(c.definite_b.sum())} of {n}, holds<->fails flips: {int(c.opposite.sum())}")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path, help="the first run's results folder (e.g. figures)")
    ap.add_argument("second", type=Path, help="the second run's results folder")
    args = ap.parse_args(argv)
    df = compare_runs(args.first, args.second)
    if df.empty:
        raise SystemExit(f"no notebook has results in both {args.first} and {args.second}")
    print(df.to_string(index=False, float_format="%.2f") + "\n\n" + summary(df))


if __name__ == "__main__":
    main()
