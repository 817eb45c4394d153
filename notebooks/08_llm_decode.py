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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/08_llm_decode.ipynb)
#
# A language model generates text one token at a time. Each new token runs the whole model on one position per
# sequence: many small kernels (section 3 counts them), each launched from Python, for very little GPU work. For a
# small model that can make decoding **host-bound**: the GPU waits for the CPU to launch the next kernel (section 7
# prints whether it is, here). A CUDA graph removes those launches, but it replays fixed shapes, and a cache that
# grows by one position per token changes shape at every step. A **static KV cache**, allocated once for a maximum
# length and masked, keeps every shape fixed; then one graph per batch size replays every decode step.
# `torch.compile(mode="reduce-overhead")` and Hugging Face's `generate` with a static cache do this for you. Serving
# engines share two of its ideas: decode graphs captured up front for a fixed list of batch sizes, a batch padded up
# to the next one, and one memory pool for all of them (vLLM's `cudagraph_capture_sizes` and its graph manager's one
# `graph_pool_handle()`; SGLang's `--cuda-graph-max-bs`). Their cache differs: vLLM keeps keys and values in a pool
# of fixed-size blocks shared by all sequences, each sequence with a table of its blocks that the attention kernel
# reads (PagedAttention), not a maximum-length cache per sequence as here; and it can capture a model piecewise,
# leaving attention outside the graphs (vLLM's "CUDA Graphs" design document).
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
# - What a graph buys prefill (the prompt) next to a decode step, and why the two differ.
# - That fusion and graphs are separate tools: a graph removes launches, fusion removes kernels, and
#   `torch.compile` without its graphs, captured by the kit, combines both (section 11).
# - How to put several tokens in one replay: K decode steps per graph, the stop token handled on the GPU
#   (section 12).
# - How to graph your own `transformers` model's decode step with a `StaticCache`, and the cache's write-position
#   trap (section 13).
# - How to state a speedup so that a rerun agrees: timing windows, a prediction interval, and a verdict ("holds",
#   "fails", or "no clear difference") for every comparison the notebook makes, saved in `claims.csv`.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU); `transformers` for its row
# (the notebook says so and skips it when it is missing). Without a GPU the notebook runs its CPU part small (the
# correctness checks, everything eager, labelled so) and shows the recorded GPU results.
#
# **How long**: 3.0 min on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25; the first calls of the compiled
# variants took a good part of it: section 6's `first_call_s` column and section 11's setup table give the times); a
# T4 has not been timed yet; under a minute on a CPU (small sizes).

# %%
# Setup: use the kit of this checkout; in Colab first make a shallow clone of the branch REPO_REF (the kit and
# its recorded GPU results). cudagraph_kit.course.setup_notebook then checks PyTorch and, in Colab, installs it.
import os, subprocess, sys
from pathlib import Path

REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")
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
            err = cloned.stderr.strip()
            why = (f"the repository has no branch or tag {REPO_REF!r}: open the notebook from the README's Colab "
                   'badge (it names a ref the repository holds) or write REPO_REF = "main" in this cell'
                   if "not found" in err else "the runtime could not reach the repository: check that it has "
                   "internet access")
            raise RuntimeError(f"setup failed: git clone --branch {REPO_REF} {REPO_URL}\n{err}\n"
                               f"Why and what to do: {why}; then run this cell again.")
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
SAMPLES = None        # timing rounds per comparison in each window; medians reported (None: 2)
WINDOWS = 3           # timing windows of every comparison, spread in time: speedup intervals come from them
WINDOW_PAUSE_S = 1.0  # the windows of one comparison start at least this many seconds apart
COMPILE = True        # torch.compile(mode="reduce-overhead") of the decode step (GPU only)
HF = True             # transformers' generate on the same weights (skipped, with a message, if not installed)
TIME_BUDGET_S = 300   # once the notebook has run this long, variants that still need compiling are skipped (said so)
K_STEPS = (1, 2, 4, 8)  # decode steps per graph replay (section 12)
SEED = 0

# %%
import math
import time
import traceback
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from cudagraph_kit import combine_windows, compare, env_table, gpu_time, has_cuda
from cudagraph_kit.buckets import MemoryLedger, capture_buckets, evaluate_buckets, ladder, plan_buckets
from cudagraph_kit.capture import capture
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import Claim, save_claims
from cudagraph_kit.course.decode import (decode_state, generate_blocks, k_step, load_state, mid_block_stop,
                                        positions_needed, stop_after)
from cudagraph_kit.course.hf_decode import StaticDecoder, hf_status
from cudagraph_kit.course.tiny_llm import (StaticKVCache, TinyConfig, TinyLLM, first_divergence, greedy_generate,
                                           greedy_generate_no_cache, hf_generate, to_hf_llama)
from cudagraph_kit.intervals import prediction_interval, ratio_across_windows

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
SAMPLES = SAMPLES or 2
if small:
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
COMPILE = COMPILE and CUDA
DT = getattr(torch, DTYPE) if CUDA else torch.float32
CFG = (TinyConfig(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, hidden=176) if small
       else TinyConfig(vocab_size=8192, dim=512, layers=4, heads=8, kv_heads=2, hidden=1408))
MAX_GEN = 8 if small else 64          # longest request of the serving loop (tokens)
MAX_LEN = max(positions_needed(PROMPT_LEN, NEW_TOKENS, max(K_STEPS)), MAX_GEN + 1)   # K-step blocks write whole
SYNC = torch.cuda.synchronize if CUDA else (lambda: None)
torch.manual_seed(SEED)
torch.set_grad_enabled(False)   # inference throughout
if not CUDA:
    torch.set_num_threads(1)    # tiny CPU work: one thread is faster than several competing for a small machine

HF_VERSION, HF_WHY = hf_status()   # the transformers version, or None and why (missing, too old)
HF = HF and HF_VERSION is not None


def elapsed():
    return time.perf_counter() - T_START


def over_budget():
    return elapsed() > TIME_BUDGET_S


print(env_table())
print(f"\nSMOKE={SMOKE}  BATCHES={BATCHES}  PROMPT_LEN={PROMPT_LEN}  NEW_TOKENS={NEW_TOKENS}  dtype={DT}  "
      f"SERVE_STEPS={SERVE_STEPS}  SAMPLES={SAMPLES} x WINDOWS={WINDOWS}  COMPILE={COMPILE}  transformers={HF_VERSION}")
if HF_VERSION is None:
    print(f">>> the transformers rows are skipped: {HF_WHY}.")
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
# ## 3. Why decoding can be host-bound
#
# One decode step launches many small kernels, about as many at every batch size (section 7's `kernels_per_call`
# column). The profiler counts them (GPU only); the CPU's time to issue them (Python, dispatcher and the launch
# itself, per kernel) is the time per token of eager decoding as long as the GPU finishes each kernel sooner.
# Section 7 compares eager's time per step with the GPU's busy time and prints the verdict.

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


def fresh_cublas(fn):
    """fn, for capturing: a capture starts with a fresh cuBLAS workspace, which lands in the graph's pool."""
    def wrapped(*args):
        if CUDA and CLEAR_CUBLAS is not None and torch.cuda.is_current_stream_capturing():
            CLEAR_CUBLAS()
        return fn(*args)
    return wrapped


graph_step = fresh_cublas(decode_step)


ledger = MemoryLedger()
LADDER = ladder(MAX_BATCH)
sample_tokens = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
sample_pos = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
with ledger.measure("kit buckets") as kit_mem:
    graphs = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=LADDER, eager_fallback=True,
                             measure_memory=True)  # each bucket's pool growth in graphs.capture_log
