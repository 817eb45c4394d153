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
# # 04 · ResNet-50 with CUDA graphs: inference batch sweep, a real training loop, accuracy parity
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/04_resnet50.ipynb)
#
# Three of the published CUDA-graph experiments use ResNet-50: the MXNet pull request (fp16 inference on a
# V100), the timm pull request (AMP training, with accuracy parity as the point) and the TorchAcc guide
# (synthetic-data training on an A100). This notebook runs all three on one real model, torchvision's
# `resnet50` with random weights (nothing is downloaded), and trains a small CNN on a real data set to check
# whether a graphed loop with an LR schedule and gradient clipping learns like the eager one.
#
# **What you'll learn**
# - How much a CUDA graph saves for ResNet-50 inference at batch 1, 2, 4, ..., 128, and the mechanism that makes
#   the gain depend on the batch: the host time an eager forward spends per kernel against the GPU-busy floor.
# - How to quote such a gain so that a rerun agrees: several timing windows, a median with a 90% prediction
#   interval, and verdicts ("pays", "stops paying", "faster") computed from those intervals.
# - How to graph a whole AMP training step the way a real loop runs it: LR scheduler (warm-up + cosine),
#   gradient clipping, gradient accumulation, bf16 or fp16 + `GradScaler`, the short last batch, and a
#   `DataLoader` with pinned memory feeding the graph's static inputs.
# - The loop before and after: which few lines change when the graph logic lives in a wrapper
#   (`capture_train_step`) instead of the training loop.
# - How to check that the graphed run reaches the same validation accuracy, epoch by epoch, as the eager run.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU; a T4, compute capability 7.5,
# has no bf16 tensor cores, so the notebook skips bf16 there and trains in fp16 + `GradScaler`). Without a GPU
# the notebook runs a tiny eager version on the CPU (ResNet-18 at 32×32, clearly labelled), says so, and shows
# the recorded GPU results.
#
# **How long**: 2.9 min on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25); a T4 has not been timed yet; about
# a minute on a CPU (tiny sizes).

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
SMOKE = None            # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)
SAMPLES = 2             # timing rounds per window (one sample of every variant per round); medians reported
CALLS = None            # calls per timing sample; None lets the kit's timing choose by time
WINDOWS = 3             # timing windows, a pause apart: every interval and verdict comes from them
WINDOW_PAUSE_S = 1.0    # seconds between windows
PAYS = 1.10             # "the graph pays": more than 10% faster than eager (speedup above 1.10)
INFER_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
TRAIN_BATCHES = [32, 128]
LOADER_BATCH = 64       # the data-feeding experiment (TorchAcc's batch size)
LOADER_STEPS = 10       # batches timed per data-feeding measurement, in each window
LOADER_WORKERS = 6      # DataLoader worker processes
PARITY_EPOCHS = 10      # epochs of the accuracy-parity runs (digits)
ACCUMULATE_EPOCHS = 2   # epochs of the gradient-accumulation check (digits)

# %%
import contextlib
import copy
import math
import multiprocessing
import os
import re
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torchvision

from cudagraph_kit import (capture, capture_train_step, combine_windows, compare, env_table, has_cuda,
                           prediction_interval, ratio_across_windows)
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import Claim, save_claims

STEM = "04_resnet50"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the tiny CPU part runs
ARCH, IMAGE = "resnet50", 224
if SMOKE:  # tiny and clearly labelled: ResNet-50 at 224x224 takes seconds per step on a CPU
    ARCH, IMAGE = "resnet18", 32
    SAMPLES, CALLS = 2, 1
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
    # training batch 8 on a GPU: with 2 images BatchNorm's batch statistics make a few steps on one repeated
    # batch chaotic, which amplifies AdamW's eager-vs-capturable rounding (batch 2 keeps the CPU run short)
    INFER_BATCHES, TRAIN_BATCHES = [1, 2], ([8] if CUDA else [2])
    LOADER_BATCH, LOADER_STEPS, LOADER_WORKERS = 2, 3, 2
    PARITY_EPOCHS, ACCUMULATE_EPOCHS = 2, 1
DEVICE = "cuda" if CUDA else "cpu"
# bf16 only where the GPU has bf16 tensor cores: compute capability 8.0 (Ampere) or newer. Not
# torch.cuda.is_bf16_supported(): by default (including_emulation=True) it also answers True where bf16 is only
# emulated, e.g. on a T4 (7.5), and timing an emulation would say nothing about bf16.
CAPABILITY = torch.cuda.get_device_capability(0) if CUDA else None
BF16 = CUDA and CAPABILITY >= (8, 0)
SEED = 0
torch.manual_seed(SEED)
print(env_table())
print(f"\nmodel: torchvision {ARCH}, random weights, {IMAGE}x{IMAGE} images"
      + ("  (SMOKE: a tiny stand-in for ResNet-50 at 224x224)" if SMOKE else ""))
print(f"timing: {WINDOWS} windows of {SAMPLES} rounds each, {WINDOW_PAUSE_S:g} s apart; 'the graph pays' means "
      f"more than {100 * (PAYS - 1):.0f}% faster than eager (speedup above {PAYS:.2f}x)")
if CUDA and not BF16:
    print(f"bf16 skipped: {torch.cuda.get_device_name(0)} has compute capability {CAPABILITY[0]}.{CAPABILITY[1]}; "
          f"bf16 tensor cores need 8.0 or newer. Below that PyTorch can emulate bf16 "
          f"(torch.cuda.is_bf16_supported() says {torch.cuda.is_bf16_supported()} here), which is not worth timing, "
          f"so this run uses fp16 (with a GradScaler for training).")
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run executes every experiment eagerly on\n"
          ">>> the CPU at tiny sizes (everything is labelled 'eager'); the GPU results recorded in figures/ are\n"
          ">>> shown at the end.")


def progress(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cuda_cleanup():
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def ms(us, missing="not measured"):
    """A time in µs as 'x.xx ms' for prose; a missing value (NaN) in words, never 'nan'."""
    return f"{us / 1e3:.2f} ms" if pd.notna(us) else missing


def interval(lo, hi, fmt=".2f", unit=""):
    """A 90% prediction interval for prose, or words when it is missing (fewer than two windows)."""
    if pd.notna(lo) and pd.notna(hi):
        return f"{lo:{fmt}}-{hi:{fmt}}{unit}"
    return "no interval (fewer than two windows)"


def tag(name):
    """A name as part of a claim id: 'fp16+GradScaler' -> 'fp16gradscaler', 'SGD momentum' -> 'sgdmomentum'."""
    return re.sub(r"[^a-z0-9]+", "", name.lower())


PROFILED = ["executed_as", "floor_us", "kernels_per_call", "copies_per_call", "eager_kernels_per_call"]


def add_profile(window, profile):
    """A timing window's table with the profiler's columns (floor, kernel counts, executed_as) taken from `profile`,
    a separate pass of compare(..., floor=True) run after every timing window: a profiler session slows the host
    work that follows it in the same process (notebook 01, section 4), so no timed window comes after one."""
    keyed = profile.set_index(["case", "variant"])[PROFILED]
    return window.drop(columns=PROFILED).join(keyed, on=["case", "variant"])


def split_cases(table, cases):
    """One compare() table that timed several cases together, its variants named "<key>: <name>" with each key's
    eager variant first -> one block of rows per case. `cases` maps each key to (case, variant labels, extra
    columns). Each row's speedup is its case's eager median over its own median in this window."""
    parts = []
    for key, (case, labels, extra) in cases.items():
        part = table[table.variant.str.startswith(f"{key}: ")].copy()
        assert len(part) == len(labels), f"{key}: {len(part)} timed variants, {len(labels)} labels"
        part["case"], part["variant"] = case, labels
        part["speedup"] = part.median_us.iloc[0] / part.median_us
        for column, value in extra.items():
            part[column] = value
        parts.append(part)
    return pd.concat(parts, ignore_index=True)

# %% [markdown]
# ## 1. Inference: the MXNet experiment, batch 1 to 128
# The model in eval mode, `channels_last` memory format (what cuDNN's fastest convolution kernels want on
# tensor cores), fp16 weights and inputs (and bf16 on GPUs with bf16 tensor cores, compute capability 8.0+).
# A real caller has its input in some other tensor, so the graph's time includes the copy into its static
# input: the graph variant is `g(x)` = `static_x.copy_(x)` + `replay()`.
#
# First the graph by hand, once, at batch 1: the same recipe as notebook 01 (side-stream warm-up, static
# input, capture, copy + replay) applied to a 50-layer network.

# %%
def build_model(dtype, arch=ARCH):
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, arch)(weights=None)
    return model.to(DEVICE, dtype=dtype, memory_format=torch.channels_last).eval()


def image_batch(n, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, IMAGE, IMAGE, generator=g).to(DEVICE, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last)


INFER_DTYPES = {"fp16": torch.float16}
if BF16:  # compute capability 8.0+ (the imports cell says why not torch.cuda.is_bf16_supported())
    INFER_DTYPES["bf16"] = torch.bfloat16
if not CUDA:  # fp16 convolutions are not what a CPU is for: the CPU run uses fp32, labelled as such
    INFER_DTYPES = {"fp32 (CPU)": torch.float32}

