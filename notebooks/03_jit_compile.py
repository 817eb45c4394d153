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
# # 03 · Fusion and CUDA graphs: `torch.jit.script`, `torch.compile` and `mode="reduce-overhead"`
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/03_jit_compile.ipynb)
#
# The 2021 blog that notebook 01 reproduces ran one more experiment: the same GELU,
# `x * 0.5 * (1.0 + torch.erf(x / 1.41421))`, compiled with `torch.jit.script`, with and without a CUDA graph.
# This notebook repeats it and then takes the modern path: `torch.compile`, a manual graph of the compiled
# function, and `torch.compile(mode="reduce-overhead")`, which builds CUDA graphs for you (CUDA graph trees).
#
# **What you'll learn**
# - Fusion and graphs solve different problems: fusion cuts the number of kernels (GPU time), a graph cuts
#   the cost of launching them (CPU time). The notebook measures each alone and both together.
# - How to read "time per call" against the GPU-busy *floor* and the number of kernels per call, and how to
#   turn timings into verdicts that a rerun keeps: timing windows, prediction intervals, "no clear difference".
# - What `mode="reduce-overhead"` costs per call, and whether it pays on one elementwise function, on a deeper
#   model and in a training step (the verdicts are computed from this run's measurements).
# - What happens to a `reduce-overhead` output you still hold when the next call runs: it depends on which call
#   produced it.
# - That TorchScript is deprecated: what still works, and what replaces it.
#
# **What you need**: an NVIDIA GPU for the graph parts (Colab: Runtime → Change runtime type → T4 GPU).
# Without one the notebook runs the CPU-possible part small and shows recorded GPU results.
#
# **How long**: 55 s on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25); a T4 has not been timed yet; about 1
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
SMOKE = None       # tiny run (CI / tests): fewer calls, one small compile on a CPU; None: read $CGK_SMOKE ("1" = on)
CALLS = None       # calls per timing sample (None: the kit picks the count from a time budget; fixed on a CPU)
SAMPLES = 3        # timing rounds per window (one sample of every variant per round); medians are reported
WINDOWS = 3        # timing windows per phase, a pause apart: the prediction intervals come from them
WINDOW_PAUSE_S = 1.0  # seconds between windows
JIT_WARMUP = 20    # calls before timing/capturing a scripted function: its fuser only fuses after profiling runs
COMPILE = True     # run the torch.compile parts (slow to start: they compile)
MLP_LAYERS = 12    # section 6: Linear + ReLU layers of the deeper model
MLP_WIDTH = 256    # section 6: features per layer
MLP_BATCH = 8      # section 6: rows per call (small: launch-bound)
MATMUL_PRECISION = "high"  # float32 matmuls on a GPU, eager and compiled alike ("high": TF32; see section 6)

# %%
import cProfile
import copy
import os
import pstats
import time
import types
import warnings
from collections import defaultdict

import matplotlib.pyplot as plt
import pandas as pd
import torch

from cudagraph_kit import (capture, combine_windows, compare, env_table, gpu_time, has_cuda,
                           ratio_across_windows)
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import Claim, save_claims

STEM = "03_jit_compile"
CUDA = has_cuda()
DEVICE = "cuda" if CUDA else "cpu"
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
if CALLS is None and (SMOKE or not CUDA):
    CALLS = 50 if CUDA else 20
if SMOKE:
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
# The blog's shapes on a GPU; much smaller ones on a CPU (the CPU part only shows that things run and agree).
SHAPES = ({"small": (1, 3, 224, 224), "large": (32, 3, 224, 224)} if CUDA
          else {"small": (1, 3, 32, 32), "large": (8, 3, 64, 64)})
# Which cases torch.compile runs on: everything on a GPU; on a CPU in SMOKE mode only one tiny compile.
COMPILE_CASES = [] if not COMPILE else (["small"] if (SMOKE and not CUDA) else list(SHAPES))
# One precision for float32 matmuls, set before anything is compiled, so eager and compiled code use the same
# (section 6 explains why it matters; the GELU has no matmul). On a CPU the default stays.
if CUDA:
    torch.set_float32_matmul_precision(MATMUL_PRECISION)

torch.manual_seed(0)
print(env_table())
print(f"\nSMOKE={SMOKE}  CALLS={CALLS or 'by time'}  SAMPLES={SAMPLES} per window, WINDOWS={WINDOWS}  "
      f"shapes={SHAPES}  compile cases={COMPILE_CASES}  float32 matmul precision: "
      f"{torch.get_float32_matmul_precision()}")
if not CUDA:
    print("\nNo CUDA GPU here. CUDA graphs (manual ones and mode='reduce-overhead') need an NVIDIA GPU, so this run\n"
          "only checks that eager, torch.jit.script and torch.compile agree on the CPU, at small sizes.\n"
          "CPU timings below are not results; the recorded GPU results are shown at the end.")

# %% [markdown]
# ## 1. The workload
#
# GELU written out as five elementwise operations. Run eagerly, every operation is its own CUDA kernel that
# reads and writes whole tensors: five launches (CPU cost, several µs each) and five passes over memory
# (GPU cost; notebook 01 counts the bytes). A compiler that *fuses* them does one pass in one kernel; a CUDA
# graph launches all the kernels it holds with one call.

