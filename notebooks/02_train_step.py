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
# # 02 · A whole training step as one CUDA graph
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/02_train_step.ipynb)
#
# **What this adds to the picture of notebook 01:** a training step is a few dozen small kernels (forward, loss,
# backward, optimizer update), each launched by the CPU through Python and the autograd engine. Capturing the
# **whole step** into one [CUDA graph](../docs/GLOSSARY.md) replaces all those launches with one.
#
# This notebook reproduces the training-step experiment of a 2021 blog post (PyTorch 1.10 on a Colab K80):
# `Sequential(Linear(128, 256), Dropout(0.2), Linear(256, 16), Dropout(0.1))`, `MSELoss`, SGD with lr 0.1,
# batch 32, and the larger size of the PyTorch documentation's example (640 × 4096 → 2048 → 1024).
#
# **What you'll learn**
# - How to capture a whole training step by hand, and with two or three changed lines through
#   `cudagraph_kit.capture_train_step` (short last batches, Adam, AMP included).
# - How to check that a graphed loop trains like the eager loop.
# - How graphing only the model (`make_graphed_callables`) compares with graphing the whole step.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU). Without one the notebook
# runs the eager part small on the CPU, says so, and shows the recorded GPU results.
#
# **How long**: 56 s on an NVIDIA H200 (measured by `reproduce`, 2026-11-29); a T4 has not been timed yet; under a
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
SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)
SAMPLES = 2           # timing rounds per case in each window (one sample of every variant per round)
WINDOWS = 8           # timing windows, a pause apart, each timing every case: the intervals come from them
WINDOW_PAUSE_S = 0.5  # seconds between windows
SAMPLE_MS = 10.0      # about this long per sample (the kit picks the calls per sample), unless CALLS is set
CALLS = None          # training steps per sample; None: the kit picks the count from SAMPLE_MS
PARITY_STEPS = 300    # steps of each eager-vs-graph training run
AMP_STEPS = 100       # steps of each eager-vs-graph AMP training run

# %%
import copy

import pandas as pd
import torch
from IPython.display import display

from cudagraph_kit import bf16_supported, capture_train_step, env_table, graph_modules, has_cuda
from cudagraph_kit.course.lessons.models import SEED, StreamWarningNote, amp_pair, eager_amp_step, eager_step, \
    loss_fn, make_batches, make_model, make_opt
from cudagraph_kit.course.measuring import figures, results, verdicts
from cudagraph_kit.course.measuring.claims import save_claims, summary
from cudagraph_kit.course.measuring.correctness import PARITY_COLUMNS, param_diff, parity_row
from cudagraph_kit.course.measuring.measure import Measured, measure
from cudagraph_kit.course.measuring.verdicts import ADAM_DEFAULT, GRAPH, GRAPH_FUSED, MODEL_ONLY

STEM = "02_train_step"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the small CPU part runs
if SMOKE:
    SAMPLES, CALLS, PARITY_STEPS, AMP_STEPS, WINDOWS, WINDOW_PAUSE_S = 2, 5, 44, 22, 2, 0.0
TIMING = dict(windows=WINDOWS, samples=SAMPLES, calls=CALLS, pause_s=WINDOW_PAUSE_S, sample_ms=SAMPLE_MS)
WARM = {"warmup": 2}  # every variant is run before it is timed: 2 warm-up calls per window, not 50 ms of them
DEVICE = "cuda" if CUDA else "cpu"
WHERE = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only, no graphs)"
torch.manual_seed(SEED)
print(env_table())
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run trains the small MLP eagerly on the\n"
          ">>> CPU (the kit's eager_fallback, labelled 'eager'); the findings shown are the recorded GPU run's.")

# %% [markdown]
# ## 1. The workload
# Two sizes of the same two-layer network with dropout: the blog's (batch 32, 128 → 256 → 16) and the PyTorch
# docs' (batch 640, 4096 → 2048 → 1024). The data is a learnable regression task, cut into epochs of 10 full
# batches and one **short last batch** of 8, as a data loader without `drop_last` produces. The builders
# (`make_model`, `make_opt`, `make_batches`) are in
# [`cudagraph_kit/course/lessons/models.py`](../cudagraph_kit/course/lessons/models.py).

# %%
SIZES = {"32x128x256x16": (32, 128, 256, 16), "640x4096x2048x1024": (640, 4096, 2048, 1024)}
if not CUDA:
    SIZES = {"32x128x256x16": SIZES["32x128x256x16"]}  # the big one is minutes of CPU time per run
N, D_IN, H, D_OUT = SIZES["32x128x256x16"]
batches = make_batches(PARITY_STEPS, N, D_IN, D_OUT)
print(make_model(D_IN, H, D_OUT))
print(f"{len(batches)} batches, sizes: {sorted({len(x) for x, _ in batches}, reverse=True)}")

# %% [markdown]
# ## 2. Capture a whole training step by hand
# Everything the graph touches must live at fixed addresses, so the recipe is:
# 1. **Static batch tensors** `static_x`, `static_y`: every batch is *copied into* them.
# 2. **Warm up on a side stream**: a few real steps create the optimizer state and initialize cuBLAS outside
#    the graph.
# 3. **`zero_grad(set_to_none=True)` right before capture**, so the captured backward *allocates* the `.grad`
#    tensors from the graph's private memory (its [pool](../docs/GLOSSARY.md)). Every replay writes fresh
#    gradients into them: no `zero_grad` is needed in the loop.
# 4. **Capture** forward, loss, backward and `optimizer.step()` under `torch.cuda.graph`.
# 5. **Train**: per batch, `copy_` into the static tensors and `replay()`.
#
# Correct before fast: a copy of the network trains eagerly on the same batches, and the parameters are
# compared. The check uses the network *without dropout*, so that the comparison is exact.

