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
# **How long**: 56 s on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25); a T4 has not been timed yet; under a
# minute on a CPU (small sizes).

# %% tags=["nbval-check-output"]
# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results.
import importlib.util, os, subprocess, sys
from pathlib import Path
REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")
if "google.colab" in sys.modules and importlib.util.find_spec("cudagraph_kit") is None:  # a fresh Colab runtime
    # If this install fails: REPO_REF must name a branch or tag of REPO_URL, and the runtime needs internet access.
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"git+{REPO_URL}@{REPO_REF}"])
from cudagraph_kit.course.setup_notebook import setup
checkout = setup(REPO_URL, REPO_REF)  # elsewhere: this checkout's kit, silently; a failure says why and what to do

# %% tags=["parameters", "nbval-check-output"]
SMOKE = None           # tiny run (CI / tests): few sizes and calls; None reads $CGK_SMOKE (1 means on)
SAMPLES = 2            # timing rounds per window (one sample of every variant per round)
CALLS = None           # calls per sample; None: the kit picks the count from a time budget per sample
SWEEP_MIN_EXP = 12     # size sweep from 2**12 (4 K) elements ...
SWEEP_MAX_EXP = 25     # ... to 2**25 (33.5 M) elements
CALLS_PER_GRAPH = [1, 10, 100]
WINDOWS = 8            # timing windows of every table, a pause apart: the intervals come from them
WINDOW_PAUSE_S = 0.5   # seconds between windows

# %%
import json
import math
import os

import matplotlib.pyplot as plt
import pandas as pd
import torch

from cudagraph_kit import env_table, has_cuda, timeit
from cudagraph_kit.capture import capture
from cudagraph_kit.intervals import stops_clearing
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import save_claims, speedup, stops_paying, summary, versus, within_floor
from cudagraph_kit.course.measure import measure

STEM = "01_gelu"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the small CPU part runs
if SMOKE:
    SAMPLES, CALLS = 2, 20
    SWEEP_MIN_EXP, SWEEP_MAX_EXP = 12, 16
    CALLS_PER_GRAPH = [1, 10]
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
DEVICE = "cuda" if CUDA else "cpu"
torch.manual_seed(0)
print(env_table())
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run only checks the GELU on the CPU at\n"
          ">>> small sizes (labelled 'eager'); the GPU results recorded in figures/ are shown at the end.")

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
# `measure` times every variant of a case in the same window, round-robin (one sample of each per round, the
# order rotated), each sample ending with a `torch.cuda.synchronize()`. A window's speedup is the median over
# its rounds of eager time / variant time. One window is not enough to quote a number: the host's speed
# drifts over minutes, and eager (host-bound) times move with it far more than graph replays do. So the table
# is timed in `WINDOWS` short windows a pause apart, and each speedup is quoted with a 90% **prediction
# interval** over the windows: where one more window, taken the same way, should land. In the last window,
# after its timings, the profiler reads the **floor** (`floor (µs)`: the time the GPU was busy per call) and
# what each variant *ran as* (did a `cudaGraphLaunch` happen?), never inferred from the name.
#
# Each comparison in the summary at the end of the lesson is computed from such an interval: it says
# "faster" only when the whole interval lies above the threshold, "slower" when it lies below, and "too
# close to call" otherwise. Without a GPU both sides ran eagerly, and the sentence says so instead of a verdict.
#
# Two ways to call the graph:
# - `graph replay`: `g.replay()` on data already in the static input (as when the previous step wrote it
#   there);
# - `graph copy+replay`: a kit call `g(x)` with new data. It first copies `x` into the static input: one
#   device-to-device memcpy launched from the CPU, not a kernel. A real caller with new data each call pays
#   this one.

# %%
m = measure({case: {"eager": lambda x=x: gelu(x),
                    "graph replay": graphs[case].replay,
                    "graph copy+replay": lambda g=graphs[case], f=torch.randn_like(x): g(f)}
             for case, x in inputs.items()},
            windows=WINDOWS, samples=SAMPLES, calls=CALLS, pause_s=WINDOW_PAUSE_S)
main_table = m.table
main_table["max_abs_err"] = [0.0 if v == "eager" else max_err[c] for c, v in zip(main_table.case, main_table.variant)]
claims = [speedup(m, "replay_beats_eager_small", "small", "graph replay"),
          speedup(m, "copy_replay_beats_eager_small", "small", "graph copy+replay"),
          speedup(m, "replay_beats_eager_large", "large", "graph replay"),
          speedup(m, "replay_saves_10pct_large", "large", "graph replay", above=1.10)]
