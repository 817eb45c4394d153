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
# A language model generates text one token at a time, and each token runs the whole model on one position per
# sequence: many small kernels, each launched from Python, for very little GPU work. A CUDA graph removes those
# launches, but it replays fixed shapes, while a [KV cache](../docs/GLOSSARY.md) (each layer's keys and values of
# the positions so far, kept so that a new token attends to them without recomputing them) grows by one position per
# token and so changes shape at every step. A **static KV cache**, allocated once for a maximum length and masked,
# keeps every shape fixed; then one graph per batch size replays every decode step. This notebook builds a small
# LLaMA-style model with random weights (nothing is downloaded), captures its decode step once per batch bucket with
# the kit, and sets it beside eager decoding, `torch.compile(mode="reduce-overhead")` and `transformers`' `generate`
# on the same weights.
#
# **What you'll learn**
# - How a static KV cache makes the decode step capturable, and how to check it first: the same greedy tokens as
#   decoding without any cache.
# - Why [decoding](../docs/GLOSSARY.md) can be host-bound, and what a graph buys a decode step next to [prefill](../docs/GLOSSARY.md) (the prompt).
# - How a few graphs in one shared memory pool serve every batch size.
# - What the kit's graphs, `reduce-overhead` and `transformers`' static-cache `generate` each cost and buy.
#
# "Going further" adds a serving loop whose batch size changes every step, fusion against graphs, several tokens
# per replay, and your own `transformers` model.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU); `transformers` for its rows
# (skipped, with a message, when it is missing). Without a GPU the notebook runs its CPU part small (the
# correctness checks, everything eager, labelled so) and shows the recorded GPU results.
#
# **How long**: 2.8 min on an NVIDIA H200 (measured by `reproduce`, 2026-11-29), part of it compiling
# (section 6's first-call seconds and the setup table of "Going further" B give the compile times). A T4 has
# not been timed yet; under a minute on a CPU (small sizes).

# %% tags=["nbval-check-output"]
# Setup. In a fresh Colab runtime: clone the kit at REPO_REF once (with its recorded GPU results) and install that
# clone; `setup` then checks it (elsewhere it uses this checkout, silently) and says what to do if something is off.
import importlib.util, os, subprocess, sys
from pathlib import Path
REPO_URL, REPO_REF = "https://github.com/cudagraph-kit/cudagraph-kit", "main"
if "google.colab" in sys.modules and importlib.util.find_spec("cudagraph_kit") is None:
    # If this fails: REPO_REF must name a branch or tag of REPO_URL, and the runtime needs internet access.
    subprocess.run(f"git clone -q --depth 1 -b {REPO_REF} {REPO_URL} cudagraph-kit && {sys.executable} -m pip install -q --no-deps ./cudagraph-kit", shell=True, check=True)
checkout = importlib.import_module("cudagraph_kit.course.running.setup_notebook").setup(REPO_URL, REPO_REF)


# %% tags=["parameters", "nbval-check-output"]
SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)
BATCHES = None        # decode batch sizes timed (None: 1, 4, 16, 64 on a GPU; 1, 4 in SMOKE or on a CPU)
PROMPT_LEN = 16       # prompt tokens per sequence
NEW_TOKENS = None     # tokens generated per sequence in a timed generation (None: 32 on a GPU; 6 small)
DTYPE = "float32"     # model dtype on a GPU ("bfloat16" is what serving uses: see exercise 2); float32 on a CPU
SERVE_STEPS = None    # decode steps of the serving loop (None: 80 on a GPU; 30 small)
SAMPLES = None        # timing rounds per variant in each window; medians reported (None: 2)
WINDOWS = 8           # timing windows of every comparison (SMOKE: 2): the speedup intervals come from them
GEN_WINDOWS = 4       # ... of those that time whole generations (section 8; Going further C, D): 10-200 ms a call
WINDOW_PAUSE_S = 0.5  # pause between two windows
COMPILE = True        # torch.compile(mode="reduce-overhead") of the decode step (GPU only)
HF = True             # transformers' generate on the same weights (skipped, with a message, if not installed)
TIME_BUDGET_S = 300   # once the notebook has run this long, variants that still need compiling are skipped (said so)
K_STEPS = (1, 2, 4, 8)  # decode steps per graph replay (Going further C)
SEED = 0

# %% tags=["nbval-check-output"]
import time
from functools import partial

import pandas as pd
import torch

from cudagraph_kit import MemoryLedger, capture, capture_buckets, env_table, gpu_time, has_cuda, ladder
from cudagraph_kit.graphed import fresh_cublas_workspace
from cudagraph_kit.course.lessons.decode import (attempt, check_row, compile_then_capture, first_calls,
                                                 positions_needed, recorded_reading, reduce_overhead_step,
                                                 report_checks, show_floors)
from cudagraph_kit.course.lessons.hf_decode import hf_status
from cudagraph_kit.course.lessons.tiny_llm import (StaticKVCache, TinyConfig, TinyLLM, greedy_generate,
                                                   greedy_generate_no_cache, hf_generate, to_hf_llama)
from cudagraph_kit.course.measuring import results
from cudagraph_kit.course.measuring.measure import Runs, measure, per_batch, profiled_mode, step_mode
from cudagraph_kit.course.measuring.verdicts import generation_claims, step_claims

# %%
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
GEN_BATCHES = sorted({BATCHES[0], MAX_BATCH})   # whole generations are timed at the smallest and largest batch
NEW_TOKENS = NEW_TOKENS or (6 if small else 32)
SERVE_STEPS = SERVE_STEPS or (30 if small else 80)
SAMPLES = SAMPLES or 2
if small:
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
TIMING = dict(windows=WINDOWS, samples=SAMPLES, pause_s=WINDOW_PAUSE_S)   # every measure() of this notebook
GEN_TIMING = dict(TIMING, windows=min(WINDOWS, GEN_WINDOWS), floor=False)  # whole generations: no profiler
COMPILE = COMPILE and CUDA
DT = getattr(torch, DTYPE) if CUDA else torch.float32
CFG = (TinyConfig(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, hidden=176) if small
       else TinyConfig(vocab_size=8192, dim=512, layers=4, heads=8, kv_heads=2, hidden=1408))
MAX_GEN = 8 if small else 64          # longest request of the serving loop (tokens)
MAX_LEN = max(positions_needed(PROMPT_LEN, NEW_TOKENS, max(K_STEPS)), MAX_GEN + 1)   # K-step blocks write whole
torch.manual_seed(SEED)
torch.set_grad_enabled(False)   # inference throughout
if not CUDA:
    torch.set_num_threads(1)    # tiny CPU work: one thread is faster than several competing for a small machine
HF_VERSION, HF_WHY = hf_status()   # the transformers version, or None and why (missing, too old)
HF = HF and HF_VERSION is not None
elapsed = lambda: time.perf_counter() - T_START  # noqa: E731  (seconds since the start)

print(env_table())
print(f"\nSMOKE={SMOKE}  BATCHES={BATCHES}  PROMPT_LEN={PROMPT_LEN}  NEW_TOKENS={NEW_TOKENS}  dtype={DT}  "
      f"SERVE_STEPS={SERVE_STEPS}  SAMPLES={SAMPLES} x WINDOWS={WINDOWS}  COMPILE={COMPILE}  transformers={HF_VERSION}")
