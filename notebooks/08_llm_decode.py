# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · LLM decoding: a static KV cache, one graph per batch bucket, and what people use today
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/v0.2.0/notebooks/08_llm_decode.ipynb)
#
# A language model generates text one token at a time. Each new token runs the whole model on one position per
# sequence: hundreds of small kernels, each launched from Python, for very little GPU work. Decoding is
# **host-bound**: the GPU waits for the CPU to launch the next kernel. A CUDA graph removes those launches, but it
# replays fixed shapes, and a cache that grows by one position per token changes shape at every step. A **static
# KV cache**, allocated once for a maximum length and masked, keeps every shape fixed; then one graph per batch
# size replays every decode step. Serving engines (vLLM, SGLang) do exactly this for a ladder of batch sizes in
# one shared memory pool; `torch.compile(mode="reduce-overhead")` and Hugging Face's `generate` with a static
# cache do it for you.
#
# This notebook builds a small LLaMA-style model with random weights (nothing is downloaded), decodes greedily
# with a static cache, captures the decode step once per batch bucket with the kit, and sets it side by side
# with eager decoding, `torch.compile(mode="reduce-overhead")` and `transformers`' `generate` on the same
# weights.
#
# **What you'll learn**
# - Why decoding is host-bound: kernels per token, the time per token against the GPU-busy floor.
# - How a static KV cache (fixed shapes, per-row positions, a mask) makes the decode step capturable, and how
#   to check it first: the same greedy tokens as decoding without any cache.
# - How to serve a batch size that changes every step from a few graphs in one shared pool, with buckets planned
#   from the batch sizes you observed, against a fixed vLLM-style ladder.
# - What the kit's graphs, `reduce-overhead` and `transformers`' static-cache `generate` each cost and buy:
#   time per token, tokens per second, capture or compile time, memory.
# - Why prefill (the prompt) gains little from a graph.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU); `transformers` for its row
# (the notebook says so and skips it when it is missing). Without a GPU the notebook runs its CPU part small (the
# correctness checks, everything eager, labelled so) and shows the recorded GPU results.
#
# **How long**: 114 s on an NVIDIA H100 (measured by `reproduce`, 2026-11-24; most of it `torch.compile`
# compiling); a T4 has not been timed yet; about a minute on a CPU (small sizes).

# %%
# Setup: use the kit of this checkout; in Colab first make a shallow clone of the release REPO_REF (the kit and
# its recorded GPU results). cudagraph_kit.course.setup_notebook then checks PyTorch and, in Colab, installs it.
import os, subprocess, sys
from pathlib import Path

REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "v0.2.0")
try:
    import google.colab  # noqa: F401  (importable only in Colab)
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
here = Path.cwd().resolve()
checkout = next((p for p in (here, *here.parents) if (p / "cudagraph_kit").is_dir()), None)
if checkout is None and IN_COLAB:
    checkout = here / "cudagraph-kit"
    if not checkout.is_dir():
        cloned = subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", REPO_REF, REPO_URL,
                                 str(checkout)], capture_output=True, text=True)
        if cloned.returncode != 0:
            raise RuntimeError(f"setup failed: git clone --branch {REPO_REF} {REPO_URL}\n{cloned.stderr.strip()}")
if checkout is not None and str(checkout) not in sys.path:
    sys.path.insert(0, str(checkout))
from cudagraph_kit.course.setup_notebook import setup_notebook  # noqa: E402
setup_notebook(checkout, REPO_REF, in_colab=IN_COLAB)

# %% tags=["parameters"]
SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)
BATCHES = None        # decode batch sizes timed (None: 1, 4, 16, 64 on a GPU; 1, 4 in SMOKE or on a CPU)
PROMPT_LEN = 16       # prompt tokens per sequence
NEW_TOKENS = None     # tokens generated per sequence in a timed generation (None: 32 on a GPU; 6 small)
DTYPE = "float32"     # model dtype on a GPU ("bfloat16" is what serving uses: see exercise 2); float32 on a CPU
SERVE_STEPS = None    # decode steps of the serving loop (None: 200 on a GPU; 30 small)
SAMPLES = None        # timing rounds per comparison; medians reported (None: 5 on a GPU; 3 small)
COMPILE = True        # torch.compile(mode="reduce-overhead") of the decode step (GPU only)
HF = True             # transformers' generate on the same weights (skipped, with a message, if not installed)
TIME_BUDGET_S = 150   # once the notebook has run this long, variants that still need compiling are skipped (said so)
SEED = 0

# %%
import math
import time
import traceback

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from cudagraph_kit import compare, env_table, gpu_time, has_cuda
from cudagraph_kit.buckets import MemoryLedger, capture_buckets, evaluate_buckets, ladder, plan_buckets
from cudagraph_kit.capture import capture
from cudagraph_kit.course import results
from cudagraph_kit.course.tiny_llm import (StaticKVCache, TinyConfig, TinyLLM, first_divergence, greedy_generate,
                                           greedy_generate_no_cache, hf_generate, to_hf_llama)

STEM = "08_llm_decode"
T_START = time.perf_counter()
CUDA = has_cuda()
DEVICE = "cuda" if CUDA else "cpu"
MiB = 2 ** 20
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
small = SMOKE or not CUDA
BATCHES = BATCHES or ([1, 4] if small else [1, 4, 16, 64])
MAX_BATCH = max(BATCHES)
NEW_TOKENS = NEW_TOKENS or (6 if small else 32)
SERVE_STEPS = SERVE_STEPS or (30 if small else 200)
SAMPLES = SAMPLES or (3 if small else 5)
COMPILE = COMPILE and CUDA
DT = getattr(torch, DTYPE) if CUDA else torch.float32
CFG = (TinyConfig(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, hidden=176) if small
       else TinyConfig(vocab_size=8192, dim=512, layers=4, heads=8, kv_heads=2, hidden=1408))