kit_held = ledger.record("kit buckets", graphs).get("held", float("nan")) / MiB
print(graphs)
capture_rows = [{"case": "capture", "variant": f"kit bucket {e['size']}", "median_us": float("nan"),
                 "speedup": float("nan"), "batch": e["size"], "setup_s": e["seconds"],
                 "pool_growth_mib": e["pool_growth_bytes"] / MiB} for e in sorted(graphs.capture_log, key=lambda e: e["size"])]
if CUDA:
    print(pd.DataFrame(capture_rows)[["batch", "setup_s", "pool_growth_mib"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    growth = {e["size"]: e["pool_growth_bytes"] / MiB for e in graphs.capture_log}
    largest = max(growth)
    held = f"{kit_held:.1f} MiB" if kit_held == kit_held else "an amount the ledger could not read"
    print(f"{len(LADDER)} graphs captured in {graphs.capture_seconds:.2f} s; they hold {held} (shared pool + static "
          f"buffers). The largest bucket, captured first, grew the pool by {growth[largest]:.1f} MiB; the other "
          f"{len(growth) - 1} together grew it by {sum(growth.values()) - growth[largest]:.1f} MiB (what they could "
          f"not reuse of it).")
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
# - **`torch.compile` without graphs, then the kit's graphs** ("compile + kit graphs"): the decode step compiled
#   in the default mode (Inductor fuses kernels; no CUDA graphs), with dynamic batch sizes so that one compile
#   serves every bucket, then captured per bucket by `capture_buckets` exactly as the eager step was. Section 11
#   sets the three tools side by side.
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

# %%
# compile + kit graphs: Inductor's fused kernels (no CUDA graphs of its own), captured per bucket by the kit
fused_graphs, fused_setup = None, {}
if COMPILE:
    def build_fused():
        def fused_decode(tokens, pos):
            return model.decode(tokens, pos, cache)
        # default mode: Inductor's fused kernels, no CUDA graphs; dynamic batch: one compile for every bucket
        fused_step = fresh_cublas(torch.compile(fused_decode, dynamic=True))
        t0 = time.perf_counter()
        for n in (MAX_BATCH, 1):                             # the compiles: dynamic sizes, and size 1 (specialized)
            fused_step(sample_tokens[:n], sample_pos[:n])
        SYNC()
        fused_setup["compile_s"] = time.perf_counter() - t0
        with ledger.measure("compile + kit buckets") as row:
            bg = capture_buckets(fused_step, sample_tokens, sample_pos, sizes=LADDER)
        fused_setup.update(capture_s=bg.capture_seconds, reserved_mib=row["reserved_delta"] / MiB)
        return bg
    fused_graphs = attempt("compile + kit graphs", build_fused)
    if fused_graphs is not None:
        print(f"compile + kit graphs: compiled in {fused_setup['compile_s']:.1f} s, {len(LADDER)} buckets captured "
              f"in {fused_setup['capture_s']:.2f} s")
else:
    print("compile + kit graphs: skipped (" + ("needs a CUDA GPU)" if not CUDA else "COMPILE=False)"))

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


FUSED_GEN, FUSED_STEP = "compile + kit graphs per bucket", "compile + kit graph (bucket)"
VARIANTS = {   # label -> generate(b) -> tokens (b, NEW_TOKENS); every one on the same model, weights, prompts
    "eager": lambda b: greedy_generate(model, cache, prompts[b], NEW_TOKENS),
    "kit graphs per bucket": gen_kit,
}
if compiled_step is not None:
    VARIANTS["reduce-overhead"] = lambda b: greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=compiled_step)
if fused_graphs is not None:
    VARIANTS[FUSED_GEN] = lambda b: greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=fused_graphs)
HF_STATIC = "transformers generate, static cache" + (" (compiled)" if CUDA else "")
HF_DYNAMIC = "transformers generate, dynamic cache"
if hf_model is not None:
    VARIANTS[HF_STATIC] = lambda b: hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation="static")
    VARIANTS[HF_DYNAMIC] = lambda b: hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation=None)
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
        step = {"eager": None, "reduce-overhead": compiled_step, FUSED_GEN: fused_graphs}.get(label, graphs)
        tokens = greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=step, logits_out=out)
    return tokens, out


check_rows, setup = [], {}
eager_ref = {b: logits_of("eager", b) for b in BATCHES}
setup_mem = {}   # label -> the ledger's row: memory the allocator reserved during its first calls
for label in VARIANTS:
    with ledger.measure(f"first calls, {label}") as setup_mem[label]:
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
# bucket (copy the inputs in, replay, slice the logits); `reduce-overhead`; the compiled step captured per bucket by
# the kit ("compile + kit graph"). In each window they take turns in one
# `compare` call (round-robin), and the window's speedup is the median of its per-round ratios. The **floor** is
# the GPU-busy time of one replay of the kit's graph (`gpu_time`): how fast a decode step could go if the host
# cost nothing. Each step makes one token per sequence, so the time per step is the time per token each sequence
# sees, and `batch / step time` is tokens per second.
#
# One window is not enough to quote a number: the host's speed drifts over minutes, and eager times move with it far
# more than graph replays do (compare their intervals in the table), so a window's own quartiles say little about
# where a rerun lands. Every comparison of this notebook is therefore timed in `WINDOWS` windows; each window goes
# over all the cases of its section (here: every batch size), so that the windows of one case are spread in time,
# and the profiler (floors, kernel counts, how each variant ran) runs in the last window only, after that case's
# timings. `combine_windows` gives each variant the median of its windows and a 90% **prediction interval**
# (`speedup_lo`..`speedup_hi`): where one more window, timed the same way, should land.
#
# Every comparison the notebook states is a **claim** computed from such an interval: it holds when the whole
# interval clears the threshold, fails when the whole interval lies on the other side, and says "no clear
# difference" when it straddles it. Two variants neither of which is eager (`reduce-overhead` against the kit's
# graph) are compared window by window (`ratio_across_windows`: the slower one's time over the faster one's in
# each window, and the interval of those ratios). The cell after the table prints the verdicts; a comparison not
# timed in two windows or more (a variant that failed, or was not run here) gets no verdict, and the cell says so.

# %%
def pause_after(started):
    """Between two windows: sleep until WINDOW_PAUSE_S has passed since this window started, so that the windows of
    each case start at least that far apart (a window that lasted longer needs no pause)."""
    time.sleep(max(0.0, WINDOW_PAUSE_S - (time.perf_counter() - started)))


def report_failure(what, exc):
    print(f"{what} failed: {type(exc).__name__}: {exc}\n"
          + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)[-6:-1]))


def safe_compare(runners, case, *args, floor=False, **kw):
    """One window of compare() for one case ("eager" first, the baseline); the profiler (floor=True) on a GPU only.
    If the profiler part fails, the same window again without it. If that fails too, each variant runs once alone:
    one that fails is dropped from this and every later window (its error kept in variant_errors as
    "case: variant"), and the others are timed. None if nothing could be timed: the case has one window fewer."""
    runners = {name: fn for name, fn in runners.items() if f"{case}: {name}" not in variant_errors}
    if "eager" not in runners:
        return None
    for with_floor in ((True, False) if CUDA and floor else (False,)):
        try:
            return compare(runners, *args, case=case, samples=SAMPLES, floor=with_floor, **kw)
        except Exception as exc:  # noqa: BLE001 - a failed window is reported; the other windows still count
            report_failure(f"{case}: compare(floor={with_floor})", exc)
    for name, fn in list(runners.items()):
        if attempt(f"{case}: {name}", lambda fn=fn: (fn(*args), SYNC())) is None:
            del runners[name]
    if "eager" not in runners or len(runners) < 2:
        return None
    try:
        return compare(runners, *args, case=case, samples=SAMPLES, floor=False, **kw)
    except Exception as exc:  # noqa: BLE001
        report_failure(f"{case}: compare without the failed variants", exc)
        return None


