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
# **What this adds to the picture of notebook 01:** a graph removed the *launches* but replayed all five kernels.
# A compiler that [*fuses*](../docs/GLOSSARY.md) them removes *kernels*. This notebook measures each alone and both together: the 2021
# blog's GELU compiled with `torch.jit.script`, with and without a graph, then the modern path: `torch.compile`,
# a graph of the compiled function, and `torch.compile(mode="reduce-overhead")`, which builds graphs for you.
#
# **What you'll learn**
# - Fusion cuts kernels (GPU time), a graph cuts launches (CPU time), and where each pays.
# - What `mode="reduce-overhead"` costs per call, and where it wins and loses: one elementwise function, a deeper
#   model, a training step.
# - What happens to a `reduce-overhead` output you still hold when the next call runs.
#
# **What you need**: an NVIDIA GPU for the graph parts (Colab: Runtime → Change runtime type → T4 GPU).
# Without one the notebook runs the CPU-possible part small and shows recorded GPU results.
#
# **How long**: 66 s on an NVIDIA H200 (measured by `reproduce`, 2026-11-29); a T4 has not been timed yet; about 1
# minute on a CPU (small sizes).

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
import logging

import pandas as pd
import torch
from IPython.display import display

from cudagraph_kit import env_table, has_cuda
from cudagraph_kit import capture
from cudagraph_kit.graphed import fresh_cublas_workspace
from cudagraph_kit.course.lessons.compilers import (fresh, keeping_outputs, read_after_next_call, script_or_none,
                                                    torchscript_fuser, with_mark_step)
from cudagraph_kit.course.lessons.models import eager_step, mlp_stack
from cudagraph_kit.course.measuring import results, verdicts
from cudagraph_kit.course.measuring.claims import save_claims, summary
from cudagraph_kit.course.measuring.correctness import param_diff
from cudagraph_kit.course.measuring.measure import Measured, measure
from cudagraph_kit.course.measuring.verdicts import IP, RO_MARK, TRAIN_KIT, TRAIN_RO

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
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs (the kit's and reduce-overhead's) need an NVIDIA GPU: this run checks\n"
          ">>> that eager, jit.script and torch.compile agree on the CPU, small; the findings shown are the recorded\n"
          ">>> GPU run's.")

# %% [markdown]
# ## 1. The workload
# GELU written out as five elementwise operations: eagerly, five kernels, each a launch (CPU cost) and a pass
# over memory (GPU cost). Every variant below goes through `add`, which runs it once on *new* data and stops the
# notebook if it disagrees with eager: correct first, then fast.

# %% tags=["nbval-check-output"]
def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}
test_inputs = {case: torch.randn(*shape, device=DEVICE) for case, shape in SHAPES.items()}
variants = {case: {"eager": gelu} for case in SHAPES}   # case -> {name: callable(x)}
errors = {case: {"eager": 0.0} for case in SHAPES}      # case -> {name: max |difference| from eager}


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
# `capture(fn, x)` does what notebook 01 wrote out by hand. `g(x)` copies the new input into the static buffer
# and replays; we also time `g.replay()` alone, "input in place", as when the previous step wrote the data there.
#
# `torch.jit.script` compiles the function to TorchScript, whose fuser turns the elementwise chain into one
# kernel after a few profiling calls (`JIT_WARMUP`). TorchScript is deprecated in favour of `torch.compile`; the
# cell prints the warning PyTorch gives, and skips this part cleanly where `torch.jit.script` is gone or fails.
# On a CPU its fuser is off, so the scripted function runs eager's five kernels.

# %%
def add_graph(case, name, g):
    """Two ways to call a captured graph: ``g(x)`` (copy x in, replay) and, input in place, ``g.replay()``."""
    add(case, name, g)
    add(case, name + IP, lambda _x, g=g: g.replay(), prepare=g.static_inputs[0].copy_)


for case in SHAPES:
    add_graph(case, "cuda graph", capture(gelu, inputs[case], eager_fallback=True))