MAX_GEN = 8 if small else 64          # longest request of the serving loop (tokens)
MAX_LEN = max(PROMPT_LEN + NEW_TOKENS, MAX_GEN + 1)
SYNC = torch.cuda.synchronize if CUDA else (lambda: None)
torch.manual_seed(SEED)
torch.set_grad_enabled(False)   # inference throughout
if not CUDA:
    torch.set_num_threads(1)    # tiny CPU work: one thread is faster than several competing for a small machine

try:
    import transformers
    HF_VERSION = transformers.__version__
except ImportError:
    HF_VERSION = None
HF = HF and HF_VERSION is not None


def elapsed():
    return time.perf_counter() - T_START


def over_budget():
    return elapsed() > TIME_BUDGET_S


print(env_table())
print(f"\nSMOKE={SMOKE}  BATCHES={BATCHES}  PROMPT_LEN={PROMPT_LEN}  NEW_TOKENS={NEW_TOKENS}  dtype={DT}  "
      f"SERVE_STEPS={SERVE_STEPS}  SAMPLES={SAMPLES}  COMPILE={COMPILE}  transformers={HF_VERSION}")
if HF_VERSION is None:
    print(">>> transformers is not installed: its rows are skipped (pip install transformers to add them).")
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run checks the static-cache decoding and the\n"
          ">>> transformers parity on the CPU at small sizes and runs every 'graph' eagerly (labelled 'eager\n"
          ">>> fallback'); it skips torch.compile. CPU timings are not results; the recorded GPU results are shown\n"
          ">>> at the end.")

# %% [markdown]
# ## 1. A small LLaMA-style model and a static KV cache
#
# `cudagraph_kit/course/tiny_llm.py` holds the model (copy it if you like): token embedding; per layer RMSNorm,
# attention with rotary position embeddings and grouped-query attention (8 query heads share 2 key/value heads)
# through `F.scaled_dot_product_attention`, RMSNorm and a SwiGLU MLP; a final norm and the output projection.
# Its weights are random, drawn from a seed on the CPU, so every run and every device starts from the same
# model. The parameter names are those of `transformers`' `LlamaForCausalLM`, which section 5 uses.
#
# The **static KV cache** holds keys and values for `MAX_BATCH` rows of `MAX_LEN` positions, allocated once.
# A decode step takes one token and one position per row, writes that row's key and value at its position
# (`k_cache[rows, :, pos] = k`, an indexed write on the GPU, no host synchronization), and attends over all
# `MAX_LEN` positions with a mask `key position <= pos`. Nothing in it depends on how long a sequence is: its
# shapes depend on the batch size alone.

# %%
model = TinyLLM(CFG, seed=SEED, device=DEVICE, dtype=DT).eval()
cache = StaticKVCache(CFG, max_batch=MAX_BATCH, max_len=MAX_LEN, device=DEVICE, dtype=DT)
n_params = sum(p.numel() for p in model.parameters())
print(f"model: {CFG}\n{n_params / 1e6:.1f} M parameters ({n_params * model.lm_head.weight.element_size() / MiB:.0f} "
      f"MiB); static cache {MAX_BATCH} rows x {MAX_LEN} positions: {cache.nbytes / MiB:.1f} MiB")
gen = torch.Generator().manual_seed(SEED + 1)
prompts = {b: torch.randint(0, CFG.vocab_size, (b, PROMPT_LEN), generator=gen).to(DEVICE) for b in BATCHES}


def decode_step(tokens, pos):
    """One decode step on the shared static cache: row i of the batch is cache row i."""
    return model.decode(tokens, pos, cache)

# %% [markdown]
# ## 2. Correct before fast: the static cache against no cache at all
#
# The reference decodes without any cache: for every new token it recomputes the whole sequence from the prompt.
# Greedy decoding with the static cache (prefill the prompt, then one decode step per token) must pick the same
# tokens, with logits equal up to rounding.

# %%
reference, ref_logits, parity = {}, {}, {}
for b in BATCHES:
    ref_l, cached_l = [], []
    reference[b] = greedy_generate_no_cache(model, prompts[b], NEW_TOKENS, logits_out=ref_l)
    cached = greedy_generate(model, cache, prompts[b], NEW_TOKENS, logits_out=cached_l)
    ref_logits[b] = ref_l
    diff = max((a - r).abs().max().item() for a, r in zip(cached_l, ref_l))
    scale = max(r.abs().max().item() for r in ref_l)
    d = first_divergence(cached, reference[b], cached_l, ref_l)
    print(f"batch {b:3d}: static cache == no cache: {d['equal']}  (max |logit diff| {diff:.1e}, logits up to "
          f"{scale:.2f})")
    parity[b] = {"tokens_equal": d["equal"], "max_logit_diff": diff, "first_step": d["first_step"],
                 "margin": d["margin"], "logit_diff": d["logit_diff"]}
    assert d["equal"] or d["logit_diff"] >= d["margin"], f"the static cache decodes differently: {d}"
nocache_parity = {"tokens_equal": all(p["tokens_equal"] for p in parity.values()), "per_batch": parity}
print("static-cache greedy tokens identical to the no-cache reference for every batch:", nocache_parity["tokens_equal"])