def pick(table, case, variant):
    """The row of `variant` in `case` (under its name or as "<variant> (eager fallback)"); None if not timed."""
    if table is None or not len(table):
        return None
    hit = table[(table.case == case) & table.variant.isin([variant, f"{variant} (eager fallback)"])]
    return hit.iloc[0] if len(hit) else None


def combine(windows):
    """The windows of one section (a compare() table per window, None where nothing was timed) → one row per
    (case, variant): combine_windows case by case over the windows that timed it, plus each window's median
    (window_medians_us, ";"-joined, nan for a window without the row)."""
    frames = [f for f in windows if f is not None and len(f)]
    parts = []
    for case in dict.fromkeys(c for f in frames for c in f.case):
        part = combine_windows([f[f.case == case] for f in frames if (f.case == case).any()])
        part["window_medians_us"] = [";".join(f"{r.median_us if r is not None else float('nan'):.6g}"
                                              for r in (pick(f, case, v) for f in windows)) for v in part.variant]
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def window_line(frame):
    """One window's speedups, for the progress line."""
    if frame is None or not len(frame):
        return "nothing timed"
    return ", ".join(f"{r.case.split(', ')[-1]}: {r.variant} {r.speedup:.2f}x" for r in frame.itertuples()
                     if r.variant != "eager")


claims = []   # every comparison this notebook states; saved to claims.csv in section 16


def state(claim):
    """Keep a claim and print its verdict and its sentence; one without an interval (timed in fewer than two
    windows) is not kept: no verdict."""
    if not (claim.lo == claim.lo and claim.hi == claim.hi):
        return not_measured(claim.claim, "timed in fewer than two windows")
    claims.append(claim)
    print(f"[{claim.verdict}] {claim.statement}")


def not_measured(claim_id, why):
    print(f"[not measured] {claim_id}: {why}; no verdict")


def speedup_claim(claim_id, table, case, variant, above=1.0, what="faster than eager"):
    """A claim on the prediction interval of `variant`'s speedup over eager in `case`."""
    r = pick(table, case, variant)
    if r is None:
        return not_measured(claim_id, f"{variant} was not timed in '{case}'")
    interval = "{lo:.2f}-{hi:.2f}x, 90% prediction interval"
    state(Claim(claim_id, lo=r.speedup_lo, hi=r.speedup_hi, above=above,
                holds=f"{case}: {r.variant} is {what} ({interval})",
                fails=f"{case}: {r.variant} is not {what} ({interval})",
                unclear=f"{case}: no clear difference: the speedup of {r.variant} over eager, {interval}, "
                        f"straddles {above:g}x"))


def faster_claim(claim_id, windows, case, fast, slow, above=1.0):
    """A claim that `fast` is faster than `slow` in `case` (by a factor above `above`), neither of them the baseline:
    the prediction interval of slow's time over fast's, window by window (ratio_across_windows)."""
    labels = {v: next((r.variant for r in (pick(f, case, v) for f in windows) if r is not None), None)
              for v in (slow, fast)}
    missing = [v for v, label in labels.items() if label is None]
    if missing:
        return not_measured(claim_id, f"{missing[0]} was not timed in '{case}'")
    a, b = labels[slow], labels[fast]
    try:
        r = ratio_across_windows(windows, (case, a), (case, b))
    except ValueError:
        return not_measured(claim_id, f"{a} and {b} were never timed in the same window of '{case}'")
    interval = f"{a} takes {{lo:.2f}}-{{hi:.2f}}x the time of {b}, 90% prediction interval"
    faster = "faster than" if above == 1.0 else f"at least {above:g}x as fast as"
    at = "" if above == 1.0 else f" at {above:g}x"
    state(Claim(claim_id, lo=r["lo"], hi=r["hi"], above=above,
                holds=f"{case}: {b} is {faster} {a} ({interval})",
                fails=f"{case}: {b} is not {faster} {a} ({interval})",
                unclear=f"{case}: no clear difference between {b} and {a}{at} ({interval})"))


ok_variants = [v for v in VARIANTS if v not in variant_errors]
step_runners = {}   # called as fn(tokens, pos): the kit's BucketedGraphs itself, so compare() reads its mode
for b in BATCHES:
    step_runners[b] = {"eager": decode_step, "kit graph (bucket)": graphs}
    if "reduce-overhead" in ok_variants and ("reduce-overhead", b) in setup:
        step_runners[b]["reduce-overhead"] = compiled_step
    if FUSED_GEN in ok_variants and (FUSED_GEN, b) in setup:
        step_runners[b][FUSED_STEP] = fused_graphs
step_windows, floors = [], {}
for w in range(WINDOWS):
    last, started, tables = w == WINDOWS - 1, time.perf_counter(), []
    for b in BATCHES:
        df = safe_compare(step_runners[b], f"decode step, batch {b}", *step_inputs[b], floor=last)
        if df is not None:
            df["batch"] = b
            tables.append(df)
        if last and CUDA and b in graphs.graphs:   # the floor: replays of the bucket's graph, after the timings
            g = attempt(f"floor, batch {b}", lambda b=b: gpu_time(graphs.graphs[b].replay, calls=20))
            if g is not None:
                floors[b] = g.busy_us
    step_windows.append(pd.concat(tables, ignore_index=True) if tables else None)
    print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(step_windows[-1])}")
    if not last:
        pause_after(started)
step_df = combine(step_windows)
if len(step_df):
    step_df["batch"] = step_df.batch.astype(int)
    step_df["floor_step_us"] = step_df.batch.map(floors).astype(float)   # NaN where no floor was measured
    step_df["us_per_step"] = step_df.median_us
    step_df["tokens_per_s"] = step_df.batch / (step_df.median_us * 1e-6)
    print(step_df[["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo", "speedup_hi",
                   "kernels_per_call", "floor_us", "floor_step_us", "tokens_per_s"]].to_string(index=False,
                                                                                   float_format=lambda v: f"{v:.1f}"))

# %%
for b in BATCHES:
    case = f"decode step, batch {b}"
    speedup_claim(f"step_graph_beats_eager_b{b}", step_df, case, "kit graph (bucket)")
    faster_claim(f"step_reduce_overhead_beats_graph_b{b}", step_windows, case, fast="reduce-overhead",
                 slow="kit graph (bucket)")
    faster_claim(f"step_fused_graph_beats_kit_graph_b{b}", step_windows, case, fast=FUSED_STEP,
                 slow="kit graph (bucket)")
    faster_claim(f"step_fused_graph_beats_reduce_overhead_b{b}", step_windows, case, fast=FUSED_STEP,
                 slow="reduce-overhead", above=1.05)
    eager_row, floor = pick(step_df, case, "eager"), floors.get(b, float("nan"))
    if eager_row is None or not floor > 0:
        not_measured(f"step_eager_host_bound_b{b}", "it needs eager's time and the GPU-busy floor (a CUDA GPU)")
        continue
    times = f"an eager step takes {{lo:.1f}}-{{hi:.1f}}x the GPU's busy time ({floor:.0f} µs, the floor)"
    state(Claim(f"step_eager_host_bound_b{b}", lo=eager_row.median_pi_lo / floor, hi=eager_row.median_pi_hi / floor,
                above=2.0,
                holds=f"{case}: eager decoding is host-bound: {times}, so the GPU sits idle most of each step",
                fails=f"{case}: eager decoding is not host-bound by this test: {times}, not more than 2x",
                unclear=f"{case}: no clear difference from 2x the floor: {times}"))

# %% [markdown]
# ## 8. Whole generations, side by side
#
# Now whole greedy generations (prefill + `NEW_TOKENS` tokens) of every variant, `transformers`' included, all
# taking turns in each window, the windows going over every batch size. Time per token is the generation's time
# divided by `NEW_TOKENS`; tokens per second count every sequence of the batch. Five verdicts per batch size,
# printed by the cell after the table: do the kit's graphs beat eager; is `reduce-overhead` faster than the kit's
# graphs; is the compiled step captured by the kit faster than `reduce-overhead`; are the kit's graphs faster than
# `transformers`' static-cache `generate`; and is that static cache faster than `transformers`' default dynamic
# cache?

