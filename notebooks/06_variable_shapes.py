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
# # 06 · Variable shapes: bucketed graphs, a bucket planner and a memory ledger
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/06_variable_shapes.ipynb)
#
# A CUDA graph replays fixed shapes, but an inference server sees a new batch size with almost every request.
# Serving engines (vLLM, SGLang) capture one graph per batch size from a fixed list of [*buckets*](../docs/GLOSSARY.md), let them share
# one [memory pool](../docs/GLOSSARY.md), and pad each batch up to the nearest captured size. `torch.compile(mode="reduce-overhead")`
# instead records a new graph for every new shape. This notebook compares the two on a seeded stream of requests
# with random batch sizes, through an MLP and a small transformer block.
#
# **What you'll learn**
# - How to serve any batch size from a few graphs: pad, replay, slice; and why that is only correct when rows
#   never see each other (checked with poison padding).
# - Why buckets share one memory pool, captured largest first, measured with a memory ledger.
# - How bucket spacing and a planner trade padded work against the number of graphs, and what `reduce-overhead`
#   does with a stream of shapes.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU). Without one the notebook
# runs its CPU part small (everything eager, labelled so), says so, and shows the recorded GPU results.
#
# **How long**: 3.3 min on an NVIDIA H200 (measured by `reproduce`, 2026-11-29); a T4 has not been timed yet; one to
# two minutes on a CPU (small sizes).

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
MAX_ROWS = None       # largest request the buckets serve (None: 64 on a GPU; 16 in SMOKE or on a CPU)
REQUESTS = None       # requests in the timed stream (None: 200 on a GPU; 40 in SMOKE; 24 on a CPU)
HISTORY = None        # request sizes seen "earlier", for the planner (None: 5000 on a GPU; 1000 in SMOKE / on a CPU)
OVERFLOW_SHARE = 0.01 # share of requests larger than MAX_ROWS (they run eagerly, counted)
SPACINGS = None       # fixed ladders besides exact sizes, pow2 and a single bucket (None: steps of 4, 8, 16)
SAMPLES = None        # timing rounds per window, one pass of every variant per round (None: 2)
WINDOWS = 8           # timing windows, a pause apart: every interval (and every verdict) comes from them
WINDOW_PAUSE_S = 0.5  # seconds between windows
COMPILE = True        # also time torch.compile with mode reduce-overhead (GPU only; compiling takes a while)
SEED = 0

# %%
import math, os, warnings

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from cudagraph_kit import (MemoryLedger, capture_buckets, capture_train_step, env_table, evaluate_buckets, has_cuda,
                           ladder, plan_buckets, pool_usage)
from cudagraph_kit import bucket_graphs, capture
from cudagraph_kit.course.lessons import buckets, models, workloads
from cudagraph_kit.course.lessons.buckets import MiB, Strategies
from cudagraph_kit.course.lessons.workloads import run_stream
from cudagraph_kit.course.measuring import figures, results, verdicts
from cudagraph_kit.course.measuring.claims import Claim, save_claims, speedup, summary
from cudagraph_kit.course.measuring.measure import measure, window_medians
from cudagraph_kit.course.measuring.verdicts import SHORT, phrase, strategy

STEM = "06_variable_shapes"
CUDA = has_cuda()
DEVICE = "cuda" if CUDA else "cpu"
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
small = SMOKE or not CUDA
MAX_ROWS = MAX_ROWS or (16 if small else 64)
REQUESTS = REQUESTS or (200 if not small else (40 if CUDA else 24))
SAMPLES = SAMPLES or 2
if SMOKE:
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
HISTORY = HISTORY or (1000 if small else 5000)
SPACINGS = SPACINGS or ([4] if small else [4, 8, 16])
COMPILE = COMPILE and CUDA
SYNC = torch.cuda.synchronize if CUDA else (lambda: None)
torch.manual_seed(SEED)
torch.set_grad_enabled(False)  # inference throughout (Appendix B's training step turns it back on)
print(env_table(), f"\nMAX_ROWS={MAX_ROWS} REQUESTS={REQUESTS} HISTORY={HISTORY} WINDOWS={WINDOWS} x SAMPLES={SAMPLES}")
claims = []  # every comparative sentence of this notebook, as a verdict on an interval (saved to claims.csv)
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run pads and slices exactly as the GPU run\n"
          ">>> does but runs every bucket eagerly (labelled 'eager fallback'), at small sizes; it skips\n"
          ">>> torch.compile's CUDA graphs and the memory ledger. CPU timings are not results: the tables show\n"
          ">>> the recorded GPU run's.")

# %% [markdown]
# ## 1. A stream of requests
#
# Each request is a batch of `n` rows, `n` drawn from a skewed distribution (many small batches, a few large
# ones) up to `MAX_ROWS`, plus a small share above it, which no bucket covers. The planner later learns from a
# *separate* draw (`HISTORY` sizes, another seed), as a server would from yesterday's traffic.

# %%
stream_sizes, history_sizes = workloads.request_sizes(REQUESTS, HISTORY, MAX_ROWS, OVERFLOW_SHARE, SEED)

# %% [markdown]
# ## 2. Two models whose rows never see each other
#
# Padding is correct only if each output row depends on its own input row alone. An MLP is such a function. So
# is a transformer block whose attention runs over the *sequence* inside each request: the batch dimension is the
# requests, and nothing mixes them. Batch norm in training mode, or attention across the batch, would not be.
# Every request is a view into one tensor already on the device, so no host-to-device copy is timed.

