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
# # 01 · GELU on a small vs a large tensor: where CUDA graphs help, and where they stop helping
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/01_gelu.ipynb)
#
# Every PyTorch operation on a GPU costs two things: the CPU has to *launch* a kernel (microseconds of
# Python, dispatcher and driver work per kernel), and the GPU has to *run* it. When the tensor is small the GPU
# finishes long before the CPU can launch the next kernel, so the launches are the bottleneck. A
# **CUDA graph** records a sequence of kernels once and replays the whole sequence with a single launch.
#
# This notebook reproduces the experiment of a 2021 blog post (PyTorch 1.10 on a Colab K80): a hand-written
# GELU, `x * 0.5 * (1.0 + torch.erf(x / 1.41421))`, which is five elementwise kernels, on a "small"
# (1, 3, 224, 224) and a "large" (32, 3, 224, 224) tensor, eager vs CUDA graph.
#
# **What you'll learn**
# - How to capture and replay a CUDA graph by hand (side-stream warm-up, static input, `copy_`, `replay`).
# - How to time GPU code honestly: medians of many calls with a synchronize, and the *floor* (the time the
#   GPU is actually busy) read from the profiler.
# - At what tensor size launch overhead stops mattering on your GPU, and how capturing several calls in one
#   graph gets tiny work close to the floor.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU). Without one the notebook
# runs its CPU part small, says so, and shows the recorded GPU results.
#
# **How long**: 76 s on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25); a T4 has not been timed yet; under a
# minute on a CPU (small sizes).

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
SMOKE = None           # tiny run (CI / tests): few sizes and calls; None reads $CGK_SMOKE (1 means on)
SAMPLES = 7            # timing rounds per comparison (one sample of every variant per round); medians reported
CALLS = None           # calls per sample; None: the kit picks the count from a time budget per sample
SWEEP_MIN_EXP = 12     # size sweep from 2**12 (4 K) elements ...
SWEEP_MAX_EXP = 25     # ... to 2**25 (33.5 M) elements
CALLS_PER_GRAPH = [1, 10, 100]
WINDOWS = 5            # timing windows of the headline and calls-per-graph tables, a pause apart: intervals from them
WINDOW_PAUSE_S = 2.0   # seconds between windows
SWEEP_WINDOWS = 3      # windows of the size sweep (every size in each window, a pause apart)

# %%
import json
import math
import os

import matplotlib.pyplot as plt
import pandas as pd
import torch

from cudagraph_kit import capture, combine_windows, compare, env_table, has_cuda, timeit
from cudagraph_kit.intervals import stops_clearing
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import faster, save_claims

STEM = "01_gelu"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the small CPU part runs
if SMOKE:
    SAMPLES, CALLS = 3, 20
    SWEEP_MIN_EXP, SWEEP_MAX_EXP = 12, 16
    CALLS_PER_GRAPH = [1, 10]
    WINDOWS, WINDOW_PAUSE_S, SWEEP_WINDOWS = 2, 0.0, 2
DEVICE = "cuda" if CUDA else "cpu"
torch.manual_seed(0)
print(env_table())
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run only checks the GELU on the CPU at\n"
          ">>> small sizes (labelled 'eager'); the GPU results recorded in figures/ are shown at the end.")


def show(df, columns):
    """The columns of a timing table that this run has (rounded for reading)."""
    return df[[c for c in columns if c in df.columns]].round(2)


TIMING_COLUMNS = ["case", "variant", "executed_as", "median_us", "iqr_us", "windows", "speedup", "speedup_lo",
                  "speedup_hi", "floor_us", "kernels_per_call", "copies_per_call", "vs_floor", "note"]

# %% [markdown]
# ## 1. The workload
# Five elementwise kernels per call, in the order Python evaluates them: `x * 0.5`, `x / 1.41421`, `erf`,
# `1.0 + …` and the final multiply. Each kernel reads its input(s) once and writes its output once, so one
# call moves 11 tensors' worth of memory: `x` is read twice (by `x * 0.5` and by `x / 1.41421`), the final
# multiply reads two tensors, and the five outputs are written. In float32 that is `11 × 4 bytes × numel`.
#
# The cell below computes those bytes for both tensors and the time they take at this GPU's memory
# bandwidth, measured here as the rate of a large device-to-device copy. Section 4 compares that time with
# the measured *floor* (the time the GPU is actually busy per call): whatever the floor has on top of the
# traffic is the kernels' fixed cost on the GPU. Launching each kernel from Python costs the CPU more than
# that, which is what a graph removes.

# %%
def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


# reads + writes of a whole tensor per kernel: x * 0.5 (2), x / 1.41421 (2), erf (2), 1.0 + ... (2), last multiply (3)
PASSES = 2 + 2 + 2 + 2 + 3
KERNELS = 5

SHAPES = {"small": (1, 3, 224, 224), "large": (32, 3, 224, 224)}
if not CUDA:
    SHAPES = {"small": (1, 3, 32, 32), "large": (8, 3, 32, 32)}
inputs = {case: torch.randn(shape, device=DEVICE) for case, shape in SHAPES.items()}