if CUDA:
    model = build_model(torch.float16)
    static_x = image_batch(1, torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():   # 1. warm-up on a side stream (cuDNN picks its kernels)
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():   # 2. capture: the kernels are recorded, not run
        static_out = model(static_x)
    new_x = image_batch(1, torch.float16, seed=7)
    static_x.copy_(new_x)                            # 3. new input into the static input, one replay
    graph.replay()
    with torch.no_grad():
        expected = model(new_x)
    torch.testing.assert_close(static_out, expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    print(f"hand-written ResNet-50 graph == eager on a new input (max |diff| "
          f"{(static_out - expected).abs().max().item():.3g}): OK")
    del model, static_x, static_out, graph, new_x, expected
    cuda_cleanup()
else:
    print("skipped: capturing a CUDA graph needs an NVIDIA GPU")

# %% [markdown]
# The sweep uses the kit: `g = capture(infer, x)` does the three steps, and `g(x)` copies and replays. For
# every batch size and dtype we first check the graph's output on a fresh input against eager (correct before
# fast). Then the timing, in `WINDOWS` windows a pause apart, each window going through every batch size once:
# for one batch size, eager and graph of every dtype run in one `compare` call (interleaved rounds, so fp16 and
# bf16 see the same state of the host). The profiler (the floor, i.e. the GPU-busy time per call, and the kernels
# per call) runs once, in a separate pass after all windows: a profiler session slows the host work that follows
# it in the same process (notebook 01, section 4), so no timing window of a section follows its profiler pass.
# `combine_windows` then reports the median of the windows with a 90% **prediction interval**
# (`speedup_lo`..`speedup_hi`): where one more window, taken the same way, should land. A window's speedup is
# that window's eager median over its graph median, for the same dtype.
#
# Why windows: an eager forward is host-bound at small batches, and host time drifts between windows and between
# runs (notebook 01, section 4, shows by how much), while a graph replay hardly moves. One window's numbers, and
# orderings read off them, do not survive a rerun; the verdicts below are computed from the intervals instead.

# %%
GRAPH_INFER = "cuda graph (with input copy)"


def make_infer(model):
    def infer(x):
        with torch.no_grad():
            return model(x)
    return infer


infer_fns = {dname: make_infer(build_model(dtype)) for dname, dtype in INFER_DTYPES.items()}
infer_cases = {}  # batch -> {dtype name: (fresh input, graph, max |graph - eager|, tolerance)}
for bs in INFER_BATCHES:  # capture and check every case first, then time them all in windows
    for dname, dtype in INFER_DTYPES.items():
        infer = infer_fns[dname]
        g = capture(infer, image_batch(bs, dtype), eager_fallback=True)
        fresh = image_batch(bs, dtype, seed=100 + bs)
        out, ref = g(fresh).float(), infer(fresh).float()
        diff = (out - ref).abs().max().item()
        tol = 1e-2 * ref.abs().max().item() + 1e-3
        correct = bool(torch.isfinite(ref).all()) and diff <= tol
        assert correct, f"graph output differs from eager at batch {bs}, {dname}: max |diff| {diff} > {tol}"
        infer_cases.setdefault(bs, {})[dname] = (fresh, g, diff, tol)
        del out, ref
progress(f"captured {len(INFER_BATCHES) * len(INFER_DTYPES)} graphs ({', '.join(INFER_DTYPES)} x batch "
         f"{INFER_BATCHES}); each matches eager on a fresh input")

def time_inference(samples, calls, floor):
    """One pass over every batch size: eager and graph of every dtype of one batch in one compare() call."""
    parts = []
    for bs, per_dtype in infer_cases.items():
        variants, cases = {}, {}
        for dname, (fresh, g, diff, tol) in per_dtype.items():
            infer = infer_fns[dname]
            variants[f"{dname}: eager"] = lambda infer=infer, x=fresh: infer(x)
            variants[f"{dname}: {GRAPH_INFER}"] = lambda g=g, x=fresh: g(x)
            graph_label = GRAPH_INFER if g.mode == "graph" else f"{GRAPH_INFER} (eager fallback)"
            cases[dname] = (f"inference {dname} bs{bs}", ["eager", graph_label],
                            {"section": "inference", "dtype": dname, "batch": bs, "max_abs_diff": [0.0, diff],
                             "tolerance": [tol, tol]})
        df = compare(variants, case=f"inference bs{bs}", samples=samples, calls=calls, floor=floor)
        parts.append(split_cases(df, cases))
    return pd.concat(parts, ignore_index=True)


infer_windows = []
for w in range(WINDOWS):
    infer_windows.append(time_inference(SAMPLES, CALLS, floor=False))
    graphs = infer_windows[-1][infer_windows[-1].variant != "eager"]
    progress(f"inference window {w + 1}/{WINDOWS}: speedups " + ", ".join(
        f"{r.dtype} bs{r.batch} {r.speedup:.2f}x" for r in graphs.itertuples()))
    if w < WINDOWS - 1:
        time.sleep(WINDOW_PAUSE_S)
infer_windows[0] = add_profile(infer_windows[0], time_inference(1, 1, floor=True))  # after all timings
progress("inference: profiler pass done (floors, kernels per call)")
del infer_cases, infer_fns, g, fresh, infer  # free the graphs and models
cuda_cleanup()
inference = combine_windows(infer_windows)
order = {d: i for i, d in enumerate(INFER_DTYPES)}  # rows by dtype, then batch (eager before graph)
inference = inference.sort_values(["dtype", "batch"], key=lambda s: s.map(order) if s.name == "dtype" else s,
                                  kind="stable").reset_index(drop=True)
inference["images_per_s"] = inference.batch / (inference.median_us * 1e-6)
inference[["case", "variant", "executed_as", "median_us", "median_pi_lo", "median_pi_hi", "speedup", "speedup_lo",
           "speedup_hi", "floor_us", "kernels_per_call", "images_per_s", "max_abs_diff"]].round(2)

# %% [markdown]
# ### Does the graph pay, and where does it stop?
# Each verdict below is computed from the intervals, not read off the medians:
# - **pays at batch b**: the graph's speedup interval at that batch lies above `PAYS` (1.10x: more than 10%
#   faster); it does not pay when the whole interval is at or below it; otherwise there is no clear difference.
# - **stops paying**: the smallest batch from which the interval of every larger batch (that one included) lies at
#   or below `PAYS`. If the largest batch's interval lies above `PAYS`, the graph still pays at the end of the
#   sweep; if it straddles `PAYS`, there is no clear point.
# - **best batch** (where the graph gains most): the batch with the largest median speedup, named only if its
#   whole interval lies above every other batch's interval; otherwise there is no clear best batch.
# - **fp16 against bf16**: for each batch, the fp16 time over the bf16 time, window by window (both were timed
#   in the same `compare` call), with its prediction interval (`ratio_across_windows`): bf16 is faster when the
#   whole interval lies above 1.

# %%
PCT = f"{100 * (PAYS - 1):.0f}%"


def pays_claim(claim_id, what, r):
    """`what` (a case and its graph variant) pays: its speedup interval over eager lies above PAYS."""
    return Claim(claim_id, lo=r.speedup_lo, hi=r.speedup_hi, above=PAYS, eager_fallback=r.executed_as == "eager",
                 holds=f"{what}: pays, more than {PCT} faster than eager ({{lo:.2f}}-{{hi:.2f}}x, 90% prediction "
                       f"interval)",
                 fails=f"{what}: does not pay, at most {PCT} faster than eager ({{lo:.2f}}-{{hi:.2f}}x)",
                 unclear=f"{what}: no clear difference from {PAYS:.2f}x (the interval {{lo:.2f}}-{{hi:.2f}}x "
                         f"straddles it)")


def stop_claim(claim_id, what, g):
    """Where `what` stops paying, from the graph rows `g` (indexed by batch, with speedup_lo/hi)."""
    batches = sorted(g.index)
    stop = None
    for b in reversed(batches):  # the smallest batch from which every interval is at or below PAYS
        if g.speedup_hi[b] <= PAYS:
            stop = b
        else:
            break
    if stop is not None:
        tail = g.loc[stop:]
        lo, hi = tail.speedup_lo.min(), tail.speedup_hi.max()
    else:
        lo, hi = g.speedup_lo[batches[-1]], g.speedup_hi[batches[-1]]
    claim = Claim(claim_id, lo=lo, hi=hi, above=PAYS, eager_fallback=bool((g.executed_as == "eager").any()),
                  holds=f"{what}: no stopping point in this sweep: the graph still pays more than {PCT} at batch "
                        f"{batches[-1]}, the largest measured ({{lo:.2f}}-{{hi:.2f}}x)",
                  fails=f"{what}: the graph stops paying from batch {stop}: "
                        + (f"every batch from {stop} to {batches[-1]} has" if stop != batches[-1] else
                           f"batch {stop}, the largest measured, has")
                        + f" its interval at or below {PAYS:.2f}x ({{lo:.2f}}-{{hi:.2f}}x)",
                  unclear=f"{what}: no clear difference from {PAYS:.2f}x at batch {batches[-1]} ({{lo:.2f}}-"
                          f"{{hi:.2f}}x), so no clear point where the graph stops paying")
    return claim, stop


def best_claim(claim_id, what, g):
    """The batch where `what` gains most, named only if its interval lies above every other batch's."""
    best = g.speedup.idxmax()
    others = g.drop(index=best)
    above = others.speedup_hi.max()
    lo, hi = (g.speedup_lo[best], g.speedup_hi[best]) if pd.notna(above) else (float("nan"), float("nan"))
    return Claim(claim_id, lo=lo, hi=hi, above=above if pd.notna(above) else PAYS,
                 eager_fallback=bool((g.executed_as == "eager").any()),
                 holds=f"{what}: the graph gains most at batch {best}: its interval {{lo:.2f}}-{{hi:.2f}}x lies "
                       f"above every other batch's (the highest of them ends at {{above:.2f}}x)",
                 fails=f"{what}: no clear best batch: batch {best} has the largest median speedup, but its interval "
                       f"{{lo:.2f}}-{{hi:.2f}}x lies below another batch's upper end {{above:.2f}}x",
                 unclear=f"{what}: no clear difference between the batches at the top: no clear best batch (batch "
                         f"{best} has the largest median speedup, its interval {{lo:.2f}}-{{hi:.2f}}x overlaps "
                         f"another batch's, which ends at {{above:.2f}}x)")


def faster_claim(claim_id, what, frames, slow, fast, slow_name, fast_name):
    """`fast_name` is faster than `slow_name`: the ratio slow time / fast time, window by window, lies above 1.
    `slow` and `fast` are (case, variant) rows found in every window's table."""
    r = ratio_across_windows(frames, slow, fast)
    ratio = f"{slow_name} time / {fast_name} time {{lo:.3f}}-{{hi:.3f}}"
    return Claim(claim_id, lo=r["lo"], hi=r["hi"], above=1.0,
                 holds=f"{what}: {fast_name} is faster than {slow_name} ({ratio}, 90% prediction interval)",
                 fails=f"{what}: {fast_name} is not faster than {slow_name} ({ratio})",
                 unclear=f"{what}: no clear difference between {slow_name} and {fast_name} ({ratio} straddles 1)")


def rows(df, variant, **where):
    sel = df[df.variant.str.startswith(variant)]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    return sel.sort_values("batch")


def variant_of(frame, case, prefix):
    """The label the rows of `case` whose variant starts with `prefix` carry (e.g. with '(eager fallback)')."""
    return frame[(frame.case == case) & frame.variant.str.startswith(prefix)].variant.iloc[0]


infer_claims, curve = [], {}
for dname in INFER_DTYPES:
    e = rows(inference, "eager", dtype=dname).set_index("batch")
    g = rows(inference, "cuda graph", dtype=dname).set_index("batch")
    for b in g.index:
        infer_claims.append(pays_claim(f"infer_{tag(dname)}_bs{b}_graph_pays", f"{dname} batch {b:3d}, {g.variant[b]}",
                                       g.loc[b]))
    stop, stop_at = stop_claim(f"infer_{tag(dname)}_pays_at_large_batches", dname, g)
    infer_claims += [stop, best_claim(f"infer_{tag(dname)}_best_batch", dname, g)]
    curve[dname] = {"eager": e, "graph": g, "stop": stop_at}
if len(INFER_DTYPES) == 2:  # fp16 and bf16, timed in the same compare() call at each batch
    (a, b) = INFER_DTYPES
    for bs in INFER_BATCHES:
        for kind, prefix in [("graph", "cuda graph"), ("eager", "eager")]:
            ca, cb = f"inference {a} bs{bs}", f"inference {b} bs{bs}"
            infer_claims.append(faster_claim(
                f"infer_bs{bs}_{kind}_{tag(b)}_faster", f"batch {bs:3d}, {kind}", infer_windows,
                (ca, variant_of(infer_windows[0], ca, prefix)), (cb, variant_of(infer_windows[0], cb, prefix)),
                a, b))
for c in infer_claims:
    print(f"[{c.verdict}] {c.statement}")

# %% [markdown]
# ### Why the curve has this shape
# An eager forward runs one op after another from Python. For each op the CPU runs Python, PyTorch's
# dispatcher and ATen's operator code, and launches the kernel: host time that does not grow with the batch
# size. The GPU then needs some time to run the kernel, which does grow with the batch. So an eager call costs
# about `max(kernels × host time per kernel, floor)`: while the first term is the larger, the GPU waits for the
# CPU (launch-bound); once the floor is the larger, the CPU waits for the GPU (GPU-bound). A graph launches all
# kernels with one call, so it costs close to the floor at every batch (the `vs_floor` column says how close).
#
# We estimate the **eager host time per kernel** where the eager call is most host-bound, at the smallest
# batch: the eager time per call divided by the kernels per call. It is everything the host spends per op
# (Python, dispatcher, ATen, the launch call), not the bare `cudaLaunchKernel` cost, and it moves with the host
# from window to window, so it comes with an interval. The cell below prints, for every batch, that model's
# eager time `max(kernels × host time, floor)` (the floor of the graph row: about the same kernels, plus the
# input copy) against the measured eager time, as a ratio: the measurement need not follow the model, since
# host work and GPU work overlap only in part. (The model is exact at the smallest batch, where the host time
# was estimated.)

# %%
for dname, c in curve.items():
    e, g = c["eager"], c["graph"]
    b0 = e.index.min()
    k0 = e.kernels_per_call[b0]
    if CUDA and pd.notna(k0) and k0 > 0:
        host_us = e.median_us[b0] / k0
        host_lo, host_hi = e.median_pi_lo[b0] / k0, e.median_pi_hi[b0] / k0
    else:
        host_us = host_lo = host_hi = float("nan")
    # "launch_us" keeps the name exercise 1 reads; it is the eager host time per kernel, not the launch alone
    c.update(host_us=host_us, launch_us=host_us, host_line_us=e.kernels_per_call * host_us,
             predicted_us=pd.concat([e.kernels_per_call * host_us, g.floor_us], axis=1).max(axis=1, skipna=False))
    if not CUDA:
        print(f"{dname} on the CPU: eager only (no host-time analysis without a GPU); times per batch "
              f"{[round(t / 1e3, 2) for t in e.median_us]} ms")
        continue
    if pd.isna(host_us):
        print(f"{dname}: the profiler counted no kernels for the eager forward at batch {b0}: no host-time estimate")
        continue
    print(f"{dname}: {k0:.0f} kernels per forward at batch {b0}; eager {ms(e.median_us[b0])} per forward -> eager "
          f"host time per kernel {host_us:.1f} µs (90% prediction interval "
          f"{interval(host_lo, host_hi, '.1f', ' µs')})")
    ratio = e.median_us / c["predicted_us"]
    for b in g.index:
        print(f"  batch {b:3d}: kernels x host time {ms(c['host_line_us'][b])}, graph floor "
              f"{ms(g.floor_us[b], 'not measured')} -> model {ms(c['predicted_us'][b])}; measured eager "
              f"{ms(e.median_us[b])} ({interval(e.median_pi_lo[b] / 1e3, e.median_pi_hi[b] / 1e3, unit=' ms')}), "
              + (f"measured / model {ratio[b]:.2f}" if pd.notna(ratio[b]) else "no model value (no floor)")
              + f"; graph {ms(g.median_us[b])}"
              + (f" = {g.vs_floor[b]:.2f}x its floor" if pd.notna(g.vs_floor[b]) else ""))
    away = ratio.drop(index=b0).dropna()
    if len(away):
        print(f"  -> measured / model eager time away from batch {b0}: {away.min():.2f} to {away.max():.2f} "
              f"(median {away.median():.2f})")

# %%
where = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only, no graphs)"
fig_infer, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.2))
for i, (dname, c) in enumerate(curve.items()):
    e, g = c["eager"], c["graph"]
    col = f"C{i}"
    ax_t.plot(e.index, e.median_us / 1e3, "o-", color=col, label=f"{dname} eager")
    ax_t.fill_between(e.index, e.median_pi_lo / 1e3, e.median_pi_hi / 1e3, color=col, alpha=0.15)
    ax_t.plot(g.index, g.median_us / 1e3, "s-", color=col, alpha=0.6,
              label=f"{dname} {'graph' if CUDA else 'kit, eager fallback'}")
    if CUDA:
        ax_t.plot(g.index, g.floor_us / 1e3, ":", color=col, label=f"{dname} floor (GPU busy)")
        if pd.notna(c["host_us"]):
            ax_t.plot(e.index, c["host_line_us"] / 1e3, "--", color=col, lw=1,
                      label=f"{dname} kernels x {c['host_us']:.1f} µs eager host time")
    ax_s.plot(g.index, g.speedup, "o-", color=col, label=f"{dname} (band: 90% prediction interval)")
    ax_s.fill_between(g.index, g.speedup_lo, g.speedup_hi, color=col, alpha=0.2)
    if c["stop"] is not None:
        ax_s.axvline(c["stop"], color=col, ls=":", lw=1)