# %%
def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def fresh(fn):
    """A copy of ``fn`` with its own code object. Dynamo keeps one compile cache per code object, so giving each
    compiled variant its own copy keeps their caches (and guards) apart."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}
# Correctness is checked on *new* data, not on the tensor a graph was captured with.
test_inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}


def max_abs_err(fn, case, prepare=None):
    """Run ``fn`` on fresh data and return the largest difference from eager GELU on the same data."""
    x = test_inputs[case]
    ref = gelu(x)
    if prepare is not None:
        prepare(x)
    out = fn(x)
    if CUDA:
        torch.cuda.synchronize()
    return (out.float() - ref.float()).abs().max().item()


variants = {case: {} for case in SHAPES}   # case -> {name: callable(x)}
errors = {case: {} for case in SHAPES}     # case -> {name: max abs error vs eager}
for case in SHAPES:
    variants[case]["eager"] = gelu
    errors[case]["eager"] = 0.0


def show(df, columns):
    """The columns of a timing table that this run has."""
    return df[[c for c in columns if c in df.columns]]


TABLE_COLUMNS = ["case", "variant", "executed_as", "median_us", "windows", "speedup", "speedup_lo", "speedup_hi",
                 "floor_us", "kernels_per_call", "copies_per_call"]

# %% [markdown]
# ## 2. The blog's experiment: eager, CUDA graph, `jit.script`, `jit.script` + graph
#
# `cudagraph_kit.capture(fn, x)` does what notebook 01 wrote out by hand: warm-up on a side stream, a static
# input buffer, `torch.cuda.graph` capture. Calling the result, `g(x)`, copies the new input into the static
# buffer and replays the graph; the output lives in graph-owned memory that the next call overwrites. That copy
# is one more launch (a device-to-device memcpy, and one more pass over memory), so we also time the case
# where the data is already in the static input ("input in place": only `g.replay()`), as when the previous
# step wrote it there.

# %%
def add_graph_variants(case, name, g):
    """Two ways to call a captured graph: with a new input (copied into the static input, then replayed), and
    with the input already in place (the data was written into ``g.static_inputs[0]``; only ``replay()``)."""
    variants[case][name] = g
    errors[case][name] = max_abs_err(g, case)
    variants[case][name + ", input in place"] = lambda _x, g=g: g.replay()
    errors[case][name + ", input in place"] = max_abs_err(variants[case][name + ", input in place"], case,
                                                          prepare=g.static_inputs[0].copy_)


if CUDA:
    for case in SHAPES:
        g = capture(gelu, inputs[case])
        add_graph_variants(case, "cuda graph", g)
    print("captured one graph per case:", [repr(variants[c]["cuda graph"]) for c in SHAPES])
else:
    print("skipped: 'cuda graph' and 'jit.script + graph' need an NVIDIA GPU.")

# %% [markdown]
# `torch.jit.script` compiles the function to TorchScript. Its profiling executor records the first calls
# (shapes, dtypes, devices) and only then hands the elementwise chain to a fuser, so we call it `JIT_WARMUP`
# times before timing or capturing it. Which fuser depends on the version: in PyTorch 1.10, the blog's
# version, TorchScript fused CUDA code with NNC (the TensorExpr fuser; nvFuser was opt-in). nvFuser became the
# default CUDA fuser in PyTorch 1.12, on Volta and newer GPUs only (so never on the blog's K80); in 2023
# TorchScript went back to NNC, and nvFuser was later removed from it. The cell below reads the fuser from the
# optimized graph (`prim::TensorExprGroup` is NNC, `prim::CudaFusionGroup` nvFuser). On a CPU this fuser is
# off by default, so the scripted function runs the same five kernels as eager.
#
# TorchScript is deprecated in recent PyTorch (in favour of `torch.compile` and `torch.export`). We record the
# warning PyTorch gives, and skip this part cleanly where `torch.jit.script` is gone or fails.

# %%
scripted, JIT_STATUS, FUSER = None, "", "none"
if not hasattr(torch, "jit") or not hasattr(torch.jit, "script"):
    JIT_STATUS = f"torch.jit.script does not exist in PyTorch {torch.__version__}: TorchScript rows skipped."
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scripted = torch.jit.script(gelu)
            for case in SHAPES:          # profiling runs, then the fused plan
                for _ in range(JIT_WARMUP):
                    scripted(inputs[case])
        except Exception as exc:  # noqa: BLE001 - any failure means: skip, and say why
            scripted = None
            JIT_STATUS = f"torch.jit.script failed on PyTorch {torch.__version__}: {type(exc).__name__}: {exc}"
    deprecations = sorted({f"{w.category.__name__}: {w.message}" for w in caught
                           if issubclass(w.category, (DeprecationWarning, FutureWarning))})
    print("Warnings PyTorch gave for torch.jit.script:", *(deprecations or ["(none)"]), sep="\n  ")
print(JIT_STATUS or f"torch.jit.script works on PyTorch {torch.__version__}.")

if scripted is not None:
    for case in SHAPES:
        variants[case]["jit.script"] = scripted
        errors[case]["jit.script"] = max_abs_err(scripted, case)
        if CUDA:
            gs = capture(scripted, inputs[case], warmup=JIT_WARMUP)  # warm up (no_grad, side stream), capture
            add_graph_variants(case, "jit.script + graph", gs)
    try:
        optimized = str(scripted.graph_for(inputs["small"]))
        FUSER = ("NNC (prim::TensorExprGroup)" if "TensorExprGroup" in optimized else
                 "nvFuser (prim::CudaFusionGroup)" if "CudaFusionGroup" in optimized else
                 "legacy fuser (prim::FusionGroup)" if "FusionGroup" in optimized else "none (no fusion group)")
        if CUDA:
            print("\nThe optimized TorchScript graph:")
            print(optimized)
    except Exception as exc:  # noqa: BLE001 - only a printout
        FUSER = f"unknown (graph_for unavailable: {exc})"
    print(f"TorchScript fuser used here: {FUSER}")

# %% [markdown]
# ## 3. The modern path: `torch.compile`, and a manual graph of the compiled function
#
# `torch.compile` (default mode) traces the function with Dynamo and generates one fused kernel with Inductor
# (Triton on a GPU, C++ on a CPU). Each call still goes through Python: Dynamo checks its *guards* (is this
# still a float32 tensor of that shape on that device?), then AOTAutograd's runtime wrapper, then the kernel
# launch. We pass `dynamic=False` so each shape gets its own specialised kernel, like a graph does, and give
# each compiled variant its own copy of `gelu` (`fresh`) so their compile caches stay apart.
#
# Capturing the compiled function with `capture()` (after it has compiled and warmed up) removes all that
# Python from the replay: the graph holds only the fused kernel.

# %%
compiled = None
if COMPILE_CASES:
    compiled = torch.compile(fresh(gelu), dynamic=False)
    for case in COMPILE_CASES:
        compiled(inputs[case])          # compiles (slow, once per shape)
        variants[case]["torch.compile"] = compiled
        errors[case]["torch.compile"] = max_abs_err(compiled, case)
        if CUDA:
            add_graph_variants(case, "torch.compile + graph", capture(compiled, inputs[case]))
    print("compiled for:", COMPILE_CASES)
else:
    print("torch.compile skipped (COMPILE=False).")

# %% [markdown]
# ## 4. `torch.compile(mode="reduce-overhead")`: CUDA graphs built for you
#
# `reduce-overhead` records the compiled code into CUDA graphs managed by *CUDA graph trees*. It is convenient,
# but each call does more than a bare `graph.replay()`:
#
# 1. **Guards and wrappers**: the same Dynamo guard check and AOTAutograd wrapper as default `torch.compile`.
# 2. **Input copy**: an input that is not known to stay at the same address (anything but parameters,
#    buffers and tensors marked with `torch._dynamo.mark_static_address`) is copied into the graph's static
#    input buffer: one more copy per call.
# 3. **Output bookkeeping**: outputs live in the graph's memory pool, which later runs reuse. The tree tracks
#    which outputs it handed out, and when a new *generation* (iteration) starts it invalidates the outputs of
#    a function's *warm-up* and *recording* runs that you still hold; the outputs of a *replay* it leaves as
#    they are, and the next replay writes into their memory (a cell below tries both).
#    By default every call of the compiled function starts a new generation (in inference);
#    `torch.compiler.cudagraph_mark_step_begin()` marks the boundary explicitly and is required whenever the
#    heuristic is wrong (e.g. training with a pending backward). Once you call it, call it every iteration:
#    from then on the tree counts generations only by your marks.
#
# We measure two "naive" loops first: `y = f(x)` (the output stays alive until the next call) and a loop
# that drops the output at once. The `mark_step_begin` variants come later (section 5) because the first
# call to it changes how generations are counted for the rest of the process.

# %%
ro = ro_static = None
keep = {}


def naive_kept(fn, key):
    """The usual loop body ``y = f(x)``: the previous output is still alive when the next call starts."""
    def call(x):
        keep[key] = fn(x)
        return keep[key]
    return call


if CUDA and COMPILE_CASES:
    ro = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    for case in COMPILE_CASES:
        for _ in range(3):              # call 1 warms up, call 2 records the graph, then it replays
            ro(inputs[case])
        kept = naive_kept(ro, case)
        variants[case]["reduce-overhead, naive (y = f(x))"] = kept
        errors[case]["reduce-overhead, naive (y = f(x))"] = max_abs_err(kept, case)
        variants[case]["reduce-overhead, output dropped"] = ro
        errors[case]["reduce-overhead, output dropped"] = max_abs_err(ro, case)
    print("reduce-overhead compiled for:", COMPILE_CASES)
else:
    print("skipped: mode='reduce-overhead' builds CUDA graphs and needs an NVIDIA GPU "
          "(on a CPU it would only run the default compiled code).")

# %% [markdown]
# **Reading an output after the next call.** `y1 = f(x1); y2 = f(x2)`: the second call starts a new
# generation, and the memory that holds `y1` may be reused. What PyTorch does when you then read `y1` depends
# on which run produced it. In PyTorch's source (`torch/_inductor/cudagraph_trees.py`), starting a new
# generation after a *warm-up* or a *recording* run invalidates the outputs of that run you still hold: reading
# one raises `RuntimeError: Error: accessing tensor output of CUDAGraphs that has been overwritten by a
# subsequent run` (the example in PyTorch's CUDA graph trees documentation hits this: its `y1` comes from the
# first call, a warm-up). Ending a *replay* (`try_end_curr_execution`) invalidates nothing: `y1` still points
# into the graph's memory pool, and the next replay writes its result there. The cell tries both, on this
# PyTorch: `y1` from a replay (the steady state of a loop), and `y1` from the first call of a freshly compiled
# function. Then the fix, which works in both cases: `.clone()` the outputs you keep (or consume them before
# the next call).

# %%
def read_after_next_call(f, x1, x2):
    """y1 = f(x1); y2 = f(x2); then read y1. Returns what happened: kept, silently overwritten, or raised."""
    y1 = f(x1)
    y2 = f(x2)                                    # a new generation: it may reuse y1's memory
    try:
        same_as_f_x1 = torch.allclose(y1, gelu(x1), atol=1e-5)   # reads y1
    except RuntimeError as exc:
        return "raises RuntimeError", str(exc).split(" Stack trace")[0]
    finally:
        del y2
    return ("kept (y1 still holds f(x1))" if same_as_f_x1 else "silently overwritten"), ""


ro_overwrite = ro_overwrite_first_call = None  # what reading a stale reduce-overhead output did on this PyTorch
if ro is not None:
    c0 = COMPILE_CASES[0]
    x1, x2 = test_inputs[c0], inputs[c0]
    ro_overwrite, message = read_after_next_call(ro, x1, x2)     # ro has replayed on this shape before
    print(f"y1 from a replay: reading it after the next call: {ro_overwrite}. {message}")
    ro_first = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    ro_overwrite_first_call, message = read_after_next_call(ro_first, x1, x2)  # call 1 warms up, call 2 records
    print(f"y1 from the first call of a freshly compiled function (its warm-up run): reading it after the next "
          f"call: {ro_overwrite_first_call}. {message}")
    y1 = ro(x1).clone()                           # the fix: clone what you keep
    y2 = ro(x2)
    torch.testing.assert_close(y1, gelu(x1))
    torch.testing.assert_close(y2, gelu(x2))
    print("with y1 = f(x1).clone(): y1 survives the next call and matches eager.")
    import torch._inductor.config as inductor_config
    if hasattr(getattr(inductor_config, "triton", None), "cudagraph_trees_generation_cloning"):
        print("This PyTorch also offers torch._inductor.config.triton.cudagraph_trees_generation_cloning = "
              "'user_visible' (clone outputs that stay alive across generations).")
    del y1, y2, ro_first
else:
    print("skipped: needs an NVIDIA GPU and torch.compile.")

# %% [markdown]
# ### Correctness first
#
# Every variant ran once on fresh data; here is its largest difference from eager. The compiled kernels may
# evaluate `erf` slightly differently, so a few ulp (about 1e-6 in float32) are expected; anything larger is
# a bug, and we stop before timing.

# %%
err_table = pd.DataFrame([{"case": c, "variant": v, "max_abs_err": e} for c in SHAPES for v, e in errors[c].items()])
print(err_table.to_string(index=False))
assert (err_table["max_abs_err"] < 1e-4).all(), "a variant disagrees with eager; do not time it"

# %% [markdown]
# ### Timing in windows: floor, kernels per call, and a prediction interval
#
# `compare()` times all variants of one tensor round-robin (one sample of each per round) and reports the
# median time per call and the speedup over eager (median of the per-round ratios). One such window is not
# enough to quote a number: the host's speed drifts over minutes, and eager (host-bound) times move with it far
# more than graph replays do (notebook 01, section 4). So each *phase* of this notebook is timed in `WINDOWS`
# windows a pause apart, each window timing every case, and `combine_windows` reports the median over the
# windows with a 90% **prediction interval** (`speedup_lo`..`speedup_hi`): where one more window, taken the
# same way, should land. Each sentence that compares two variants is a **claim** computed from such an
# interval: it holds when the whole interval clears the threshold, fails when the whole interval is on the
# other side, and says "no clear difference" otherwise. A comparison between two variants neither of which is
# eager uses the ratio of their times, window by window (`ratio_across_windows`).
#
# After all windows of a phase, the profiler reads the GPU-busy time per call (the *floor*), the kernels and
# copies per call, and whether a CUDA graph was launched (`executed_as` comes from the profiler, not from the
# name). It runs last because a profiler session slows the launches that come after it in the process.
#
# This is **phase 1**: everything before the first `mark_step_begin` of the process.

# %%
PHASE_1, PHASE_2 = "1: before mark_step_begin", "2: after mark_step_begin"
PROFILED = ["executed_as", "floor_us", "kernels_per_call", "copies_per_call", "eager_kernels_per_call"]


def plain(variant):
    return variant.replace(" (eager fallback)", "")


def time_phase(phase, cases):
    """Time ``cases``, a list of ``(case, shape, {name: fn}, args)``, in WINDOWS windows a pause apart, each window
    timing every case (eager first, as each case's baseline); then, on a GPU, read the profiler once per case
    after all windows. Returns the combined table (one row per case and variant: median over the windows, with
    its 90% prediction interval) and the per-window tables (for ``ratio_across_windows``)."""
    windows = []
    for w in range(WINDOWS):
        warmup = None if (w == 0 and CALLS is None) else 3  # the first window warms up by time (and calibrates)
        frames = []
        for case, shape, fns, args in cases:
            df = compare(fns, *args, case=case, samples=SAMPLES, calls=CALLS, warmup=warmup, floor=False)
            df.insert(1, "shape", shape)
            df["phase"] = phase
            frames.append(df)
        windows.append(pd.concat(frames, ignore_index=True))
        eager = windows[-1][windows[-1]["variant"] == "eager"]
        print(f"phase {phase}, window {w + 1}/{WINDOWS}: eager " + ", ".join(
            f"{r.case} {r.median_us:.1f} µs" for r in eager.itertuples()))
        if w < WINDOWS - 1:
            time.sleep(WINDOW_PAUSE_S)
    table = combine_windows(windows)
    if CUDA:  # the profiler, after every timing of the phase: a few calls of each variant
        profiled = pd.concat([compare(fns, *args, case=case, samples=1, calls=3, warmup=1, floor=True)
                              for case, _shape, fns, args in cases], ignore_index=True)
        found = {(c, plain(v)): r for c, v, r in zip(profiled["case"], profiled["variant"],
                                                      profiled.to_dict("records"))}
        for col in PROFILED:
            table[col] = [found.get((c, plain(v)), {}).get(col, float("nan"))
                          for c, v in zip(table["case"], table["variant"])]
        table["vs_floor"] = table["median_us"] / table["floor_us"]
    return table, windows


phase_1_cases = [(case, "x".join(map(str, SHAPES[case])), dict(variants[case]), (inputs[case],)) for case in SHAPES]
gelu_1, gelu_1_windows = time_phase(PHASE_1, phase_1_cases)
gelu_1["max_abs_err"] = [errors[c][plain(v)] for c, v in zip(gelu_1["case"], gelu_1["variant"])]
print(show(gelu_1, TABLE_COLUMNS).to_string(index=False, float_format="%.2f"))

# %% [markdown]
# Reading the table: default `torch.compile` launches one fused kernel but spends tens of µs in Python
# (Dynamo's frame entry and guards, AOTAutograd's wrapper, Inductor's wrapper) before it. `reduce-overhead`
# keeps all of that, adds the CUDA graph trees' bookkeeping, and launches two things instead of one: a copy
# of the input into the graph's static buffer and the graph. On one fused elementwise kernel the graph has
# almost nothing left to save (one kernel launch becomes a graph launch plus a copy), while the Python on top
# grows. A manual graph of the compiled function skips all the Python: one `copy_` and one `replay()`, or only
# `replay()` when the input is already in place. The cell below prints this run's numbers and the claims they
# support (section 7 shows where the time of a call goes).

# %%
NAN = float("nan")
claims, claim_sources = [], {}


def speedup_interval(table, case, variant):
    """(lo, hi): the 90% prediction interval of ``variant``'s speedup over eager on ``case``; NaN if it did not run."""
    r = table[(table["case"] == case) & (table["variant"] == variant)]
    return (float(r["speedup_lo"].iloc[0]), float(r["speedup_hi"].iloc[0])) if len(r) else (NAN, NAN)


def time_ratio(windows, case, slower, faster):
    """(lo, hi): the 90% prediction interval of ``slower``'s time over ``faster``'s, window by window (above 1:
    ``faster`` is faster); NaN if either did not run."""
    try:
        r = ratio_across_windows(windows, (case, slower), (case, faster))
    except ValueError:
        return NAN, NAN
    return r["lo"], r["hi"]


def add_claim(claim_id, interval, source, measure, holds, fails, unclear, above=1.0):
    """A claim on ``interval`` (skipped when it was not measured in this run); ``measure`` names the interval in
    every sentence; ``source`` says which rows it comes from (saved to env.json)."""
    lo, hi = interval
    if not (lo == lo and hi == hi):
        return None
    tail = f" ({measure} {{lo:.2f}}-{{hi:.2f}}x, 90% prediction interval)"
    c = Claim(claim_id, lo=lo, hi=hi, above=above, holds=holds + tail, fails=fails + tail,
              unclear=f"no clear difference: {unclear}" + tail)
    claims.append(c)
    claim_sources[claim_id] = source
    return c


def print_claims(ids):
    for c in claims:
        if c.claim in ids:
            print(f"[{c.verdict}] {c.statement}")


FUSED = "jit.script" if scripted is not None else "torch.compile"  # fusion alone, with the least Python on top
IP = ", input in place"
for case in COMPILE_CASES if CUDA else []:
    d = gelu_1[gelu_1["case"] == case].set_index("variant")
    naive = d.loc["reduce-overhead, naive (y = f(x))"]
    print(f"{case}: eager {d.loc['eager', 'median_us']:.1f} µs; torch.compile {d.loc['torch.compile', 'median_us']:.1f} µs "
          f"({d.loc['torch.compile', 'kernels_per_call']:g} kernel); reduce-overhead naive {naive.median_us:.1f} µs "
          f"({naive.speedup:.2f}x eager; {naive.kernels_per_call:g} kernels + {naive.copies_per_call:g} memcpy per "
          f"call); manual graph of the compiled function, input in place "
          f"{d.loc['torch.compile + graph' + IP, 'median_us']:.1f} µs.")
    w = gelu_1_windows
    add_claim(f"graph_beats_eager_{case}", speedup_interval(gelu_1, case, "cuda graph" + IP),
              {"kind": "speedup", "case": case, "variant": "cuda graph" + IP}, "speedup over eager",
              f"{case} GELU: a CUDA graph of the five eager kernels, input in place, is faster than eager",
              f"{case} GELU: a CUDA graph of the five eager kernels, input in place, is not faster than eager",
              f"{case} GELU, a CUDA graph of the five eager kernels (input in place) against eager")
    add_claim(f"fusion_beats_graph_{case}", time_ratio(w, case, "cuda graph" + IP, FUSED),
              {"kind": "ratio", "case": case, "slower": "cuda graph" + IP, "faster": FUSED},
              "time of the graph over the fused function's",
              f"{case} GELU: fusion alone ({FUSED}, one kernel launched from Python) is faster than a graph alone "
              f"(the five eager kernels replayed in place)",
              f"{case} GELU: a graph alone (the five eager kernels replayed in place) is at least as fast as fusion "
              f"alone ({FUSED}, one kernel launched from Python)",
              f"{case} GELU, fusion alone ({FUSED}) against a graph alone (the five eager kernels in place)")
    add_claim(f"fusion_adds_to_graph_{case}", time_ratio(w, case, "cuda graph" + IP, "torch.compile + graph" + IP),
              {"kind": "ratio", "case": case, "slower": "cuda graph" + IP, "faster": "torch.compile + graph" + IP},
              "time of the graph of eager's kernels over the graph of the fused one's",
              f"{case} GELU: inside a graph fusion still pays: a graph of torch.compile's one fused kernel is faster "
              f"than a graph of eager's five",
              f"{case} GELU: inside a graph fusion does not pay: a graph of torch.compile's fused kernel is not "
              f"faster than a graph of eager's five",
              f"{case} GELU, a graph of torch.compile's fused kernel against a graph of eager's five")
    add_claim(f"graph_adds_to_fusion_{case}", time_ratio(w, case, FUSED, f"{FUSED} + graph" + IP),
              {"kind": "ratio", "case": case, "slower": FUSED, "faster": f"{FUSED} + graph" + IP},
              f"time of {FUSED} over {FUSED} + graph",
              f"{case} GELU: on top of fusion a graph still pays: {FUSED} + graph (input in place) is faster than "
              f"{FUSED} alone",
              f"{case} GELU: on top of fusion a graph does not pay: {FUSED} + graph (input in place) is not faster "
              f"than {FUSED} alone",
              f"{case} GELU, {FUSED} + graph (input in place) against {FUSED} alone")
    add_claim(f"compile_beats_script_graph_{case}",
              time_ratio(w, case, "jit.script + graph" + IP, "torch.compile + graph" + IP),
              {"kind": "ratio", "case": case, "slower": "jit.script + graph" + IP,
               "faster": "torch.compile + graph" + IP},
              "time of TorchScript's graph over torch.compile's",
              f"{case} GELU: replayed in a graph, torch.compile's fused kernel is faster than TorchScript's",
              f"{case} GELU: replayed in a graph, torch.compile's fused kernel is not faster than TorchScript's",
              f"{case} GELU, torch.compile's fused kernel against TorchScript's, both replayed in a graph")
    add_claim(f"ro_naive_beats_eager_{case}", speedup_interval(gelu_1, case, "reduce-overhead, naive (y = f(x))"),
              {"kind": "speedup", "case": case, "variant": "reduce-overhead, naive (y = f(x))"}, "speedup over eager",
              f"{case} GELU: reduce-overhead, called as y = f(x), is faster than eager",
              f"{case} GELU: reduce-overhead, called as y = f(x), is not faster than eager",
              f"{case} GELU, reduce-overhead (y = f(x)) against eager")
print_claims(set(claim_sources))
if not claims:
    print("No claims here: the graph, fusion and reduce-overhead comparisons need an NVIDIA GPU (and torch.compile).")

# %% [markdown]
# ## 5. Using `reduce-overhead` as documented
#
# What the documentation recommends:
#
# - **Say where an iteration starts**: `torch.compiler.cudagraph_mark_step_begin()` before each call. (In
#   inference every call already starts a new generation, so here the mark changes nothing about when memory
#   is reused; in training, or whenever the heuristic is wrong, it is what keeps replays on the fast path.)
# - **Keep the input where the graph reads it**: if your data is produced into the same tensor every
#   iteration (a preallocated batch buffer, a KV cache), mark it with
#   `torch._dynamo.mark_static_address(buf, guard=True)`; the graph should then read it in place instead of
#   copying it. And consume or `.clone()` each output before the next call. The kernels and copies per call
#   show whether the copy really went away on your version.
#
# The first `mark_step_begin` changes how the process counts generations, so these variants are timed in
# **phase 2**, with eager and the manual graph of the compiled function timed again beside them as
# references, together with sections 6 and 6b (below). Speedups are read within a phase.

# %%
def with_mark_step(fn):
    def call(x):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(x)
    return call


late = {case: [] for case in SHAPES}
if CUDA and COMPILE_CASES:
    ro_static = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    for case in COMPILE_CASES:
        marked = with_mark_step(ro)
        variants[case]["reduce-overhead + mark_step_begin"] = marked
        errors[case]["reduce-overhead + mark_step_begin"] = max_abs_err(marked, case)

        buf = inputs[case].clone()                 # the buffer your pipeline writes each new input into
        # Before the first call, so the graph is built for it. guard=True makes Dynamo guard the address (a new
        # address recompiles). With the default guard=False, PyTorch 2.11 kept copying the input on our H200
        # whenever the compiled graph came from the compile cache (the static-input marking was lost).
        torch._dynamo.mark_static_address(buf, guard=True)
        in_place = with_mark_step(ro_static)
        for _ in range(3):
            in_place(buf)
        # timed: the data is already in `buf` (the argument is ignored); checked: new data written into `buf` first
        variants[case]["reduce-overhead, static input"] = lambda _x, f=in_place, b=buf: f(b)
        errors[case]["reduce-overhead, static input"] = max_abs_err(
            variants[case]["reduce-overhead, static input"], case, prepare=buf.copy_)
        late[case] = ["eager", "torch.compile + graph" + IP, "reduce-overhead + mark_step_begin",
                      "reduce-overhead, static input"]
    late_errors = pd.DataFrame([{"case": c, "variant": v, "max_abs_err": errors[c][v]}
                                for c in SHAPES for v in late[c]])
    print(late_errors.to_string(index=False))
    assert (late_errors["max_abs_err"] < 1e-4).all(), "a variant disagrees with eager; do not time it"
else:
    print("skipped: needs an NVIDIA GPU.")

# %% [markdown]
# ## 6. A deeper model: many kernels per call
#
# `reduce-overhead`'s fixed cost per call (guards, wrappers, the tree's bookkeeping, one input copy, one
# graph launch) does not grow with the work inside the graph, while eager pays a launch per kernel and default
# `torch.compile` pays one per generated kernel. So give it a region with many kernels: an MLP of
# `MLP_LAYERS` × (`Linear` + `ReLU`), `MLP_WIDTH` features, a batch of `MLP_BATCH` rows (inference, no
# gradients): small matrices, so every kernel is short and the model is launch-bound. `build_mlp(seed)` builds
# it with the weights that seed draws (section 6b builds its training copies with it too). Timed in
# **phase 2**: eager, default `torch.compile`, `reduce-overhead` (with `mark_step_begin`, as the process
# requires by now), the kit's manual graph of the eager model (`g(x)`, and with the input in place), and a
# manual graph of the compiled model with its input in place.
#
# **A fair comparison needs comparable GPU work on both sides.** A graph removes launches, not slow kernels:
# it replays whatever kernels eager PyTorch or `torch.compile` chose, and it cannot run faster than they do
# (the floor). Eager `nn.Linear` and the compiled forward call cuBLAS through different operators (eager: one
# `addmm` with the bias; Inductor: a plain `mm` plus a fused bias + ReLU kernel), so cuBLAS may pick different
# matrix-multiply kernels for them. In an earlier recorded run in full float32 (an H100, PyTorch 2.11) it did:
# the compiled forward's kernel was about 8x slower on the GPU (floor 375 µs against 47 µs), and the comparison
# measured that kernel choice, not launch overhead. So this notebook sets one precision for float32 matmuls,
# for eager and compiled code alike, before anything is compiled (`MATMUL_PRECISION`, default `"high"`: TF32
# tensor cores, which PyTorch's own warning suggests). The cells below print both floors, and a claim checks
# that a graph of the compiled kernels is not far slower than a graph of eager's.

# %%
def build_mlp(seed):
    """A fresh MLP_LAYERS x (Linear(MLP_WIDTH, MLP_WIDTH) + ReLU) on DEVICE, its weights drawn after
    torch.manual_seed(seed). Example: build_mlp(0) and build_mlp(0) hold equal weights.
    """
    torch.manual_seed(seed)
    layers = []
    for _ in range(MLP_LAYERS):
        layers += [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(DEVICE)


mlp = build_mlp(seed=0).requires_grad_(False)
x_mlp, x_mlp_test = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)


def mlp_forward(x):
    return mlp(x)


mlp_variants = {"eager": mlp}
if CUDA and COMPILE:
    mlp_variants["torch.compile"] = torch.compile(fresh(mlp_forward), dynamic=False)
    mlp_variants["reduce-overhead + mark_step_begin"] = with_mark_step(
        torch.compile(fresh(mlp_forward), mode="reduce-overhead", dynamic=False))
if CUDA:
    g_mlp = capture(mlp, x_mlp)
    mlp_variants["cuda graph"] = g_mlp
    mlp_variants["cuda graph" + IP] = lambda _x, g=g_mlp: g.replay()

ref_mlp = mlp(x_mlp_test)
mlp_errors = {}
for name, fn in list(mlp_variants.items()):
    for _ in range(3):                      # compile, record, replay
        fn(x_mlp)
    if name == "cuda graph" + IP:
        g_mlp.static_inputs[0].copy_(x_mlp_test)
    out = fn(x_mlp_test)
    mlp_errors[name] = (out - ref_mlp).abs().max().item()
if "torch.compile" in mlp_variants:         # the compiled kernels alone, without the Python: a graph of them
    g_mlp_compiled = capture(mlp_variants["torch.compile"], x_mlp)
    mlp_variants["torch.compile + graph" + IP] = lambda _x, g=g_mlp_compiled: g.replay()
    g_mlp_compiled.static_inputs[0].copy_(x_mlp_test)
    mlp_errors["torch.compile + graph" + IP] = (mlp_variants["torch.compile + graph" + IP](x_mlp_test)
                                                - ref_mlp).abs().max().item()
rel = {k: v / ref_mlp.abs().max().item() for k, v in mlp_errors.items()}
# TF32 keeps 10 bits of mantissa, and eager and compiled code may run different matmul kernels: differences of
# about 1e-3 of the output's scale are expected there; in full float32, a few ulp.
MLP_TOLERANCE = 1e-2 if torch.get_float32_matmul_precision() != "highest" else 1e-4
print(pd.DataFrame({"max_abs_err": mlp_errors, "relative to max |output|": rel}).to_string(float_format="%.2e"))
assert max(rel.values()) < MLP_TOLERANCE, "a variant disagrees with eager; do not time it"
MLP_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}"