# %% [markdown]
# ## 3. Decoding is host-bound
#
# One decode step launches a fixed number of kernels whatever the batch size. The profiler counts them (GPU
# only); the CPU's time to launch them, a few microseconds each, is the time per token of eager decoding as
# long as the GPU finishes each kernel sooner.

# %%
step_inputs = {b: (torch.randint(0, CFG.vocab_size, (b,), generator=gen).to(DEVICE),
                   torch.full((b,), PROMPT_LEN, dtype=torch.long, device=DEVICE)) for b in BATCHES}
eager_profile = gpu_time(decode_step, *step_inputs[BATCHES[0]], calls=5) if CUDA else None
if eager_profile is not None:
    print(f"one eager decode step at batch {BATCHES[0]}: {eager_profile.kernels:.0f} kernels and "
          f"{eager_profile.copies:.0f} copies/fills launched one by one; top kernels by GPU time: "
          + ", ".join(f"{name[:40]} {us:.1f} µs" for name, us in eager_profile.top[:3]))
else:
    print("kernel counts need a GPU (torch.profiler's CUDA activity); see the recorded results at the end.")

# %% [markdown]
# ## 4. One graph per batch bucket, in one shared pool
#
# `capture_buckets(decode_step, tokens, pos, sizes=...)` captures the decode step once per bucket size, largest
# first, all in one memory pool (the kit's default). A call copies the tokens and positions into static buffers,
# pads them up to the bucket (token 0 at position 0: the padding rows write into cache rows no sequence is using),
# replays, and returns the real rows' logits. The cache itself is outside the graphs: they read and write it in
# place, which is why it must never be reallocated.
#
# The bucket sizes here are `ladder(MAX_BATCH)`: 1, 2, 4, then steps of 8, the pattern vLLM captures by default.
# The capture log gives each bucket's capture time and how much the shared pool grew for it; the ledger gives the
# memory the graphs hold in all.
#
# **One pitfall first.** A matrix multiply on the GPU uses cuBLAS, and cuBLAS a *workspace*: scratch memory that
# PyTorch allocates once per stream and keeps. A graph captured after that workspace exists bakes its address in.
# `torch.compile(mode="reduce-overhead")` (section 5) frees those workspaces every time it warms up or records a
# graph, so that its own graphs get one in their own pool (PyTorch's `torch/_inductor/cudagraph_trees.py`,
# `clear_cublass_cache`, says why). A graph captured earlier, by hand or by the kit, then writes into memory that now
# belongs to other tensors: silent corruption, or an illegal memory access later. Any process that mixes its own
# graphs with `reduce-overhead` (or with `transformers`' compiled `generate`, which uses it) needs the same
# precaution: `graph_step` below frees the workspaces at the start of a capture, so the capture allocates a new
# one inside the graph's own pool, where nothing else can take it.

# %%
CLEAR_CUBLAS = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)   # what Inductor's graph trees call


def graph_step(tokens, pos):
    """decode_step, for capturing: a capture starts with a fresh cuBLAS workspace, which lands in the graph's pool."""
    if CUDA and CLEAR_CUBLAS is not None and torch.cuda.is_current_stream_capturing():
        CLEAR_CUBLAS()
    return decode_step(tokens, pos)


ledger = MemoryLedger()
LADDER = ladder(MAX_BATCH)
sample_tokens = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
sample_pos = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
with ledger.measure("kit buckets") as kit_mem:
    graphs = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=LADDER, eager_fallback=True)
kit_held = ledger.record("kit buckets", graphs).get("held", float("nan")) / MiB
print(graphs)
capture_rows = [{"case": "capture", "variant": f"kit bucket {e['size']}", "median_us": float("nan"),
                 "speedup": float("nan"), "batch": e["size"], "setup_s": e["seconds"],
                 "pool_growth_mib": e["pool_growth_bytes"] / MiB} for e in sorted(graphs.capture_log, key=lambda e: e["size"])]