m.short()

# %% [markdown]
# On a GPU the next cell reads two more things off the last window's profile. First, what `g(x)` costs on top
# of the replay, and that it is one copy, not one more kernel. Second, the traffic arithmetic of section 1
# against the floor of the replay (the five kernels alone): where the floor is far above the time the traffic
# needs, the kernels' fixed cost on the GPU dominates; where the two are close, the call is bandwidth-bound.
# Compare both with eager's wall time per kernel: that is what launching from Python costs. Where
# `(floor - traffic) per kernel` comes out negative, the kernels ran faster than the copy-bandwidth estimate:
# part of their traffic stayed in the L2 cache (section 1 marks the tensors whose input and output fit in it).

# %%
if CUDA:
    for case in inputs:
        r, c = m.row(case, "graph replay"), m.row(case, "graph copy+replay")
        print(f"{case}: g(x) takes {c.median_us - r.median_us:.1f} µs more than the replay: {c.copies_per_call:g} "
              f"copy and {c.kernels_per_call:g} kernels per call (replay: {r.copies_per_call:g} copies, "
              f"{r.kernels_per_call:g} kernels)")
    floors = traffic.set_index("case")
    floors["floor_us (replay)"] = [m.row(c, "graph replay").floor_us for c in floors.index]
    floors["eager µs per kernel"] = [m.row(c, "eager").median_us / KERNELS for c in floors.index]
    floors["(floor - traffic) per kernel"] = (floors["floor_us (replay)"] - floors.traffic_us_at_copy_bw) / KERNELS
    print(floors[["traffic_MB", "traffic_us_at_copy_bw", "floor_us (replay)", "(floor - traffic) per kernel",
                  "eager µs per kernel"]].round(2).to_string())
else:
    print("The floor and the copy counts come from the profiler on a GPU; the recorded run has them (section 10).")

# %% [markdown]
# ## 5. Size sweep: where does the launch overhead stop mattering?
# From 4 K to 33 M elements, time per call of eager and of the graph (replay), and the floor. While the
# GPU work per call is shorter than the CPU's launch cost, eager time is flat (launch-bound) and the graph
# wins; once the GPU work dominates, both approach the floor and the speedup falls to 1. The **crossover** is
# read from intervals, not from single readings: the smallest size from which the graph's whole 90%
# prediction interval lies at or below 1.10x (it saves at most 10%), at that size and every larger one
# (`stops_clearing`). A size whose interval straddles 1.10x gets no verdict either way.
#
# Size alone does not set it; the L2 cache does too. While the tensors the five kernels read and write fit in
# L2 (section 1 prints its size), the kernels work on-chip; once they stop fitting, every kernel goes to DRAM
# and the floor jumps. Look for that jump in the floor near the crossover: where it coincides with the
# crossover, the crossover is an **L2 cliff**, and a GPU with a smaller L2 reaches it at a smaller tensor.

# %%
exps = list(range(SWEEP_MIN_EXP, SWEEP_MAX_EXP + 1))
sweep_cases = {}
for e in exps:  # capture every size first (and check it against eager), then time them all in each window
    xs = torch.randn(2 ** e, device=DEVICE)
    gs = capture(gelu, xs, eager_fallback=True)
    torch.testing.assert_close(gs(xs), gelu(xs))
    sweep_cases[f"sweep 2^{e}"] = {"eager": lambda xs=xs: gelu(xs), "graph replay": gs.replay}
ms = measure(sweep_cases, windows=WINDOWS, samples=SAMPLES, calls=CALLS, pause_s=WINDOW_PAUSE_S,
             progress=lambda line: print(line.split(":")[0], f"of the sweep: {len(exps)} sizes timed"))
sweep = ms.table
sweep["numel"] = [2 ** int(c.split("^")[1]) for c in sweep.case]
graph_s = sweep[sweep.variant != "eager"].set_index("numel")
sweep_ran_eagerly = graph_s.variant.str.contains("eager fallback").any()
points = list(zip(graph_s.index, graph_s.speedup_lo, graph_s.speedup_hi))
crossover = None if sweep_ran_eagerly else stops_clearing(points, above=1.10)["from"]
claims.append(stops_paying("graph_stops_paying", points, 1.10, "the graph replay in the size sweep", " elements",
                           eager_fallback=sweep_ran_eagerly))
ms.short()