ax_t.set(xscale="log", yscale="log", xlabel="batch size", ylabel="time per batch (ms)",
         title=f"{ARCH} inference, {IMAGE}x{IMAGE}, channels_last (band: eager 90% PI)")
ax_s.axhline(PAYS, color="grey", lw=1, ls="--", label=f"{PAYS:.2f}x: the graph pays above")
ax_s.axhline(1.0, color="black", lw=0.8)
ax_s.set(xscale="log", yscale="log", xlabel="batch size", ylabel="speedup of the graph over eager (x)",
         title="speedup vs batch size (dotted: where the graph stops paying, if clear)")
for ax in (ax_t, ax_s):
    ax.set_xticks(INFER_BATCHES, [str(b) for b in INFER_BATCHES])
    ax.legend(fontsize=7)
fig_infer.suptitle(f"Eager vs CUDA graph inference on {where}")
fig_infer.tight_layout()

# %% [markdown]
# ## 2. Training: the timm and TorchAcc experiments, the way a real loop runs them
# ### The loop, before and after
# An eager AMP training loop with the pieces real loops have (warm-up + cosine LR schedule, gradient
# clipping, mixed precision):
#
# ```python
# opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
# sched = warmup_cosine(opt)                       # LinearLR then CosineAnnealingLR, in SequentialLR
# for x, y in loader:
#     x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
#     opt.zero_grad(set_to_none=True)
#     with torch.autocast("cuda", dtype=torch.bfloat16):
#         loss = loss_fn(model(x), y)
#     loss.backward()
#     torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
#     opt.step()
#     sched.step()
# ```
#
# The same loop with the whole step as one CUDA graph. The lines that change are marked; everything else,
# the scheduler included, stays as it was:
#
# ```python
# opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)        # (1) fused: reads a GPU LR
# sched = warmup_cosine(opt)
# step = capture_train_step(model, opt, loss_fn, sample_batch=(x0, y0),              # (2) build the step once
#                           amp_dtype=torch.bfloat16, max_grad_norm=1.0)
# for x, y in loader:
#     x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
#     loss = step(x, y)                                                              # (3) zero_grad ... step
#     sched.step()
# ```
#
# TorchAcc advertised a 3-line change; the timm maintainer turned down a CUDA-graph pull request because the
# graph logic made "a mess of the train loop" and asked for it in a wrapper, a state machine around the
# optimizer step. `capture_train_step` is that wrapper: the first calls run eagerly (warm-up), one call
# captures, the rest copy the batch into static tensors and replay. Inside it:
#
# - **LR schedule.** A graph bakes Python numbers into its kernels, so an LR stored as a float would be
#   frozen at capture. The step keeps each group's LR in a GPU tensor that the captured optimizer reads, and
#   copies `group["lr"]` into it before each replay; the scheduler keeps writing plain floats. That needs an
#   optimizer that reads a *tensor* LR on the GPU: `SGD(fused=True)` and `Adam`/`AdamW(capturable=True)` do;
#   plain `SGD` passes the LR to its kernels as a host number, so the kit refuses a scheduler on it with an
#   error naming the fix, instead of training silently at a constant LR.
# - **Clipping.** `clip_grad_norm_(..., error_if_nonfinite=False)` computes the norm and scales the gradients
#   entirely on the GPU (the non-finite check is what would read the norm on the CPU), so it is captured.
# - **fp16 + `GradScaler`** (the T4 path): the scaler skips the optimizer step when gradients overflow, and
#   whether that reads a value on the CPU depends on the optimizer (PyTorch's `torch/amp/grad_scaler.py`,
#   `GradScaler.step`). An optimizer without fused scale handling (plain or `foreach` SGD, Adam, AdamW:
#   `_step_supports_amp_scaling` is False) goes through `_maybe_opt_step`, which reads the found-inf flags with
#   `.item()`: a host-GPU synchronization every step, which a capture forbids. An optimizer built with
#   `fused=True`, such as the `SGD(fused=True)` above, has `_step_supports_amp_scaling` set: `scaler.step` hands
#   it the scale and the found-inf flag as GPU tensors, and the fused kernel unscales and skips the update on the
#   GPU, with no CPU read (PyTorch's own test `test_graph_scaling_fused_optimizers` captures `scaler.step` and
#   `scaler.update` with fused optimizers). `scaler.update()` stays on the GPU either way. The kit keeps one
#   design for every optimizer: the graph captures forward and `scaler.scale(loss).backward()`; then
#   `scaler.unscale_` (before clipping, so the clip sees true gradients), clipping, `scaler.step` and
#   `scaler.update` run eagerly after the replay (with a fused optimizer: launches, no synchronization). bf16
#   needs no scaler and the whole step is one graph.
# - **Gradient accumulation** fits the state machine: with `accumulate=k` each call is one micro-batch and
#   every k-th call steps. There is one graph per position in the window (the first writes fresh gradients,
#   the middle ones add to them, the last adds, clips and steps), sharing one memory pool. Section 4 checks it.
# - **The short last batch** of an epoch has another shape: it runs as an eager step on the same parameters
#   and gradient buffers, and the graph continues afterwards.
#
# ### Time per training step
# Synthetic data as TorchAcc used: random `uint8` images (what a decoder hands over) converted to float on
# the GPU inside the model, random labels, 1000 classes. Two optimizers, with their settings in every label:
# - **SGD momentum**: `SGD(lr=0.01, momentum=0.9)` with its default implementation (foreach on the GPU), the
#   same object type eagerly and in the graph;
# - **AdamW**: `AdamW(lr=1e-3, foreach=True)`; eagerly with the default `capturable=False` (its step count lives
#   on the CPU), in the graph with `capturable=True` (the step count lives on the GPU, which a graph needs). So
#   the eager AdamW baseline here is the default implementation, not the capturable one that notebook 02 times
#   eagerly: the labels say which is which.
#
# Before timing, both variants train a few steps from the same weights on the same batch and we compare the
# losses. The timing then follows section 1: `WINDOWS` windows a pause apart, then the profiler pass.
# On a bf16 GPU the smallest batch also runs the fp16 + `GradScaler` path; bf16 and fp16 of one batch and
# optimizer are timed in the same `compare` call, so their times can be compared window by window.

