"""Probe: what does a shared pool hold beyond the largest bucket, for notebook 06's transformer block?

For each setting (allocator config, attention backend) a fresh process captures the block for the default ladder
(max 64 rows) into one shared pool, and for the largest bucket alone; it prints the pool's growth per capture and
its segments (size, in use, free blocks). Run on a GPU: ``python scripts/probes/probe_pool.py``.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/probes/ -> root
CHILD = r'''
import json, sys, torch, torch.nn as nn, torch.nn.functional as F
from cudagraph_kit import capture_buckets, ladder, pool_usage
backend = sys.argv[1]

class Block(nn.Module):
    def __init__(self, d, heads, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp_ratio * d), nn.GELU(), nn.Linear(mlp_ratio * d, d))
    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if backend == "math":
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))

torch.manual_seed(0)
model = Block(256, 4).cuda().eval()
sample = torch.randn(64, 64, 256, device="cuda")
out = {}
for label, sizes in (("largest alone", [64]), ("default ladder", ladder(64)), ("exact sizes", list(range(1, 65)))):
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    bg = capture_buckets(model, sample, sizes=sizes, measure_memory=True)
    pool = tuple(bg.graphs[64].pool())
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == pool]
    out[label] = {
        "pool_mib": sum(s["total_size"] for s in segs) / 2**20,
        "in_use_mib": sum(s["allocated_size"] for s in segs) / 2**20,
        "segments": sorted([(round(s["total_size"] / 2**20, 2), round(s["allocated_size"] / 2**20, 2),
                             sum(b["state"] != "active_allocated" for b in s["blocks"])) for s in segs], reverse=True),
        "growth_per_capture_mib": [(c["size"], round(c["pool_growth_bytes"] / 2**20, 2)) for c in bg.capture_log
                                   if c["pool_growth_bytes"]],
    }
    del bg
print(json.dumps(out))
'''


def main():
    settings = [("default allocator", "", "default"), ("default allocator, math attention", "", "math"),
                ("expandable_segments", "expandable_segments:True", "default")]
    for label, conf, backend in settings:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        r = subprocess.run([sys.executable, "-c", CHILD, backend], capture_output=True, text=True, env=env,
                           timeout=240)
        print(f"== {label}")
        if r.returncode:
            print("  failed:", (r.stderr.strip().splitlines() or [""])[-1][:300])
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        alone = res["largest alone"]["pool_mib"]
        for k, v in res.items():
            print(f"  {k}: pool {v['pool_mib']:.1f} MiB ({v['pool_mib'] / alone:.2f}x alone), in use "
                  f"{v['in_use_mib']:.1f} MiB")
            print(f"    segments (MiB total, MiB in use, free blocks): {v['segments']}")
            print(f"    growth per capture (rows, MiB): {v['growth_per_capture_mib']}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