# %%
gen_runners = {b: {v: (lambda v=v, b=b: VARIANTS[v](b)) for v in VARIANTS
                   if v not in variant_errors and (v, b) in setup} for b in BATCHES}
gen_windows = []
for w in range(WINDOWS):
    started, tables = time.perf_counter(), []
    for b in BATCHES:
        df = safe_compare(gen_runners[b], f"generate, batch {b}", floor=False, calls=1)
        if df is not None:
            df["batch"] = b
            tables.append(df)
    gen_windows.append(pd.concat(tables, ignore_index=True) if tables else None)
    print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(gen_windows[-1])}")
    if w < WINDOWS - 1:
        pause_after(started)
gen_executed_as = {}
if CUDA:
    # after all timings: the profiler says whether each variant replays graphs, from one generation at the smallest
    # batch (traces of whole generations take a while to read; a variant runs alike at every size)
    b0 = BATCHES[0]
    for v in gen_runners[b0]:
        g = attempt(f"profile {v}", lambda v=v: gpu_time(lambda: VARIANTS[v](b0), calls=1, warmup=0))
        gen_executed_as[v] = "unknown" if g is None else ("cuda graph" if g.graph_launches > 0 else "eager")
gen_df = combine(gen_windows)
if len(gen_df):
    gen_df["batch"] = gen_df.batch.astype(int)
    if CUDA:
        gen_df["executed_as"] = gen_df.variant.map(gen_executed_as).fillna("unknown")
    gen_df["us_per_token"] = gen_df.median_us / NEW_TOKENS
    gen_df["tokens_per_s"] = gen_df.batch * NEW_TOKENS / (gen_df.median_us * 1e-6)
    gen_df["first_call_s"] = [setup.get((v.replace(" (eager fallback)", ""), b), float("nan"))
                              for v, b in zip(gen_df.variant, gen_df.batch)]
    print(gen_df[["case", "variant", "executed_as", "us_per_token", "speedup", "speedup_lo", "speedup_hi",
                  "tokens_per_s", "first_call_s"]].to_string(index=False, float_format=lambda v: f"{v:.1f}"))

# %%
for b in BATCHES:
    case = f"generate, batch {b}"
    speedup_claim(f"generate_graphs_beat_eager_b{b}", gen_df, case, "kit graphs per bucket")
    faster_claim(f"generate_reduce_overhead_beats_graphs_b{b}", gen_windows, case, fast="reduce-overhead",
                 slow="kit graphs per bucket")
    faster_claim(f"generate_fused_graphs_beat_reduce_overhead_b{b}", gen_windows, case, fast=FUSED_GEN,
                 slow="reduce-overhead")
    faster_claim(f"generate_graphs_beat_hf_static_b{b}", gen_windows, case, fast="kit graphs per bucket",
                 slow=HF_STATIC)
    faster_claim(f"generate_hf_static_beats_hf_dynamic_b{b}", gen_windows, case, fast=HF_STATIC, slow=HF_DYNAMIC)

# %% [markdown]
# ## 9. Prefill: what does a graph buy it?
#
# Prefill runs the whole prompt at once: about as many kernels as a decode step (the `kernels_per_call` column of
# `results.csv` counts both), each with `batch x prompt` rows of work, so the GPU has more to do per launch and the
# host's launch cost weighs less in the total. One measured point: the largest batch with a prompt of 8 times
# `PROMPT_LEN`, cut to the cache's length (the case name gives the size that ran), eager against a graph of the
# prefill (`capture`, same cache), in `WINDOWS` windows. Two verdicts, printed by the cell after the table: does the
# graph still save more than 10% on prefill, and does it buy a decode step at the same batch more than it buys
# prefill (the decode step's speedup over prefill's, window by window)?

# %%
PREFILL_LEN = min(8 * PROMPT_LEN, MAX_LEN)
PREFILL_CASE = f"prefill, {MAX_BATCH} x {PREFILL_LEN} tokens"
long_prompt = torch.randint(0, CFG.vocab_size, (MAX_BATCH, PREFILL_LEN), generator=gen).to(DEVICE)


prefill_for_capture = fresh_cublas(lambda x: model.prefill(x, cache))   # the workspace in the graph's pool (section 4)
prefill_windows = []
prefill_graph = attempt("prefill graph", lambda: capture(prefill_for_capture, long_prompt, eager_fallback=True))
if prefill_graph is not None:
    err = (prefill_graph(long_prompt).float() - model.prefill(long_prompt, cache).float()).abs().max().item()
    print(f"prefill graph == eager: max |logit diff| {err:.1e}")
    # the graph itself is timed (called as prefill_graph(long_prompt)), so compare() reads its mode
    prefill_runners = {"eager": lambda x: model.prefill(x, cache), "graph": prefill_graph}
    for w in range(WINDOWS):
        last, started = w == WINDOWS - 1, time.perf_counter()
        df = safe_compare(prefill_runners, PREFILL_CASE, long_prompt, floor=last)
        if df is not None:
            df["batch"] = MAX_BATCH
        prefill_windows.append(df)
        print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(df)}")
        if not last:
            pause_after(started)
    del prefill_graph, prefill_runners
prefill_df = combine(prefill_windows)
if len(prefill_df):
    print(prefill_df[["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo", "speedup_hi",
                      "floor_us"]].to_string(index=False, float_format=lambda v: f"{v:.1f}"))

# %%
speedup_claim("prefill_graph_saves_10pct", prefill_df, PREFILL_CASE, "graph", above=1.10,
              what="more than 10% faster than eager")
decode_case = f"decode step, batch {MAX_BATCH}"
pairs = [(pick(sw, decode_case, "kit graph (bucket)"), pick(pw, PREFILL_CASE, "graph"))
         for sw, pw in zip(step_windows, prefill_windows)]       # window by window
ratios = [s.speedup / p.speedup for s, p in pairs if s is not None and p is not None]
if ratios:
    lo, hi = prediction_interval(ratios)
    interval = ("the decode step's speedup over eager is {lo:.2f}-{hi:.2f}x prefill's, window by window, 90% "
                "prediction interval")
    state(Claim("decode_gains_more_than_prefill", lo=lo, hi=hi, above=1.0,
                holds=f"a graph buys a decode step at batch {MAX_BATCH} more than it buys prefill ({interval})",
                fails=f"a graph buys prefill at least as much as a decode step at batch {MAX_BATCH} ({interval})",
                unclear=f"no clear difference between what a graph buys a decode step at batch {MAX_BATCH} and "
                        f"what it buys prefill ({interval})"))
else:
    not_measured("decode_gains_more_than_prefill", f"the prefill or the decode step at batch {MAX_BATCH} was not timed")

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
# as many graphs as the ladder; and one graph per batch size. The planner minimises padded rows here. Whether
# padding rows cost much depends on how fast a decode step's time grows with the batch (section 7's table); what
# the number of graphs costs, on how the driver and the GPU handle many graphs. The last cell of this section
# prints the verdicts: does each strategy beat eager, do the planned buckets beat the ladder, and does the
# ladder beat one graph per batch size?

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
LADDER_NAME, PLANNED_NAME, EXACT_NAME = ("graphs, vLLM-style ladder", "graphs, planned buckets",
                                        "graphs, one per batch size")
strategies = {"eager": decode_step, LADDER_NAME: graphs}
serve_info = {"eager": {"graphs": 0, "setup_s": 0.0, "held_mib": 0.0, "bucket_sizes": ""},
              LADDER_NAME: {"graphs": len(LADDER), "setup_s": graphs.capture_seconds, "held_mib": kit_held,
                            "bucket_sizes": " ".join(map(str, LADDER))}}
