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
# - What `mode="reduce-overhead"` costs per call, and where it pays: one elementwise function, a deeper model,
#   a training step.
# - What happens to a `reduce-overhead` output you still hold when the next call runs.
# - Why a process that mixes its own graphs with `reduce-overhead` must give each capture a fresh cuBLAS
#   workspace.
# - That TorchScript is deprecated: what still works, and what replaces it.
#
# **What you need**: an NVIDIA GPU for the graph parts (Colab: Runtime → Change runtime type → T4 GPU).
# Without one the notebook runs the CPU-possible part small and shows recorded GPU results.
#
# **How long**: 68 s on an NVIDIA H100 80GB HBM3 (measured by `reproduce`, 2026-11-25); a T4 has not been timed yet; about 1
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
SMOKE = None       # tiny run (CI / tests): fewer calls, one small compile on a CPU; None: read $CGK_SMOKE ("1" = on)
CALLS = None       # calls per timing sample (None: the kit picks the count from SAMPLE_MS; fixed on a CPU)
SAMPLES = 2        # timing rounds per window (one sample of every variant per round)
SAMPLE_MS = 15.0   # about this long per sample when CALLS is None
WINDOWS = 8        # timing windows per phase, a pause apart: the prediction intervals come from them
WINDOW_PAUSE_S = 0.5  # seconds between windows
JIT_WARMUP = 20    # calls before timing/capturing a scripted function: its fuser only fuses after profiling runs
COMPILE = True     # run the torch.compile parts (slow to start: they compile)
MLP_LAYERS = 12    # section 6: Linear + ReLU layers of the deeper model
MLP_WIDTH = 256    # section 6: features per layer
MLP_BATCH = 8      # section 6: rows per call (small: launch-bound)
MATMUL_PRECISION = "high"  # float32 matmuls on a GPU, eager and compiled alike ("high": TF32; see section 6)

# %%
import os
import re
import types
import warnings

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Image, display

from cudagraph_kit import env_table, has_cuda
from cudagraph_kit.capture import capture, fresh_cublas_workspace
from cudagraph_kit.course import results
from cudagraph_kit.course.claims import save_claims, speedup, summary, versus
from cudagraph_kit.course.measure import measure
from cudagraph_kit.course.nb03_parts import plot_times

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
# torch.compile runs on every case on a GPU; on a CPU in SMOKE mode on the small one only (compiling is slow).
COMPILE_CASES = [] if not COMPILE else (["small"] if (SMOKE and not CUDA) else list(SHAPES))
if CUDA:  # one float32 matmul precision for eager and compiled code, set before anything compiles (section 6)
    torch.set_float32_matmul_precision(MATMUL_PRECISION)

torch.manual_seed(0)
print(env_table())
print(f"\nSMOKE={SMOKE}  CALLS={CALLS or 'by time'}  {WINDOWS} windows x {SAMPLES} samples  shapes={SHAPES}  "
      f"compile cases={COMPILE_CASES}  float32 matmul precision: {torch.get_float32_matmul_precision()}")
if not CUDA:
    print("\nNo CUDA GPU here. CUDA graphs (the kit's and mode='reduce-overhead') need an NVIDIA GPU: this run checks\n"
          "that eager, torch.jit.script and torch.compile agree on the CPU, at small sizes, and the graph variants\n"
          "run eagerly (labelled 'eager fallback'). CPU timings are not results; the recorded GPU run is at the end.")

# %% [markdown]
# ## 1. The workload
#
# GELU written out as five elementwise operations. Run eagerly, every operation is its own CUDA kernel that
# reads and writes whole tensors: five launches (CPU cost, several µs each) and five passes over memory
# (GPU cost; notebook 01 counts the bytes). A compiler that *fuses* them does one pass in one kernel; a CUDA
# graph launches all the kernels it holds with one call.
#
# Every variant below goes through `add`, which runs it once on *new* data (not the tensor a graph was captured
# with) and stops the notebook if it disagrees with eager: correct first, then fast.