if not CUDA:
    print("\n>>> No CUDA GPU here: CUDA graphs need an NVIDIA GPU. This run checks the decoding on the CPU, small, runs\n"
          ">>> every 'graph' eagerly ('eager fallback'), skips torch.compile; the recorded GPU results are at the end.")

# %% [markdown]
# ## 1. A small LLaMA-style model and a static KV cache
#
# `cudagraph_kit/course/lessons/tiny_llm.py` holds the model, a small LLaMA (RMSNorm, rotary attention, a SwiGLU MLP) with
# random weights drawn from a seed, named as in `transformers`' `LlamaForCausalLM`, which section 5 uses.
#
# The **static KV cache** holds keys and values for `MAX_BATCH` rows of `MAX_LEN` positions, allocated once. A
# decode step takes one token and one position per row, writes that row's key and value at its position (an
# indexed write on the GPU, no host synchronization) and attends over all `MAX_LEN` positions with a mask
# `key position <= pos`. Its shapes depend on the batch size alone.

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
# The reference recomputes the whole sequence for every new token, with no cache. Greedy decoding with the static
# cache (prefill the prompt, then one decode step per token) must pick the same tokens, with logits equal up to
# rounding. A token may differ only at a near tie (`near_tie`): eager's two best logits were so close that
# rounding could swap them.

# %%
parity = []
for b in BATCHES:
    ref_l, cached_l = [], []
    ref = greedy_generate_no_cache(model, prompts[b], NEW_TOKENS, logits_out=ref_l)
    cached = greedy_generate(model, cache, prompts[b], NEW_TOKENS, logits_out=cached_l)
    parity.append(check_row("static cache", cached, cached_l, ref, ref_l, batch=b))
parity = pd.DataFrame(parity).assign(case="no-cache parity")
print(parity[["batch", "tokens_equal", "max_logit_diff", "near_tie"]].to_string(index=False))
assert (parity.tokens_equal | parity.near_tie).all(), "the static cache decodes differently from no cache"


# %% [markdown]
# ## 3. Why decoding can be host-bound
#
# A decode step launches many small kernels, about as many at every batch size. As long as the GPU finishes each
# kernel sooner than the CPU issues the next (Python, PyTorch's dispatcher, the launch itself), the CPU sets the
# time per token. The profiler counts the kernels at batch 1 (without a GPU, the recorded run's count; "Going
# further" B counts the graphed variants at every batch size); section 7 sets eager's step against the GPU's busy
# time.

# %%
step_inputs = {b: (torch.randint(0, CFG.vocab_size, (b,), generator=gen).to(DEVICE),
                   torch.full((b,), PROMPT_LEN, dtype=torch.long, device=DEVICE)) for b in BATCHES}
eager_profile = gpu_time(decode_step, *step_inputs[BATCHES[0]], calls=5) if CUDA else None
if eager_profile is not None:
    print(f"one eager decode step at batch {BATCHES[0]} launched {eager_profile.kernels:.0f} kernels and "
          f"{eager_profile.copies:.0f} copies/fills, one by one")
else:   # the profiler's CUDA activity needs a GPU: the recorded GPU run's count, labelled
    print("No GPU here: nothing to count.", recorded_reading(STEM, "kernels", batch=BATCHES[0]))

# %% [markdown]
# ## 4. One graph per batch bucket, in one shared pool
#
# `capture_buckets(decode_step, tokens, pos, sizes=...)` captures the decode step once per bucket size. A call
# copies the tokens and positions into static buffers, pads them up to the bucket (the padding rows write into
# cache rows no sequence uses), replays, and returns the real rows' logits. The cache lives outside the graphs,
# which read and write it in place: it must never be reallocated. The sizes are `ladder(MAX_BATCH)`: 1, 2, 4,
# then steps of 8, the pattern vLLM captures by default. The buckets share one memory pool, captured largest
# first, so every smaller graph reuses the largest one's memory ("Going further" A measures what a set holds).
#
# **One pitfall.** A matrix multiply runs in cuBLAS, with a [*workspace*](../docs/GLOSSARY.md) that PyTorch
# allocates once per stream; a graph bakes its address in. `reduce-overhead` (section 5) frees those workspaces
# whenever it records a graph, and a graph captured earlier would then write into memory that other tensors now
# use. `fresh_cublas_workspace(fn)` gives each capture of `fn` a workspace of its own, inside the graph's pool.

# %%
graph_step = fresh_cublas_workspace(decode_step)
ledger = MemoryLedger()
LADDER = ladder(MAX_BATCH)
sample_tokens = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
sample_pos = torch.zeros(MAX_BATCH, dtype=torch.long, device=DEVICE)
graphs = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=LADDER, eager_fallback=True)
kit_held = ledger.record("kit buckets", graphs).get("held", float("nan")) / MiB   # pool + static buffers
print(graphs)
if CUDA:
    print(f"{len(LADDER)} graphs captured in {graphs.capture_seconds:.2f} s; they hold {kit_held:.1f} MiB (shared "
          "pool + static buffers)")
else:   # the recorded GPU run's capture, labelled
    print("No GPU here: nothing captured; every bucket runs eagerly, padded and sliced exactly as the graphs would.\n"
          + recorded_reading(STEM, "capture"))

# a padded request: 3 rows served by the 4-row bucket give the same logits as eager
t3, p3 = step_inputs[MAX_BATCH][0][:3], step_inputs[MAX_BATCH][1][:3]
padded_err = (graphs(t3, p3).float() - decode_step(t3, p3).float()).abs().max().item()
print(f"3 rows padded to bucket {graphs.bucket_for(3)}: max |bucketed - eager| logits {padded_err:.1e}")
assert padded_err < 1e-3

# %% [markdown]
# ## 5. What people use today
#
# - **`torch.compile(mode="reduce-overhead")`** of the same decode step: [Inductor](../docs/GLOSSARY.md) [fuses](../docs/GLOSSARY.md) the small kernels and
#   records a CUDA graph per batch size it meets. The cache buffers are marked as static addresses
#   (`torch._dynamo.mark_static_address`), as `transformers` does, so the graphs may write them in place. A batch
#   size it has not seen costs a compile or a recording.
# - **`transformers`' `generate`** on a `LlamaForCausalLM` with a copy of the same weights:
#   `cache_implementation="static"` allocates a static cache, and on a GPU `generate` then compiles the decoding
#   forward with `reduce-overhead` by itself ("Going further" D says when). Its default dynamic cache (eager) is
#   timed too.
# - **compile + kit graphs**: the decode step compiled in the default mode (fused kernels, no graphs), then
#   captured per bucket by `capture_buckets`, as the eager step was ("Going further" B says how to compile it so
#   that the capture compiles nothing more).
#
# Each variant is tried on its own; one that fails becomes a row with its error, and the others go on. Inductor's
# warning that TensorFloat32 tensor cores are "available but not enabled" is expected: the course keeps PyTorch's
# full float32 matrix multiplies, so every variant compares with eager at float32 rounding.

