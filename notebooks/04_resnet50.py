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
# **What this adds to the picture:** notebooks 01-03 graphed small functions. A real network has hundreds of
# kernels per call, and a real training loop has an LR schedule, clipping and mixed precision. Three published
# experiments use ResNet-50: [MXNet PR #19142](https://github.com/apache/mxnet/pull/19142) (fp16 inference),
# [timm PR #1271](https://github.com/huggingface/pytorch-image-models/pull/1271) (AMP training, with accuracy
# parity as the point) and Alibaba's TorchAcc guide (synthetic-data training). This notebook runs them on
# torchvision's `resnet50` with random weights (nothing is downloaded), and trains a small CNN on a real data set.
#
# **What you'll learn**
# - How much a graph saves for ResNet-50 inference from batch 1 to 128, and why the gain shrinks as the batch grows.
# - How to graph a whole AMP training step the way a real loop runs it, with the loop changed by three lines.
# - How to check that the graphed run reaches the same validation accuracy as the eager one.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU; a T4 has no bf16 tensor
# cores, so the notebook trains in fp16 + `GradScaler` there). Without a GPU the notebook runs a tiny eager version
# on the CPU (ResNet-18 at 32×32, clearly labelled), says so, and shows the recorded GPU results.
#
# **How long**: 2.3 min on an NVIDIA H200 (measured by `reproduce`, 2026-11-29); a T4 has not been timed yet; about
# a minute on a CPU (tiny sizes).

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
SMOKE = None            # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)
WINDOWS = 8             # timing windows, a pause apart: every interval and verdict comes from them
SAMPLES = 2             # timing rounds per window (one sample of every variant per round)
CALLS = None            # calls per inference sample; None lets the kit's timing choose by time
WINDOW_PAUSE_S = 0.5    # seconds between windows
PAYS = 1.10             # "the graph pays": more than 10% faster than eager (speedup above 1.10)
INFER_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
TRAIN_BATCHES = [32, 128]
PARITY_EPOCHS = 10      # epochs of the accuracy-parity runs (digits)
ACCUMULATE_EPOCHS = 2   # epochs of the gradient-accumulation check (digits)
LOADER_BATCH = 64       # appendix, data feeding (TorchAcc's batch size)
LOADER_STEPS = 10       # batches timed per data-feeding measurement, in each window
LOADER_WORKERS = 6      # DataLoader worker processes

# %%
import math

import pandas as pd
import torch
from IPython.display import display

from cudagraph_kit import bf16_supported, capture_train_step, env_table, has_cuda, usable_gpu_memory
from cudagraph_kit import capture
from cudagraph_kit.course.lessons import vision
from cudagraph_kit.course.measuring import breakdowns, correctness, figures, results, verdicts
from cudagraph_kit.course.measuring.claims import save_claims, summary, versus
from cudagraph_kit.course.measuring.measure import Measured, cuda_cleanup, joined, measure
from cudagraph_kit.course.measuring.verdicts import GRAPH_INFER, GRAPH_TRAIN

STEM = "04_resnet50"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the tiny CPU part runs
ARCH, IMAGE = "resnet50", 224
if SMOKE:  # tiny and clearly labelled: ResNet-50 at 224x224 takes seconds per step on a CPU
    ARCH, IMAGE = "resnet18", 32
    WINDOWS, SAMPLES, CALLS, WINDOW_PAUSE_S = 2, 2, 1, 0.0
    # training batch 8 on a GPU: with 2 images BatchNorm's batch statistics make a few steps on one repeated
    # batch chaotic, which amplifies AdamW's eager-vs-capturable rounding (batch 2 keeps the CPU run short)
    INFER_BATCHES, TRAIN_BATCHES = [1, 2], ([8] if CUDA else [2])
    PARITY_EPOCHS, ACCUMULATE_EPOCHS = 2, 1
    LOADER_BATCH, LOADER_STEPS, LOADER_WORKERS = 2, 3, 2
DEVICE = "cuda" if CUDA else "cpu"
BF16 = CUDA and bf16_supported()   # bf16 tensor cores: compute capability 8.0+ (a T4 only emulates bf16)
WHERE = torch.cuda.get_device_name(0) if CUDA else "CPU (eager only)"
SEED = 0
torch.manual_seed(SEED)
print(env_table())
print(f"\nmodel: torchvision {ARCH}, random weights, {IMAGE}x{IMAGE} images{' (a tiny stand-in)' * SMOKE}")
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run executes every experiment eagerly on\n"
          ">>> the CPU at tiny sizes (everything is labelled 'eager'); the findings shown are the recorded GPU run's.")


def build_model(dtype):
    return vision.build_model(ARCH, dtype, DEVICE, SEED)