# %%
class ToFloat(torch.nn.Module):
    """uint8 images (as a data loader delivers them) -> float in [-1, 1], channels_last, on the GPU."""

    def forward(self, x):
        return (x.float() / 127.5 - 1.0).contiguous(memory_format=torch.channels_last)


def build_train_model(arch=ARCH):
    torch.manual_seed(SEED)
    net = getattr(torchvision.models, arch)(weights=None, num_classes=1000)
    return torch.nn.Sequential(ToFloat(), net).to(DEVICE, memory_format=torch.channels_last).train()


def train_batch(n, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, IMAGE, IMAGE), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 1000, (n,), generator=g)
    return x.to(DEVICE), y.to(DEVICE)


OPTIMIZERS = {  # name -> the label every table and verdict carries: the settings of both sides
    "SGD momentum": "SGD momentum (default implementation, eager and graph)",
    "AdamW": "AdamW foreach (eager: capturable=False, the default; graph: capturable=True)",
}


def make_optimizer(name, params, graphed):
    if name == "SGD momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    # eagerly the default AdamW (capturable=False); a graph needs capturable=True (the step count on the GPU)
    return torch.optim.AdamW(params, lr=1e-3, foreach=True, capturable=graphed and CUDA)


# the AMP paths: bf16 on a GPU with bf16 tensor cores; fp16 + GradScaler otherwise (T4), and on a bf16 GPU also
# at the smallest batch, timed beside bf16
MAIN_AMP = ("bf16" if BF16 else "fp16+GradScaler") if CUDA else "fp32 (CPU)"


def amps_at(bs):
    return [MAIN_AMP, "fp16+GradScaler"] if BF16 and bs == TRAIN_BATCHES[0] else [MAIN_AMP]


AMP = {"bf16": torch.bfloat16, "fp16+GradScaler": torch.float16, "fp32 (CPU)": None}
loss_fn = torch.nn.CrossEntropyLoss()