# %%
variant_errors = {}
attempt = partial(attempt, errors=variant_errors)   # a variant that fails is reported in the tables; the rest go on
compiled_step, fused_graphs, fused_setup = None, None, {}
if COMPILE:
    compiled_step = attempt("reduce-overhead", lambda: reduce_overhead_step(decode_step, cache))
    fused_graphs = attempt("compile + kit graphs", lambda: compile_then_capture(
        model, cache, sample_tokens, sample_pos, LADDER, ledger, fused_setup))   # fused_setup: its setup costs
if fused_graphs is not None:
    print(f"compile + kit graphs: {fused_setup['compiles']} compiles in {fused_setup['compile_s']:.1f} s; "
          f"{len(LADDER)} buckets captured in {fused_setup['capture_s']:.2f} s, with "
          f"{fused_setup['compiles_in_capture']} compiles during the capture")
elif not COMPILE:
    print("reduce-overhead, compile + kit graphs: skipped (" + ("needs a CUDA GPU)" if not CUDA else "COMPILE=False)"))

hf_model = attempt("transformers", lambda: to_hf_llama(model, max_position_embeddings=max(4096, MAX_LEN))) if HF else None
if hf_model is not None:
    x = prompts[MAX_BATCH]
    hf_diff = (hf_model(x).logits.float() - model(x).float()).abs().max().item()
    print(f"transformers {HF_VERSION}: LlamaForCausalLM with our weights; max |logit diff| on the prompts {hf_diff:.1e}")
elif not HF:
    print("transformers: skipped (" + (f"{HF_WHY})" if HF_VERSION is None else "HF=False)"))

# %%
KIT_STEP, KIT_GEN = "kit graph (bucket)", "kit graph per bucket"
FUSED_GEN, FUSED_STEP = "compile + kit graph per bucket", "compile + kit graph (bucket)"
HF_STATIC = "transformers generate, static cache"   # section 8 adds what it ran as, once profiled
HF_DYNAMIC = "transformers generate, dynamic cache"
STEPS = {"eager": None, KIT_GEN: graphs, "reduce-overhead": compiled_step, FUSED_GEN: fused_graphs}
VARIANTS = [v for v, s in STEPS.items() if v in ("eager", KIT_GEN) or s is not None]
VARIANTS += [HF_STATIC, HF_DYNAMIC] if hf_model is not None else []
NEEDS_COMPILE = {"reduce-overhead", HF_STATIC} if CUDA else set()


def generate(label, b, logits_out=None):
    """NEW_TOKENS greedy tokens for prompts[b] with variant `label` (every one on the same model and weights)."""
    if label.startswith("transformers"):
        impl = "static" if "static" in label else None
        return hf_generate(hf_model, prompts[b], NEW_TOKENS, cache_implementation=impl, logits_out=logits_out)
    return greedy_generate(model, cache, prompts[b], NEW_TOKENS, step=STEPS[label], logits_out=logits_out)


# %% [markdown]
# ## 6. Correctness of every variant, against eager
#
# Each variant generates `NEW_TOKENS` greedy tokens for the same prompts at every batch size; its first call at a
# batch size also pays for its compile or recording (its first-call seconds, printed below). Identical tokens pass, and so
# do tokens that part at a near tie: the variant's logits moved by `logit_diff`, at least eager's gap between its
# two best logits there (`margin`), because other kernels sum in another order. Anything else is a bug, and the
# cell lists it.

# %%
eager_ref = {}
for b in BATCHES:
    lg = []
    eager_ref[b] = generate("eager", b, lg), lg
if CUDA:
    torch.cuda.empty_cache()   # so that what reduce-overhead's first calls add to the graph pools is all theirs
check_rows, setup, pool_growth = first_calls(
    VARIANTS, BATCHES, generate, eager_ref, variant_errors, ledger,
    skip=lambda label, b: (label in NEEDS_COMPILE and elapsed() > TIME_BUDGET_S and f"skipped: the notebook had "
                           f"run {elapsed():.0f} s before its compile at batch {b} (TIME_BUDGET_S={TIME_BUDGET_S})"))
checks = pd.DataFrame(check_rows)   # every column is saved with the results (case "correctness")
unexplained = checks[~checks.tokens_equal & ~checks.near_tie]   # other tokens than eager's, not at a near tie: a bug
report_checks(checks, unexplained, variant_errors)   # the verdict, each first call (s), any bug, any error

# %% [markdown]
# ## 7. Time per decode step, and what a graph buys prefill
#
# The decode step alone at each batch size: eager, the kit's graph for that bucket, `reduce-overhead`, and
# compile + kit graph. A step makes one token per sequence, so its time is the time per token each sequence sees.
# **Prefill** runs the whole prompt at once: about as many kernels, each with `batch x prompt` rows of work, so
# launches weigh less. One case times it at the largest batch with a longer prompt (its name gives the size):
# eager against a graph of the prefill, the row named `graph`.
#
# `measure` times every case in `WINDOWS` windows, the variants of a case taking turns in each, and quotes each
# speedup with a 90% **prediction interval**: where one more window should land. The **floor** of a batch size is
# the GPU-busy time of one replay of the kit's graph (`gpu_time`): how fast a step could go if the host cost
# nothing. Eager is host-bound where its step takes more than twice the floor.
#
# Below: the floors, each variant's median time per case, a chart of the speedups with their intervals, and five
# verdicts. At batch 1: the graph against eager, eager against its floor, `reduce-overhead` against the graph, and
# compile + kit graph against `reduce-overhead` (the aim: more than 5% faster). At the largest batch: does a graph
# buy a decode step more than it buys prefill? The other verdicts (other batch sizes, prefill alone) are in
# `claims.csv`.
#
# If batch 16's floor is above batch 64's, the cause is the matrix-multiply kernel that cuBLAS picks for each
# shape, not the graph: the appendix lists the kernels.

# %%
PREFILL_LEN = min(8 * PROMPT_LEN, MAX_LEN)
PREFILL_CASE = f"prefill, {MAX_BATCH} x {PREFILL_LEN} tokens"
long_prompt = torch.randint(0, CFG.vocab_size, (MAX_BATCH, PREFILL_LEN), generator=gen).to(DEVICE)
prefill_graph = capture(fresh_cublas_workspace(lambda x: model.prefill(x, cache)), long_prompt, eager_fallback=True)
err = (prefill_graph(long_prompt).float() - model.prefill(long_prompt, cache).float()).abs().max().item()
print(f"prefill graph == eager: max |logit diff| {err:.1e}")

STEP_CASE, B1 = {b: f"decode step, batch {b}" for b in BATCHES}, BATCHES[0]
step_cases = {}
for b in BATCHES:
    timed = {"eager": decode_step, KIT_STEP: graphs}   # the BucketedGraphs itself: compare reads its mode
    if ("reduce-overhead", b) in setup:
        timed["reduce-overhead"] = compiled_step
    if (FUSED_GEN, b) in setup:
        timed[FUSED_STEP] = fused_graphs
    step_cases[STEP_CASE[b]] = (timed, step_inputs[b])