# %% tags=["nbval-check-output"]
eager_s = sweep[sweep.variant == "eager"].set_index("numel")
fig_sweep, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
ax1.loglog(eager_s.index, eager_s.median_us, "o-", label="eager")
ax1.loglog(graph_s.index, graph_s.median_us, "s-",
           label="CUDA graph replay" if CUDA else "graph (eager fallback: no GPU)")
if graph_s.floor_us.notna().any():
    ax1.loglog(graph_s.index, graph_s.floor_us, "k--", lw=1, label="floor (GPU busy, graph rows)")
ax1.set(xlabel="elements", ylabel="time per call (µs)", title="GELU time per call")
if CUDA:   # on a CPU both sides ran eagerly: no speedup to draw
    ax2.semilogx(graph_s.index, graph_s.speedup, "o-", color="C2")
    ax2.fill_between(graph_s.index, graph_s.speedup_lo, graph_s.speedup_hi, color="C2", alpha=0.2,
                     label="90% prediction interval (windows)")
    ax2.legend(loc="upper right")
else:
    ax2.text(0.5, 0.5, "no graph ran (no GPU)", ha="center", transform=ax2.transAxes)
ax2.axhline(1.0, color="grey", lw=0.8)
ax2.set(xlabel="elements", ylabel="eager / graph", title="speedup of the graph")
if crossover:
    for ax in (ax1, ax2):
        ax.axvline(crossover, color="C3", ls=":", lw=1.5)
    ax2.annotate(f"crossover: {crossover:,}\n(≤ 10% gain from here)", (crossover, graph_s.speedup.max() * 0.8),
                 color="C3", ha="right", xytext=(-8, 0), textcoords="offset points")
ax1.legend()
where = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only, no graphs)"
fig_sweep.suptitle(f"GELU eager vs CUDA graph on {where}")
fig_sweep.tight_layout()

# %% [markdown]
# The red dotted line marks the crossover where this run found one; the summary at the end of the lesson
# states it with its interval (its finding on the size sweep). The appendix checks that the sweep point nearest
# the small tensor agrees with the table of section 4.
#
# ## 6. Several calls per graph
# Even a graph has a launch cost (the `cudaGraphLaunch` call and its scheduling: in the table of section 4,
# the gap between a replay and its floor). For tiny work that cost is a visible share of the time per call, so
# capture several calls in one graph: `capture(..., calls_per_graph=k)` records `k` calls, and the kit divides
# the time per replay by `k`. All variants, with eager as the baseline, are timed together. How close to the
# floor does the small case get?

# %%
x = inputs["small"]
k_variants = {"eager": lambda x=x: gelu(x)}
for k in CALLS_PER_GRAPH:
    gk = capture(gelu, x, calls_per_graph=k, eager_fallback=True)
    torch.testing.assert_close(gk(x), gelu(x))
    k_variants[f"graph, {k} calls/graph"] = gk.replay
K_CASE, K_FEW, K_MANY = "small, calls per graph", min(CALLS_PER_GRAPH), max(CALLS_PER_GRAPH)
mk = measure({K_CASE: k_variants}, windows=WINDOWS, samples=SAMPLES, calls=CALLS, pause_s=WINDOW_PAUSE_S)
per_graph = mk.table
per_graph["calls_per_graph"] = [float("nan")] + [float(k) for k in CALLS_PER_GRAPH]
claims += [versus(mk, "more_calls_per_graph_faster", (K_CASE, f"graph, {K_MANY} calls/graph"),
                  (K_CASE, f"graph, {K_FEW} calls/graph"), subject=f"small: {K_MANY} calls per graph",
                  than=f"{K_FEW} per graph"),
           within_floor(mk, "many_calls_near_floor", K_CASE, f"graph, {K_MANY} calls/graph", 1.3,
                        subject=f"small: {K_MANY} calls per graph")]
mk.short()

# %% tags=["nbval-check-output"]
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
# One row per measurement in `results.csv`, the machine in `env.json`, the verdicts in `claims.csv`, and the
# figures as PNG, in the folder printed below: `build/figures/01_gelu/` by default, with or without a GPU, so
# running this notebook never overwrites the recorded GPU run in `figures/`. Only `python -m cudagraph_kit
# reproduce` on a GPU publishes there, after staging its run under `build/reproduce/`.