# %%
full_batches = [b for b in batches if len(b[0]) == N][:20]
if CUDA:
    model = make_model(D_IN, H, D_OUT, dropout=False)
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    static_x = torch.zeros(N, D_IN, device="cuda")          # 1. static batch tensors
    static_y = torch.zeros(N, D_OUT, device="cuda")

    side = torch.cuda.Stream()                               # 2. warm-up: 3 real steps on a side stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, y in full_batches[:3]:
            static_x.copy_(x)
            static_y.copy_(y)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)

    opt.zero_grad(set_to_none=True)                          # 3. grads become graph-owned
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                            # 4. capture the whole step
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()

    for x, y in full_batches[3:]:                            # 5. one replay = one training step
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)  # the same 20 steps, eagerly
    for x, y in full_batches:
        eager_step(reference, ref_opt)(x, y)
    hand_diff = param_diff(model, reference)
    print(f"hand-written graph vs eager after {len(full_batches)} steps: max |param diff| = {hand_diff:.3g}")
    assert hand_diff < 1e-5
    del model, reference, opt, ref_opt, graph, static_loss
else:
    print("skipped: capturing a CUDA graph needs an NVIDIA GPU")

# %% [markdown]
# ## 3. The same with the kit
# In an ordinary training loop two or three lines change:
#
# ```python
# opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)      # (1) capturable optimizer
# step = capture_train_step(model, opt, loss_fn, sample_batch=(x0, y0))      # (2) build the step once
# for x, y in loader:
#     loss = step(x, y)                                                      # (3) one call = one step
# ```
#
# The first 3 calls are eager warm-up steps on a side stream, the 4th captures and replays, later calls copy the
# batch in and replay. A batch of another shape (the short last batch) runs an **eager** step on the same
# parameters. The returned loss is a GPU tensor: read it with `.item()` only when you log, since every `.item()`
# waits for the GPU. `capturable=True` keeps Adam's step count on the GPU, so that its update can be captured.
# Without CUDA, `eager_fallback=True` runs plain eager steps (`mode == "eager"`; the state stays `warmup`). The
# cell prints a line wherever what a call ran changes, read from the step's counters (`replays`, `eager_steps`).

# %%
model = make_model(D_IN, H, D_OUT)
step = capture_train_step(model, make_opt("SGD", model.parameters()), loss_fn, batches[0], eager_fallback=True)
counts, seen = lambda: (step.replays, step.eager_steps, step.warmup_steps), None   # what the step reports
for i, (x, y) in enumerate(batches[:12]):
    before, loss = counts(), step(x, y)
    grew = [now > then for now, then in zip(counts(), before)]
    ran = "replayed" if grew[0] else "eager: other shape" if grew[1] else "eager: warm-up" if grew[2] else "eager"
    if (len(x), ran) != seen:   # a line where something changes: warm-up, capture, a short batch
        print(f"call {i + 1:2d}: batch {len(x):2d} rows, {ran:18s} state={step.state:8s} loss={loss.item():.4f}")
    seen = (len(x), ran)
del model, step

# %% [markdown]
# ## 4. Training parity: eager vs whole-step graph
# Same seed, same batches (short ones included), `PARITY_STEPS` steps, trained once eagerly and once with
# `capture_train_step`. Without dropout the graph replays the same kernels on the same numbers, so the parameters
# should match to float32 rounding (the cell asserts a difference below 1e-5; with Adam the last bits can differ,
# and "Going further" F shows why). With dropout, both runs start from the same seed, and
# each replay draws new masks from the same generator in the same order as eager ("Going further" D explains how):
# the table shows whether the parameters and the per-step losses still match. Without a GPU the kit ran every step
# eagerly: these runs then compare eager with eager, so the recorded GPU run's parity rows are shown instead.

# %%
def train_eager(model, opt, batches):
    return torch.stack([eager_step(model, opt)(x, y).detach() for x, y in batches]).float().cpu()


def train_kit(model, opt, batches):
    step = capture_train_step(model, opt, loss_fn, batches[0], eager_fallback=True)
    return torch.stack([step(x, y) for x, y in batches]).float().cpu(), step


parity_rows, curves, adam_runs = [], {}, None
for opt_name, dropout in [("SGD", False), ("Adam(capturable)", False), ("SGD", True)]:
    base = make_model(D_IN, H, D_OUT, dropout=dropout)
    ref, test = copy.deepcopy(base), copy.deepcopy(base)
    torch.manual_seed(SEED)
    ref_losses = train_eager(ref, make_opt(opt_name, ref.parameters()), batches)
    torch.manual_seed(SEED)
    losses, step = train_kit(test, make_opt(opt_name, test.parameters()), batches)
    case = f"parity MLP {N}x{D_IN}x{H}x{D_OUT}, {opt_name}, {'dropout' if dropout else 'no dropout'}"
    parity_rows.append(parity_row(case, ref, test, base, ref_losses, losses, step, dropout))
    curves[case] = (ref_losses, losses, step.mode)
    adam_runs = (base, ref, test, step) if opt_name.startswith("Adam") else adam_runs  # "Going further" F
    assert dropout or parity_rows[-1]["max_abs_param_diff"] < 1e-5, parity_rows[-1]  # without dropout: like eager
