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
# # 07 · Data-parallel training with CUDA graphs: throughput and jitter across ranks
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/07_data_parallel.ipynb)
#
# **What this adds to the picture:** in data-parallel training (`DistributedDataParallel`, one process per GPU,
# started by `torchrun`) every step ends with an [**all-reduce**](../docs/GLOSSARY.md) of the gradients, which finishes only when the
# *slowest* [rank](../docs/GLOSSARY.md) joins it. When the step is CPU-bound, each rank's step time wobbles with whatever its CPU is doing,
# and every rank pays for the worst of them. The "CUDA Graph Support in PyTorch" talk argues that graphs remove
# this *jitter*: one `replay()` per step leaves the CPU almost nothing to do. TorchAcc shows the same workload,
# ResNet-50 with `torchrun`, from the compiler side. This notebook applies PyTorch's three rules for capturing a
# DDP step, runs the measurement here, and reads the recorded two-GPU run of `scripts/ddp_train.py`.
#
# **What you'll learn**
# - PyTorch's three rules for DDP under CUDA graphs, and the trap `torchrun` sets for the first one.
# - How to time a step per rank *without* a synchronize per step (CUDA events).
# - Eager vs whole-step graph on two GPUs: throughput, and the spread of step times across steps and ranks.
#
# **What you need**: nothing to read the recorded two-GPU results. The single-process demonstration runs on
# one NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU) or, eagerly, on the CPU; the local run uses
# every GPU here (at most two), or two CPU processes with the gloo backend.
#
# **How long**: 42 s on an NVIDIA H200 (measured by `reproduce`, 2026-11-29): the local run is two short
# `torchrun` jobs of a small MLP, one process per GPU (one process on a one-GPU machine). Under a minute on a CPU
# (two gloo processes, eager, small).

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
LOCAL_STEPS = 300     # timed steps per rank in the local torchrun run
DEMO_STEPS = 30       # steps of the single-process eager-vs-graph DDP check
NPROC = None          # processes of the local run; None: every GPU here (at most 2), or 2 on the CPU

# %%
import gc
import importlib.util
import os
import tempfile
import textwrap

import pandas as pd
import torch
import torch.distributed as dist
from IPython.display import display
from torch.nn.parallel import DistributedDataParallel as DDP

from cudagraph_kit import capture_train_step, env_table, has_cuda
from cudagraph_kit.course.lessons.data_parallel import recorded_outcome, sweep_pairs, sweep_sentences, sweep_takeaways
from cudagraph_kit.course.measuring import results
from cudagraph_kit.ddp import ddp_for_graphs, free_port, setup_distributed_for_graphs

STEM = "07_data_parallel"              # what this notebook runs on this machine
SWEEP_STEM = "07_data_parallel_sweep"  # the recorded two-GPU run (python scripts/ddp_train.py --sweep)
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the small CPU part runs
if SMOKE:
    LOCAL_STEPS, DEMO_STEPS = 20, 15
if NPROC is None:
    NPROC = min(2, torch.cuda.device_count()) if CUDA else 2
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
pd.set_option("display.width", 200)
print(env_table())
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run trains eagerly on the CPU with the gloo\n"
          ">>> backend (everything is labelled 'eager'); the GPU runs recorded in figures/ are shown below,\n"
          ">>> each labelled with its GPU and date.")

# %% [markdown]
# ## 1. PyTorch's three rules for DDP under a CUDA graph
# PyTorch's CUDA-graphs notes ("Usage with DistributedDataParallel", NCCL 2.9.6 or newer, which allows
# collectives inside a graph) list three setup steps for capturing a whole DDP training step:
#
# 1. **NCCL's async error handling off, before `init_process_group`**: `TORCH_NCCL_ASYNC_ERROR_HANDLING=0`. The
#    trap: `torchrun` writes `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` into every worker's environment unless you set it
#    where torchrun starts, and that name takes precedence over the old `NCCL_ASYNC_ERROR_HANDLING` the notes still
#    use. (The price: a failed collective no longer tears the process down; a scheduler's time limit must.)
# 2. **DDP constructed in a side-stream context.** DDP keeps every parameter's `AccumulateGrad` node, and an
#    autograd node remembers the stream that was current when it was created. Built on the default stream,
#    the captured backward would synchronize with the default stream, which invalidates the capture.
# 3. **At least 11 DDP-enabled eager iterations before capture.** DDP's own source shows why: it times its
#    first 10 iterations (and every 100th after) with CUDA events that it synchronizes at the start of the
#    next forward, and a synchronize inside a capture breaks it.
#
# The kit applies or checks each one: `setup_distributed_for_graphs()` sets the variable, then creates the process
# group; `ddp_for_graphs(model, device_ids=[rank])` builds DDP on the capture stream; `capture_train_step` raises
# the warm-up to 11 for a DDP model and refuses a process group whose async error handling was on. A training
# script changes in three lines:
#
# ```python
# info = setup_distributed_for_graphs()                                     # rule 1, then init_process_group
# model = ddp_for_graphs(model.to(info.device), device_ids=[info.local_rank])  # rule 2
# step = capture_train_step(model, opt, loss_fn, sample_batch)              # rule 3: 11 eager warm-ups, capture
# for x, y in loader:
#     loss = step(x, y)                                                     # one replay per step
# ```
#
# `scripts/ddp_train.py` is that script, with synthetic data, AMP, an LR schedule and gradient clipping (notebook
# 04 shows how those fit into a graph).
#
# ## 2. The rules in one process: graphed DDP trains like eager DDP
# A process group of one process is enough to see the mechanics (the all-reduce then has no partner). Correct
# before fast: the same MLP is trained eagerly with plain DDP and with the graphed DDP step, from the same
# weights on the same batches, and the weights are compared.