# %%
class Block(nn.Module):
    """Pre-norm transformer block; x is (requests, seq, d), attention runs within each request."""

    def __init__(self, d, heads, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp_ratio * d), nn.GELU(), nn.Linear(mlp_ratio * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)          # (b, heads, t, head_dim): over the sequence
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


D_MLP, H_MLP = (256, 1024) if CUDA else (32, 64)
SEQ, D_BLOCK, HEADS = (64, 256, 4) if CUDA else (8, 32, 2)
MODELS = {"MLP": (models.make_mlp(D_MLP, H_MLP), (D_MLP,)), "transformer block": (Block(D_BLOCK, HEADS), (SEQ, D_BLOCK))}
data, streams = workloads.request_views(MODELS, stream_sizes, MAX_ROWS, DEVICE, SEED + 2)

# %% [markdown]
# ## 3. Buckets by hand: pad, replay, slice
#
# Two graphs of the MLP, for 8 rows and for `MAX_ROWS` rows. Both read one static input buffer and write one
# static output buffer, sized for the largest bucket; each graph works on the first `b` rows. A request of 5 rows
# is copied into the first 5 rows, rows 5..7 are padded with zeros, the 8-row graph replays, and the result is the
# first 5 rows of the output buffer.
#
# The two graphs share one memory pool (`torch.cuda.graph_pool_handle()`), the largest captured first, so the
# smaller one reuses the memory the larger one freed. PyTorch's CUDA notes ("Sharing memory across captures")
# allow graphs to share a pool if they never run concurrently and either replay in capture order or do not
# depend on each other's outputs: buckets replay one at a time on one stream and read none of each other's
# outputs. Replaying one graph of a shared pool can overwrite another's outputs; here each graph copies its
# result into `static_out`, outside the pool, which the next call overwrites: clone a result you keep.

# %%
mlp = MODELS["MLP"][0]
if CUDA:
    pool = torch.cuda.graph_pool_handle()
    static_in = torch.zeros(MAX_ROWS, D_MLP, device="cuda")
    static_out = torch.zeros(MAX_ROWS, D_MLP, device="cuda")
    side = torch.cuda.Stream()
    graphs = {}
    for b in (MAX_ROWS, 8):                                   # largest first
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                         # warm up on a side stream
            for _ in range(3):
                mlp(static_in[:b])
        torch.cuda.current_stream().wait_stream(side)
        graphs[b] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[b], pool=pool, stream=side):
            static_out[:b].copy_(mlp(static_in[:b]))          # the temporaries go back to the shared pool

    x = torch.randn(5, D_MLP, device="cuda")                  # a request of 5 rows
    static_in[:5].copy_(x)
    static_in[5:8].zero_()                                    # padding
    graphs[8].replay()
    y = static_out[:5]                                        # slice the real rows out
    torch.testing.assert_close(y, mlp(x), rtol=1e-4, atol=1e-5)
    print("hand-written bucket == eager on a 5-row request: OK; both graphs share pool", tuple(pool))
    del graphs, static_in, static_out
else:
    print("skipped: capturing CUDA graphs needs an NVIDIA GPU (the kit below runs its eager fallback).")

# %% [markdown]
# ## 4. The same with the kit, and a poison test
#
# `capture_buckets(fn, sample, sizes=...)` does the above for any list of sizes (default: 1, 2, 4, then steps
# of 8) and checks every call: only the size along the batch dimension may vary. Requests above the largest
# bucket run eagerly and are **counted** (with a warning the first time), never silently.
#
# Correct before fast: `verify(x)` fills the padding rows with NaN, runs the request, and compares it with
# eager. A function whose rows never see each other returns no NaN; one that mixes rows across the batch (here a
# normalisation over the batch dimension) lets the poison into every row, and `verify` reports `inf`.

# %%
sample = data["MLP"][:MAX_ROWS]
serve = capture_buckets(mlp, sample, eager_fallback=True)
print(serve)
odd = next(n for n in range(3, MAX_ROWS) if serve.bucket_for(n) != n)   # a size that gets padded
x = data["MLP"][:odd]
print(f"MLP, {odd} rows padded to {serve.bucket_for(odd)}: max |bucketed - eager| with NaN padding = "
      f"{serve.verify(x):.2e}")
mixes_rows = capture_buckets(lambda t: t - t.mean(dim=0), sample, eager_fallback=True)
print(f"x - x.mean(dim=0) (mixes rows): verify -> {mixes_rows.verify(x)}  (the padding leaked: never bucket this)")
assert serve.verify(x) < 1e-4 and math.isinf(mixes_rows.verify(x))
del mixes_rows

# %% [markdown]
# ## 5. Strategies, and what each one holds in memory
#
# For each model, from the same sample, `Strategies` ([`buckets.py`](../cudagraph_kit/course/lessons/buckets.py))
# builds:
# - **exact sizes**: one graph for every size from 1 to `MAX_ROWS` (no padding; the most graphs);
# - **fixed ladders**: powers of two, steps of 4, 8 (the kit's default) and 16 (`SPACINGS`), and a **single
#   bucket** of `MAX_ROWS` rows (everything padded to the largest size);
# - **planned** buckets: `plan_buckets` picks as many bucket sizes as the default ladder has, where the history's
#   requests fall, to spend the least GPU time on padding ("Going further" B shows how).
#
# All buckets of one strategy share one pool of their own. A `MemoryLedger` reads the bytes each strategy's pools
# reserve (from `torch.cuda.memory_snapshot()`) and adds its static input and output buffers: that is what the
# strategy *holds*. The default ladder is also captured with one pool per graph, PyTorch's default, to see what
# sharing saves. Without a GPU nothing is captured, and the cell shows the recorded GPU run's memory instead.

