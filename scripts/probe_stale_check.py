"""Probe: what the stale-weights check (``capture(..., check_weights=True)``) costs per call, and the stale cases it
turns into errors.

Cases:
  gelu   notebook 01's small GELU, x of shape (1, 3, 224, 224): a function that reaches no module, so there is nothing
         to check; variants: hand-written ``static.copy_(x); graph.replay()`` and the kit's ``g(x)`` (check on and off).
  llama  a transformers ``LlamaForCausalLM`` decode step with a ``StaticCache``, built from a config (12 layers, hidden
         768, 12 heads, random weights, bf16, batch 1): ``g(ids, pos)`` with the check on and off, and the hand-written
         copies + replay.
Timing: the variants of a case are timed round-robin in each round (order rotated), ``--calls`` calls per sample
with a synchronize at each end; per-call times are reported as medians over ``--rounds`` rounds with their quartiles,
and the cost of the check as the median (and quartiles) of the per-round differences on - off. ``check_us`` is the
host time of ``CapturedTensors.check()`` alone (nothing launched), per call.
Stale cases (recorded in stale_cases.json): a Llama parameter replaced by assignment, the Llama re-typed with
``.half()``, and ``optimizer.add_param_group`` after ``capture_train_step``: each must raise StaleGraphError before
replaying.

Run on a GPU:  python scripts/probe_stale_check.py --out figures/stale_check/<gpu>
Writes rounds.csv (every sample), summary.csv (one row per case and variant), stale_cases.json, env.json.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from cudagraph_kit.capture import StaleGraphError, capture
from cudagraph_kit.train_step import capture_train_step


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), q[0], q[2]


def time_round(variants: dict, calls: int, order: list) -> dict:
    out = {}
    for name in order:
        fn = variants[name]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) / calls * 1e6
    return out


def host_check_us(g, calls: int) -> float | None:
    if g.weights is None:
        return None
    check = g.weights.check
    t0 = time.perf_counter()
    for _ in range(calls):
        check()
    return (time.perf_counter() - t0) / calls * 1e6


def build_llama(layers=12, hidden=768, heads=12, max_len=512):
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    try:
        cache = StaticCache(config=cfg, max_cache_len=max_len)                        # transformers 5
    except TypeError:
        cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len,     # transformers 4
                            device="cuda", dtype=torch.bfloat16)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode_step(ids, pos):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_kw: cache}).logits

    return model, decode_step, cache


def case_rows(case: str, variants: dict, rounds: int, calls: int, rows: list, before_round=None) -> None:
    names = list(variants)
    for r in range(rounds):
        if before_round is not None:
            before_round()
        order = names[r % len(names):] + names[:r % len(names)]
        for name, us in time_round(variants, calls, order).items():
            rows.append({"case": case, "variant": name, "round": r, "us_per_call": us})


def summarize(rows: list, checks: dict) -> list:
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        per = {}
        for r in rows:
            if r["case"] == case:
                per.setdefault(r["variant"], {})[r["round"]] = r["us_per_call"]
        for variant, by_round in per.items():
            med, lo, hi = quartiles(list(by_round.values()))
            row = {"case": case, "variant": variant, "median_us": med, "q1_us": lo, "q3_us": hi,
                   "rounds": len(by_round)}
            for base in ("check_off", "hand_written"):
                if variant != base and base in per:
                    diffs = [by_round[k] - per[base][k] for k in by_round if k in per[base]]
                    row[f"minus_{base}_median_us"], row[f"minus_{base}_q1_us"], row[f"minus_{base}_q3_us"] = \
                        quartiles(diffs)
            if variant == "check_on":
                row["check_us"], row["checked_tensors"] = checks.get(case, (None, None))
            out.append(row)
    return out


def stale_cases(decode_step, model, ids, pos) -> list:
    """Each stale case through the public API: does it raise StaleGraphError before replaying?"""
    results = []

    def attempt(name, make_stale, call):
        try:
            make_stale()
            call()
            results.append({"case": name, "raised": False, "error": None, "message": None})
        except StaleGraphError as exc:
            results.append({"case": name, "raised": True, "error": type(exc).__name__, "message": str(exc)})
        except Exception as exc:  # noqa: BLE001 - recorded: any other error is a finding too
            results.append({"case": name, "raised": False, "error": type(exc).__name__, "message": str(exc)})

    g = capture(decode_step, ids, pos)
    q = model.model.layers[0].self_attn.q_proj
    attempt("llama: parameter replaced (q_proj.weight = nn.Parameter(...))",
            lambda: setattr(q, "weight", torch.nn.Parameter(torch.randn_like(q.weight))), lambda: g(ids, pos))
    g = capture(decode_step, ids, pos)
    attempt("llama: model.half() after capture", model.half, lambda: g(ids, pos))

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    step = capture_train_step(net, opt, torch.nn.functional.mse_loss, (x, y), warmup=2)
    for _ in range(4):
        step(x, y)
    head = torch.nn.Linear(8, 8).cuda()
    attempt("train step: optimizer.add_param_group after capture",
            lambda: opt.add_param_group({"params": list(head.parameters())}), lambda: step(x, y))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=500, help="calls per sample (llama: a fifth of it)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    rows, checks = [], {}

    x = torch.randn(1, 3, 224, 224, device="cuda")
    g_on, g_off = capture(gelu, x), capture(gelu, x, check_weights=False)
    hand_graph, hand_static = g_off.graph, g_off.static_inputs[0]   # copy_ + replay by hand on the same graph

    def hand():
        hand_static.copy_(x)
        hand_graph.replay()
    case_rows("gelu", {"hand_written": hand, "check_on": lambda: g_on(x), "check_off": lambda: g_off(x)},
              args.rounds, args.calls, rows)
    checks["gelu"] = (host_check_us(g_on, 10_000), len(g_on.weights) if g_on.weights is not None else 0)

    model, decode_step, cache = build_llama()

    def rewind():  # transformers 5's StaticLayer advances its own write position on every call: start over
        torch.cuda.synchronize()
        cache.reset()
    ids = torch.ones(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        decode_step(ids, pos)  # the cache's lazy initialisation, outside any capture
    l_on, l_off = capture(decode_step, ids, pos), capture(decode_step, ids, pos, check_weights=False)
    hand_graph_l, (s_ids, s_pos) = l_off.graph, l_off.static_inputs

    def hand_l():
        s_ids.copy_(ids)
        s_pos.copy_(pos)
        hand_graph_l.replay()
    case_rows("llama", {"hand_written": hand_l, "check_on": lambda: l_on(ids, pos),
                        "check_off": lambda: l_off(ids, pos)},
              args.rounds, max(20, args.calls // 5), rows, before_round=rewind)
    checks["llama"] = (host_check_us(l_on, 10_000), len(l_on.weights))

    summary = summarize(rows, checks)
    rewind()
    stale = stale_cases(decode_step, model, ids, pos)

    import pandas as pd
    pd.DataFrame(rows).to_csv(args.out / "rounds.csv", index=False)
    pd.DataFrame(summary).to_csv(args.out / "summary.csv", index=False)
    (args.out / "stale_cases.json").write_text(json.dumps(stale, indent=2))
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    env = {"gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": tf_version,
           "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "rounds": args.rounds, "calls_gelu": args.calls, "calls_llama": max(20, args.calls // 5)}
    (args.out / "env.json").write_text(json.dumps(env, indent=2))

    print(f"{env['gpu']}, PyTorch {env['torch']}, transformers {tf_version}")
    cols = ["case", "variant", "median_us", "q1_us", "q3_us", "minus_check_off_median_us",
            "minus_hand_written_median_us", "check_us", "checked_tensors"]
    print(pd.DataFrame(summary).reindex(columns=cols).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    for s in stale:
        print(f"{'RAISED' if s['raised'] else 'NOT RAISED':>10}  {s['case']}: {(s['message'] or '')[:160]}")


if __name__ == "__main__":
    main()