copy_bandwidth = l2_bytes = None
if CUDA:
    big = torch.empty(2**26, device="cuda")                     # 256 MiB: far larger than any L2 cache
    big_out = torch.empty_like(big)
    t_copy = timeit(lambda: big_out.copy_(big))
    copy_bandwidth = 2 * big.numel() * big.element_size() / (t_copy.median_us * 1e-6)  # read + write, bytes/s
    l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    del big, big_out
    print(f"measured copy bandwidth: {copy_bandwidth / 1e12:.2f} TB/s"
          + (f"; L2 cache {l2_bytes / 2**20:.0f} MiB" if l2_bytes else ""))

traffic = pd.DataFrame([{
    "case": case, "shape": tuple(x.shape), "numel": x.numel(), "tensor_MiB": x.numel() * x.element_size() / 2**20,
    "traffic_MB": PASSES * x.element_size() * x.numel() / 1e6,
    "traffic_us_at_copy_bw": (PASSES * x.element_size() * x.numel() / copy_bandwidth * 1e6
                              if copy_bandwidth else float("nan")),
} for case, x in inputs.items()])
for r in traffic.itertuples():
    line = f"{r.case:5s} {r.shape}: {r.numel:>9,} elements, {r.tensor_MiB:5.1f} MiB, {r.traffic_MB:6.1f} MB moved per call"
    if copy_bandwidth:
        line += f" = {r.traffic_us_at_copy_bw:5.1f} µs at {copy_bandwidth / 1e12:.2f} TB/s"
        if l2_bytes and 2 * r.tensor_MiB * 2**20 < l2_bytes:  # one input and one output fit in L2 together
            line += " (input and output fit in L2, so the kernels may beat this)"
    print(line)

# %% [markdown]
# ## 2. Capture and replay by hand
# This is all a CUDA graph needs in PyTorch. Three rules make it correct:
# 1. **Warm up on a side stream** before capturing (PyTorch's CUDA-graphs notes require it). Warm-up
#    creates state that belongs to the stream it ran on: the caching allocator reuses a freed block only for
#    allocations on the stream it was allocated on, autograd creates each parameter's `AccumulateGrad` node
#    on the current stream (and accumulates gradients on that stream as long as the node lives), and DDP
#    builds its buckets and hooks on the stream it is constructed on (the notes ask for a side stream there
#    too). The capture itself runs on a side stream of its own
#    (`torch.cuda.graph` picks one), and the legacy default stream cannot take part in a capture: it
#    synchronizes implicitly with the other streams, which CUDA forbids while a stream is capturing. Warming up
#    on a side stream keeps that state off the default stream. (`wait_stream` in both directions orders the
#    warm-up after earlier work and the capture after the warm-up.)
# 2. **Static memory.** The graph replays fixed addresses: it reads `static_input` and writes
#    `static_output`, the very tensors that existed during capture. New data must be *copied into*
#    `static_input`; the result appears in `static_output` and is overwritten by the next replay.
# 3. **No CPU synchronization inside** (`.item()`, `print(tensor)`, data-dependent shapes): notebook 05 shows
#    what happens otherwise.

