"""Probe: why can ``measure_bucket_costs`` give bucket 1 more GPU time than bucket 64 (test_buckets' Block(128, 4))?

Repeats the test's setup; for each repetition prints, per size and round, device_time's (µs, queued) with the
host time that sized the spin, and the profiler's GPU-busy time per call (``gpu_time``) as a reference.
Run on a GPU: ``python scripts/probes/probe_device_time.py [--reps 6]``.
"""
import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=6, help="repetitions of the test's setup (default 6)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/probes/ -> root
sys.path.insert(0, str(ROOT))
from cudagraph_kit import capture_buckets, timing  # noqa: E402
from cudagraph_kit.bucket_plan import measure_bucket_costs  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from test_buckets import Block  # noqa: E402  (the transformer block the GPU test used when it failed)


def main(reps=6):
    out = []
    orig = timing.device_time
    for rep in range(reps):
        log = []

        def traced(fn, *a, calls=10, host_us=None):
            r = orig(fn, *a, calls=calls, host_us=host_us)
            log.append({"host_us": host_us, "us": r[0], "queued": r[1]})
            return r
        timing.device_time = traced
        model = Block(128, 4).cuda().eval()
        sample = torch.randn(64, 32, 128, device="cuda")
        exact = capture_buckets(model, sample, sizes=[1, 16, 64])
        costs = measure_bucket_costs(exact, sample)
        timing.device_time = orig
        row = {"rep": rep, "costs": dict(costs), "pad_us": costs.pad_us, "spin_cycles_per_us":
               timing._SPIN_CYCLES_PER_US, "trace": log}
        if rep == reps - 1:  # the profiler last: its session slows later launches
            row["profiler_busy_us"] = {b: timing.gpu_time(exact, sample[:b]).busy_us for b in (1, 16, 64)}
        print(json.dumps(row, default=str), flush=True)
        out.append(row)
    return out


if __name__ == "__main__":
    main(ARGS.reps)