# %%
FIXED, DEFAULT = buckets.fixed_ladders(MAX_ROWS, SPACINGS)   # {label: spacing}; DEFAULT: the kit's ladder(MAX_ROWS)
lab = Strategies(MODELS, data, MAX_ROWS, CUDA)
lab.build_ladders(FIXED)                                   # exact sizes, FIXED, and the one-pool-per-graph ladder
lab.plan(history_sizes, DEFAULT, rounds=3 if small else 5)  # "planned": measured costs, then plan_buckets
built, info = lab.built, lab.info                          # built[model][strategy]: a BucketedGraphs
memory = lab.memory()   # one row per model and strategy (the setup times are in "Going further" A)
evidence = lab.sharing(DEFAULT)                            # the checks below the table ([] without a GPU)
buckets.show_memory(memory, evidence, STEM, CUDA)          # without a GPU: the recorded GPU run's tables
claims += buckets.sharing_claims(evidence, DEFAULT)       # one verdict per model (GPU only)

# %% [markdown]
# In a shared pool each smaller bucket reuses the memory the larger ones freed, so the pool should hold about
# what the largest bucket needs, however many buckets there are (target: 1.2x or less). With one pool per graph
# every bucket keeps its own memory, so the total grows with every bucket. Where a shared pool holds clearly more,
# the cause is fragmentation, which Appendix A measures.
#
# ## 6. `torch.compile(mode="reduce-overhead")` on the same stream
#
# `reduce-overhead` records CUDA graphs for you (CUDA graph trees), one per distinct input shape. Two ways to
# call it: the default (`dynamic=None`: the first size is compiled static, the next one recompiles with the batch
# dimension dynamic), and `dynamic=True` (dynamic from the start). The compiled code is then shared across sizes,
# but a graph is not: each new batch size records one more. The first two passes over the stream compile and
# record; their time is the setup cost. The recorded graphs live in one memory pool shared by every compiled
# function ("Going further" C).

# %%
compiled, TREES_POOL_MIB = buckets.compile_variants(MODELS, streams, info, COMPILE)   # {model: {label: fn}}
if not COMPILE:
    print("skipped: mode='reduce-overhead' records CUDA graphs and needs an NVIDIA GPU." if not CUDA
          else "skipped (COMPILE=False).")

# %% [markdown]
# ## 7. Correctness first: every variant against eager, on the whole stream
#
# Different batch sizes may pick different matrix-multiply kernels, which round differently, so we expect
# differences at the level of float32 rounding (relative 1e-5 or less); a wrong result (a padding leak, a stale
# buffer) would be of the order of the values themselves. Requests above `MAX_ROWS` take each bucketed variant's
# eager path; the kit warns about the first one (a `BucketOverflowWarning`, expected here, so the cell keeps it
# quiet) and counts them all in `stats.eager_overflows`. The cell prints, per model, the largest relative
# difference from eager of any variant over the whole stream; `err_table` holds each variant's.

# %%
variants = {name: lab.variants(name, compiled) for name in MODELS}   # {model: {label: fn}}, eager first
errors = {}
for name, fns in variants.items():
    model, worst = MODELS[name][0], dict.fromkeys(fns, 0.0)
    for x in streams[name]:
        ref = model(x)
        scale = ref.abs().max().item()
        for label, fn in fns.items():
            with warnings.catch_warnings():   # a request above MAX_ROWS: expected here, counted in stats
                warnings.simplefilter("ignore", bucket_graphs.BucketOverflowWarning)
                out = fn(x)
            assert out.shape == ref.shape, (label, out.shape, ref.shape)
            worst[label] = max(worst[label], (out - ref).abs().max().item() / scale)
            del out  # a graph's output is overwritten by its next call: never keep it across calls
    errors[name] = worst
err_table = pd.DataFrame(errors)
for name, col in err_table.items():   # err_table: every variant's largest |variant - eager| / max|eager|
    print(f"{name}: every variant within {col.max():.1e} of eager, relative (largest: {col.idxmax()})")
assert (err_table < 1e-3).all().all(), "a variant disagrees with eager: do not time it"

# %% [markdown]
# ## 8. Time per pass over the stream
#
# `measure` times whole passes over the stream (its `REQUESTS` requests back to back, synchronised at the end),
# all variants of a model taking turns, in `WINDOWS` windows a pause apart. The table gives each variant's median
# time per pass. Each speedup over eager comes with its 90% prediction interval, the range one more window should
# land in; two variants are compared by the ratio of their passes, window by window. The verdicts below say which
# comparisons clear 1x.
#
# Before the timing, one more pass runs each request alone through every variant, timed up to a
# `torch.cuda.synchronize()` after it (latency), and counts padding and overflows. The results table at the start
# of "Going further" divides each pass by the number of requests (time per request) and adds that latency pass's
# median (p50) and 99th percentile (p99), with what each strategy built, holds and padded. One slow moment of the
# host moves a p99, and one pass has no interval, so no verdict rests on them.

# %%
latency, pad_stats = buckets.latency_pass(variants, streams, SYNC)
passes = {name: {label: (lambda fn=fn, reqs=streams[name]: run_stream(fn, reqs)) for label, fn in fns.items()}
          for name, fns in variants.items()}