# %% tags=["nbval-check-output"]
def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def fresh(fn):
    """A copy of ``fn`` with its own code object. Dynamo keeps one compile cache per code object, so giving each
    compiled variant its own copy keeps their caches (and guards) apart."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}
test_inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}
variants = {case: {"eager": gelu} for case in SHAPES}   # case -> {name: callable(x)}
errors = {case: {"eager": 0.0} for case in SHAPES}      # case -> {name: max |difference| from eager}
IP = ", input in place"


def add(case, name, fn, prepare=None):
    """Check ``fn`` on new data against eager GELU (``prepare(x)`` first, if given), then keep it as a variant."""
    x = test_inputs[case]
    if prepare is not None:
        prepare(x)
    errors[case][name] = err = (fn(x).float() - gelu(x).float()).abs().max().item()
    assert err < 1e-4, f"{case}: {name} differs from eager by {err:.2e}; do not time it"
    variants[case][name] = fn

# %% [markdown]
# ## 2. The blog's experiment: eager, CUDA graph, `jit.script`, `jit.script` + graph
#
# `capture(fn, x)` (from `cudagraph_kit.capture`) does what notebook 01 wrote out by hand: warm-up on a side stream, a static
# input buffer, `torch.cuda.graph` capture. Calling the result, `g(x)`, copies the new input into the static
# buffer and replays the graph; the output lives in graph-owned memory that the next call overwrites. That copy
# is one more launch (a device-to-device memcpy, and one more pass over memory), so we also time the case
# where the data is already in the static input ("input in place": only `g.replay()`), as when the previous
# step wrote it there. Without a GPU, `eager_fallback=True` makes `capture` run the function eagerly instead,
# and the tables say so.

# %%
def add_graph(case, name, g):
    """Two ways to call a captured graph: ``g(x)`` (copy x in, replay) and, input in place, ``g.replay()``."""
    add(case, name, g)
    add(case, name + IP, lambda _x, g=g: g.replay(), prepare=g.static_inputs[0].copy_)


for case in SHAPES:
    add_graph(case, "cuda graph", capture(gelu, inputs[case], eager_fallback=True))
print("captured:", *[variants[c]["cuda graph"] for c in SHAPES], sep="\n  ")

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
# TorchScript is deprecated in recent PyTorch (in favour of `torch.compile` and `torch.export`). We print the
# warning PyTorch gives, and skip this part cleanly where `torch.jit.script` is gone or fails.

# %%
scripted, FUSER = None, "none (TorchScript not usable here)"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        scripted = torch.jit.script(gelu)
        for case in SHAPES:          # profiling runs, then the fused plan
            for _ in range(JIT_WARMUP):
                scripted(inputs[case])
    except Exception as exc:  # noqa: BLE001 - gone or broken on this version: skip the TorchScript rows, say why
        scripted = None
        print(f"torch.jit.script is not usable on PyTorch {torch.__version__}: {type(exc).__name__}: {exc}")
print("Warnings PyTorch gave for torch.jit.script:", *sorted({f"{w.category.__name__}: {w.message}" for w in caught
      if issubclass(w.category, (DeprecationWarning, FutureWarning))}) or ["(none)"], sep="\n  ")

if scripted is not None:
    for case in SHAPES:
        add(case, "jit.script", scripted)
        add_graph(case, "jit.script + graph", capture(scripted, inputs[case], warmup=JIT_WARMUP, eager_fallback=True))
    try:
        optimized = str(scripted.graph_for(inputs["small"]))
    except Exception as exc:  # noqa: BLE001 - only a printout
        optimized = f"(graph_for unavailable: {exc})"
    FUSER = next((name for key, name in [("TensorExprGroup", "NNC (prim::TensorExprGroup)"),
                                         ("CudaFusionGroup", "nvFuser (prim::CudaFusionGroup)"),
                                         ("FusionGroup", "legacy fuser (prim::FusionGroup)")] if key in optimized),
                 "none (no fusion group)")
    fused_ops = re.findall(r"aten::(\w+)\(", optimized.partition("with prim::")[2])   # the fusion group's body
    if fused_ops:
        print(f"TorchScript's fusion group runs {len(fused_ops)} operations as one kernel: {', '.join(fused_ops)}")
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
compiled = torch.compile(fresh(gelu), dynamic=False) if COMPILE_CASES else None
for case in COMPILE_CASES:
    add(case, "torch.compile", compiled)          # the first call compiles (slow, once per shape)
    add_graph(case, "torch.compile + graph", capture(compiled, inputs[case], eager_fallback=True))
print("torch.compile ran on:", COMPILE_CASES or "nothing (COMPILE=False)")

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
#    the outputs it handed out and counts *generations* (iterations). By default every call of the compiled
#    function starts a new generation (in inference); `torch.compiler.cudagraph_mark_step_begin()` marks the
#    boundary explicitly and is required whenever that heuristic is wrong (e.g. training with a pending
#    backward). Once you call it, call it every iteration: from then on the tree counts generations only by
#    your marks.
#
# We time two "naive" loops first: `y = f(x)` (the output stays alive until the next call) and a loop that
# drops the output at once. The `mark_step_begin` variants come later (section 5), because the first call to
# it changes how generations are counted for the rest of the process. Without a GPU there is no
# `reduce-overhead` graph to build, so these rows are GPU-only.

# %%
ro = None
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
        add(case, "reduce-overhead, naive (y = f(x))", naive_kept(ro, case))
        add(case, "reduce-overhead, output dropped", ro)
print("reduce-overhead ran on:", COMPILE_CASES if ro is not None else "nothing (needs an NVIDIA GPU)")

# %% [markdown]
# **Reading an output after the next call.** `y1 = f(x1); y2 = f(x2)`: the second call starts a new
# generation, and the memory that holds `y1` may be reused. What PyTorch does when you then read `y1` depends
# on which run produced it. In PyTorch's source (`torch/_inductor/cudagraph_trees.py`), starting a new
# generation after a *warm-up* or a *recording* run invalidates the outputs of that run you still hold
# (`dealloc_current_path_weakrefs`): reading one raises `RuntimeError: Error: accessing tensor output of
# CUDAGraphs that has been overwritten by a subsequent run` (the example in PyTorch's CUDA graph trees
# documentation hits this: its `y1` comes from the first call, a warm-up). Ending a *replay*
# (`try_end_curr_execution`) invalidates nothing: `y1` still points into the graph's memory pool, and the next
# replay writes its result there, silently. The cell tries both on this PyTorch: `y1` from a replay (the steady
# state of a loop), and `y1` from the first call of a freshly compiled function. Then the fix, which works in
# both cases: `.clone()` the outputs you keep (or consume them before the next call).

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
    x1, x2 = test_inputs[COMPILE_CASES[0]], inputs[COMPILE_CASES[0]]
    ro_overwrite, message = read_after_next_call(ro, x1, x2)     # ro has replayed on this shape before
    print(f"y1 from a replay, read after the next call: {ro_overwrite}. {message}")
    ro_first = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    ro_overwrite_first_call, message = read_after_next_call(ro_first, x1, x2)  # call 1 warms up, call 2 records
    print(f"y1 from the first call of a freshly compiled function (a warm-up run), read after the next call: "
          f"{ro_overwrite_first_call}. {message}")
    y1 = ro(x1).clone()                           # the fix: clone what you keep
    y2 = ro(x2)
    torch.testing.assert_close(y1, gelu(x1))
    torch.testing.assert_close(y2, gelu(x2))
    print("with y1 = f(x1).clone(): y1 survives the next call and matches eager.")
    del y1, y2, ro_first
else:
    print("skipped: needs an NVIDIA GPU and torch.compile.")

# %% [markdown]
# ### Timing phase 1: everything before the first `mark_step_begin`
#
# Every variant above agreed with eager on new data (`add` checked it):

# %%
print(pd.DataFrame([{"case": c, "variant": v, "max_abs_err": e} for c in SHAPES for v, e in errors[c].items()])
      .to_string(index=False))

# %% [markdown]
# `measure` times all variants of each tensor round-robin in `WINDOWS` windows a pause apart (the host's speed
# drifts over minutes, and eager, host-bound times move with it far more than graph replays do; notebook 01,
# section 4). It reports each variant's median over the windows, its speedup over eager with a 90% **prediction
# interval** (where one more window, taken the same way, should land), and, from the profiler in the last
# window only, the GPU-busy time per call (the *floor*), the kernels and copies per call, and whether a CUDA
# graph was launched ("ran as" comes from the profiler, not from the name). Every comparison in this notebook
# is a verdict on such an interval; the verdicts are collected in the summary at the end.

# %%
PHASE_1, PHASE_2 = "1: before mark_step_begin", "2: after mark_step_begin"


def timed(cases, phase):
    """measure() over ``cases`` ({case: ({name: fn}, args)}), every variant warmed up before each window; the
    phase is written into the table."""
    m = measure({case: (fns, args, {"warmup": 3}) for case, (fns, args) in cases.items()}, windows=WINDOWS,
                samples=SAMPLES, calls=CALLS, sample_ms=SAMPLE_MS, pause_s=WINDOW_PAUSE_S)
    m.table.insert(2, "phase", phase)
    return m


m1 = timed({case: (variants[case], (inputs[case],)) for case in SHAPES}, PHASE_1)
m1.short().assign(**{"kernels/call": m1.table.kernels_per_call, "copies/call": m1.table.copies_per_call})

# %% [markdown]
# Reading the table: default `torch.compile` launches one fused kernel but spends tens of µs in Python
# (Dynamo's frame entry and guards, AOTAutograd's wrapper, Inductor's wrapper) before it. `reduce-overhead`
# keeps all of that, adds the CUDA graph trees' bookkeeping, and launches two things instead of one: a copy
# of the input into the graph's static buffer and the graph. (That copy runs as a kernel, `torch._foreach_copy_`,
# so the table counts it under kernels/call, not copies/call.) On one fused elementwise kernel the graph has
# almost nothing left to save (one kernel launch becomes a graph launch plus a copy), while the Python on top
# grows. A manual graph of the compiled function skips all the Python: one `copy_` and one `replay()`, or only
# `replay()` when the input is already in place. (The appendix shows where the CPU time of one call goes.)
#
# The claims of this phase: a graph against eager, fusion against a graph, and whether they stack. "Fusion
# alone" is `jit.script` where TorchScript works (one fused kernel launched from Python with the least Python
# on top), else `torch.compile`.

# %%
claims = []


def claim(build, *args, **kwargs):
    """Build a claim and keep it; skip it where this run did not time one of its variants (no torch.compile)."""
    try:
        claims.append(build(*args, **kwargs))
    except KeyError:
        pass


FUSED = "jit.script" if scripted is not None else "torch.compile"
for case in SHAPES:
    g, eager5 = f"{case} GELU", "a graph of eager's five kernels"
    claim(speedup, m1, f"graph_beats_eager_{case}", case, "cuda graph" + IP, subject=f"{g}: {eager5} (input in place)")
    claim(versus, m1, f"fusion_beats_graph_{case}", (case, FUSED), (case, "cuda graph" + IP),
          subject=f"{g}: fusion alone ({FUSED})", than=eager5)
    claim(versus, m1, f"fusion_adds_to_graph_{case}", (case, "torch.compile + graph" + IP), (case, "cuda graph" + IP),
          subject=f"{g}: a graph of torch.compile's one fused kernel", than=eager5)
    claim(versus, m1, f"graph_adds_to_fusion_{case}", (case, f"{FUSED} + graph" + IP), (case, FUSED),
          subject=f"{g}: {FUSED} in a graph (input in place)", than=f"{FUSED} alone")
    claim(versus, m1, f"compile_beats_script_graph_{case}", (case, "torch.compile + graph" + IP),
          (case, "jit.script + graph" + IP), subject=f"{g}: torch.compile's kernel in a graph", than="TorchScript's")
    claim(speedup, m1, f"ro_naive_beats_eager_{case}", case, "reduce-overhead, naive (y = f(x))",
          subject=f"{g}: reduce-overhead, called as y = f(x)")
print(f"{len(claims)} claims from phase 1 (the summary at the end lists them)")

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
# **phase 2**, as cases of their own (`small, phase 2`, ...) with eager and the manual graph of the compiled
# function timed again beside them, together with sections 6 and 6b. Speedups are read within a phase.

# %%
def with_mark_step(fn):
    def call(x):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(x)
    return call


late = {}   # phase 2's GELU cases: {case: {name: fn}}
if ro is not None:
    ro_static = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    for case in COMPILE_CASES:
        add(case, "reduce-overhead + mark_step_begin", with_mark_step(ro))
        buf = inputs[case].clone()                 # the buffer your pipeline writes each new input into
        # Before the first call, so the graph is built for it. guard=True makes Dynamo guard the address (a new
        # address recompiles). With the default guard=False, PyTorch 2.11 kept copying the input on our H200
        # whenever the compiled graph came from the compile cache (the static-input marking was lost).
        torch._dynamo.mark_static_address(buf, guard=True)
        in_place = with_mark_step(ro_static)
        for _ in range(3):
            in_place(buf)
        # timed: the data is already in `buf` (the argument is ignored); checked: new data written into `buf` first
        add(case, "reduce-overhead, static input", lambda _x, f=in_place, b=buf: f(b), prepare=buf.copy_)
        late[f"{case}, phase 2"] = {n: variants[case][n] for n in ("eager", "torch.compile + graph" + IP,
                                    "reduce-overhead + mark_step_begin", "reduce-overhead, static input")}
print("phase 2 GELU cases:", list(late) or "none (needs an NVIDIA GPU)")

# %% [markdown]
# ## 6. A deeper model: many kernels per call
#
# `reduce-overhead`'s fixed cost per call (guards, wrappers, the tree's bookkeeping, one input copy, one
# graph launch) does not grow with the work inside the graph, while eager pays a launch per kernel and default
# `torch.compile` pays one per generated kernel. So give it a region with many kernels: an MLP of
# `MLP_LAYERS` × (`Linear` + `ReLU`), `MLP_WIDTH` features, a batch of `MLP_BATCH` rows (inference, no
# gradients): small matrices, so every kernel is short and the model is launch-bound. Timed in **phase 2**:
# eager, default `torch.compile`, `reduce-overhead` (with `mark_step_begin`, as the process requires by now),
# the kit's graph of the eager model (`g(x)`, and with the input in place), and a graph of the compiled model.
#
# **A fair comparison needs comparable GPU work on both sides.** A graph removes launches, not slow kernels: it
# cannot run faster than the kernels it replays (the floor). Eager `nn.Linear` and the compiled forward call
# cuBLAS through different operators (eager: one `addmm` with the bias; Inductor: a plain `mm` plus a fused
# bias + ReLU kernel), so cuBLAS may pick different matrix-multiply kernels for them; in full float32 the
# comparison can then measure that kernel choice rather than launch overhead. So this notebook sets one precision
# for float32 matmuls, for eager and compiled code alike, before anything is compiled (`MATMUL_PRECISION`, default
# `"high"`: TF32 tensor cores, which PyTorch's own warning suggests), and a claim checks that a graph of the
# compiled kernels is not far slower than a graph of eager's (the summary's 12-layer MLP finding that sets the
# two graphs side by side).
#
# **One pitfall first: the cuBLAS workspace.** cuBLAS keeps a scratch *workspace* per (handle, stream), and a
# graph captured after it exists bakes its address in. `reduce-overhead` frees those workspaces whenever it warms
# up or records a graph, so a graph captured earlier by the kit may then write into memory that now belongs to
# other tensors. This notebook captures the MLP with the kit *and* records it with `reduce-overhead` in one
# process, so it wraps each function it captures in the kit's `fresh_cublas_workspace`
# (`cudagraph_kit.capture`): the capture then allocates its own workspace inside the graph's pool.

# %%
def build_mlp(seed):
    """MLP_LAYERS x (Linear(MLP_WIDTH, MLP_WIDTH) + ReLU) on DEVICE, weights drawn after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(MLP_LAYERS):
        layers += [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(DEVICE)


mlp = build_mlp(seed=0).requires_grad_(False)
x_mlp, x_mlp_test = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)


