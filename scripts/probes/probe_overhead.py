"""Probe: where does the kit's call cost over ``static_x.copy_(x); graph.replay()`` go on this host?

Times, round-robin with the order rotated every round, the raw copy+replay, the kit call, and the raw call plus
each of the kit's hot-path checks alone. Prints per-variant medians and the paired median difference to raw.
Run on a GPU: ``python scripts/probes/probe_overhead.py [--calls 2000] [--rounds 41]``.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per sample (default 2000)")
    ap.add_argument("--rounds", type=int, default=41, help="round-robin rounds (default 41)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

from cudagraph_kit.graphed import capture  # noqa: E402


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def per_call_us(fn, calls):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main(shape=(1, 3, 224, 224), calls=2000, rounds=41):
    x = torch.randn(shape, device="cuda")
    new = torch.randn_like(x)
    g = capture(gelu, x)
    static, graph = g.static_inputs[0], g.graph
    replay = graph.replay
    torch.testing.assert_close(g(new), gelu(new))
    size, dtype, index = static.shape, static.dtype, static.get_device()

    variants = {
        "raw copy_+replay": lambda: (static.copy_(new), replay()),
        "kit g(x)": lambda: g(new),
        "raw + shape check": lambda: (new.shape == size, static.copy_(new), replay()),
        "raw + dtype check": lambda: (new.dtype is dtype, static.copy_(new), replay()),
        "raw + get_device()": lambda: (new.get_device() == index, static.copy_(new), replay()),
        "raw + is_cuda": lambda: (new.is_cuda, static.copy_(new), replay()),
        "replay only": replay,
        "copy_ only": lambda: static.copy_(new),
    }
    names = list(variants)
    samples = {n: [] for n in names}
    for n in names:
        per_call_us(variants[n], 200)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            samples[n].append(per_call_us(variants[n], calls))
    raw = samples["raw copy_+replay"]
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, shape {shape}, {rounds} rounds x {calls} calls")
    print(f"{'variant':22s} {'median µs':>10s} {'q1':>8s} {'q3':>8s} {'paired diff vs raw µs':>22s}")
    for n in names:
        s = samples[n]
        q1, _, q3 = statistics.quantiles(s, n=4)
        diff = statistics.median(a - b for a, b in zip(s, raw))
        print(f"{n:22s} {statistics.median(s):10.2f} {q1:8.2f} {q3:8.2f} {diff:+22.2f}")


if __name__ == "__main__":
    main(calls=ARGS.calls, rounds=ARGS.rounds)