def eager_train_step(model, opt, amp_dtype, scaler):
    def run(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()
    return run


GRAPH_TRAIN = "whole-step graph"
CHECK_STEPS = 6 if CUDA else 2


def build_train_case(amp_name, bs, opt_name, x, y):
    """An eager step and a whole-step graph from the same weights; their losses compared before any timing."""
    amp_dtype = AMP[amp_name]
    base = build_train_model()
    m_eager, m_graph = copy.deepcopy(base), copy.deepcopy(base)
    del base
    use_scaler = amp_name == "fp16+GradScaler"
    eager = eager_train_step(m_eager, make_optimizer(opt_name, m_eager.parameters(), graphed=False), amp_dtype,
                             torch.amp.GradScaler("cuda") if use_scaler else None)
    step = capture_train_step(m_graph, make_optimizer(opt_name, m_graph.parameters(), graphed=True), loss_fn,
                              (x, y), amp_dtype=amp_dtype,
                              scaler=torch.amp.GradScaler("cuda") if use_scaler else None,
                              eager_fallback=True)
    # correct before fast: the same steps from the same weights on the same batch (with a GPU: 3 warm-up
    # steps, the capture, 2 replays; on the CPU both run eagerly, so 2 steps show it)
    le = torch.stack([eager(x, y) for _ in range(CHECK_STEPS)]).float().cpu()
    lg = torch.stack([step(x, y) for _ in range(CHECK_STEPS)]).float().cpu()
    loss_diff = ((lg - le).abs() / le.abs()).max().item()
    # The first step starts from the same weights: its loss must match. SGD runs the same update eagerly and in
    # the graph, and its losses stay equal bit for bit (bf16, and fp16 with the scaler's skipped steps). AdamW is
    # the default implementation eagerly and capturable=True in the graph: two orderings of one update, rounded
    # differently, and a step on one repeated batch amplifies that (seen on an H200: 6% after 6 steps, bf16
    # bs32). A wrong graph (stale input, frozen LR, missing step) is off by far more.
    assert abs(lg[0] - le[0]) <= 1e-3 * abs(le[0]), f"first step differs: eager {le[0]:.5f}, graph {lg[0]:.5f}"
    assert loss_diff < 0.1, f"graphed training diverged from eager: {le.tolist()} vs {lg.tolist()}"
    print(f"{amp_name} bs{bs} {opt_name}: eager vs graphed losses over {CHECK_STEPS} steps agree within "
          f"{100 * loss_diff:.1f}% (first step: identical to 1e-3)")
    label = GRAPH_TRAIN if step.mode == "graph" else f"{GRAPH_TRAIN} (eager fallback)"
    extra = {"section": "training", "dtype": amp_name, "batch": bs, "optimizer": opt_name,
             "max_rel_loss_diff": [float("nan"), loss_diff],
             "losses_eager": " ".join(f"{v:.4f}" for v in le.tolist()),
             "losses_graph": " ".join(f"{v:.4f}" for v in lg.tolist())}
    return eager, step, (f"train {amp_name} bs{bs}, {OPTIMIZERS[opt_name]}", ["eager", label], extra)


# Which cases live at once: on a GPU with room for all of them, every training case in every window (the windows
# of one case then lie far apart in time); on a smaller GPU one batch size and optimizer at a time.
TRAIN_CASES = [(bs, opt) for bs in TRAIN_BATCHES for opt in OPTIMIZERS]
roomy = not CUDA or torch.cuda.get_device_properties(0).total_memory >= 60 * 2**30
train_groups = [TRAIN_CASES] if roomy else [[case] for case in TRAIN_CASES]
train_windows = [[] for _ in range(WINDOWS)]
for group in train_groups:
    batches = {bs: train_batch(bs) for bs in dict.fromkeys(bs for bs, _ in group)}
    built = {(bs, opt): {amp: build_train_case(amp, bs, opt, *batches[bs]) for amp in amps_at(bs)}
             for bs, opt in group}
    def time_group(samples, calls, floor):
        """One pass over the group: eager and graph of every AMP path of one batch and optimizer in one compare()."""
        parts = []
        for (bs, opt), per_amp in built.items():
            variants = {}
            for amp, (eager, step, _) in per_amp.items():
                variants[f"{amp}: eager"], variants[f"{amp}: {GRAPH_TRAIN}"] = eager, step
            df = compare(variants, *batches[bs], case=f"train bs{bs}, {opt}", samples=samples, calls=calls,
                         floor=floor)
            parts.append(split_cases(df, {amp: spec for amp, (_, _, spec) in per_amp.items()}))
        return pd.concat(parts, ignore_index=True)

    group_windows = []
    for w in range(WINDOWS):
        group_windows.append(time_group(SAMPLES, CALLS, floor=False))
        progress(f"training window {w + 1}/{WINDOWS}: " + ", ".join(
            f"{r.dtype} bs{r.batch} {r.optimizer} {r.speedup:.2f}x" for r in group_windows[-1].itertuples()
            if r.variant != "eager"))
        if w < WINDOWS - 1:
            time.sleep(WINDOW_PAUSE_S)
    group_windows[0] = add_profile(group_windows[0], time_group(1, 1, floor=True))  # after all timings
    for w, frame in enumerate(group_windows):
        train_windows[w].append(frame)
    del built, batches, group_windows, time_group
    cuda_cleanup()
train_windows = [pd.concat(parts, ignore_index=True) for parts in train_windows]
training = combine_windows(train_windows)
training["ms_per_step"] = training.median_us / 1e3
training["images_per_s"] = training.batch / (training.median_us * 1e-6)
training[["case", "variant", "executed_as", "ms_per_step", "images_per_s", "speedup", "speedup_lo", "speedup_hi",
          "floor_us", "vs_floor", "kernels_per_call"]].round(2)

# %%
fig_train, ax = plt.subplots(figsize=(11, 0.45 * len(training) + 1.8))
for i, r in training.iterrows():
    is_graph = r.variant.startswith(GRAPH_TRAIN)
    ax.barh(i, r.images_per_s, color="C1" if is_graph else "C0")
    ax.text(r.images_per_s, i, f" {r.images_per_s:,.0f} img/s, {r.ms_per_step:.1f} ms"
            + (f" ({r.speedup:.2f}x, {interval(r.speedup_lo, r.speedup_hi)})" if is_graph else ""),
            va="center", fontsize=8)
ax.set_yticks(range(len(training)), [f"{r.dtype} bs{r.batch}, {r.optimizer} · {r.variant}"
                                      for r in training.itertuples()], fontsize=8)
ax.invert_yaxis()
ax.set(xlabel="training throughput (images/s)",
       title=f"{ARCH} training step, eager vs whole-step graph, on {where}\n(graph rows: speedup median, 90% PI)")
ax.set_xlim(0, training.images_per_s.max() * 1.45)
fig_train.text(0.01, 0.005, "Optimizers: " + "; ".join(OPTIMIZERS.values()), fontsize=7, ha="left", va="bottom")
fig_train.tight_layout(rect=(0, 0.03, 1, 1))

# %% [markdown]
# The cell below prints, for every training case, the graphed step against its floor and whether the graph pays
# (speedup interval above `PAYS`), then, where both AMP paths ran at one batch, whether bf16 is faster than
# fp16 + `GradScaler`, eagerly and graphed (their time ratio, window by window). The fp16 + `GradScaler` graph rows
# have no floor: the scaler's unscale, step and update run eagerly after the replay, so the profiler sees kernels
# launched outside the graph and `compare` reports no floor for them.

# %%
train_claims = []
for r in training[training.variant.str.startswith(GRAPH_TRAIN)].itertuples():
    floor_text = (f"{r.vs_floor:.2f}x its floor" if pd.notna(r.vs_floor) else
                  "no floor (part of its step runs eagerly)" if CUDA else "no floor on a CPU")
    kernels = f"{r.kernels_per_call:.0f} kernels per step" if pd.notna(r.kernels_per_call) else "kernels not counted"
    step_pi = interval(r.median_pi_lo / 1e3, r.median_pi_hi / 1e3, ".1f", " ms")
    print(f"{r.case}: graph {r.ms_per_step:.1f} ms/step ({step_pi}) = {floor_text}, {kernels}, "
          f"{r.speedup:.2f}x over eager ({interval(r.speedup_lo, r.speedup_hi)})")
    train_claims.append(pays_claim(f"train_{tag(r.dtype)}_bs{r.batch}_{tag(r.optimizer)}_graph_pays",
                                   f"{r.dtype} batch {r.batch}, {r.optimizer}, {r.variant}", r))
for bs in TRAIN_BATCHES:
    if len(amps_at(bs)) < 2:
        continue
    for opt in OPTIMIZERS:
        cb, ca = (f"train {amp} bs{bs}, {OPTIMIZERS[opt]}" for amp in amps_at(bs))  # bf16, fp16+GradScaler
        for kind, prefix in [("graph", GRAPH_TRAIN), ("eager", "eager")]:
            train_claims.append(faster_claim(
                f"train_bs{bs}_{tag(opt)}_{kind}_bf16_faster", f"training batch {bs}, {opt}, {kind}", train_windows,
                (ca, variant_of(train_windows[0], ca, prefix)), (cb, variant_of(train_windows[0], cb, prefix)),
                "fp16+GradScaler", "bf16"))
print()
for c in train_claims:
    print(f"[{c.verdict}] {c.statement}")
if CUDA:
    main_sgd = training[(training.dtype == MAIN_AMP) & (training.optimizer == "SGD momentum")]
    lo_b, hi_b = TRAIN_BATCHES[0], TRAIN_BATCHES[-1]
    e_lo, e_hi = (main_sgd[(main_sgd.batch == b) & (main_sgd.variant == "eager")].iloc[0] for b in (lo_b, hi_b))
    g_lo, g_hi = (main_sgd[(main_sgd.batch == b) & (main_sgd.variant != "eager")].iloc[0] for b in (lo_b, hi_b))
    print(f"\nEager SGD step ({MAIN_AMP}): {e_lo.ms_per_step:.1f} ms at batch {lo_b} and {e_hi.ms_per_step:.1f} ms at "
          f"batch {hi_b} ({hi_b // lo_b}x the images); the graphed step's GPU-busy floor: "
          f"{ms(g_lo.floor_us, 'not measured')} at batch {lo_b}, {ms(g_hi.floor_us, 'not measured')} at batch {hi_b}.")
else:
    print("\nCPU run: the times above are eager steps of a tiny model, not results.")

# %% [markdown]
# ## 3. Data feeding: can the input pipeline keep up with the graph?
# A graph makes the GPU side of a step fast, so the input pipeline can become the bottleneck. The usual
# remedies apply unchanged: a `DataLoader` with worker processes prepares batches in parallel, `pin_memory=True`
# puts them in page-locked host memory, and `x.to("cuda", non_blocking=True)` copies them without stalling
# the CPU; `step(x, y)` then copies the batch into the graph's static tensors on the GPU (a device-to-device
# copy, captured nowhere, ordered on the same stream).
#
# Three measurements over the same number of batches (TorchAcc's setup: batch 64, AdamW, synthetic images that
# each worker generates as a decoder would hand them over, `uint8`):
# - **loader only**: iterate the loader and copy each batch to the GPU;
# - **step only**: the graphed step on a batch already on the GPU;
# - **both**: the real loop, loader feeding the graphed step.
# If "both" is close to the slower of the two, the pipeline overlaps with the GPU; whichever of the first two
# is slower is what limits throughput. The three are measured in each of `WINDOWS` windows (`LOADER_STEPS`
# batches each), and the cell prints two verdicts computed from the windows: which part is slower (the loader's
# time over the step's, window by window) and whether the real loop costs more than 15% on top of the slower
# part.

# %%
class SyntheticImages(torch.utils.data.Dataset):
    """Random uint8 images and labels, made per sample in the worker (as decoding would be)."""

    def __init__(self, n, image=IMAGE, classes=1000):
        self.n, self.image, self.classes = n, image, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 256, (3, self.image, self.image), dtype=torch.uint8, generator=g)
        return x, int(torch.randint(0, self.classes, (1,), generator=g))


def make_loader(batch, steps, workers):
    fork = "fork" in multiprocessing.get_all_start_methods()  # workers need the notebook's Dataset class
    workers = workers if fork else 0
    return torch.utils.data.DataLoader(
        SyntheticImages(batch * (steps + 2)), batch_size=batch, shuffle=False, drop_last=True,
        num_workers=workers, pin_memory=CUDA, persistent_workers=False,
        multiprocessing_context="fork" if workers else None, prefetch_factor=4 if workers else None)