def mlp_forward(x):
    return mlp(x)


mlp_variants, mlp_graphs = {"eager": mlp}, [capture(fresh_cublas_workspace(mlp), x_mlp, eager_fallback=True)]
mlp_variants["cuda graph"] = mlp_graphs[0]
mlp_variants["cuda graph" + IP] = lambda _x, g=mlp_graphs[0]: g.replay()
if CUDA and COMPILE:
    mlp_variants["torch.compile"] = mlp_compiled = torch.compile(fresh(mlp_forward), dynamic=False)
    mlp_variants["reduce-overhead + mark_step_begin"] = with_mark_step(
        torch.compile(fresh(mlp_forward), mode="reduce-overhead", dynamic=False))
    mlp_compiled(x_mlp)                          # compile, then capture the compiled kernels alone
    mlp_graphs.append(capture(fresh_cublas_workspace(mlp_compiled), x_mlp))
    mlp_variants["torch.compile + graph" + IP] = lambda _x, g=mlp_graphs[1]: g.replay()

ref_mlp = mlp(x_mlp_test)
mlp_errors = {}
for name, fn in mlp_variants.items():
    for _ in range(3):                            # compile, record, replay
        fn(x_mlp)
    for g in mlp_graphs:                          # new data in place, for the "input in place" rows
        g.static_inputs[0].copy_(x_mlp_test)
    mlp_errors[name] = (fn(x_mlp_test) - ref_mlp).abs().max().item()