timing = measure(passes, windows=WINDOWS, samples=SAMPLES, calls=1, pause_s=WINDOW_PAUSE_S, floor=CUDA,
                 verdicts=verdicts.stream_verdicts)
claims += timing.claims
results.show(timing, STEM, figure=True, table="times", per="pass",   # no GPU: the recorded run's rows and verdicts
             headlines=["mlp_default_ladder_beats_eager", "block_default_ladder_beats_eager",
                        "mlp_default_ladder_beats_reduce_overhead", "block_default_ladder_beats_reduce_overhead",
                        "block_planned_beats_default_ladder"])
results_df = buckets.results_table(timing, latency, pad_stats, lab, errors, REQUESTS,   # shown in "Going further"
                                   torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)")

# %% [markdown]
# ## 9. Takeaways
# Numbered from this run on a GPU; without one, from the recorded GPU run (named above them).

# %%
TAKEAWAYS = [
    "A few buckets serve every batch size: pad up to the nearest bucket, replay, slice the real rows out. It is "
    "correct only where rows never see each other, so run the poison test first. The default ladder was "
    "{mlp_default_ladder_beats_eager} faster than eager on the MLP and {block_default_ladder_beats_eager} on the "
    "transformer block.",
    "Give all buckets one shared pool and capture the largest first: each smaller bucket reuses the memory the "
    "larger ones freed, while one pool per graph adds up (section 5). {mlp_shared_pool_within_target:statement}; "
    "{block_shared_pool_within_target:statement}.",
    "A planner fed with the sizes you saw puts the buckets where the requests are and weighs padding against GPU "
    "time; what that buys over a plain ladder depends on the traffic: "
    "{block_planned_beats_default_ladder:statement}; {mlp_planned_beats_default_ladder:statement}.",
    "Time `torch.compile(mode=\"reduce-overhead\")` after the passes that compile and record its graphs "
    "(section 6), on the same stream as the buckets: "
    "{mlp_default_ladder_beats_reduce_overhead:statement}; {block_default_ladder_beats_reduce_overhead:statement}.",
    "Requests above the largest bucket still run, eagerly, and the kit counts them: watch `stats.eager_overflows`.",
]
results.show_takeaways(STEM, claims, TAKEAWAYS, missing="skip");

# %% [markdown]
# ## Going further (optional)
#
# **The results table**: time per request (the median pass / requests), p50 and p99 of the latency pass, and what
# each strategy built, how long that took, what it holds, and the share of computed rows that were padding.
# `held_mib` is empty for eager (no graphs) and for `reduce-overhead` (one shared pool, C).

# %%
buckets.show_results(results_df, STEM, CUDA)   # without a GPU: the recorded GPU run's table

# %% [markdown]
# ### A. The memory ledger, per pool
# The ledger per strategy, from `torch.cuda.memory_snapshot()` grouped by pool: reserved and allocated bytes of
# the pools and the static buffers. Each strategy gets pools of its own, so what it holds does not depend on what
# was built before it. `Strategies` builds each strategy between two `torch.cuda.empty_cache()` calls, after one
# throwaway build of every size (the first captures of a process load kernels and create workspaces once), so
# `device_used_mib`, the growth of the device memory in use across a build (`torch.cuda.mem_get_info`), keeps
# only what the strategy still holds; it also sees memory outside the allocator, such as the graphs' executables.
# A private pool never reserves less than one allocator segment, however small its bucket (Appendix A).

