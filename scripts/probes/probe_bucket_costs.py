"""Probe: which cost model lets ``plan_buckets`` beat the best fixed ladder on notebook 06's stream?

Builds notebook 06's two models (MLP 256-1024, transformer block 64x256, 4 heads), its seeded stream (200
requests, MAX_ROWS 64) and history (5000 sizes), captures one graph per size, and measures the time of a request
of each size two ways: the notebook's old probes (pow2 and multiples of 16, ``timeit``, 3 samples, interpolated)
and every size timed round-robin (``compare``). It plans 18 buckets from each cost model, captures the plans,
and times them on the stream against the ladder in steps of 4 and exact sizes, round-robin.
Run on a GPU: ``python scripts/probes/probe_bucket_costs.py --out OUT_DIR``.
"""
import argparse
import json
import sys
import time
from pathlib import Path



def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the probe's CSV and JSON")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root
from cudagraph_kit import capture_buckets, evaluate_buckets, ladder, plan_buckets  # noqa: E402
from cudagraph_kit.bucket_plan import interpolate, measure_bucket_costs  # noqa: E402
from cudagraph_kit.timing import compare, timeit  # noqa: E402

MAX_ROWS, REQUESTS, HISTORY, SEED, OVERFLOW_SHARE = 64, 200, 5000, 0, 0.01


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
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def make_mlp(d, h):
    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, h), nn.GELU(),
                         nn.Linear(h, d))


def draw_sizes(n, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = 1 + (MAX_ROWS * torch.rand(n, generator=gen) ** 3).floor().long()
    over = torch.rand(n, generator=gen) < OVERFLOW_SHARE
    big = MAX_ROWS + 1 + (torch.rand(n, generator=gen) * MAX_ROWS / 2).floor().long()
    return torch.where(over, big, sizes).tolist()


def isotonic(values):
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks = []                       # [mean, weight]
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return np.concatenate([[m] * w for m, w in blocks])


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    torch.set_grad_enabled(False)
    stream_sizes = draw_sizes(REQUESTS, SEED)
    if max(stream_sizes) <= MAX_ROWS:
        stream_sizes[len(stream_sizes) // 2] = MAX_ROWS + 1 + MAX_ROWS // 4
    history = draw_sizes(HISTORY, SEED + 1)
    models = {"MLP": (make_mlp(256, 1024), (256,)), "transformer block": (Block(256, 4), (64, 256))}
    gen = torch.Generator().manual_seed(SEED + 2)
    offsets = [int(torch.randint(0, 2 * MAX_ROWS - n + 1, (1,), generator=gen)) for n in stream_sizes]
    rows, heads, info = [], [], {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, (model, row_shape) in models.items():
        model.cuda().eval()
        data = torch.randn(2 * MAX_ROWS, *row_shape, device="cuda")
        stream = [data[o:o + n] for o, n in zip(offsets, stream_sizes)]
        exact = capture_buckets(model, data[:MAX_ROWS], sizes=range(1, MAX_ROWS + 1))
        sizes = list(range(1, MAX_ROWS + 1))
        probes = sorted(set(ladder(MAX_ROWS, "pow2")) | set(range(16, MAX_ROWS + 1, 16)))
        t0 = time.perf_counter()
        old = [timeit(exact, data[:b], calls=100, samples=3).median_us for b in probes]
        old_env = np.minimum.accumulate(old[::-1])[::-1]
        old_cost = interpolate(dict(zip(probes, old_env)))
        t_old = time.perf_counter() - t0
        t0 = time.perf_counter()
        df = compare({str(b): (lambda b=b: exact(data[:b])) for b in sizes}, case=name, calls=50, samples=9,
                     warmup=3, floor=False)
        t_all = time.perf_counter() - t0
        med = df.median_us.to_numpy()
        t0 = time.perf_counter()
        gpu_cost = measure_bucket_costs(exact, data[:MAX_ROWS])
        t_gpu = time.perf_counter() - t0
        env = np.minimum.accumulate(med[::-1])[::-1]
        iso = isotonic(med)
        for b, m, e, i in zip(sizes, med, env, iso):
            rows.append({"model": name, "rows": b, "median_us": m, "envelope_us": e, "isotonic_us": i,
                         "old_model_us": old_cost(b), "iqr_us": float(df.iqr_us.iloc[b - 1]),
                         "gpu_us": gpu_cost[b]})
        info[f"{name} seconds"] = {"old probes": t_old, "all sizes": t_all, "gpu time": t_gpu}
        costs = {"old (probes, envelope)": old_cost, "all sizes, envelope": dict(zip(sizes, env)),
                 "all sizes, isotonic": dict(zip(sizes, iso)), "all sizes, median": dict(zip(sizes, med)),
                 "gpu time": gpu_cost}
        plans = {label: plan_buckets(history, max_graphs=18, cost=c, max_size=MAX_ROWS).sizes
                 for label, c in costs.items()}
        plans["gpu time, 11 graphs"] = plan_buckets(history, max_graphs=11, cost=gpu_cost, max_size=MAX_ROWS).sizes
        plans["steps of 4"] = ladder(MAX_ROWS, 4)
        plans["steps of 8"] = ladder(MAX_ROWS, 8)
        built = {"exact sizes": exact}
        for label, s in plans.items():
            built[label] = capture_buckets(model, data[:MAX_ROWS], sizes=s)
        runners = {label: (lambda fn=fn: [fn(x) for x in stream]) for label, fn in built.items()}
        h = compare(runners, case=name, calls=1, samples=21, floor=False)
        for r in h.to_dict("records"):
            s = plans.get(r["variant"], sizes)
            r.update({"sizes": " ".join(map(str, s)), "graphs": len(s),
                      "stream_pad_fraction": evaluate_buckets(stream_sizes, s)["pad_fraction"],
                      "expected_waste_on_history_us": evaluate_buckets(history, s, cost=gpu_cost)["expected_waste"]})
            heads.append(r)
        print(h[["case", "variant", "median_us", "speedup", "speedup_lo", "speedup_hi"]].to_string(index=False))
        for label, s in plans.items():
            print(f"  {label}: {s}")
        del built, exact
        torch.cuda.empty_cache()
    pd.DataFrame(rows).to_csv(out / "bucket_costs.csv", index=False)
    pd.DataFrame(heads).to_csv(out / "bucket_head_to_head.csv", index=False)
    (out / "bucket_costs.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main(ARGS.out)