step_cases[PREFILL_CASE] = ({"eager": lambda x: model.prefill(x, cache), "graph": prefill_graph}, (long_prompt,))
m_step = measure(step_cases, **TIMING)
floors = {b: gpu_time(graphs.graphs[b].replay, calls=20).busy_us for b in BATCHES if CUDA and b in graphs.graphs}
show_floors(floors, STEM)   # without a GPU: the recorded GPU run's floors, labelled
claims = m_step.claims = step_claims(m_step, STEP_CASE, step_cases, floors, PREFILL_CASE, KIT_STEP, FUSED_STEP,
                                     not CUDA)
step_df = per_batch(m_step, STEP_CASE)             # the rows of the decode steps: tokens_per_s = batch / step time
step_df = step_df[step_df.case != PREFILL_CASE].assign(us_per_step=lambda d: d.median_us)
results.show(m_step, STEM, step_claims, figure=True, table="times",   # without a GPU: the recorded GPU run's
             headlines=[f"step_graph_beats_eager_b{B1}", f"step_eager_host_bound_b{B1}",
                        f"step_reduce_overhead_beats_graph_b{B1}", f"step_fused_graph_beats_reduce_overhead_b{B1}",
                        "decode_gains_more_than_prefill"])

# %% [markdown]
# ## 8. Whole generations, side by side
#
# One greedy generation (prefill and `NEW_TOKENS` tokens) per variant, `transformers`' included, at the smallest
# and the largest batch size. A profiled call labels the static-cache `generate` "(compiled: CUDA graphs)", or
# "(ran eagerly)" where it launched no graph: `generate` graphs its decoding forward only; its prefill and its
# Python loop run outside. The verdicts: do the kit's graphs beat eager; then, at the smallest batch, does
# `reduce-overhead` beat them, do they beat the static-cache `generate`, and does that beat the default dynamic
# cache?

# %%
GEN_CASE = {b: f"generate, batch {b}" for b in GEN_BATCHES}
HF_STATIC_MODE = profiled_mode(lambda: generate(HF_STATIC, BATCHES[0])) if (HF_STATIC, BATCHES[0]) in setup else "eager"
HF_STATIC_RAN = HF_STATIC + ((" (compiled: CUDA graphs)" if HF_STATIC_MODE == "graph" else " (ran eagerly)") if CUDA else "")
gen_modes = {b: {"eager": "eager", HF_DYNAMIC: "eager", HF_STATIC: HF_STATIC_MODE, KIT_GEN: graphs,
                 FUSED_GEN: fused_graphs, "reduce-overhead": step_mode(m_step, STEP_CASE[b], "reduce-overhead")}
             for b in GEN_BATCHES}
gen_cases = {GEN_CASE[b]: ({HF_STATIC_RAN if v == HF_STATIC else v: Runs(lambda v=v, b=b: generate(v, b), gen_modes[b][v])
                            for v in VARIANTS if (v, b) in setup}, (), {"calls": 1}) for b in GEN_BATCHES}
m_gen = measure(gen_cases, **GEN_TIMING)   # "ran as": the step's profiled rows (section 7), not a profiler here
claims = claims + generation_claims(m_gen, GEN_CASE, gen_cases, KIT_GEN, HF_STATIC_RAN, HF_DYNAMIC)
m_gen.claims = claims[len(m_step.claims):]
gen_df = per_batch(m_gen, GEN_CASE, NEW_TOKENS).assign(us_per_token=lambda d: d.median_us / NEW_TOKENS)
# without a GPU the rows and verdicts shown are the recorded GPU run's, whose largest batch is 64
results.show(m_gen, STEM, generation_claims, figure=True, table="times",
             headlines=[f"generate_graphs_beat_eager_b{B1}", f"generate_graphs_beat_eager_b{MAX_BATCH if CUDA else 64}",
                        f"generate_reduce_overhead_beats_graphs_b{B1}",
                        f"generate_graphs_beat_hf_static_b{B1}", f"generate_hf_static_beats_hf_dynamic_b{B1}"])

# %% [markdown]
# ## 9. Takeaways
# Numbered from this run on a GPU; without one, from the recorded GPU run (named above them). A takeaway whose
# comparison this run could not make (no compiler, no `transformers`) is left out.

# %%
TAKEAWAYS = [
    "A decode step is many tiny kernels, so eager decoding is host-bound: at batch 1 an eager step took "
    "{step_eager_host_bound_b1} the GPU's busy time, and the kit's graph of it was {step_graph_beats_eager_b1} "
    "faster than eager.",
    "A static KV cache fixes every shape, so a few graphs, one per batch bucket, serve every batch size: whole "
    "generations at batch 64 ran {generate_graphs_beat_eager_b64} faster than eager.",
    "`reduce-overhead` graphs a compiled step, whose kernels Inductor fused: at batch 1 its step was "
    "{step_reduce_overhead_beats_graph_b1} faster than the kit's graph of the eager step.",
    "A graph buys a decode step more than it buys prefill, whose kernels each have far more work: "
    "{decode_gains_more_than_prefill:statement}.",
]
results.show_takeaways(STEM, claims, TAKEAWAYS, missing="skip");

# %% [markdown]
# ## Going further (optional)
# Further experiments and internals: a serving loop whose batch size changes every step, fusion against graphs,
# several tokens per replay, your own `transformers` model; then the picture, saving the results, and every
# headline verdict. The exercises follow.
#
# ### A. A serving loop: the batch size changes every step
#
# Serving engines use section 4's two ideas: decode graphs captured up front for a fixed list of batch sizes, a
# batch padded up to the next one, and one memory pool for all of them (vLLM's `cudagraph_capture_sizes` and its
# graph manager's one `graph_pool_handle()`; SGLang's `--cuda-graph-max-bs`). Their cache differs: vLLM keeps keys
# and values in a pool of fixed-size blocks shared by all sequences, each sequence with a table of its blocks that
# the attention kernel reads (PagedAttention), not a maximum-length cache per sequence as here; and it can capture
# a model piecewise, leaving attention outside the graphs (vLLM's "CUDA Graphs" design document).
#
# Here requests arrive at random (a seeded stream), each with a one-token prompt and a length drawn between 1 and
# `MAX_GEN` tokens; at most `MAX_BATCH` are decoded together, the rest wait. Every step decodes one token for
# every active request, so the batch size moves at every arrival and every finish. A finished request leaves a
# hole: the last row moves into it (its cache row too), so active requests always fill rows `0..n-1` and a
# bucket's padding rows are free rows. Tokens and positions stay on the GPU; the host only counts (the loop is
# `serve_stream` in `cudagraph_kit/course/lessons/workloads.py`).
#
# Strategies: eager; the kit's graphs on the vLLM-style ladder (`ladder(MAX_BATCH)`, the graphs of section 4);
# buckets **planned** by `plan_buckets` from the batch sizes of an earlier stream (another seed), with at most
# as many graphs as the ladder; and one graph per batch size. The planner minimises padded rows here. Whether
# padding rows cost much depends on how fast a decode step's time grows with the batch (section 7's table; the
# appendix explains why batch 16 can take longer than batch 64); what the number of graphs costs, on how the
# driver and the GPU handle many graphs. The verdicts: does each strategy beat eager, do the planned buckets beat
# the ladder, and does the ladder beat one graph per batch size?

