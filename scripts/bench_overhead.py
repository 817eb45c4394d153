"""Benchmark: what a kit call costs on the host, per call, beside a hand-written replay and ``reduce-overhead``.

Host time per call, without synchronization: each sample is a burst of calls timed on the host with a synchronize
before and after the burst, never inside it (what a training or decode loop pays to issue a call). The variants of a
case are timed round-robin, the order rotated each round, so drift hits them alike; reported per variant: the median
per-call time over the rounds, its quartiles, and the median of the per-round differences to the hand-written
``static.copy_(x); graph.replay()`` (the kit's cost over the raw graph).

Cases (every graphed result is compared with eager first):
  mlp48   48 ``Linear(64, 64)`` layers (96 tensors), batch 8: hand-written, the kit with its guard (default), the kit
          inside ``weights_fixed`` (one check per burst of calls), the kit with ``check_weights=False``, the kit
          before this change (``--baseline``), and ``torch.compile(mode="reduce-overhead")``.
  llama   a transformers ``LlamaForCausalLM`` decode step with a ``StaticCache`` (12 layers, hidden 768, random
          weights, bf16, batch 1; 114 tensors read): the same kit variants (no reduce-overhead).
  train   a whole Adam(capturable) training step of 56 ``Linear(64, 64)`` layers (111 parameters): the host time of
          the step's checks before each replay (nothing launched), now and before this change.
Also: the guard's check alone per call (nothing launched) and per tensor.

Run on a GPU:  python scripts/bench_overhead.py [--out DIR] [--baseline DIR]   (``reproduce`` runs it after the
notebooks and publishes figures/00_overhead)
``--baseline DIR``: a folder holding the kit before the change as the package ``cudagraph_kit_old``
(``git archive <commit> cudagraph_kit | tar -x -C DIR && mv DIR/cudagraph_kit DIR/cudagraph_kit_old``).
Writes rounds.csv, results.csv (the summary), checks.csv, env.json; the README's "what the kit costs" is rendered from
results.csv and checks.csv (scripts/update_readme.py).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from cudagraph_kit.graphed import capture  # noqa: E402
from cudagraph_kit.guard import weights_fixed  # noqa: E402
from cudagraph_kit.train_step import capture_train_step  # noqa: E402


def burst_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def block_us(g, call, calls: int) -> float:
    """A burst inside one ``weights_fixed`` block: its entry and exit checks are part of the time."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with weights_fixed(g):
        for _ in range(calls):
            call()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def run_case(case: str, variants: dict, rounds: int, calls: int, rows: list, before_round=None) -> None:
    names = list(variants)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if before_round is not None:
                before_round()
            rows.append({"case": case, "variant": name, "round": r, "us_per_call": variants[name](calls)})


def summarize(rows: list) -> list:
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {}
        for r in rows:
            if r["case"] == case:
                by.setdefault(r["variant"], {})[r["round"]] = r["us_per_call"]
        hand = by["hand_written"]
        for variant, samples in by.items():
            xs = list(samples.values())
            q = statistics.quantiles(xs, n=4, method="inclusive")
            diffs = [samples[k] - hand[k] for k in samples if k in hand]
            out.append({"case": case, "variant": variant, "median_us": statistics.median(xs), "q1_us": q[0],
                        "q3_us": q[2], "minus_hand_written_median_us": statistics.median(diffs), "rounds": len(xs)})
    return out


def check_alone_us(check, n: int = 20_000) -> float:
    for _ in range(100):
        check()
    t0 = time.perf_counter()
    for _ in range(n):
        check()
    return (time.perf_counter() - t0) / n * 1e6


def mlp48():
    torch.manual_seed(0)
    layers = []
    for _ in range(48):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda().eval()


def build_llama(layers=12, hidden=768, heads=12, max_len=512):
    import inspect

    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    try:
        cache = StaticCache(config=cfg, max_cache_len=max_len)                        # transformers 5
    except TypeError:
        cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device="cuda", dtype=torch.bfloat16)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode_step(ids, pos):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_kw: cache}).logits
    return model, decode_step, cache


