"""Probe (GPU): where a decode loop's time goes, the kit's graphs against ``torch.compile(mode="reduce-overhead")``.

Notebook 08 generates greedy tokens with its small LLaMA (08's GPU configuration, float32) in a plain host loop: one
call of the decode step per token, then ``argmax`` and ``pos + 1``. This probe times whole generations (prefill and
``--tokens`` tokens) of the same model, round-robin, at batch 1 and 64:

- ``compile + kit graph per bucket``: the step compiled in the default mode, captured per bucket (08's variant);
- the same inside ``weights_fixed`` (one guard check per generation instead of per call);
- ``reduce-overhead``: the step compiled with ``mode="reduce-overhead"`` (08's variant);
- ``compile + kit, K tokens per replay``: K compiled decode steps in one graph (08's "Going further" C), one host
  read per block of K tokens.

For each generation it also takes the host's time to issue the loop (before the final synchronize): when that is
below the whole generation's time, the loop waits for the GPU and the host's cost per call is hidden. And it takes
apart one call of the kit's bucketed graphs at batch 1, host µs per part (bursts of calls, synchronized around the
burst, never inside): checking the arguments, the guard, copying the inputs in, the replay, slicing the outputs;
beside one call of the ``reduce-overhead`` step.

Writes ``generations.csv`` (one row per variant, batch and round), ``summary.csv`` (medians, µs per token, ratio to
reduce-overhead), ``host_parts.csv`` and ``env.json`` into ``--out``::

    python scripts/probes/probe_decode_loop.py [--out build/decode_loop] [--rounds 15] [--tokens 32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/decode_loop", help="folder for the CSV and JSON files (default: build/decode_loop)")
    ap.add_argument("--rounds", type=int, default=15, help="round-robin rounds of whole generations (default 15)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per generation (default 32, as in 08)")
    ap.add_argument("--k", type=int, default=8, help="tokens per replay of the K-step variant (default 8)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args(argv)

    import pandas as pd
    import torch

    if not torch.cuda.is_available():
        print("probe_decode_loop needs a CUDA GPU (it times CUDA graphs); nothing was run.", file=sys.stderr)
        return 2

    from cudagraph_kit import capture
    from cudagraph_kit.bucket_graphs import ladder
    from cudagraph_kit.course.lessons.decode import decode_state, generate_blocks, k_step, load_state, positions_needed
    from cudagraph_kit.course.lessons.decode import compile_then_capture, reduce_overhead_step
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM, greedy_generate
    from cudagraph_kit.env import describe
    from cudagraph_kit.graphed import fresh_cublas_workspace
    from cudagraph_kit.guard import weights_fixed
    from cudagraph_kit.memory import MemoryLedger

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    cfg = TinyConfig(vocab_size=8192, dim=512, layers=4, heads=8, kv_heads=2, hidden=1408)   # 08 on a GPU
    prompt_len, max_batch = 16, max(args.batches)
    max_len = max(positions_needed(prompt_len, args.tokens, args.k), 65)
    model = TinyLLM(cfg, seed=0, device="cuda", dtype=torch.float32).eval()
    cache = StaticKVCache(cfg, max_batch=max_batch, max_len=max_len, device="cuda", dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    prompts = {b: torch.randint(0, cfg.vocab_size, (b, prompt_len), generator=gen).cuda() for b in args.batches}

    def decode_step(tokens, pos):
        return model.decode(tokens, pos, cache)

    sizes = ladder(max_batch)
    zeros = torch.zeros(max_batch, dtype=torch.long, device="cuda")
    t0 = time.perf_counter()
    fused = compile_then_capture(model, cache, zeros, zeros.clone(), sizes, MemoryLedger(), {})
    print(f"compile + kit buckets ready in {time.perf_counter() - t0:.1f} s; guard: {fused.guard}", flush=True)
    t0 = time.perf_counter()
    reduce_overhead = reduce_overhead_step(decode_step, cache)
    for b in args.batches:   # compile and record each batch size before timing
        for _ in range(3):
            greedy_generate(model, cache, prompts[b], args.tokens, step=reduce_overhead)
    print(f"reduce-overhead ready in {time.perf_counter() - t0:.1f} s", flush=True)

    # K compiled steps per replay (the compiled step of compile_then_capture is fused.fn: fresh_cublas_workspace of it)
    k_graphs = {}
    for b in args.batches:
        block = fresh_cublas_workspace(k_step(fused.fn, args.k, pad_token=0))
        sample = decode_state(torch.zeros(b, dtype=torch.long, device="cuda"), 0)
        try:
            k_graphs[b] = capture(block, *sample, warmup=2)
        except Exception as exc:  # noqa: BLE001 - the other variants still run
            print(f"K={args.k} per replay at batch {b} could not be captured: {type(exc).__name__}: {exc}"[:600])
    print(f"K={args.k} graphs captured for batches {sorted(k_graphs)}", flush=True)

    def plain(step):
        return lambda b: greedy_generate(model, cache, prompts[b], args.tokens, step=step)

    def fixed(b):
        with weights_fixed(fused):
            return greedy_generate(model, cache, prompts[b], args.tokens, step=fused)

    def k_block(b):
        g = k_graphs[b]
        first = model.prefill(prompts[b], cache).argmax(-1)
        load_state(g.static_inputs, decode_state(first, prompt_len))
        return generate_blocks(g.replay, g.static_inputs, first, args.tokens, args.k, 0)

    variants = {"compile + kit graph per bucket": plain(fused), "compile + kit, weights_fixed": fixed,
                "reduce-overhead": plain(reduce_overhead)}
    if len(k_graphs) == len(args.batches):
        variants[f"compile + kit, {args.k} tokens per replay"] = k_block
    eager = {b: greedy_generate(model, cache, prompts[b], args.tokens) for b in args.batches}
    for name, run in variants.items():   # correct before fast: the same tokens as eager
        for b in args.batches:
            got = run(b)
            same = torch.equal(got.cpu(), eager[b].cpu())
            print(f"{name}, batch {b}: tokens equal to eager: {same}", flush=True)

    rows = []
    order = list(variants)
    for r in range(args.rounds):
        for b in args.batches:
            for name in order[r % len(order):] + order[:r % len(order)]:   # the order rotated each round
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                variants[name](b)
                host = time.perf_counter() - t0
                torch.cuda.synchronize()
                rows.append({"variant": name, "batch": b, "round": r, "host_ms": host * 1e3,
                             "ms": (time.perf_counter() - t0) * 1e3})
    df = pd.DataFrame(rows)
    df.to_csv(out / "generations.csv", index=False)
    summary = df.groupby(["batch", "variant"], sort=False).agg(ms=("ms", "median"), host_ms=("host_ms", "median"))
    summary = summary.reset_index()
    summary["us_per_token"] = summary.ms * 1e3 / args.tokens
    ro = summary[summary.variant == "reduce-overhead"].set_index("batch").ms
    summary["vs_reduce_overhead"] = summary.ms / summary.batch.map(ro)
    # the same ratio per round (drift hits both alike), its median and range
    per_round = df.pivot_table(index=["batch", "round"], columns="variant", values="ms")
    for name in order:
        ratio = (per_round[name] / per_round["reduce-overhead"]).groupby(level=0)
        summary.loc[summary.variant == name, "ratio_median"] = summary.batch.map(ratio.median())
        summary.loc[summary.variant == name, "ratio_min"] = summary.batch.map(ratio.min())
        summary.loc[summary.variant == name, "ratio_max"] = summary.batch.map(ratio.max())
    summary.to_csv(out / "summary.csv", index=False)
    print(summary.round(3).to_string(index=False), flush=True)

    # one call of the kit's buckets taken apart, at the smallest batch, host µs per part
    b = min(args.batches)
    tokens, pos = torch.zeros(b, dtype=torch.long, device="cuda"), torch.full((b,), prompt_len, device="cuda")
    bucket = fused.bucket_for(b)
    views = fused._views[bucket]
    graph = fused.graphs[bucket]

    def burst(fn, calls=200, rounds=21):
        times = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(times)

    parts = {
        "whole kit call": lambda: fused(tokens, pos),
        "argument check (_rows, bucket_for)": lambda: fused.bucket_for(fused._rows((tokens, pos))),
        "guard.check()": fused.guard.check if fused.guard is not None else (lambda: None),
        "copy 2 inputs in": lambda: (views[0].narrow(0, 0, b).copy_(tokens), views[1].narrow(0, 0, b).copy_(pos)),
        "replay": graph.replay,
        "slice outputs": lambda: [o.narrow(0, 0, b) for o in fused.static_outputs],
        "reduce-overhead call": lambda: reduce_overhead(tokens, pos),
        "loop's argmax + pos + 1": lambda: (fused.static_outputs[0].narrow(0, 0, b).argmax(-1), pos + 1),
    }
    host = pd.DataFrame([{"part": k, "host_us_per_call": burst(fn)} for k, fn in parts.items()])
    host.to_csv(out / "host_parts.csv", index=False)
    print(host.round(2).to_string(index=False), flush=True)
    (out / "env.json").write_text(json.dumps({**describe(), "tokens": args.tokens, "rounds": args.rounds,
                                              "k": args.k, "batches": args.batches, "dtype": "float32"}, indent=1,
                                             default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