FUSER = "none (TorchScript not usable here)"
scripted, warned = script_or_none(gelu, list(inputs.values()), JIT_WARMUP)   # profiling runs, then the fused plan
print("Warnings PyTorch gave for torch.jit.script:", *(warned or ["(none)"]), sep="\n  ")
if scripted is not None:
    for case in SHAPES:
        add(case, "jit.script", scripted)
        add_graph(case, "jit.script + graph", capture(scripted, inputs[case], warmup=JIT_WARMUP, eager_fallback=True))
    FUSER, fused_ops = torchscript_fuser(scripted, inputs["small"])
    print(f"TorchScript's fuser here: {FUSER}; its fusion group runs {fused_ops or 'nothing'} as one kernel")

# %% [markdown]
# ## 3. The modern path: `torch.compile`, and a graph of the compiled function
# `torch.compile` (default mode) traces the function with [Dynamo](../docs/GLOSSARY.md) and generates one fused kernel with
# [Inductor](../docs/GLOSSARY.md).
# Each call still goes through Python: Dynamo checks its *guards* (still a float32 tensor of that shape?), then a
# runtime wrapper, then the launch. Capturing the compiled function with `capture()` removes all that Python
# from the replay: the graph holds only the fused kernel. (`dynamic=False`: one kernel per shape, as a graph.)

# %%
if not CUDA:   # Inductor imports torch.utils.cpp_extension, which logs "No CUDA runtime is found, using CUDA_HOME=..."
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)   # on a machine without a GPU: expected
compiled = torch.compile(fresh(gelu), dynamic=False) if COMPILE_CASES else None
for case in COMPILE_CASES:
    add(case, "torch.compile", compiled)          # the first call compiles (slow, once per shape)
    add_graph(case, "torch.compile + graph", capture(compiled, inputs[case], eager_fallback=True))
print("torch.compile ran on:", COMPILE_CASES or "nothing (COMPILE=False)")

# %% [markdown]
# ## 4. `torch.compile(mode="reduce-overhead")`: CUDA graphs built for you
# `reduce-overhead` records the compiled code into CUDA graphs managed by *CUDA graph trees*. Each call does more
# than a bare `replay()`: the same guards and wrappers as default `torch.compile`; a copy of each input not known
# to stay at one address into the graph's static buffer; and bookkeeping of the outputs it handed out, which live
# in the graph's memory pool and are reused by a later run. `torch.compiler.cudagraph_mark_step_begin()` marks
# where an iteration starts; the first call to it changes how the process counts iterations, so the marked
# variants are timed later, in phase 2. Without a GPU there is no `reduce-overhead` graph, so these rows are GPU-only.

# %%
ro = None
if CUDA and COMPILE_CASES:
    ro = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    for case in COMPILE_CASES:
        for _ in range(3):              # call 1 warms up, call 2 records the graph, then it replays
            ro(inputs[case])
        add(case, "reduce-overhead, naive (y = f(x))", keeping_outputs(ro))   # y = f(x): the last output stays alive
        add(case, "reduce-overhead, output dropped", ro)
print("reduce-overhead ran on:", COMPILE_CASES if ro is not None else "nothing (needs an NVIDIA GPU)")

# %% [markdown]
# **An output you keep, read after the next call.** `y1 = f(x1); y2 = f(x2)`: the second call may reuse the
# memory that holds `y1`. PyTorch's `torch/_inductor/cudagraph_trees.py` invalidates the outputs of a *warm-up* or
# *recording* run when the next one starts (reading `y1` raises `RuntimeError: ... accessing tensor output of
# CUDAGraphs that has been overwritten by a subsequent run`), but not those of a *replay*: there the next replay
# writes its result into `y1`'s memory, silently. The cell tries both on this PyTorch, then the fix: `.clone()`
# the outputs you keep (or consume them before the next call).

# %%
ro_overwrite = ro_overwrite_first_call = None  # what reading a stale reduce-overhead output did on this PyTorch
if ro is not None:
    x1, x2 = test_inputs[COMPILE_CASES[0]], inputs[COMPILE_CASES[0]]
    ro_overwrite, message = read_after_next_call(ro, x1, x2, gelu)     # ro has replayed on this shape before
    print(f"y1 from a replay, read after the next call: {ro_overwrite}. {message}")
    ro_first = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    ro_overwrite_first_call, message = read_after_next_call(ro_first, x1, x2, gelu)  # call 1 warms up, call 2 records
    print(f"y1 from the first call of a freshly compiled function (a warm-up run): {ro_overwrite_first_call}. "
          f"{message}")
    y1 = ro(x1).clone()                           # the fix: clone what you keep
    y2 = ro(x2)
    torch.testing.assert_close(y1, gelu(x1))
    torch.testing.assert_close(y2, gelu(x2))
    print("with y1 = f(x1).clone(): y1 survives the next call and matches eager.")
    del y1, y2, ro_first