# %%
if CUDA:
    static_input = torch.randn(SHAPES["small"], device="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # 1. warm-up on a side stream
        for _ in range(3):
            gelu(static_input)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                 # 2. capture: kernels are recorded, not run
        static_output = gelu(static_input)

    new_data = torch.randn(SHAPES["small"], device="cuda")
    static_input.copy_(new_data)                  # 3. new data goes into the static input ...
    graph.replay()                                # ... and one launch runs all five kernels
    torch.testing.assert_close(static_output, gelu(new_data))   # correct before fast
    print("hand-written graph == eager on new data: OK")
else:
    print("skipped: capturing a CUDA graph needs an NVIDIA GPU")

# %% [markdown]
# ## 3. The same with the kit, and a correctness check against eager
# `cudagraph_kit.capture` does exactly the steps above (side-stream warm-up, static inputs, capture) and
# checks every call: a tensor of another shape, dtype or device is refused with a clear error before it
# can touch the graph. Without a GPU, `eager_fallback=True` runs the function eagerly and labels it `eager`.

# %%
graphs = {case: capture(gelu, x, eager_fallback=True) for case, x in inputs.items()}
max_err = {}
for case, g in graphs.items():
    fresh = torch.randn_like(inputs[case])
    out = g(fresh)
    max_err[case] = (out - gelu(fresh)).abs().max().item()
    print(f"{case}: mode={g.mode}, max |graph - eager| on fresh data = {max_err[case]:.2e}")
    assert max_err[case] == 0.0 or max_err[case] < 1e-6

# %% [markdown]
# ## 4. Timing: eager vs graph, and the floor
# `compare` times all variants of one case in the same window, round-robin (one sample of each per round),
# each sample ending with a `torch.cuda.synchronize()`. `speedup` is the median over rounds of
# eager time / variant time. After all timings it reads from `torch.profiler` the **floor** (`floor_us`: the
# time the GPU was busy per call), the kernels and the copies (memcpy/memset) per call. The `executed_as`
# column comes from the profiler (did a `cudaGraphLaunch` happen?), never from the name.
#
# One window is not enough to quote a number. The host's speed drifts over minutes, and eager (host-bound)
# times move with it far more than graph replays do, so a window's own quartiles say little about where a
# rerun lands. The headline table is therefore timed in `WINDOWS` windows a pause apart (the profiler only in
# the last one, after all timings), and `combine_windows` reports the median of the windows with a 90%
# **prediction interval** (`speedup_lo`..`speedup_hi`): where one more window, taken the same way, should land.
# Each sentence below that compares two variants is a **claim** computed from that interval: it holds when
# the whole interval clears the threshold, fails when the whole interval is on the other side, and says "no
# clear difference" otherwise. Without a GPU both sides ran eagerly: each such claim says "eager vs eager" and
# states no verdict about a graph.
#
# Two ways to call the graph:
# - `graph replay`: `g.replay()` on data already in the static input (as when the previous step wrote it
#   there);
# - `graph copy+replay`: a kit call `g(x)` with new data. It first copies `x` into the static input: one
#   device-to-device memcpy launched from the CPU (the `copies_per_call` column), not a kernel, so
#   `kernels_per_call` stays 5. A real caller with new data each call pays this one.

# %%
import time

windows = []
for w in range(WINDOWS):
    last = w == WINDOWS - 1
    tables = []
    for case, x in inputs.items():
        g = graphs[case]
        fresh = torch.randn_like(x)
        tables.append(compare({"eager": lambda x=x: gelu(x), "graph replay": g.replay,
                               "graph copy+replay": lambda g=g, f=fresh: g(f)},
                              case=case, samples=SAMPLES, calls=CALLS, floor=last))
    windows.append(pd.concat(tables, ignore_index=True))
    print(f"window {w + 1}/{WINDOWS}: " + ", ".join(
        f"{r.case} {r.variant} {r.speedup:.2f}x" for r in windows[-1].itertuples() if r.variant != "eager"))
    if not last:
        time.sleep(WINDOW_PAUSE_S)
main_table = combine_windows(windows)
main_table["max_abs_err"] = [0.0 if v == "eager" else max_err[c] for c, v in zip(main_table.case, main_table.variant)]
show(main_table, TIMING_COLUMNS)

# %%
def row(table, case, variant):
    return table[(table.case == case) & (table.variant.str.startswith(variant))].iloc[0]


def claim_faster(claim_id, case, variant, above=1.0):
    """A claim on a speedup's prediction interval: the variant is faster than eager (by more than `above`) on
    `case`. A row that ran eagerly (no GPU) gives an eager-fallback claim: no verdict about a graph."""
    r = row(main_table, case, variant)
    return faster(claim_id, r.speedup_lo, r.speedup_hi, f"{case}: the {variant}", above=above,
                  eager_fallback=r.executed_as == "eager")


claims = [claim_faster("replay_beats_eager_small", "small", "graph replay"),
          claim_faster("copy_replay_beats_eager_small", "small", "graph copy+replay"),
          claim_faster("replay_beats_eager_large", "large", "graph replay"),
          claim_faster("replay_saves_10pct_large", "large", "graph replay", above=1.10)]
for c in claims:
    print(f"[{c.verdict}] {c.statement}")

# %% [markdown]
# **How far does a rerun move, and can we stop it?** `scripts/probe_drift.py` asks that of this GELU: it
# starts many fresh Python processes, one after another, and each times eager against the graph replay under
# one *control*: nothing changed (`baseline`), the garbage collector off, one CPU thread, 20 s of launches
# first, a `torch.profiler` session first, a higher scheduling priority. The cell below shows its recorded
# run (one dot per process) and reads the verdict off its table.

# %%
drift_dir = (results.recorded_root() or Path("figures")) / "drift"
drift = results.drift_summary(drift_dir)
if drift is not None:
    print(f"recorded on {drift['gpu']} ({drift['processes']} fresh processes per control, 3 windows each):")
    print(drift["table"][["control", "processes", "eager_us", "eager_spread", "graph_us", "graph_spread", "speedup",
                          "speedup_pi_lo", "speedup_pi_hi"]].round(2).to_string(index=False))
    print(f"\n{drift['sentence'][0].upper()}{drift['sentence'][1:]}.")
    from IPython.display import Image, display
    display(Image(filename=str(drift_dir / "drift.png")))
else:
    print("No recorded drift study found (figures/drift/); run python scripts/probe_drift.py on a GPU.")

# %% [markdown]
# What it means for a speedup someone quotes: the replay is steady, but eager, the baseline of every speedup,
# moves with the host from one process to the next, and none of the usual suspects (garbage collection,
# threads, a cold start, priority) holds it still. The one thing that does move everything is what ran before
# in the process: time before you profile. So a speedup is a range, not a number; the interval above is that
# range for a fresh process, and the headline table of this notebook gives one for its own windows.

# %%
if CUDA:
    for case in inputs:
        e, r, c = (row(main_table, case, v) for v in ("eager", "graph replay", "graph copy+replay"))
        print(f"{case}: eager {e.median_us:.1f} µs, replay {r.median_us:.1f} µs ({r.speedup:.2f}x), "
              f"g(x) {c.median_us:.1f} µs ({c.speedup:.2f}x). g(x) costs {c.median_us - r.median_us:.1f} µs more "
              f"than the replay: {c.copies_per_call:g} copy and {c.kernels_per_call:g} kernels per call "
              f"(replay: {r.copies_per_call:g} copies, {r.kernels_per_call:g} kernels).")

    # the traffic arithmetic of section 1 against the measured floor (graph replay rows: the five kernels alone)
    floors = traffic.set_index("case")
    floors["floor_us (graph replay row)"] = [row(main_table, c, "graph replay").floor_us for c in floors.index]
    floors["floor - traffic time, per kernel (µs)"] = (
        (floors["floor_us (graph replay row)"] - floors.traffic_us_at_copy_bw) / KERNELS)
    print(floors[["traffic_MB", "traffic_us_at_copy_bw", "floor_us (graph replay row)",
                  "floor - traffic time, per kernel (µs)"]].round(2).to_string())
    s, l = floors.loc["small"], floors.loc["large"]
    print(f"\nSmall tensor: the traffic alone would take {s.traffic_us_at_copy_bw:.1f} µs, the GPU is busy "
          f"{s['floor_us (graph replay row)']:.1f} µs: the kernels' fixed cost dominates. Large tensor: "
          f"{l.traffic_us_at_copy_bw:.1f} µs of traffic against a floor of {l['floor_us (graph replay row)']:.1f} µs: "
          f"bandwidth-bound. Eager pays {row(main_table, 'small', 'eager').median_us / KERNELS:.1f} µs of "
          f"wall time per kernel on the small tensor.")

# %% [markdown]
# ## 5. Size sweep: where does the launch overhead stop mattering?
# From 4 K to 33 M elements, time per call of eager and of the graph (replay), and the floor. While the
# GPU work per call is shorter than the CPU's launch cost, eager time is flat (launch-bound) and the graph
# wins; once the GPU work dominates, both approach the floor and the speedup falls to 1. We mark the
# **crossover** from verdicts, not from single readings: the smallest size from which the graph's whole 90%
# prediction interval lies at or below 1.10x (it saves at most 10%), at that size and every larger one
# (`stops_clearing`). A size whose interval straddles 1.10x gets no verdict either way.
#
# Size alone does not set it; the L2 cache does too. While the tensors the five kernels read and write fit in
# L2 (section 1 prints its size), the kernels work on-chip; once they stop fitting, every kernel goes to DRAM
# and the floor jumps. Look for that jump in the floor near the crossover: where it coincides with the
# crossover, the crossover is an **L2 cliff**, and a GPU with a smaller L2 reaches it at a smaller tensor.

# %%
exps = list(range(SWEEP_MIN_EXP, SWEEP_MAX_EXP + 1))
sweep_graphs = {}
for e in exps:  # capture every size first (and check it against eager), then time them in windows
    x = torch.randn(2 ** e, device=DEVICE)
    sweep_graphs[e] = (x, capture(gelu, x, eager_fallback=True))
    torch.testing.assert_close(sweep_graphs[e][1](x), gelu(x))
sweep_windows = []
for w in range(SWEEP_WINDOWS):
    last = w == SWEEP_WINDOWS - 1
    rows = []
    for e, (x, g) in sweep_graphs.items():
        df = compare({"eager": lambda x=x: gelu(x), "graph replay": g.replay}, case=f"sweep 2^{e}",
                     samples=SAMPLES, calls=CALLS, floor=last)
        df["numel"] = 2 ** e
        rows.append(df)
    sweep_windows.append(pd.concat(rows, ignore_index=True))
    print(f"sweep window {w + 1}/{SWEEP_WINDOWS}: {len(exps)} sizes timed")
    if not last:
        time.sleep(WINDOW_PAUSE_S)
sweep = combine_windows(sweep_windows)
for e in exps:
    ev, gr = sweep[sweep.case == f"sweep 2^{e}"].iloc[0], sweep[sweep.case == f"sweep 2^{e}"].iloc[1]
    print(f"2^{e} = {2 ** e:>10,} elements: eager {ev.median_us:8.1f} µs, graph {gr.median_us:8.1f} µs "
          f"({gr.executed_as}), speedup {gr.speedup:5.2f}x ({gr.speedup_lo:.2f}-{gr.speedup_hi:.2f}), "
          f"floor (graph row) {gr.floor_us:7.1f} µs")

# %%
eager_s = sweep[sweep.variant == "eager"].set_index("numel")
graph_s = sweep[sweep.variant.str.startswith("graph")].set_index("numel")
speedup = graph_s.speedup  # median over windows of the per-round ratios eager / graph, from compare()
stops = stops_clearing(zip(graph_s.index, graph_s.speedup_lo, graph_s.speedup_hi), above=1.10)
crossover = stops["from"]

fig_sweep, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
ax1.loglog(eager_s.index, eager_s.median_us, "o-", label="eager")
ax1.loglog(graph_s.index, graph_s.median_us, "s-",
           label="CUDA graph replay" if CUDA else "graph (eager fallback: no GPU)")
if graph_s.floor_us.notna().any():
    ax1.loglog(graph_s.index, graph_s.floor_us, "k--", lw=1, label="floor (GPU busy, graph rows)")
ax1.set(xlabel="elements", ylabel="time per call (µs)", title="GELU time per call")
ax2.semilogx(speedup.index, speedup.values, "o-", color="C2")
if "speedup_lo" in graph_s:
    ax2.fill_between(speedup.index, graph_s.speedup_lo, graph_s.speedup_hi, color="C2", alpha=0.2,
                     label="90% prediction interval (windows)")
    ax2.legend(loc="upper right")
ax2.axhline(1.0, color="grey", lw=0.8)
ax2.set(xlabel="elements", ylabel="eager / graph", title="speedup of the graph")
if crossover:
    for ax in (ax1, ax2):
        ax.axvline(crossover, color="C3", ls=":", lw=1.5)
    ax2.annotate(f"crossover: {crossover:,}\n(≤ 10% gain from here)", (crossover, speedup.max() * 0.8),
                 color="C3", ha="right", xytext=(-8, 0), textcoords="offset points")
ax1.legend()
where = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only, no graphs)"
fig_sweep.suptitle(f"GELU eager vs CUDA graph on {where}")
fig_sweep.tight_layout()
if crossover:
    print(f"crossover: from {crossover:,} elements on, every interval lies at or below 1.10x")