# %%
if CUDA:
    cols = ["label", "graphs", "pools", "pool_sharing", "pool_reserved_mib", "pool_allocated_mib", "buffers_mib",
            "held_mib"]
    print(lab.ledger.table().query("kind == 'graphs'")[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(lab.memory()[["model", "strategy", "held_mib", "device_used_mib"]].to_string(
        index=False, float_format=lambda v: f"{v:.2f}"))
else:
    print("The ledger reads GPU memory: on a CPU nothing is captured.")

# %% [markdown]
# ### B. The planner
# A fixed ladder spends buckets evenly; the requests do not come evenly. `plan_buckets` takes the sizes you
# observed (`HISTORY`, a separate draw) and picks the bucket sizes that minimise the expected padded *work*,
# subject to a maximum number of graphs and a memory budget, exactly, with a dynamic programme over the distinct
# observed sizes.
#
# What is a padded row worth? `measure_bucket_costs` serves one request of each size on the exact-size graphs and
# takes its **GPU time** (calls queued behind a spin kernel, timed with CUDA events, round-robin over the sizes).
# In a stream, requests queue up behind each other, so a bucket costs the server its GPU time; the wall time of
# one request alone would mostly be the host's work for a small bucket and would let the planner pad small
# requests up for free, on paper. A padded request also writes its padding rows first (one small kernel,
# `pad_us`). The planner minimises the sum over requests of `cost(bucket) - cost(size)`, plus `pad_us` per padded
# request. The memory model is what each bucket added to the shared pool when the exact sizes were captured (the
# capture log); the budget is what the default ladder needs by that model. On a CPU the costs are the eager
# fallback's wall time and only exercise the planner.

# %%
for name in MODELS:
    cost, p = lab.cost_model[name], lab.plans[name]
    shown = ladder(MAX_ROWS, "pow2") + [b for b in (17, 33) if b <= MAX_ROWS]
    print(f"{name}: {'GPU' if CUDA else 'wall (CPU, eager)'} µs per request of b rows:",
          ", ".join(f"{b}: {cost[b]:.1f}" for b in sorted(shown)),
          f"; writing the padding rows of a padded request: {cost.pad_us:.2f} µs")
    print(f"    planned {p.n_graphs} buckets {p.sizes}: expected padding time {p.expected_waste:.2f} µs per request, "
          f"{p.pad_fraction:.1%} of computed rows padded (on the history)")
    for label in FIXED:
        ev = evaluate_buckets(history_sizes, built[name][label].sizes, cost=cost)
        print(f"    {label:22s} {ev['n_graphs']:3d} graphs: expected padding {ev['expected_waste']:7.2f} µs/request, "
              f"{ev['pad_fraction']:.1%} rows padded")

# %% [markdown]
# The planner's curve: the fewest padded rows it can reach with `K` graphs (plain row counts, no cost model, no
# memory limit), on the history. The figure in E puts the fixed ladders next to it: a ladder above the curve
# spends its graphs where few requests fall.

# %%
K_MAX = min(len(set(history_sizes)), 12 if small else 40)
curve = [(k, plan_buckets(history_sizes, max_graphs=k, max_size=MAX_ROWS)) for k in range(1, K_MAX + 1)]
for k, p in curve[:: max(1, K_MAX // 8)]:
    print(f"{k:3d} graphs: {p.pad_fraction:6.1%} of computed rows padded, buckets {p.sizes}")

# %% [markdown]
# ### C. Where `reduce-overhead`'s graphs live
# CUDA graph trees (`torch/_inductor/cudagraph_trees.py`) keep one `CUDAGraphTreeManager` per GPU in thread-local
# storage; it creates one pool (`torch.cuda.graph_pool_handle()`, its `cuda_graphs_thread_pool`) and records every
# graph into it, for *every* function compiled with `reduce-overhead` in that thread: both models and both
# variants here share one pool, and a later recording reuses memory that earlier graphs no longer need. So what
# one variant adds to that pool depends on what was recorded before it: a per-variant number would measure the
# order of the cells. Each `reduce-overhead` row therefore leaves `held_mib` empty, noted "not measurable here",
# and we read the one number that does not depend on the order: the bytes the pool reserves once all four
# variants are recorded (the manager is private API, so a PyTorch that moved it gets "not measurable here" too).
# A batch of one row is specialised either way, so it gets a compile of its own. PyTorch warns once more sizes
# than `torch._inductor.config.triton.cudagraph_dynamic_shape_warn_limit` have been recorded and suggests padding
# inputs to a few fixed shapes; this notebook switches that warning off and counts graph launches itself (D).
# Compiling may also warn that TensorFloat32 tensor cores are "available but not enabled" (newer PyTorch logs it
# as a performance hint instead). The course keeps PyTorch's default, full float32 matrix multiplies, so that every
# variant compares with eager at float32 rounding; section 6 silences that warning.

# %%
if COMPILE:
    print(f"the graph trees' one pool, all {sum(map(len, compiled.values()))} compiled variants together: "
          + (f"{TREES_POOL_MIB:.1f} MiB reserved" if TREES_POOL_MIB == TREES_POOL_MIB
             else "not measurable here (this PyTorch does not expose the graph trees' pool)"))
else:
    print("reduce-overhead ran only on a GPU: the recorded run's pool is in env.json (graph_trees_pool_mib).")

# %% [markdown]
# ### D. Graph launches per request
# Read from the profiler after all timings (a profiler session slows later launches): how many `cudaGraphLaunch`
# calls one pass over the stream makes, per request. A bucketed variant launches exactly one graph per request
# except for the overflow requests; `reduce-overhead` launches one wherever it recorded a graph for that size.

# %%
launches = buckets.launches_per_request(variants, streams, REQUESTS, CUDA)   # in the results table's row order
results_df["graph_launches_per_request"] = list(launches.values())
print(results_df[["case", "variant", "eager_overflows", "graph_launches_per_request"]].to_string(index=False)
      if CUDA else "Graph launches need a GPU: on a CPU no graph runs.")

# %% [markdown]
# ### E. The trade-off over bucket spacing
# Left: time per request of each strategy against its number of graphs (log scale), with the prediction interval
# of its median pass as error bars, and eager and `reduce-overhead` as lines with their intervals as bands.
# Middle: padding, as a share of the rows computed on the stream, and the planner's curve (B). Right: memory held
# and setup time; `reduce-overhead`'s variants share the graph trees' one pool, shown as one bar of its own (C).

# %% tags=["nbval-check-output"]
fig = figures.plot_tradeoff(results_df, info, curve, TREES_POOL_MIB, MODELS, lab.order, CUDA)
plt.show()

# %% [markdown]
# ### F. Every verdict of this run, and the recorded run beside it
# This run's headline verdicts so far (on a CPU, the sentences say that the graphs ran eagerly). The appendices
# run after the exercises: their verdicts, two of the headlines listed here among them (the planner against the
# best ladder, expandable segments), go to `claims.csv` only. Then this run's stream timings beside the last GPU
# run committed to this repository; the full table and figure are in `figures/06_variable_shapes/`.

# %%
summary(claims, ["mlp_default_ladder_beats_eager", "mlp_reduce_overhead_beats_eager", "mlp_default_ladder_beats_single_bucket",
                 "mlp_planned_beats_default_ladder", "mlp_default_ladder_beats_reduce_overhead", "mlp_planned_beats_best_ladder",
                 "block_default_ladder_beats_eager", "block_default_ladder_beats_reduce_overhead",
                 "block_expandable_segments_saves_memory"]);
beside = results.beside_recorded(STEM, timing.table)  # shows the table (None when nothing is recorded)

# %% [markdown]
# ### G. Save the results
# One row per (model, variant) of the stream comparison, the memory ledger rows (`case` ending in "memory", and on
# a GPU one row for the graph trees' shared pool) and the planner's curve (`case` "planner curve"), with the
# machine in `env.json`, the verdicts in `claims.csv` and the figure as PNG, in the folder printed below
# (`build/figures/` by default, with or without a GPU; only `python -m cudagraph_kit reproduce` on a GPU publishes
# to the recorded `figures/`). Appendix C adds its rows and saves again.

# %%
pool_rows, checks = [], []  # filled by the appendix (allocator settings; planned vs the best fixed ladder)


def save_all(h2h=None):
    mem_rows = [{"case": f"{m_}: memory", "variant": k, "median_us": float("nan"), "speedup": float("nan"), **v}
                for m_ in info for k, v in info[m_].items()]
    if COMPILE:
        mem_rows.append({"case": "reduce-overhead: memory", "variant": "graph trees' pool, all compiled variants",
                         "median_us": float("nan"), "speedup": float("nan"), "held_mib": TREES_POOL_MIB,
                         "pool_mib": TREES_POOL_MIB, "memory_note": "one pool per GPU and thread, shared by every "
                         "function compiled with mode='reduce-overhead' (both models, both variants)"})
    curve_rows = [{"case": "planner curve", "variant": f"planned, at most {k} graphs", "median_us": float("nan"),
                   "speedup": float("nan"), "graphs": p.n_graphs, "pad_fraction": p.pad_fraction,
                   "padded_rows_per_request": p.padded_rows_per_request, "bucket_sizes": " ".join(map(str, p.sizes))}
                  for k, p in curve]
    all_rows = pd.concat([results_df, h2h, pd.DataFrame(mem_rows), pd.DataFrame(curve_rows)], ignore_index=True)
    extra = {"max_rows": MAX_ROWS, "requests": REQUESTS, "history": HISTORY, "seed": SEED, "windows": WINDOWS,
             "samples_per_window": SAMPLES, "evidence": evidence, "planned_vs_best": checks,
             "allocator_fragmentation": pool_rows,
             "graph_trees_pool_mib": TREES_POOL_MIB if TREES_POOL_MIB == TREES_POOL_MIB else None}
    folder = results.save(STEM, all_rows, figures={"tradeoff": fig}, extra_env=extra)
    save_claims(folder, claims)
    return folder


print("saved to", save_all())

# %% [markdown]
# ### H. Side by side with published figures
#
# Two published observations this notebook measures again. A detector that captured graphs for 11 input
# resolutions reserved 38.2 GiB with a pool per graph and 11.4 GiB with one shared pool
# ([roboflow/rf-detr #1490](https://github.com/roboflow/rf-detr/issues/1490)). A user of `reduce-overhead` with
# dynamically padded inputs saw one graph recorded per distinct length and a 1.5x speedup fall to about none
# ([pytorch/pytorch #188150](https://github.com/pytorch/pytorch/issues/188150)).

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED = pd.DataFrame({
    "observation": ["pool per graph / shared pool (memory)", "reduce-overhead speedup with varying shapes"],
    "published": ["38.2 GiB / 11.4 GiB = 3.35x (11 resolutions)", "1.5x -> about 1x (one graph per length)"],
})
print(PUBLISHED.to_string(index=False))

# %%
for e in evidence:
    if e["check"].startswith("default ladder: one pool per graph"):
        print(f"{e['model']}, this run: one pool per graph holds {e['value']:.2f}x the shared pool's memory")
print("\n".join(c.statement for c in claims if "reduce_overhead" in c.claim and c.claim.endswith("beats_eager"))
      or "reduce-overhead needs a GPU: section 8 showed the recorded run's verdicts.")

# %% [markdown]
# **What sets these numbers.** How much sharing a pool saves depends on the number of graphs and on the memory
# each private pool keeps: the detector's private pools each kept a whole forward pass's activations. The models
# here are small, but a private pool never reserves less than one allocator segment
# (2 MiB for small blocks, Appendix A), so for the MLP, whose activations fit in one segment, the ratio mostly
# counts pools: the default ladder's graphs against one shared pool. `reduce-overhead` only replays a graph for
# a size it has already recorded: on this stream the first passes paid for compiling and recording (the setup
# column), and in service every size not seen before would cost a recording again, while a bucket ladder is
# captured once, before the first request.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU the buckets run eagerly, padding and slicing exactly as graphs do, so the planning and the
# poison test are checked there too.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb06_variable_shapes.py`
# (try first).

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.exercises.nb06_variable_shapes import MIXING_WHY, check_batch_mixing, check_uniform_plan

# %% [markdown]
# ### Exercise 1: buckets for uniform traffic
# The planner of section 5 learned from skewed traffic: many small requests. Suppose the traffic changes and
# every size from 1 to `MAX_ROWS` becomes equally likely. Draw `HISTORY` such sizes
# (`torch.randint(1, MAX_ROWS + 1, (HISTORY,), generator=torch.Generator().manual_seed(SEED + 3))`), plan buckets
# for them with `plan_buckets(..., max_graphs=len(ladder(MAX_ROWS)), max_size=MAX_ROWS)` (as many graphs as the
# default ladder), and compare the padding of the plan, of the default ladder and of a plan made on
# `history_sizes` with `evaluate_buckets`, on both kinds of traffic. Compared with the plan of as many graphs on
# `history_sizes`, did the buckets move to `"larger"` or `"smaller"` sizes (their mean), or stay the `"same"`?
# Then capture the plan for the MLP (`capture_buckets(mlp, sample, sizes=..., eager_fallback=True)`) and
# `verify` it on padded requests before anything else.

# %% tags=["nbval-check-output"]
uniform_sizes = ...  # HISTORY request sizes, uniform over 1..MAX_ROWS
uniform_plan = ...   # plan_buckets(uniform_sizes, max_graphs=len(ladder(MAX_ROWS)), max_size=MAX_ROWS)
moved = ...          # "larger", "smaller" or "same"
serve_uniform = ...  # capture_buckets(mlp, sample, sizes=uniform_plan.sizes, eager_fallback=True)

# %% tags=["nbval-check-output"]
check_uniform_plan(uniform_sizes, uniform_plan, moved, serve_uniform, max_rows=MAX_ROWS, skewed_sizes=history_sizes,
                   reference=built["MLP"][DEFAULT])

# %% [markdown]
# ### Exercise 2: a block whose rows see each other
# Padding is only correct when rows never see each other (section 2). Write `BatchMixingBlock`, a subclass of
# `Block` whose attention runs across the requests (the batch dimension) instead of within each one: for
# example, swap the first two dimensions before and after `Block.forward`, so that the requests become the
# sequence. Bucket it (`capture_buckets(model, data["transformer block"][:MAX_ROWS], eager_fallback=True)`) and
# `verify` a request whose size is not a bucket. What does it report, and why must such a model never be padded?
# Pick one of the options printed below.

# %% tags=["nbval-check-output"]
class BatchMixingBlock(Block):
    ...  # your code: forward(self, x) with attention across dim 0


mixing_leak = ...  # serve.verify(x) for a padded request x
why = ...          # "a", "b" or "c"
print("\n".join(f"{key}) {text}" for key, text in MIXING_WHY.items()))

# %% tags=["nbval-check-output"]
check_batch_mixing(BatchMixingBlock, mixing_leak, why, d_block=D_BLOCK, heads=HEADS,
                   sample=data["transformer block"][:MAX_ROWS])

# %% [markdown]
# ## Appendix A: why a shared pool can hold more than its largest bucket
#
# **Fragmentation.** The caching allocator
# carves memory into *segments* (2 MiB for small blocks, 20 MiB or the rounded request for large ones) and
# hands out blocks from them. The largest bucket's capture leaves segments shaped by its own requests; a
# smaller bucket asks for other sizes, in another order, and when no free block of the pool fits, the pool
# grows by a new segment although the free memory would suffice in total: fragmentation. The allocator's
# `expandable_segments` option (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, see PyTorch's CUDA
# semantics notes) maps memory into one growing segment per stream and pool instead, so freed space can be
# reused whatever the request sizes. Set it in the environment before Python starts; here it is switched at run
# time with `torch.cuda.memory._set_allocator_settings` (what PyTorch's own tests do; it applies to segments
# created from then on; recent PyTorch warns that this private function is deprecated, and it still applies) to compare both settings in one process: the transformer block's default ladder in a
# shared pool against its largest bucket alone, each size checked against eager first (`verify`).

# %%
def pool_held(name, sizes):
    """Bytes reserved by the shared pool of ``sizes`` buckets of model ``name``, after checking every size."""
    model, _ = MODELS[name]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    serve = capture_buckets(model, data[name][:MAX_ROWS], sizes=sizes)
    worst = max(serve.verify(data[name][:n]) for n in range(1, MAX_ROWS + 1))  # correct before measuring
    assert worst < 1e-3, f"a bucketed graph disagrees with eager (max |err| {worst:.2e})"
    return pool_usage()[tuple(serve.graphs[MAX_ROWS].pool())]["reserved"]


set_allocator = getattr(torch.cuda.memory, "_set_allocator_settings", None)
if CUDA and set_allocator is not None:
    for setting in ("expandable_segments:False", "expandable_segments:True"):
        set_allocator(setting)       # what PYTORCH_CUDA_ALLOC_CONF sets; from here on, for new segments
        try:
            alone, ladder_held = pool_held("transformer block", [MAX_ROWS]), pool_held("transformer block", ladder(MAX_ROWS))
        finally:
            set_allocator("expandable_segments:False")
        pool_rows.append({"allocator": setting, "largest bucket alone (MiB)": alone / MiB,
                          "default ladder, shared pool (MiB)": ladder_held / MiB, "ladder / alone": ladder_held / alone})
    pool_table = pd.DataFrame(pool_rows)
    print("transformer block, shared-pool memory only (the static buffers are the same in every row):")
    print(pool_table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    off, on = pool_table["ladder / alone"]
    evidence.append({"model": "transformer block", "check": "default ladder (shared pool, expandable_segments:True) / "
                     "largest bucket alone, pools only", "value": on, "target": "<= 1.2"})
    # a verdict on allocator bytes: one reading, no timing noise in it, so its interval is the point itself
    saving = off / on if on > 0 else float("nan")
    said = (f"the default ladder's shared pool takes {on:.2f}x the memory of its largest bucket alone with "
            f"expandable segments, {off:.2f}x without")
    claims.append(Claim(
        "block_expandable_segments_saves_memory", lo=saving, hi=saving, above=1.05,
        holds=f"transformer block: expandable segments save memory: {said} ({{lo:.2f}}x less; allocator bytes, "
              "one reading)",
        fails=f"transformer block: expandable segments save less than 5%: {said} (allocator bytes, one reading)",
        unclear=f"transformer block: the saving from expandable segments is too close to 5% to call: {said}"))
    print(claims[-1].statement)
else:
    print("Needs a GPU (and torch.cuda.memory._set_allocator_settings): the allocator's segments are CUDA memory.")

# %% [markdown]
# ## Appendix B: the ledger on any graph the kit makes
# The ledger reads any graph the kit makes: a `capture()` result, a `BucketedGraphs`, and a
# `capture_train_step` step (after its warm-up steps, on the call that captures it), each with its pool and
# its static buffers.

# %%
demo = MemoryLedger()
g_one = capture(mlp, data["MLP"][:8], eager_fallback=True)
demo.record("capture(): MLP, 8 rows", g_one)
demo.record("capture_buckets(): MLP, default ladder", built["MLP"][DEFAULT])
with torch.enable_grad():
    net = models.make_mlp(D_MLP, H_MLP).to(DEVICE)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batch = (data["MLP"][:8], data["MLP"][8:16])
    step = capture_train_step(net, opt, nn.MSELoss(), batch, eager_fallback=True)
    for _ in range(5):                          # 3 eager warm-up steps, the capture, one replay
        step(*batch)
demo.record("capture_train_step(): MLP + SGD, 8 rows", step)
print(demo.table().drop(columns=["kind"]).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
del g_one, step, net, opt

# %% [markdown]
# ## Appendix C: planned buckets against the best fixed ladder
#
# This run's pick of a fixed ladder for each model is the one with the shortest median pass in section 8 (a pick,
# not a verdict: ladders whose intervals overlap may swap places in another run). We plan again with its number
# of graphs and its memory (by the same memory model) as the limits, capture the plan, and time the two against
# each other in `WINDOWS` windows, the ladder first: the planned row's speedup is ladder time / planned time.

# %%
PLANNED_AT_BEST = "planned at the best ladder's limits"
as_timed = (lambda s: s if CUDA else f"{s} (eager fallback)")  # noqa: E731
pairs, h2h_cases = {}, {}
for name in MODELS:
    timed = results_df[(results_df.case == name) & results_df.variant.map(strategy).isin(FIXED)]
    best = strategy(timed.sort_values("median_us").variant.iloc[0])   # this run's pick, not a verdict
    plan = lab.plan_for(name, len(built[name][best].sizes), built[name][best].sizes, history_sizes)
    built[name][PLANNED_AT_BEST] = lab.build(name, PLANNED_AT_BEST, plan.sizes)
    pairs[name] = (best, plan)
    h2h_cases[f"{name}: planned vs best fixed ladder"] = {
        as_timed(s): (lambda fn=built[name][s], reqs=streams[name]: run_stream(fn, reqs)) for s in (best, PLANNED_AT_BEST)}
h2h_timing = measure(h2h_cases, windows=WINDOWS, samples=SAMPLES, calls=1, pause_s=WINDOW_PAUSE_S, floor=CUDA,
                     progress=lambda line: print(line.split(":")[0], end="  "))
print()  # end the line of window progress before the verdicts

head_to_head = []
for name, (best, plan) in pairs.items():
    case = f"{name}: planned vs best fixed ladder"
    for lbl in (best, PLANNED_AT_BEST):
        r = h2h_timing.row(case, lbl).to_dict()
        head_to_head.append({**r, "window_medians_us": window_medians(h2h_timing.windows, case, r["variant"]),
                             "graphs": info[name][lbl]["graphs"], "setup_s": info[name][lbl]["setup_s"],
                             "held_mib": info[name][lbl]["held_mib"], "pool_mib": info[name][lbl]["pool_mib"],
                             "requests": REQUESTS, "us_per_request": r["median_us"] / REQUESTS,
                             "bucket_sizes": " ".join(map(str, built[name][lbl].sizes)),
                             "pad_fraction": evaluate_buckets(stream_sizes, built[name][lbl].sizes)["pad_fraction"],
                             "device": results_df["device"].iloc[0]})
    c = speedup(h2h_timing, f"{SHORT[name]}_planned_beats_best_ladder", case, PLANNED_AT_BEST,
                subject=f"{name}: {phrase(PLANNED_AT_BEST)}",
                than=f"{phrase(best)} (the fastest fixed ladder in section 8)")
    claims.append(c)
    lo, hi = h2h_timing.interval(case, PLANNED_AT_BEST)
    checks.append({"model": name, "best fixed ladder": best, "ladder graphs": len(built[name][best].sizes),
                   "planned graphs": plan.n_graphs, "ladder / planned time": float(h2h_timing.row(case, PLANNED_AT_BEST).speedup),
                   "interval": f"{lo:.3f} .. {hi:.3f}" if lo == lo and hi == hi else "-",
                   "verdict": c.verdict, "statement": c.statement,
                   "ladder held MiB": info[name][best]["held_mib"], "planned held MiB": info[name][PLANNED_AT_BEST]["held_mib"]})
    print(c.statement)
h2h = pd.DataFrame(head_to_head)
print("saved again, with the appendix's rows:", save_all(h2h))