# %%
def demo_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(DEVICE)


gen = torch.Generator().manual_seed(1)
demo_batches = [(torch.randn(64, 256, generator=gen).to(DEVICE), torch.randint(0, 10, (64,), generator=gen).to(DEVICE))
                for _ in range(8)]
loss_fn = torch.nn.functional.cross_entropy
ids = [0] if CUDA else None

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # one process: this machine only
info = setup_distributed_for_graphs()  # rank 0 of 1: NCCL with CUDA, gloo without
print(f"process group: backend {info.backend}, world size {info.world_size}, device {info.device}, "
      f"TORCH_NCCL_ASYNC_ERROR_HANDLING={os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING']}")

reference = DDP(demo_model(), device_ids=ids)  # the eager loop
ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, capturable=CUDA)
for i in range(DEMO_STEPS):
    x, y = demo_batches[i % len(demo_batches)]
    ref_opt.zero_grad(set_to_none=True)
    loss_fn(reference(x), y).backward()
    ref_opt.step()

model = ddp_for_graphs(demo_model(), device_ids=ids)  # built on the capture stream
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=CUDA)
step = capture_train_step(model, opt, loss_fn, demo_batches[0], eager_fallback=True)  # warm-up 3 -> 11
for i in range(DEMO_STEPS):
    step(*demo_batches[i % len(demo_batches)])
demo_diff = max((p - q).abs().max().item() for p, q in zip(reference.parameters(), model.parameters()))
demo_moved = max((p - q).abs().max().item() for p, q in zip(reference.parameters(), demo_model().parameters()))
print(f"after {DEMO_STEPS} steps: max |param diff| kit step ({step.mode}) vs eager DDP = {demo_diff:.3g} "
      f"(the weights moved by up to {demo_moved:.3g} from their start); eager warm-up steps before the capture: "
      f"{step.warmup}" + ("" if step.mode == "graph" else " (nothing is captured without CUDA)"))
if not CUDA:
    print(recorded_outcome(results.load(STEM), "demo"))
assert demo_diff < 1e-5
demo_mode = step.mode
del step, model, opt, reference, ref_opt  # a graph that captured NCCL work goes before its process group
gc.collect()
if CUDA:
    torch.cuda.synchronize()
dist.destroy_process_group()

# %% [markdown]
# Now rule 1 broken the way `torchrun` breaks it: a process group created while
# `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`. The kit refuses before anything runs, and says why and what to do.

# %%
if CUDA:
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # what torchrun puts into every worker
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("nccl", rank=0, world_size=1)  # by hand, not through the kit
    bad = ddp_for_graphs(demo_model(), device_ids=[0])
    try:
        capture_train_step(bad, torch.optim.AdamW(bad.parameters(), lr=1e-3, capturable=True), loss_fn, demo_batches[0])
        rule1_error = None
    except RuntimeError as exc:
        rule1_error = str(exc)
        print(textwrap.fill(rule1_error, 110))
    dist.destroy_process_group()
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    del bad
    assert rule1_error and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in rule1_error
else:
    rule1_error = None
    print(recorded_outcome(results.load(STEM), "rule 1"))  # the recorded GPU run's message