def timed(batches_iter, per_batch, steps):
    """Seconds per batch for `steps` batches, after the first 2 (worker start-up is not throughput)."""
    for _ in range(2):
        per_batch(*next(batches_iter))
    if CUDA:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        per_batch(*next(batches_iter))
    if CUDA:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


to_gpu = lambda x, y: (x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True))  # noqa: E731
feed_model = build_train_model()
feed_step = capture_train_step(feed_model, make_optimizer("AdamW", feed_model.parameters(), graphed=True), loss_fn,
                               train_batch(LOADER_BATCH), amp_dtype=AMP[MAIN_AMP],
                               scaler=torch.amp.GradScaler("cuda") if MAIN_AMP == "fp16+GradScaler" else None,
                               eager_fallback=True)
xg, yg = train_batch(LOADER_BATCH, seed=3)
for _ in range(5):  # warm-up and capture before timing
    feed_step(xg, yg)

feed_variant = f"{GRAPH_TRAIN} ({feed_step.mode})"
feed_case = (f"data feeding bs{LOADER_BATCH}, {feed_variant}, AdamW foreach capturable={CUDA}, "
             f"{LOADER_WORKERS} workers")
feed_windows = []
for w in range(WINDOWS):
    t = {"loader only": timed(iter(make_loader(LOADER_BATCH, LOADER_STEPS, LOADER_WORKERS)), to_gpu, LOADER_STEPS),
         "step only": timed(iter([(xg, yg)] * (LOADER_STEPS + 2)), feed_step, LOADER_STEPS),
         "loader + step": timed(iter(make_loader(LOADER_BATCH, LOADER_STEPS, LOADER_WORKERS)),
                                lambda x, y: feed_step(*to_gpu(x, y)), LOADER_STEPS)}
    feed_windows.append(pd.DataFrame([{"case": feed_case, "variant": k, "median_us": v * 1e6} for k, v in t.items()]))
    progress(f"data feeding window {w + 1}/{WINDOWS}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items()))
    if w < WINDOWS - 1:
        time.sleep(WINDOW_PAUSE_S)
del feed_model, feed_step, xg, yg
cuda_cleanup()

step_part = "the graphed step (the GPU)" if CUDA else "the training step (eager, on the CPU here)"
# the step faster than the loader means the loader (the input pipeline) limits throughput
feed_claims = [faster_claim("feed_step_faster_than_loader", "data feeding", feed_windows,
                            (feed_case, "loader only"), (feed_case, "step only"), "the loader", "the step")]
per_window = [f.set_index("variant").median_us for f in feed_windows]
overlap = [t["loader + step"] / max(t["loader only"], t["step only"]) for t in per_window]
o_lo, o_hi = prediction_interval(overlap)
feed_claims.append(Claim(
    "feed_loop_costs_15pct_over_slower_part", lo=o_lo, hi=o_hi, above=1.15,
    holds="data feeding: the real loop takes {lo:.2f}-{hi:.2f}x the time of its slower part: more than 15% on "
          "top, the loader and the step do not fully overlap",
    fails="data feeding: the real loop takes {lo:.2f}-{hi:.2f}x the time of its slower part: at most 15% on top, "
          "the loader and the step overlap",
    unclear="data feeding: no clear difference from 1.15x: the real loop takes {lo:.2f}-{hi:.2f}x the time of its "
            "slower part"))
bound = {"holds": "the input pipeline", "fails": step_part, "unclear": "no clear difference"}[feed_claims[0].verdict]
loader_rows = []
for variant in per_window[0].index:
    times = [t[variant] for t in per_window]
    lo, hi = prediction_interval(times)
    median = float(pd.Series(times).median())
    loader_rows.append({
        "case": feed_case, "variant": variant,
        "executed_as": "cuda graph" if feed_variant.endswith("(graph)") and variant != "loader only" else "eager",
        "median_us": median, "median_pi_lo": lo, "median_pi_hi": hi, "windows": len(times),
        "speedup": float("nan"), "floor_us": float("nan"), "section": "data feeding", "batch": LOADER_BATCH,
        "images_per_s": LOADER_BATCH / (median * 1e-6), "bound_by": bound})
    print(f"{variant:14s} {median / 1e3:7.2f} ms per batch ({interval(lo / 1e3, hi / 1e3, unit=' ms')}) = "
          f"{LOADER_BATCH / (median * 1e-6):8,.0f} images/s")
loader_rows = pd.DataFrame(loader_rows)
print(f"\nthe loop over its slower part, per window: {', '.join(f'{o:.2f}x' for o in overlap)}")
for c in feed_claims:
    print(f"[{c.verdict}] {c.statement}")
print(f"throughput limited by: {bound}")

# %% [markdown]
# ## 4. Accuracy parity: the same training, eager and graphed
# The point of the timm table was that graphs change the speed, not the result. Here on a real data set
# that ships inside scikit-learn (8×8 handwritten digits, 1,797 images; nothing is downloaded): a small CNN
# trained with SGD + momentum (`fused=True`), a warm-up + cosine LR schedule stepped every batch, gradient
# clipping at norm 1.0, batch 32 and a `DataLoader` that reshuffles every epoch (the last batch of each epoch
# is short, so it runs eagerly inside the graphed run). Three runs from the same seed: eager, eager again
# (what run-to-run equality looks like on this GPU; skipped on a CPU) and graphed. Convolutions use cuDNN's
# deterministic algorithms here, so a difference between runs is a real one. After every epoch, validation
# accuracy on the 20% held out.

# %%
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

digits = load_digits()
X = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
X = (X - X.mean()) / X.std()  # standardized pixels
Y = torch.tensor(digits.target)
X_train, X_val, Y_train, Y_val = train_test_split(X, Y, test_size=0.2, random_state=0, stratify=Y)
X_val, Y_val = X_val.to(DEVICE), Y_val.to(DEVICE)
DIGITS_BATCH, MAX_NORM = 32, 1.0
steps_per_epoch = math.ceil(len(X_train) / DIGITS_BATCH)
print(f"digits: {len(X_train)} training images ({steps_per_epoch} batches per epoch, the last one of "
      f"{len(X_train) % DIGITS_BATCH}), {len(X_val)} validation images")


def small_cnn():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(DEVICE)


def warmup_cosine(opt, total, warmup):
    s = torch.optim.lr_scheduler
    return s.SequentialLR(opt, [s.LinearLR(opt, start_factor=0.1, total_iters=warmup),
                                s.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])


def digits_loader(seed):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X_train, Y_train), batch_size=DIGITS_BATCH,
                                       shuffle=True, generator=torch.Generator().manual_seed(seed),
                                       pin_memory=CUDA)


@torch.no_grad()
def accuracy(model):
    model.eval()
    acc = (model(X_val).argmax(1) == Y_val).float().mean().item()
    model.train()
    return acc