else:
    print("crossover: not reached in this sweep (no run of sizes up to the largest whose intervals all lie at "
          "or below 1.10x)")
if stops["unclear_before"]:
    r = graph_s.loc[stops["unclear_before"]]
    print(f"at {stops['unclear_before']:,} elements the interval {r.speedup_lo:.2f}-{r.speedup_hi:.2f}x straddles "
          "1.10x: no verdict there")

# %% [markdown]
# **Does the sweep agree with the headline table?** The sweep point nearest the small tensor's size was
# timed the same way (same `compare`, same samples, same calls rule) but in another window: it is one more
# window, which the headline's prediction interval should hold (nine times out of ten). The cell below puts
# the two side by side, says whether it does, and if not, which time moved.

# %%
small_numel = inputs["small"].numel()
nearest = min(graph_s.index, key=lambda n: abs(math.log(n / small_numel)))
h_e, h_g = row(main_table, "small", "eager"), row(main_table, "small", "graph replay")
s_e, s_g = eager_s.loc[nearest], graph_s.loc[nearest]
print(pd.DataFrame([
    {"timed in": "section 4 (small tensor)", "numel": small_numel, "eager µs": h_e.median_us,
     "graph µs": h_g.median_us, "speedup": h_g.speedup, "speedup_lo": h_g.get("speedup_lo"),
     "speedup_hi": h_g.get("speedup_hi")},
    {"timed in": f"sweep 2^{int(math.log2(nearest))}", "numel": nearest, "eager µs": s_e.median_us,
     "graph µs": s_g.median_us, "speedup": s_g.speedup, "speedup_lo": s_g.get("speedup_lo"),
     "speedup_hi": s_g.get("speedup_hi")},
]).round(2).to_string(index=False))
ratio_change = s_g.speedup / h_g.speedup - 1
eager_change, graph_change = s_e.median_us / h_e.median_us - 1, s_g.median_us / h_g.median_us - 1
agree = bool(pd.notna(h_g.speedup_lo) and h_g.speedup_lo <= s_g.speedup <= h_g.speedup_hi)
if agree:
    print(f"\nThey agree: the sweep's speedup ({s_g.speedup:.2f}x) lies inside the headline's prediction interval "
          f"({h_g.speedup_lo:.2f}-{h_g.speedup_hi:.2f}x); the speedups differ by {ratio_change:+.0%}.")
