"""Probe: why can ``measure_bucket_costs`` give bucket 1 more GPU time than bucket 64 (test_buckets' Block(128, 4))?

Repeats the test's setup; for each repetition prints, per size and round, device_time's (µs, queued) with the
host time that sized the spin, and the profiler's GPU-busy time per call (``gpu_time``) as a reference.
Run on a GPU: ``python scripts/probe_device_time.py``.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

from cudagraph_kit.buckets import capture_buckets, measure_bucket_costs
from cudagraph_kit import timing


class Block(nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


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
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