else:   # no reduce-overhead graph here: say so, then the recorded GPU run's outcome, labelled
    rec = results.load(STEM)
    print("No NVIDIA GPU here (or COMPILE=False): reduce-overhead built no graph, so no output was read after a call.")
    if rec is not None and rec.env.get("reduce_overhead_stale_output"):
        print(f"{rec.caption}:\n  y1 from a replay, read after the next call: {rec.env['reduce_overhead_stale_output']}"
              f"\n  y1 from a first call (a warm-up run): {rec.env['reduce_overhead_stale_output_first_call']}")

# %% [markdown]
# ## 5. Timing phase 1: everything before the first `mark_step_begin`
# Every variant above agreed with eager on new data (`add` checked it). `measure` times the variants of each
# tensor round-robin in `WINDOWS` [windows](../docs/GLOSSARY.md), each speedup with its 90% prediction interval;
# the profiler, in the last window, reads the [floor](../docs/GLOSSARY.md), the kernels per call and what each
# variant ran as. "Fusion alone" is `jit.script` where TorchScript works, else `torch.compile`. Below: each
# variant's median time, a chart of its speedup with its interval, and four verdicts; "Going further" D lists every
# verdict, with the floors.

# %%
PHASE_1, PHASE_2 = "1: before mark_step_begin", "2: after mark_step_begin"
FUSED = "jit.script" if scripted is not None else "torch.compile"


def timed(cases, phase, builds):
    """measure() over ``cases`` ({case: ({name: fn}, args)}), every variant warmed up before each window, with
    the verdicts ``builds`` makes; the phase is written into the table."""
    m = measure({case: (fns, args, {"warmup": 3}) for case, (fns, args) in cases.items()}, windows=WINDOWS,
                samples=SAMPLES, calls=CALLS, sample_ms=SAMPLE_MS, pause_s=WINDOW_PAUSE_S, verdicts=builds)
    m.table.insert(2, "phase", phase)
    return m


m1 = timed({case: (variants[case], (inputs[case],)) for case in SHAPES}, PHASE_1, verdicts.fusion_and_graphs(FUSED))
results.show(m1, STEM, figure=True, table="times",   # without a GPU: the recorded GPU run's rows and verdicts
             headlines=["graph_beats_eager_small", "fusion_adds_to_graph_large", "graph_adds_to_fusion_small",
                        "ro_naive_beats_eager_small"])

# %% [markdown]
# Default `torch.compile` launches one fused kernel, after its Python (guards and a runtime wrapper).
# `reduce-overhead` keeps that Python, adds its bookkeeping, and per call also copies the input into the graph's
# buffer (`torch._foreach_copy_`) before the replay. On one fused kernel its graph saves at most that one launch,
# and what it adds can cost more: compare its rows with `torch.compile`'s above, and read its verdict against eager. A graph of
# the compiled function skips all the Python: one `copy_` and one `replay()`, or only `replay()` with the input
# in place. ("Going further" B shows where the CPU time of one call goes.)

# %% [markdown]
# ## 6. A deeper model: many kernels per call
# `reduce-overhead`'s fixed cost per call does not grow with the work inside the graph, while eager pays a launch
# per kernel. So give it many kernels: an MLP of `MLP_LAYERS` × (`Linear` + `ReLU`), `MLP_WIDTH` features, a batch
# of `MLP_BATCH` rows (inference): short kernels, launch-bound. Timed in phase 2: eager, default `torch.compile`,
# `reduce-overhead` (with marks), the kit's graph of the eager model, and a graph of the compiled model.
#
# **One pitfall: the cuBLAS [*workspace*](../docs/GLOSSARY.md).** A graph bakes in the address of cuBLAS's scratch
# workspace, which `reduce-overhead` frees when it records, so each function the kit captures here is wrapped in
# `fresh_cublas_workspace`: the capture gets its own workspace in the graph's pool. (One float32 matmul precision,
# `MATMUL_PRECISION`, on both sides: "Going further" C.)

# %%
mlp = mlp_stack(MLP_LAYERS, MLP_WIDTH, seed=0, device=DEVICE).requires_grad_(False)
x_mlp, x_mlp_test = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)