else:
    mover = "eager" if abs(eager_change) > abs(graph_change) else "graph"
    print(f"\nThey differ by {ratio_change:+.0%}. Between the two windows the eager time moved by {eager_change:+.0%} "
          f"and the graph time by {graph_change:+.0%}: the {mover} time moved. Eager time is host-bound (Python, "
          "dispatcher, driver) and drifts with the host's state from one window to the next, while the graph "
          "replay barely moves; that is why a speedup is quoted with an interval from several windows.")
consistency = {"small_numel": small_numel, "sweep_numel": int(nearest), "speedup_small": float(h_g.speedup),
               "speedup_sweep": float(s_g.speedup), "agree": bool(agree),
               "eager_change": float(eager_change), "graph_change": float(graph_change)}

# %% [markdown]
# ## 6. Several calls per graph
# Even a graph has a launch cost (the `cudaGraphLaunch` call and its scheduling: in the table, the gap between
# a replay and its floor). For tiny work that cost dominates, so capture several calls in one graph:
# `capture(..., calls_per_graph=k)` records `k` calls, and the kit divides the time per replay by `k`. All
# variants, with eager as the baseline, are timed in one `compare`. How close to the floor does the small case
# get?

# %%
x = inputs["small"]
k_variants = {"eager": lambda: gelu(x)}
for k in CALLS_PER_GRAPH:
    gk = capture(gelu, x, calls_per_graph=k, eager_fallback=True)
    torch.testing.assert_close(gk(x), gelu(x))
    k_variants[f"graph, {k} calls/graph"] = gk.replay