parity = pd.DataFrame(parity_rows)
rec = None if CUDA else results.load(STEM)        # no GPU: the recorded GPU run's parity rows
shown = parity if CUDA else rec.df[rec.df.case.isin(parity.case)] if rec else parity.iloc[0:0]
print(f"{'This run, on ' + WHERE if CUDA else getattr(rec, 'caption', 'No recorded run')}: {shown.steps.max():.0f} steps")
display(shown[list(PARITY_COLUMNS)].rename(columns=PARITY_COLUMNS).style.hide(axis="index").format(
    {"largest parameter difference": "{:.1e}"}, precision=4))

# %% tags=["nbval-check-output"]
fig_loss = figures.loss_curves(curves, f"Same seed, same batches: eager vs graphed training on {WHERE}")

# %% [markdown]
# Where Adam's parameters differ in the last bits ("bitwise equal" says whether they do, "largest parameter
# difference" by how much), the cause is that the
# graphed step reads its learning rate from a GPU tensor (so a scheduler can change it between replays) while the
# eager loop passes a Python number; "Going further" F tests that.
#
# ## 5. Time per step: eager vs whole-step graph vs graphing the model only
# Three ways to run the same step, each on its own copy of the network:
# - **eager**: the ordinary loop (`zero_grad`, forward, loss, `backward`, `step`);
# - **whole-step graph**: `capture_train_step` (the time includes copying the batch in and the loss out);
# - **make_graphed_callables (model only)**: `cudagraph_kit.partial.graph_modules(model, (x,))` calls
#   `torch.cuda.make_graphed_callables`, which captures the model's forward and backward as two graphs; the
#   loss, `zero_grad` and the optimizer step stay eager. ("Going further" A shows the plain PyTorch call.)
#
# In the Adam cases every variant uses `Adam(capturable=True)`, so both sides run the same algorithm; one more row
# times the default eager `Adam()` ("Going further" B says why). The table below shows the SGD rows and five
# verdicts; "Going further" C has the Adam rows and every verdict. As in notebook 01, `measure` times
# [windows](../docs/GLOSSARY.md) a pause apart and quotes each speedup with its 90% prediction interval; the
# last window reads the [floor](../docs/GLOSSARY.md).

# %%
step_cases = {}  # case -> (variants, (x, y), options), as measure() takes them
stream_note = StreamWarningNote()   # a warning autograd gives once: gradients met on two streams ("Going further" H)
with stream_note.watch("section 5's make_graphed_callables rows", f"MLP {next(iter(SIZES))}, SGD"):
    for size, (n, d_in, h, d_out) in SIZES.items():
        x, y = torch.randn(n, d_in, device=DEVICE), torch.randn(n, d_out, device=DEVICE)
        for opt_name in ["SGD", "Adam(capturable)"]:
            copies = [make_model(d_in, h, d_out) for _ in range(4)]   # the same seed: the same start
            variants = {"eager": eager_step(copies[0], make_opt(opt_name, copies[0].parameters())),
                        GRAPH: capture_train_step(copies[1], make_opt(opt_name, copies[1].parameters()), loss_fn,
                                                  (x, y), eager_fallback=True)}
            if CUDA:
                partial = graph_modules(copies[2], (x,))  # warms up and captures on its own side streams
                variants[MODEL_ONLY] = eager_step(partial, make_opt(opt_name, partial.parameters()))
                if opt_name.startswith("Adam"):  # what an ordinary eager loop would use: Adam's defaults
                    variants[ADAM_DEFAULT] = eager_step(copies[3], torch.optim.Adam(copies[3].parameters(), lr=1e-3))
            for fn in variants.values():  # the whole-step graph captures on its 4th call: all warm before timing
                for _ in range(4):
                    fn(x, y)
            step_cases[f"MLP {size}, {opt_name}"] = (variants, (x, y), WARM)
m = measure(step_cases, **TIMING, verdicts=verdicts.train_step)
timing = m.table  # every column (the exercises read it)
results.show(m.part(cases=r", SGD$", claims=[  # SGD's rows; the Adam rows and every verdict: "Going further" C
    "graph_beats_eager_small_sgd", "model_only_beats_eager_small_sgd", "graph_beats_model_only_small_sgd",
    "graph_beats_eager_docs_sgd", "graph_within_floor_docs_sgd"]), STEM)   # no GPU: the recorded GPU run's

# %%
fig_time = results.shown(figures.step_times(timing, f"Training step time on {WHERE}",
                                            {"eager": "C0", GRAPH: "C1", MODEL_ONLY: "C2", ADAM_DEFAULT: "C4"}),
                         STEM, "step_time")   # without a GPU: the recorded run's figure

# %% [markdown]
# **What graphing only the model can save.** `make_graphed_callables` removes the launches of the model's forward
# and backward, but the loss, autograd's bookkeeping, `zero_grad` and the optimizer step still launch one kernel
# at a time. The whole-step graph replaces every launch with one. A graph time near its floor means the GPU is
# busy for nearly the whole step: no launch trick can make it much faster.
#
# ## 6. Mixed precision (AMP) through `capture_train_step`
# `capture_train_step(..., amp_dtype=...)` runs the forward under `torch.autocast(cache_enabled=False)`: with the
# cache on, a weight cast cached before the capture would be read by every replay instead of being recast.
# - **bf16** needs compute capability 8.0 or newer (bf16 tensor cores); the kit's `bf16_supported()` checks that.
#   (`torch.cuda.is_bf16_supported()` also says True on a T4, which only emulates bf16.)
# - **fp16 + `torch.amp.GradScaler("cuda")`** everywhere else (the T4 path): the graph captures the forward and
#   the scaled backward; `scaler.step` and `scaler.update` run eagerly after each replay. With a plain optimizer
#   `scaler.step` reads on the CPU whether a gradient was inf (a synchronization every step); with
#   `fused=True` that check stays on the GPU. So fp16 is timed with `SGD` and with `SGD(fused=True)`.
#
# Each case: parity with the eager AMP loop first, then eager vs whole-step graph timed as in section 5.