def mlp_forward(x):
    return mlp(x)


mlp_variants, mlp_graphs = {"eager": mlp}, [capture(fresh_cublas_workspace(mlp), x_mlp, eager_fallback=True)]
mlp_variants["cuda graph"] = mlp_graphs[0]
mlp_variants["cuda graph" + IP] = lambda _x, g=mlp_graphs[0]: g.replay()
if CUDA and COMPILE:
    mlp_variants["torch.compile"] = mlp_compiled = torch.compile(fresh(mlp_forward), dynamic=False)
    mlp_variants[RO_MARK] = with_mark_step(torch.compile(fresh(mlp_forward), mode="reduce-overhead", dynamic=False))
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
# TF32 keeps 10 bits of mantissa, and eager and compiled code may run different matmul kernels
MLP_TOLERANCE = 1e-2 if torch.get_float32_matmul_precision() != "highest" else 1e-4
relative = {k: v / ref_mlp.abs().max().item() for k, v in mlp_errors.items()}
print("max |difference| from eager, relative to max |output|:", {k: f"{v:.1e}" for k, v in relative.items()})
assert max(relative.values()) < MLP_TOLERANCE, "a variant disagrees with eager; do not time it"
MLP_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}"

# %% [markdown]
# ### 6b. A training step: forward and backward under `reduce-overhead`
# `torch.compile` of the model gives AOTAutograd a forward and a backward graph, and `reduce-overhead` replays
# each as a CUDA graph, while the loss, autograd's bookkeeping and `optimizer.step()` stay in Python. Timed in
# phase 2, one copy of the MLP per variant (the same weights), parity with eager first: the eager step, that step
# with the model compiled with `reduce-overhead`, and the kit's whole-step graph (`capture_train_step`, notebook
# 02), which captures the optimizer step too.

# %%
TRAIN_CASE = f"MLP {MLP_LAYERS}x(Linear {MLP_WIDTH}+ReLU), batch {MLP_BATCH}, SGD training step"
train_steps, train_errors = {}, {}
if CUDA and COMPILE:
    from cudagraph_kit import capture_train_step

    loss_fn = torch.nn.functional.mse_loss
    x_train, y_train = torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE), torch.randn(MLP_BATCH, MLP_WIDTH, device=DEVICE)
    models = {name: mlp_stack(MLP_LAYERS, MLP_WIDTH, seed=1, device=DEVICE) for name in ("eager", TRAIN_RO, TRAIN_KIT)}
    opts = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in models.items()}
    models[TRAIN_KIT].forward = fresh_cublas_workspace(models[TRAIN_KIT].forward)  # the capture gets fresh workspaces
    train_steps = {
        "eager": eager_step(models["eager"], opts["eager"]),
        TRAIN_RO: eager_step(models[TRAIN_RO], opts[TRAIN_RO],   # with cudagraph_mark_step_begin() at each step
                             torch.compile(models[TRAIN_RO], mode="reduce-overhead", dynamic=False)),
        TRAIN_KIT: capture_train_step(models[TRAIN_KIT], opts[TRAIN_KIT], loss_fn, (x_train, y_train)),
    }
    for _ in range(6):                        # parity: the same six steps on every variant
        for step in train_steps.values():
            step(x_train, y_train)
    train_errors = {name: param_diff(model, models["eager"]) for name, model in models.items()}
    print("max |parameter difference| from eager after 6 steps:", {k: f"{v:.1e}" for k, v in train_errors.items()})
    assert max(train_errors.values()) < 1e-4, "a training variant disagrees with eager; do not time it"
else:
    print("skipped: needs an NVIDIA GPU (and torch.compile).")

# %% [markdown]
# ### Timing phase 2: sections 6 and 6b together
# Every window times the MLP forward and the training step, so the windows of each case are spread over the whole
# phase. ("Going further" A times `reduce-overhead` on the GELU as the documentation recommends.)

# %%
phase_2_cases = {MLP_CASE: (mlp_variants, (x_mlp,))}
if train_steps:
    phase_2_cases[TRAIN_CASE] = (train_steps, (x_train, y_train))
m2 = timed(phase_2_cases, PHASE_2, verdicts.reduce_overhead_in_use)
results.show(m2.part(cases=r"^MLP ", claims=r"_(mlp|training)$"), STEM, figure=True, table="times",
             headlines=["ro_beats_compile_mlp", "ro_beats_eager_training", "kit_beats_ro_training"])

