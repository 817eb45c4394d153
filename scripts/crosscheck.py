"""Cross-check: the kit's timings against plain PyTorch, in the same process and the same time window.

For the headline cases of notebooks 01-03 (small/large GELU eager and graph, the kit call ``g(x)``, jit.script +
graph, whole-step MLP SGD and Adam), each round times the case the kit's way (``compare``, floor and profiler
included) and a plain-PyTorch way (hand-written capture, a loop between two synchronizes, no kit, no profiler),
one right after the other, in alternating order. ``ratio`` = kit / reference, median over rounds; ``recorded_us`` is what the notebook of
the same ``reproduce`` run recorded for that row, so drift between moments shows too.

    python scripts/crosscheck.py            # needs a CUDA GPU; writes figures/00_crosscheck/ (or $CGK_RESULTS_DIR)
    python scripts/crosscheck.py --refresh-recorded   # re-read recorded_us from figures/ (no GPU)
"""
import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refresh-recorded", action="store_true",
                    help="re-read recorded_us in figures/00_crosscheck/results.csv from figures/ (no GPU)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from cudagraph_kit import capture_train_step, compare, env_table  # noqa: E402
from cudagraph_kit.graphed import capture  # noqa: E402
from cudagraph_kit.course.measuring import results  # noqa: E402

ROUNDS = 8  # even: half the rounds time the kit first, half the plain loop first


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def reference_us(fn, calls, samples=3):
    """Plain PyTorch: median over samples of (loop of `calls` calls between two synchronizes) / calls."""
    out = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(out)


def hand_graph(fn):
    """The docs recipe, no kit: warm up on a side stream, capture, return (graph, output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def mlp_step_cases(opt_name):
    """Kit whole-step graph and a hand-written whole-step graph of the same MLP (separate models, same seed)."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Dropout(0.2), torch.nn.Linear(256, 16),
                                    torch.nn.Dropout(0.1)).cuda()
        opt = (torch.optim.SGD(model.parameters(), lr=0.1) if opt_name == "SGD"
               else torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True))
        return model, opt
    x, y = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")
    loss_fn = torch.nn.MSELoss()

    model, opt = build()
    kit_step = capture_train_step(model, opt, loss_fn, (x, y))
    for _ in range(5):
        kit_step(x, y)

    model_r, opt_r = build()
    sx, sy = x.clone(), y.clone()

    def step():
        loss = loss_fn(model_r(sx), sy)
        loss.backward()
        opt_r.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt_r.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt_r.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def ref_call():
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()

    model_e, opt_e = build()  # eager steps on a model of their own: the graphs own the others' .grad tensors

    def eager_step():
        opt_e.zero_grad(set_to_none=True)
        loss_fn(model_e(x), y).backward()
        opt_e.step()

    return {f"MLP 32x128x256x16, {opt_name}": [("eager", eager_step, eager_step),
                                                 ("whole-step graph", lambda: kit_step(x, y), ref_call)]}