# TF32 keeps 10 bits of mantissa and eager and compiled code may run different matmul kernels: differences of
# about 1e-3 of the output's scale are expected there; in full float32, a few ulp.
MLP_TOLERANCE = 1e-2 if torch.get_float32_matmul_precision() != "highest" else 1e-4
relative = {k: v / ref_mlp.abs().max().item() for k, v in mlp_errors.items()}
print("max |difference| from eager, relative to max |output|:", {k: f"{v:.1e}" for k, v in relative.items()})
assert max(relative.values()) < MLP_TOLERANCE, "a variant disagrees with eager; do not time it"
MLP_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}"

# %% [markdown]
# ### 6b. A training step: forward and backward under `reduce-overhead`
# Training is where `reduce-overhead` is meant to be used: `torch.compile` of the model gives AOTAutograd a
# forward and a backward graph, and `reduce-overhead` replays each as a CUDA graph, while the loss, the
# backward's autograd bookkeeping and `optimizer.step()` stay in Python. The same MLP architecture, one copy per
# variant from `build_mlp(seed=1)` (so all start from the same weights), each with its own SGD optimizer,
# timed in **phase 2**: the eager step, that step with the model compiled with `reduce-overhead`
# (`cudagraph_mark_step_begin` at each step), and the kit's whole-step graph (`capture_train_step`, notebook
# 02), which captures the optimizer step too, its forward wrapped in `fresh_cublas_workspace` (forward,
# backward and optimizer then all get their workspaces inside the graph's pool). Parity with eager first.

