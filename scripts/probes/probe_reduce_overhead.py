"""Probe: where does ``torch.compile(mode="reduce-overhead")`` beat eager on this GPU, and what does it cost?

Case A, inference: the 12-layer MLP of notebook 03 (Linear 256 + ReLU, batch 8), compiled three ways.
Case B, training: the same MLP trained with SGD, forward+backward under reduce-overhead (two graphs, built by
AOTAutograd and cudagraph trees) against eager and the kit's whole-step graph. Everything is checked against
eager first; all variants of a case are timed in one ``compare`` (round-robin).
Run on a GPU: ``python scripts/probes/probe_reduce_overhead.py``.
"""
import argparse
import copy
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root

if __name__ == "__main__":  # no options: --help and a mistyped option answer here, before PyTorch loads
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from cudagraph_kit import capture_train_step, compare  # noqa: E402
from cudagraph_kit.graphed import capture  # noqa: E402

LAYERS, WIDTH, BATCH = 12, 256, 8
COLS = ["variant", "executed_as", "median_us", "iqr_us", "speedup", "speedup_lo", "speedup_hi", "floor_us",
        "kernels_per_call", "copies_per_call", "eager_kernels_per_call"]


def make_mlp(seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def mark(fn):
    def call(*a):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(*a)
    return call


def top_functions(fn, *args, calls=300, n=14):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*args)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    return s.getvalue()


def inference():
    print("== A. inference, 12-layer MLP forward")
    mlp = make_mlp().requires_grad_(False)
    mlp_grad = make_mlp()                       # parameters that require grad, run under no_grad
    x, x2 = torch.randn(BATCH, WIDTH, device="cuda"), torch.randn(BATCH, WIDTH, device="cuda")

    def closure_forward(t):
        return mlp(t)

    ro_module = torch.compile(mlp, mode="reduce-overhead", dynamic=False)
    ro_closure = mark(torch.compile(closure_forward, mode="reduce-overhead", dynamic=False))
    ro_grad_module = torch.compile(mlp_grad, mode="reduce-overhead", dynamic=False)
    variants = {
        "eager": mlp,
        "torch.compile": torch.compile(copy.deepcopy(mlp), dynamic=False),
        "reduce-overhead, module (params frozen)": mark(ro_module),
        "reduce-overhead, closure (notebook 03)": ro_closure,
        "reduce-overhead, module under no_grad": lambda t: _no_grad(mark(ro_grad_module), t),
        "kit graph g(x)": capture(mlp, x),
    }
    ref = mlp(x2)
    for name, fn in variants.items():
        for _ in range(3):
            fn(x)
        err = (fn(x2) - ref).abs().max().item()
        print(f"  {name}: max |err| vs eager {err:.2e}")
        assert err < 1e-3, name
    df = compare(variants, x, case="MLP forward", samples=15)
    print(df[COLS].to_string(index=False, float_format="%.2f"))
    print("  cudagraph_skips:", counters["inductor"]["cudagraph_skips"])
    print(top_functions(variants["reduce-overhead, closure (notebook 03)"], x))
    print(top_functions(variants["reduce-overhead, module (params frozen)"], x))


def _no_grad(fn, t):
    with torch.no_grad():
        return fn(t)


def training():
    print("== B. training, 12-layer MLP, SGD, forward+backward")
    loss_fn = torch.nn.functional.mse_loss
    x, y = torch.randn(BATCH, WIDTH, device="cuda"), torch.randn(BATCH, WIDTH, device="cuda")

    def eager_step_of(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(xb, yb):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            return loss
        return step

    def ro_step_of(model, compile_opt=False):
        cmodel = torch.compile(model, mode="reduce-overhead", dynamic=False)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        opt_step = torch.compile(opt.step) if compile_opt else opt.step

        def step(xb, yb):
            torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(cmodel(xb), yb)
            loss.backward()
            opt_step()
            return loss
        return step

    def kit_step_of(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        return capture_train_step(model, opt, loss_fn, (x, y))

    makers = {"eager": eager_step_of, "reduce-overhead fwd+bwd, eager SGD": ro_step_of,
              "reduce-overhead fwd+bwd, compiled SGD": lambda m: ro_step_of(m, True),
              "kit whole-step graph": kit_step_of}
    models = {name: make_mlp(1) for name in makers}
    steps = {name: makers[name](models[name]) for name in makers}
    for _ in range(6):                           # parity: same data, same steps
        for name in steps:
            steps[name](x, y)
    ref = list(models["eager"].parameters())
    for name, model in models.items():
        err = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref))
        print(f"  {name}: max |param diff| vs eager after 6 steps {err:.2e}")
    df = compare(steps, x, y, case="MLP training step", samples=15)
    print(df[COLS].to_string(index=False, float_format="%.2f"))
    print("  cudagraph_skips:", counters["inductor"]["cudagraph_skips"])


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0), torch.__version__)
    for part in (inference, training):
        try:
            part()
        except Exception as e:  # keep going: the other case still tells something
            print(f"  {part.__name__} failed: {type(e).__name__}: {e}")