# %% [markdown]
# ## 7. Fusion vs graphs, and the published figures
# The published figures come from a 2021 blog post in Japanese by the GitHub user shu65 ("Measuring the
# performance of CUDA Graphs, new in PyTorch 1.10") and its notebook,
# [shu65/blog-pytorch-notebooks: pytorch_CUDA_Graphs.ipynb](https://github.com/shu65/blog-pytorch-notebooks/blob/main/pytorch_CUDA_Graphs.ipynb):
# a Tesla K80, PyTorch 1.10, wall clock over 10,000 calls. The reference is this project's plain PyTorch run on an
# H100 (PyTorch 2.11, median of 5 repeats, no kit code). The blog's graph figures go on the "input in place" rows.

# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED = pd.DataFrame([  # case, variant, K80 blog (µs), H100 reference (µs); None: no figure
    ("small", "eager", 70.9, 75.8), ("small", "cuda graph" + IP, 64.9, 8.7), ("small", "jit.script", 38.9, 10.9),
    ("small", "jit.script + graph" + IP, 35.6, 2.7), ("small", "torch.compile", None, 34.2),
    ("small", "torch.compile + graph" + IP, None, 3.0), ("small", "reduce-overhead, naive (y = f(x))", None, 85.2),
    ("large", "eager", 1320.0, 72.4), ("large", "cuda graph" + IP, 1340.0, 66.8), ("large", "jit.script", 425.0, None),
    ("large", "jit.script + graph" + IP, 374.0, 18.5), ("large", "torch.compile + graph" + IP, None, 11.4),
], columns=["case", "variant", "K80 blog (µs)", "H100 reference (µs)"])
for col in ["K80 blog (µs)", "H100 reference (µs)"]:   # a speedup over the case's eager row (x)
    PUBLISHED[col.replace("(µs)", "(x)")] = PUBLISHED.groupby("case")[col].transform("first") / PUBLISHED[col]

# %%
rec = None if CUDA else results.load(STEM)        # no GPU: the recorded GPU run's rows
now = m1.short() if CUDA else Measured(rec.df[rec.df.phase == PHASE_1]).short(cuda=True) if rec else None
if now is not None:   # speedups over eager (x); this run's with its 90% interval
    now["this run (x)"] = now.speedup.where(now["90% interval"] == "", now.speedup + " (" + now["90% interval"] + ")")
    print("This run:" if CUDA else f"{rec.caption}:")
    display(PUBLISHED[["case", "variant", "K80 blog (x)", "H100 reference (x)"]].merge(
        now[["case", "variant", "this run (x)"]], on=["case", "variant"], how="left").round(2).astype(object).fillna("-"))

# %% [markdown]
# **Why the ratios differ.** On the K80 the GPU was the bottleneck for both tensors (each kernel ran longer than
# its launch took), so a graph gained almost nothing and only fusion helped. A Hopper GPU runs each of the small
# tensor's kernels in much less time than a launch takes, so eager GELU on the small tensor is mostly launch
# overhead, which a graph removes. On the large tensor the five kernels take longer, bound by memory bandwidth:
# fusion cuts the passes over memory, and a graph removes whatever launch time is left (with the input copied in,
# the copy is one more kernel, which can cost what the graph saves); section 5's table shows how much that is on
# this GPU (its `cuda graph` rows copy the input in).
# A ratio also moves with its eager time: where this GPU's eager call is faster than the reference's, every ratio
# over it shrinks with it, even when the graphed times are alike.
#
# ## 8. Takeaways
# Numbered from this run on a GPU; without one, from the recorded GPU run (named above them).

# %%
TAKEAWAYS = [
    "A graph removes launches: on the small GELU, a graph of eager's five kernels, its input already in place, was "
    "{graph_beats_eager_small} faster than eager.",
    "Fusion removes kernels: on the large GELU, a graph of torch.compile's one fused kernel was "
    "{fusion_adds_to_graph_large} faster than a graph of eager's five.",
    "On the small GELU, fusion and a graph add up when the input is already in place (`g(x)` adds a copy per call): "
    "the fused kernel in a graph was {graph_adds_to_fusion_small} faster than the fused kernel alone.",
    "Against default torch.compile, `reduce-overhead` pays where a region has many kernels: on the deeper MLP it "
    "was {ro_beats_compile_mlp} faster. In training, the kit's whole-step graph, optimizer included, was "
    "{kit_beats_ro_training} faster than `reduce-overhead`.",
    "Clone a `reduce-overhead` output you keep across calls, and give your own captures a fresh cuBLAS workspace "
    "(`fresh_cublas_workspace`) in a process where `reduce-overhead` runs too.",
]
claims = m1.claims + m2.claims
results.show_takeaways(STEM, claims, TAKEAWAYS);