def train_digits(graphed, epochs=PARITY_EPOCHS, accumulate=1):
    """The training loop; `graphed` switches the three lines shown in section 2."""
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=CUDA)
    total = epochs * steps_per_epoch // accumulate
    sched = warmup_cosine(opt, total, warmup=max(1, total // 10))
    step, calls = None, 0
    losses, lrs, accs = [], [], []
    loader = digits_loader(seed=1)
    for epoch in range(epochs):
        for x, y in loader:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            if graphed:
                if step is None:
                    step = capture_train_step(model, opt, loss_fn, (x, y), max_grad_norm=MAX_NORM,
                                              accumulate=accumulate, eager_fallback=True)
                loss = step(x, y)
                stepped = step.optimizer_steps > len(lrs)
            else:  # accumulation windows run across epoch boundaries, as in the graphed step
                if calls % accumulate == 0:
                    opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                (loss / accumulate if accumulate > 1 else loss).backward()
                stepped = calls % accumulate == accumulate - 1
                if stepped:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                    opt.step()
            if stepped:
                sched.step()
                lrs.append(opt.param_groups[0]["lr"])
            losses.append(loss.detach())
            calls += 1
        accs.append(accuracy(model))
    return model, torch.stack(losses).float().cpu(), lrs, accs, step


def compare_params(a, b):
    diff = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    return diff, all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


cudnn_det = torch.backends.cudnn.deterministic
torch.backends.cudnn.deterministic = True  # deterministic convolution kernels: a difference means a real one
RUNS = [("eager", False), ("eager, again", False), ("graphed", True)]
if not CUDA:  # the CPU is deterministic, and the graphed run is eager there too
    RUNS.remove(("eager, again", False))
runs = {name: train_digits(graphed) for name, graphed in RUNS}
torch.backends.cudnn.deterministic = cudnn_det
g_step = runs["graphed"][4]
graph_label = "graphed" if g_step.mode == "graph" else "kit, eager fallback (no CUDA)"
print(f"graphed run: {g_step}")
diff, bitwise = compare_params(runs["eager"][0], runs["graphed"][0])
diff_rr, bitwise_rr = compare_params(runs["eager"][0], runs.get("eager, again", runs["eager"])[0])
assert runs["eager"][2] == runs["graphed"][2], "the LR schedules differ"
print(f"LR schedule identical in both runs ({len(runs['eager'][2])} scheduler steps, "
      f"from {max(runs['eager'][2]):.4f} at its peak to {runs['eager'][2][-1]:.2e})")
print(f"final parameters, graphed vs eager: max |diff| {diff:.3g}, bitwise equal: {bitwise}")
if "eager, again" in runs:
    print(f"final parameters, eager vs eager again: max |diff| {diff_rr:.3g}, bitwise equal: {bitwise_rr}")
if not bitwise and bitwise_rr:
    print("The graphed run is not bit-for-bit the eager run, while two eager runs are. One difference between them: "
          "the eager optimizer step receives the LR as a Python float, the graph reads it from a float32 tensor.")
parity_acc = pd.DataFrame({"epoch": range(1, PARITY_EPOCHS + 1),
                           **{(graph_label if k == "graphed" else k): r[3] for k, r in runs.items()}})
parity_acc

# %%
fig_parity, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(12, 4))
ax_l.plot(runs["eager"][1].numpy(), lw=2.5, alpha=0.5, label="eager")
ax_l.plot(runs["graphed"][1].numpy(), lw=1, ls="--", label=graph_label)
ax_l.set(yscale="log", xlabel="step", ylabel="training loss (cross-entropy)", title="loss per step")
ax_a.plot(parity_acc.epoch, parity_acc.eager, "o-", lw=2.5, alpha=0.5, label="eager")
ax_a.plot(parity_acc.epoch, parity_acc[graph_label], "s--", label=graph_label)
ax_a.set(xlabel="epoch", ylabel="validation accuracy", title="validation accuracy per epoch")
for ax in (ax_l, ax_a):
    ax.legend()
fig_parity.suptitle(f"Digits CNN, warm-up + cosine LR, clipping at {MAX_NORM}: eager vs graphed on {where}")
fig_parity.tight_layout()

# %% [markdown]
# **Gradient accumulation.** The same loop with `accumulate=4` (one optimizer step per 4 batches; the short
# batch of each epoch lands somewhere inside a window and runs eagerly), for `ACCUMULATE_EPOCHS` epochs,
# against the eager loop that divides each loss by 4 and steps every 4th batch.

# %%
torch.backends.cudnn.deterministic = True
acc_runs = {name: train_digits(graphed, epochs=ACCUMULATE_EPOCHS, accumulate=4) for name, graphed in [("eager", False),
                                                                                       ("graphed", True)]}
torch.backends.cudnn.deterministic = cudnn_det
acc_step = acc_runs["graphed"][4]
acc_diff, acc_bitwise = compare_params(acc_runs["eager"][0], acc_runs["graphed"][0])
acc_loss_diff = (acc_runs["eager"][1] - acc_runs["graphed"][1]).abs().max().item()
print(f"{acc_step}\ngraphs by window position: {sorted(acc_step.graphs)}; optimizer steps {acc_step.optimizer_steps}")
print(f"accumulate=4, graphed vs eager after {ACCUMULATE_EPOCHS} epoch(s): max |param diff| {acc_diff:.3g} (bitwise equal: "
      f"{acc_bitwise}), max |loss diff| {acc_loss_diff:.3g}")

parity_rows = []
for name, run in runs.items():
    label = name if name != "graphed" else graph_label
    for epoch, acc in enumerate(run[3], 1):
        q = run[1][(epoch - 1) * steps_per_epoch: epoch * steps_per_epoch]
        parity_rows.append({"case": f"parity digits CNN epoch {epoch}", "variant": label,
                            "executed_as": "cuda graph" if name == "graphed" and g_step.mode == "graph" else "eager",
                            "median_us": float("nan"), "speedup": float("nan"), "floor_us": float("nan"),
                            "section": "accuracy parity", "epoch": epoch, "val_acc": acc,
                            "train_loss": q.mean().item()})
finals = {"graphed vs eager": (diff, bitwise, g_step), "eager again vs eager": (diff_rr, bitwise_rr, None),
          "accumulate=4, graphed vs eager": (acc_diff, acc_bitwise, acc_step)}
if "eager, again" not in runs:
    del finals["eager again vs eager"]
for name, (d, b, st) in finals.items():
    parity_rows.append({"case": f"parity digits CNN final parameters, {name}",
                        "variant": ("eager" if st is None else graph_label), "median_us": float("nan"),
                        "speedup": float("nan"), "floor_us": float("nan"), "section": "accuracy parity",
                        "executed_as": "cuda graph" if st is not None and st.mode == "graph" else "eager",
                        "max_abs_param_diff": d, "params_bitwise_equal": b,
                        "eager_steps": st.eager_steps if st is not None else float("nan"),
                        "replays": st.replays if st is not None else float("nan"),
                        "max_abs_loss_diff": acc_loss_diff if "accumulate" in name else
                        (runs["eager"][1] - runs["graphed" if st is not None else "eager, again"][1]).abs().max().item()})
parity = pd.DataFrame(parity_rows)

# %% [markdown]
# ## 5. Save the results
# One table in `figures/04_resnet50/results.csv` (a run without CUDA writes to `build/figures/` instead):
# the inference sweep (`section == "inference"`, with `batch`, `dtype`, `images_per_s`, `max_abs_diff` and
# `correct` from the check against eager), the training steps (`"training"`, with `ms_per_step`,
# `images_per_s` and the loss comparison before timing), the data-feeding measurements (`"data feeding"`,
# `bound_by`) and the accuracy-parity runs (`"accuracy parity"`: `val_acc` per epoch, then the final
# parameter comparisons). Every timed row carries `windows`, the median of the windows and its 90% prediction
# interval (`median_pi_lo`/`median_pi_hi`; for speedups `speedup_lo`/`speedup_hi`), the profiler's floor where
# there is one, and the `executed_as` the profiler observed. The verdicts of sections 1-3 go to `claims.csv`
# (claim, statement, verdict, lo, hi, above).

# %%
all_rows = pd.concat([inference, training, loader_rows, parity], ignore_index=True)
all_rows["arch"], all_rows["image"] = ARCH, IMAGE
claims = infer_claims + train_claims + feed_claims
folder = results.save(STEM, all_rows, figures={"inference_sweep": fig_infer, "training_throughput": fig_train,
                                               "accuracy_parity": fig_parity})
save_claims(folder, claims)
print("saved to", folder, f"(results.csv, env.json, claims.csv with {len(claims)} verdicts, figures)")
print(pd.Series([c.verdict for c in claims]).value_counts().to_string())

# %% [markdown]
# ## 6. Side by side with the published figures
# - **MXNet PR #19142** (V100 16 GB, GluonCV ResNet50_v2, fp16 inference, 1,000 calls after 10 warm-up):
#   batch 1: 2.815 → 2.323 ms per call (about 17% faster); batch 128: 47.32 → 47.15 ms (0.3%).
# - **pytorch/benchmark issue #706** (V100, torchvision ResNet-50, fp32 training): batch 1: 89.0 → 50.2 ms
#   per step (1.77×); batch 4: 1.31×; no gain from batch 8.
# - **TorchAcc** (A100 80 GB, torchvision ResNet-50 with a 100-class head, synthetic 224×224 images, batch 64,
#   AdamW lr 1e-3, fp32): about 930 images/s natively and about 1,150 with TorchAcc in its logs (compiler and
#   graphs); the post reports a 16% average gain once compilation is done.
# - **timm PR** (8 GPUs, AMP + channels_last, 10 epochs): A100 batch 32: 5,665 → 6,630 images/s (all 8 GPUs,
#   1.17×), eval top-1 59.30 → 59.20; V100 batch 128: 4,184 → 4,141 images/s (0.99×), top-1 43.13 → 42.66.
# - **Plain PyTorch on an H100** (our reference run without the kit, section 7 of the shared reference):
#   inference fp16 batch 1 / 8 / 32 / 128: 5.19 / 4.97 / 4.10 / 9.73 ms eager, 0.86 / 1.13 / 2.57 / 9.41 ms graph;
#   bf16 training SGD batch 32: 24.1 → 10.0 ms (2.4×), batch 128: 34.1 → 33.0 ms (1.03×).
#
# The published setups differ from this run (GPU, precision, model variant, timing method), so compare the
# *shape*: how the gain depends on the batch size, not the absolute times.

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED = pd.DataFrame([
    # (experiment, setup, batch, eager ms, graph ms)  per batch or per step, as published
    ("inference", "MXNet, V100, ResNet50_v2 fp16", 1, 2.815, 2.323),
    ("inference", "MXNet, V100, ResNet50_v2 fp16", 128, 47.32, 47.15),
    ("inference", "plain PyTorch, H100, fp16 (reference)", 1, 5.19, 0.86),
    ("inference", "plain PyTorch, H100, fp16 (reference)", 8, 4.97, 1.13),
    ("inference", "plain PyTorch, H100, fp16 (reference)", 32, 4.10, 2.57),
    ("inference", "plain PyTorch, H100, fp16 (reference)", 128, 9.73, 9.41),
    ("training", "pytorch/benchmark, V100, fp32, SGD", 1, 89.0, 50.2),
    ("training", "TorchAcc, A100, fp32, AdamW (img/s -> ms)", 64, 64 / 930 * 1e3, 64 / 1150 * 1e3),
    ("training", "timm, A100x8, AMP, per GPU (img/s -> ms)", 32, 32 / (5665.04 / 8) * 1e3, 32 / (6630.37 / 8) * 1e3),
    ("training", "plain PyTorch, H100, bf16, SGD (reference)", 32, 24.1, 10.0),
    ("training", "plain PyTorch, H100, bf16, SGD (reference)", 128, 34.1, 33.0),
], columns=["experiment", "published setup", "batch", "published eager ms", "published graph ms"])
PUBLISHED["published speedup"] = PUBLISHED["published eager ms"] / PUBLISHED["published graph ms"]
print(PUBLISHED.round(2).to_string(index=False))

# %%
def measured(experiment, batch):
    """This run's closest row: fp16 inference / the main AMP path's SGD training, at the same batch if measured."""
    if experiment == "inference":
        df = inference[inference.dtype == next(iter(INFER_DTYPES))]
    else:
        df = training[(training.dtype == MAIN_AMP) & (training.optimizer == "SGD momentum")]
    if batch not in set(df.batch):
        return [float("nan")] * 3 + ["not measured", "not measured"]
    e = df[(df.batch == batch) & (df.variant == "eager")].iloc[0]
    g = df[(df.batch == batch) & (df.variant != "eager")].iloc[0]
    return [e.median_us / 1e3, g.median_us / 1e3, g.speedup, interval(g.speedup_lo, g.speedup_hi), g.executed_as]


here = "this GPU" if CUDA else "this CPU (eager only)"
side = PUBLISHED[["experiment", "published setup", "batch", "published speedup"]].copy()
side[[f"{here} eager ms", f"{here} graph ms", f"{here} speedup", f"{here} speedup 90% PI",
      f"{here} executed as"]] = [measured(e, b) for e, b in zip(PUBLISHED.experiment, PUBLISHED.batch)]
side.round(2)

# %% [markdown]
# The cell below puts this run's numbers beside the published ones; every comparative sentence in it is one of
# the verdicts computed in sections 1 and 2.

# %%
if CUDA:
    first = next(iter(INFER_DTYPES))
    fp = curve[first]
    b0 = fp["graph"].index[0]
    g1, e1 = fp["graph"].loc[b0], fp["eager"].loc[b0]
    busy = (f"the GPU is busy {g1.floor_us / e1.median_us:.0%} of the eager time (the graph's floor "
            f"{ms(g1.floor_us)} against an eager {ms(e1.median_us)})" if pd.notna(g1.floor_us) else
            "no floor was measured for the graph row")
    host = (f"{e1.kernels_per_call:.0f} kernels at {fp['host_us']:.1f} µs of eager host time each"
            if pd.notna(fp["host_us"]) else "kernels not counted")
    print(f"Inference at batch {b0} ({first}): {g1.speedup:.1f}x here ({interval(g1.speedup_lo, g1.speedup_hi)}x, "
          f"90% prediction interval), 1.21x for MXNet on a V100. There the graph, which removes the launches, still "
          f"took 2.32 ms of the eager 2.82 ms: at most {1 - 2.323 / 2.815:.0%} of the eager time was launch "
          f"overhead. Here {busy}; {host}.")
    by_id = {c.claim: c for c in claims}
    stop = by_id[f"infer_{tag(first)}_pays_at_large_batches"]
    print(f"[{stop.verdict}] {stop.statement}. (MXNet measured 0.3% at batch 128.)")
    graphs = training[training.variant.str.startswith(GRAPH_TRAIN)]
    with_floor = graphs[(graphs.batch >= 32) & graphs.vs_floor.notna()]
    if len(with_floor):
        print(f"Graphed training steps from batch 32 up with a floor ({len(with_floor)} of "
              f"{int((graphs.batch >= 32).sum())}): at most {with_floor.vs_floor.max():.2f}x their GPU-busy floor.")
    t0 = training[(training.dtype == MAIN_AMP) & (training.optimizer == "SGD momentum")].sort_values("batch")
    e0, g0 = t0[t0.variant == "eager"].iloc[0], t0[t0.variant != "eager"].iloc[0]
    idle = (f"the graphed step keeps the GPU busy {ms(g0.floor_us)}, so the GPU idles for about "
            f"{1 - g0.floor_us / e0.median_us:.0%} of the eager step" if pd.notna(g0.floor_us) else
            "no floor was measured for the graphed step")
    print(f"Training at batch {e0.batch} ({MAIN_AMP}, SGD): the eager step takes {e0.ms_per_step:.1f} ms "
          f"({interval(e0.median_pi_lo / 1e3, e0.median_pi_hi / 1e3, '.1f', ' ms')}), the graphed step "
          f"{g0.ms_per_step:.1f} ms; {idle}. pytorch/benchmark measured 1.77x at batch 1 on a V100 (fp32) and no "
          f"gain from batch 8; this run's verdicts per batch:")
    for bs in TRAIN_BATCHES:
        c = by_id[f"train_{tag(MAIN_AMP)}_bs{bs}_{tag('SGD momentum')}_graph_pays"]
        print(f"  [{c.verdict}] {c.statement}")
else:
    print("No GPU: the columns for this machine are eager CPU times of a tiny model; see the recorded GPU run below.")

# %% [markdown]
# ## 7. Recorded GPU results
# The table and figures of the last GPU run committed to this repository (what a reader without a GPU sees).

# %%
recorded = results.show_recorded(STEM, columns=["section", "case", "variant", "executed_as", "median_us", "speedup",
                                                "floor_us", "images_per_s", "val_acc", "max_abs_param_diff",
                                                "params_bitwise_equal"])

# %% [markdown]
# ## Summary
# - An eager ResNet-50 forward costs about its kernel count times the host time per op, or the GPU-busy floor,
#   whichever is larger; a CUDA graph brings it to about the floor. The host time per op does not grow with the
#   batch and the floor does, so the model predicts a gain that shrinks as the batch grows. Section 1 prints, from
#   the intervals of several timing windows, at which batches the graph pays on this GPU, from which batch it
#   stops paying (if there is a clear point) and how far the model lands from the measurement.
# - Quote a speedup with the interval a rerun lands in, and compare two variants (fp16 and bf16, timed in the
#   same `compare` call) window by window: an ordering read off one window's medians does not survive a rerun
#   where host time drifts.
# - A whole AMP training step, optimizer included, is one graph with `capture_train_step`, and the parts of a
#   real loop come along: the LR scheduler (through a GPU LR tensor, for `SGD(fused=True)` and
#   `Adam`/`AdamW(capturable=True)`), gradient clipping inside the graph, gradient accumulation, fp16 with a
#   `GradScaler` (its step and update run eagerly after the replay; only a non-fused optimizer makes the inf check
#   a CPU read), the short last batch. Name the optimizer settings of both sides
#   when you compare them: eager AdamW here is the default (`capturable=False`), the graph's is capturable.
# - The loop keeps its shape: three lines change, and the graph logic lives in the wrapper.
# - Feeding it is ordinary: workers, pinned memory and non-blocking copies; measure whether the loader or the
#   GPU is the limit before blaming either (section 3 prints the verdict for this machine).
# - Check that the graphed run learns like the eager run: section 4 compares the LR schedule, the validation
#   accuracy per epoch and the final parameters of the two runs.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU a check verifies what it can there, such as correctness against eager and your arithmetic.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb04_resnet50.py` (try
# first).

# %%
import numpy as np

from cudagraph_kit.course.exercises_04 import check_batch_prediction, check_clip_norms

# %% [markdown]
# ### Exercise 1: predict, then measure, a batch size between two of the sweep
# Pick a batch size the sweep did not measure, between two that it did (say 48). **First predict** the graph's
# speedup there with the host-time model of section 1, from the sweep alone (`c = curve[dname]` for the first
# dtype of `INFER_DTYPES`): interpolate the floor and the kernels per call, `floor = np.interp(new_batch,
# c["graph"].index, c["graph"].floor_us)` and likewise `c["eager"].kernels_per_call`, then
# `predicted_speedup = max(kernels * c["launch_us"], floor) / floor`. (`c["launch_us"]` is section 1's eager host
# time per kernel, under the name the check reads: Python, dispatcher, ATen and the launch call, not the launch
# alone.) **Then measure**: make `infer = make_infer(build_model(dtype))`, capture it at that batch with
# `capture(..., eager_fallback=True)`, check it against eager on a fresh input, and time eager and the graph in
# one `compare`. Is that batch launch-bound (the eager row's kernels × `launch_us` above the graph row's floor) or
# GPU-bound? How far does the model land from the measurement, and why? (One `compare` is one window: its
# speedup is no verdict, and a rerun may land elsewhere.)

# %%
new_batch = ...          # an int between two of INFER_BATCHES, not one of them
predicted_speedup = ...  # from the sweep, before measuring
new_graph = ...          # capture(infer, image_batch(new_batch, dtype), eager_fallback=True)
new_table = ...          # compare({"eager": infer, GRAPH_INFER: new_graph}, x, case=..., samples=SAMPLES, calls=CALLS)
bound = ...              # "launch-bound" or "GPU-bound", from new_table

# %%
check_batch_prediction(new_batch, predicted_speedup, new_graph, new_table, bound,
                       sweep=curve[next(iter(INFER_DTYPES))], sweep_batches=INFER_BATCHES)

# %% [markdown]
# ### Exercise 2: how often does clipping act, eager and graphed?
# Section 4 clips the gradients at `MAX_NORM` inside the graph. Run one epoch of its loop twice from the same
# seed, eagerly and graphed (like `train_digits(graphed, epochs=1)`, with the schedule over one epoch), and record
# the gradient norm before clipping at every step: in the eager loop the value that
# `torch.nn.utils.clip_grad_norm_` returns, in the graphed loop `step.grad_norm` after each call. Do the two agree?
# On what share of the steps did clipping act (norm above `MAX_NORM`)? Careful: a graph writes the norm of every
# replay into the same tensor, as it does with every output (notebook 01, section 2).

# %%
norms_eager = ...       # one norm per step of the eager epoch
norms_graphed = ...     # one norm per step of the graphed epoch
clipped_fraction = ...  # the share of graphed steps whose norm is above MAX_NORM

# %%
check_clip_norms(norms_eager, norms_graphed, clipped_fraction, max_norm=MAX_NORM, steps=steps_per_epoch)
