"""How wide a graph speedup's 90% prediction interval will be with n timing windows, from recorded windows.

Each recorded row keeps its windows' speedups (``window_speedups``). Their spread on a log scale (the sd of the
logarithms) is what drift between windows does to one speedup; the interval is ``exp(mean ± t(n-1) * sd *
sqrt(1 + 1/n))``, so its width (hi/lo) for n windows at the same sd follows. Shorter windows keep that sd as long
as the drift between windows outweighs a window's own noise, which a second run checks
(``scripts/rerun_report.py``).

Usage::

    python scripts/interval_design.py figures            # predicted median width for 3, 5, 8 and 12 windows
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cudagraph_kit.intervals import _t_quantile  # noqa: E402


def window_log_sds(figures: Path) -> list[float]:
    """The sd of log speedups across windows, one per graph row with three or more windows."""
    sds = []
    for csv in sorted(figures.glob("*/results.csv")):
        df = pd.read_csv(csv)
        if "window_speedups" not in df or "executed_as" not in df:
            continue
        for r in df[(df.executed_as == "cuda graph") & df.window_speedups.notna()].itertuples():
            xs = [float(v) for v in str(r.window_speedups).split(";") if float(v) > 0]
            if len(xs) >= 3:
                sds.append(statistics.stdev(math.log(x) for x in xs))
    return sds


def width(sd: float, n: int, level: float = 0.90) -> float:
    """hi/lo of the prediction interval of n windows whose log speedups have this sd."""
    return math.exp(2 * _t_quantile(level, n - 1) * sd * math.sqrt(1 + 1 / n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("figures", nargs="?", type=Path, default=Path("figures"),
                    help="a results folder with recorded windows (default: figures)")
    figures = ap.parse_args(argv).figures
    sds = window_log_sds(figures)
    if not sds:
        print(f"no graph rows with three or more windows under {figures}/")
        return 1
    print(f"{len(sds)} graph speedups from {figures}/; median sd of log speedups across windows: "
          f"{statistics.median(sds):.3f}")
    print("windows  median width (hi/lo)  share <= 1.5x")
    for n in (3, 5, 8, 12):
        ws = [width(sd, n) for sd in sds]
        print(f"{n:>7}  {statistics.median(ws):>20.2f}x  {sum(w <= 1.5 for w in ws) / len(ws):>12.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