def image_batch(n, dtype, seed=1):
    return vision.image_batch(n, IMAGE, dtype, DEVICE, seed)


# %% [markdown]
# ## 1. Inference: the MXNet experiment, batch 1 to 128
# The model in eval mode, `channels_last` memory format and fp16 weights and inputs, as in the MXNet experiment.
# The sweep uses the kit: `g = capture(infer, x)`, and `g(x)` copies and replays (a real caller has its input in
# some other tensor, so the graph's time includes that copy). Every graph is first checked against eager on a
# fresh input. Then `measure` times eager and graph at every batch size in `WINDOWS`
# [windows](../docs/GLOSSARY.md); the [verdicts](../docs/GLOSSARY.md) say at which batches the graph **pays** (its
# speedup interval lies above `PAYS`, more than 10% faster) and from which batch on it stops paying. The table shows
# batches 1, 32 and 128; the figure shows every batch, and "Going further" D every row and verdict. The table's
# [floor](../docs/GLOSSARY.md) is the GPU's own time for the call's kernels: no call can be faster.

# %%
INFER_DTYPES = {"fp16": torch.float16} if CUDA else {"fp32 (CPU)": torch.float32}  # fp16 convolutions: GPU only


def make_infer(model):
    def infer(x):
        with torch.no_grad():
            return model(x)
    return infer


infer_fns = {dname: make_infer(build_model(dtype)) for dname, dtype in INFER_DTYPES.items()}
infer_cases, checks = {}, []
for bs in INFER_BATCHES:  # capture and check every case first, then time them all
    for dname, dtype in INFER_DTYPES.items():
        infer = infer_fns[dname]
        g = capture(infer, image_batch(bs, dtype), eager_fallback=True)
        fresh = image_batch(bs, dtype, seed=100 + bs)
        out, ref = g(fresh).float(), infer(fresh).float()
        diff, tol = (out - ref).abs().max().item(), 1e-2 * ref.abs().max().item() + 1e-3
        assert torch.isfinite(ref).all() and diff <= tol, f"graph != eager at batch {bs}, {dname}: {diff} > {tol}"
        case = f"inference {dname} bs{bs}"
        infer_cases[case] = ({"eager": infer, GRAPH_INFER: g}, (fresh,))
        checks.append({"case": case, "dtype": dname, "batch": bs, "max_abs_diff": diff, "tolerance": tol})

m_infer = measure(infer_cases, windows=WINDOWS, samples=SAMPLES, calls=CALLS, pause_s=WINDOW_PAUSE_S,
                  verdicts=verdicts.resnet_inference(PAYS))
del infer_cases, infer_fns, g, fresh, infer, out, ref
cuda_cleanup()
inference = m_infer.table.merge(pd.DataFrame(checks), on="case")
inference.loc[inference.variant == "eager", "max_abs_diff"] = 0.0  # the reference itself
inference["section"], inference["images_per_s"] = "inference", inference.batch / (inference.median_us * 1e-6)
results.show(m_infer.part(r" bs(1|32|128)$", r"_bs(1|32|128)_graph_pays$|_pays_at_large_batches$"), STEM)  # or recorded
curve = breakdowns.inference_curves(inference, PAYS)
fig_infer = results.shown(figures.plot_inference(
    curve, INFER_BATCHES, PAYS, cuda=CUDA, title=f"{ARCH} inference, {IMAGE}x{IMAGE}, channels_last, eager vs CUDA "
                                                 f"graph on {WHERE}"), STEM, "inference_sweep")

# %% [markdown]
# An eager forward costs about `max(kernels × host time per kernel, floor)`: while the first term is the larger,
# the GPU waits for the CPU ([launch-bound](../docs/GLOSSARY.md)); once the [floor](../docs/GLOSSARY.md) is the
# larger, the CPU waits for the GPU. A graph launches all its kernels with one call, so it costs close to the
# floor at every batch, and its gain shrinks as the batch grows. ("Going further" A fits that model.)
#
# ## 2. Training: the timm and TorchAcc experiments, the way a real loop runs them
# An eager AMP training loop with the pieces real loops have, and the same loop with the whole step as one graph.
# The lines that change are marked; the scheduler stays as it was:
#
# ```python
# opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)        # (1) fused: reads a GPU LR
# sched = warmup_cosine(opt)
# step = capture_train_step(model, opt, loss_fn, sample_batch=(x0, y0),              # (2) build the step once
#                           amp_dtype=torch.bfloat16, max_grad_norm=1.0)
# for x, y in loader:
#     x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
#     loss = step(x, y)                      # (3) replaces zero_grad, autocast forward, backward, clip, opt.step
#     sched.step()
# ```
#
# TorchAcc advertised a 3-line change; the timm maintainer turned down the CUDA-graph pull request because the
# graph logic made "a mess of the train loop" and asked for a wrapper. `capture_train_step` is that wrapper. The
# LR schedule works because the step keeps each group's LR in a GPU tensor that the captured optimizer reads;
# "Going further" B says how each piece (schedule, clipping, bf16, fp16 with a `GradScaler`, accumulation, the
# short last batch) fits into a graph. Timed here: the bare AMP step (no clipping, no schedule) on synthetic data as
# TorchAcc used, SGD momentum and AdamW, each eager against the whole-step graph, their losses compared first.

