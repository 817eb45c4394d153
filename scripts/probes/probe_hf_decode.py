"""Probe (GPU): time per token of a transformers causal LM's greedy decoding at batch 1, five ways, same weights.

A ``LlamaForCausalLM`` built from a config (defaults: 12 layers, hidden 768, 12 query / 4 key-value heads, random
weights, bfloat16; nothing downloaded), a 32-token prompt, 64 new tokens, greedy:

- ``eager``: the decode step with a ``StaticCache`` (``cudagraph_kit.course.lessons.hf_decode.StaticDecoder``), eager;
- ``kit graph``: that step captured by ``cudagraph_kit.graphed``;
- ``hand graph``: the same step captured by hand (side-stream warm-up, ``torch.cuda.graph``, copy + replay);
- ``compiled + kit graph``: the step compiled without CUDA graphs (``--compile-mode``, default
  ``max-autotune-no-cudagraphs``), then captured by the kit;
- ``HF generate static``: ``generate(cache_implementation="static")``, which compiles with reduce-overhead itself.

Every variant's tokens are compared with eager's first; where they differ, ``env.json`` and ``hf_decode.csv``
keep the first differing step, eager's top-2 logit gap there (``margin``), how far the variant's logits were
(``logit_diff``) and ``near_tie`` (``logit_diff >= margin``: bfloat16 rounding decided a near tie). All variants are timed round-robin in ``--windows``
windows (``cudagraph_kit.compare``), each call one whole generation (prefill included); per token = median / new
tokens. Writes ``hf_decode.csv`` (one row per variant, with the prediction intervals of ``combine_windows``),
``hf_decode_ratios.csv`` (kit / hand graph and compiled+kit vs HF generate, window by window, with intervals) and
``env.json`` under ``--out``::

    python scripts/probes/probe_hf_decode.py --out figures/08_hf_decode
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    help='torch.compile mode without CUDA graphs: "max-autotune-no-cudagraphs" or "default"')
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--skip-hf-generate", action="store_true")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

from cudagraph_kit import combine_windows, compare  # noqa: E402
from cudagraph_kit.graphed import capture, fresh_cublas_workspace  # noqa: E402
from cudagraph_kit.course.lessons.hf_decode import StaticDecoder, hf_status  # noqa: E402
from cudagraph_kit.course.lessons.tiny_llm import first_divergence, hf_generate  # noqa: E402
from cudagraph_kit.env import describe  # noqa: E402
from cudagraph_kit.intervals import ratio_across_windows  # noqa: E402


def hand_capture(fn, ids, pos):
    """The step captured by hand: warm-up on a side stream, torch.cuda.graph, and a call that copies and replays."""
    static_ids, static_pos = ids.clone(), pos.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_ids, static_pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_ids, static_pos)

    def call(new_ids, new_pos):
        static_ids.copy_(new_ids)
        static_pos.copy_(new_pos)
        graph.replay()
        return static_out
    return call


def token_checks(generators: dict, ref, ref_logits) -> dict:
    """Each ``{name: generate(logits_out) -> tokens}`` against the eager reference: tokens equal, and where they
    differ the first differing step, eager's top-2 logit gap there (``margin``), how far the variant's logits were
    (``logit_diff``) and whether that makes it a near tie (``logit_diff >= margin``: rounding decided it)."""
    checks = {}
    for name, gen in generators.items():
        logits = []
        d = first_divergence(gen(logits), ref, logits, ref_logits)
        known = lambda v: None if v != v else v  # noqa: E731  (NaN -> None in env.json)
        checks[name] = {"tokens_equal": d["equal"], "first_step": d["first_step"], "margin": known(d["margin"]),
                        "logit_diff": known(d["logit_diff"]), "near_tie": d["near_tie"]}
    return checks


def main(args):
    if not torch.cuda.is_available():
        sys.exit("this probe needs a CUDA GPU")
    version, why = hf_status()
    if version is None:
        sys.exit(f"this probe needs transformers: {why}")
    if "cudagraphs" not in args.compile_mode and args.compile_mode != "default":
        sys.exit(f"--compile-mode {args.compile_mode!r} would add CUDA graphs of its own; use "
                 "max-autotune-no-cudagraphs or default")
    import pandas as pd
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_grad_enabled(False)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=4096, bos_token_id=None,
                      eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", getattr(torch, args.dtype)).eval()
    prompt = torch.randint(1, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).cuda()
    dec = StaticDecoder(model, batch=1, max_len=args.prompt + args.new)
    print(f"transformers {version}: {dec.behaviour.describe()}")
    steps, setup_s = {}, {}
    t0 = time.perf_counter()
    steps["kit graph"] = dec.capture(capture, fn=fresh_cublas_workspace(dec.step))
    setup_s["kit graph"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    steps["hand graph"] = dec.capture(hand_capture, fn=fresh_cublas_workspace(dec.step))
    setup_s["hand graph"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = torch.compile(dec.step, mode=None if args.compile_mode == "default" else args.compile_mode)
    steps["compiled + kit graph"] = dec.capture(capture, fn=fresh_cublas_workspace(compiled))
    setup_s["compiled + kit graph"] = time.perf_counter() - t0

    runners = {"eager": lambda: dec.generate(prompt, args.new)}
    runners.update({name: (lambda g=g: dec.generate(prompt, args.new, step=g)) for name, g in steps.items()})
    if not args.skip_hf_generate:
        runners["HF generate static"] = lambda: hf_generate(model, prompt, args.new, cache_implementation="static")
    ref_logits = []
    ref = dec.generate(prompt, args.new, logits_out=ref_logits)
    generators = {name: (lambda out, g=g: dec.generate(prompt, args.new, step=g, logits_out=out))
                  for name, g in steps.items()}
    if "HF generate static" in runners:
        generators["HF generate static"] = lambda out: hf_generate(model, prompt, args.new,
                                                                   cache_implementation="static", logits_out=out)
    for name in generators:   # its first call (a compile) counts as setup
        t0 = time.perf_counter()
        runners[name]()
        torch.cuda.synchronize()
        setup_s[name] = setup_s.get(name, 0.0) + (time.perf_counter() - t0)
    checks = {"eager": {"tokens_equal": True, "first_step": None, "margin": None, "logit_diff": None,
                        "near_tie": False}, **token_checks(generators, ref, ref_logits)}
    for name, c in checks.items():
        print(f"{name}: tokens equal to eager: {c['tokens_equal']}" + ("" if c["tokens_equal"] else
              f" (from step {c['first_step']}: eager's top-2 gap {c['margin']}, logits {c['logit_diff']} apart, "
              f"near tie: {c['near_tie']})"))
    windows = [compare(runners, case="hf decode, batch 1", calls=1, samples=args.samples, floor=False)
               for _ in range(args.windows)]
    table = combine_windows(windows)
    table["ms_per_token"] = table.median_us / 1000 / args.new
    table["setup_s"] = table.variant.map(setup_s)
    for col in ("tokens_equal", "first_step", "margin", "logit_diff", "near_tie"):
        table[col] = table.variant.map(lambda v, col=col: checks[v][col])
    print(table[["variant", "ms_per_token", "speedup", "speedup_lo", "speedup_hi", "setup_s", "tokens_equal"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    ratios = []
    pairs = [("kit graph", "hand graph"), ("compiled + kit graph", "HF generate static"),
             ("kit graph", "compiled + kit graph")]
    for a, b in pairs:   # a's time over b's, window by window
        if a in runners and b in runners:
            r = ratio_across_windows(windows, ("hf decode, batch 1", a), ("hf decode, batch 1", b))
            ratios.append({"numerator": a, "denominator": b, "lo": r["lo"], "hi": r["hi"],
                           "values": ";".join(f"{v:.4f}" for v in r.get("values", []))})
            print(f"{a} time / {b} time: {r['lo']:.3f}-{r['hi']:.3f} (90% prediction interval)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "hf_decode.csv", index=False)
    pd.DataFrame(ratios).to_csv(out / "hf_decode_ratios.csv", index=False)
    env = describe()
    env.update(vars(args), transformers=version, write_position=dec.behaviour.describe(), checks=checks,
               script="scripts/probes/probe_hf_decode.py")
    (out / "env.json").write_text(json.dumps(env, indent=2, default=str))
    print("wrote", out)


if __name__ == "__main__":
    main(ARGS)