if CUDA:
    print(pd.DataFrame(capture_rows)[["batch", "setup_s", "pool_growth_mib"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"{len(LADDER)} graphs captured in {graphs.capture_seconds:.2f} s; they hold {kit_held:.1f} MiB (shared pool "
          f"+ static buffers); the largest bucket, captured first, took most of the pool, the others reused it.")
else:
    print("no CUDA: nothing captured; every bucket runs eagerly, padded and sliced exactly as the graphs would.")

# a padded request: 3 rows served by the 4-row bucket give the same logits as eager
t3, p3 = step_inputs[max(BATCHES)][0][:3], step_inputs[max(BATCHES)][1][:3]
padded_err = (graphs(t3, p3).float() - decode_step(t3, p3).float()).abs().max().item()
print(f"3 rows padded to bucket {graphs.bucket_for(3)}: max |bucketed - eager| logits {padded_err:.1e}")
assert padded_err < 1e-3

# %% [markdown]
# ## 5. What people use today: `reduce-overhead` and `transformers`' static cache
#
# - **`torch.compile(mode="reduce-overhead")`** of the same decode step: Inductor fuses the small kernels and
#   records a CUDA graph per batch size it meets (CUDA graph trees). The cache buffers are marked as static
#   addresses (`torch._dynamo.mark_static_address`), as `transformers` does, so the graphs may write them in
#   place. A batch size it has not seen costs a compile (the first two) or a recording.
# - **`transformers`' `generate`** on a `LlamaForCausalLM` built from the same configuration, with a copy of
#   the same weights: `cache_implementation="static"` makes it allocate a static cache, and on a GPU its
#   `generate` then compiles the decoding forward with `torch.compile(mode="reduce-overhead")` by itself. Its
#   default dynamic cache (eager) is timed as well. Its prefill and ours both run eagerly.
#
# Each variant is tried on its own; one that fails becomes a row with its error, and the others go on.

# %%
variant_errors = {}


def attempt(label, fn):
    """Run fn(); on an exception keep the error for the tables and return None."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure of one variant is reported, the notebook goes on
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        variant_errors[label] = message
        print(f"{label}: failed, {message}\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)[-6:-1]))
        return None


compiled_step = None
compile_setup = {}
if COMPILE:
    def build_compiled():
        for buf in (cache.k, cache.v):
            if hasattr(torch._dynamo, "mark_static_address"):
                torch._dynamo.mark_static_address(buf)
        fn = torch.compile(decode_step, mode="reduce-overhead")
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)

        def step(tokens, pos):
            mark()                      # a new decode step: the previous step's outputs may be overwritten
            return fn(tokens, pos)
        return step
    compiled_step = attempt("reduce-overhead", build_compiled)
else:
    print("reduce-overhead: skipped (" + ("needs a CUDA GPU)" if not CUDA else "COMPILE=False)"))

hf_model = None
if HF:
    hf_model = attempt("transformers", lambda: to_hf_llama(model, max_position_embeddings=max(4096, MAX_LEN)))
    if hf_model is not None:
        x = prompts[BATCHES[-1]]
        hf_diff = (hf_model(x).logits.float() - model(x).float()).abs().max().item()
        print(f"transformers {HF_VERSION}: LlamaForCausalLM with our weights; max |logit diff| on the prompts "
              f"{hf_diff:.1e}")
else:
    print("transformers: skipped (" + ("not installed)" if HF_VERSION is None else "HF=False)"))


def gen_kit(b):
    return greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=graphs)


VARIANTS = {   # label -> generate(b) -> tokens (b, NEW_TOKENS); every one on the same model, weights, prompts
    "eager": lambda b: greedy_generate(model, cache, prompts[b], NEW_TOKENS),
    "kit graphs per bucket": gen_kit,
}
if compiled_step is not None:
    VARIANTS["reduce-overhead"] = lambda b: greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=compiled_step)
if hf_model is not None:
    VARIANTS["transformers generate, static cache" + (" (compiled)" if CUDA else "")] = \
        lambda b: hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation="static")
    VARIANTS["transformers generate, dynamic cache"] = \
        lambda b: hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation=None)
NEEDS_COMPILE = {v for v in VARIANTS if v.startswith("reduce-overhead") or "(compiled)" in v}
print("variants:", list(VARIANTS))

# %% [markdown]
# ## 6. Correctness of every variant, against eager
#
# Each variant generates `NEW_TOKENS` greedy tokens for the same prompts at every batch size; its first call at a
# new batch size also pays for its compile or recording (timed here as setup). Identical tokens are the test.
# Where a variant's tokens differ, the table shows where they first differ, eager's gap between its two best
# logits there (`margin`) and how far the variant's logits were from eager's (`logit_diff`): a difference at a
# near tie (`logit_diff >= margin`) is rounding (other kernels sum in another order), after which the two
# continuations are different texts; anything else is a bug.

# %%
def logits_of(label, b):
    out = []
    if label.startswith("transformers"):
        impl = "static" if "static" in label else None
        tokens = hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation=impl, logits_out=out)
    else:
        step = {"eager": None, "reduce-overhead": compiled_step}.get(label, graphs)
        tokens = greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=step, logits_out=out)
    return tokens, out


check_rows, setup = [], {}
eager_ref = {b: logits_of("eager", b) for b in BATCHES}
for label in VARIANTS:
    for b in BATCHES:
        if label in variant_errors:
            break
        if label in NEEDS_COMPILE and over_budget():
            variant_errors[label] = (f"skipped: the notebook had run {elapsed():.0f} s (TIME_BUDGET_S="
                                     f"{TIME_BUDGET_S}) before its compile at batch {b}")
            print(f"{label}: {variant_errors[label]}")
            break
        t0 = time.perf_counter()
        got = attempt(label, lambda: logits_of(label, b))
        SYNC()
        if got is None:
            break
        setup[(label, b)] = time.perf_counter() - t0
        tokens, lg = got
        d = first_divergence(tokens, eager_ref[b][0], lg, eager_ref[b][1])
        check_rows.append({"variant": label, "batch": b,
                           "tokens_equal": d["equal"], "rows_differing": d["rows_differing"],
                           "first_step": d["first_step"], "margin": d["margin"], "logit_diff": d["logit_diff"],
                           "near_tie": (not d["equal"]) and d["logit_diff"] >= d["margin"],
                           "max_logit_diff": max((a - r).abs().max().item() for a, r in zip(lg, eager_ref[b][1])),
                           "first_call_s": setup[(label, b)]})
checks = pd.DataFrame(check_rows)
print(checks.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
unexplained = checks[~checks.tokens_equal & ~checks.near_tie]
if len(unexplained):
    print("\n>>> NOT a near tie: these variants decode differently from eager; their timings below are not comparable:")
    print(unexplained[["variant", "batch", "first_step", "margin", "logit_diff"]].to_string(index=False))
else:
    print("\nevery variant gives eager's greedy tokens" + (" (differences only at near ties, as shown)"
                                                          if (~checks.tokens_equal).any() else ""))
for v in variant_errors:
    print(f"{v}: {variant_errors[v]}")

# %% [markdown]
# ## 7. Time per decode step, and the floor
#
# The decode step alone at each batch size, on the same tokens and positions: eager; the kit's graph for that
# bucket (copy the inputs in, replay, slice the logits); the compiled step. All take turns in one `compare`
# window, speedups are medians of per-round ratios. The **floor** is the GPU-busy time of one replay of the kit's
# graph (`gpu_time`): how fast a decode step could go if the host cost nothing. Each step makes one token per
# sequence, so the time per step is the time per token each sequence sees, and `batch / step time` is tokens
# per second.

# %%
def safe_compare(runners, case, floor=True, **kw):
    """compare(), and if the profiler part fails, again without the floors; None if even that fails."""
    for floor in ((CUDA, False) if CUDA and floor else (False,)):
        try:
            df = compare(runners, case=case, samples=SAMPLES, floor=floor, **kw)
            print(f"[{case}: timed at {elapsed():.0f} s since the start]")
            return df
        except Exception as exc:  # noqa: BLE001
            print(f"{case}: compare(floor={floor}) failed: {type(exc).__name__}: {exc}\n"
                  + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)[-6:-1]))
    return None


ok_variants = [v for v in VARIANTS if v not in variant_errors]
ok_in_check = set(checks.variant) if len(checks) else set()
step_tables, floors = [], {}
for b in BATCHES:
    t, p = step_inputs[b]
    runners = {"eager": lambda t=t, p=p: decode_step(t, p),
               "kit graph (bucket)": lambda t=t, p=p: graphs(t, p)}
    if "reduce-overhead" in ok_variants and ("reduce-overhead", b) in setup:
        runners["reduce-overhead"] = lambda t=t, p=p: compiled_step(t, p)
    df = safe_compare(runners, f"decode step, batch {b}")
    if df is None:
        continue
    df["batch"] = b
    if CUDA and b in graphs.graphs:
        g = attempt(f"floor, batch {b}", lambda: gpu_time(graphs.graphs[b].replay, calls=20))
        floors[b] = g.busy_us if g is not None else float("nan")
    else:
        floors[b] = float("nan")
    df["floor_step_us"] = floors[b]
    df["us_per_step"] = df.median_us
    df["tokens_per_s"] = b / (df.median_us * 1e-6)
    step_tables.append(df)
    print(df[["case", "variant", "executed_as", "median_us", "speedup", "kernels_per_call", "floor_step_us",
              "tokens_per_s"]].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
step_df = pd.concat(step_tables, ignore_index=True) if step_tables else pd.DataFrame()

# %% [markdown]
# ## 8. Whole generations, side by side
#
# Now whole greedy generations (prefill + `NEW_TOKENS` tokens) of every variant, `transformers`' included, all
# taking turns in one window per batch size. Time per token is the generation's time divided by `NEW_TOKENS`;
# tokens per second count every sequence of the batch.

# %%
gen_tables, gen_executed_as = [], {}
for b in BATCHES:
    runners = {v: (lambda v=v, b=b: VARIANTS[v](b)) for v in VARIANTS
               if v not in variant_errors and (v, b) in setup}
    df = safe_compare(runners, f"generate, batch {b}", floor=False, calls=1)
    if df is None:
        continue
    if CUDA and not gen_executed_as:
        # after the timings: the profiler says whether each variant replays graphs, from one generation at the
        # smallest batch (traces of whole generations take a while to read; a variant runs alike at every size)
        for v in runners:
            g = attempt(f"profile {v}", lambda v=v: gpu_time(lambda: VARIANTS[v](b), calls=1, warmup=0))
            gen_executed_as[v] = "unknown" if g is None else ("cuda graph" if g.graph_launches > 0 else "eager")
    if CUDA:
        df["executed_as"] = df.variant.map(gen_executed_as).fillna("unknown")
    df["batch"] = b
    df["us_per_token"] = df.median_us / NEW_TOKENS
    df["tokens_per_s"] = b * NEW_TOKENS / (df.median_us * 1e-6)
    df["first_call_s"] = [setup.get((v.replace(" (eager fallback)", ""), b), float("nan")) for v in df.variant]
    gen_tables.append(df)
    print(df[["case", "variant", "executed_as", "us_per_token", "speedup", "tokens_per_s", "first_call_s"]]
          .to_string(index=False, float_format=lambda v: f"{v:.1f}"))
gen_df = pd.concat(gen_tables, ignore_index=True) if gen_tables else pd.DataFrame()
error_rows = [{"case": "errors", "variant": v, "median_us": float("nan"), "speedup": float("nan"), "error": e}
              for v, e in variant_errors.items()]
if error_rows:
    print(pd.DataFrame(error_rows)[["variant", "error"]].to_string(index=False))

# %% [markdown]
# ## 9. Prefill gains little from a graph
#
# Prefill runs the whole prompt at once: the same number of kernels as a decode step, each with `batch x
# prompt` rows of work. One measured point: the largest batch with a prompt of 8 times `PROMPT_LEN`, eager
# against a graph of the prefill (`capture`, same cache).

# %%
PREFILL_LEN = min(8 * PROMPT_LEN, MAX_LEN)
long_prompt = torch.randint(0, CFG.vocab_size, (MAX_BATCH, PREFILL_LEN), generator=gen).to(DEVICE)
prefill_df = None
def prefill_for_capture(x):
    if CUDA and CLEAR_CUBLAS is not None and torch.cuda.is_current_stream_capturing():
        CLEAR_CUBLAS()                  # the workspace in the graph's own pool, as in section 4
    return model.prefill(x, cache)


prefill_graph = attempt("prefill graph", lambda: capture(prefill_for_capture, long_prompt, eager_fallback=True))
if prefill_graph is not None:
    err = (prefill_graph(long_prompt).float() - model.prefill(long_prompt, cache).float()).abs().max().item()
    print(f"prefill graph == eager: max |logit diff| {err:.1e}")
    prefill_df = safe_compare({"eager": lambda: model.prefill(long_prompt, cache),
                               "graph": lambda: prefill_graph(long_prompt)},
                              f"prefill, {MAX_BATCH} x {PREFILL_LEN} tokens")
    if prefill_df is not None:
        prefill_df["batch"] = MAX_BATCH
        print(prefill_df[["case", "variant", "executed_as", "median_us", "speedup", "floor_us"]]
              .to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    del prefill_graph

# %% [markdown]
# ## 10. A serving loop: the batch size changes every step
#
# Requests arrive at random (a seeded stream), each with a one-token prompt and a length drawn between 1 and
# `MAX_GEN` tokens; at most `MAX_BATCH` are decoded together, the rest wait. Every step decodes one token for
# every active request, so the batch size moves at every arrival and every finish. A finished request leaves a
# hole: the last row moves into it (its cache row too), so active requests always fill rows `0..n-1` and a
# bucket's padding rows are free rows. Tokens and positions stay on the GPU; the host only counts.
#
# Strategies: eager; the kit's graphs on the vLLM-style ladder (`ladder(MAX_BATCH)`, the same graphs as above);
# buckets **planned** by `plan_buckets` from the batch sizes of an earlier stream (another seed), with at most
# as many graphs as the ladder; and one graph per batch size. The planner minimises padded rows here; on a GPU
# a decode step's time hardly grows with the batch, so expect little between the bucket strategies and a lot
# between them and eager.

# %%
def make_stream(seed, steps):
    """Per step: the requests arriving (their lengths); a deterministic host-side schedule."""
    g = torch.Generator().manual_seed(seed)
    rate = MAX_BATCH / (MAX_GEN / 2) * 0.8               # arrivals per step that keep the batch near 80% full
    arrivals = torch.poisson(torch.full((steps,), rate), generator=g).long().tolist()
    lengths = iter((1 + (torch.rand(sum(arrivals) + 1, generator=g) * MAX_GEN).long()).tolist())
    return [[next(lengths) for _ in range(k)] for k in arrivals]


def batch_sizes(stream):
    """The batch size of every step of a stream (the same for every strategy: it depends on the schedule alone)."""
    sizes, active, queue = [], [], []
    for arriving in stream:
        queue += arriving
        while queue and len(active) < MAX_BATCH:
            active.append(queue.pop(0))
        if active:
            sizes.append(len(active))
        active = [r - 1 for r in active if r > 1]
    return sizes


def serve(step, stream, record=None):
    """Run a stream through ``step(tokens, pos)``; with ``record`` (a dict) keep each request's tokens."""
    tokens = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
    pos = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
    active, queue, next_id, log = [], [], 0, []      # active: [request id, tokens left], row i = active[i]
    for arriving in stream:
        for length in arriving:
            queue.append((next_id, length))
            next_id += 1
        while queue and len(active) < MAX_BATCH:
            rid, length = queue.pop(0)
            r = len(active)
            tokens[r] = 1 + rid % (CFG.vocab_size - 1)   # its one-token prompt
            pos[r] = 0
            active.append([rid, length])
        n = len(active)
        if n == 0:
            continue
        nxt = step(tokens[:n], pos[:n]).argmax(-1)
        tokens[:n] = nxt
        pos[:n] += 1
        if record is not None:
            log.append((nxt, [a[0] for a in active]))
        done = []
        for i, a in enumerate(active):
            a[1] -= 1
            if a[1] == 0:
                done.append(i)
        for i in reversed(done):                         # fill each hole with the last row
            last = len(active) - 1
            if i != last:
                cache.move_row(last, i)
                tokens[i] = tokens[last]
                pos[i] = pos[last]
                active[i] = active[last]
            active.pop()
    if record is not None:
        for nxt, ids in log:
            for rid, t in zip(ids, nxt.tolist()):
                record.setdefault(rid, []).append(t)
    return log


stream = make_stream(SEED + 10, SERVE_STEPS)
history = batch_sizes(make_stream(SEED + 11, 4 * SERVE_STEPS))    # an earlier day's traffic, for the planner
observed = batch_sizes(stream)
plan = plan_buckets(history, max_graphs=len(LADDER), max_size=MAX_BATCH)
print(f"stream: {len(observed)} decode steps, batch size median {np.median(observed):.0f}, range "
      f"{min(observed)}..{max(observed)}, {len(set(observed))} distinct sizes")
print(f"vLLM-style ladder ({len(LADDER)} graphs): {LADDER}")
print(f"planned from the history ({plan.n_graphs} graphs): {plan.sizes}")
for name, sizes in (("ladder", LADDER), ("planned", plan.sizes)):
    ev = evaluate_buckets(observed, sizes)
    print(f"    {name:8s} on this stream: {ev['pad_fraction']:.1%} of the computed rows are padding")

# %%
strategies = {"eager": decode_step, "graphs, vLLM-style ladder": graphs}
serve_info = {"eager": {"graphs": 0, "setup_s": 0.0, "held_mib": 0.0, "bucket_sizes": ""},
              "graphs, vLLM-style ladder": {"graphs": len(LADDER), "setup_s": graphs.capture_seconds, "held_mib": kit_held,
                                    "bucket_sizes": " ".join(map(str, LADDER))}}
for name, sizes in (("graphs, planned buckets", plan.sizes), ("graphs, one per batch size", list(range(1, MAX_BATCH + 1)))):
    with ledger.measure(name):
        bg = attempt(name, lambda sizes=sizes: capture_buckets(graph_step, sample_tokens, sample_pos, sizes=sizes,
                                                               eager_fallback=True))
    if bg is None:
        continue
    strategies[name] = bg
    serve_info[name] = {"graphs": len(sizes), "setup_s": bg.capture_seconds, "bucket_sizes": " ".join(map(str, sizes)),
                        "held_mib": ledger.record(name, bg).get("held", float("nan")) / MiB}

served = {}
for name, step in strategies.items():
    served[name] = {}
    attempt(f"serving loop, {name}", lambda step=step, name=name: serve(step, stream, record=served[name]))
ref_tokens = served["eager"]
serve_checks = {}
for name in strategies:
    same = sum(served[name].get(rid) == toks for rid, toks in ref_tokens.items())
    serve_checks[name] = same / max(1, len(ref_tokens))
    print(f"{name}: {same} of {len(ref_tokens)} requests decoded exactly as eager")
for s in strategies.values():
    if hasattr(s, "reset_stats"):
        s.reset_stats()
serve_df = safe_compare({name: (lambda step=step: serve(step, stream)) for name, step in strategies.items()},
                        "serving loop", floor=False, calls=1)
if serve_df is not None:
    steps = len(observed)
    # what ran: the eager step, or BucketedGraphs whose mode says whether they hold captured graphs
    serve_df["executed_as"] = [("cuda graph" if getattr(s, "mode", None) == "graph" else "eager")
                               for s in strategies.values()]
    serve_df["us_per_step"] = serve_df.median_us / steps
    serve_df["tokens_per_s"] = sum(observed) / (serve_df.median_us * 1e-6)
    serve_df["same_tokens_as_eager"] = [serve_checks.get(v.replace(" (eager fallback)", ""), float("nan"))
                                        for v in serve_df.variant]
    for col in ("graphs", "setup_s", "held_mib", "bucket_sizes"):
        serve_df[col] = [serve_info.get(v.replace(" (eager fallback)", ""), {}).get(col) for v in serve_df.variant]
    serve_df["pad_fraction"] = [evaluate_buckets(observed, [int(x) for x in s.split()])["pad_fraction"] if s else 0.0
                                for s in serve_df.bucket_sizes.fillna("")]
    print(serve_df[["variant", "executed_as", "us_per_step", "speedup", "tokens_per_s", "graphs", "setup_s",
                    "held_mib", "pad_fraction", "same_tokens_as_eager"]].to_string(index=False,
                                                                                 float_format=lambda v: f"{v:.3g}"))

# %% [markdown]
# ## 11. The picture
#
# Left: time per decode step against the batch size, with the floor. Middle: tokens per second of whole
# generations, every variant. Right: the serving loop, time per step of each strategy, with its number of graphs.

# %%
def plot(step_df, gen_df, serve_df):
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8))
    ax = axes[0]
    if len(step_df):
        for v, d in step_df.groupby("variant", sort=False):
            ax.plot(d.batch, d.us_per_step, "o-", label=f"{v} ({d.executed_as.iloc[0]})")
        f = step_df.drop_duplicates("batch")
        if f.floor_step_us.notna().any():
            ax.plot(f.batch, f.floor_step_us, "k--", label="floor (GPU busy, kit graph)")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per decode step (= per token of a sequence)",
           title="decode step")
    ax.legend(fontsize=7)
    ax = axes[1]
    if len(gen_df):
        for v, d in gen_df.groupby("variant", sort=False):
            ax.plot(d.batch, d.tokens_per_s, "o-", label=v)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens / s (whole generation)",
           title=f"generate {NEW_TOKENS} tokens after a {PROMPT_LEN}-token prompt")
    ax.legend(fontsize=7)
    ax = axes[2]
    if serve_df is not None and len(serve_df):
        y = np.arange(len(serve_df))
        ax.barh(y, serve_df.us_per_step, color="C0")
        ax.set_yticks(y, [f"{v} ({0 if g != g or g is None else int(g)} graphs)" for v, g in
                          zip(serve_df.variant, serve_df.graphs)], fontsize=7)
        for yi, (t, s) in enumerate(zip(serve_df.us_per_step, serve_df.speedup)):
            ax.text(t, yi, f" {t:.0f} µs, {s:.2f}x", va="center", fontsize=7)
    ax.set(xlabel="µs per decode step (median pass / steps)", title="serving loop, batch size changing every step")
    where = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only: not a GPU result)"
    fig.suptitle(f"LLM decoding with a static KV cache: {where}, PyTorch {torch.__version__}, {DT}", fontsize=11)
    fig.tight_layout()
    return fig