# %%
AMP_CASES = []
if not CUDA:
    print("skipped: AMP through a CUDA graph needs an NVIDIA GPU.")
elif bf16_supported():  # compute capability >= 8.0: bf16 tensor cores
    AMP_CASES.append(("bf16", torch.bfloat16, False))
else:
    print(f"bf16 skipped: bf16_supported() is False on {WHERE} (or CUDAGRAPH_KIT_NO_BF16=1 is set)")
if CUDA:
    AMP_CASES.append(("fp16 + GradScaler", torch.float16, True))

amp_parity_rows, amp_cases = [], {}
x, y = torch.randn(N, D_IN, device=DEVICE), torch.randn(N, D_OUT, device=DEVICE)
for label, dtype, use_scaler in AMP_CASES:
    graphed_opts = {GRAPH: "SGD"} | ({GRAPH_FUSED: "SGD(fused=True)"} if use_scaler else {})
    for opt_name in graphed_opts.values():  # parity first: the graphed AMP step must train like the eager one
        base = make_model(D_IN, H, D_OUT, dropout=False)
        ref, ref_step, test, step = amp_pair(base, opt_name, dtype, use_scaler, batches[0])
        ref_losses = torch.stack([ref_step(xb, yb) for xb, yb in batches[:AMP_STEPS]]).float().cpu()
        losses = torch.stack([step(xb, yb) for xb, yb in batches[:AMP_STEPS]]).float().cpu()
        case = f"parity MLP {N}x{D_IN}x{H}x{D_OUT}, {opt_name}, AMP {label}, no dropout"
        amp_parity_rows.append(parity_row(case, ref, test, base, ref_losses, losses, step, False))
        print(f"AMP parity, {label}, {opt_name}: max |param diff| graph vs eager = "
              f"{amp_parity_rows[-1]['max_abs_param_diff']:.3g}")
        assert amp_parity_rows[-1]["max_abs_param_diff"] < 1e-4, "the graphed AMP step must train like eager"
    base = make_model(D_IN, H, D_OUT, dropout=False)
    variants = {"eager": amp_pair(base, "SGD", dtype, use_scaler, (x, y))[1]}  # the eager step of a pair
    variants |= {name: amp_pair(base, o, dtype, use_scaler, (x, y))[3] for name, o in graphed_opts.items()}
    for fn in variants.values():
        for _ in range(4):
            fn(x, y)
    amp_cases[f"MLP {N}x{D_IN}x{H}x{D_OUT}, SGD, AMP {label}"] = (variants, (x, y), WARM)
amp_parity = pd.DataFrame(amp_parity_rows)
amp = measure(amp_cases, **TIMING, verdicts=verdicts.amp_step) if amp_cases else None
amp_timing = amp.table if amp else timing.iloc[0:0]  # the exercises read it
results.show(amp, STEM, verdicts.amp_step)   # without a GPU: the recorded AMP rows and verdicts

# %% [markdown]
# The fp16 rows get no floor: the scaler's part runs eagerly after each replay, outside the graph. Skipping the
# synchronization does not by itself make a step faster: where the host takes longer than the GPU, the GPU has
# usually finished by the time the host waits for it.
#
# ## 7. Side by side with the published K80 figure and a reference run
# The published figure comes from a 2021 blog post in Japanese by the GitHub user shu65 ("Measuring the
# performance of CUDA Graphs, new in PyTorch 1.10") and its notebook,
# [shu65/blog-pytorch-notebooks: pytorch_CUDA_Graphs.ipynb](https://github.com/shu65/blog-pytorch-notebooks/blob/main/pytorch_CUDA_Graphs.ipynb):
# 10 iterations timed with `time.time()` on a Tesla K80 (PyTorch 1.10, CUDA 11.1); its eager loop never zeroed
# the gradients and its warm-up was not on a side stream (this notebook fixes both). The reference columns are
# this project's own run of plain PyTorch (no kit code) on an NVIDIA H100 80GB HBM3 with PyTorch 2.11
# (2026-11-22), median of 5 repeats; NaN marks a figure that was not published.

# %%
# NBVAL_CHECK_OUTPUT
REFERENCE = pd.DataFrame([  # (case, variant, K80 eager, K80 graph, H100 eager, H100 graph, H100 floor), µs
    ("MLP 32x128x256x16, SGD", GRAPH, 1110, 471, 911, 70.9, 63.6),
    ("MLP 32x128x256x16, Adam(capturable)", GRAPH, None, None, 1376, 126, 117),
    ("MLP 32x128x256x16, SGD", MODEL_ONLY, None, None, 911, 522, None),
    ("MLP 640x4096x2048x1024, SGD", GRAPH, None, None, 976, 922, 910),
    ("MLP 640x4096x2048x1024, Adam(capturable)", GRAPH, None, None, 1407, 1221, 1205),
], columns=["case", "variant", "K80 eager µs", "K80 graph µs", "H100 ref eager µs", "H100 ref graph µs",
            "H100 ref floor µs"]).astype({c: float for c in ["K80 eager µs", "K80 graph µs"]})