# %%
import numpy as np

from cudagraph_kit import evaluate_buckets, plan_buckets
from cudagraph_kit.course.lessons.workloads import batch_sizes, make_stream, serve_stream, serve_table
from cudagraph_kit.course.measuring.claims import speedup, versus


def serve(step, stream, record=None):
    """Run a stream of requests through step(tokens, pos) on the shared cache; record: {request id: tokens}."""
    return serve_stream(step, stream, cache, MAX_BATCH, CFG.vocab_size, record=record)


stream = make_stream(SEED + 10, SERVE_STEPS, MAX_BATCH, MAX_GEN)
history = batch_sizes(make_stream(SEED + 11, 4 * SERVE_STEPS, MAX_BATCH, MAX_GEN), MAX_BATCH)   # an earlier day
observed = batch_sizes(stream, MAX_BATCH)
plan = plan_buckets(history, max_graphs=len(LADDER), max_size=MAX_BATCH)
print(f"stream: {len(observed)} decode steps, batch size median {np.median(observed):.0f}, range "
      f"{min(observed)}..{max(observed)}, {len(set(observed))} distinct sizes")
for name, sizes in (("vLLM-style ladder", LADDER), ("planned", plan.sizes)):
    print(f"{name} ({len(sizes)} graphs): {sizes}; on this stream "
          f"{evaluate_buckets(observed, sizes)['pad_fraction']:.1%} of the computed rows are padding")

# %%
LADDER_NAME, PLANNED_NAME, EXACT_NAME = "vLLM-style ladder of graphs", "planned set of graphs", "one graph per batch size"
strategies = {"eager": decode_step, LADDER_NAME: graphs}
for name, sizes in ((PLANNED_NAME, plan.sizes), (EXACT_NAME, list(range(1, MAX_BATCH + 1)))):
    strategies[name] = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=sizes, eager_fallback=True)
served = {name: {} for name in strategies}
for name, step in strategies.items():
    serve(step, stream, record=served[name])
same = {name: sum(served[name].get(r) == t for r, t in served["eager"].items()) / len(served["eager"])
        for name in strategies}
print("share of requests decoded exactly as eager:", same)
m_serve = measure({"serving loop": ({name: Runs(lambda s=s: serve(s, stream), "eager" if s is decode_step else s)
                                     for name, s in strategies.items()}, (), {"calls": 1})}, floor=False, **TIMING)
for cid, name in (("serving_ladder_beats_eager", LADDER_NAME), ("serving_planned_beats_eager", PLANNED_NAME),
                  ("serving_one_per_size_beats_eager", EXACT_NAME)):
    claims.append(speedup(m_serve, cid, "serving loop", name))
claims.append(versus(m_serve, "serving_planned_beats_ladder", ("serving loop", PLANNED_NAME), ("serving loop", LADDER_NAME)))
claims.append(versus(m_serve, "serving_ladder_beats_one_per_size", ("serving loop", LADDER_NAME),
                     ("serving loop", EXACT_NAME)))
sizes_of = {LADDER_NAME: LADDER, PLANNED_NAME: plan.sizes, EXACT_NAME: list(range(1, MAX_BATCH + 1)), "eager": []}
serve_df = serve_table(m_serve, strategies, sizes_of, observed, same, ledger)   # per step, graphs, memory, padding
serve_df[["variant", "executed_as", "us_per_step", "speedup", "speedup_lo", "speedup_hi", "graphs", "setup_s",
          "held_mib", "pad_fraction", "same_tokens_as_eager"]].round(3)

# %% [markdown]
# `held_mib` is the memory each set of graphs holds, as `MemoryLedger.record` reads it: the shared pool plus the
# static buffers. A set's buckets are captured largest first into one pool, so every smaller graph reuses the
# blocks of the largest one, and the static input and output buffers are sized for the largest bucket too: a set
# holds the memory of its largest bucket alone. All three sets end at the same largest batch size, so they hold
# the same memory, whatever their number of graphs; what grows with that number is the capture time (`setup_s`).
#
# ### B. Fusion and graphs are separate tools
#
# Sections 7 and 8 put four ways of running the same decode step side by side. The columns of this section's last
# table (section 7's timings with the profiler's counts) say what each one removed: `kernels_per_call` counts the
# kernels a step runs, `floor_us` is the GPU's busy time for one call (the time left when launching costs nothing),
# and `median_us` is what a step took. A CUDA graph removes the *launches* (the host's cost per kernel) but replays
# every kernel it captured: the kit's graph of the eager step runs all of eager's kernels (plus its input copies), so
# its floor is that of eager's kernels. Fusion (Inductor, `torch.compile`) removes *kernels*: fewer, larger kernels,
# so a lower floor, but each one is still launched from the host. `reduce-overhead` does both, and so does the fused
# step captured by the kit. What `reduce-overhead` adds on every call is bookkeeping, read in PyTorch's
# `torch/_inductor/cudagraph_trees.py`: Dynamo's guards for the compiled frame, then `CUDAGraphTreeManager._run`,
# whose `CUDAGraphNode.check_invariants` compares the data pointers of the static inputs (parameters,
# `mark_static_address` buffers) and of the tensors its pool manages with those recorded
# (`torch._C._tensors_data_ptrs_at_indices_equal`) and checks that the outputs expected dead are dead; then
# `CUDAGraphNode.run` copies the other inputs in (`torch._foreach_copy_`), replays, and rebuilds the output tensors
# from their metadata (`reconstruct_outputs`). Its memory is one pool per device for the whole tree of graphs; its
# outputs live in that pool until the next step (hence `cudagraph_mark_step_begin`). The kit's call checks its
# arguments in Python, copies the inputs and replays: it has no guards to run, no tree of graphs to walk and no
# outputs to rebuild. All of that is host work: it adds to the time per step only where the host, not the GPU, sets
# the pace. Section 7's verdicts on the compiled step captured by the kit against `reduce-overhead` say whether it
# did here (G has batch 1; `claims.csv` every batch size). The same file frees cuBLAS's workspaces before and after
# every warm-up or recording (`clear_cublass_cache`): section 4's pitfall.

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
# **Compile first, then capture, and make the compile see what the capture will pass.** `capture_buckets` calls
# the step on views of its static buffers (`buf.narrow(0, 0, bucket)`), and Dynamo guards on a view's base as well
# as on the view. Warmed up on a view as long as its buffer (the largest batch), Dynamo shares one size symbol
# between the two and guards that they are equal; the first smaller bucket then fails that guard and compiles
# again, inside the capture, where a compile costs far more than the capture itself. Warmed up at half the
# largest batch and at 1 (PyTorch specializes size 1), the two compiles serve every bucket (`compile_then_capture`
# in `cudagraph_kit/course/lessons/decode.py`).
#
# The table below gives what each variant cost to set up: compile time (the compiled step's two compiles;
# `reduce-overhead`'s first calls of section 6: a compile at each of the first two batch sizes, the second with the
# batch size dynamic, then one recording per new batch size), capture time (the kit),
# the compiles Dynamo ran during the kit's capture (none, when the compile has seen the buckets' kind of input),
# and `graph_mib`, the memory
# the graphs hold: for the kit's buckets the ledger's reading of their pool plus their static buffers
# (`MemoryLedger.record`), for `reduce-overhead` how much the graph pools grew during its first calls (the growth of
# every pool but the allocator's default one, `MemoryLedger.measure`). Both read pools, not the allocator's total,
# so a cache emptied on the way (every capture through `torch.cuda.graph` calls `torch.cuda.empty_cache()` on
# entering) cannot make them negative.
#
# Then the three graphed variants at each batch size: time per step, kernels per step, floor and the median over
# the floor (`vs_floor`). Read the two fused variants together: they run the same fused kernels, so the aim "the
# compiled step captured by the kit is more than 5% faster than `reduce-overhead`" can only be met where
# `reduce-overhead`'s per-call host work shows. Where both medians sit close to their floors (`vs_floor` near 1),
# both are GPU-bound: the time goes to the fused kernels themselves, `reduce-overhead`'s guards and checks run on the
# host while the GPU is still busy with kernels already queued, and the aim fails or is too close to call
# (G has batch 1). Both run fewer kernels than the kit's graph of the eager step and so have a lower floor;
# whether that makes `reduce-overhead` faster than the kit's graph at a given batch size is a verdict of section 7
# (batch 1 in G; the other batch sizes are in `claims.csv`). A verdict compares two variants window by window, so
# it can be firm where their intervals over eager overlap.