def build_cases():
    cases = {}
    for case, shape in {"small": (1, 3, 224, 224), "large": (32, 3, 224, 224)}.items():
        x = torch.randn(shape, device="cuda")
        new = torch.randn_like(x)
        g = capture(gelu, x)
        hg, hout = hand_graph(lambda x=x: gelu(x))
        hx = x  # the hand-written graph reads x itself

        def hand_copy_replay(hg=hg, hx=hx, new=new):
            hx.copy_(new)
            hg.replay()

        torch.testing.assert_close(g(new), gelu(new))  # correct before fast
        hand_copy_replay()
        torch.testing.assert_close(hout, gelu(new))
        cases[f"GELU {case}"] = [
            ("eager", lambda x=x: gelu(x), lambda x=x: gelu(x)),
            ("graph replay", g.replay, hg.replay),
            ("kit g(x) / copy_+replay", lambda g=g, new=new: g(new), hand_copy_replay),
        ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice
        jgelu = torch.jit.script(gelu)
    xs = torch.randn(1, 3, 224, 224, device="cuda")
    for _ in range(3):
        jgelu(xs)
    gj = capture(jgelu, xs)
    hj, _ = hand_graph(lambda: jgelu(xs))
    cases["GELU small"].append(("jit.script + graph", gj.replay, hj.replay))
    cases.update(mlp_step_cases("SGD"))
    cases.update(mlp_step_cases("Adam"))
    return cases


# (case, variant) -> (notebook stem, start of the case in its results.csv, the variant there)
RECORDED = {
    ("GELU small", "eager"): ("01_gelu", "small", "eager"),
    ("GELU small", "graph replay"): ("01_gelu", "small", "graph replay"),
    ("GELU small", "kit g(x) / copy_+replay"): ("01_gelu", "small", "graph copy+replay"),
    ("GELU large", "eager"): ("01_gelu", "large", "eager"),
    ("GELU large", "graph replay"): ("01_gelu", "large", "graph replay"),
    ("GELU large", "kit g(x) / copy_+replay"): ("01_gelu", "large", "graph copy+replay"),
    ("GELU small", "jit.script + graph"): ("03_jit_compile", "small", "jit.script + graph, input in place"),
    ("MLP 32x128x256x16, SGD", "eager"): ("02_train_step", "MLP 32x128x256x16, SGD", "eager"),
    ("MLP 32x128x256x16, SGD", "whole-step graph"): ("02_train_step", "MLP 32x128x256x16, SGD", "whole-step graph"),
    ("MLP 32x128x256x16, Adam", "eager"): ("02_train_step", "MLP 32x128x256x16, Adam", "eager"),
    ("MLP 32x128x256x16, Adam", "whole-step graph"): ("02_train_step", "MLP 32x128x256x16, Adam", "whole-step graph"),
}


def recorded_us(case, variant, root):
    key = RECORDED.get((case, variant))
    if key is None:
        return float("nan")
    rec = results.load(key[0], root=root)
    if rec is None:
        return float("nan")
    df = rec.df
    sel = df[df.case.astype(str).str.startswith(key[1]) & (df.variant.astype(str) == key[2])]
    return float(sel.median_us.iloc[0]) if len(sel) else float("nan")


def refresh_recorded(root):
    """Re-read ``recorded_us`` from the notebooks' current results (no GPU needed): for a cross-check taken in a
    separate call from the notebooks it compares with."""
    folder = Path(root) / "00_crosscheck"
    df = pd.read_csv(folder / "results.csv")
    df["recorded_us"] = [recorded_us(c, v, root) for c, v in zip(df.case, df.variant)]
    df.to_csv(folder / "results.csv", index=False)
    print(df[["case", "variant", "kit_us", "reference_us", "ratio", "recorded_us"]].round(2).to_string(index=False))


def main(args: argparse.Namespace):
    if args.refresh_recorded:
        return refresh_recorded(results.recorded_root())
    if not torch.cuda.is_available():
        sys.exit("crosscheck needs a CUDA GPU: it compares graph replays timed by the kit and by plain PyTorch.")
    print(env_table(), flush=True)
    cases = build_cases()
    kit, ref, calls = {}, {}, {}
    for r in range(ROUNDS):
        for case, variants in cases.items():
            for variant, kit_fn, ref_fn in variants:
                key = (case, variant)
                if r % 2 and key in calls:  # odd rounds: the plain-PyTorch loop first, so order favours neither
                    ref.setdefault(key, []).append(reference_us(ref_fn, calls[key]))
                df = compare({variant: kit_fn}, case=case, samples=3)  # the kit's way, floor and profiler included
                calls[key] = int(df.calls.iloc[0])
                kit.setdefault(key, []).append(float(df.median_us.iloc[0]))
                if not (r % 2):
                    ref.setdefault(key, []).append(reference_us(ref_fn, calls[key]))
        print(f"round {r + 1}/{ROUNDS} done", flush=True)
    root = results.results_root()
    rows = []
    for (case, variant), ks in kit.items():
        rs = ref[(case, variant)]
        ratios = [k / r for k, r in zip(ks, rs)]
        q = statistics.quantiles(ratios, n=4, method="inclusive")
        rows.append({"case": case, "variant": variant, "kit_us": statistics.median(ks),
                     "reference_us": statistics.median(rs), "ratio": statistics.median(ratios),
                     "ratio_lo": q[0], "ratio_hi": q[2], "calls": calls[(case, variant)],
                     "recorded_us": recorded_us(case, variant, root)})
    df = pd.DataFrame(rows)
    df["median_us"] = df.kit_us
    df["speedup"] = df.groupby("case").kit_us.transform("first") / df.kit_us
    folder = results.save("00_crosscheck", df, extra_env={"rounds": ROUNDS})
    with pd.option_context("display.width", 200):
        print(df[["case", "variant", "kit_us", "reference_us", "ratio", "ratio_lo", "ratio_hi", "recorded_us"]]
              .round(3).to_string(index=False))
    bad = df[(df.ratio < 0.85) | (df.ratio > 1.15)]
    print(f"{len(df) - len(bad)}/{len(df)} rows with kit/reference within 0.85-1.15; saved {folder}")


if __name__ == "__main__":
    main(ARGS)
