"""Benchmark: what does the kit's graphed call cost over raw ``CUDAGraph.replay()`` plus the same input copy?

Target (DESIGN.md): a kit call is within 3% (or 1 µs) of ``static_x.copy_(x); graph.replay()``.
Kit, raw and replay-only are timed round-robin, the order rotated each round, so drift hits them alike.
Results go to ``figures/00_overhead/`` (results.csv + env.json). Run on a GPU:

    python scripts/bench_overhead.py
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from cudagraph_kit import capture, env_table, timeit  # noqa: E402
from cudagraph_kit.course import results  # noqa: E402


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def measure(shape, calls, rounds=31):
    x = torch.randn(shape, device="cuda")
    new = torch.randn_like(x)
    g = capture(gelu, x)
    static_x, graph = g.static_inputs[0], g.graph

    def raw():
        static_x.copy_(new)
        graph.replay()

    torch.testing.assert_close(g(new), gelu(new))  # correct before fast
    timed = {"kit": (g, new), "raw": (raw,), "replay": (graph.replay,)}  # (callable, its arguments)
    samples = {k: [] for k in timed}
    for r in range(rounds):  # round-robin, the order rotated each round: drift and order hit all three alike
        order = list(timed)[r % 3:] + list(timed)[:r % 3]
        for k in order:
            fn, *args = timed[k]
            samples[k].append(timeit(fn, *args, calls=calls, samples=1, warmup=5).median_us)
    kit_s, raw_s, rep_s = samples["kit"], samples["raw"], samples["replay"]
    kit, raw_t, rep = (statistics.median(s) for s in (kit_s, raw_s, rep_s))
    diffs = [k - r for k, r in zip(kit_s, raw_s)]
    return kit, raw_t, rep, statistics.median(diffs), kit_s, raw_s


def main():
    if not torch.cuda.is_available():
        sys.exit("bench_overhead needs a CUDA GPU (it compares graph replays).")
    print(env_table())
    rows = []
    for case, shape, calls in [("tiny (1,3,224,224)", (1, 3, 224, 224), 2000),
                               ("large (32,3,224,224)", (32, 3, 224, 224), 300)]:
        kit, raw_t, rep, diff, kit_s, raw_s = measure(shape, calls)
        overhead_pct = 100 * (kit - raw_t) / raw_t
        ok = (kit - raw_t) <= max(0.03 * raw_t, 1.0)
        spread = statistics.quantiles(raw_s, n=4)
        for variant, med in [("raw copy_+replay", raw_t), ("kit g(x)", kit), ("raw replay only", rep)]:
            rows.append({"case": case, "variant": variant, "median_us": med, "speedup": raw_t / med,
                         "floor_us": float("nan"), "kit_minus_raw_us": diff if variant == "kit g(x)" else 0.0,
                         "overhead_pct": overhead_pct if variant == "kit g(x)" else 0.0,
                         "raw_iqr_us": spread[2] - spread[0], "meets_target": ok})
        print(f"{case}: raw {raw_t:.2f} µs, kit {kit:.2f} µs (median paired diff {diff:+.2f} µs, "
              f"{overhead_pct:+.1f}%), replay alone {rep:.2f} µs -> target {'MET' if ok else 'MISSED'}")
    df = pd.DataFrame(rows)
    folder = results.save("00_overhead", df)
    print(df.to_string(index=False))
    print("saved", folder)


if __name__ == "__main__":
    main()