# %% tags=["nbval-check-output"]
MAIN_AMP = ("bf16" if BF16 else "fp16+GradScaler") if CUDA else "fp32 (CPU)"
CHECK_STEPS = 6 if CUDA else 2  # with a GPU: 3 warm-up steps, the capture, 2 replays
loss_fn = torch.nn.CrossEntropyLoss()


def amps_at(bs):  # on a bf16 GPU the smallest batch also runs fp16 + GradScaler
    return [MAIN_AMP, "fp16+GradScaler"] if BF16 and bs == TRAIN_BATCHES[0] else [MAIN_AMP]


# %% tags=["nbval-check-output"]
def train_case(amp, bs, opt_name, x, y):
    """An eager step and a whole-step graph from the same weights; their losses compared before any timing."""
    m_eager, m_graph = vision.copies(vision.build_train_model(ARCH, DEVICE, SEED))
    scaler = (lambda: torch.amp.GradScaler("cuda")) if amp == "fp16+GradScaler" else (lambda: None)
    eager = vision.eager_train_step(m_eager, vision.make_optimizer(opt_name, m_eager.parameters(), False, CUDA),
                                    loss_fn, vision.AMP[amp], scaler(), DEVICE)
    step = capture_train_step(m_graph, vision.make_optimizer(opt_name, m_graph.parameters(), True, CUDA), loss_fn,
                              (x, y), amp_dtype=vision.AMP[amp], scaler=scaler(), eager_fallback=True)
    le, lg, rel = correctness.check_losses(eager, step, x, y, CHECK_STEPS)
    case = f"train {amp} bs{bs}, {vision.OPTIMIZERS[opt_name]}"
    check = {"case": case, "dtype": amp, "batch": bs, "optimizer": opt_name,
             "max_rel_loss_diff": rel, "losses_eager": " ".join(f"{v:.4f}" for v in le.tolist()),
             "losses_graph": " ".join(f"{v:.4f}" for v in lg.tolist())}
    return case, ({"eager": eager, GRAPH_TRAIN: step}, (x, y), {"calls": 1}), check


# %%
# A GPU with room for every case holds them all at once; a smaller one (a T4) takes one batch and optimizer at a time.
TRAIN_CASES = [(bs, opt) for bs in TRAIN_BATCHES for opt in vision.OPTIMIZERS]
roomy = not CUDA or usable_gpu_memory() >= 60 * 2**30
measured, train_checks = [], []
for group in ([TRAIN_CASES] if roomy else [[c] for c in TRAIN_CASES]):
    cases = {}
    for bs, opt in group:
        x, y = vision.train_batch(bs, IMAGE, DEVICE)
        for amp in amps_at(bs):
            case, spec, check = train_case(amp, bs, opt, x, y)
            cases[case] = spec
            train_checks.append(check)
    measured.append(measure(cases, windows=WINDOWS, samples=SAMPLES, pause_s=WINDOW_PAUSE_S))  # one call a sample
    del cases, x, y   # a smaller GPU frees this group's models before the next group's are built
    cuda_cleanup()
print(f"{len(train_checks)} cases: eager and graphed losses agree within "
      f"{100 * max(c['max_rel_loss_diff'] for c in train_checks):.2f}% over {CHECK_STEPS} steps (each: Going further C)"
      if CUDA else "No GPU: the kit ran eagerly, so there is no graph to check. " + vision.recorded_checks(
          results.load(STEM), "losses"))
m_train = joined(measured, verdicts.resnet_training(PAYS, vision.OPTIMIZERS))   # one table, its verdicts
training = m_train.table.merge(pd.DataFrame(train_checks), on="case")
training.loc[training.variant == "eager", "max_rel_loss_diff"] = float("nan")  # compared on the graph's row
training["section"], training["ms_per_step"] = "training", training.median_us / 1e3
training["images_per_s"] = training.batch / (training.median_us * 1e-6)
results.show(m_train.part(cases="SGD momentum", claims="sgdmomentum_graph_pays$"), STEM)   # AdamW: "Going further" D
fig_train = results.shown(figures.plot_training(
    training, GRAPH_TRAIN, footnote="Optimizers: " + "; ".join(vision.OPTIMIZERS.values()),
    title=f"{ARCH} training step, eager vs whole-step graph, on {WHERE}\n(graph rows: speedup, 90% interval)"),
    STEM, "training_throughput")