# %% [markdown]
# ## 3. What the script measures
# For every rank and every step `scripts/ddp_train.py` records a CUDA event on the rank's stream when the
# step has been issued, **without** synchronizing. After the run, the interval between consecutive events
# is the step time on the GPU's own timeline: how often a step completes on that GPU, including any time
# it sat idle waiting for its CPU to launch work, or inside the all-reduce waiting for the other rank. The
# host time between step returns (`host_median_us`, its median) is kept beside it; it includes the time the CPU waits, so it does
# not show how busy the CPU is (section 5). One synchronize at each end of the timed
# window gives the throughput over all ranks: MLP samples or ResNet-50 images per second.
#
# Why not `torch.cuda.synchronize()` after every step? It makes the CPU wait for the GPU, so the CPU can no longer
# run ahead and queue the next step, and that queue is what hides the CPU's hiccups in a graphed loop. Any loop
# that calls `loss.item()` every step synchronizes; the sweep runs the MLP both ways.
#
# The two-GPU sweep reports the spread per rank (median; IQR, the width of the middle half of the step times; p99,
# the time 99% of the steps stay under; max) and across ranks: the difference between the slowest and the
# fastest rank's median, and, step by step, between the ranks' step times.
#
# ## 4. A short run on this machine
# `torchrun` starts one process per rank (on the CPU: two processes with the gloo backend, eager only). The
# command, exactly as the notebook runs it (`torchrun` is `python -m torch.distributed.run`):

# %%
SCRIPT = (checkout or Path.cwd().parent) / "scripts" / "ddp_train.py"  # `checkout`: found by the setup cell
if not SCRIPT.is_file():
    raise FileNotFoundError(f"{SCRIPT} not found: the local run needs the repository's scripts/. Fix: run this "
                            "notebook from a clone of the repository (in Colab the first cell makes one).")
spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
ddp_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ddp_train)

RUNS = Path(tempfile.mkdtemp(prefix="cgk-ddp-runs-"))  # the runs' raw files (a CSV per rank, run.json)
modes = ["eager", "graph"] if CUDA else ["eager"]
run_dirs = []
for mode in modes:
    args = ["--model", "mlp", "--mode", mode, "--steps", LOCAL_STEPS, "--warmup-steps", 3 if SMOKE else 20,
            "--batch", 64, "--out", RUNS / mode]
    port = free_port()
    cmd = ddp_train.torchrun_command(NPROC, args, port)  # [python, -m, torch.distributed.run, ...] = torchrun ...
    print("torchrun", " ".join(str(a).replace(str(SCRIPT.parent.parent) + os.sep, "") for a in cmd[3:]))
    ddp_train.launch(NPROC, args, timeout_s=900, port=port, quiet=True)  # its numbers: the table below
    run_dirs.append(RUNS / mode)
local, local_per_rank, local_steps, local_meta = ddp_train.collect(run_dirs)
local[["variant", "executed_as", "median_us", "p99_us", "images_per_s", "host_median_us", "parity_ok"]].rename(
    columns={"images_per_s": "samples_per_s"}).round(1)  # the MLP's samples per second, over all ranks

# %%
where = f"{NPROC} x {torch.cuda.get_device_name(0)}" if CUDA else f"{NPROC} CPU processes (gloo, eager only, no graphs)"
fig_local = ddp_train.plot_step_times(local_steps, f"Per-rank step time on {where}")
if not CUDA:
    print("These are CPU timings of the eager path: they show that the measurement works, not how a GPU behaves.")
    print(recorded_outcome(results.load(STEM), "local"))

# %% [markdown]
# ## 5. The recorded two-GPU run
# `python scripts/ddp_train.py --sweep --nproc 2 --out figures` runs, back to back on two GPUs: the MLP
# eager and graphed (with and without a synchronize per step) and ResNet-50 (224 px, batch 64 per rank,
# bf16, channels-last) eager and graphed, and writes `figures/07_data_parallel_sweep/`. Every graphed run first
# trains eager DDP and graphed DDP side by side for 20 steps from the same weights and stops if they differ
# (`parity_ok`).

# %%
rec = results.show_recorded(SWEEP_STEM, columns=[
    "model", "variant", "executed_as", "median_us", "throughput_speedup", "iqr_us", "p99_us", "parity_ok"], digits=1)
if rec is None:
    print("Make them on a machine with two NVIDIA GPUs: python scripts/ddp_train.py --sweep --nproc 2 --out figures")
else:
    print(f"{rec.env.get('world_size')} ranks; the sweep took {rec.env.get('sweep_seconds')} s")

# %% [markdown]
# Is a step CPU-bound? The host time between step returns cannot say: in a steady loop the CPU waits once it has
# filled the launch queue, so a step returns once per step time whatever the CPU did (in a run long enough to
# fill the queue: the short local run above is not, "Going further" A). What can say is the CPU's
# time to *issue* a step, read from the first steps after the synchronize that opens the timed window: if issuing
# takes 80% of the step or more, the step is **CPU-bound**. ("Going further" A explains the reading.) The next
# cell prints, for each model, the issue time as a share of the step, how much of the eager step the GPU waited for
# a CPU (the eager step less the graphed one, "Going further" A), and how the spread across ranks changed from
# eager to graph (the table above gives the spread across steps: `iqr_us`, `p99_us`).