# %%
all_rows = pd.concat([main_table, sweep, per_graph], ignore_index=True)
folder = results.save(STEM, all_rows, figures={"size_sweep": fig_sweep, "calls_per_graph": fig_k, **pictures},
                      extra_env={"crossover_numel": crossover,
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
# place, and `g(x)` with the input copy. The floor quoted is the `floor (µs)` of the graph replay row (the
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
cases = ["small", "large"]
side_by_side = pd.DataFrame({
    "case": cases,
    "K80 eager µs": PUBLISHED_K80.eager_us,
    "K80 graph µs": PUBLISHED_K80.graph_us,
    "K80 speedup": PUBLISHED_K80.speedup,
    f"{here} eager µs": [m.row(c, "eager").median_us for c in cases],
    "replay µs": [m.row(c, "graph replay").median_us for c in cases],
    "speedup (replay)": [m.row(c, "graph replay").speedup for c in cases],
    "g(x) µs": [m.row(c, "graph copy+replay").median_us for c in cases],
    "speedup (g(x))": [m.row(c, "graph copy+replay").speedup for c in cases],
    "floor µs (replay row)": [m.row(c, "graph replay").floor_us for c in cases],
    "graph ran as": [m.row(c, "graph replay").executed_as for c in cases],
})
side_by_side.round(2) if CUDA else side_by_side.iloc[:, :4]   # a CPU run has no graph to set beside the K80's

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU itself was slow: even the small GELU kept it busy about as
# long as launching it took, so removing launches saved little, and the large tensor was entirely GPU-bound.
# A modern GPU runs the same five kernels in a few microseconds while the CPU still spends several
# microseconds per launch, so the small case becomes launch-bound and removing the launches pays; the large
# case is bandwidth-bound, so the graph only removes the gaps between kernels. The cell below puts this run's
# numbers on it.

# %%
if CUDA:
    for case in cases:
        e, r = m.row(case, "eager"), m.row(case, "graph replay")
        k80 = PUBLISHED_K80.set_index("case").loc[case]
        print(f"{case}: K80 eager {k80.eager_us:g} µs -> {k80.speedup:.2f}x with a graph. Here eager "
              f"{e.median_us:.1f} µs ({e.median_us / KERNELS:.1f} µs per kernel) against a floor of "
              f"{r.floor_us:.1f} µs: eager takes {e.median_us / r.floor_us:.1f}x the GPU's busy time, the graph "
              f"replay {r.vs_floor:.2f}x.")
else:
    print("The measured side needs an NVIDIA GPU; the recorded GPU run is shown below.")

# %% [markdown]
# ## 10. Recorded GPU results
# This run's table beside the GPU run recorded in `figures/` before it (the caption names that run's GPU, date
# and id). Without a GPU, the recorded figures follow.

# %%
recorded = results.beside_recorded(STEM, main_table)
rec = results.load(STEM)
if not CUDA and rec is not None:
    from IPython.display import Image, display
    for png in rec.pngs:
        if png.stem in ("size_sweep", "calls_per_graph"):
            display(Image(filename=str(png)))

# %% [markdown]
# ## Summary
# The findings of this run, one sentence each, computed from the intervals above (on a CPU, each says that the
# graph side ran eagerly and leaves the verdict to the recorded GPU run):

# %%
findings = summary(claims)

# %% [markdown]
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

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.exercises_01 import HOST_COPY_WHY, check_fp16_sweep, check_fused_gelu, check_host_copies

# %% [markdown]
# ### Exercise 1: one fused kernel instead of five
# `torch.nn.functional.gelu` computes the same function in **one** kernel (its default, `approximate="none"`, is
# the erf form used here). Define `fused_gelu`, capture it with `capture(..., eager_fallback=True)`, check it
# against eager, and time eager against `g.replay` on the small tensor in one `compare` (import it first:
# `from cudagraph_kit import compare`). Predict first: is the graph's speedup larger or smaller than for the
# hand-written GELU in section 4, and why? (Going further: run the size sweep of section 5 with it. Where is the
# crossover now?)

# %% tags=["nbval-check-output"]
def fused_gelu(x):
    ...  # your code: one call


fused_table = ...  # compare({"eager": ..., "graph replay": ...}, case="small", samples=SAMPLES, calls=CALLS)

# %% tags=["nbval-check-output"]
check_fused_gelu(fused_gelu, fused_table, reference=main_table)

# %% [markdown]
# ### Exercise 2: the size sweep in float16
# Half the bytes per element. Run the sweep of section 5 again with float16 inputs
# (`torch.randn(n, device=DEVICE, dtype=torch.float16)`), one `compare` per size with `df["numel"] = n` and
# `df["dtype"] = "float16"`. One `compare` per size is one window, with no interval, so here the crossover is
# read from the point speedups: the smallest size whose graph speedup is below 1.10x (section 5 reads it from
# intervals instead). Did the crossover move to `"larger"` or `"smaller"` tensors, or stay the `"same"`? Think
# about which cost float16 changes: the time the GPU needs per call, or the time the CPU needs to launch it?

# %% tags=["nbval-check-output"]
sweep16 = ...      # pd.concat of one compare() per size, each with "numel" and "dtype" columns
crossover16 = ...  # the smallest numel whose graph row has speedup < 1.10, or None if there is none
answer = ...       # "larger", "smaller" or "same"

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
kit_message = ...  # try: graphs["small"](bad) / except ValueError as exc: kit_message = str(exc)


def host_copy_capture(pinned):
    ...  # your code (needs an NVIDIA GPU)


why = ...  # "a", "b" or "c"
print("\n".join(f"{key}) {text}" for key, text in HOST_COPY_WHY.items()))

# %%
check_host_copies(kit_message, host_copy_capture, why)


# %% [markdown]
# ## Appendix: how far a rerun moves, and does the sweep agree with the headline?
# ### A. Drift across fresh processes
# `scripts/probes/probe_drift.py` asks how far a rerun moves: it starts many fresh Python processes, one after
# another, and each times eager against the graph replay under one *control*: nothing changed (`baseline`),
# the garbage collector off, one CPU thread, 20 s of launches first, a `torch.profiler` session first, a higher
# scheduling priority. The cell below shows its recorded run (one dot per process) and reads the verdict off
# its table.

# %% tags=["nbval-check-output"]
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
    print("No recorded drift study found (figures/drift/); run python scripts/probes/probe_drift.py on a GPU.")

# %% [markdown]
# What it means for a speedup someone quotes: where the recorded spreads say so, the replay is steady while
# eager, the baseline of every speedup, moves with the host from one process to the next, and none of the
# controls tried keeps it steady; a profiler session earlier in the process slows what runs after it. So a speedup
# is a range, not a number: the interval for a fresh process above, and the prediction intervals of this
# notebook for its own windows.
#
# ### B. The sweep against the headline table
# The sweep point nearest the small tensor's size was timed the same way as section 4 (same samples, same
# calls rule) but in other windows: it is one more measurement, which the headline's prediction interval
# should contain (nine times out of ten). The cell below puts the two side by side, says whether it does, and if
# not, which time moved. It adds `headline_vs_sweep.json` to this run's results folder.

# %%
small_numel = inputs["small"].numel()
nearest = min(graph_s.index, key=lambda n: abs(math.log(n / small_numel)))
h_e, h_g = m.row("small", "eager"), m.row("small", "graph replay")
s_e, s_g = eager_s.loc[nearest], graph_s.loc[nearest]
cross = pd.DataFrame([
    {"timed in": "section 4 (small tensor)", "numel": small_numel, "eager µs": h_e.median_us,
     "graph µs": h_g.median_us, "speedup": h_g.speedup, "speedup_lo": h_g.speedup_lo, "speedup_hi": h_g.speedup_hi},
    {"timed in": f"sweep 2^{int(math.log2(nearest))}", "numel": nearest, "eager µs": s_e.median_us,
     "graph µs": s_g.median_us, "speedup": s_g.speedup, "speedup_lo": s_g.speedup_lo, "speedup_hi": s_g.speedup_hi},
]).round(2)
eager_change, graph_change = s_e.median_us / h_e.median_us - 1, s_g.median_us / h_g.median_us - 1
agree = bool(pd.notna(h_g.speedup_lo) and h_g.speedup_lo <= s_g.speedup <= h_g.speedup_hi) if CUDA else None
print(cross.to_string(index=False) if CUDA else "Both sides ran eagerly on this CPU: no graph speedup to cross-check.")
if agree:
    print(f"\nThe sweep's speedup lies inside the headline's prediction interval; the speedups differ by "
          f"{s_g.speedup / h_g.speedup - 1:+.0%}.")
elif CUDA:
    mover = "eager" if abs(eager_change) > abs(graph_change) else "graph"
    print(f"\nThe sweep's speedup lies outside the headline's prediction interval. Between the two measurements "
          f"the eager time moved by {eager_change:+.0%} and the graph time by {graph_change:+.0%}: the {mover} "
          "time moved.")
consistency = {"small_numel": small_numel, "sweep_numel": int(nearest), "speedup_small": float(h_g.speedup),
               "speedup_sweep": float(s_g.speedup), "agree": agree,
               "eager_change": float(eager_change), "graph_change": float(graph_change)}
_ = (folder / "headline_vs_sweep.json").write_text(json.dumps(consistency, indent=1))