# %%
from cudagraph_kit.course.lessons.decode import setup_table

setup_rows = [{"variant": KIT_GEN, "compile_s": 0.0, "capture_s": graphs.capture_seconds, "graph_mib": kit_held}]
if fused_graphs is not None:
    setup_rows.append({"variant": FUSED_GEN, **fused_setup})
if ("reduce-overhead", BATCHES[0]) in setup:
    setup_rows.append({"variant": "reduce-overhead", "graph_mib": pool_growth["reduce-overhead"] / MiB,
                       "compile_s": sum(t for (v, _), t in setup.items() if v == "reduce-overhead")})
setup_df = setup_table(setup_rows)
graphed = step_df[step_df.variant.isin([KIT_STEP, FUSED_STEP, "reduce-overhead"])]
if CUDA and len(graphed):
    units = {"batch": "batch (sequences)", "median_us": "time (µs/step)", "kernels_per_call": "kernels (count/step)",
             "floor_us": "floor (µs/step)", "vs_floor": "time / floor (x)"}   # every column with its unit
    print(graphed[list(units)[:1] + ["variant"] + list(units)[1:]].astype({"batch": int})
          .rename(columns=units).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
else:
    print("no graphed variant was timed here (they need a CUDA GPU): see the recorded results in F below.")

# %% [markdown]
# ### C. Several tokens per replay
#
# One graph per token still costs the host one replay, one read of the done flags and one loop turn per token. A
# graph can hold several decode steps: `k_step(step, K)` (in `cudagraph_kit/course/lessons/decode.py`) runs K steps in one
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
from cudagraph_kit.course.lessons.decode import (decode_state, generate_blocks, generation, k_step, load_state,
                                                mid_block_stop, stop_after)

PAD, K_BATCHES = 0, sorted({1, min(8, MAX_BATCH)})
kx = prompts[MAX_BATCH]            # batch b decodes the first b of these prompts, in cache rows 0..b-1
k_graphs, k_rows = {}, []
for b in K_BATCHES:
    ref = greedy_generate(model, cache, kx[:b], NEW_TOKENS)           # one step per token, no stop
    stop, stop_step = mid_block_stop(ref, max(K_STEPS))
    want = stop_after(ref, stop, PAD)
    for k in K_STEPS:
        block = fresh_cublas_workspace(k_step(decode_step, k, pad_token=PAD))  # the cuBLAS workspace in its pool (section 4)
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
# prefill excluded (it ran once above): eager (the same K=1 block, run eagerly), then one graph per token (K=1) and
# one graph per K tokens for the other K. The table gives the time of a whole generation (tokens per second, which
# count the decoded tokens of every row, are in the saved results). The verdicts compare each K with one graph per
# token, window by window.
#
# What a block of K steps saves is the host work between replays: the loop turn, and the read of the done flags,
# which waits for the GPU, so that the GPU then waits for the next replay. A replay of one decode step already keeps
# the GPU busy for most of its time (section 7: the kit's graph runs close to its floor), so expect a gain far
# smaller than the graph's gain over eager, though it can exceed the step's own distance to its floor, since each
# done-flag read adds a wait of its own (G has K=8 at batch 1 and 8).

# %%
def k_runner(b, k):
    """One timed generation at batch b (any start token will do: no stop token): k=0 runs the K=1 block eagerly,
    else the graph of K steps replays once per block."""
    return generation(kx[:b, -1].clone(), PROMPT_LEN, NEW_TOKENS, max(k, 1), PAD, graph=k_graphs.get((b, k)),
                      step=decode_step)


K_NAME = {k: f"K={k}: one graph per {k} tokens" if k > 1 else "K=1: one graph per token" for k in K_STEPS}
K_CASE = {b: f"k-step decode, batch {b}" for b in K_BATCHES}
k_cases = {K_CASE[b]: ({"eager": Runs(k_runner(b, 0)), **{K_NAME[k]: Runs(k_runner(b, k), k_graphs[b, k])
                                                           for k in K_STEPS if (b, k) in k_graphs}},
                       (), {"calls": 1}) for b in K_BATCHES}
m_k = measure(k_cases, **GEN_TIMING)   # each runner carries its graph's mode: no profiler on whole generations
for b in K_BATCHES:
    for k in K_STEPS[1:]:
        if {K_NAME[1], K_NAME[k]} <= set(k_cases[K_CASE[b]][0]):
            claims.append(versus(m_k, f"kstep_k{k}_beats_one_graph_per_token_b{b}", (K_CASE[b], K_NAME[k]),
                                 (K_CASE[b], K_NAME[1])))
k_df = per_batch(m_k, K_CASE, NEW_TOKENS - 1)     # the decoded tokens of every row (prefill made the first)
m_k.short()

# %% [markdown]
# **Where a decode loop's time goes.** `scripts/probes/probe_decode_loop.py` timed whole generations of this
# notebook's model on an H200, round-robin: the compiled step captured per bucket (section 5), the same inside
# `weights_fixed`, K=8 compiled steps per replay, and `reduce-overhead`. It also took one kit call apart on the host.
# The cell reads what it recorded in `figures/08_decode_loop/`: when the host finishes issuing a generation before the
# GPU finishes running it, the GPU sets the pace, and a cheaper call or fewer replays cannot shorten the loop.

# %%
from cudagraph_kit.course.measuring.breakdowns import decode_loop_reading

print(decode_loop_reading((results.recorded_root() or Path("figures")) / "08_decode_loop"))

# %% [markdown]
# ### D. Your own Hugging Face model
#
# The model people want to speed up is usually one they load from `transformers`. The recipe is the same as for
# our own model: allocate a `StaticCache` once, make the decode step a function of tensors only (`input_ids` and
# `position_ids`, both (batch, 1)) that calls the model with that cache and returns the last position's logits,
# prefill eagerly, capture the step, replay it for every token. `StaticDecoder` in
# `cudagraph_kit/course/lessons/hf_decode.py` is that recipe (also in `docs/CHEATSHEET.md`); here it runs on section 5's
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
# graphs then captured by the kit.
# `transformers`' own `generate(cache_implementation="static")` was checked in section 6 and is timed below. On a
# GPU it compiles twice: at the first batch size, and at the second with the batch dimension marked dynamic
# ([Dynamo](../docs/GLOSSARY.md)'s automatic dynamic shapes); later sizes reuse that code and record one more
# graph each.


# %%
from cudagraph_kit.course.lessons.hf_decode import StaticDecoder

HF_KIT, HF_FUSED = "HF step, kit graph", "HF step compiled + kit graph"
hf_dec, hf_graphs, hf_checks = None, {}, []
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
        t0 = time.perf_counter()
        hf_graphs[name] = attempt(name, lambda: hf_dec.capture(capture, fn=fresh_cublas_workspace(build()),
                                                               eager_fallback=True))
        if hf_graphs[name] is not None:
            lg, setup_s = [], time.perf_counter() - t0                 # compile (if any) and capture
            tokens = hf_dec.generate(hx, NEW_TOKENS, step=hf_graphs[name], logits_out=lg)
            hf_checks.append(check_row(name, tokens, lg, hf_ref, ref_l, setup_s=setup_s))
    print(pd.DataFrame(hf_checks).to_string(index=False, float_format=lambda v: f"{v:.3g}"))

# %% [markdown]
# A graphed step whose tokens differ from the eager step's at a near tie (`near_tie`: the logits moved by at least
# eager's gap between its two best tokens there) is rounding, not a bug; it is still timed. Whole generations
# (prefill included, as in section 8; the table gives the time of one generation, the saved results also the time
# per token): the eager step, the graphed steps, and `transformers`' static-cache `generate` (compiled with
# `reduce-overhead` on a GPU, by `transformers` itself). Three verdicts: does the kit's graph beat the eager step;
# does the compiled step captured by the kit beat the kit's graph; and does it beat `generate`'s static cache?

# %%
HF_CASE = f"transformers model, batch {BATCHES[0]}"
hf_timed = {"eager": Runs(lambda: hf_dec.generate(hx, NEW_TOKENS))} if hf_dec is not None else {}
for r in hf_checks:
    if r["variant"] in hf_graphs and (r["tokens_equal"] or r["near_tie"]):
        g = hf_graphs[r["variant"]]
        hf_timed[r["variant"]] = Runs(lambda g=g: hf_dec.generate(hx, NEW_TOKENS, step=g), g)
if hf_dec is not None and (HF_STATIC, BATCHES[0]) in setup:
    hf_timed[HF_STATIC_RAN] = Runs(lambda: hf_generate(hf_model, hx, NEW_TOKENS, cache_implementation="static"),
                                   HF_STATIC_MODE)
hf_df = pd.DataFrame()
if len(hf_timed) > 1:
    m_hf = measure({HF_CASE: (hf_timed, (), {"calls": 1})}, **GEN_TIMING)   # ran as: each runner's mode
    if HF_KIT in hf_timed:
        claims.append(speedup(m_hf, "hf_kit_graph_beats_eager", HF_CASE, HF_KIT))
    for cid, slow in (("hf_fused_graph_beats_kit_graph", HF_KIT), ("hf_fused_graph_beats_hf_static_generate", HF_STATIC_RAN)):
        if {HF_FUSED, slow} <= set(hf_timed):
            claims.append(versus(m_hf, cid, (HF_CASE, HF_FUSED), (HF_CASE, slow)))
    hf_df = per_batch(m_hf, {BATCHES[0]: HF_CASE}, NEW_TOKENS).assign(us_per_token=lambda d: d.median_us / NEW_TOKENS)
    print(m_hf.short().to_string(index=False))

# %% [markdown]
# ### E. The picture
#
# Left: time per decode step against the batch size, with the floor. Middle: tokens per second of whole
# generations, every variant. Right: the serving loop, time per step of each strategy, with its number of graphs.

# %% tags=["nbval-check-output"]
import matplotlib.pyplot as plt

from cudagraph_kit.course.measuring.figures import plot_decode

where = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only: not a GPU result)"
step_df["floor_step_us"] = step_df.batch.map(floors).astype(float)   # section 7's floors; NaN where none was measured
fig = plot_decode(step_df, gen_df, serve_df, f"LLM decoding with a static KV cache: {where}, PyTorch "
                                             f"{torch.__version__}, {DT}")