fig = plot(step_df, gen_df, serve_df)
plt.show()

# %% [markdown]
# ## 12. Save the results
#
# One row per (case, variant) of the step, generation, prefill and serving comparisons, the correctness checks
# (`case` "correctness"), the capture log (`case` "capture") and the variants that failed (`case` "errors"), with
# the machine in `env.json`. A run without CUDA writes to `build/figures/` instead.

# %%
device_name = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
check_out = checks.assign(case="correctness", median_us=float("nan"), speedup=float("nan")) if len(checks) else None
frames = [f for f in (step_df, gen_df, prefill_df, serve_df, pd.DataFrame(capture_rows), check_out,
                      pd.DataFrame(error_rows)) if f is not None and len(f)]
all_rows = pd.concat(frames, ignore_index=True)
all_rows["device"] = device_name
extra = {"config": vars(CFG), "dtype": str(DT), "batches": BATCHES, "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
         "serve_steps": SERVE_STEPS, "max_batch": MAX_BATCH, "seed": SEED, "transformers": HF_VERSION,
         "nocache_parity": nocache_parity, "hf_logit_diff": hf_diff if hf_model is not None else None,
         "planned_buckets": plan.sizes, "ladder": LADDER, "variant_errors": variant_errors,
         "eager_kernels_per_step": eager_profile.kernels if eager_profile is not None else None,
         "seconds": round(elapsed(), 1)}