k_windows = []
for w in range(WINDOWS):  # a pause apart, like the headline: back-to-back windows hide the host's drift
    k_windows.append(compare(k_variants, case="small, calls per graph", samples=SAMPLES, calls=CALLS,
                             floor=w == WINDOWS - 1))
    if w < WINDOWS - 1:
        time.sleep(WINDOW_PAUSE_S)
per_graph = combine_windows(k_windows)
per_graph["calls_per_graph"] = [float("nan")] + [float(k) for k in CALLS_PER_GRAPH]
amortized = per_graph[per_graph.calls_per_graph >= 10].vs_floor
if amortized.notna().any():
    print(f"with >= 10 calls per graph the small GELU runs at {amortized.max():.2f}x its floor "
          f"(target on an H100/H200: within 1.3x)")
show(per_graph, ["variant", "executed_as", "median_us", "floor_us", "vs_floor", "speedup", "speedup_lo",
                 "speedup_hi", "note"])

# %%
graphed_k = per_graph[per_graph.calls_per_graph.notna()]
fig_k, ax = plt.subplots(figsize=(6, 3.6))
ax.bar([str(int(k)) for k in graphed_k.calls_per_graph], graphed_k.median_us, color="C1", label="time per call")
if graphed_k.floor_us.notna().any():
    ax.axhline(graphed_k.floor_us.median(), color="k", ls="--", lw=1, label="floor (GPU busy)")
    ax.axhline(1.3 * graphed_k.floor_us.median(), color="grey", ls=":", lw=1, label="1.3 × floor")
ax.set(xlabel="GELU calls captured per graph", ylabel="µs per call", title=f"Small GELU on {where}")
ax.legend()
fig_k.tight_layout()

# %% [markdown]
# ## 7. The picture: what a graph changes on the timeline
# All timings are done, so the profiler may run now (a profiler session slows every later kernel launch in the
# process unless CUPTI is torn down, which is why it comes last). `show.record` runs the small GELU three times
# under `torch.profiler`, eagerly and as graph replays, and `show.timelines` draws both traces on one time
# scale: the host's CUDA API calls above (one `cudaLaunchKernel` per kernel, one `cudaGraphLaunch` per graph),
# the kernels on the GPU below. White space on the GPU row is time the GPU sat idle, waiting for the host.
#
# Then the graph itself: `show.graph_nodes` captures the GELU once more and reads its nodes and their
# dependencies from the graph's DOT dump (`CUDAGraph.enable_debug_mode()` before the capture, then
# `debug_dump(path)`), or, where this PyTorch cannot write one, the kernels of one profiled replay in the order
# they ran. The helpers are in `cudagraph_kit/show.py`: call them on your own graph.

# %%
from cudagraph_kit import show

PICTURES = ("timeline", "graph_nodes")
pictures, picture_facts = {}, {}
if CUDA:
    x = inputs["small"]
    traces = {"eager: 3 calls": show.record(gelu, x, calls=3),
              "CUDA graph: 3 replays": show.record(graphs["small"].replay, calls=3)}
    pictures["timeline"] = show.timelines(traces, title=f"Small GELU {SHAPES['small']} on {where}")
    for name, trace in traces.items():
        ev = show.trace_events(trace)
        kinds = [h["kind"] for h in ev["host"]]
        picture_facts[name] = {"kernel_launches": kinds.count("kernel"), "graph_launches": kinds.count("graph"),
                               "gpu_kernels": sum(e["cat"] == "kernel" for e in ev["gpu"])}
        print(f"{name}: {kinds.count('kernel')} cudaLaunchKernel, {kinds.count('graph')} cudaGraphLaunch on the "
              f"host; {picture_facts[name]['gpu_kernels']} kernels on the GPU")
    nodes, edges, node_source = show.graph_nodes(gelu, x)
    picture_facts["graph_nodes"] = {"source": node_source, "nodes": len(nodes), "edges": len(edges),
                                    "kernels": sum(n["kind"] == "kernel" for n in nodes)}
    print(f"the captured GELU: {len(nodes)} nodes, {len(edges)} edges (read from "
          f"{'its DOT dump' if node_source == 'dot' else 'a profiled replay, in the order they ran'}):")
    for n in nodes:
        print(f"  {n['kind']:7s} {n['label']}")
    pictures["graph_nodes"] = show.draw_graph(
        nodes, edges, title=f"The captured GELU: {len(nodes)} nodes (from {node_source})").figure
