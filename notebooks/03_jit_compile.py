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
#   the cost of launching them (CPU time). You usually want both.
# - How to read "time per call" against the GPU-busy *floor* and the number of kernels per call.
# - Why `mode="reduce-overhead"` called naively on a tiny function can be *slower* than eager, and how to use it well.
# - That TorchScript is deprecated: what still works, and what replaces it.
#
# **What you need**: an NVIDIA GPU for the graph parts (Colab: Runtime → Change runtime type → T4 GPU).
# Without one the notebook runs the CPU-possible part small and shows recorded GPU results.
#
# **How long**: 33 s on an NVIDIA H200 (measured by `reproduce`; most of it `torch.compile` compiling); a T4
# has not been timed yet, expect a few minutes; about 1 minute on a CPU (small sizes).

# %%
# Setup. In a checkout of cudagraph-kit (this folder or one above it has cudagraph_kit/): use its kit. In Colab:
# first make a shallow clone (the kit and its recorded GPU results), install it, and work in its notebooks/.
import importlib.util, os, subprocess, sys
from pathlib import Path

REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")


def setup_run(*command):
    """Run one setup command; if it fails, raise with the command's own error output."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"setup failed (exit {done.returncode}): {' '.join(command)}\n"
                           + (done.stderr or done.stdout).strip())


try:
    import google.colab  # noqa: F401  (importable only in Colab)
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
cwd = Path.cwd().resolve()
checkout = next((p for p in (cwd, *cwd.parents) if (p / "cudagraph_kit" / "__init__.py").is_file()), None)
if checkout is None and IN_COLAB:
    checkout = cwd / "cudagraph-kit"
    if not checkout.is_dir():
        setup_run("git", "clone", "--quiet", "--depth", "1", "--branch", REPO_REF, REPO_URL, str(checkout))
    installed = importlib.util.find_spec("cudagraph_kit")
    if installed is None or checkout not in Path(installed.origin).resolve().parents:
        # --no-deps: Colab's own torch, numpy, pandas and matplotlib stay as they are
        setup_run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                  "--editable", str(checkout))
    os.chdir(checkout / "notebooks")  # where the notebooks run; the recorded results are in ../figures
    print(f"cudagraph-kit ({REPO_REF}) in {checkout}, installed; working in {Path.cwd()}")
if checkout is not None and str(checkout) not in sys.path:
    sys.path.insert(0, str(checkout))

# %% tags=["parameters"]
SMOKE = None       # tiny run (CI / tests): fewer calls, one small compile on a CPU; None: read $CGK_SMOKE ("1" = on)
CALLS = None       # calls per timing sample (None: 1000 on a GPU, fewer on a CPU / in SMOKE)
SAMPLES = None     # timing samples; the median is reported (None: 7, 3 in SMOKE)
JIT_WARMUP = 20    # calls before timing/capturing a scripted function: its fuser only fuses after profiling runs
COMPILE = True     # run the torch.compile part (slow to start: it compiles)

# %%
import cProfile
import os
import pstats
import types
import warnings
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter
import pandas as pd
import torch

from cudagraph_kit import capture, compare, env_table, gpu_time, has_cuda, results

STEM = "03_jit_compile"
CUDA = has_cuda()
DEVICE = "cuda" if CUDA else "cpu"
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
if CALLS is None:
    CALLS = (200 if SMOKE else 1000) if CUDA else (20 if SMOKE else 200)
if SAMPLES is None:
    SAMPLES = 3 if SMOKE else 7
# The blog's shapes on a GPU; much smaller ones on a CPU (the CPU part only shows that things run and agree).
SHAPES = ({"small": (1, 3, 224, 224), "large": (32, 3, 224, 224)} if CUDA
          else {"small": (1, 3, 32, 32), "large": (8, 3, 64, 64)})
# Which cases torch.compile runs on: everything on a GPU; on a CPU in SMOKE mode only one tiny compile.
COMPILE_CASES = [] if not COMPILE else (["small"] if (SMOKE and not CUDA) else list(SHAPES))

torch.manual_seed(0)
print(env_table())
print(f"\nSMOKE={SMOKE}  CALLS={CALLS}  SAMPLES={SAMPLES}  shapes={SHAPES}  compile cases={COMPILE_CASES}")
if not CUDA:
    print("\nNo CUDA GPU here. CUDA graphs (manual ones and mode='reduce-overhead') need an NVIDIA GPU, so this run\n"
          "only checks that eager, torch.jit.script and torch.compile agree on the CPU, at small sizes.\n"
          "CPU timings below are not results; the recorded GPU results are shown at the end.")

# %% [markdown]
# ## 1. The workload
#
# GELU written out as five elementwise operations. Run eagerly, every operation is its own CUDA kernel that
# reads and writes the whole tensor: five launches (CPU cost, several µs each) and five passes over memory
# (GPU cost). A compiler that *fuses* them does one pass in one kernel; a CUDA graph launches all the kernels
# it holds with one call.

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

# %% [markdown]
# ## 2. The blog's experiment: eager, CUDA graph, `jit.script`, `jit.script` + graph
#
# `cudagraph_kit.capture(fn, x)` does what notebook 01 wrote out by hand: warm-up on a side stream, a static
# input buffer, `torch.cuda.graph` capture. Calling the result, `g(x)`, copies the new input into the static
# buffer and replays the graph; the output lives in graph-owned memory that the next call overwrites. That copy
# is one more launch (and one more pass over memory), so we also time the case where the data is already in
# the static input ("input in place": only `g.replay()`), as when the previous step wrote it there.

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
# `torch.jit.script` compiles the function to TorchScript. Its executor *profiles* the first calls (shapes,
# dtypes, devices) and only then hands the elementwise chain to a fuser (NNC on current PyTorch, nvFuser in
# 2021), so we call it `JIT_WARMUP` times before timing or capturing it. On a CPU this fuser is off by default,
# so the scripted function runs the same five kernels as eager.
#
# TorchScript is deprecated in recent PyTorch (in favour of `torch.compile` and `torch.export`). We record the
# warning PyTorch gives, and skip this part cleanly where `torch.jit.script` is gone or fails.

# %%
scripted, JIT_STATUS = None, ""
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
    if CUDA:
        try:
            print("\nThe optimized TorchScript graph (look for a fusion group):")
            print(scripted.graph_for(inputs["small"]))
        except Exception as exc:  # noqa: BLE001 - only a printout
            print(f"(graph_for unavailable: {exc})")

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
# 3. **Output bookkeeping**: outputs live in the graph's memory pool, which the next replay overwrites. The
#    tree checks which earlier outputs are still alive, rebuilds the output tensors, and when a new
#    *generation* (iteration) starts it invalidates (newer PyTorch versions may instead copy out) outputs you
#    still hold. By default every call of the compiled function starts a new generation (in inference);
#    `torch.compiler.cudagraph_mark_step_begin()` marks the boundary explicitly and is required whenever the
#    heuristic is wrong (e.g. training with a pending backward). Once you call it, call it every iteration:
#    from then on the tree counts generations only by your marks.
#
# We measure three ways of calling it. First the "naive" loops, `y = f(x)` (the output stays alive until
# the next call) and a loop that drops the output at once. The `mark_step_begin` variants come later
# (section 5) because the first call to it changes how generations are counted for the rest of the process.

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
# ### Timing, floor and kernels per call
#
# `compare()` times each variant (median of `SAMPLES` samples of `CALLS` calls, synchronized) and reads the
# profiler for the GPU-busy time per call (the *floor*), the kernels per call, and whether a CUDA graph was
# launched (`executed_as` comes from the profiler, not from the name).

# %%
def run_compare(case, names):
    df = compare({n: variants[case][n] for n in names}, inputs[case], case=case, calls=CALLS, samples=SAMPLES,
                 warmup=10, floor=CUDA)
    df.insert(1, "shape", "x".join(map(str, SHAPES[case])))
    return df


frames = [run_compare(case, list(variants[case])) for case in SHAPES]
print(pd.concat(frames)[["case", "variant", "executed_as", "median_us", "floor_us", "kernels_per_call"]]
      .to_string(index=False, float_format="%.1f"))

# %% [markdown]
# ### Where does a naive `reduce-overhead` call spend its time?
#
# Two measurements, on the same variants. First, what the GPU does per call and which CUDA runtime calls the
# CPU makes (profiler): each `cudaLaunchKernel`/`cudaMemcpyAsync` costs the CPU a launch, `cudaGraphLaunch`
# is one graph replay. Then where the CPU time goes: Python's `cProfile` over many calls, grouped by the part
# of PyTorch it was spent in. cProfile slows Python down, so read the *shares*, not the absolute µs.

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


def gpu_breakdown(names, cases=None):
    rows = []
    for case in cases or COMPILE_CASES:
        for n in names:
            g = gpu_time(variants[case][n], inputs[case], calls=50)
            rows.append({"case": case, "variant": n, "GPU busy µs": g.busy_us,
                         "GPU work per call (µs)": "; ".join(f"{short(k)} {v:.1f}" for k, v in g.top[:3]),
                         "CUDA runtime calls per call": runtime_calls(variants[case][n], inputs[case])})
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
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(gpu_breakdown(["eager", "torch.compile", "torch.compile + graph", "torch.compile + graph, input in place",
                             "reduce-overhead, naive (y = f(x))", "reduce-overhead, output dropped"])
              .to_string(index=False, float_format="%.2f"))
    for name in ["torch.compile", "torch.compile + graph", "reduce-overhead, naive (y = f(x))"]:
        print(f"\nWhere the CPU time of one call goes, {name!r} (small tensor):")
        print(cpu_breakdown(variants[COMPILE_CASES[0]][name], inputs[COMPILE_CASES[0]])
              .to_string(index=False, float_format="%.1f"))
else:
    print("skipped: needs an NVIDIA GPU.")

# %% [markdown]
# Reading the tables: default `torch.compile` launches one fused kernel but spends tens of µs in Python
# (Dynamo's frame entry and guards, AOTAutograd's wrapper, Inductor's wrapper) before it. `reduce-overhead`
# keeps all of that, adds the CUDA graph trees' bookkeeping, and launches two things instead of one: the copy
# of the input into the graph's static buffer (a separate kernel) and the graph. Compared with default
# `torch.compile` there is nothing left for the graph to save (one fused-kernel launch becomes a graph launch
# plus a copy) while the Python on top grows, so on this tiny function it is slower than eager; on the large
# tensor the input copy is also a full extra pass over memory. A manual graph of the compiled function skips all the Python:
# one `copy_` and one `replay()`, or only `replay()` when the input is already in place.

# %% [markdown]
# ## 5. Using `reduce-overhead` well
#
# What the documentation recommends, measured:
#
# - **Say where an iteration starts**: `torch.compiler.cudagraph_mark_step_begin()` before each call. (In
#   inference every call already starts a new generation, so expect no gain here; in training, or whenever
#   the heuristic is wrong, it is what keeps replays on the fast path.)
# - **Keep the input where the graph reads it**: if your data is produced into the same tensor every
#   iteration (a preallocated batch buffer, a KV cache), mark it with
#   `torch._dynamo.mark_static_address(buf, guard=True)`; the graph should then read it in place instead of
#   copying it. And consume or `.clone()` each output before
#   the next call. The kernels and runtime calls below show whether the copy really went away on your version.

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
        variants[case]["reduce-overhead, used well"] = lambda _x, f=in_place, b=buf: f(b)
        errors[case]["reduce-overhead, used well"] = max_abs_err(
            variants[case]["reduce-overhead, used well"], case, prepare=buf.copy_)
        late[case] = ["reduce-overhead + mark_step_begin", "reduce-overhead, used well"]
    late_errors = pd.DataFrame([{"case": c, "variant": v, "max_abs_err": errors[c][v]}
                                for c in SHAPES for v in late[c]])
    print(late_errors.to_string(index=False))
    assert (late_errors["max_abs_err"] < 1e-4).all(), "a variant disagrees with eager; do not time it"
    late_frames = [run_compare(case, late[case]) for case in COMPILE_CASES]
    print(pd.concat(late_frames)[["case", "variant", "executed_as", "median_us", "floor_us", "kernels_per_call"]]
          .to_string(index=False, float_format="%.1f"))
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(gpu_breakdown(late[COMPILE_CASES[0]]).to_string(index=False, float_format="%.2f"))
    print("\nWhere the CPU time of one call goes, 'reduce-overhead, used well' (small tensor):")
    print(cpu_breakdown(variants[COMPILE_CASES[0]]["reduce-overhead, used well"], inputs[COMPILE_CASES[0]])
          .to_string(index=False, float_format="%.1f"))
    for case in COMPILE_CASES:
        k = {f.loc[i, "variant"]: f.loc[i, "kernels_per_call"] for f in frames + late_frames for i in f.index
             if f.loc[i, "case"] == case}
        same = k["reduce-overhead, used well"] >= k["reduce-overhead, output dropped"]
        print(f"{case}: mark_static_address {'did NOT remove' if same else 'removed'} the input copy on PyTorch "
              f"{torch.__version__} ({k['reduce-overhead, output dropped']:g} -> "
              f"{k['reduce-overhead, used well']:g} kernels per call).")
else:
    late_frames = []
    print("skipped: needs an NVIDIA GPU.")

# %% [markdown]
# ## 6. All results, saved
#
# `speedup` is relative to eager on the same tensor. `floor_us` is the GPU-busy time per call: what a variant
# would cost if launching were free. Fusion lowers the floor (fewer passes over memory); a graph brings the
# time per call down *towards* the floor (fewer, cheaper launches).

# %%
df = pd.concat(frames + late_frames, ignore_index=True)
df["max_abs_err"] = [errors[c][v.replace(" (eager fallback)", "")] for c, v in zip(df["case"], df["variant"])]
eager_us = df[df["variant"] == "eager"].set_index("case")["median_us"]
df["speedup"] = df["case"].map(eager_us) / df["median_us"]
df["device"] = torch.cuda.get_device_name(0) if CUDA else "CPU (no CUDA)"
cols = ["case", "shape", "variant", "executed_as", "median_us", "iqr_us", "speedup", "floor_us", "vs_floor",
        "kernels_per_call", "max_abs_err", "device", "clock"]
df = df[cols + [c for c in df.columns if c not in cols]]
print(df[["case", "variant", "executed_as", "median_us", "speedup", "floor_us", "kernels_per_call", "max_abs_err"]]
      .to_string(index=False, float_format=lambda v: f"{v:.3g}"))

# %%
def plot(df):
    cases = list(dict.fromkeys(df["case"]))
    fig, axes = plt.subplots(1, len(cases), figsize=(7 * len(cases), 0.42 * df.groupby("case").size().max() + 1.6),
                             squeeze=False)
    colors = {"cuda graph": "tab:green", "eager": "tab:blue"}
    for ax, case in zip(axes[0], cases):
        d = df[df["case"] == case].iloc[::-1]
        y = range(len(d))
        ax.barh(list(y), d["median_us"], color=[colors.get(e, "tab:gray") for e in d["executed_as"]])
        if d["floor_us"].notna().any():
            ax.scatter(d["floor_us"], list(y), marker="|", s=300, color="black", zorder=3, label="GPU-busy floor")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_yticks(list(y), [f"{v} ({e})" for v, e in zip(d["variant"], d["executed_as"])], fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # no overlapping minor labels
        ax.set_xlabel("time per call, µs (log scale)")
        ax.set_title(f"GELU {case} {d['shape'].iloc[0]}")
        for yi, v in zip(y, d["median_us"]):
            ax.text(v, yi, f" {v:.1f}", va="center", fontsize=7)
    where = df["device"].iloc[0]
    note = "" if CUDA else " (CPU, eager only: not a GPU result)"
    fig.suptitle(f"Time per call; green: ran as a CUDA graph, blue: eager launches. {where}, "
                 f"PyTorch {torch.__version__}{note}", fontsize=10)
    fig.tight_layout()
    return fig


fig = plot(df)
folder = results.save(STEM, df, figures={"time_per_call": fig})
print("saved to", folder)
plt.show()

# %% [markdown]
# ## 7. Fusion vs graphs, and the published figures
#
# The blog measured on a Tesla K80 with PyTorch 1.10 (wall clock, 10,000 calls, mean). Our reference is a plain
# PyTorch run on an H200 (PyTorch 2.11, median of 5 repeats). The last column is this notebook's run.

# %%
# Published graph figures go on the "input in place" rows: the H200 reference's floors (1.2 µs for the fused
# graphs) show it replayed without copying a new input; the blog does not say.
IP = ", input in place"
K80 = {("small", "eager"): 70.9, ("small", "cuda graph" + IP): 64.9, ("small", "jit.script"): 38.9,
       ("small", "jit.script + graph" + IP): 35.6, ("large", "eager"): 1320.0, ("large", "cuda graph" + IP): 1340.0,
       ("large", "jit.script"): 425.0, ("large", "jit.script + graph" + IP): 374.0}
H200 = {("small", "eager"): 56.4, ("small", "cuda graph" + IP): 11.5, ("small", "jit.script"): 20.4,
        ("small", "jit.script + graph" + IP): 5.8, ("small", "torch.compile"): 39.5,
        ("small", "torch.compile + graph" + IP): 5.9, ("small", "reduce-overhead, naive (y = f(x))"): 102.0,
        ("large", "eager"): 57.8, ("large", "cuda graph" + IP): 50.5, ("large", "jit.script"): 15.2,
        ("large", "jit.script + graph" + IP): 14.9, ("large", "torch.compile"): 55.1,
        ("large", "torch.compile + graph" + IP): 8.7, ("large", "reduce-overhead, naive (y = f(x))"): 78.0}

if CUDA:
    ours, ours_label = df, f"this run: {df['device'].iloc[0]}"
else:
    rec = results.load(STEM)
    ours = rec.df if rec is not None else None
    ours_label = f"recorded: {rec.env.get('gpu')}" if rec is not None else "this run (needs a GPU)"


def fmt(us, eager):
    if us is None or pd.isna(us):
        return "-"
    return f"{us:.1f} µs ({eager / us:.2f}x)" if us < 1000 else f"{us / 1000:.3f} ms ({eager / us:.2f}x)"


rows = []
for case in ("small", "large"):
    for v in ["eager", "cuda graph" + IP, "cuda graph", "jit.script", "jit.script + graph" + IP, "jit.script + graph",
              "torch.compile", "torch.compile + graph" + IP, "torch.compile + graph",
              "reduce-overhead, naive (y = f(x))", "reduce-overhead + mark_step_begin", "reduce-overhead, used well"]:
        mine = None
        if ours is not None:
            m = ours[(ours["case"] == case) & (ours["variant"] == v)]
            e = ours[(ours["case"] == case) & (ours["variant"] == "eager")]
            if len(m) and len(e):
                mine = fmt(m["median_us"].iloc[0], e["median_us"].iloc[0])
        rows.append({"case": case, "variant": v,
                     "K80, blog (PyTorch 1.10)": fmt(K80.get((case, v)), K80[(case, "eager")]),
                     "H200, reference (PyTorch 2.11)": fmt(H200.get((case, v)), H200[(case, "eager")]),
                     ours_label: mine or "-"})
side_by_side = pd.DataFrame(rows)
side_by_side

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU was the bottleneck for both tensors (each kernel ran longer
# than the CPU took to launch it; the large GELU is five passes over 19 MB at about 240 GB/s), so a graph
# gained almost nothing and only fusion helped; a Hopper GPU runs the small tensor's kernels in about a µs
# each, so eager GELU there is almost pure launch overhead and graphs win several-fold, and on the large
# tensor fusion first shrinks the GPU time until the fused kernel is launch-bound too, so fusion + graph
# compounds.
#
# The two effects stack: the "kernels per call" column shows fusion going from five kernels to one; the
# floor shows the GPU time that saves; the graph variants show the CPU launch cost going away.

# %%
if CUDA:
    fusion = df[df["variant"].isin(["eager", "cuda graph" + IP, "jit.script", "jit.script + graph" + IP,
                                    "torch.compile", "torch.compile + graph" + IP])]
    print(fusion[["case", "variant", "kernels_per_call", "floor_us", "median_us", "vs_floor"]]
          .to_string(index=False, float_format="%.1f"))
    for case in SHAPES:
        d = df[df["case"] == case].set_index("variant")
        if "reduce-overhead, naive (y = f(x))" in d.index:
            print(f"\n{case}: eager {d.loc['eager', 'median_us']:.1f} µs; reduce-overhead naive "
                  f"{d.loc['reduce-overhead, naive (y = f(x))', 'median_us']:.1f} µs, with mark_step_begin "
                  f"{d.loc['reduce-overhead + mark_step_begin', 'median_us']:.1f} µs, used well "
                  f"{d.loc['reduce-overhead, used well', 'median_us']:.1f} µs; manual graph of the compiled "
                  f"function {d.loc['torch.compile + graph', 'median_us']:.1f} µs "
                  f"(input in place {d.loc['torch.compile + graph, input in place', 'median_us']:.1f} µs); "
                  f"floor {d.loc['torch.compile + graph, input in place', 'floor_us']:.1f} µs.")
else:
    print("Kernels per call and the GPU-busy floor come from the CUDA profiler: they need an NVIDIA GPU.\n"
          "Recorded GPU results:")
    results.show_recorded(STEM)

# %% [markdown]
# ## 8. Summary
#
# - **Fusion** (`torch.jit.script`'s fuser, `torch.compile`'s Inductor) turns five kernels into one: less GPU
#   time (the floor drops) and fewer launches. **Graphs** remove the per-launch CPU cost. On a fast GPU a
#   small elementwise function is launch-bound, so a graph of the fused function, replayed with its input in
#   place, is the fastest variant by far. Copying a new input into the graph costs one more launch (and, for a
#   large tensor, one more pass over memory): produce data where the graph reads it when you can.
# - `torch.jit.script` still runs where it exists, but it is deprecated; `torch.compile` is the replacement, and
#   capturing a compiled function with `capture()` works the same way as capturing eager code.
# - `torch.compile(mode="reduce-overhead")` is convenient, but its safety machinery (guards, copying inputs
#   into static buffers, tracking the outputs it hands out) costs CPU time on every call. For a tiny function
#   that overhead can exceed what the graph saves. Use it on larger regions (a whole model's forward), call
#   `torch.compiler.cudagraph_mark_step_begin()` at each iteration boundary, keep inputs in a static buffer
#   (`torch._dynamo.mark_static_address`) when you can, and consume or clone outputs before the next call.
#   When every µs counts, a manual graph of the compiled function with its input in place is the floor you
#   can reach from Python.
#
# ## Exercises
#
# 1. Capture 10 calls of the compiled GELU in one graph (`capture(compiled, x, calls_per_graph=10)`) and time it
#    on the small tensor. How close to the floor does it get? (Notebook 01 does this for eager GELU.)
# 2. Wrap GELU in a 10-layer `nn.Sequential` of `Linear` + GELU and compare `reduce-overhead` with default
#    `torch.compile`. At what amount of work per call does `reduce-overhead`'s fixed cost stop mattering?
# 3. In a fresh process, keep two outputs of a `reduce-overhead` function alive: `y1 = f(x); y2 = f(x2); print(y1)`.
#    What does your PyTorch version do with `y1` (an error, or a copy taken out of the graph's memory)? What
#    does `y1 = f(x).clone()` change, and what does it cost per call?
# 4. Run `gelu` through `torch.compile(mode="max-autotune-no-cudagraphs")` and compare its floor with default mode.