# %% [markdown]
# Where the losses differ by more than rounding, look at AdamW: its eager side runs with `capturable=False` and its
# graph with `capturable=True`, two implementations ("Going further" C lists every case).
#
# ## 3. Accuracy parity: the same training, eager and graphed
# The point of the timm table was that graphs change the speed, not the result. Here on a real data set that
# ships with scikit-learn (8×8 handwritten digits, 1,797 images; nothing is downloaded): a small CNN trained with
# `SGD(momentum=0.9, fused=True)`, a warm-up + cosine LR schedule stepped every batch, gradient clipping at norm
# 1.0, batch 32, a `DataLoader` that reshuffles every epoch (its short last batch runs eagerly in the graphed run).
# Three runs from the same seed, with cuDNN's deterministic convolutions: eager, eager again (what run-to-run
# equality looks like here; skipped on a CPU) and graphed. After every epoch, validation accuracy on the 20%
# held out.

# %% tags=["nbval-check-output"]
X_train, X_val, Y_train, Y_val = vision.digits_split(DEVICE)
DIGITS_BATCH, MAX_NORM = 32, 1.0
steps_per_epoch = math.ceil(len(X_train) / DIGITS_BATCH)
# %% tags=["nbval-check-output"]
def train_digits(graphed, epochs=PARITY_EPOCHS, accumulate=1):
    """The training loop; `graphed` switches the three lines shown in section 2."""
    model = vision.small_cnn(DEVICE, SEED)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=CUDA)
    total = epochs * steps_per_epoch // accumulate
    sched = vision.warmup_cosine(opt, total, warmup=max(1, total // 10))
    step, calls, losses, lrs, accs = None, 0, [], [], []
    loader = vision.digits_loader(X_train, Y_train, DIGITS_BATCH, seed=1, pin_memory=CUDA)
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
        accs.append(vision.accuracy(model, X_val, Y_val))
    return {"model": model, "losses": torch.stack(losses).float().cpu(), "lrs": lrs, "accs": accs, "step": step}


# %%
runs = vision.deterministic_runs(train_digits, [("eager", False)] + ([("eager, again", False)] if CUDA else [])
                                 + [("graphed", True)])
g_step = runs["graphed"]["step"]
graph_label = "graphed" if g_step.mode == "graph" else "kit, eager fallback (no CUDA)"
assert runs["eager"]["lrs"] == runs["graphed"]["lrs"], "the LR schedules differ"
diff, bitwise = correctness.compare_params(runs["eager"]["model"], runs["graphed"]["model"])
print(f"graphed run: {g_step.replays} replays, {g_step.eager_steps} eager steps. LR schedule identical in both runs; "
      f"final parameters, graphed vs eager: max |diff| {diff:.3g}, bitwise equal: {bitwise}" if CUDA else
      "No GPU: the 'graphed' run ran eagerly. " + vision.recorded_checks(results.load(STEM), "parity"))
labels = {name: graph_label if name == "graphed" else name for name in runs}
parity_acc = pd.DataFrame({"epoch": range(1, PARITY_EPOCHS + 1), **{labels[k]: r["accs"] for k, r in runs.items()}})
fig_parity = figures.plot_parity({labels[k]: runs[k]["losses"].numpy() for k in ("eager", "graphed")},
                                 {labels[k]: runs[k]["accs"] for k in ("eager", "graphed")},
                                 f"Digits CNN, warm-up + cosine LR, clipping at {MAX_NORM}: eager vs graphed")
parity_acc

# %% [markdown]
# The line above the table compares the graphed run's final parameters with the eager run's, value by value: the
# largest difference, and whether every bit is equal.
#
# ## 4. Side by side with the published figures
# [MXNet PR #19142](https://github.com/apache/mxnet/pull/19142) (V100 16 GB, GluonCV ResNet50_v2, fp16
# inference); [pytorch/benchmark issue #706](https://github.com/pytorch/benchmark/issues/706) (V100, torchvision
# ResNet-50, fp32 training); TorchAcc (Alibaba's ResNet-50 guide; A100 80 GB, synthetic images, batch 64, AdamW);
# [timm PR #1271](https://github.com/huggingface/pytorch-image-models/pull/1271) (8 GPUs, AMP + channels_last; on
# an A100 eval top-1 59.30 eager and 59.20 graphed, on a V100 43.13 and 42.66). Each published speedup beside this
# run's at the same batch, on one GPU; "not measured" where this run timed no such batch or optimizer (the
# published times, and a plain PyTorch run without the kit, are in "Going further" D):

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
PUBLISHED["reference"] = PUBLISHED["published setup"].str.endswith("(reference)")   # no kit code: Going further D

# %%
rec = None if CUDA else results.load(STEM)        # no GPU: the recorded GPU run's rows
table = pd.concat([m_infer.table, m_train.table]) if CUDA else rec.df if rec is not None else m_infer.table.iloc[0:0]
print("This run:" if CUDA else f"{rec.caption}:" if rec is not None else "No recorded GPU run found.")
PUBLISHED["speedup (90% interval)"] = vision.this_run_speedups(table, PUBLISHED, GRAPH_INFER, GRAPH_TRAIN)
PUBLISHED[~PUBLISHED.reference].drop(columns=["reference", "published eager ms", "published graph ms"]).round(2)

# %% [markdown]
# **Why they differ.** The gain is the host time a graph removes, over the time the GPU needs anyway. On the V100
# of the MXNet run the graph saved only a small part of the eager time at batch 1 (the table's first row, as
# published). A Hopper GPU finishes the same kernels several times faster while the host time per op stays, so
# the eager forward is [host-bound](../docs/GLOSSARY.md) up to larger batches and the graph gains far more. The shape
# is the same everywhere: the gain shrinks as the batch grows and fades once the GPU is busy.
#
# ## 5. Takeaways
# Numbered from this run on a GPU; without one, from the recorded GPU run (named above them).

# %%
dtype0, B0, amp0, T0 = vision.first_cases(table)   # from this run, or the recorded one
DT, AMP0 = verdicts.tag(dtype0), verdicts.tag(amp0)
TAKEAWAYS = [
    f"At batch {B0} a CUDA graph made ResNet-50 inference {{infer_{DT}_bs{B0}_graph_pays}} faster than eager: "
    "an eager forward of many small kernels is bound by the host's launches (\"Going further\" A counts them).",
    f"The gain shrinks as the batch grows, because the GPU's work grows and the host's does not: "
    f"{{infer_{DT}_pays_at_large_batches:statement}}.",
    f"A whole training step, optimizer included, is one graph with `capture_train_step`: the timed AMP step at "
    f"batch {T0} with SGD momentum was {{train_{AMP0}_bs{T0}_sgdmomentum_graph_pays}} faster than eager. Clipping "
    "and an LR schedule can go in the graph too (section 2's snippet); they were not timed here.",
    "A graph should change the speed, not the result: train one loop eagerly and graphed from the same seed and "
    "compare them epoch by epoch, as section 3 does.",
]
results.show_takeaways(STEM, m_infer.claims + m_train.claims, TAKEAWAYS);

# %% [markdown]
# ## Going further (optional)
# 0. the graph by hand, at batch 1; A. the host-time model of the inference curve; B. how each piece of a training loop fits into a graph; C.
# gradient accumulation, and every parity row; D. saving the results, every verdict, and the recorded run beside
# this one; E. whether the input pipeline keeps up with the graph. The exercises follow.
#
# ### 0. The graph by hand, at batch 1
# The recipe of notebook 01 (side-stream warm-up, static input, capture, copy + replay) applied to a 50-layer
# network; the kit's `capture` does the same steps.

# %%
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
# ### A. Why the curve has this shape
# An eager forward runs one op after another from Python. For each op the CPU runs Python, PyTorch's dispatcher
# and ATen's operator code and launches the kernel: host time that does not grow with the batch. The GPU's work
# does grow with the batch. So an eager call costs about `max(kernels × host time per kernel, floor)`: while the
# first term is the larger, the GPU waits for the CPU (launch-bound); once the floor is the larger, the CPU waits
# for the GPU (GPU-bound). A graph launches all its kernels with one call, so it costs close to the floor at every
# batch.
#
# The table estimates the eager host time per kernel where eager is most host-bound, at the smallest batch (eager
# time / kernels per call; everything the host spends per op, not the bare `cudaLaunchKernel`), and compares that
# model with the measured eager time at every batch. Host and GPU work overlap only in part, so the measurement
# need not follow the model exactly; the model is exact at the smallest batch by construction.

# %%
for dname, c in curve.items():
    if not CUDA:
        print(f"{dname} on the CPU: eager only, no floor and no kernel counts, so no host-time model")
        continue
    print(f"{dname}: eager host time per kernel {c['host_us']:.1f} µs (90% prediction interval "
          f"{c['span'][0]:.1f}-{c['span'][1]:.1f} µs), estimated at batch {c['eager'].index.min()}")
    display(c["model"])

# %% [markdown]
# ### B. How each piece of a training loop fits into a graph
# - **LR schedule.** A graph bakes Python numbers into its kernels, so an LR kept as a float would be frozen at
#   capture. The step keeps each group's LR in a GPU tensor that the captured optimizer reads and copies
#   `group["lr"]` into it before each replay; the scheduler keeps writing plain floats. That needs an optimizer
#   that reads a *tensor* LR on the GPU: `SGD(fused=True)` and `Adam`/`AdamW(capturable=True)` do. Plain `SGD`
#   passes the LR to its kernels as a host number, so the kit refuses a scheduler on it with an error naming the
#   fix, instead of training silently at a constant LR.
# - **Clipping.** `clip_grad_norm_(..., error_if_nonfinite=False)` computes the norm and scales the gradients on
#   the GPU (only the non-finite check would read the norm on the CPU), so it is captured.
# - **bf16** needs no loss scaling: forward, backward, clipping and the optimizer step are one graph.
# - **fp16 + `GradScaler`** (the T4 path). What reads the GPU from the CPU, in PyTorch's `torch/amp/grad_scaler.py`:
#   `scaler.scale` and `scaler.unscale_` do not (the inf check writes a GPU flag), nor does `scaler.update` (its
#   `_amp_update_scale_` reads the flags on the GPU). `scaler.step` depends on the optimizer. One without fused
#   scale handling (plain or `foreach` SGD and AdamW, the ones section 2 timed) goes through `_maybe_opt_step`, which
#   reads the found-inf flags with `.item()`: a host synchronization every step, which a capture cannot contain.
#   One built with `fused=True` sets `_step_supports_amp_scaling`: `scaler.step` hands it the scale and the
#   found-inf flag as GPU tensors and the fused kernel unscales and skips the update on the GPU, with no CPU read
#   (PyTorch's test `test_graph_scaling_fused_optimizers` captures `scaler.step` and `scaler.update` this way).
#   The kit keeps one design for every optimizer: its graph holds forward and `scaler.scale(loss).backward()`;
#   `scaler.unscale_` (before clipping, so the clip sees true gradients), the clipping, `scaler.step` and
#   `scaler.update` run eagerly after each replay. With section 2's non-fused optimizers that eager tail includes
#   the one synchronization of `_maybe_opt_step`; with a fused optimizer it is launches only.
# - **Gradient accumulation**: with `accumulate=k` each call is one micro-batch and every k-th call steps, one
#   graph per position in the window, in one memory pool. C below checks it.
# - **The short last batch** of an epoch has another shape: it runs as an eager step on the same parameters and
#   gradient buffers, and the graph continues afterwards.
#
#
# ### C. Gradient accumulation, and every parity row
# The same loop with `accumulate=4` (one optimizer step per 4 batches; the short batch
# of each epoch lands somewhere inside a window and runs eagerly), for `ACCUMULATE_EPOCHS` epochs, against the
# eager loop that divides each loss by 4 and steps every 4th batch.

# %%
acc_runs = vision.deterministic_runs(train_digits, [("eager", False), ("graphed", True)], epochs=ACCUMULATE_EPOCHS,
                                     accumulate=4)
acc_step = acc_runs["graphed"]["step"]
acc_diff, acc_bitwise = correctness.compare_params(acc_runs["eager"]["model"], acc_runs["graphed"]["model"])
acc_loss_diff = (acc_runs["eager"]["losses"] - acc_runs["graphed"]["losses"]).abs().max().item()
print(f"{acc_step}\ngraphs by window position: {sorted(acc_step.graphs)}; optimizer steps {acc_step.optimizer_steps}")
print(f"accumulate=4, graphed vs eager after {ACCUMULATE_EPOCHS} epoch(s): max |param diff| {acc_diff:.3g} "
      f"(bitwise equal: {acc_bitwise}), max |loss diff| {acc_loss_diff:.3g}")


def final(step, d, b, loss_diff):
    """One final-parameter comparison row of results.csv."""
    return {"variant": graph_label if step is not None else "eager", "max_abs_param_diff": d,
            "params_bitwise_equal": b, "max_abs_loss_diff": loss_diff,
            "executed_as": "cuda graph" if step is not None and step.mode == "graph" else "eager",
            "eager_steps": step.eager_steps if step is not None else float("nan"),
            "replays": step.replays if step is not None else float("nan")}


if "eager, again" in runs:
    d2, b2 = correctness.compare_params(runs["eager"]["model"], runs["eager, again"]["model"])
    print(f"final parameters, eager vs eager again: max |diff| {d2:.3g}, bitwise equal: {b2}")
for r in runs.values():
    r["executed_as"] = "cuda graph" if r["step"] is not None and r["step"].mode == "graph" else "eager"
finals = {"graphed vs eager": final(g_step, diff, bitwise,
                                    (runs["eager"]["losses"] - runs["graphed"]["losses"]).abs().max().item())}
if "eager, again" in runs:
    finals["eager again vs eager"] = final(None, d2, b2, (
        runs["eager"]["losses"] - runs["eager, again"]["losses"]).abs().max().item())
finals["accumulate=4, graphed vs eager"] = final(acc_step, acc_diff, acc_bitwise, acc_loss_diff)
parity = correctness.parity_rows(runs, labels, steps_per_epoch, finals)
print(f"section 2's training cases, eager vs graphed losses over {CHECK_STEPS} steps (the first step to 1e-3):")
for c in train_checks:
    print(f"  {c['case']}: within {100 * c['max_rel_loss_diff']:.2f}%")

# %% [markdown]
# ### D. Save, every verdict, and the recorded GPU run beside this one
# One table in `results.csv` (`build/figures/04_resnet50/` by default; only `reproduce` on a GPU publishes to
# `figures/`): the inference sweep (`section == "inference"`), the training steps (`"training"`) and the
# accuracy-parity runs (`"accuracy parity"`); E adds its data-feeding rows and saves again. The verdicts go to
# `claims.csv`. Then section 4's table in full: the published times, and the project's own plain PyTorch run on an
# H100 (no kit code, 2026-11-22) as a reference for the kit's speedups.

# %%
FIGURES = {"inference_sweep": fig_infer, "training_throughput": fig_train, "accuracy_parity": fig_parity}
claims = m_infer.claims + m_train.claims
all_rows = pd.concat([inference, training, parity], ignore_index=True).assign(arch=ARCH, image=IMAGE)
folder = results.save(STEM, all_rows, figures=FIGURES)
save_claims(folder, claims)
print("saved to", folder)
for experiment in (m_infer, m_train):   # every row and verdict of sections 1 and 2 (without a GPU: the recorded run's)
    results.show(experiment, STEM)
display(PUBLISHED.drop(columns="reference").round(2))   # every published row, with times
if CUDA:  # this GPU's times beside the recorded run's, case by case
    recorded = results.beside_recorded(STEM, pd.concat([m_infer.table, m_train.table], ignore_index=True))
else:  # this run's tiny CPU cases have no recorded twin: the recorded GPU table as it is
    recorded = results.show_recorded(STEM, columns=["case", "variant", "executed_as", "median_us", "speedup",
                                                    "speedup_lo", "speedup_hi", "floor_us", "val_acc"])

# %% [markdown]
# ### E. Can the input pipeline keep up with the graph?
# A graph makes the GPU side of a step fast, so the input pipeline can become the bottleneck. The usual remedies
# apply unchanged: a `DataLoader` with worker processes, `pin_memory=True`, `x.to("cuda", non_blocking=True)`;
# `step(x, y)` then copies the batch into the graph's static tensors on the GPU. TorchAcc's setup (batch 64, AdamW,
# synthetic `uint8` images that each worker generates as a decoder would hand them over), three measurements per
# window: **loader only** (iterate and copy to the GPU), **step only** (the graphed step on a batch already there)
# and **loader + step** (the real loop). A loader is a stream with a prefetch queue, not a call to repeat, so
# `workloads.feeding_windows` times `LOADER_STEPS` batches of a fresh epoch per window; the windows are combined as
# `measure` combines them. If the real loop takes about as long as its slower part, the two overlap, and the slower
# part is what limits throughput. In the timing table the cell prints last, `speedup` is relative to its first row,
# the loader alone: a value below 1 means slower than the loader.

# %%
from cudagraph_kit.intervals import combine_windows, prediction_interval
from cudagraph_kit.course.lessons import workloads
from cudagraph_kit.course.measuring.claims import Claim

feed_model = vision.build_train_model(ARCH, DEVICE, SEED)
feed_step = capture_train_step(feed_model, vision.make_optimizer("AdamW", feed_model.parameters(), True, CUDA),
                               loss_fn, vision.train_batch(LOADER_BATCH, IMAGE, DEVICE), amp_dtype=vision.AMP[MAIN_AMP],
                               scaler=torch.amp.GradScaler("cuda") if MAIN_AMP == "fp16+GradScaler" else None,
                               eager_fallback=True)
for _ in range(5):  # warm-up and capture before timing
    feed_step(*vision.train_batch(LOADER_BATCH, IMAGE, DEVICE, seed=3))
feed_mode = feed_step.mode
feed_case = (f"data feeding bs{LOADER_BATCH}, {GRAPH_TRAIN} ({feed_step.mode}), AdamW foreach capturable={CUDA}, "
             f"{LOADER_WORKERS} workers")
frames = workloads.feeding_windows(feed_step, LOADER_BATCH, LOADER_STEPS, IMAGE, LOADER_WORKERS, DEVICE, WINDOWS,
                                   WINDOW_PAUSE_S, feed_case)
m_feed = Measured(combine_windows(frames), frames)
loop_over_slower = prediction_interval(workloads.overlap(frames))  # the real loop's time over its slower part's
took = "data feeding: the real loop takes {lo:.2f}-{hi:.2f}x the time of its slower part alone"
feed_claims = [
    versus(m_feed, "feed_loader_faster_than_step", (feed_case, "loader only"), (feed_case, "step only"),
           subject="data feeding: the loader alone", than="the training step alone"),
    Claim("feed_loop_costs_15pct_over_slower_part", *loop_over_slower, above=1.15, subject="data feeding: the real loop",
          holds=f"{took}: more than 15% over it, so the loader and the step overlap poorly",
          fails=f"{took}: within 15% of it, so the loader and the step overlap", unclear=f"{took}: too close to 1.15x")]
bound = workloads.limited_by(frames, feed_claims[0].verdict)
m_feed.table["executed_as"] = ["cuda graph" if feed_mode == "graph" and v != "loader only" else "eager"
                               for v in m_feed.table.variant]
feed = m_feed.table.assign(section="data feeding", batch=LOADER_BATCH, bound_by=bound,
                           images_per_s=LOADER_BATCH / (m_feed.table.median_us * 1e-6))
del feed_model, feed_step
cuda_cleanup()
folder = results.save(STEM, pd.concat([all_rows, feed], ignore_index=True), figures=FIGURES)
save_claims(folder, claims + feed_claims)
print(f"throughput limited by: {bound}")
feed_findings = summary(feed_claims)
m_feed.short()


# %% [markdown]
# ## Exercises
# Each exercise extends the experiment above. Fill in its cell (every `...` is a placeholder that runs as it is),
# then run the check below it: ✔ right, ✘ off (with a hint), … not done yet. Parts that need an NVIDIA GPU say
# so (⏸); on a CPU a check verifies what it can there, such as correctness against eager and your arithmetic.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb04_resnet50.py` (try
# first).

# %% tags=["nbval-check-output"]
import numpy as np

from cudagraph_kit import compare
from cudagraph_kit.course.exercises.nb04_resnet50 import check_batch_prediction, check_clip_norms

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

# %% tags=["nbval-check-output"]
new_batch = ...          # an int between two of INFER_BATCHES, not one of them
predicted_speedup = ...  # from the sweep, before measuring
new_graph = ...          # capture(infer, image_batch(new_batch, dtype), eager_fallback=True)
new_table = ...          # compare({"eager": infer, GRAPH_INFER: new_graph}, x, case=..., samples=SAMPLES, calls=CALLS)
bound = ...              # "launch-bound" or "GPU-bound", from new_table

# %% tags=["nbval-check-output"]
check_batch_prediction(new_batch, predicted_speedup, new_graph, new_table, bound,
                       sweep=curve[next(iter(INFER_DTYPES))], sweep_batches=INFER_BATCHES)

# %% [markdown]
# ### Exercise 2: how often does clipping act, eager and graphed?
# Section 3 clips the gradients at `MAX_NORM` inside the graph. Run one epoch of its loop twice from the same
# seed, eagerly and graphed (like `train_digits(graphed, epochs=1)`, with the schedule over one epoch), and record
# the gradient norm before clipping at every step: in the eager loop the value that
# `torch.nn.utils.clip_grad_norm_` returns, in the graphed loop `step.grad_norm` after each call. Do the two agree?
# On what share of the steps did clipping act (norm above `MAX_NORM`)? Careful: a graph writes the norm of every
# replay into the same tensor, as it does with every output (notebook 01, section 2). Section 3's pieces, by name:

# %% tags=["nbval-check-output"]
warmup_cosine = vision.warmup_cosine   # warmup_cosine(opt, total, warmup)


def small_cnn():
    return vision.small_cnn(DEVICE, SEED)


def digits_loader(seed):
    return vision.digits_loader(X_train, Y_train, DIGITS_BATCH, seed, pin_memory=CUDA)


# %% tags=["nbval-check-output"]
norms_eager = ...       # one norm per step of the eager epoch
norms_graphed = ...     # one norm per step of the graphed epoch
clipped_fraction = ...  # the share of graphed steps whose norm is above MAX_NORM

# %% tags=["nbval-check-output"]
check_clip_norms(norms_eager, norms_graphed, clipped_fraction, max_norm=MAX_NORM, steps=steps_per_epoch)