plt.show()

# %% [markdown]
# ### F. Save the results, and the recorded GPU run beside this one
#
# One row per (case, variant) of every timed comparison (with `window_medians_us`, each window's median), the
# correctness checks (`case` "no-cache parity", "correctness", "k-step correctness", "hf correctness"), the capture
# times (`case` "capture"), the setup costs (`case` "setup") and the variants that failed (`case` "errors"), with
# the machine in `env.json` and every verdict of this run in `claims.csv`, in the folder printed below
# (`build/figures/` by default, with or without a GPU; only `python -m cudagraph_kit reproduce` on a GPU publishes
# to the recorded `figures/`). Then this run's decode-step times and speedups beside those of the last GPU run
# committed to this repository (what a reader without a GPU sees).

# %%
from cudagraph_kit.course.measuring.claims import save_claims

prefill_df = per_batch(m_step, STEP_CASE).query("case == @PREFILL_CASE").assign(batch=MAX_BATCH)
gen_df["first_call_s"] = [setup.get((HF_STATIC if v == HF_STATIC_RAN else v.replace(" (eager fallback)", ""), b),
                                    float("nan")) for v, b in zip(gen_df.variant, gen_df.batch)]   # section 6's
error_rows = pd.DataFrame([{"case": "errors", "variant": v, "error": e} for v, e in variant_errors.items()])
capture_rows = pd.DataFrame([{"case": "capture", "variant": f"kit bucket {e['size']}", "batch": e["size"],
                              "setup_s": e["seconds"]} for e in graphs.capture_log])
tables = [parity, step_df, gen_df, prefill_df, serve_df, capture_rows, checks.assign(case="correctness"), setup_df, k_checks,
          k_df, pd.DataFrame(hf_checks).assign(case="hf correctness"), hf_df, error_rows]
all_rows = pd.concat([t for t in tables if len(t)], ignore_index=True)
all_rows["device"] = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
extra = {"config": vars(CFG), "dtype": str(DT), "batches": BATCHES, "gen_batches": GEN_BATCHES, "seed": SEED,
         "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS, "serve_steps": SERVE_STEPS, "ladder": LADDER,
         "planned_buckets": plan.sizes, "k_steps": list(K_STEPS), "k_batches": K_BATCHES, "windows": WINDOWS,
         "samples": SAMPLES, "transformers": HF_VERSION, "variant_errors": variant_errors, "seconds": round(elapsed(), 1),
         "hf_logit_diff": hf_diff if hf_model is not None else None,
         "hf_write_position": hf_dec.behaviour.describe() if hf_dec is not None else None}
