"""Probe: what does a CUDA graph of 1-33 tiny nodes cost, on the host and on the GPU, against the same kernels
launched eagerly? The data behind ``advice.measure_replay_cost`` and ``advise``'s floor for small graphs.

For k = 1 .. 33 kernels (a chain of multiplies on a 150k-element tensor, and one-element adds) it times, round-robin
in one ``compare`` window: eager, the raw ``CUDAGraph.replay`` and the kit's ``g.replay()``; then the GPU time of
the same calls queued behind a spin kernel (``device_time``) for eager and graph. Writes a CSV and a JSON.
Run on a GPU: ``python scripts/probes/probe_tiny_graphs.py --out OUT_DIR``.
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the probe's CSV and JSON")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root
from cudagraph_kit.graphed import capture  # noqa: E402
from cudagraph_kit.advice import advise, measure_replay_cost  # noqa: E402
from cudagraph_kit.timing import compare, device_time  # noqa: E402

KS = (1, 2, 3, 5, 9, 17, 33)


def chain(k, op):
    def f(x):
        for _ in range(k):
            x = op(x)
        return x
    return f


def raw_graph(fn, x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    return g


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    big = torch.randn(1, 3, 224, 224, device="cuda")
    one = torch.zeros(1, device="cuda")
    variants, meta = {}, {}
    for k in KS:
        f_big = chain(k, lambda t: t * 1.0001)
        f_one = chain(k, lambda t: t.add_(1.0))
        g_big = raw_graph(f_big, big)
        g_one = raw_graph(f_one, one)
        kit = capture(f_big, big)
        variants[f"eager mul x{k}"] = (lambda f=f_big: f(big))
        variants[f"graph mul x{k}"] = g_big.replay
        variants[f"kit replay mul x{k}"] = (lambda g=kit: g.replay())
        variants[f"eager add1 x{k}"] = (lambda f=f_one: f(one))
        variants[f"graph add1 x{k}"] = g_one.replay
        meta.update({f"eager mul x{k}": (k, "eager", "mul"), f"graph mul x{k}": (k, "graph", "mul"),
                     f"kit replay mul x{k}": (k, "kit", "mul"), f"eager add1 x{k}": (k, "eager", "add1"),
                     f"graph add1 x{k}": (k, "graph", "add1")})
    df = compare(variants, case="tiny graphs", samples=11)
    dev = []
    for name, fn in variants.items():
        r = device_time(fn, calls=10)
        dev.append(r[0] if r else float("nan"))
    df["device_time_us"] = dev
    df["k"] = [meta[v][0] for v in df.variant]
    df["how"] = [meta[v][1] for v in df.variant]
    df["op"] = [meta[v][2] for v in df.variant]
    df["gpu"] = torch.cuda.get_device_name(0)
    df.to_csv(out / "tiny_graphs.csv", index=False)
    print(df[["variant", "median_us", "floor_us", "device_time_us", "kernels_per_call", "copies_per_call"]]
          .to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    cost = measure_replay_cost()
    info = {"cost": dataclasses.asdict(cost), "gap_saved_us": cost.gap_saved_us,
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": []}
    gelu = lambda x: x * 0.5 * (1.0 + torch.erf(x / 1.41421))
    one_kernel = lambda x: x * 1.0001
    for label, fn, x in (("gelu small", gelu, big), ("gelu large", gelu, torch.randn(32, 3, 224, 224, device="cuda")),
                         ("one kernel small", one_kernel, big)):
        a = advise(fn, x)
        g = capture(fn, x)
        m = compare({"eager": fn, "graph": lambda t, g=g: g.replay()}, x, case=label, samples=11)
        measured = float(m.speedup.iloc[1])
        info["cases"].append({"case": label, "advise": str(a), "predicted": a.speedup, "measured": measured,
                              "ratio": a.speedup / measured, "graph_median_us": float(m.median_us.iloc[1])})
        print(label, a, f"measured {measured:.2f}x ratio {a.speedup / measured:.2f}")
    (out / "tiny_graphs.json").write_text(json.dumps(info, indent=1, default=str))


if __name__ == "__main__":
    main(ARGS.out)