folder = results.save(STEM, all_rows, figures={"decode": fig}, extra_env=extra)
print("saved to", folder, f"({elapsed():.0f} s since the start)")

# %% [markdown]
# ## 13. Recorded GPU results
# The table and figure of the last GPU run committed to this repository (what a reader without a GPU sees).

# %%
recorded = results.show_recorded(STEM, columns=["case", "variant", "executed_as", "batch", "median_us", "speedup",
                                                 "us_per_token", "us_per_step", "tokens_per_s", "floor_step_us",
                                                 "first_call_s", "graphs", "held_mib", "error"])

# %% [markdown]
# ## Summary
#
# - Decoding runs the whole model for one token per sequence: the same few hundred kernels whatever the batch,
#   each tiny. Eager, the host's launches set the time per token; the floor (section 7) shows what the GPU itself
#   needs.
# - A **static KV cache** (allocated once, per-row positions, a mask over all positions) fixes every shape, so a
#   decode step can be captured. Check it before anything else: the same greedy tokens as decoding with no cache.
# - The kit's `capture_buckets` captures the step once per batch bucket in one shared pool; padding rows land in
#   unused cache rows, so a bucket serves every smaller batch. Capture takes seconds, not a compile.
# - `torch.compile(mode="reduce-overhead")` and `transformers`' static-cache `generate` do the same for you, and
#   Inductor also fuses kernels (a lower floor), at the price of compiling and one recording per new batch size.
# - Prefill is GPU-bound (many rows per kernel): a graph buys it little.
# - In a serving loop the batch size changes at every step; a handful of buckets serves them all. Plan them
#   from the sizes you observe, and measure: here a step's GPU time hardly depends on the batch size, so
#   padding is cheap and the number of graphs matters more than their placement.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say so
# (⏸); on a CPU the buckets run eagerly, padding and slicing exactly as graphs do.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb08_llm_decode.py` (try
# first).