folder = results.save(STEM, all_rows, figures={"decode": fig}, extra_env=extra)
save_claims(folder, claims)
print("saved to", folder, f"({elapsed():.0f} s since the start)")
recorded = results.beside_recorded(STEM, step_df)   # the decode steps; every table is in the saved results

# %% [markdown]
# ### G. The headline verdicts
# Every verdict of every section is in `claims.csv`; the headline ones follow (on a CPU, the sentences say that
# the graphs ran eagerly).

# %%
from cudagraph_kit.course.measuring.claims import summary

B1, KB = BATCHES[0], K_BATCHES[-1]
HEADLINES = [f"step_graph_beats_eager_b{B1}", f"step_eager_host_bound_b{B1}",
             f"step_reduce_overhead_beats_graph_b{B1}", f"step_fused_graph_beats_reduce_overhead_b{B1}",
             "decode_gains_more_than_prefill", f"generate_graphs_beat_eager_b{MAX_BATCH}",
             f"generate_graphs_beat_hf_static_b{B1}", "serving_ladder_beats_eager", "serving_planned_beats_ladder",
             f"kstep_k{max(K_STEPS)}_beats_one_graph_per_token_b{B1}",
             f"kstep_k{max(K_STEPS)}_beats_one_graph_per_token_b{KB}", "hf_kit_graph_beats_eager",
             "hf_fused_graph_beats_hf_static_generate"]
summary(claims, HEADLINES)
if set(HEADLINES) - {c.claim for c in claims}:
    print("Some headline comparisons need what this run lacks (a GPU, torch.compile or transformers); the recorded "
          "GPU run has them (F).")

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say so
# (⏸); on a CPU the buckets run eagerly, padding and slicing exactly as graphs do.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb08_llm_decode.py` (try
# first).

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.exercises.nb08_llm_decode import TIE_WHY, check_decode_buckets, check_k_step_decode, check_low_precision_ties

# %% [markdown]
# ### Exercise 1: buckets for the serving loop, and what a padding row costs
# Plan at most 4 buckets for the history of the serving loop ("Going further" A) with `plan_buckets(history,
# max_graphs=4, max_size=MAX_BATCH)`, capture them (`capture_buckets(graph_step, sample_tokens, sample_pos,
# sizes=..., eager_fallback=True)`), and run the stream through them with `serve(..., record=...)`. Do the requests decode
# exactly as eager (`served["eager"]`)? Then give `pad_fraction`, the share of the computed rows that are padding
# on this stream (`evaluate_buckets`).

# %% tags=["nbval-check-output"]
few_buckets = ...     # plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)
serve_few = ...       # capture_buckets(graph_step, sample_tokens, sample_pos, sizes=few_buckets.sizes, eager_fallback=True)
few_tokens = ...      # {request id: tokens}: the record of serve(serve_few, stream, record=...)
pad_fraction = ...    # evaluate_buckets(observed, few_buckets.sizes)["pad_fraction"]

# %% tags=["nbval-check-output"]
check_decode_buckets(few_buckets, serve_few, few_tokens, pad_fraction, history=history, observed=observed,
                     max_batch=MAX_BATCH, eager_tokens=served["eager"])

# %% [markdown]
# ### Exercise 2: bfloat16 and near ties
# Serving usually runs in bfloat16. Build the same model in bfloat16 (`TinyLLM(CFG, seed=SEED, device=DEVICE,
# dtype=torch.bfloat16)`, with a `StaticKVCache` of the same dtype), decode the largest batch's prompts greedily
# with the static cache and without a cache (`greedy_generate(..., logits_out=...)`,
# `greedy_generate_no_cache(..., logits_out=...)`), and compare the tokens with `first_divergence`. If they
# differ, why? Pick one of the options printed below.

# %% tags=["nbval-check-output"]
bf16_tokens = ...        # greedy_generate on the bfloat16 model, static cache
bf16_reference = ...     # greedy_generate_no_cache on the bfloat16 model
bf16_divergence = ...    # first_divergence(bf16_tokens, bf16_reference, its logits, the reference's logits)
tie_why = ...            # "a", "b" or "c"
print("\n".join(f"{key}) {text}" for key, text in TIE_WHY.items()))

# %% tags=["nbval-check-output"]
check_low_precision_ties(bf16_tokens, bf16_reference, bf16_divergence, tie_why, prompt=prompts[MAX_BATCH],
                         cfg=CFG, seed=SEED, new_tokens=NEW_TOKENS)

# %% [markdown]
# ### Exercise 3: four tokens per replay, stopping on the GPU
# Write `k4_block(tokens, pos, done, stop)` yourself: four greedy steps of `decode_step`, each step's argmax the
# next step's token, rows already done emitting `PAD`, `done` set where the stop token came out; update the four
# state tensors **in place** and return the four tokens, (b, 4). Capture it with the kit (`capture(fresh_cublas_workspace(
# k4_block), *decode_state(torch.zeros(b, dtype=torch.long, device=DEVICE), 0), warmup=2, eager_fallback=True)`),
# then decode the prompts below: prefill, `load_state(k4_graph.static_inputs, decode_state(first, PROMPT_LEN,
# EX3_STOP))`, `generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)`. Why must the
# updates be in place?

# %% tags=["nbval-check-output"]
ex3_prompt = kx[:K_BATCHES[-1]]
EX3_STOP = mid_block_stop(greedy_generate(model, cache, ex3_prompt, NEW_TOKENS), 4)[0]   # stops inside a block
k4_block = ...     # def k4_block(tokens, pos, done, stop): ... four steps of decode_step, in place
k4_graph = ...     # capture(fresh_cublas_workspace(k4_block), *decode_state(...zeros..., 0), warmup=2, eager_fallback=True)
k4_tokens = ...    # generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)

# %% tags=["nbval-check-output"]
check_k_step_decode(k4_block, k4_graph, k4_tokens, model=model, cache=cache, prompt=ex3_prompt, stop_token=EX3_STOP,
                    new_tokens=NEW_TOKENS, pad_token=PAD)


# %% [markdown]
# ## Appendix: the batch-16 question, which kernels does a decode step run at each batch size?
#
# In the recorded runs a decode step at batch 16 kept the GPU busy longer than one at batch 64 (the floors of
# section 7), on an H200 and on an H100. `scripts/probes/probe_decode_kernels.py` profiled this notebook's decode step
# (eager and the kit's graph, float32 as here) at batch 1, 8, 16, 32 and 64 and saved each batch's top kernels to
# `figures/08_decode_kernels/`. The table below reads it: the matrix-multiply kernel that cuBLAS picks changes with
# the batch size. Eager and the graph run the same kernel at every batch: the graph replays what eager launched, so
# this is cuBLAS's heuristic for these shapes, not the kit. Padding a batch of 16 up to a bucket of 32 is one way
# around it, which `plan_buckets` (notebook 06) can find from measured costs.

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.measuring.breakdowns import kernel_table

kernels, sentence = kernel_table((results.recorded_root() or Path("figures")) / "08_decode_kernels")
if kernels is not None:
    print(kernels.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
print(sentence)