for name, sizes in ((PLANNED_NAME, plan.sizes), (EXACT_NAME, list(range(1, MAX_BATCH + 1)))):
    with ledger.measure(name):
        bg = attempt(name, lambda sizes=sizes: capture_buckets(graph_step, sample_tokens, sample_pos, sizes=sizes,
                                                               eager_fallback=True, measure_memory=True))
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
serve_runners = {name: (lambda step=step: serve(step, stream)) for name, step in strategies.items()
                 if f"serving loop, {name}" not in variant_errors}
serve_windows = []
for w in range(WINDOWS):
    started = time.perf_counter()
    serve_windows.append(safe_compare(serve_runners, "serving loop", floor=False, calls=1))
    print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(serve_windows[-1])}")
    if w < WINDOWS - 1:
        pause_after(started)
serve_df = combine(serve_windows)
if len(serve_df):
    steps = len(observed)
    # what ran: the eager step, or BucketedGraphs whose mode says whether they hold captured graphs
    ran_as = {name: "cuda graph" if getattr(s, "mode", None) == "graph" else "eager" for name, s in strategies.items()}
    serve_df["executed_as"] = [ran_as.get(v.replace(" (eager fallback)", ""), "unknown") for v in serve_df.variant]
    serve_df["us_per_step"] = serve_df.median_us / steps
    serve_df["tokens_per_s"] = sum(observed) / (serve_df.median_us * 1e-6)
    serve_df["same_tokens_as_eager"] = [serve_checks.get(v.replace(" (eager fallback)", ""), float("nan"))
                                        for v in serve_df.variant]
    for col in ("graphs", "setup_s", "held_mib", "bucket_sizes"):
        serve_df[col] = [serve_info.get(v.replace(" (eager fallback)", ""), {}).get(col) for v in serve_df.variant]
    serve_df["pad_fraction"] = [evaluate_buckets(observed, [int(x) for x in s.split()])["pad_fraction"] if s else 0.0
                                for s in serve_df.bucket_sizes.fillna("")]
    print(serve_df[["variant", "executed_as", "us_per_step", "speedup", "speedup_lo", "speedup_hi", "tokens_per_s",
                    "graphs", "setup_s", "held_mib", "pad_fraction", "same_tokens_as_eager"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3g}"))

# %%
for claim_id, name in (("serving_ladder_beats_eager", LADDER_NAME), ("serving_planned_beats_eager", PLANNED_NAME),
                       ("serving_one_per_size_beats_eager", EXACT_NAME)):
    speedup_claim(claim_id, serve_df, "serving loop", name)
faster_claim("serving_planned_beats_ladder", serve_windows, "serving loop", fast=PLANNED_NAME, slow=LADDER_NAME)
faster_claim("serving_ladder_beats_one_per_size", serve_windows, "serving loop", fast=LADDER_NAME, slow=EXACT_NAME)

# %% [markdown]
# ## 11. Fusion and graphs are separate tools
#
# Sections 7 and 8 put four ways of running the same decode step side by side. Section 7's columns say what each one
# removed: `kernels_per_call` counts the kernels a step runs, `floor_us` is the GPU's busy time for one call (the
# time left when launching costs nothing), and the median is what a step took. A CUDA graph removes the *launches*
# (the host's cost per kernel) but replays every kernel it captured: the kit's graph of the eager step runs all of
# eager's kernels (plus its input copies), so its floor is that of eager's kernels. Fusion (Inductor,
# `torch.compile`) removes *kernels*: fewer, larger kernels, so a lower floor, but each one is still launched from
# the host. `reduce-overhead` does both, and so does the fused step captured by the kit. What `reduce-overhead` adds
# on every call is bookkeeping, read in PyTorch's `torch/_inductor/cudagraph_trees.py`: Dynamo's guards for the
# compiled frame, then `CUDAGraphTreeManager._run`, whose `CUDAGraphNode.check_invariants` compares the data
# pointers of the static inputs (parameters, `mark_static_address` buffers) and of the tensors its pool manages with
# those recorded (`torch._C._tensors_data_ptrs_at_indices_equal`) and checks that the outputs expected dead are
# dead; then `CUDAGraphNode.run` copies the other inputs in (`torch._foreach_copy_`), replays, and rebuilds the
# output tensors from their metadata (`reconstruct_outputs`). Its memory is one pool per device for the whole tree
# of graphs; its outputs live in that pool until the next step (hence `cudagraph_mark_step_begin`). The kit's call
# checks its arguments in Python, copies the inputs and replays: it has no guards to run, no tree of graphs to walk
# and no outputs to rebuild. All of that is host work: it adds to the time per step only where the host, not the
# GPU, sets the pace. The verdicts after the next table say whether it did here.

# %%
# NBVAL_CHECK_OUTPUT
TOOLS = pd.DataFrame([
    ("kit graph of the eager step", "yes", "no", "argument checks, input copies, one replay", "the kit's pool"),
    ("torch.compile, default mode", "no", "yes", "Dynamo's guards, one launch per fused kernel", "caching allocator"),
    ("compile + kit graph", "yes", "yes", "argument checks, input copies, one replay", "the kit's pool"),
    ("reduce-overhead", "yes", "yes", "guards, pointer and liveness checks, input copies, one replay, outputs "
     "rebuilt", "its tree's pool"),
], columns=["tool", "removes launches", "removes kernels", "work per call besides the GPU's", "memory"])
print(TOOLS.to_string(index=False))

# %% [markdown]
# What each cost to set up: compile time, capture time (the kit) or compile plus recording (`reduce-overhead`'s
# first calls, one recording per batch size). `reserved_mib` is the change in the memory PyTorch's caching
# allocator had reserved across that setup (the kit's captures of all buckets; `reduce-overhead`'s first calls of
# section 6). It is a difference, not the memory the graphs hold, and it can be negative: every capture through
# `torch.cuda.graph` first empties the allocator's cache (`torch.cuda.empty_cache()` in its `__enter__`), which
# hands back to the driver blocks that earlier cells left cached. What the kit's graphs hold is the ledger's line
# in section 4. Then, at each batch size, the time per step, kernels per step and floor of the three graphed
# variants, and the verdicts of sections 7 and 8 on them.
#
# Read the two fused variants together. In the recorded H100 run the compiled step captured by the kit ran as
# many kernels per step as `reduce-overhead` and took the same time: each verdict between them is "fails" at
# the 1.05x threshold or "no clear difference", so neither is faster. Both medians sit close to their floors,
# so both are GPU-bound at these sizes: `reduce-overhead`'s per-call checks run on the host while the GPU is
# still busy with kernels already queued, and they add no visible time. Both are faster than the kit's graph of
# the eager step, whose extra kernels raise its floor.

# %%
def setup_row(variant, compile_s, capture_s, reserved):
    return {"case": "setup", "variant": variant, "median_us": float("nan"), "speedup": float("nan"),
            "compile_s": compile_s, "capture_s": capture_s, "reserved_mib": reserved}


setup_rows = [setup_row("kit graphs per bucket", 0.0, graphs.capture_seconds,
                        kit_mem.get("reserved_delta", float("nan")) / MiB)]
if fused_graphs is not None:
    setup_rows.append(setup_row(FUSED_GEN, fused_setup["compile_s"], fused_setup["capture_s"],
                                fused_setup["reserved_mib"]))
if "reduce-overhead" in setup_mem and ("reduce-overhead", BATCHES[0]) in setup:
    first_calls = sum(t for (v, _), t in setup.items() if v == "reduce-overhead")
    setup_rows.append(setup_row("reduce-overhead", first_calls, float("nan"),
                                setup_mem["reduce-overhead"].get("reserved_delta", float("nan")) / MiB))
setup_df = pd.DataFrame(setup_rows)
print(setup_df[["variant", "compile_s", "capture_s", "reserved_mib"]].to_string(
    index=False, float_format=lambda v: f"{v:.2f}"))
graphed = step_df[step_df.variant.isin(["kit graph (bucket)", FUSED_STEP, "reduce-overhead"])] if len(step_df) else []
if len(graphed) and CUDA:
    print(graphed[["batch", "variant", "median_us", "kernels_per_call", "floor_us"]].to_string(
        index=False, float_format=lambda v: f"{v:.1f}"))
else:
    print("no graphed variant was timed here (they need a CUDA GPU): see the recorded results in section 17.")
for c in claims:
    if c.claim.startswith(("step_fused_graph", "generate_fused_graphs")):
        print(f"[{c.verdict}] {c.statement}")

# %% [markdown]
# ## 12. Several tokens per replay
#
# One graph per token still costs the host one replay, one read of the done flags and one loop turn per token. A
# graph can hold several decode steps: `k_step(step, K)` (in `cudagraph_kit/course/decode.py`) runs K steps in one
# function, each step's argmax becoming the next step's input **on the GPU**. Its state is four tensors (the last
# tokens, the positions, which rows are done, the stop token) that it updates in place, so replay after replay
# continues the sequences with nothing copied in between. A row that produces the stop token is marked done on the
# GPU and emits the pad token from then on; the host reads the done flags once per block of K tokens
# (`generate_blocks`), and stops when every row is done. The same function runs eagerly on a CPU.
#
# First, correctness: for batch 1 and 8 and K in `K_STEPS`, the tokens equal those of one step per token with
# the same stop rule (`stop_after` on plain greedy tokens), with a stop token chosen so that a sequence stops in
# the middle of a block.

# %%
PAD, K_BATCHES = 0, sorted({1, min(8, MAX_BATCH)})
kx = prompts[MAX_BATCH]            # batch b decodes the first b of these prompts, in cache rows 0..b-1
k_graphs, k_rows = {}, []
for b in K_BATCHES:
    ref = greedy_generate(model, cache, kx[:b], NEW_TOKENS)           # one step per token, no stop
    stop, stop_step = mid_block_stop(ref, max(K_STEPS))
    want = stop_after(ref, stop, PAD)
    for k in K_STEPS:
        block = fresh_cublas(k_step(decode_step, k, pad_token=PAD))  # the cuBLAS workspace in its pool (section 4)
        sample = decode_state(torch.zeros(b, dtype=torch.long, device=DEVICE), 0)
        g = attempt(f"{k} tokens per replay, batch {b}", lambda: capture(block, *sample, warmup=2, eager_fallback=True))
        if g is None:
            continue
        k_graphs[b, k] = g
        first = model.prefill(kx[:b], cache).argmax(-1)
        load_state(g.static_inputs, decode_state(first, PROMPT_LEN, stop))
        stats = {}
        got = generate_blocks(g.replay, g.static_inputs, first, NEW_TOKENS, k, PAD, stats=stats)
        k_rows.append({"case": "k-step correctness", "variant": f"K={k}", "batch": b, "executed_as": g.mode,
                       "median_us": float("nan"), "speedup": float("nan"), "stop_step": stop_step,
                       "tokens_equal": bool(torch.equal(got.cpu(), want.cpu())), **stats})
k_checks = pd.DataFrame(k_rows)
print(k_checks[["batch", "variant", "executed_as", "stop_step", "blocks", "host_checks", "tokens_equal"]]
      .to_string(index=False))
assert k_checks.tokens_equal.all(), "K steps per replay decoded differently from one step per token"

# %% [markdown]
# Then the speed: whole generations of `NEW_TOKENS` tokens with no stop token (every K makes the same tokens),
# prefill excluded (it ran once above), in `WINDOWS` windows: eager (the same K=1 block, run eagerly), then one
# graph per token (K=1) and one graph per K tokens for the other K. Tokens per second count the decoded tokens of
# every row. The verdicts compare each K with one graph per token, window by window.
#
# What a block of K steps saves is that host work between replays. A replay of one decode step already keeps the
# GPU busy for most of its time (section 7: the kit's graph runs close to its floor), so expect a small gain. In
# the recorded H100 run the gain was small at batch 8 and unclear at batch 1 for K=4 and K=8.

# %%
def k_runner(b, k):
    """One timed generation at batch b: k=0 eager (the K=1 block run eagerly), else the graph of K steps per replay."""
    first = kx[:b, -1].clone()                 # any start token will do for timing (no stop token)
    start = decode_state(first, PROMPT_LEN)
    if k == 0:
        block = k_step(decode_step, 1, PAD)

        def run():
            state = tuple(t.clone() for t in start)
            return generate_blocks(lambda: block(*state), state, first, NEW_TOKENS, 1, PAD)
        return run
    g = k_graphs[b, k]

    def run():
        load_state(g.static_inputs, start)
        return generate_blocks(g.replay, g.static_inputs, first, NEW_TOKENS, k, PAD)
    return run


K_NAME = {k: f"K={k}: one graph per {k} tokens" if k > 1 else "K=1: one graph per token" for k in K_STEPS}
k_runners = {b: {"eager": k_runner(b, 0), **{K_NAME[k]: k_runner(b, k) for k in K_STEPS if (b, k) in k_graphs}}
             for b in K_BATCHES}
k_windows = []
for w in range(WINDOWS):
    started = time.perf_counter()
    tables = [safe_compare(k_runners[b], f"k-step decode, batch {b}", floor=False, calls=1) for b in K_BATCHES]
    tables = [df.assign(batch=b) for b, df in zip(K_BATCHES, tables) if df is not None]
    k_windows.append(pd.concat(tables, ignore_index=True) if tables else None)
    print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(k_windows[-1])}")
    if w < WINDOWS - 1:
        pause_after(started)
k_df = combine(k_windows)
if len(k_df):
    k_df["tokens_per_s"] = k_df.batch * (NEW_TOKENS - 1) / (k_df.median_us * 1e-6)
    print(k_df[["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo", "speedup_hi",
                "tokens_per_s"]].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
for b in K_BATCHES:
    for k in K_STEPS[1:]:
        faster_claim(f"kstep_k{k}_beats_one_graph_per_token_b{b}", k_windows, f"k-step decode, batch {b}",
                     fast=K_NAME[k], slow=K_NAME[1])

# %% [markdown]
# ## 13. Your own Hugging Face model
#
# The model people want to speed up is usually one they load from `transformers`. The recipe is the same as for
# our own model: allocate a `StaticCache` once, make the decode step a function of tensors only (`input_ids` and
# `position_ids`, both (batch, 1)) that calls the model with that cache and returns the last position's logits,
# prefill eagerly, capture the step, replay it for every token. `StaticDecoder` in
# `cudagraph_kit/course/hf_decode.py` is that recipe (also in `docs/CHEATSHEET.md`); here it runs on section 5's
# `LlamaForCausalLM`, which holds our weights.
#
# **The trap.** Where a step writes its key and value depends on the `transformers` version. In 4.x a static cache
# writes at the `cache_position` it is given. In 5.x (the cell below prints what this version does) each
# `StaticLayer` keeps its own write position on the GPU (`cumulative_length`), which every update advances and which
# ignores `cache_position`. A captured step advances it at every replay, and so did the capture's warm-up calls:
# unless it goes back to zero before each new sequence (`cache.reset()`, in place), the step writes past the cache's
# end (`index_copy_` out of bounds). `write_position_behaviour` finds out which kind this version has by a probe
# (one update of a tiny cache), not from the version number; `StaticDecoder` resets the cache before each sequence
# and after capturing, and checks the write position after every prefill. The table checks, at the first batch size,
# two graphed variants of the step against the eager step's tokens: the kit's graph, and the step compiled without
# graphs then captured by the kit. Its last row checks our `TinyLLM` (same weights) against the same tokens.
# `transformers`' own `generate(cache_implementation="static")` was checked in section 6 and is timed below.

# %%
HF_KIT, HF_FUSED = "HF step, kit graph", "HF step compiled + kit graph"
hf_dec, hf_graphs, hf_checks, hf_setup = None, {}, [], {}
if hf_model is None:
    print("skipped: " + (HF_WHY if HF_VERSION is None else "HF=False, or the transformers model failed (section 5)"))
else:
    hx = prompts[BATCHES[0]]
    hf_dec = StaticDecoder(hf_model, batch=hx.shape[0], max_len=MAX_LEN)
    print(f"transformers {HF_VERSION}: {hf_dec.behaviour.describe()}")
    ref_l = []
    hf_ref = hf_dec.generate(hx, NEW_TOKENS, logits_out=ref_l)       # the eager step: the reference
    builds = {HF_KIT: lambda: hf_dec.step}
    if COMPILE:
        builds[HF_FUSED] = lambda: torch.compile(hf_dec.step)         # default mode: fused kernels, no graphs
    for name, build in builds.items():
        if name == HF_FUSED and over_budget():
            variant_errors[name] = f"skipped: the notebook had run {elapsed():.0f} s (TIME_BUDGET_S={TIME_BUDGET_S})"
            continue
        t0 = time.perf_counter()
        hf_graphs[name] = attempt(name, lambda: hf_dec.capture(capture, fn=fresh_cublas(build()), eager_fallback=True))
        hf_setup[name] = time.perf_counter() - t0
    for name, g in [(n, g) for n, g in hf_graphs.items() if g is not None]:
        lg = []
        d = first_divergence(hf_dec.generate(hx, NEW_TOKENS, step=g, logits_out=lg), hf_ref, lg, ref_l)
        hf_checks.append({"variant": name, "tokens_equal": d["equal"], "first_step": d["first_step"],
                          "margin": d["margin"], "logit_diff": d["logit_diff"], "setup_s": hf_setup[name]})
    d = first_divergence(greedy_generate(model, cache, hx, NEW_TOKENS), hf_ref)
    hf_checks.append({"variant": "our TinyLLM, same weights", "tokens_equal": d["equal"],
                      "first_step": d["first_step"]})
    print(pd.DataFrame(hf_checks).to_string(index=False, float_format=lambda v: f"{v:.3g}"))

# %% [markdown]
# Time per token of whole generations (prefill included, as in section 8), in `WINDOWS` windows: the eager step,
# the two graphed steps, and `transformers`' static-cache `generate` (compiled with `reduce-overhead` on a GPU, by
# `transformers` itself; its first calls were in section 6). Three verdicts follow: does the kit's graph beat the
# eager step; does the compiled step captured by the kit beat the kit's graph; and does it beat `generate`'s
# static cache?

# %%
HF_CASE = f"transformers model, batch {BATCHES[0]}"
hf_runners = {}
if hf_dec is not None:
    hf_runners["eager"] = lambda: hf_dec.generate(hx, NEW_TOKENS)
    hf_runners.update({n: (lambda g=g: hf_dec.generate(hx, NEW_TOKENS, step=g)) for n, g in hf_graphs.items()
                       if g is not None and any(r["variant"] == n and r["tokens_equal"] for r in hf_checks)})
    if HF_STATIC not in variant_errors and (HF_STATIC, BATCHES[0]) in setup:
        hf_runners[HF_STATIC] = lambda: hf_generate(hf_model, hx, NEW_TOKENS, cache_implementation="static")
hf_windows = []
for w in range(WINDOWS if len(hf_runners) > 1 else 0):
    started = time.perf_counter()
    hf_windows.append(safe_compare(hf_runners, HF_CASE, floor=False, calls=1))
    print(f"window {w + 1}/{WINDOWS} ({elapsed():.0f} s since the start): {window_line(hf_windows[-1])}")
    if w < WINDOWS - 1:
        pause_after(started)
hf_df = combine(hf_windows)
if len(hf_df):
    hf_df["batch"] = BATCHES[0]
    hf_df["us_per_token"] = hf_df.median_us / NEW_TOKENS
    print(hf_df[["variant", "executed_as", "us_per_token", "speedup", "speedup_lo", "speedup_hi"]].to_string(
        index=False, float_format=lambda v: f"{v:.1f}"))
speedup_claim("hf_kit_graph_beats_eager", hf_df, HF_CASE, HF_KIT)
faster_claim("hf_fused_graph_beats_kit_graph", hf_windows, HF_CASE, fast=HF_FUSED, slow=HF_KIT)
faster_claim("hf_fused_graph_beats_hf_static_generate", hf_windows, HF_CASE, fast=HF_FUSED, slow=HF_STATIC)

# %% [markdown]
# ## 14. The batch-16 question: which kernels does a decode step run at each batch size?
#
# In the recorded runs a decode step at batch 16 kept the GPU busy longer than one at batch 64 (the floors of
# section 7), on an H200 and on an H100. `scripts/probe_decode_kernels.py` profiled this notebook's decode step
# (eager and the kit's graph, float32 as here) at batch 1, 8, 16, 32 and 64 and saved each batch's top kernels to
# `figures/08_decode_kernels/`. The cell below reads that table: the matrix-multiply kernel that cuBLAS picks
# changes with the batch size, and at batch 8 and 16 its choice (a different tile shape) takes longer than the one it
# picks for 32 and 64. Eager and the graph run the same kernel at every batch: the graph replays what eager
# launched, so this is cuBLAS's heuristic for these shapes, not the kit. Padding a batch of 16 up to a bucket of
# 32 is one way around it, which `plan_buckets` (notebook 06) can find from measured costs.

# %%
import re  # noqa: E402


def matmul_kernel(name: str) -> str:
    """A cuBLAS kernel's family and tile shape, e.g. 'gemm 32x128x8' (the full names run to 200 characters)."""
    tile = re.search(r"tilesize(\d+x\d+x\d+)", name)
    return ("gemv" if "gemv" in name else "gemm") + (f" {tile.group(1)}" if tile else "")


KERNELS_DIR = (results.recorded_root() or Path("figures")) / "08_decode_kernels"
if (KERNELS_DIR / "decode_kernels.csv").is_file():
    kernels = pd.read_csv(KERNELS_DIR / "decode_kernels.csv")
    steps = pd.read_csv(KERNELS_DIR / "decode_steps.csv")
    gemm = kernels[kernels.name.str.contains("gemm|gemv", case=False)].copy()
    gemm["kernel"] = gemm.name.map(matmul_kernel)
    top = gemm.sort_values("total_us", ascending=False).groupby(["variant", "batch"]).head(1)
    table = top.merge(steps, on=["variant", "batch"]).sort_values(["batch", "variant"])
    print(table[["batch", "variant", "kernel", "total_us", "busy_us"]].rename(columns={
        "total_us": "top matmul µs/step", "busy_us": "GPU busy µs/step"}).to_string(
        index=False, float_format=lambda v: f"{v:.1f}"))
    graph_rows = table[table.variant == "graph"].set_index("batch")
    slow, fast = graph_rows.busy_us.idxmax(), graph_rows.busy_us[graph_rows.index > graph_rows.busy_us.idxmax()]
    if len(fast):
        fast = fast.idxmin()
        same = (table.groupby("batch").kernel.nunique() == 1).all()
        print(f"\nBatch {slow} keeps the GPU busy {graph_rows.busy_us[slow]:.0f} µs per step and batch {fast} "
              f"{graph_rows.busy_us[fast]:.0f} µs; their top matmul kernels are {graph_rows.kernel[slow]} "
              f"({graph_rows.total_us[slow]:.0f} µs) and {graph_rows.kernel[fast]} ({graph_rows.total_us[fast]:.0f} µs). "
              f"Eager and the graph run {'the same' if same else 'different'} top kernels at each batch.")
else:
    print(f"not recorded ({KERNELS_DIR / 'decode_kernels.csv'} is missing): on a GPU, run\n"
          "    python scripts/probe_decode_kernels.py --out figures/08_decode_kernels")

# %% [markdown]
# ## 15. The picture
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
    if len(serve_df):
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
# ## 16. Save the results
#
# One row per (case, variant) of the step, generation, prefill and serving comparisons, the correctness checks
# (`case` "correctness"), the capture log (`case` "capture") and the variants that failed (`case` "errors"), with
# the machine in `env.json` and every verdict of this run in `claims.csv` (columns claim, statement, verdict, lo,
# hi, above). A run without CUDA writes to `build/figures/` instead.

# %%
device_name = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
error_rows = [{"case": "errors", "variant": v, "median_us": float("nan"), "speedup": float("nan"), "error": e}
              for v, e in variant_errors.items()]
if error_rows:
    print(pd.DataFrame(error_rows)[["variant", "error"]].to_string(index=False))
check_out = checks.assign(case="correctness", median_us=float("nan"), speedup=float("nan")) if len(checks) else None
hf_out = pd.DataFrame(hf_checks).assign(case="hf correctness", median_us=float("nan"), speedup=float("nan"))
frames = [f for f in (step_df, gen_df, prefill_df, serve_df, pd.DataFrame(capture_rows), check_out, setup_df, k_checks,
                      k_df, hf_out if len(hf_checks) else None, hf_df, pd.DataFrame(error_rows))
          if f is not None and len(f)]
all_rows = pd.concat(frames, ignore_index=True)
all_rows["device"] = device_name
extra = {"config": vars(CFG), "dtype": str(DT), "batches": BATCHES, "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
         "serve_steps": SERVE_STEPS, "max_batch": MAX_BATCH, "seed": SEED, "transformers": HF_VERSION,
         "nocache_parity": nocache_parity, "hf_logit_diff": hf_diff if hf_model is not None else None,
         "planned_buckets": plan.sizes, "ladder": LADDER, "variant_errors": variant_errors,
         "eager_kernels_per_step": eager_profile.kernels if eager_profile is not None else None,
         "k_steps": list(K_STEPS), "k_batches": K_BATCHES, "hf_write_position": (hf_dec.behaviour.describe()
                                                                               if hf_dec is not None else None),
         "seconds": round(elapsed(), 1)}
folder = results.save(STEM, all_rows, figures={"decode": fig}, extra_env=extra)
save_claims(folder, claims)
print("saved to", folder, f"(results.csv, env.json, claims.csv, decode.png; {elapsed():.0f} s since the start)")
print(f"\nThe {len(claims)} verdicts of this run" + ("" if CUDA else " (CPU, eager only: not GPU results)") + ":")
for c in claims:
    print(f"  [{c.verdict}] {c.statement}")

# %% [markdown]
# ## 17. Recorded GPU results
# The table and figure of the last GPU run committed to this repository (what a reader without a GPU sees).

# %%
recorded = results.show_recorded(STEM, columns=["case", "variant", "executed_as", "batch", "median_us", "speedup",
                                                 "us_per_token", "us_per_step", "tokens_per_s", "floor_step_us",
                                                 "first_call_s", "graphs", "held_mib", "error"])

# %% [markdown]
# ## Summary
#
# - Decoding runs the whole model for one token per sequence: many tiny kernels, about as many at every batch
#   size (section 3 counts them). Eager, the host's launches can set the time per token; section 7 compares eager's time per step
#   with the floor, what the GPU itself needs, and prints whether eager decoding was host-bound here.
# - A **static KV cache** (allocated once, per-row positions, a mask over all positions) fixes every shape, so a
#   decode step can be captured. Check it before anything else: the same greedy tokens as decoding with no cache.
# - The kit's `capture_buckets` captures the step once per batch bucket in one shared pool; padding rows land in
#   unused cache rows, so a bucket serves every smaller batch. Capturing runs the step and records it, no
#   compiler involved: section 4 prints the capture time, section 8 every variant's first call, compile included.
# - `torch.compile(mode="reduce-overhead")` and `transformers`' static-cache `generate` do the same for you;
#   Inductor also fuses kernels (section 7's `kernels_per_call`), at the price of compiling and one recording per
#   new batch size. Sections 7 and 8 print, batch by batch, which of them is faster, or "no clear difference".
# - Prefill gives every kernel `batch x prompt` rows of work, so launches weigh less in its time than in a decode
#   step's; section 9 prints what a graph bought it here, next to what it bought a decode step.
# - In a serving loop the batch size changes at every step; a handful of buckets serves them all. Plan them from
#   the sizes you observe, and measure: section 10 prints whether the planned buckets beat the ladder and whether
#   the ladder beat one graph per batch size on this GPU.
# - Fusion and graphs are separate tools: a graph removes launches, not kernels; fusion removes kernels, not
#   launches. The step compiled without graphs and captured by the kit has both, like `reduce-overhead`, and skips
#   its per-call checks. In the recorded H100 run the two took the same time: both ran the same fused kernels
#   close to the GPU-busy floor, where the host's work per call is hidden behind the GPU's (section 11).
# - Several tokens per replay: K decode steps in one graph, the argmax and the stop token handled on the GPU and
#   the host reading the done flags once per block; section 12 prints, for each K and batch, whether it beat one
#   graph per token. In the recorded H100 run the gain was small or unclear, since a one-step replay already
#   keeps the GPU busy.
# - Your own `transformers` model: a `StaticCache`, a step of tensors only, and a reset of the cache's write
#   position before each sequence (5.x keeps it on the GPU and advances it at every replay); section 13 checks the
#   tokens and times it against `generate`'s own static-cache path.
# - Quote a speedup with the interval a rerun lands in (several timing windows), and let the verdict, not the
#   median, decide a comparison: `claims.csv` holds every verdict of this run.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say so
# (⏸); on a CPU the buckets run eagerly, padding and slicing exactly as graphs do.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb08_llm_decode.py` (try
# first).

# %%
from cudagraph_kit.course.exercises_08 import TIE_WHY, check_decode_buckets, check_k_step_decode, check_low_precision_ties

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
# Serving usually runs in bfloat16. Build the same model in bfloat16 (`TinyLLM(CFG, seed=SEED, device=DEVICE,
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

# %% [markdown]
# ### Exercise 3: four tokens per replay, stopping on the GPU
# Write `k4_block(tokens, pos, done, stop)` yourself: four greedy steps of `decode_step`, each step's argmax the
# next step's token, rows already done emitting `PAD`, `done` set where the stop token came out; update the four
# state tensors **in place** and return the four tokens, (b, 4). Capture it with the kit (`capture(fresh_cublas(
# k4_block), *decode_state(torch.zeros(b, dtype=torch.long, device=DEVICE), 0), warmup=2, eager_fallback=True)`),
# then decode the prompts below: prefill, `load_state(k4_graph.static_inputs, decode_state(first, PROMPT_LEN,
# EX3_STOP))`, `generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)`. Why must the
# updates be in place?

# %%
ex3_prompt = kx[:K_BATCHES[-1]]
EX3_STOP = mid_block_stop(greedy_generate(model, cache, ex3_prompt, NEW_TOKENS), 4)[0]   # stops inside a block
k4_block = ...     # def k4_block(tokens, pos, done, stop): ... four steps of decode_step, in place
k4_graph = ...     # capture(fresh_cublas(k4_block), *decode_state(...zeros..., 0), warmup=2, eager_fallback=True)
k4_tokens = ...    # generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)

# %%
check_k_step_decode(k4_block, k4_graph, k4_tokens, model=model, cache=cache, prompt=ex3_prompt, stop_token=EX3_STOP,
                    new_tokens=NEW_TOKENS, pad_token=PAD)