# %% tags=["nbval-check-output"]
pairs = {}   # model -> (eager row, graph row, their issue times), for the takeaways
if rec is not None:
    pairs = sweep_pairs(rec.df, ddp_train.issue_times(pd.read_csv(rec.dir / "steps.csv.gz")))
    print(sweep_sentences(pairs, rec.df, rec.env))  # headed by the recorded run's GPUs and date

# %% [markdown]
# ## 6. Side by side with the published figures
# TorchAcc ran torchvision's ResNet-50 with a 100-class head on synthetic 224 px images, batch 64, AdamW,
# on A100 80 GB GPUs; the talk quotes MLPerf speedups from graphs at scale. Per-GPU throughput makes the
# numbers comparable in kind, not in value: different GPUs, TorchAcc's compiler instead of CUDA graphs, and
# our bf16 against their AMP.

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED = pd.DataFrame([
    ("TorchAcc (A100 80GB)", "ResNet-50 bs64, native PyTorch, 1 GPU", 930, 930),
    ("TorchAcc (A100 80GB)", "ResNet-50 bs64, torchacc.accelerate, 1 GPU", 1150, 1150),
    ("TorchAcc (A100 80GB)", "ResNet-50 bs64, 4 GPUs data parallel (torchrun)", 4380, 4380 / 4),
    ("TorchAcc (A100 80GB)", "ResNet-50 bs64, 4 GPUs + AMP", 6440, 6440 / 4),
], columns=["source", "setup", "images_per_s", "images_per_s_per_gpu"])
TALK = pd.DataFrame([("BERT, max scale", 1.1), ("Mask R-CNN", 1.6), ("DLRM", 2.2)],
                    columns=["MLPerf workload (talk)", "speedup from CUDA graphs"])
print(TALK.to_string(index=False))

# %% tags=["nbval-check-output"]
if rec is not None:
    r50 = rec.df[rec.df.model == "resnet50"]
    ranks = rec.env.get("world_size") or 1
    ours = pd.DataFrame({
        "source": f"this kit ({ranks} x {rec.env.get('gpu')})",
        "setup": [f"ResNet-50 bs{b}, {a}, {v}, {ranks} GPUs DDP" for b, a, v in zip(r50.batch_per_rank, r50.amp, r50.variant)],
        "images_per_s": r50.images_per_s.round(0),
        "images_per_s_per_gpu": (r50.images_per_s / ranks).round(0),
        "executed_as": r50.executed_as,
    })
    display(pd.concat([PUBLISHED, ours], ignore_index=True))  # TorchAcc's 4-GPU + AMP row: the middle of 6,200-6,680
else:
    display(PUBLISHED)
    print("Our side needs the recorded two-GPU results (section 5).")

# %% [markdown]
# **Why they differ.** The GPUs differ (A100 there; the recorded run names its GPU above), TorchAcc's gain
# comes from a compiler, ours from removing launches, and their "AMP" is not necessarily our bf16. What
# carries over is the shape of the argument: a data-parallel step can only be as fast as its slowest rank,
# and where the eager step is bound by the CPU that launches it (section 5 reads that from the CPU's time to
# issue a step), removing the launches raises the throughput of every rank at once. The talk's jitter
# argument grows with the number of ranks, since the more ranks there are, the likelier one of them hiccups
# at any given step; the MLPerf figures come from runs at scale, two GPUs on one machine show the mechanism.
#
# ## 7. Takeaways
# From the recorded two-GPU run (named above them).

# %%
TAKEAWAYS = ["A whole DDP training step can be one CUDA graph with PyTorch's own DDP and `torchrun`, if three rules "
             "are followed: async error handling off before the process group exists (mind torchrun's default), DDP "
             "built on a side stream, at least 11 eager steps before capture. The kit applies and checks them."]
TAKEAWAYS += sweep_takeaways(pairs, rec.df) if rec is not None else []
results.show_takeaways(SWEEP_STEM, [], TAKEAWAYS);