else:
    print("The pictures need an NVIDIA GPU: they are read from what the GPU ran (torch.profiler, the graph's DOT dump).")
    shown = results.load(STEM)
    recorded_pictures = [p for p in (shown.pngs if shown else []) if p.stem in PICTURES]
    if recorded_pictures:
        from IPython.display import Image, display
        print(f"The recorded ones ({shown.caption}):")
        for png in recorded_pictures:
            display(Image(filename=str(png)))
    else:
        print("No recorded pictures found (figures/01_gelu/timeline.png, graph_nodes.png).")

# %% [markdown]
# Read the top panel from left to right: each blue launch on the host is followed, a little later, by one short
# green kernel on the GPU, and between kernels the GPU waits. In the bottom panel one orange `cudaGraphLaunch`
# per replay sends all five kernels of a call, and they follow one another without waiting for the host. The
# GPU work is the same; what the graph removes is the host's launches and the gaps they leave. Read the picture
# for its shape, not its times: the profiler itself slows the host's launches (compare the eager time per call
# of section 4), which makes the eager gaps wider than they are without it.

# %% [markdown]
# ## 8. Save the results
# One row per measurement in `figures/01_gelu/results.csv`, the machine in `env.json`, the verdicts of
# section 4 in `claims.csv`, and the figures as PNG. A run without CUDA writes to `build/figures/` instead, so it never overwrites the recorded GPU run.

# %%
all_rows = pd.concat([main_table, sweep, per_graph], ignore_index=True)
folder = results.save(STEM, all_rows, figures={"size_sweep": fig_sweep, "calls_per_graph": fig_k, **pictures},
                      extra_env={"crossover_numel": crossover, "headline_vs_sweep": consistency,
                                 "copy_bandwidth_TBps": copy_bandwidth / 1e12 if copy_bandwidth else None,
                                 "pictures": picture_facts})
save_claims(folder, claims)
print("saved to", folder, "(results.csv, env.json, claims.csv, figures)")

# %% [markdown]
# ## 9. Side by side with the published K80 figures
# The published figures come from a 2021 blog post in Japanese by the GitHub user shu65,
# "PyTorch 1.10の新機能「CUDA Graphs」のパフォーマンスを測定してみる" ("Measuring the performance of CUDA Graphs,
# new in PyTorch 1.10"), and its measurement notebook,
# [shu65/blog-pytorch-notebooks: pytorch_CUDA_Graphs.ipynb](https://github.com/shu65/blog-pytorch-notebooks/blob/main/pytorch_CUDA_Graphs.ipynb).
# The blog timed 10,000 calls with `time.time()` on a Tesla K80, PyTorch 1.10, CUDA 11.1 (mean per call).
# Its graph figures replayed on data already in place. Here both speedups are shown: replay on data in
# place, and `g(x)` with the input copy. The floor quoted is the `floor_us` of the graph replay row (the
# five kernels alone).

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED_K80 = pd.DataFrame({
    "case": ["small", "large"],
    "eager_us": [70.9, 1320.0],
    "graph_us": [64.9, 1340.0],
    "speedup": [1.09, 0.99],
})
print("Published (Tesla K80, PyTorch 1.10):")
print(PUBLISHED_K80.to_string(index=False))

# %%
here = "this GPU" if CUDA else "this CPU (eager only)"
side_by_side = pd.DataFrame({
    "case": ["small", "large"],
    "K80 eager µs": PUBLISHED_K80.eager_us,
    "K80 graph µs": PUBLISHED_K80.graph_us,
    "K80 speedup": PUBLISHED_K80.speedup,
    f"{here} eager µs": [row(main_table, c, "eager").median_us for c in ("small", "large")],
    "replay µs": [row(main_table, c, "graph replay").median_us for c in ("small", "large")],
    "speedup (replay)": [row(main_table, c, "graph replay").speedup for c in ("small", "large")],
    "g(x) µs": [row(main_table, c, "graph copy+replay").median_us for c in ("small", "large")],
    "speedup (g(x))": [row(main_table, c, "graph copy+replay").speedup for c in ("small", "large")],
    "floor µs (replay row)": [row(main_table, c, "graph replay").floor_us for c in ("small", "large")],
    "graph executed as": [row(main_table, c, "graph replay").executed_as for c in ("small", "large")],
})
side_by_side.round(2)

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU itself was slow: even the small GELU kept it busy about as
# long as launching it took, so removing launches saved little, and the large tensor was entirely GPU-bound.
# A modern GPU runs the same five kernels in a few microseconds while the CPU still spends several
# microseconds per launch, so the small case becomes launch-bound and removing the launches pays; the large
# case is bandwidth-bound, so the graph only removes the gaps between kernels. The cell below puts this run's
# numbers on it, with the verdicts of section 4.

# %%
if CUDA:
    for case in ("small", "large"):
        e, r = row(main_table, case, "eager"), row(main_table, case, "graph replay")
        k80 = PUBLISHED_K80.set_index("case").loc[case]
        print(f"{case}: K80 eager {k80.eager_us:g} µs -> {k80.speedup:.2f}x with a graph. Here eager "
              f"{e.median_us:.1f} µs ({e.median_us / KERNELS:.1f} µs per kernel) against a floor of {r.floor_us:.1f} µs: "
              f"eager spends {e.median_us / r.floor_us:.1f}x the GPU's busy time, the graph {r.vs_floor:.2f}x.")
    for c in claims[::2]:
        print(f"[{c.verdict}] {c.statement}")