REFERENCE["K80 speedup"] = REFERENCE["K80 eager µs"] / REFERENCE["K80 graph µs"]
REFERENCE["H100 ref speedup"] = REFERENCE["H100 ref eager µs"] / REFERENCE["H100 ref graph µs"]
print(REFERENCE.drop(columns=["K80 speedup", "H100 ref speedup"]).round(2).to_string(index=False))   # speedups: below

# %%
rec = None if CUDA else results.load(STEM)        # no GPU: the recorded GPU run's rows
now = m.short() if CUDA else Measured(rec.df).short(cuda=True) if rec else None
if now is not None:
    print("This run:" if CUDA else f"{rec.caption}:")
    display(REFERENCE[REFERENCE.case.str.endswith("SGD")][["case", "variant", "K80 speedup", "H100 ref speedup"]].merge(
        now[["case", "variant", "median (µs)", "speedup", "90% interval"]], on=["case", "variant"]).round(2))

# %% [markdown]
# **Why the numbers differ.** An eager step of the small network is mostly the CPU's cost of launching its
# kernels, and CPUs did not get much faster per launch, while GPUs did. On the K80 the graphed small step still took
# about 40% of the eager step (the published times), so the graph could only remove the gaps; on an H100 the same
# kernels take tens of microseconds, so the graph removes most of the step. The H100 reference ran on another host:
# its eager step, and so its ratios, move with that host's CPU, and can sit outside this run's intervals. At the docs size the GPU's work (the floor) grows toward
# the host's time to issue the step, and a graph can save at most the gap between the two; the takeaways below
# give this run's verdict.
#
# ## 8. Takeaways
# Numbered from this run on a GPU; without one, from the recorded GPU run (named above them).

# %%
TAKEAWAYS = [
    "A whole training step, optimizer included, can be one CUDA graph: static batch tensors, side-stream warm-up, "
    "`zero_grad(set_to_none=True)` before capture, then `copy_` + `replay()` per batch.",
    "It trains like the eager loop: the same parameters where the arithmetic is the same; dropout draws fresh "
    "masks on every replay.",
    "Graph the whole step, not only the model: on the small network the whole-step graph was "
    "{graph_beats_eager_small_sgd} faster than eager and {graph_beats_model_only_small_sgd} faster than "
    "`make_graphed_callables`.",
    "Where the GPU's work fills the step (the docs size), a graph can only remove the gaps between kernels: "
    "{graph_beats_eager_docs_sgd:statement}.",
    "AMP is captured the same way: bf16 on compute capability 8.0 or newer, else fp16 with the scaler's step after "
    "each replay; how much of the gain each keeps is in section 6's table.",
]
claims = m.claims + (amp.claims if amp else [])
results.show_takeaways(STEM, claims, TAKEAWAYS);

# %% [markdown]
# ## Going further (optional)
# A. the plain `make_graphed_callables` call; B. the baseline for Adam; C. every verdict of this run; D. dropout
# inside a graph; E. saving the results; F. Adam's last bits; G. where the time of an eager step goes; H. the
# `AccumulateGrad` warning. The exercises follow.
#
# ### A. The plain `make_graphed_callables` call
# `torch.cuda.make_graphed_callables(module, sample_args)` warms the module up, captures its forward and backward
# as two graphs, and returns the module with its forward replaced: a drop-in part of an autograd training loop.
# Its rules (from its docstring): each sample tensor's `requires_grad` must match the real input's; real inputs
# come in the sample's order and shape; under autocast it needs `cache_enabled=False`; no module hooks. The
# kit's `graph_modules` calls the same function and turns those rules into checks. The cell graphs a copy of
# the small network and checks its output and gradients against eager on a new batch.