# %% [markdown]
# ## Going further (optional)
# `reduce-overhead` as documented, where the time of one call goes, a fair comparison on the MLP, every verdict of
# this run, and saving the results. The exercises follow.
#
# ### A. `reduce-overhead` as documented: marks and a static input
# The documentation recommends `torch.compiler.cudagraph_mark_step_begin()` before each call, and, where your
# data is produced into the same tensor every iteration, `torch._dynamo.mark_static_address(buf, guard=True)`, so
# that the graph reads it in place instead of copying it. These variants are timed here, after the first
# `mark_step_begin` (phase 2) and before any profiler runs, as cases of their own (`small, phase 2`, ...) with eager
# and the graph of the compiled function timed again beside them. The kernels per call of section 4's variant
# against this one's then say whether `mark_static_address` removed the input copy on this PyTorch.

# %%
late = {}   # phase 2's GELU cases: {case: {name: fn}}
if ro is not None:
    ro_static = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
    for case in COMPILE_CASES:
        add(case, RO_MARK, with_mark_step(ro))
        buf = inputs[case].clone()                 # the buffer your pipeline writes each new input into
        # before the first call, so the graph is built for it; guard=True: a new address recompiles
        torch._dynamo.mark_static_address(buf, guard=True)
        in_place = with_mark_step(ro_static)
        for _ in range(3):
            in_place(buf)
        # timed: the data is already in `buf` (the argument is ignored); checked: new data written into `buf` first
        add(case, "reduce-overhead, static input", lambda _x, f=in_place, b=buf: f(b), prepare=buf.copy_)
        late[f"{case}, phase 2"] = {n: variants[case][n] for n in ("eager", "torch.compile + graph" + IP,
                                    RO_MARK, "reduce-overhead, static input")}
print("phase 2 GELU cases:", list(late) or "none (needs an NVIDIA GPU)")
m3 = timed({case: (fns, (inputs[case.split(",")[0]],)) for case, fns in late.items()}, PHASE_2,
           verdicts.reduce_overhead_in_use) if late else None
claims = claims + (m3.claims if m3 else [])
if m3 is not None:
    results.show(m3, STEM, table="times")
for case in late:
    base = case.split(",")[0]
    before, after = (m1.row(base, "reduce-overhead, output dropped").kernels_per_call,
                     m3.row(case, "reduce-overhead, static input").kernels_per_call)
    print(f"{base}: mark_static_address {'removed' if after < before else 'did not remove'} the input copy on "
          f"PyTorch {torch.__version__} ({before:g} -> {after:g} kernels per call).")

# %% [markdown]
# ### B. Where the time of a call goes
# Two measurements, made after all timings (a profiler session slows every later kernel launch in the process).
# First, what the GPU does per call and which CUDA runtime calls the CPU makes: each kernel launch
# (`cudaLaunchKernel`, or a variant such as `cuLaunchKernel` for Triton's kernels) and each `cudaMemcpyAsync`
# costs the CPU a launch; `cudaGraphLaunch` is one graph replay. Then where the CPU time goes: Python's `cProfile`
# over many calls, grouped by the part of PyTorch it was spent in. cProfile slows Python down, so read the
# *shares*, not the absolute µs. The `reduce-overhead` variants here are the ones with `mark_step_begin`: by now
# the process counts generations only by marks. The helpers are in `cudagraph_kit/course/measuring/breakdowns.py`.

# %%
from cudagraph_kit.course.measuring.breakdowns import cpu_breakdown, gpu_breakdown  # noqa: E402