else:
    print("The measured side needs an NVIDIA GPU; the recorded GPU run is shown below.")

# %% [markdown]
# ## 10. Recorded GPU results
# The table and figures of the last GPU run committed to this repository (what a reader without a GPU sees).

# %%
recorded = results.show_recorded(STEM, columns=["case", "variant", "executed_as", "median_us", "speedup", "floor_us",
                                                "kernels_per_call", "copies_per_call", "vs_floor"])

# %% [markdown]
# ## Summary
# - A CUDA graph replaces many kernel launches with one. It helps exactly when launches, not the GPU, are
#   the bottleneck: small tensors, many small kernels, fast GPUs.
# - Time honestly: compare variants round-robin in one window, quote the speedup with its prediction interval
#   over several windows, and compare with the GPU-busy floor. A graph that is far above the floor is still
#   paying for its own launch; capture several calls per graph to amortize it.
# - Feeding a graph new data costs a copy into its static input (`g(x)`); produce data where the graph reads
#   it when you can.
# - Correct before fast: every graphed result above was compared with eager first.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU a check verifies what it can there, such as correctness against eager and honest labels.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb01_gelu.py` (try first).

# %%
from cudagraph_kit.course.exercises_01 import HOST_COPY_WHY, check_fp16_sweep, check_fused_gelu, check_host_copies

# %% [markdown]
# ### Exercise 1: one fused kernel instead of five
# `torch.nn.functional.gelu` computes the same function in **one** kernel (its default, `approximate="none"`, is
# the erf form used here). Define `fused_gelu`, capture it with `capture(..., eager_fallback=True)`, check it
# against eager, and time eager against `g.replay` on the small tensor in one `compare`. Predict first: is the
# graph's speedup larger or smaller than for the hand-written GELU in section 4, and why? (Going further: run the
# size sweep of section 5 with it. Where is the crossover now?)

# %%
def fused_gelu(x):
    ...  # your code: one call


fused_table = ...  # compare({"eager": ..., "graph replay": ...}, case="small", samples=SAMPLES, calls=CALLS)

# %%
check_fused_gelu(fused_gelu, fused_table, reference=main_table)

# %% [markdown]
# ### Exercise 2: the size sweep in float16
# Half the bytes per element. Run the sweep of section 5 again with float16 inputs
# (`torch.randn(n, device=DEVICE, dtype=torch.float16)`), one `compare` per size with `df["numel"] = n` and
# `df["dtype"] = "float16"`, and find its crossover the same way. Did the crossover move to `"larger"` or
# `"smaller"` tensors, or stay the `"same"`? Think about which cost float16 changes: the time the GPU needs per
# call, or the time the CPU needs to launch it?

# %%
sweep16 = ...      # pd.concat of one compare() per size, each with "numel" and "dtype" columns
crossover16 = ...  # the smallest numel whose graph row has speedup < 1.10, or None if there is none
answer = ...       # "larger", "smaller" or "same"

# %%
check_fp16_sweep(sweep16, crossover16, answer, reference_sweep=sweep)

# %% [markdown]
# ### Exercise 3: a wrong input, and host memory inside a graph
# **(a)** Call a kit graph with a tensor it was not captured for and keep the kit's message
# (`except ValueError as exc`). On a GPU pass a CPU tensor, `graphs["small"](inputs["small"].cpu())`; on a CPU
# run, where the graph's input lives on the CPU too, pass a float64 one (`.double()`).
#
# **(b)** *Needs an NVIDIA GPU.* A graph can also copy from host memory. Write `host_copy_capture(pinned)`:
# allocate `x_host = torch.randn(shape, pin_memory=pinned)` and a CUDA tensor `static` before the capture, warm
# up on a side stream (section 2), then capture `static.copy_(x_host, non_blocking=True)` followed by
# `out = gelu(static)`. A blocking copy (`non_blocking=False`) synchronizes with the GPU, which a capture forbids.
# If the capture raises, synchronize and return `{"captured": False, "error": str(exc)}`. Otherwise write new
# values into `x_host`, replay, synchronize, and return `{"captured": True, "replay_reads_new_values": ...}`
# (does `out` equal `gelu` of the new values?). Which captures on your PyTorch: pinned, pageable, both?
#
# **(c)** Why can a graph safely read pinned host memory at replay time? Pick one of the options printed below.

# %%
kit_message = ...  # try: graphs["small"](bad) / except ValueError as exc: kit_message = str(exc)


def host_copy_capture(pinned):
    ...  # your code (needs an NVIDIA GPU)


why = ...  # "a", "b" or "c"
print("\n".join(f"{key}) {text}" for key, text in HOST_COPY_WHY.items()))

# %%
check_host_copies(kit_message, host_copy_capture, why)