# %%
if CUDA:
    eager_model = make_model(D_IN, H, D_OUT, dropout=False)
    plain_model = copy.deepcopy(eager_model)
    sample_x = torch.randn(N, D_IN, device="cuda")             # a data batch: requires_grad=False, as in training
    with stream_note.watch("the plain make_graphed_callables cell", f"MLP {N}x{D_IN}x{H}x{D_OUT}, SGD"):
        plain_model = torch.cuda.make_graphed_callables(plain_model, (sample_x,))
        x_new, y_new = torch.randn(N, D_IN, device="cuda"), torch.randn(N, D_OUT, device="cuda")
        outputs = {}
        for name, module in {"eager": eager_model, "make_graphed_callables": plain_model}.items():
            out = module(x_new)
            loss_fn(out, y_new).backward()                    # autograd runs the captured backward graph
            outputs[name] = out.detach().clone()
    torch.testing.assert_close(outputs["make_graphed_callables"], outputs["eager"])
    for a, b in zip(plain_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    plain_grad_err = max((a.grad - b.grad).abs().max().item()
                         for a, b in zip(plain_model.parameters(), eager_model.parameters()))
    print(f"plain make_graphed_callables == eager on a new batch: output and gradients (largest gradient "
          f"difference {plain_grad_err:.1e})")
    del eager_model, plain_model, sample_x, outputs
else:
    plain_grad_err = None
    print("skipped: torch.cuda.make_graphed_callables needs an NVIDIA GPU")

# %% [markdown]
# ### B. Which eager Adam is the baseline
# In the Adam cases every variant, the `eager` row included, uses `Adam(capturable=True)` (foreach): the graph
# needs it, and with the same option on both sides the speedup measures what the launches cost and nothing else.
# An ordinary eager loop would use the default `Adam()` (`capturable=False`), which computes the bias corrections
# on the host instead of in GPU kernels; PyTorch's documentation warns that `capturable=True` can impair
# ungraphed performance. So the Adam cases time one more row, `default eager Adam (capturable=False)`, whose
# speedup is over the capturable eager row. (Notebook 04 uses the default AdamW as its eager baseline.)
#
# ### C. Every row and verdict of this run, and the recorded run beside it
# Sections 5 and 6 showed a part; here is every row and every verdict (without a GPU, the recorded run's).

# %%
for experiment in (m, amp):
    results.show(experiment, STEM, verdicts.amp_step if experiment is amp else None)
if CUDA:
    recorded = results.beside_recorded(STEM, pd.concat([timing, amp_timing], ignore_index=True))

# %% [markdown]
# ### D. Dropout inside a graph
# Dropout kernels draw their masks from PyTorch's Philox generator, addressed by a seed and an *offset*. An eager
# launch reads the generator's offset on the CPU and advances it. A replayed kernel cannot receive a new CPU
# value, so during capture PyTorch records each kernel's offset *relative to a per-graph base* and the total the
# graph consumes; before every replay it writes the generator's current offset into the graph's base-offset
# tensor on the GPU and advances the generator by that total. So the masks are **not frozen**: each replay draws
# new ones. Whether they coincide with the eager run's bit for bit depends on every random draw happening in the
# same order and amounts in both runs; where they do not, the masks come from the same distribution, so the loss
# *statistics* match while the individual losses do not. Section 4 printed which of the two happened here.
#
# ### E. Save the results
# One row per timed variant and one per parity run in `results.csv` (parity rows have no timings), the machine in
# `env.json`, the verdicts in `claims.csv`, and the figures as PNG, in `build/figures/02_train_step/` by default:
# running this notebook never overwrites the recorded GPU run in `figures/`. The cell of H saves again with G's rows.

# %%
FIGURES = {"loss_curves": fig_loss, "step_time": fig_time}
run_env = {"accumulate_grad_stream_warning": stream_note.raised_by, "amp_cases": [label for label, _, _ in AMP_CASES],
           "plain_make_graphed_callables_grad_err": plain_grad_err, "adam_tensor_hparams_check": None,
           "windows": WINDOWS}


def save_run(tables, claims):
    folder = results.save(STEM, pd.concat(tables, ignore_index=True), figures=FIGURES, extra_env=run_env)
    save_claims(folder, claims)
    return folder


folder = save_run([timing, amp_timing, parity, amp_parity], claims)
print("saved to", folder, f"(results.csv, env.json, claims.csv with {len(claims)} verdicts, figures)")

# %% [markdown]
# ### F. Adam's last bits
# Different implementations of one optimizer (the for-loop, `foreach` and `fused` ones, each with `capturable`
# on or off) order and round their arithmetic differently, so a graph compared with an eager optimizer built
# with other options differs for that reason alone. That is not the case in section 4: both runs use
# `torch.optim.Adam(..., capturable=True)` with PyTorch's default implementation for CUDA tensors, `foreach`;
# neither is `fused=True`, and there is no autocast and no convolution (cuDNN) in this network. One thing does
# differ. The graphed step reads its learning rate from a GPU tensor (that is how `capture_train_step` lets a
# scheduler change it between replays), and beta1 as well where this PyTorch's Adam can read it on the GPU; the
# eager loop passes Python numbers. With a tensor instead of a number, Adam's step calls other overloads of its
# `_foreach_*` kernels, and those may round the last bit differently. The cell below tests that explanation: it
# trains a third copy eagerly, with those hyper-parameters as the same GPU tensors on exactly the steps the graph
# replayed (every full batch after the warm-up; the warm-up and the short batches ran eagerly with Python
# numbers), and compares it with both runs.

# %%
def train_eager_like_replays(model, opt, batches, tensor_hparams, warmup):
    """The eager loop, with the hyper-parameters named in ``tensor_hparams`` ("lr", "betas") swapped for float32
    GPU tensors on the steps a graph would replay: full batches after ``warmup`` warm-up steps."""
    group = opt.param_groups[0]
    lr_t = torch.tensor(group["lr"], dtype=torch.float32, device=DEVICE)
    beta1_t = torch.tensor(group["betas"][0], dtype=torch.float32, device=DEVICE)
    for i, (xb, yb) in enumerate(batches):
        numbers = group["lr"], group["betas"]
        if i >= warmup and len(xb) == len(batches[0][0]):
            group["lr"] = lr_t if "lr" in tensor_hparams else group["lr"]
            group["betas"] = (beta1_t, numbers[1][1]) if "betas" in tensor_hparams else group["betas"]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        opt.step()
        group["lr"], group["betas"] = numbers


if CUDA and adam_runs is not None:
    a_base, a_ref, a_test, a_step = adam_runs
    # which hyper-parameters the captured step reads from GPU tensors: the kit's own record of them (internals)
    tensor_hparams = (["lr"] if (getattr(a_step, "_lr_tensors", None) or [None])[0] is not None else []) + \
        (["betas"] if "betas" in (getattr(a_step, "_live", None) or [{}])[0] else [])
    mirror = copy.deepcopy(a_base)
    torch.manual_seed(SEED)
    train_eager_like_replays(mirror, make_opt("Adam(capturable)", mirror.parameters()), batches, tensor_hparams,
                             a_step.warmup)
    adam_check = {"tensor_hparams": tensor_hparams, "graph_vs_eager_max_diff": param_diff(a_test, a_ref),
                  "graph_vs_tensor_eager_max_diff": param_diff(a_test, mirror),
                  "graph_equals_tensor_eager": all(torch.equal(p, q) for p, q in zip(a_test.parameters(),
                                                                                      mirror.parameters())),
                  "eager_vs_tensor_eager_max_diff": param_diff(a_ref, mirror)}
    run_env["adam_tensor_hparams_check"] = adam_check
    print(f"The graphed step reads {' and '.join(tensor_hparams) or 'nothing'} from GPU tensors. Max |param diff| "
          f"after {len(batches)} steps: graph vs eager {adam_check['graph_vs_eager_max_diff']:.3g}; graph vs eager "
          f"with the same tensors {adam_check['graph_vs_tensor_eager_max_diff']:.3g}; the two eager runs "
          f"{adam_check['eager_vs_tensor_eager_max_diff']:.3g}.")
    if adam_check["graph_vs_eager_max_diff"] == 0:
        print("The graphed Adam run equals the eager one bit for bit here: there is no difference to explain.")
    elif adam_check["graph_equals_tensor_eager"]:
        print("The graphed run equals, bit for bit, the eager run given the same GPU tensors on the same steps: the "
              "difference from the plain eager loop comes from passing those hyper-parameters as tensors.")
    else:
        print("The graphed run still differs from the eager run given the same tensors: passing them as tensors "
              "explains only part of the difference here, and this notebook does not say what explains the rest.")
else:
    print("skipped: Adam(capturable=True) and CUDA graphs need an NVIDIA GPU (on a CPU both runs are the same "
          "eager code)")

# %% [markdown]
# ### G. Where the time of an eager step goes
# How much of an eager step of the small network is GPU work? The rest is CPU work: Python (the module calls, the
# optimizer's loops), the dispatcher and the autograd engine, and the driver's launches. The GPU-busy time of the
# same kernels is the floor of the whole-step graph in section 5 (an eager row gets no floor of its own: the
# profiler records kernels launched one by one from Python as running longer than they do). To see where the rest
# goes, the parts of the step are timed separately (`cudagraph_kit.course.measuring.breakdowns.step_parts`), each on its own
# copy of the network and optimizer: the whole eager step; `zero_grad` alone (`set_to_none=True`: no kernel, pure
# Python); forward + loss; `zero_grad` + forward + loss + backward; `optimizer.step()` alone. Backward and the
# optimizer follow by difference. Parts timed separately do not add up exactly (caches, allocator state): read them
# as a breakdown, not as an exact sum. A part obtained by difference is the difference of two noisy medians: when
# the part is small next to that noise it can come out larger or smaller than the same part timed alone, or even
# negative, which means "within the noise", not a negative cost. So the breakdown is the median of the windows'
# differences, and the two verdicts per optimizer say, from the ratio of the two timings window by window, whether
# each part stands out of the noise.

# %%
from IPython.display import display  # noqa: E402

from cudagraph_kit.course.measuring.breakdowns import breakdown, step_parts  # noqa: E402
from cudagraph_kit.course.measuring.verdicts import part_claims  # noqa: E402

OPT_KEY = {"SGD": "sgd", "Adam(capturable)": "adam"}

xp, yp = torch.randn(N, D_IN, device=DEVICE), torch.randn(N, D_OUT, device=DEVICE)
OPT_LABEL = {"SGD": "SGD", "Adam(capturable)": "Adam (capturable=True)" if CUDA else "Adam (capturable=False)"}
part_cases = {f"eager step parts, MLP {N}x{D_IN}x{H}x{D_OUT}, {o}":
              (step_parts(make_model(D_IN, H, D_OUT), lambda ps, o=o: make_opt(o, ps), loss_fn, xp, yp),
               (xp, yp), WARM) for o in OPT_LABEL}
parts_m = measure(part_cases, **TIMING, progress=None)
appendix_claims = []
for opt_name, label in OPT_LABEL.items():
    case = f"eager step parts, MLP {N}x{D_IN}x{H}x{D_OUT}, {opt_name}"
    appendix_claims += part_claims(parts_m, case, OPT_KEY[opt_name], f"{label} step")
    b = breakdown(parts_m, case)
    whole, g = b.set_index("part").loc["whole eager step"], m.row(f"MLP {N}x{D_IN}x{H}x{D_OUT}, {opt_name}", GRAPH)
    if CUDA:
        print(f"\n{label}: whole eager step {whole['µs']:.0f} µs" + (
            f"; the GPU needs about {g.floor_us:.0f} µs for the same work (the whole-step graph's floor), so about "
            f"{1 - g.floor_us / whole['µs']:.0%} of the eager step is host work the GPU waits for"
            if g.floor_us == g.floor_us and g.floor_us > 0 else " (no GPU floor in this run)"))
        display(b.round(2))
if CUDA:
    _ = summary(appendix_claims)
else:
    print("No GPU here: the parts were timed on this CPU, which says nothing about a GPU step; the recorded GPU "
          "run's breakdown and verdicts are in figures/02_train_step (results.csv, claims.csv).")

# %% [markdown]
# ### H. The `AccumulateGrad` stream warning
# Autograd creates one `AccumulateGrad` node per parameter (the node that adds a gradient into `.grad`), on the
# stream that is current when it is created, and reuses that node for as long as something keeps it alive. When
# a backward produces a gradient on another stream than the node's, the engine synchronizes the two streams for
# that parameter and warns, once per process (`TORCH_WARN_ONCE`). `torch.cuda.make_graphed_callables` warms up
# and captures on side streams of its own and keeps the outputs of its forward capture, and with them the
# autograd graph built during capture, which holds the parameters' `AccumulateGrad` nodes created on that side
# stream. Every later eager backward through the graphed module runs on the default stream and accumulates
# through those nodes. The whole-step graph keeps no autograd graph alive after its capture (its loss is
# detached), and the eager loop stays on one stream. The cost is a few cross-stream event waits per step in the
# `make_graphed_callables` rows; results are unaffected. Silence it with
# `torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)` once you know where it comes from.
# Section 5's timing cell notes, through `StreamWarningNote` (`cudagraph_kit/course/lessons/models.py`), whether it
# came from its `make_graphed_callables` rows (the first in this process to make one), and shows any other warning
# as usual.

# %%
print("AccumulateGrad stream warning:", f"raised by {stream_note.raised_by[0]}" if stream_note.raised_by else
      "not raised in this run")
folder = save_run([timing, amp_timing, parts_m.table, parity, amp_parity], claims + appendix_claims)
print("saved again with the appendix:", folder, f"({len(claims) + len(appendix_claims)} verdicts)")


# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU a check verifies what it can there, such as your reasoning, counts and honest labels.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb02_train_step.py` (try
# first).

# %% tags=["nbval-check-output"]
from cudagraph_kit import compare
from cudagraph_kit.course.exercises.nb02_train_step import STEP_PARTS, check_amp_adam, check_lr_schedule, check_short_batches

# %% [markdown]
# ### Exercise 1: Adam with fp16 and a `GradScaler`
# Repeat the fp16 + `GradScaler` case of section 6 with `make_opt("Adam(capturable)", ...)` instead of SGD. First
# the parity run: one copy of a network without dropout trained by `eager_amp_step`, another by
# `capture_train_step(..., amp_dtype=torch.float16, scaler=torch.amp.GradScaler("cuda"))`, on
# `batches[:AMP_STEPS]`; record the largest parameter difference. Then eager against the whole-step graph in one
# `compare` (imported above). How much of the speedup remains, and which
# parts of the step (names from `STEP_PARTS`, printed below) still run eagerly after each replay? *The parity
# run and the timing need an NVIDIA GPU; the question does not.*

# %% tags=["nbval-check-output"]
still_eager = ...     # a set of names from STEP_PARTS
max_param_diff = ...  # graph vs eager AMP Adam after the same steps (GPU)
amp_adam_table = ...  # compare({"eager": ..., GRAPH: ...}, x, y, case=..., samples=SAMPLES, calls=CALLS) (GPU)
print("STEP_PARTS:", STEP_PARTS)

# %%
check_amp_adam(still_eager, amp_adam_table, max_param_diff, reference=amp_timing)

# %% [markdown]
# ### Exercise 2: a learning-rate schedule in a graphed loop
# Train the network without dropout twice on `batches`, once through `capture_train_step(...,
# eager_fallback=True)` and once with an eager loop, each with `torch.optim.lr_scheduler.StepLR(opt,
# step_size=10, gamma=0.5)` stepped after every training step; record the graphed run's learning rate after each
# step. Do the two runs end with the same parameters? Start with Adam and a Python-number lr; then try a tensor lr,
# and plain SGD.
#
# Hint: a hand-written graph replays its kernels with the arguments they were captured with, and a Python-number lr
# is such an argument: the scheduler changes `group["lr"]`, the replays never see it. `capture_train_step` handles
# this for optimizers that can read the lr from GPU memory (`Adam`/`AdamW` with `capturable=True`, `SGD` with
# `fused=True`): it keeps the lr in a GPU tensor and copies each new value in before a replay. You can also pass
# `lr=torch.tensor(..., device="cuda")` yourself; the schedulers update a tensor lr in place. Plain SGD reads the lr
# as a Python number inside its step, so `capture_train_step` refuses a schedule that changes it, and says how to
# fix it. On a CPU both runs are eager, so they agree
# whatever the lr; the check tells you what only a GPU run can show.

# %% tags=["nbval-check-output"]
graphed_model = ...  # trained through capture_train_step(..., eager_fallback=True), with the scheduler
eager_model = ...    # the same network, seed and schedule, trained by an eager loop
optimizer = ...      # the graphed run's optimizer
lrs = ...            # float(optimizer.param_groups[0]["lr"]) after each step of the graphed run

# %% tags=["nbval-check-output"]
check_lr_schedule(graphed_model, eager_model, optimizer, lrs)

# %% [markdown]
# ### Exercise 3: short batches, and what they cost
# A loader with `drop_last=False` ends each epoch with a short batch, and datasets of different sizes end with
# different ones. Build three epochs of batches of `N` rows from datasets of, say, 1000, 1010 and 990 rows. Before
# running: how many steps will run eagerly? Then run all of them through a new `capture_train_step(...,
# eager_fallback=True)` and read `short_step.eager_steps`. What do those eager steps cost, compared with graph
# replays? Use the `eager` and `whole-step graph` rows of `timing` (section 5, case "MLP 32x128x256x16, SGD"):
# eager steps × (eager µs − graph µs). How would you avoid that cost?

# %% tags=["nbval-check-output"]
short_batches = ...          # a list of (x, y) batches of several sizes
predicted_eager_steps = ...  # counted from the sizes, before running
short_step = ...             # the capture_train_step that all of short_batches ran through
extra_us = ...               # eager steps x (eager median_us - whole-step graph median_us)

# %% tags=["nbval-check-output"]
check_short_batches(short_batches, predicted_eager_steps, short_step, extra_us, timing)