# %% [markdown]
# ## Going further (optional)
# ### A. Reading whether a step is CPU-bound
# The *host time per step* (`host_median_us`, the time between step returns) cannot tell
# whether the CPU is the bottleneck. In a steady loop the CPU cannot run ahead of the GPU for long: once it has
# filled the launch queue, or when it reaches a call that blocks, it waits. So a step returns once per step
# time on average, whether the CPU spent that time launching or waiting, and the host time is about the step
# time in every run of the sweep, graphed ones included, although a graphed step leaves the CPU almost nothing to
# do. A run too short to fill the queue is the exception: its CPU may never have to wait, and then its host time
# stays below the step time (compare `host_median_us` with `median_us` in section 4's table).
#
# What separates the two cases is the CPU's time to *issue* a step, without the waiting, against the step
# time. The recorded steps hold it: the timed window opens with a synchronize, so in its first steps the GPU's
# queue is short and the CPU has not waited yet, and their host time is the issue time
# (`ddp_train.issue_times`: steps 1-4, the slowest rank). If issuing a step takes about as long as the step
# (80% of it or more), the CPU never gets ahead: the step is **CPU-bound**, the GPU waits for launches, and a
# hiccup of either rank's CPU delays the all-reduce of both. If it takes much less, the CPU gets ahead and
# the step time is what the GPUs need, the wait for the other rank included. A whole-step graph runs the same
# kernels and all-reduce with one launch, so where the graphed step is not CPU-bound, the eager step's extra
# time over it is time the eager GPU spent waiting for a CPU, its own or, through the all-reduce, the other
# rank's. Section 5 gives both readings for each model of the recorded run, and how the spread across steps
# (IQR, p99) and across ranks changed from eager to graph. (The runs with a synchronize per step wait from the
# first step on, so they have no issue time.)


# %% [markdown]
# ### B. The local run per rank, and saving the results
# The local run's step times per rank; then its table, figure and per-rank times go to the folder printed below
# (`build/figures/` by default), never over the recorded run in `figures/`, which only `python -m cudagraph_kit
# reproduce` on a GPU publishes. The kit's message for the broken rule 1 (section 2) is saved with them, so that a
# learner without a GPU reads it in that cell.

# %%
display(local_per_rank.round(1))
folder = results.save(STEM, local, figures={"step_time_distributions": fig_local},
                      extra_env={"world_size": NPROC, "demo_max_param_diff": demo_diff, "demo_mode": demo_mode,
                                 "rule1_error": rule1_error})
local_per_rank.to_csv(folder / "per_rank.csv", index=False)
print("saved to", folder)

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU the data-parallel runs are eager (gloo), and a check verifies what is honest there.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb07_data_parallel.py`
# (try first).

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.exercises.nb07_data_parallel import check_item_per_step, check_rank_spread

# %% [markdown]
# ### Exercise 1: the spread across ranks, from the raw step times
# `local_steps` (section 4) holds every step time of every rank of the local run: columns `variant`, `rank`,
# `step`, `step_us`. Compute, for each variant, the two numbers of section 3 that describe the spread across
# ranks: how far apart the slowest and the fastest rank's *median* step times are, and, step by step, the
# slowest minus the fastest rank's step time, summarized by its 99th percentile (pandas' default quantile).
# They must agree with the `rank_median_spread_us` and `step_rank_diff_p99_us` columns of `local`. Which of
# the two says more about what an all-reduce waits for at each step?

# %% tags=["nbval-check-output"]
rank_spread = ...  # {variant: (median spread in µs, per-step p99 spread in µs)}

# %% tags=["nbval-check-output"]
check_rank_spread(rank_spread, local_steps)

# %% [markdown]
# ### Exercise 2: what a `loss.item()` per step costs a graphed DDP step
# Section 3 argues that a synchronize per step takes away the CPU's lead that a graph relies on. Measure it in
# one process: create a process group again (`setup_distributed_for_graphs()`, after a new `MASTER_PORT` as in
# section 2), build section 2's eager DDP loop and graphed DDP step, run the graphed step through its 11 warm-up
# steps and the capture, and time in one `compare` (`samples=7, calls=None if CUDA else 10`) on one batch:
# `"eager"`, `"whole-step graph"` and `"whole-step graph + loss.item()"` (the step followed by `.item()` of its
# loss, as a loop that logs the loss every step does). What does the `.item()` cost per step, and is the graph
# still ahead of eager with it? Delete the step, the models and the optimizers, then destroy the process group.

# %% tags=["nbval-check-output"]
item_table = ...    # compare({"eager": ..., "whole-step graph": ..., "whole-step graph + loss.item()": ...}, x, y, ...)
item_cost_us = ...  # median µs of the "+ loss.item()" row minus that of the "whole-step graph" row
keeps_lead = ...    # True if the "+ loss.item()" row is still faster than eager (speedup > 1)

# %% tags=["nbval-check-output"]
check_item_per_step(item_table, item_cost_us, keeps_lead)