# %%
TRAIN_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}, SGD training step"
TRAIN_RO, TRAIN_KIT = "reduce-overhead forward+backward", "kit whole-step graph"
train_steps, train_errors = {}, {}
if CUDA and COMPILE:
    from cudagraph_kit import capture_train_step

    loss_fn = torch.nn.functional.mse_loss
    x_train, y_train = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)

    def eager_train_step(model, opt, forward):
        def step(x, y):
            if forward is not model:
                torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the graphs may reuse their memory
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(forward(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    models = {name: build_mlp(seed=1) for name in ("eager", TRAIN_RO, TRAIN_KIT)}  # the same initial weights
    opts = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in models.items()}
    models[TRAIN_KIT].forward = fresh_cublas_workspace(models[TRAIN_KIT].forward)  # the capture gets fresh workspaces
    train_steps = {
        "eager": eager_train_step(models["eager"], opts["eager"], models["eager"]),
        TRAIN_RO: eager_train_step(models[TRAIN_RO], opts[TRAIN_RO],
                                   torch.compile(models[TRAIN_RO], mode="reduce-overhead", dynamic=False)),
        TRAIN_KIT: capture_train_step(models[TRAIN_KIT], opts[TRAIN_KIT], loss_fn, (x_train, y_train)),
    }
    for _ in range(6):                        # parity: the same six steps on every variant
        for step in train_steps.values():
            step(x_train, y_train)
    train_errors = {name: max((p - q).abs().max().item() for p, q in zip(model.parameters(),
                                                                         models["eager"].parameters()))
                    for name, model in models.items()}
    print("max |parameter difference| from eager after 6 steps:", {k: f"{v:.1e}" for k, v in train_errors.items()})
    assert max(train_errors.values()) < 1e-4, "a training variant disagrees with eager; do not time it"
else:
    print("skipped: needs an NVIDIA GPU (and torch.compile).")

# %% [markdown]
# ### Timing phase 2: sections 5, 6 and 6b together
# Every window times the section-5 GELU cases, the MLP forward and the training step, one after the other, so
# the windows of each case are spread over the whole phase; the profiler runs in the last window.

# %%
phase_2_cases = {**{case: (fns, (inputs[case.split(",")[0]],)) for case, fns in late.items()},
                 MLP_CASE: (mlp_variants, (x_mlp,))}
if train_steps:
    phase_2_cases[TRAIN_CASE] = (train_steps, (x_train, y_train))
m2 = timed(phase_2_cases, PHASE_2)
m2.short().assign(**{"kernels/call": m2.table.kernels_per_call, "copies/call": m2.table.copies_per_call})

# %% [markdown]
# Does `reduce-overhead` pay on the one elementwise function in its documented form (marks and a static
# input)? Did `mark_static_address` remove the input copy? On the deeper MLP, is the comparison fair, and does
# `reduce-overhead` beat eager and default `torch.compile`? In training, `reduce-overhead` graphs the forward and
# the backward; the kit's whole-step graph also holds the loss, `zero_grad` and the optimizer step.

# %%
for case in late:
    base = case.split(",")[0]
    before, after = (m1.row(base, "reduce-overhead, output dropped").kernels_per_call,
                     m2.row(case, "reduce-overhead, static input").kernels_per_call)
    print(f"{base}: mark_static_address {'removed' if after < before else 'did NOT remove'} the input copy on "
          f"PyTorch {torch.__version__} ({before:g} -> {after:g} kernels per call).")
    claim(speedup, m2, f"ro_static_beats_eager_{base}", case, "reduce-overhead, static input",
          subject=f"{base} GELU: reduce-overhead with mark_step_begin and a static input")
L, RO_MARK = f"{MLP_LAYERS}-layer MLP", "reduce-overhead + mark_step_begin"
claim(versus, m2, "compiled_graph_slower_mlp", (MLP_CASE, "cuda graph" + IP), (MLP_CASE, "torch.compile + graph" + IP),
      subject=f"{L}: a graph of eager's kernels", than="a graph of the compiled forward's kernels", above=1.25)
claim(speedup, m2, "ro_beats_eager_mlp", MLP_CASE, RO_MARK, subject=f"{L} forward: reduce-overhead (with marks)")
claim(versus, m2, "ro_beats_compile_mlp", (MLP_CASE, RO_MARK), (MLP_CASE, "torch.compile"),
      subject=f"{L} forward: reduce-overhead", than="default torch.compile")
claim(speedup, m2, "ro_beats_eager_training", TRAIN_CASE, TRAIN_RO,
      subject=f"{L} SGD training step: reduce-overhead (forward and backward graphs, optimizer eager)")
claim(versus, m2, "kit_beats_ro_training", (TRAIN_CASE, TRAIN_KIT), (TRAIN_CASE, TRAIN_RO),
      subject=f"{L} SGD training step: the kit's whole-step graph (optimizer included)", than="reduce-overhead")
print(f"{len(claims)} claims in all (the summary at the end lists them)")

# %% [markdown]
# ## 7. All results, saved
#
# `speedup` is relative to eager in the same case (phase 2's GELU rows are cases of their own), the median over
# the windows, with its 90% prediction interval (`speedup_lo`..`speedup_hi`). `floor_us` is the GPU-busy time
# per call: what a variant would cost if launching were free. Fusion lowers the floor (fewer passes over
# memory); a graph brings the time per call down *towards* the floor (fewer, cheaper launches). The claims are
# saved beside the table, in `claims.csv`.

# %%
shape_of = {case: "x".join(map(str, SHAPES[case.split(",")[0]])) for case in [*SHAPES, *late]}
errors_of = {**{(c.split(",")[0], v): e for c in [*SHAPES, *late] for v, e in errors[c.split(",")[0]].items()},
             **{(MLP_CASE, v): e for v, e in mlp_errors.items()}, **{(TRAIN_CASE, v): e for v, e in train_errors.items()}}
df = pd.concat([m1.table, m2.table], ignore_index=True)
df.insert(1, "shape", [shape_of.get(c, f"{MLP_BATCH}x{MLP_WIDTH}") for c in df.case])
df["max_abs_err"] = [errors_of[(c if c in (MLP_CASE, TRAIN_CASE) else c.split(",")[0], v.replace(" (eager fallback)", ""))]
                     for c, v in zip(df.case, df.variant)]
df["device"] = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
df["matmul_precision"] = torch.get_float32_matmul_precision()
fig = plot_times(df, f"Time per call on {df.device.iloc[0]}, PyTorch {torch.__version__}"
                 f"{'' if CUDA else ' (CPU, graphs ran eagerly: not a GPU result)'}\nmedian over {WINDOWS} windows, "
                 "whisker: 90% prediction interval")
folder = results.save(STEM, df, figures={"time_per_call": fig},
                      extra_env={"torchscript_fuser": FUSER, "reduce_overhead_stale_output": ro_overwrite,
                                 "reduce_overhead_stale_output_first_call": ro_overwrite_first_call,
                                 "matmul_precision": torch.get_float32_matmul_precision(), "windows": WINDOWS})
save_claims(folder, claims)
print("saved to", folder, "(results.csv, env.json, claims.csv, time_per_call.png)")
display(Image(filename=str(folder / "time_per_call.png")))  # the saved figure, shown whatever the plot backend
plt.close(fig)

# %% [markdown]
# ## 8. Fusion vs graphs, and the published figures
#
# The published figures come from a 2021 blog post in Japanese by the GitHub user shu65,
# "PyTorch 1.10の新機能「CUDA Graphs」のパフォーマンスを測定してみる" ("Measuring the performance of CUDA Graphs,
# new in PyTorch 1.10"), and its measurement notebook,
# [shu65/blog-pytorch-notebooks: pytorch_CUDA_Graphs.ipynb](https://github.com/shu65/blog-pytorch-notebooks/blob/main/pytorch_CUDA_Graphs.ipynb).
# The blog measured on a Tesla K80 with PyTorch 1.10 (wall clock, 10,000 calls, mean). Our reference is a plain
# PyTorch run on an H100 (PyTorch 2.11, median of 5 repeats, in a process whose timings no profiler session had
# slowed down; no kit code). The blog does not say whether its graph runs copied a new input each call; its
# graph figures go on the "input in place" rows, beside the reference's, which replayed without copying one (its
# floors, not reprinted here, showed no copy).

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED = pd.DataFrame([  # case, variant, K80 blog (µs), H100 reference (µs); None: no figure
    ("small", "eager", 70.9, 75.8), ("small", "cuda graph" + IP, 64.9, 8.7), ("small", "jit.script", 38.9, 10.9),
    ("small", "jit.script + graph" + IP, 35.6, 2.7), ("small", "torch.compile", None, 34.2),
    ("small", "torch.compile + graph" + IP, None, 3.0), ("small", "reduce-overhead, naive (y = f(x))", None, 85.2),
    ("large", "eager", 1320.0, 72.4), ("large", "cuda graph" + IP, 1340.0, 66.8), ("large", "jit.script", 425.0, None),
    ("large", "jit.script + graph" + IP, 374.0, 18.5), ("large", "torch.compile + graph" + IP, None, 11.4),
], columns=["case", "variant", "K80 blog (µs)", "H100 reference (µs)"])
for col in ["K80 blog (µs)", "H100 reference (µs)"]:
    PUBLISHED[col.replace("(µs)", "speedup")] = PUBLISHED.groupby("case")[col].transform("first") / PUBLISHED[col]
print(PUBLISHED.to_string(index=False, na_rep="-", float_format="%.2f"))

# %% [markdown]
# Beside this run (GPU only: on a CPU the graph rows ran eagerly, and a CPU's times are not results; the recorded
# GPU run is in section 9):

# %%
if CUDA:
    mine = df[df.phase == PHASE_1][["case", "variant", "median_us", "speedup", "floor_us", "kernels_per_call"]]
    print(PUBLISHED.merge(mine, on=["case", "variant"], how="left").rename(
        columns={"median_us": "this run (µs)", "speedup": "this run speedup"}).to_string(
        index=False, na_rep="-", float_format="%.2f"))
K80_BANDWIDTH = 240e9  # bytes/s per GPU of a Tesla K80 (data sheet)
large_bytes = 11 * 4 * 32 * 3 * 224 * 224  # 11 tensor passes of float32 (notebook 01, "Going further" B)
print(f"K80, large GELU: {large_bytes / 1e6:.0f} MB per call / {K80_BANDWIDTH / 1e9:.0f} GB/s = "
      f"{large_bytes / K80_BANDWIDTH * 1e3:.2f} ms of memory traffic at the data-sheet bandwidth; one fused pass in "
      f"and one out: {2 * 4 * 32 * 3 * 224 * 224 / K80_BANDWIDTH * 1e3:.2f} ms.")

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU was the bottleneck for both tensors in the blog's figures (each
# kernel ran longer than the CPU took to launch it; the cell above works out the large GELU's memory traffic at
# the K80's bandwidth), so a graph gained almost nothing there and only fusion helped. A Hopper GPU runs each
# of the small tensor's kernels in much less time than a launch takes (compare the floor with the eager time
# in the tables above), so eager GELU on the small tensor is mostly launch overhead, which a graph removes. On
# the large tensor the five kernels are bound by memory bandwidth: fusion cuts the passes over memory, and
# whether a graph still pays on top of it depends on whether the fused kernel's GPU time is longer than
# launching it. The "kernels per call" column shows fusion going from five kernels to one; the floor shows the
# GPU time that saves; the graph variants show the CPU launch cost going away. Which matters more on each tensor
# on this GPU, and whether they stack, is what the summary's claims say.
#
# ## 9. The recorded GPU run
# This run's numbers are in the tables of sections 4 and 6; here are those of the GPU run recorded in `figures/`
# before it (the caption names that run), to read beside them.

# %%
results.show_recorded(STEM, columns=["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo",
                                     "speedup_hi", "floor_us", "kernels_per_call"]);

# %% [markdown]
# ## 10. Summary
#
# This run's headline verdicts, each from a 90% prediction interval (without a GPU, the graph comparisons say they
# compared eager with eager):

# %%
summary(claims, ["graph_beats_eager_small", "fusion_beats_graph_small", "fusion_adds_to_graph_small",
                 "graph_adds_to_fusion_small", "compile_beats_script_graph_small", "graph_beats_eager_large",
                 "ro_static_beats_eager_small", "compiled_graph_slower_mlp", "ro_beats_compile_mlp", "kit_beats_ro_training"]);

# %% [markdown]
# - **Fusion** (`torch.jit.script`'s fuser, `torch.compile`'s Inductor) turns five kernels into one: less GPU
#   time (the floor drops) and fewer launches. **Graphs** remove the per-launch CPU cost. A small elementwise
#   function on a fast GPU is launch-bound, which is where a graph helps; a large one is bandwidth-bound, which
#   is where fusion helps. Copying a new input into a graph costs one more launch (and, for a large tensor, one
#   more pass over memory): produce data where the graph reads it when you can.
# - `torch.jit.script` still runs where it exists, but it is deprecated; `torch.compile` is the replacement, and
#   capturing a compiled function with `capture()` works the same way as capturing eager code.
# - `torch.compile(mode="reduce-overhead")` pays a fixed CPU cost on every call for its safety machinery
#   (guards, copying inputs into static buffers, tracking the outputs it hands out). On a single fused
#   elementwise kernel there is little left for its graph to save, so that cost decides. On a region with many
#   kernels its graph saves a launch per kernel and the fixed cost is paid once, but it can only be as fast as
#   the kernels torch.compile generated, and in training the optimizer step and autograd's bookkeeping stay in
#   Python. Use it on regions with many kernels, such as whole model forwards or training steps (the phase-2
#   table shows what it saved over eager on each here; the findings above compare it with default
#   `torch.compile` and with the kit's whole-step graph), call `torch.compiler.cudagraph_mark_step_begin()` at
#   each iteration boundary, keep inputs in a static buffer when you can, and clone outputs you keep across
#   calls: an old output of a replay is overwritten silently. A manual graph with its input in place skips all
#   of that Python per call.
# - Mixing your own graphs with `reduce-overhead` in one process: give each capture a fresh cuBLAS workspace
#   (`fresh_cublas_workspace`), or `reduce-overhead` frees the one your graph baked in.
# %% [markdown]
# ## Exercises
# Each exercise extends the experiments above. Fill in its cell (every `...` is a placeholder that runs as it
# is), then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU
# say so (⏸); on a CPU a check verifies what it can there, such as correctness against eager. Worked solutions,
# run by the test suite against these checks: `notebooks/solutions/nb03_jit_compile.py` (try first).

# %% tags=["nbval-check-output"]
from cudagraph_kit import compare  # noqa: F401 (the exercises time with it)
from cudagraph_kit.course.exercises_03 import check_clone_cost, check_compiled_calls_per_graph, check_max_autotune, check_mlp_depth

# %% [markdown]
# ### Exercise 1: ten compiled calls in one graph
# Capture the compiled GELU twice on the small tensor, once with one call per graph and once with ten
# (`capture(compiled, x, calls_per_graph=10, eager_fallback=True)`), check the ten-call graph against eager, and
# time eager, `g1.replay` and `g10.replay` in one `compare` with rows named `"eager"`, `"compiled graph, 1 call"`
# and `"compiled graph, 10 calls"`. Pass the bound method `g10.replay` itself: `compare` then divides its time by
# `g10.calls_per_graph`. How close to the floor does each get? (Notebook 01, section 6, does this for eager GELU.)

# %% tags=["nbval-check-output"]
g10 = ...     # capture(compiled, inputs["small"], calls_per_graph=10, eager_fallback=True)
table1 = ...  # compare({"eager": ..., "compiled graph, 1 call": ..., "compiled graph, 10 calls": ...}, case="small", ...)

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
autotuned = ...       # torch.compile(fresh(gelu), mode="max-autotune-no-cudagraphs", dynamic=False)
autotune_table = ...  # compare({"eager": ..., ...: g_default.replay, ...: g_auto.replay}, case="small", ...) (GPU)

# %%
check_max_autotune(autotuned, autotune_table, x=inputs["small"])

# %% [markdown]
# ## Appendix: where the time of a call goes
#
# Two measurements, made after all timings (a profiler session slows every later kernel launch in the process,
# so it must not run before a timing). First, what the GPU does per call and which CUDA runtime calls the CPU
# makes (profiler): each kernel launch (`cudaLaunchKernel`, or a variant of it such as `cuLaunchKernel` for
# Triton's kernels or `cudaLaunchKernelExC`) and each `cudaMemcpyAsync` costs the CPU a launch, `cudaGraphLaunch`
# is one graph replay. Then where the CPU time goes: Python's `cProfile` over many calls, grouped by the part of
# PyTorch it was spent in. cProfile slows Python down, so read the *shares*, not the absolute µs. The
# `reduce-overhead` variants here are the ones with `mark_step_begin`: by now the process counts generations
# only by marks. The helpers are in `cudagraph_kit/course/nb03_parts.py`.

# %%
from cudagraph_kit.course.nb03_parts import cpu_breakdown, gpu_breakdown  # noqa: E402

if CUDA and COMPILE_CASES:
    c0 = COMPILE_CASES[0]
    named = [(c0, n, variants[c0][n], inputs[c0]) for n in
             ["eager", "torch.compile", "torch.compile + graph", "torch.compile + graph" + IP,
              "reduce-overhead + mark_step_begin", "reduce-overhead, static input"]]
    named += [(MLP_CASE, n, mlp_variants[n], x_mlp) for n in ["eager", "torch.compile", RO_MARK]]
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(gpu_breakdown(named).to_string(index=False, float_format="%.2f"))
    for case, name, fn, x in [named[i] for i in (1, 2, 4, 5, 8)]:
        print(f"\nWhere the CPU time of one call goes, {case}: {name!r}:")
        print(cpu_breakdown(fn, x).to_string(index=False, float_format="%.1f"))
else:
    print("skipped: needs an NVIDIA GPU.")
