"""Probe (GPU): which kernels does notebook 08's decode step run at each batch size, and for how long?

In the recorded run of 08 a decode step at batch 16 kept the GPU busy longer than one at batch 64 (927 µs against
600 µs, H200 and H100). This profiles the same model and step (08's GPU configuration, float32 by default, the
cache of 64 rows x 65 positions) eagerly and as the kit's graph at each batch size, and writes:

- ``decode_kernels.csv``: per (variant, batch, kernel name): ``count`` per step and ``total_us`` per step, sorted;
- ``decode_steps.csv``: per (variant, batch): GPU-busy µs per step, kernels per step, median step time (µs);
- ``env.json``: the machine (``cudagraph_kit.env.describe()``) and the settings.

Notebook 08's appendix (the batch-16 question) reads ``figures/08_decode_kernels/decode_kernels.csv``::

    python scripts/probes/probe_decode_kernels.py --out figures/08_decode_kernels
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for decode_kernels.csv, decode_steps.csv, env.json")
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--dtype", default="float32", help="notebook 08's DTYPE (float32 in the recorded run)")
    ap.add_argument("--calls", type=int, default=20, help="profiled calls per (variant, batch)")
    ap.add_argument("--top", type=int, default=15, help="kernels kept per (variant, batch), by total time")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

from cudagraph_kit import capture_buckets  # noqa: E402
from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM  # noqa: E402
from cudagraph_kit.env import describe  # noqa: E402

CFG = TinyConfig(vocab_size=8192, dim=512, layers=4, heads=8, kv_heads=2, hidden=1408)   # notebook 08 on a GPU
PROMPT_LEN, MAX_LEN = 16, 65


def profile(fn, calls):
    """Per kernel name: (launches, total µs) per call, and the GPU-busy µs per call (union of kernel intervals)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_name, intervals = defaultdict(lambda: [0, 0.0]), []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per_name[e.name][0] += 1
            per_name[e.name][1] += e.time_range.elapsed_us()
            intervals.append((e.time_range.start, e.time_range.end))
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return {name: (n / calls, us / calls) for name, (n, us) in per_name.items()}, busy / calls


def step_time_us(fn, calls=200):
    """Median µs of one call, CUDA events around blocks of 20 calls (after a warm-up)."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(calls // 20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000 / 20)
    return statistics.median(times)


def main(args):
    if not torch.cuda.is_available():
        sys.exit("this probe needs a CUDA GPU (it profiles GPU kernels)")
    import pandas as pd

    batches = [int(b) for b in args.batches.split(",")]
    dtype = getattr(torch, args.dtype)
    torch.set_grad_enabled(False)
    model = TinyLLM(CFG, seed=0, device="cuda", dtype=dtype).eval()
    cache = StaticKVCache(CFG, max_batch=max(batches), max_len=MAX_LEN, device="cuda", dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    model.prefill(torch.randint(0, CFG.vocab_size, (max(batches), PROMPT_LEN), generator=gen).cuda(), cache)

    def step(tokens, pos):
        return model.decode(tokens, pos, cache)

    z = torch.zeros(max(batches), dtype=torch.long, device="cuda")
    graphs = capture_buckets(step, z, z.clone(), sizes=batches)
    kernel_rows, step_rows = [], []
    for b in batches:
        tokens = torch.randint(0, CFG.vocab_size, (b,), generator=gen).cuda()
        pos = torch.full((b,), PROMPT_LEN, dtype=torch.long, device="cuda")
        graphs(tokens, pos)                                  # the bucket's static inputs now hold this batch
        for variant, fn in (("eager", lambda: step(tokens, pos)), ("graph", graphs.graphs[b].replay)):
            median = step_time_us(fn)
            kernels, busy = profile(fn, args.calls)
            step_rows.append({"variant": variant, "batch": b, "busy_us": busy, "median_us": median,
                              "kernels": sum(n for n, _ in kernels.values())})
            ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]
            kernel_rows += [{"variant": variant, "batch": b, "name": name, "count": n, "total_us": us,
                             "share_of_busy": us / busy if busy else float("nan")} for name, (n, us) in ranked]
            print(f"{variant:5s} batch {b:3d}: {median:8.1f} µs/step, GPU busy {busy:8.1f} µs, "
                  f"{step_rows[-1]['kernels']:.0f} kernels; top: {ranked[0][0][:70]} {ranked[0][1][1]:.1f} µs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(kernel_rows).to_csv(out / "decode_kernels.csv", index=False)
    pd.DataFrame(step_rows).to_csv(out / "decode_steps.csv", index=False)
    env = describe()
    env.update(config=vars(CFG), dtype=args.dtype, batches=batches, prompt_len=PROMPT_LEN, max_len=MAX_LEN,
               calls=args.calls, script="scripts/probes/probe_decode_kernels.py")
    (out / "env.json").write_text(json.dumps(env, indent=2, default=str))
    print("wrote", out / "decode_kernels.csv", out / "decode_steps.csv", out / "env.json")


if __name__ == "__main__":
    main(ARGS)