def kit_variants(make_graph, old_capture, args_now, cast=None):
    """hand_written, kit, kit_weights_fixed, kit_check_off (and kit_before_change) for one function."""
    g_on = make_graph(capture)
    g_off = make_graph(lambda *a, **k: capture(*a, check_weights=False, **k))
    graph, statics = g_off.graph, g_off.static_inputs

    def hand():
        for s, a in zip(statics, args_now):
            s.copy_(a)
        graph.replay()

    variants = {"hand_written": lambda n: burst_us(hand, n),
                "kit": lambda n: burst_us(lambda: g_on(*args_now), n),
                "kit_weights_fixed": lambda n: block_us(g_on, lambda: g_on(*args_now), n),
                "kit_check_off": lambda n: burst_us(lambda: g_off(*args_now), n)}
    if old_capture is not None:
        g_old = make_graph(old_capture)
        variants["kit_before_change"] = lambda n: burst_us(lambda: g_old(*args_now), n)
    return variants, g_on


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default: <results root>/00_overhead ($CGK_RESULTS_DIR under reproduce, "
                    "build/figures otherwise; never the recorded figures/ unless reproduce publishes it)")
    ap.add_argument("--baseline", type=Path, help="a folder holding the kit before the change as cudagraph_kit_old")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--calls", type=int, default=50, help="calls per burst")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: host costs measured on a CPU machine are not results")
    if args.out is None:
        from cudagraph_kit.course.measuring import results
        args.out = Path(results.results_root()) / "00_overhead"
    args.out.mkdir(parents=True, exist_ok=True)
    old = None
    if args.baseline is not None:
        sys.path.insert(0, str(args.baseline))
        old = importlib.import_module("cudagraph_kit_old")
    rows, checks = [], []

    # -- mlp48 ---------------------------------------------------------------------------------------------------
    model = mlp48()
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        variants, g = kit_variants(lambda cap: cap(model, x), old.capture if old else None, (x,))
        torch.testing.assert_close(g(x), model(x))
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):
            compiled(x)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
        variants["reduce_overhead"] = lambda n: burst_us(lambda: compiled(x), n)
        run_case("mlp48", variants, args.rounds, args.calls, rows)
    checks.append({"case": "mlp48", "tensors": len(g.guard), "check_us": check_alone_us(g.guard.check)})

    # -- llama ---------------------------------------------------------------------------------------------------
    lm, decode_step, cache = build_llama()
    ids = torch.ones(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")

    def rewind():  # transformers 5's StaticLayer advances its own write position on every call: start over
        torch.cuda.synchronize()
        cache.reset()
    with torch.no_grad():
        decode_step(ids, pos)   # the cache's lazy initialisation, outside any capture
        rewind()
        expected = decode_step(ids, pos).clone()
        rewind()
        variants, g = kit_variants(lambda cap: cap(decode_step, ids, pos), old.capture if old else None, (ids, pos))
        rewind()
        torch.testing.assert_close(g(ids, pos).float(), expected.float(), rtol=2e-2, atol=2e-2)
        run_case("llama", variants, args.rounds, args.calls, rows, before_round=rewind)
    checks.append({"case": "llama", "tensors": len(g.guard), "check_us": check_alone_us(g.guard.check)})
    del g, variants

    # -- train: the checks before each replay of a whole Adam step (111 parameters) ----------------------------------
    torch.manual_seed(0)
    xt, yt = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    for label, maker in (("now", capture_train_step), ("before_change", old.capture_train_step if old else None)):
        if maker is None:
            continue
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(55)], torch.nn.Linear(64, 64, bias=False))
        net = net.cuda()
        opt = torch.optim.Adam(net.parameters(), lr=1e-4, capturable=True)
        step = maker(net, opt, torch.nn.functional.mse_loss, (xt, yt), warmup=2)
        for _ in range(4):
            step(xt, yt)
        torch.cuda.synchronize()
        if label == "now":
            checks_fn = step._check_still_captured
        else:  # the checks the earlier step ran before each replay
            def checks_fn(s=step):
                s._check_still_captured()
                s._check_grads_still_static()
        checks.append({"case": f"train_step_checks_{label}", "tensors": sum(1 for _ in net.parameters()),
                       "check_us": check_alone_us(checks_fn, 5_000)})
        del step, opt, net

    import pandas as pd
    summary = summarize(rows)
    pd.DataFrame(rows).to_csv(args.out / "rounds.csv", index=False)
    pd.DataFrame(summary).to_csv(args.out / "results.csv", index=False)   # what the README renders
    for c in checks:
        c["per_tensor_us"] = c["check_us"] / c["tensors"] if c["tensors"] else None
    pd.DataFrame(checks).to_csv(args.out / "checks.csv", index=False)
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    env = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": tf_version,
           "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "rounds": args.rounds, "calls_per_burst": args.calls, "baseline": str(args.baseline or "")}
    if os.environ.get("CGK_RUN"):  # under reproduce: the run this benchmark belongs to (check-figures reads it)
        env["run"] = json.loads(os.environ["CGK_RUN"])
    (args.out / "env.json").write_text(json.dumps(env, indent=2))
    print(f"{env['gpu']}, PyTorch {env['torch']}, transformers {tf_version}")
    print(pd.DataFrame(summary).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(pd.DataFrame(checks).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