# %% [markdown]
# ### 6b. A training step: forward and backward under `reduce-overhead`
# Training is where `reduce-overhead` is meant to be used: `torch.compile` of the model gives AOTAutograd a
# forward and a backward graph, and `reduce-overhead` replays each as a CUDA graph, while the loss, the
# backward's autograd bookkeeping and `optimizer.step()` stay in Python. The same MLP architecture, one copy per
# variant from `build_mlp(seed=1)` (so all start from the same weights), each with its own SGD optimizer,
# trained on batches of `MLP_BATCH` rows, timed in **phase 2**: the eager step, that step with the model
# compiled with `reduce-overhead` (`cudagraph_mark_step_begin` at each step), and the kit's whole-step graph
# (`capture_train_step`, notebook 02), which captures the optimizer step too. Parity with eager first.

# %%
TRAIN_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}, SGD training step"
TRAIN_RO, TRAIN_KIT = "reduce-overhead forward+backward", "kit whole-step graph"
train_steps, train_errors = {}, {}
if CUDA and COMPILE:
    from cudagraph_kit import capture_train_step

    loss_fn = torch.nn.functional.mse_loss
    x_train, y_train = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)

    def eager_train_step(model, opt, compiled=None):
        forward = compiled or model

        def step(x, y):
            if compiled is not None:
                torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the graphs may reuse their memory
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(forward(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    train_models = {name: build_mlp(seed=1) for name in ("eager", TRAIN_RO, TRAIN_KIT)}  # the same initial weights
    train_optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in train_models.items()}
    train_steps = {
        "eager": eager_train_step(train_models["eager"], train_optimizers["eager"]),
        TRAIN_RO: eager_train_step(train_models[TRAIN_RO], train_optimizers[TRAIN_RO],
                                   torch.compile(train_models[TRAIN_RO], mode="reduce-overhead", dynamic=False)),
        TRAIN_KIT: capture_train_step(train_models[TRAIN_KIT], train_optimizers[TRAIN_KIT], loss_fn,
                                      (x_train, y_train)),
    }
    for _ in range(6):                        # parity: the same six steps on every variant
        for step in train_steps.values():
            step(x_train, y_train)
    train_errors = {name: max((p - q).abs().max().item()
                              for p, q in zip(model.parameters(), train_models["eager"].parameters()))
                    for name, model in train_models.items()}
    print("max |parameter difference| vs eager after 6 steps:",
          ", ".join(f"{k} {v:.1e}" for k, v in train_errors.items()))
    assert max(train_errors.values()) < 1e-4, "a training variant disagrees with eager; do not time it"
else:
    print("skipped: needs an NVIDIA GPU (and torch.compile).")

# %% [markdown]
# ### Timing phase 2: sections 5, 6 and 6b together
# Every window times the section-5 GELU variants, the MLP forward and the training step, one after the other,
# so the windows of each case are spread over the whole phase; then the profiler runs once per case.

# %%
phase_2_cases = [(case, "x".join(map(str, SHAPES[case])), {n: variants[case][n] for n in late[case]},
                  (inputs[case],)) for case in SHAPES if late[case]]
phase_2_cases.append((MLP_CASE, f"{MLP_BATCH}x{MLP_WIDTH}", mlp_variants, (x_mlp,)))
if train_steps:
    phase_2_cases.append((TRAIN_CASE, f"{MLP_BATCH}x{MLP_WIDTH}", train_steps, (x_train, y_train)))
phase_2, phase_2_windows = time_phase(PHASE_2, phase_2_cases)


def err_of(case, variant):
    v = plain(variant)
    return mlp_errors[v] if case == MLP_CASE else train_errors[v] if case == TRAIN_CASE else errors[case][v]


phase_2["max_abs_err"] = [err_of(c, v) for c, v in zip(phase_2["case"], phase_2["variant"])]
print(show(phase_2, TABLE_COLUMNS).to_string(index=False, float_format="%.2f"))

# %% [markdown]
# **Section 5: does `reduce-overhead` ever pay on this one elementwise function?** The claims below compare its
# documented best form (marks and a static input) with eager, and the kernels per call show whether
# `mark_static_address` removed the input copy.

# %%
for case in COMPILE_CASES if CUDA else []:
    k = pd.concat([gelu_1, phase_2]).query("case == @case").drop_duplicates("variant").set_index("variant")
    went = k.loc["reduce-overhead, static input", "kernels_per_call"] < k.loc["reduce-overhead, output dropped",
                                                                             "kernels_per_call"]
    print(f"{case}: mark_static_address {'removed' if went else 'did NOT remove'} the input copy on PyTorch "
          f"{torch.__version__} ({k.loc['reduce-overhead, output dropped', 'kernels_per_call']:g} -> "
          f"{k.loc['reduce-overhead, static input', 'kernels_per_call']:g} kernels per call).")
    add_claim(f"ro_static_beats_eager_{case}", speedup_interval(phase_2, case, "reduce-overhead, static input"),
              {"kind": "speedup", "case": case, "variant": "reduce-overhead, static input"}, "speedup over eager",
              f"{case} GELU: reduce-overhead with mark_step_begin and a static input is faster than eager",
              f"{case} GELU: reduce-overhead with mark_step_begin and a static input is not faster than eager",
              f"{case} GELU, reduce-overhead with mark_step_begin and a static input against eager")
RO_GELU_IDS = [f"{k}_{case}" for k in ("ro_naive_beats_eager", "ro_static_beats_eager") for case in SHAPES]
print_claims(RO_GELU_IDS)
RO_GELU_VERDICT = ("; ".join(c.statement for c in claims if c.claim in RO_GELU_IDS)
                   or "not measured (needs an NVIDIA GPU and torch.compile)")

# %% [markdown]
# **Section 6: the deeper MLP.** First the floors: is the GPU work of the compiled forward comparable with
# eager's (the fairness check above)? Then the claims: does `reduce-overhead` beat eager and default
# `torch.compile` on it?

# %%
def us(value):
    return f"{value:.1f} µs" if value == value else "not measured"


m = phase_2[phase_2["case"] == MLP_CASE].set_index("variant")
MLP_FLOORS = {"eager's kernels (graph)": NAN, "the compiled forward's kernels (graph)": NAN,
              "reduce-overhead's graph": NAN}
if CUDA and COMPILE:
    MLP_FLOORS = {"eager's kernels (graph)": float(m.loc["cuda graph" + IP, "floor_us"]),
                  "the compiled forward's kernels (graph)": float(m.loc["torch.compile + graph" + IP, "floor_us"]),
                  "reduce-overhead's graph": float(m.loc["reduce-overhead + mark_step_begin", "floor_us"])}
    e_floor, c_floor = MLP_FLOORS["eager's kernels (graph)"], MLP_FLOORS["the compiled forward's kernels (graph)"]
    print(f"float32 matmul precision: {torch.get_float32_matmul_precision()}. GPU floor per call (profiler, after "
          "all windows): " + ", ".join(f"{k} {us(v)}" for k, v in MLP_FLOORS.items())
          + (f"; compiled / eager floor = {c_floor / e_floor:.2f}" if e_floor == e_floor and c_floor == c_floor
             else "") + f". Kernels per call: eager {m.loc['eager', 'kernels_per_call']:g}, torch.compile "
          f"{m.loc['torch.compile', 'kernels_per_call']:g} (+ {m.loc['torch.compile', 'copies_per_call']:g} copies).")
    w = phase_2_windows
    add_claim("compiled_graph_slower_mlp", time_ratio(w, MLP_CASE, "torch.compile + graph" + IP, "cuda graph" + IP),
              {"kind": "ratio", "case": MLP_CASE, "slower": "torch.compile + graph" + IP, "faster": "cuda graph" + IP},
              "time of a graph of the compiled kernels over a graph of eager's",
              f"{MLP_LAYERS}-layer MLP: the compiled forward's kernels are far slower on the GPU than eager's, so "
              f"the comparison below measures kernel choice more than launch overhead",
              f"{MLP_LAYERS}-layer MLP: the compiled forward's kernels are not far slower on the GPU than eager's "
              f"(at most 1.25x), so the comparison below is one of launch overhead",
              f"{MLP_LAYERS}-layer MLP, a graph of the compiled forward's kernels against a graph of eager's, at "
              f"the 1.25x mark", above=1.25)
    add_claim("ro_beats_eager_mlp", speedup_interval(phase_2, MLP_CASE, "reduce-overhead + mark_step_begin"),
              {"kind": "speedup", "case": MLP_CASE, "variant": "reduce-overhead + mark_step_begin"},
              "speedup over eager",
              f"{MLP_LAYERS}-layer MLP forward: reduce-overhead (with mark_step_begin) is faster than eager",
              f"{MLP_LAYERS}-layer MLP forward: reduce-overhead (with mark_step_begin) is not faster than eager",
              f"{MLP_LAYERS}-layer MLP forward, reduce-overhead (with mark_step_begin) against eager")
    add_claim("ro_beats_compile_mlp", time_ratio(w, MLP_CASE, "torch.compile", "reduce-overhead + mark_step_begin"),
              {"kind": "ratio", "case": MLP_CASE, "slower": "torch.compile",
               "faster": "reduce-overhead + mark_step_begin"},
              "time of default torch.compile over reduce-overhead's",
              f"{MLP_LAYERS}-layer MLP forward: reduce-overhead is faster than default torch.compile",
              f"{MLP_LAYERS}-layer MLP forward: reduce-overhead is not faster than default torch.compile",
              f"{MLP_LAYERS}-layer MLP forward, reduce-overhead against default torch.compile")
    print(f"eager {us(m.loc['eager', 'median_us'])}, torch.compile {us(m.loc['torch.compile', 'median_us'])}, "
          f"reduce-overhead {us(m.loc['reduce-overhead + mark_step_begin', 'median_us'])}, the kit's graph of the "
          f"eager model {us(m.loc['cuda graph', 'median_us'])} with the input copy and "
          f"{us(m.loc['cuda graph' + IP, 'median_us'])} in place, a graph of the compiled model in place "
          f"{us(m.loc['torch.compile + graph' + IP, 'median_us'])} (medians over {WINDOWS} windows).")
RO_MLP_IDS = ["compiled_graph_slower_mlp", "ro_beats_eager_mlp", "ro_beats_compile_mlp"]
print_claims(RO_MLP_IDS)
RO_MLP_VERDICT = ("; ".join(c.statement for c in claims if c.claim in RO_MLP_IDS)
                  or "not measured (needs an NVIDIA GPU and torch.compile)")

# %% [markdown]
# **Section 6b: the training step.** `reduce-overhead` graphs the forward and the backward; the kit's
# whole-step graph also holds the loss, `zero_grad` and the optimizer step.

# %%
if train_steps:
    t = phase_2[phase_2["case"] == TRAIN_CASE].set_index("variant")
    print(f"per step: eager {us(t.loc['eager', 'median_us'])} ({t.loc['eager', 'kernels_per_call']:g} kernels "
          f"launched one by one), {TRAIN_RO} {us(t.loc[TRAIN_RO, 'median_us'])}, {TRAIN_KIT} "
          f"{us(t.loc[TRAIN_KIT, 'median_us'])} (medians over {WINDOWS} windows).")
    add_claim("ro_beats_eager_training", speedup_interval(phase_2, TRAIN_CASE, TRAIN_RO),
              {"kind": "speedup", "case": TRAIN_CASE, "variant": TRAIN_RO}, "speedup over eager",
              f"{MLP_LAYERS}-layer MLP SGD training step: reduce-overhead (forward and backward graphs, optimizer "
              f"eager) is faster than eager",
              f"{MLP_LAYERS}-layer MLP SGD training step: reduce-overhead (forward and backward graphs, optimizer "
              f"eager) is not faster than eager",
              f"{MLP_LAYERS}-layer MLP SGD training step, reduce-overhead against eager")
    add_claim("kit_beats_ro_training", time_ratio(phase_2_windows, TRAIN_CASE, TRAIN_RO, TRAIN_KIT),
              {"kind": "ratio", "case": TRAIN_CASE, "slower": TRAIN_RO, "faster": TRAIN_KIT},
              "time of reduce-overhead's step over the whole-step graph's",
              f"{MLP_LAYERS}-layer MLP SGD training step: the kit's whole-step graph (optimizer included) is "
              f"faster than reduce-overhead",
              f"{MLP_LAYERS}-layer MLP SGD training step: the kit's whole-step graph (optimizer included) is not "
              f"faster than reduce-overhead",
              f"{MLP_LAYERS}-layer MLP SGD training step, the kit's whole-step graph against reduce-overhead")
RO_TRAIN_IDS = ["ro_beats_eager_training", "kit_beats_ro_training"]
print_claims(RO_TRAIN_IDS)
RO_TRAIN_VERDICT = ("; ".join(c.statement for c in claims if c.claim in RO_TRAIN_IDS)
                    or "not measured (needs an NVIDIA GPU and torch.compile)")

# %% [markdown]
# ## 7. Where the time of a call goes
#
# Two measurements, made after all timings (a profiler session slows every later kernel launch in the
# process, so it must not run before a timing). First, what the GPU does per call and which CUDA runtime calls
# the CPU makes (profiler): each `cudaLaunchKernel`/`cudaMemcpyAsync` costs the CPU a launch, `cudaGraphLaunch`
# is one graph replay. Then where the CPU time goes: Python's `cProfile` over many calls, grouped by the part
# of PyTorch it was spent in. cProfile slows Python down, so read the *shares*, not the absolute µs. The
# `reduce-overhead` variants here are the ones with `mark_step_begin`: by now the process counts generations
# only by marks, so a loop without them would no longer behave as it did in phase 1.

# %%
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def short(kernel):
    name = kernel.removeprefix("void ").replace("(anonymous namespace)::", "")
    return name.split("<")[0].split("(")[0]


def runtime_calls(fn, x, calls=50):
    """CUDA runtime API calls per call of ``fn(x)`` (launches, copies, graph launches, synchronizations)."""
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
    counts = defaultdict(int)
    for e in prof.events():
        if (e.device_type == DeviceType.CPU and e.name.startswith("cu")  # runtime (cuda*) and driver (cu*) API
                and not any(k in e.name for k in ("GetDevice", "IsCapturing"))):
            counts[e.name] += 1
    return ", ".join(f"{k} {v / calls:g}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v >= calls / 2)


def gpu_breakdown(named):
    rows = []
    for case, n, fn, x in named:
        g = gpu_time(fn, x)
        rows.append({"case": case, "variant": n, "GPU busy µs": getattr(g, "busy_us", float("nan")),
                     "GPU work per call (µs)": "; ".join(f"{short(k)} {v:.1f}" for k, v in getattr(g, "top", [])[:3]),
                     "CUDA runtime calls per call": runtime_calls(fn, x)})
    return pd.DataFrame(rows)


def bucket(filename, funcname):
    if filename == "~":  # C functions called from Python
        if "replay" in funcname:
            return "C++: graph replay (launch)"
        if "copy" in funcname:
            return "C++: copies (launch)"
        return "C++: other calls (tensor bookkeeping, ...)"
    f = filename.replace("\\", "/")
    for key, label in (("torch/_dynamo", "Dynamo: frame entry + guards"),
                       ("torch/_functorch", "AOTAutograd runtime wrappers"),
                       ("cudagraph_trees", "CUDA graph trees bookkeeping"),
                       ("torch/_inductor", "Inductor compiled-code wrapper"),
                       ("cudagraph_kit", "cudagraph_kit (GraphedCallable)")):
        if key in f:
            return label
    if "site-packages/torch/" in f:
        return "other torch Python (torch/" + f.rsplit("site-packages/torch/", 1)[1].split("/")[0] + ")"
    if "/lib/python" in f and "site-packages" not in f:
        return "Python standard library"
    return "this notebook / other"


def cpu_breakdown(fn, x, calls=2000):
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(x)
    prof.disable()
    torch.cuda.synchronize()
    per = defaultdict(float)
    for (filename, _line, funcname), (_cc, _nc, tottime, _ct, _callers) in pstats.Stats(prof).stats.items():
        per[bucket(filename, funcname)] += tottime
    total = sum(per.values())
    return pd.DataFrame([{"where": k, "µs/call (under cProfile)": v / calls * 1e6, "share": f"{v / total:.0%}"}
                         for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v / total >= 0.01])


if CUDA and COMPILE_CASES:
    c0 = COMPILE_CASES[0]
    named = [(c0, n, variants[c0][n], inputs[c0]) for n in
             ["eager", "torch.compile", "torch.compile + graph", "torch.compile + graph, input in place",
              "reduce-overhead + mark_step_begin", "reduce-overhead, static input"]]
    named += [(MLP_CASE, n, mlp_variants[n], x_mlp) for n in ["eager", "torch.compile",
                                                              "reduce-overhead + mark_step_begin"]]
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(gpu_breakdown(named).to_string(index=False, float_format="%.2f"))
    for label, fn, x in [("torch.compile", variants[c0]["torch.compile"], inputs[c0]),
                         ("torch.compile + graph", variants[c0]["torch.compile + graph"], inputs[c0]),
                         ("reduce-overhead + mark_step_begin", variants[c0]["reduce-overhead + mark_step_begin"],
                          inputs[c0]),
                         ("reduce-overhead, static input", variants[c0]["reduce-overhead, static input"], inputs[c0]),
                         (f"reduce-overhead + mark_step_begin, {MLP_CASE}",
                          mlp_variants["reduce-overhead + mark_step_begin"], x_mlp)]:
        print(f"\nWhere the CPU time of one call goes, {label!r}:")
        print(cpu_breakdown(fn, x).to_string(index=False, float_format="%.1f"))
else:
    print("skipped: needs an NVIDIA GPU.")

# %% [markdown]
# ## 8. All results, saved
#
# `speedup` is relative to eager on the same tensor in the same phase (column `phase`), the median over
# `windows` windows; `speedup_lo`..`speedup_hi` is its 90% prediction interval. `floor_us` is the GPU-busy time
# per call: what a variant would cost if launching were free. Fusion lowers the floor (fewer passes over
# memory); a graph brings the time per call down *towards* the floor (fewer, cheaper launches). The claims are
# saved beside the table, in `claims.csv`.

# %%
df = pd.concat([gelu_1, phase_2], ignore_index=True)
df["device"] = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
df["matmul_precision"] = torch.get_float32_matmul_precision()
cols = ["case", "shape", "phase", "variant", "executed_as", "median_us", "windows", "speedup", "speedup_lo",
        "speedup_hi", "floor_us", "vs_floor", "kernels_per_call", "copies_per_call", "max_abs_err", "device",
        "matmul_precision"]
df = df[[c for c in cols if c in df.columns] + [c for c in df.columns if c not in cols]]
print(show(df, ["case", "phase", "variant", "executed_as", "median_us", "speedup", "speedup_lo", "speedup_hi",
                "floor_us", "kernels_per_call", "copies_per_call", "max_abs_err"])
      .to_string(index=False, float_format=lambda v: f"{v:.3g}"))

# %%
from IPython.display import Image, display


def plot(df):
    """One panel per case, a linear time axis each; bars coloured by how the variant ran, the 90% prediction
    interval of the time as a whisker, the floor as a tick."""
    cases = list(dict.fromkeys(df["case"]))
    sizes = df.groupby("case", sort=False).size()
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 0.36 * sizes.sum() + 1.2 * len(cases) + 0.8),
                             gridspec_kw={"height_ratios": list(sizes)}, squeeze=False)
    colors = {"cuda graph": "tab:green", "eager": "tab:blue"}
    for ax, case in zip(axes[:, 0], cases):
        d = df[df["case"] == case].iloc[::-1]
        y = list(range(len(d)))
        ax.barh(y, d["median_us"], color=[colors.get(e, "tab:gray") for e in d["executed_as"]], height=0.7)
        if {"median_pi_lo", "median_pi_hi"} <= set(d.columns) and d["median_pi_lo"].notna().any():
            ax.errorbar(d["median_us"], y, fmt="none", ecolor="black", elinewidth=0.8, capsize=2,
                        xerr=[(d["median_us"] - d["median_pi_lo"]).clip(lower=0).fillna(0),
                              (d["median_pi_hi"] - d["median_us"]).clip(lower=0).fillna(0)])
        if d["floor_us"].notna().any():
            ax.scatter(d["floor_us"], y, marker="|", s=250, color="black", zorder=3)
        labels = [v.replace(" (eager fallback)", "") + (" †" if p == PHASE_2 and c in SHAPES else "")
                  for v, p, c in zip(d["variant"], d["phase"], d["case"])]
        ax.set_yticks(y, labels, fontsize=8)
        top = max(d["median_us"].max(), d["median_pi_hi"].max() if "median_pi_hi" in d else 0)
        top = top if top == top else d["median_us"].max()
        ax.set_xlim(0, top * 1.25)  # room for the value labels inside the axes
        for yi, v in zip(y, d["median_us"]):
            ax.text(v + top * 0.01, yi + 0.25, f"{v:.1f}", va="center", fontsize=7)
        ax.set_xlabel("time per call (µs)")
        ax.set_title(f"{case} ({d['shape'].iloc[0]})", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    where = df["device"].iloc[0]
    note = "" if CUDA else " (CPU, eager only: not a GPU result)"
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()] + [
        plt.Line2D([], [], marker="|", color="black", ls="", markersize=12)]
    fig.legend(handles, ["ran as a CUDA graph", "eager launches", "GPU-busy floor"], loc="upper right", fontsize=8,
               ncol=3, bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Time per call on {where}, PyTorch {torch.__version__}{note}\n"
                 f"median over {WINDOWS} windows, whisker: 90% prediction interval; † timed in phase 2 (after the "
                 "first mark_step_begin), with its own eager row", fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    return fig


fig = plot(df)
folder = results.save(STEM, df, figures={"time_per_call": fig},
                      extra_env={"torchscript_fuser": FUSER, "reduce_overhead_stale_output": ro_overwrite,
                                 "reduce_overhead_stale_output_first_call": ro_overwrite_first_call,
                                 "reduce_overhead_gelu": RO_GELU_VERDICT, "reduce_overhead_mlp": RO_MLP_VERDICT,
                                 "reduce_overhead_training": RO_TRAIN_VERDICT,
                                 "mlp_floors_us": {k: (v if v == v else None) for k, v in MLP_FLOORS.items()},
                                 "matmul_precision": torch.get_float32_matmul_precision(),
                                 "windows": WINDOWS, "claim_sources": claim_sources})
save_claims(folder, claims)
print("saved to", folder, "(results.csv, env.json, claims.csv, time_per_call.png)")
display(Image(filename=str(folder / "time_per_call.png")))  # the saved figure, shown whatever the plot backend
plt.close(fig)

# %% [markdown]
# ## 9. Fusion vs graphs, and the published figures
#
# The published figures come from a 2021 blog post in Japanese by the GitHub user shu65,
# "PyTorch 1.10の新機能「CUDA Graphs」のパフォーマンスを測定してみる" ("Measuring the performance of CUDA Graphs,
# new in PyTorch 1.10"), and its measurement notebook,
# [shu65/blog-pytorch-notebooks: pytorch_CUDA_Graphs.ipynb](https://github.com/shu65/blog-pytorch-notebooks/blob/main/pytorch_CUDA_Graphs.ipynb).
# The blog measured on a Tesla K80 with PyTorch 1.10 (wall clock, 10,000 calls, mean). Our reference is a plain
# PyTorch run on an H100 (PyTorch 2.11, median of 5 repeats, in a process whose timings no profiler session had
# slowed down; "-" where it has no figure). The last column is this notebook's run (phase 1; the phase 2
# rows with their own eager), medians over the timing windows.

# %%
# NBVAL_CHECK_OUTPUT
# Published graph figures go on the "input in place" rows: the reference's floors (about 1.4 µs for the fused
# graphs) show it replayed without copying a new input; the blog does not say.
IP = ", input in place"
K80 = {("small", "eager"): 70.9, ("small", "cuda graph" + IP): 64.9, ("small", "jit.script"): 38.9,
       ("small", "jit.script + graph" + IP): 35.6, ("large", "eager"): 1320.0, ("large", "cuda graph" + IP): 1340.0,
       ("large", "jit.script"): 425.0, ("large", "jit.script + graph" + IP): 374.0}
H100 = {("small", "eager"): 75.8, ("small", "cuda graph" + IP): 8.7, ("small", "jit.script"): 10.9,
        ("small", "jit.script + graph" + IP): 2.7, ("small", "torch.compile"): 34.2,
        ("small", "torch.compile + graph" + IP): 3.0, ("small", "reduce-overhead, naive (y = f(x))"): 85.2,
        ("large", "eager"): 72.4, ("large", "cuda graph" + IP): 66.8, ("large", "jit.script + graph" + IP): 18.5,
        ("large", "torch.compile + graph" + IP): 11.4}
published_figures = pd.DataFrame([{"case": c, "variant": v, "K80, PyTorch 1.10 (µs)": K80.get((c, v)),
                                   "H100 reference (µs)": H100.get((c, v))} for c, v in dict.fromkeys([*K80, *H100])])
print(published_figures.to_string(index=False, na_rep="-"))

# %%
if CUDA:
    ours, ours_label = df, f"this run: {df['device'].iloc[0]}"
else:
    rec = results.load(STEM)
    ours = rec.df if rec is not None else None
    ours_label = f"recorded: {rec.env.get('gpu')}" if rec is not None else "this run (needs a GPU)"


def fmt(us, speedup):
    if us is None or pd.isna(us):
        return "-"
    return f"{us:.1f} µs ({speedup:.2f}x)" if us < 1000 else f"{us / 1000:.3f} ms ({speedup:.2f}x)"


def published(table, case, v):
    us = table.get((case, v))
    return fmt(us, table[(case, "eager")] / us) if us else "-"


rows = []
for case in ("small", "large"):
    for v in ["eager", "cuda graph" + IP, "cuda graph", "jit.script", "jit.script + graph" + IP, "jit.script + graph",
              "torch.compile", "torch.compile + graph" + IP, "torch.compile + graph",
              "reduce-overhead, naive (y = f(x))", "reduce-overhead + mark_step_begin", "reduce-overhead, static input"]:
        mine = "-"
        if ours is not None:
            m = ours[(ours["case"] == case) & (ours["variant"] == v)]
            if len(m):
                mine = fmt(m["median_us"].iloc[0], m["speedup"].iloc[0])
        rows.append({"case": case, "variant": v, "K80, blog (PyTorch 1.10)": published(K80, case, v),
                     "H100, reference (PyTorch 2.11)": published(H100, case, v), ours_label: mine})
side_by_side = pd.DataFrame(rows)
side_by_side

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU was the bottleneck for both tensors in the blog's figures (each
# kernel ran longer than the CPU took to launch it; the cell below works out the large GELU's memory traffic at
# the K80's bandwidth), so a graph gained almost nothing there and only fusion helped. A Hopper GPU runs each
# of the small tensor's kernels in much less time than a launch takes (compare the floor with the eager time
# per kernel in the table below), so eager GELU on the small tensor is mostly launch overhead, which a graph
# removes. On the large tensor the five kernels are bound by memory bandwidth: fusion cuts the passes over
# memory, and whether a graph still pays on top of it depends on whether the fused kernel's GPU time is longer
# than launching it.
#
# The two effects are separate: the "kernels per call" column shows fusion going from five kernels to one; the
# floor shows the GPU time that saves; the graph variants show the CPU launch cost going away. Which one
# matters more on each tensor on this GPU, and whether they stack, is what the claims printed below say.

# %%
K80_BANDWIDTH = 240e9  # bytes/s per GPU of a Tesla K80 (data sheet)
large_bytes = 11 * 4 * 32 * 3 * 224 * 224  # 11 tensor passes of float32 (notebook 01, section 1)
print(f"K80, large GELU: {large_bytes / 1e6:.0f} MB per call / {K80_BANDWIDTH / 1e9:.0f} GB/s = "
      f"{large_bytes / K80_BANDWIDTH * 1e3:.2f} ms of memory traffic at the data-sheet bandwidth; the blog measured "
      f"{K80[('large', 'eager')] / 1000:.2f} ms eager and {K80[('large', 'jit.script')] / 1000:.3f} ms fused (one pass "
      f"in, one out: {2 * 4 * 32 * 3 * 224 * 224 / K80_BANDWIDTH * 1e3:.2f} ms of traffic).")
if CUDA:
    fusion = df[df["variant"].isin(["eager", "cuda graph" + IP, "jit.script", "jit.script + graph" + IP,
                                    "torch.compile", "torch.compile + graph" + IP]) & (df["phase"] == PHASE_1)]
    print(show(fusion, ["case", "variant", "kernels_per_call", "floor_us", "median_us", "vs_floor"])
          .to_string(index=False, float_format="%.1f"))
    print()
    print_claims({f"{k}_{case}" for k in ("graph_beats_eager", "fusion_beats_graph", "fusion_adds_to_graph",
                                          "graph_adds_to_fusion", "compile_beats_script_graph") for case in SHAPES})
else:
    print("Kernels per call and the GPU-busy floor come from the CUDA profiler: they need an NVIDIA GPU.\n"
          "Recorded GPU results:")
    results.show_recorded(STEM)

# %% [markdown]
# ## 10. Summary
#
# This run's verdicts first, every claim with its 90% prediction interval ("no clear difference" where the
# interval straddles the threshold):

# %%
for c in claims:
    print(f"- [{c.verdict}] {c.statement}")
if not claims:
    print("- no claims: the comparisons need an NVIDIA GPU (the recorded GPU run's are in figures/03_jit_compile/"
          "claims.csv)")
print(f"- float32 matmul precision (eager and compiled): {torch.get_float32_matmul_precision()}")
print(f"- TorchScript fuser on this PyTorch: {FUSER}")
print(f"- Reading a reduce-overhead output after the next call: from a replay, "
      f"{ro_overwrite or 'not tried (needs a GPU)'}; from the first call, "
      f"{ro_overwrite_first_call or 'not tried (needs a GPU)'}")

# %% [markdown]
# - **Fusion** (`torch.jit.script`'s fuser, `torch.compile`'s Inductor) turns five kernels into one: less GPU
#   time (the floor drops) and fewer launches. **Graphs** remove the per-launch CPU cost. A small elementwise
#   function on a fast GPU is launch-bound, which is where a graph helps; a large one is bandwidth-bound, which
#   is where fusion helps; the claims above say how this GPU splits it, and whether the two stack. Copying a
#   new input into a graph costs one more launch (and, for a large tensor, one more pass over memory): produce
#   data where the graph reads it when you can.
# - `torch.jit.script` still runs where it exists, but it is deprecated; `torch.compile` is the replacement, and
#   capturing a compiled function with `capture()` works the same way as capturing eager code.
# - `torch.compile(mode="reduce-overhead")` pays a fixed CPU cost on every call for its safety machinery
#   (guards, copying inputs into static buffers, tracking the outputs it hands out). On a single fused
#   elementwise kernel there is little left for its graph to save, so that cost decides. On a region with many
#   kernels its graph saves a launch per kernel and the fixed cost is paid once, but it can only be as fast as
#   the kernels torch.compile generated (compare the floors, with the same matmul precision on both sides), and
#   in training the optimizer step and autograd's bookkeeping stay in Python. Use it on whole model forwards or
#   training steps, call `torch.compiler.cudagraph_mark_step_begin()` at each iteration boundary, keep inputs in
#   a static buffer when you can, and clone outputs you keep across calls. A manual graph with its input in
#   place skips all of that Python per call.

# %% [markdown]
# ## Exercises
# Each exercise extends the experiments above. Fill in its cell (every `...` is a placeholder that runs as it
# is), then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU
# say so (⏸); on a CPU a check verifies what it can there, such as correctness against eager. Worked solutions,
# run by the test suite against these checks: `notebooks/solutions/nb03_jit_compile.py` (try first).

# %%
from cudagraph_kit.course.exercises_03 import check_clone_cost, check_compiled_calls_per_graph, check_max_autotune, check_mlp_depth

# %% [markdown]
# ### Exercise 1: ten compiled calls in one graph
# Capture the compiled GELU twice on the small tensor, once with one call per graph and once with ten
# (`capture(compiled, x, calls_per_graph=10, eager_fallback=True)`), check the ten-call graph against eager, and
# time eager, `g1.replay` and `g10.replay` in one `compare` with rows named `"eager"`, `"compiled graph, 1 call"`
# and `"compiled graph, 10 calls"`. Pass the bound method `g10.replay` itself: `compare` then divides its time by
# `g10.calls_per_graph`. How close to the floor does each get? (Notebook 01, section 6, does this for eager GELU.)

# %%
g10 = ...     # capture(compiled, inputs["small"], calls_per_graph=10, eager_fallback=True)
table1 = ...  # compare({"eager": ..., "compiled graph, 1 call": ..., "compiled graph, 10 calls": ...}, case="small", ...)

# %%
check_compiled_calls_per_graph(g10, table1)

# %% [markdown]
# ### Exercise 2: how deep before `reduce-overhead` wins?
# Write `make_mlp(layers, width)`: section 6's model (`layers` × (`Linear` + `ReLU`), inference, on `DEVICE`).
# Then, *on an NVIDIA GPU*, time eager, default `torch.compile` and `reduce-overhead` (through `with_mark_step`)
# at several depths, say 2, 4, 8 and 16 layers: one `compare` per depth with `df["layers"] = layers`, each
# variant first checked against eager (give each compiled variant its own `fresh` copy of the forward function;
# on a GPU this notebook runs float32 matmuls at `MATMUL_PRECISION`, TF32 by default, so allow differences of
# about 1e-2 of the output's largest value). One window per depth is a first look; for a verdict, time each depth
# in several windows and compare intervals, as section 6 does.
# From how many layers does `reduce-overhead` beat both? Going further: vary `MLP_BATCH` from 8 to 4096. From what
# batch does the graph stop mattering?

# %%
def make_mlp(layers, width):
    ...  # your code


depth_table = ...   # pd.concat of one compare() per depth, each with a "layers" column (GPU)
ro_wins_from = ...  # the smallest depth where reduce-overhead beats eager and torch.compile, or None (GPU)

# %%
check_mlp_depth(make_mlp, depth_table, ro_wins_from)

# %% [markdown]
# ### Exercise 3: what keeping `reduce-overhead` outputs costs
# Section 4 showed that the next call replays into the memory of the previous output. Write `keep_output(x)`,
# which returns an output you may keep across calls: on a GPU built on `with_mark_step(ro)`, on a CPU (no
# `reduce-overhead` graphs there) on `compiled`. Then, *on an NVIDIA GPU*, time `y = f(x)` against
# `y = f(x).clone()` in one `compare` on the small tensor, rows `"eager"`, `"reduce-overhead, y = f(x)"` and
# `"reduce-overhead, y = f(x).clone()"`, and read what keeping the output costs per call. Try the large tensor too.

# %%
keep_output = ...    # a function x -> an output that survives the next call
clone_table = ...    # compare({"eager": ..., "reduce-overhead, y = f(x)": ..., ...}, inputs["small"], ...) (GPU)
clone_cost_us = ...  # median_us of the clone row minus that of the plain row (GPU)

# %%
check_clone_cost(keep_output, clone_table, clone_cost_us, x=inputs["small"])

# %% [markdown]
# ### Exercise 4: `max-autotune-no-cudagraphs` against the default mode
# `torch.compile(mode="max-autotune-no-cudagraphs")` compiles longer: it turns on Inductor's `max_autotune` and
# `coordinate_descent_tuning`, which benchmark kernel choices and launch configurations, and builds no CUDA graphs
# (`torch._inductor.list_mode_options()` shows what each mode sets on your version). Compile `fresh(gelu)` with it
# for the small tensor and check it against eager. Then, *on an NVIDIA GPU*, capture it and the default-mode
# `compiled` with `capture()` and time both replays in one `compare`, rows `"eager"`,
# `"torch.compile + graph, input in place"` and `"max-autotune + graph, input in place"`. Does the search find a
# faster kernel for one elementwise function? Compare the floors.

# %%
autotuned = ...       # torch.compile(fresh(gelu), mode="max-autotune-no-cudagraphs", dynamic=False)
autotune_table = ...  # compare({"eager": ..., ...: g_default.replay, ...: g_auto.replay}, case="small", ...) (GPU)

# %%
check_max_autotune(autotuned, autotune_table, x=inputs["small"])