# %%
from cudagraph_kit.course.exercises import TIE_WHY, check_decode_buckets, check_low_precision_ties

# %% [markdown]
# ### Exercise 1: buckets for the serving loop, and what a padding row costs
# Plan at most 4 buckets for the serving loop's history (`plan_buckets(history, max_graphs=4,
# max_size=MAX_BATCH)`), capture them (`capture_buckets(graph_step, sample_tokens, sample_pos, sizes=...,
# eager_fallback=True)`), and run the stream through them with `serve(..., record=...)`. Do the requests decode
# exactly as eager (`served["eager"]`)? Then give `pad_fraction`, the share of the computed rows that are padding
# on this stream (`evaluate_buckets`).

# %%
few_buckets = ...     # plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)
serve_few = ...       # capture_buckets(graph_step, sample_tokens, sample_pos, sizes=few_buckets.sizes, eager_fallback=True)
few_tokens = ...      # {request id: tokens}: the record of serve(serve_few, stream, record=...)
pad_fraction = ...    # evaluate_buckets(observed, few_buckets.sizes)["pad_fraction"]

# %%
check_decode_buckets(few_buckets, serve_few, few_tokens, pad_fraction, history=history, observed=observed,
                     max_batch=MAX_BATCH, eager_tokens=served["eager"])

# %% [markdown]
# ### Exercise 2: bfloat16 and near ties
# Serving runs in bfloat16. Build the same model in bfloat16 (`TinyLLM(CFG, seed=SEED, device=DEVICE,
# dtype=torch.bfloat16)`, with a `StaticKVCache` of the same dtype), decode the largest batch's prompts greedily
# with the static cache and without a cache (`greedy_generate(..., logits_out=...)`,
# `greedy_generate_no_cache(..., logits_out=...)`), and compare the tokens with `first_divergence`. If they
# differ, why? Pick one of the options printed below.

# %%
bf16_tokens = ...        # greedy_generate on the bfloat16 model, static cache
bf16_reference = ...     # greedy_generate_no_cache on the bfloat16 model
bf16_divergence = ...    # first_divergence(bf16_tokens, bf16_reference, its logits, the reference's logits)
tie_why = ...            # "a", "b" or "c"
print("\n".join(f"{key}) {text}" for key, text in TIE_WHY.items()))

# %%
check_low_precision_ties(bf16_tokens, bf16_reference, bf16_divergence, tie_why, prompt=prompts[MAX_BATCH],
                         cfg=CFG, seed=SEED, new_tokens=NEW_TOKENS)