if CUDA and COMPILE_CASES:
    c0 = COMPILE_CASES[0]
    named = [(c0, n, variants[c0][n], inputs[c0]) for n in
             ["eager", "torch.compile", "torch.compile + graph", "torch.compile + graph" + IP,
              RO_MARK, "reduce-overhead, static input"]]
    named += [(MLP_CASE, n, mlp_variants[n], x_mlp) for n in ["eager", "torch.compile", RO_MARK]]
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(gpu_breakdown(named).to_string(index=False, float_format="%.2f"))
    for case, name, fn, x in [named[i] for i in (1, 2, 4, 5, 8)]:
        print(f"\nWhere the CPU time of one call goes, {case}: {name!r}:")
        print(cpu_breakdown(fn, x).to_string(index=False, float_format="%.1f"))
else:
    print("skipped: needs an NVIDIA GPU.")

# %% [markdown]
# ### C. A fair comparison on the MLP: comparable GPU work
# A graph removes launches, not slow kernels: it cannot run faster than the kernels it replays (the floor). Eager
# `nn.Linear` and the compiled forward call cuBLAS through different operators (eager: one `addmm` with the bias;
# Inductor: a plain `mm` plus a fused bias + ReLU kernel), so cuBLAS may pick different matrix-multiply kernels
# for them; in full float32 the comparison can then measure that choice rather than launch overhead. So this
# notebook sets one precision for float32 matmuls, eager and compiled alike, before anything is compiled
# (`MATMUL_PRECISION`, default `"high"`: TF32 tensor cores, which PyTorch's own warning suggests), and a verdict
# checks that a graph of the compiled kernels is not far slower than a graph of eager's
# (`compiled_graph_slower_mlp`, in D's list below). The cell below reads the floors of the two graphs.

# %%
if CUDA and COMPILE:
    floors = {v: m2.row(MLP_CASE, v).floor_us for v in ("cuda graph" + IP, "torch.compile + graph" + IP)}
    print(f"{MLP_CASE}: floor of a graph of eager's kernels {floors['cuda graph' + IP]:.1f} µs, of the compiled "
          f"forward's kernels {floors['torch.compile + graph' + IP]:.1f} µs "
          f"(float32 matmul precision {torch.get_float32_matmul_precision()!r})")
else:
    print("The floors come from the GPU; the recorded run has them (figures/03_jit_compile).")

# %% [markdown]
# ### D. Every verdict of this run, and the recorded run beside it
# The takeaways quote a few verdicts; here is each one this run computed (without a GPU, the graph comparisons
# say they compared eager with eager), and the GPU run that `figures/` held when this notebook started (its
# caption names it).

# %%
if CUDA:
    summary(claims)
results.show_recorded(STEM, columns=["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo",
                                     "speedup_hi", "floor_us", "kernels_per_call"]);

# %% [markdown]
# ### E. Save the results
# `speedup` is relative to eager in the same case (phase 2's GELU rows are cases of their own). `floor_us` is the
# GPU-busy time per call: fusion lowers it (fewer passes over memory); a graph brings the time per call down
# *towards* it. Saved in `build/figures/03_jit_compile/` by default, never over the recorded run in `figures/`.

# %%
from cudagraph_kit.course.measuring.figures import plot_times  # noqa: E402
from cudagraph_kit.course.measuring.results import shown  # noqa: E402

shape_of = {case: "x".join(map(str, SHAPES[case.split(",")[0]])) for case in [*SHAPES, *late]}
errors_of = {**{(c.split(",")[0], v): e for c in [*SHAPES, *late] for v, e in errors[c.split(",")[0]].items()},
             **{(MLP_CASE, v): e for v, e in mlp_errors.items()}, **{(TRAIN_CASE, v): e for v, e in train_errors.items()}}
df = pd.concat([m1.table, m2.table] + ([m3.table] if m3 else []), ignore_index=True)
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
shown(fig, STEM, "time_per_call");   # without a GPU: the recorded run's figure


# %% [markdown]
# ## Exercises
# Each exercise extends the experiments above. Fill in its cell (every `...` is a placeholder that runs as it
# is), then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU
# say so (⏸); on a CPU a check verifies what it can there, such as correctness against eager. Worked solutions,
# run by the test suite against these checks: `notebooks/solutions/nb03_jit_compile.py` (try first).

# %% tags=["nbval-check-output"]
from cudagraph_kit import compare  # noqa: F401 (the exercises time with it)
from cudagraph_kit.course.exercises.nb03_jit_compile import check_clone_cost, check_compiled_calls_per_graph, check_max_autotune, check_mlp_depth

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
