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
# # 05 · What breaks a CUDA graph, how to find it before it breaks, and how to prove a graph is right
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cudagraph-kit/cudagraph-kit/blob/main/notebooks/05_pitfalls.ipynb)
#
# A [CUDA graph](../docs/GLOSSARY.md) records GPU work once and [replays](../docs/GLOSSARY.md) it. Everything that is *not* GPU work is left behind at
# [capture](../docs/GLOSSARY.md): Python numbers, `if` decisions, values read on the CPU, the shapes of that one call. Some mistakes make
# the capture fail with a cryptic CUDA error; the worse ones capture fine and then compute the wrong thing, silently.
#
# **What you'll learn**
# - Which mistakes *raise* (and how to read the error) and which are *silently wrong*.
# - `check_capturable(fn, *args)`: run a function eagerly with checks switched on, **before** capturing, and get
#   each problem with the line of your code that causes it.
# - `verify(graphed, reference, *args)`: replay a graph against eager on fresh inputs and get the first
#   divergence: the tool for the silent failures.
# - `advise(fn, *args)`: will a graph help at all? Its predictions, made before capturing, checked against speedups
#   measured right after.
#
# Going further adds more: a learning rate schedule, warm-up streams, background threads, memory pools,
# `torch.compile(mode="reduce-overhead")`, and a graph replayed after its model was freed.
#
# **What you need**: an NVIDIA GPU (Colab: Runtime → Change runtime type → T4 GPU). Without one the notebook
# runs the checks that are honest on a CPU (Python state, values read on the CPU, data-dependent shapes,
# optimizers, seeding), says plainly that CUDA graphs need an NVIDIA GPU, and shows in each demo what the recorded
# GPU run saw there.
#
# **How long**: 2.7 min on an NVIDIA H200 (measured by `reproduce`, 2026-11-29); a T4 has not been timed yet; under
# a minute on a CPU.

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
SMOKE = None                 # tiny run (CI / tests); None reads $CGK_SMOKE (1 means on)
SAMPLES = 2                  # timing samples per window in section 7; each window's median is kept
WINDOWS = 8                  # timing windows of section 7, a pause apart: its intervals come from them
WINDOW_PAUSE_S = 0.5         # seconds between windows
ADVISE_SAMPLES = 7           # samples of advise's own eager timing (one prediction per case, before capture)
TRIES = 2                    # fresh processes per variant of the two-captures experiment (Going further F)
POOL_BATCHES = [1024, 768, 512, 384, 256, 192, 128, 64]   # batch sizes captured in Going further D, largest first

# %%
import os
import warnings

import torch

from cudagraph_kit import CaptureError, capture, check_capturable, env_table, has_cuda, verify
from cudagraph_kit.advice import advise, measure_replay_cost
from cudagraph_kit.course.lessons.pitfalls import brief, brief_error, first_line, first_sentence, outcome
from cudagraph_kit.course.measuring import results
from cudagraph_kit.course.measuring.measure import measure

STEM = "05_pitfalls"
CUDA = has_cuda()
if SMOKE is None:
    SMOKE = os.environ.get("CGK_SMOKE", "0") == "1"
SMOKE = SMOKE or not CUDA  # without a GPU only the small CPU part runs
if SMOKE:
    SAMPLES, ADVISE_SAMPLES, TRIES, POOL_BATCHES = 2, 3, 1, [512, 256, 128]
    WINDOWS, WINDOW_PAUSE_S = 2, 0.0
DEVICE = "cuda" if CUDA else "cpu"
torch.manual_seed(0)
print(env_table())
if not CUDA:
    print("\n>>> No CUDA GPU here. CUDA graphs need an NVIDIA GPU: this run only does the checks that are honest on\n"
          ">>> a CPU (check_capturable on Python state, value reads, data-dependent shapes, optimizers, seeding);\n"
          ">>> nothing is captured. Each demo shows what the recorded GPU run in figures/ saw instead.")

# %% [markdown]
# ## 0. How to read the demos
# Each pitfall below is a short demo: the mistake, what it does (it **raises**, or it is **silently wrong**), the
# tool that finds it, and the fix. `print(brief(report))` shows what `check_capturable` found, one line per finding
# with the line of your code it points at (`print(report)` adds each finding's explanation and fix). Each demo ends
# with `outcome(...)`: it notes what the demo found for the table in "Going further" H, and without a GPU it prints
# what the recorded GPU run saw in that demo.

# %% tags=["nbval-check-output"]
def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


X = torch.randn(256, device=DEVICE) + 2.0

# %% [markdown]
# ## 1. A value read on the CPU: `.item()`, `print`
# Reading a GPU value into Python (`.item()`, `print` of a GPU tensor, `if tensor:`) makes the CPU wait for the GPU (a [*host synchronization*](../docs/GLOSSARY.md)). During
# capture nothing has run yet, so there is no value to read: CUDA refuses with *"operation not
# permitted when stream is capturing"*. `check_capturable` runs the function eagerly with checks switched on and
# finds every such line before you capture (PyTorch's sync debug mode, `torch.cuda.set_sync_debug_mode`, is one of
# the things it uses). It calls the function twice, the second time on inputs with other values (section 5 says
# why), so `log_while_computing` prints two different sums below.

# %%
def scale_by_mean(x):
    m = x.mean().item()            # the CPU waits for the GPU: not capturable
    return x / m


def log_while_computing(x):
    y = torch.tanh(x)
    print("sum:", y.sum())         # printing a GPU tensor copies it to the CPU
    return y * 2


report_item = check_capturable(scale_by_mean, X)
report_print = check_capturable(log_while_computing, X)
print(brief(report_item), brief(report_print), sep="\n")

# %% [markdown]
# Capturing `scale_by_mean` anyway fails. The kit turns the CUDA error into a `CaptureError` that names the cause
# and the fix. The fix keeps the mean on the GPU.

# %%
error = None
if CUDA:
    try:
        capture(scale_by_mean, X)
    except CaptureError as e:
        error = e
        print(brief_error(e))


def scale_by_mean_fixed(x):
    return x / x.mean()            # the mean stays on the GPU


report_fixed = check_capturable(scale_by_mean_fixed, X)
print("fixed:", brief(report_fixed))
outcome("host sync", found=[report_item, report_print], fixed=report_fixed, error=error)

# %% [markdown]
# ## 2. Rebinding a static input instead of copying into it
# A graph reads the *memory* it was captured with (its [static inputs](../docs/GLOSSARY.md)).
# `static_input = new_batch` only gives the name a new tensor; the graph still reads the old one and returns the
# result for the old data. Nothing raises. The fix is `static_input.copy_(new_batch)` (the callable that the kit's
# `capture` returns does it for you). `verify` catches the mistake: it fills the graph's input buffers with NaN
# before each call and compares the graph with eager on new inputs. A graph that reads its old buffer then returns
# NaN: that is the `max |graph - eager| = nan` below. The demo captures by hand, with a
# [warm-up](../docs/GLOSSARY.md) on a side stream.

# %%
bad = good = None
if CUDA:
    graph_input = torch.randn(256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gelu(graph_input)                                  # warm-up on a side stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_output = gelu(graph_input)

    def replay_rebinding(x):
        graph_input = x            # the mistake: a new name binding, the graph still reads the captured tensor
        graph.replay()
        return graph_output

    def replay_copying(x):
        graph_input.copy_(x)       # the fix: new data into the memory the graph reads
        graph.replay()
        return graph_output

    new = torch.randn(256, device="cuda")
    print(f"rebinding: max |graph - eager| = {(replay_rebinding(new) - gelu(new)).abs().max().item():.3g}")
    bad = verify(replay_rebinding, gelu, graph_input, static_inputs=[graph_input])
    good = verify(replay_copying, gelu, graph_input, static_inputs=[graph_input])
    print(*str(bad).splitlines()[:2], "copying: " + first_line(good), sep="\n")
outcome("rebinding", bad=bad, good=good)

# %% [markdown]
# ## 3. Keeping an output across replays
# A graph writes its outputs into the same memory at every replay. Keep the tensor a call returned, call
# again, and the kept tensor now holds the *new* result: a list of losses becomes one loss N times. `verify`
# compares each call's output with eager right after the call, so it finds no mismatch here; what it does say is
# that every call returns the same output memory. The fix: clone what you keep, or `capture(..., clone_outputs=True)`.

# %%
kept = eager = report = fixed = None
if CUDA:
    g = capture(gelu, torch.randn(4, device="cuda"))
    outputs = [g(torch.full((4,), v, device="cuda")) for v in (1.0, 2.0, 3.0)]   # three calls, outputs kept
    kept = [round(out[0].item(), 4) for out in outputs]                          # read after the third call
    eager = [round(gelu(torch.tensor(v)).item(), 4) for v in (1.0, 2.0, 3.0)]
    print("three calls, three kept outputs:", kept, "| eager:", eager)
    report = verify(g, gelu, g.static_inputs[0])
    print(report)
    g_clone = capture(gelu, torch.randn(4, device="cuda"), clone_outputs=True)
    fixed = verify(g_clone, gelu, g_clone.static_inputs[0])
outcome("kept output", kept=kept, eager=eager, report=report, fixed=fixed)

# %% [markdown]
# ## 4. A changing shape
# A graph replays the shapes it captured. The kit refuses an input of another shape before touching the graph.
# A plain `static.copy_(x)` raises for most other shapes, but it silently broadcasts one that fits, such as a single
# row into a whole batch. Code whose *output* shape depends on the data (`x[mask]`, `nonzero`, `unique`) cannot be
# captured at all. On a GPU `check_capturable` also reports a host sync there: `x[mask]` reads on the CPU how many
# values it keeps, to size its output. The fixes: fixed-size forms (`torch.where`, masks multiplied in), or one
# graph per size (notebook 06).

# %%
def positives(x):
    return x[x > 0]                # the output's length depends on the values


def positives_fixed(x):
    return torch.where(x > 0, x, 0.0)


report_shape = check_capturable(positives, torch.randn(256, device=DEVICE))
report_shape_fixed = check_capturable(positives_fixed, torch.randn(256, device=DEVICE))
print(brief(report_shape), brief(report_shape_fixed), sep="\n")
refused = None
if CUDA:
    g = capture(gelu, torch.randn(8, 64, device="cuda"))
    try:
        g(torch.randn(5, 64, device="cuda"))
    except ValueError as e:
        refused = e
        print("the kit refuses:", first_sentence(e))
outcome("shape", found=report_shape, fixed=report_shape_fixed, refused=refused)

# %% [markdown]
# ## 5. A Python counter frozen into the graph
# Python code does not run when a graph replays. A counter incremented in `forward`, a flag, a learning
# rate that a scheduler changes: the graph keeps the value it saw at capture. `check_capturable` calls the
# function twice and reports Python values that changed, with the line that changed them. With a GPU, `verify`
# first calls eager twice on identical inputs: here even eager disagrees with itself. It names the value that
# changed, with its value before and after those two calls (earlier calls, the capture's among them, had already
# counted up). The fix keeps the value in a GPU tensor updated in place: exercise 1 asks you to write it for this
# counter, and Going further A shows it for a learning rate.

# %%
class ScaledByStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.step = 0

    def forward(self, x):
        # Python state: frozen in a graph
        self.step += 1
        return self.lin(x) / self.step


report_counter = check_capturable(ScaledByStep().to(DEVICE), torch.randn(4, 16, device=DEVICE))
print(brief(report_counter))
frozen = None
if CUDA:
    m = ScaledByStep().cuda()
    g = capture(m, torch.randn(4, 16, device="cuda"))
    frozen = verify(g, m, g.static_inputs[0])
    print("verify:", *str(frozen).splitlines()[1:2])   # its cause line: the value that changed, and where
outcome("counter", found=report_counter, frozen=frozen)

# %% [markdown]
# ## 6. Random numbers
# Random numbers from PyTorch's **default** CUDA generator are fine in a graph: PyTorch moves that generator on
# before every replay, so each replay draws new numbers (notebook 02 explains how). Two replays of a graphed
# dropout (p = 0.5) should then give two independent masks, which differ in about half of their positions. What
# breaks is drawing from another `torch.Generator`
# (capture fails unless it is registered with the graph) and reseeding inside the captured function
# (`torch.manual_seed` cannot run during capture, and replays would never reseed).

# %%
def noisy(x):
    torch.manual_seed(0)           # reseeding inside the function
    return x + 0.1 * torch.randn_like(x)


report_seed = check_capturable(noisy, X)
print(brief(report_seed))
report_gen = error = masks_differ = same_as_eager = None
if CUDA:
    gen = torch.Generator(device="cuda")

    def noisy_own_generator(x):
        return x + 0.1 * torch.randn(x.shape, device=x.device, generator=gen)

    report_gen = check_capturable(noisy_own_generator, X)
    try:
        with warnings.catch_warnings():  # the capture fails before any kernel, so PyTorch also warns that the
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")  # graph is empty: expected here
            capture(noisy_own_generator, X)
    except CaptureError as e:
        error = e
        print(brief_error(e))
    # the default generator: new numbers at every replay, and the same numbers as eager from the same state
    dropout = capture(lambda t: torch.nn.functional.dropout(t, 0.5), torch.ones(1000, device="cuda"))
    a, b = dropout(torch.ones(1000, device="cuda")).clone(), dropout(torch.ones(1000, device="cuda")).clone()
    masks_differ = (a != b).sum().item()
    print(f"two replays of a graphed dropout: masks differ in {masks_differ} of 1000 positions")
    same_as_eager = verify(dropout, lambda t: torch.nn.functional.dropout(t, 0.5), torch.ones(1000, device="cuda"))
    print("graph vs eager from the same RNG state:", first_line(same_as_eager))
outcome("rng", found=report_seed, own_generator=report_gen, error=error, masks_differ=masks_differ,
        same_as_eager=same_as_eager)

# %% [markdown]
# ## 7. Will a graph help? `advise` before capturing, checked against measured speedups
# A graph removes launch cost, not GPU work. `advise(fn, *args)` runs the eager function alone, before anything is
# captured. It times a call, counts its kernels and measures how long the GPU is busy with them (busy time includes
# the short gaps between kernels launched one by one, which a graph shortens, so a graph can take less). With what a
# replay costs on this GPU (`measure_replay_cost()`), it predicts the speedup a graph should reach. A call whose
# GPU work is much shorter than its eager time is [launch-bound](../docs/GLOSSARY.md). advise's words for its
# prediction: "launch-bound" (a graph should help: 1.5x or more), "partly launch-bound" (a little: 1.1x-1.5x),
# "GPU-bound" (about as fast as eager: a predicted speedup within 1.1x), or slower than eager.
# `print(advise(fn, *args))` gives the whole reading; Going further G has the formula.
#
# The cases are the GELU of notebook 01 (a small and a large tensor) and the training steps of notebook 02 (two
# sizes, SGD and Adam). For each, `advise` runs first; only then is the graph captured.

# %%
from cudagraph_kit.course.lessons.workloads import advise_workloads
from cudagraph_kit.course.measuring.predictions import show_advise, show_predictions

cost, predicted, timed, claim_ids = None, {}, {}, {}  # per case: advise's prediction, what measure() times, its id
if CUDA:
    cost = measure_replay_cost()
    for case, claim_id, args, eager, capture_graph in advise_workloads(gelu):
        predicted[case] = advise(eager, *args, cost=cost, samples=ADVISE_SAMPLES)  # first: nothing captured yet
        timed[case] = ({"eager": eager, **capture_graph()}, args)                  # only then the capture
        claim_ids[case] = claim_id
show_predictions(predicted, STEM)  # without a GPU: the recorded GPU run's predictions

# %% [markdown]
# Then eager and graph are timed against each other in several [windows](../docs/GLOSSARY.md) a pause apart
# (`WINDOWS`, in the parameters cell). `measure` gives the median speedup and its 90%
# [prediction interval](../docs/GLOSSARY.md), where one more window should land. Each case makes two claims, each a
# [verdict](../docs/GLOSSARY.md) from that interval. First: the measured speedup lies within 1.5x of the prediction.
# Second: it went the way advise's words said (faster, about as fast, or slower than eager). Where the interval
# lies partly within 1.5x and partly beyond, the verdict says so: this run cannot decide that claim. Below: the
# first claim over all cases and for the two GELU cases; Going further I lists every verdict.

# %%
from cudagraph_kit.course.measuring.verdicts import advise_overall_claim, advise_vs_measured

m_advise = measure(timed, windows=WINDOWS, samples=SAMPLES, pause_s=WINDOW_PAUSE_S) if timed else None
honest, case_claims = advise_vs_measured(predicted, m_advise, claim_ids)
claims = [*case_claims, advise_overall_claim(case_claims)] if case_claims else []  # this run's verdicts
show_advise(honest, claims, STEM, headlines=["advise_within_1_5x_all", "advise_within_1_5x_gelu_small",
                                             "advise_within_1_5x_gelu_large"])  # without a GPU: the recorded run's

# %% [markdown]
# ## Takeaways
# What the demos above showed, and `advise`'s record from this run on a GPU, or without one from the recorded GPU
# run (named above them).

# %%
TAKEAWAYS = [
    "Some code cannot be captured: a value read on the CPU (`.item()`, `print`), an output whose shape depends on "
    "the data (`x[mask]`), reseeding. `check_capturable` names the line of each before you capture. The two "
    "captures tried here (`.item()`, another generator) failed with a `CaptureError` that gave the cause and fix.",
    "Other mistakes capture fine and compute the wrong thing. `verify` compares the graph with eager over several "
    "calls, its input buffers filled with NaN before each so that a stale read shows: it caught the rebound static "
    "input and the frozen counter. A kept output passed that comparison; verify's note that every call returns the "
    "same output memory is the warning to clone it.",
    "A graph removes launch cost, not GPU work. `advise` predicts the gain from the eager function alone, before any "
    "capture; treat its number as an estimate and time the graph: {advise_within_1_5x_all:statement}.",
]
results.show_takeaways(STEM, claims, TAKEAWAYS);

# %% [markdown]
# ## Going further (optional)
# A. a learning rate frozen into the graph; B. warm-up not on a side stream; C. a background thread during capture;
# D. memory: a private [pool](../docs/GLOSSARY.md) per graph vs one shared pool; E. `torch.compile(mode="reduce-overhead")`; F. two
# hand-written captures and "an illegal memory access"; G. how `advise` predicts; H. the pitfalls at a glance;
# I. every verdict of this run; J. saving the results; K. side by side with the published figures; L. the recorded
# GPU results. The exercises follow.
#
# Experiments that could kill the CUDA context, or need a fresh process, are functions in
# `cudagraph_kit/course/lessons/pitfall_scripts.py`; `run_isolated(fn, *args, timeout=...)` runs one in a fresh
# interpreter and returns the dict it reports, with the exit code, so a crash is a row in a table, not a stalled
# notebook. The tables of B and C show each error as its type and first clause, then print the first error once,
# as the experiment reported it.

# %% tags=["nbval-check-output"]
import inspect
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
from IPython.display import display

from cudagraph_kit import shared_pool
from cudagraph_kit.course.lessons.models import detached_eager_step as eager_step
from cudagraph_kit.course.lessons.pitfall_scripts import docs_recipe_capture, run_isolated
from cudagraph_kit.course.lessons.pitfalls import PITFALLS, still_works
from cudagraph_kit.course.measuring.claims import save_claims, summary
from cudagraph_kit.course.measuring.figures import show_figure

# %% [markdown]
# ### A. A learning rate frozen into the graph
# A learning rate that a scheduler changes is a Python float in `opt.param_groups`: section 5's pitfall again.
# `check_capturable` finds it in a training step with a scheduler:

# %%
model = torch.nn.Linear(16, 1).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def train_step_with_schedule(x, y):
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    sched.step()                   # changes opt.param_groups[0]["lr"], a Python float
    return x


report_lr = check_capturable(train_step_with_schedule, torch.randn(8, 16, device=DEVICE), torch.randn(8, 1, device=DEVICE))
print(report_lr)

# %% [markdown]
# With a GPU, `verify` shows what the frozen rate does. The docs recipe for a whole training step (side-stream
# warm-up, `zero_grad(set_to_none=True)`, capture) with `Adam(capturable=True)`, a learning rate halved before
# every step, once as a Python float and once as a GPU tensor updated in place (`Adam` accepts a tensor `lr` with
# `capturable=True`). The eager reference starts from the same state. The recipe (F's two-captures experiment uses
# it too):

# %% tags=["nbval-check-output"]
print(inspect.getsource(docs_recipe_capture))

# %% tags=["nbval-check-output"]
def make_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)).to(DEVICE)


def capture_step_by_hand(model, opt, x, y):
    """The docs recipe, called like the eager step: new data copied into the captured x and y, then a replay."""
    graph, loss = docs_recipe_capture(model, opt, x, y)

    def step(xb, yb):
        x.copy_(xb)
        y.copy_(yb)
        graph.replay()
        return loss.detach().clone()
    return step


# %%
def lr_experiment(lr_as_tensor):
    lr = (lambda: torch.tensor(1e-2, device="cuda")) if lr_as_tensor else (lambda: 1e-2)
    model, ref = make_mlp(), make_mlp()
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=lr(), capturable=True) for m in (model, ref))
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    graphed = capture_step_by_hand(model, opt, x, y)

    def halve_lr(step):
        for o in (opt, ref_opt):
            group = o.param_groups[0]
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(1e-2 * 0.5 ** step)   # in place: the graph reads this tensor each replay
            else:
                group["lr"] = 1e-2 * 0.5 ** step        # a new Python float: the graph never sees it

    return verify(graphed, eager_step(ref, ref_opt), x, y, steps=3, state=[(model, ref), (opt, ref_opt)],
                  before_step=halve_lr)


seen, detected = "needs a GPU", "Python state" in report_lr.kinds()
if CUDA:
    lr_float, lr_tensor = lr_experiment(False), lr_experiment(True)
    print("lr as a Python float:", lr_float)
    print("lr as a GPU tensor updated in place:", lr_tensor)
    seen, detected = first_line(lr_float), detected and not lr_float.ok and lr_tensor.ok
PITFALLS.record("a learning rate frozen into the graph", "silently wrong", "check_capturable: Python state; verify",
                "lr as a GPU tensor updated in place (Adam/AdamW with capturable=True)", seen, detected)

# %% [markdown]
# ### B. Warm-up not on a side stream (the AccumulateGrad stream warning)
# The docs recipe warms up on a side stream. Autograd remembers, for each parameter, the stream its
# `AccumulateGrad` node was created on. If the warm-up ran on the default stream and its autograd graph is
# still alive (the `loss` variable of the last warm-up step keeps it), the captured backward must sync with
# the default stream: PyTorch warns *"The AccumulateGrad node's stream does not match ..."*, and the capture
# can fail. `torch.cuda.graph` captures on a stream of its own, so a side-stream warm-up whose autograd graph is
# still alive can draw the same warning; only `del loss` drops those nodes. Three variants, each in a fresh
# process: warm-up on the default stream with the last loss kept, on a side stream with it kept, on a side
# stream with `del loss` before capture. The experiment, a function that `run_isolated` runs in a fresh process:

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.lessons.pitfall_scripts import WARMUP_VARIANTS, warmup_stream
from cudagraph_kit.course.lessons.pitfalls import short_cause, show_isolated

print(inspect.getsource(warmup_stream))

# %%
seen, detected = "needs a GPU", None
if CUDA:
    warmup = show_isolated([run_isolated(warmup_stream, v) for v in WARMUP_VARIANTS],
                           ["variant", "capture", "AccumulateGrad warning", "eager works after", "exit code"])
    bad, good = warmup.iloc[0], warmup.iloc[2]
    detected = bool((bad.get("AccumulateGrad warning") or bad.get("capture") != "ok")
                    and good.get("capture") == "ok" and not good.get("AccumulateGrad warning"))
    seen = f"default stream: capture {short_cause(bad.get('capture'))}, warning={bad.get('AccumulateGrad warning')}"
PITFALLS.record("warm-up not on a side stream", "warns; the capture can fail", "PyTorch's AccumulateGrad warning",
                "warm up on a side stream and drop the warm-up's autograd graph (del loss); the kit does both",
                seen, detected)

# %% [markdown]
# ### C. A background thread during capture (`capture_error_mode`)
# While a capture is under way, CUDA forbids "potentially unsafe" calls such as `cudaMalloc`. In the default
# mode, `capture_error_mode="global"`, that holds for **every thread** of the process: a data-loading thread
# that allocates GPU memory at the wrong moment gets an error, and the capture can be invalidated.
# `"thread_local"` restricts the rule to the capturing thread. (Mode names and meaning: `torch.cuda.graph`'s
# documentation.) The background thread below allocates a new 300 MiB tensor while the main thread captures,
# once in each mode, each in a fresh process.

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.lessons.pitfall_scripts import CAPTURE_ERROR_MODES, background_thread_allocates

print(inspect.getsource(background_thread_allocates))

# %%
seen, detected = "needs a GPU", None
if CUDA:
    threads = show_isolated([run_isolated(background_thread_allocates, mode) for mode in CAPTURE_ERROR_MODES],
                            ["mode", "thread", "capture", "correct", "eager works after", "exit code"])
    strict, local = threads.iloc[0], threads.iloc[1]
    detected = bool((strict.get("thread") != "ok" or strict.get("capture") != "ok")
                    and local.get("thread") == "ok" and local.get("capture") == "ok" and local.get("correct"))
    seen = f"global: thread {short_cause(strict.get('thread'))}; capture {short_cause(strict.get('capture'))}"
PITFALLS.record("another thread allocating during capture", "raises (in that thread, or at capture end)",
                "the error; capture_error_mode", "capture_error_mode='thread_local', or keep other threads off the GPU "
                "while capturing", seen, detected)

# %% [markdown]
# ### D. Memory: a private pool per graph vs one shared pool
# Each capture gets its own private memory pool by default, and memory a graph used for intermediates stays
# reserved for it. One graph per batch size quickly adds up. Graphs captured into **one shared pool**
# (`capture(..., pool=shared_pool())`: a `torch.cuda.graph_pool_handle()`, or a `torch.cuda.MemPool` from PyTorch
# 2.14) reuse each other's intermediate memory.
#
# The rule that comes with it, from PyTorch's CUDA notes ("Sharing memory across captures"): graphs may share a
# pool if they are always replayed in the order they were captured and never concurrently, or if they do not
# depend on each other's outputs and never run concurrently, in any order. In a shared pool, replaying one graph
# can overwrite another graph's outputs: clone an output you keep before replaying another graph.
#
# The kit captures every graph of a GPU on one stream, which the pool needs to reuse memory. Measured with
# `torch.cuda.memory_reserved()`: an MLP forward captured for several batch sizes (largest first). Memory reserved
# is counted, not timed, so one reading of each is the claim's interval.

# %%
from cudagraph_kit.course.measuring.figures import plot_memory
from cudagraph_kit.course.measuring.verdicts import memory_reading

memory_rows, fig_mem = [], None
seen, detected = "needs a GPU", None
if CUDA:
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()

    def reserved_for_graphs(pool_of):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        graphs = [capture(mlp, torch.randn(n, 1024, device="cuda"), pool=pool_of()) for n in POOL_BATCHES]
        for gr in graphs:                              # still correct, each of them
            x = torch.randn_like(gr.static_inputs[0])
            with torch.no_grad():
                torch.testing.assert_close(gr(x), mlp(x))
        return torch.cuda.memory_reserved() - before   # the graphs are still alive here

    private = reserved_for_graphs(lambda: None)
    pool = shared_pool()
    shared = reserved_for_graphs(lambda: pool)
    memory_rows, memory_claim = memory_reading(private, shared, POOL_BATCHES)
    claims.append(memory_claim)
    print(pd.DataFrame(memory_rows).round(1).to_string(index=False), "\n" + memory_claim.statement)
    fig_mem = plot_memory(memory_rows, f"{len(POOL_BATCHES)} MLP graphs on {torch.cuda.get_device_name(0)}")
    show_figure(fig_mem)
    seen = f"private {private / 2**20:.0f} MiB vs shared {shared / 2**20:.0f} MiB"
    detected = memory_claim.verdict == "holds"
PITFALLS.record("memory held by one private pool per graph", "wastes memory (can run out)",
                "torch.cuda.memory_reserved()", "capture into one shared pool: pool=shared_pool()", seen, detected)

# %% [markdown]
# ### E. `torch.compile(mode="reduce-overhead")`: skipped graphs and overwritten outputs
# `reduce-overhead` builds CUDA graphs for you, and has two pitfalls of its own:
# - When a compiled region cannot be graphed (an input it mutates, for one), it **silently runs without a
#   graph** and only logs *"skipping cudagraphs due to ..."*. Turn the log on with
#   `TORCH_LOGS="cudagraphs"` (older versions: `"perf_hints"`) or `torch._logging.set_logs(...)`; the count
#   is in `torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`.
# - Its outputs live in the graph's memory, and the next call may write into it. Keep an output and call again,
#   and what reading the old one does depends on which run produced it (PyTorch's
#   `torch/_inductor/cudagraph_trees.py`; notebook 03, section 4 tries both). When the next call starts a new
#   generation, the tree invalidates the outputs of a *warm-up* or *recording* run you still hold (the first
#   calls for a shape), and reading one raises *"accessing tensor output of CUDAGraphs that has been overwritten
#   by a subsequent run"*. The outputs of a *replay* (every later call) are left as they are: the next replay
#   writes its result into their memory, and the kept tensor silently holds the next call's values, with no
#   error. Do not rely on the error: clone what you keep (notebook 03 has the rest of the story:
#   `cudagraph_mark_step_begin`).
#
# The experiment compiles two regions, one that mutates an input and one that reads a CPU tensor, and prints the
# skips this PyTorch logged. Then it keeps an output of a replay (the fourth call), calls again with other data,
# and prints what this PyTorch did, then the same with a `.clone()`. Compiling runs in a separate process with a
# time limit, so a slow or stuck compile cannot stall the notebook.

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.lessons.pitfall_scripts import reduce_overhead_pitfalls

print(inspect.getsource(reduce_overhead_pitfalls))

# %%
from cudagraph_kit.course.lessons.pitfalls import show_reduce_overhead

ro = run_isolated(reduce_overhead_pitfalls, timeout=300) if CUDA else None
seen, detected, found_old = show_reduce_overhead(ro, torch.__version__)
PITFALLS.record("reduce-overhead: skipped graphs, overwritten outputs",
                "silently slower; a kept output raises or silently holds the next call's values",
                f"TORCH_LOGS=cudagraphs (perf_hints), the cudagraph_skips counter; for a kept output: {found_old}",
                "keep compiled regions on the GPU without input mutation; clone outputs you keep", seen, detected,
                still_works(gelu))

# %% [markdown]
# ### F. Two hand-written captures and "an illegal memory access"
# A report: the docs recipe for a whole training step, the 640×4096→2048→1024 MLP (with the docs' dropout)
# and `Adam(capturable=True)`, captured twice (a second model) before the first graph's first replay; the
# first graph's replay then crashed with *"an illegal memory access was encountered"*, in most tries, and
# capturing through the kit, which replays right after capture, did not crash. The variants below test those
# observations; the cells after them print what each variant did in this run.
#
# What to check in PyTorch's source: a graph records raw addresses and owns only the memory allocated
# **during** capture (its private pool). It does not keep alive the tensors it reads that existed before
# capture: the parameters, the optimizer state, the static inputs. And `torch.cuda.graph` empties the
# allocator's cache (`torch.cuda.empty_cache()`) when each capture begins, returning freed memory to the
# driver. So if the first model's objects go out of scope (the usual `model = ...` rebinding in a script or
# notebook), what the first graph still reads goes back to the allocator: it can be handed to new tensors, or
# unmapped at the second capture's start. The first graph's replay then reads memory it does not own, and may fault.
# A hypothesis to rule out: the second capture's `zero_grad(set_to_none=True)` frees gradients the first
# graph wrote; but those were allocated during capture, in the first graph's private pool, which stays
# reserved while that graph lives.
#
# Each variant runs `TRIES` times, each in a fresh process (an illegal memory access ends the CUDA context):
# keep every object alive, drop the first model's objects, drop them and replay right after capture, drop them
# and call `empty_cache()` with no second capture, and capture the same model and optimizer twice.
# Before replaying, the experiment looks up where each tensor the first graph reads now lies, with
# `torch.cuda.memory_snapshot()`: still allocated, free in the allocator's cache, or returned to the driver.

# %% tags=["nbval-check-output"]
from cudagraph_kit.course.lessons.pitfall_scripts import TWO_CAPTURE_VARIANTS, two_captures

print(inspect.getsource(two_captures))

# %%
from cudagraph_kit.course.lessons.pitfalls import two_captures_table, two_captures_verdict

two_rows, seen, detected = [], "needs a GPU", None
if CUDA:
    jobs = [(variant, attempt) for variant in TWO_CAPTURE_VARIANTS for attempt in range(TRIES)]
    with ThreadPoolExecutor(max_workers=5) as workers:  # separate processes: they can run side by side
        answers = list(workers.map(lambda job: run_isolated(two_captures, job[0]), jobs))
    two_rows, summary_two = two_captures_table(jobs, answers)
    print(summary_two.to_string(), "\n")
    print(pd.DataFrame(two_rows)[["variant", "try", "replay of graph 1", "graph 1 memory"]].to_string(index=False))
    detected, seen = two_captures_verdict(summary_two)
else:
    print("skipped: needs an NVIDIA GPU (the recorded run is shown in L)")
PITFALLS.record("a graph replayed after what it reads was freed", "silently wrong, or crashes the process",
                "nothing before the crash: keep references", "keep model, optimizer and static tensors alive as long "
                "as the graph (the kit's objects hold them)", seen, detected)

# %% [markdown]
# Reading the table: where every object stays alive, graph 1 replays cleanly and reads nothing freed. Where the first
# model's objects were dropped, graph 1 reads tensors it does not own (optimizer state, inputs), whose memory the
# allocator has taken back: the last column says where each now lies (free in its cache, handed to new tensors, or,
# after an `empty_cache()`, returned to the driver), and graph 1's replay can fault on it (the `crashed` column).
# The table places each tensor by its whole span, first byte to last: a tensor that starts in cached memory and
# runs past the end of its segment into memory returned to the driver shows as "partly free in cache and partly
# returned to the driver". A probe that first found it (`scripts/probes/probe_two_captures.py`, output in
# `figures/05_two_captures_spans/`, run on an H100) saw it in every crashing try: one optimizer-state tensor, whose
# end the second capture's start had handed back to the driver by emptying the cache. Under compute-sanitizer's memcheck (on an
# H100) the same variant replayed without an error: there every tracked tensor lay in memory allocated again, which
# memcheck counts as valid, so graph 1 silently read memory that other tensors now own. Whichever way the memory
# went, a replay after a drop is undefined. A graph does not own what it reads: keep the model, optimizer and static
# tensors alive as long as the graph (the kit's `GraphedCallable` and `GraphedTrainStep` hold them). A replay right
# after capture keeps nothing alive, so it cannot protect the first graph (compare its rows with "drop"); what
# protects the kit's graphs is that the kit's objects keep references. Capturing the same model and optimizer twice
# frees the gradients the first graph wrote (the second capture's `zero_grad(set_to_none=True)`), so the table may
# count them as "free in cache"; but they lie in the first graph's private pool, which stays reserved for that graph
# while it exists, so nothing else is given that memory.

# %% [markdown]
# ### G. How `advise` predicts
# `advise` measures, before anything is captured, the eager time per call, the kernels (and copies) per call
# (profiler) and the **GPU time** of the calls queued back to back (CUDA events, with a spin kernel holding the GPU
# while the host queues them). Kernels launched one by one leave a gap between them on the GPU even when queued;
# inside a graph the next node starts sooner. `measure_replay_cost()` measures that gap, a graph node's GPU time and
# the host's cost of one replay. Then:
#
# - graph GPU time = eager GPU time − kernels × gap saved + the graph's own start;
# - best graph time = max(graph GPU time, nodes × node time, host cost of one replay);
# - speedup = eager time / best graph time: an estimate, which a measured speedup can exceed (the eager time
#   drifts between `advise` and the timing windows, and the formula may miss a saving).
#
# The predicted speedup divides `advise`'s own eager time by its predicted graph time. The host's speed drifts
# between `advise`'s measurement and the timing windows, and the eager time moves with it, so part of a miss can
# come from the eager side; to judge the graph alone, compare `predicted_graph_us` with `measured_graph_us` in
# the table below. Appendix B checks the same formula on the rows notebooks 01-04 recorded (fitted after the
# fact, since their floor is the timed graph's own).

# %%
if cost is not None:
    print(f"replay cost on this GPU: the host spends {cost.launch_us:.2f} µs per replay; a tiny node takes "
          f"{cost.graph_node_us:.2f} µs of GPU time in a graph and {cost.eager_node_us:.2f} µs launched eagerly "
          f"(gap saved {cost.gap_saved_us:.2f} µs per kernel)")
    display(honest[["case", "nodes", "predicted_graph_us", "measured_graph_us", "predicted_speedup",
                    "measured_speedup"]].round(2))
    display(m_advise.short())
else:
    print("skipped: advise measures on an NVIDIA GPU (the recorded run's timings are in L)")

# %% [markdown]
# ### H. The pitfalls at a glance
# What happens without the fix, and what finds it. "detected" is what this run measured (None: the check needs
# a GPU and did not run here); "process still works" is the `still_works` check after a failure (None: not run
# for that row; the experiments run in a fresh process report "eager works after" in their own tables).

# %%
# NBVAL_IGNORE_OUTPUT
PITFALLS.table().style.hide(axis="index").set_properties(**{"text-align": "left"})   # long text wraps

# %% [markdown]
# ### I. Every verdict of this run

# %%
if claims:
    summary(claims)
else:
    print("No verdicts: without a GPU nothing was captured or timed (the recorded run is shown in L).")

# %% [markdown]
# ### J. Save the results
# One table: a row per pitfall, the memory measurement, the timings of section 7 (cases named `measured: ...`)
# and `advise`'s predictions (`advise: ...`); the verdicts go to `claims.csv`. All of it goes to the folder printed
# below (`build/figures/` by default, with or without a GPU), never over the recorded GPU run in `figures/`, which
# only `python -m cudagraph_kit reproduce` on a GPU publishes. Appendix B adds its rows and saves again.

# %%
from cudagraph_kit.course.lessons.pitfalls import result_table


def save_all(advice, figures=None):
    table = result_table(PITFALLS, memory_rows, m_advise, advice, cost, two_rows, CUDA)
    figs = {k: f for k, f in {"pool_memory": fig_mem, **(figures or {})}.items() if f is not None}
    folder = results.save(STEM, table, figures=figs,
                          extra_env={"tries": TRIES, "pool_batches": POOL_BATCHES, "windows": WINDOWS,
                                     "samples_per_window": SAMPLES, "advise_samples": ADVISE_SAMPLES})
    save_claims(folder, claims)
    return folder


print("saved to", save_all(honest))

# %% [markdown]
# ### K. Side by side with the published figures
# The one published figure for these pitfalls is about memory: a detector that captured one graph per input
# resolution, with a private pool per graph and with one shared pool
# ([roboflow/rf-detr #1490](https://github.com/roboflow/rf-detr/issues/1490)). Beside it, D's reading.
# %%
# NBVAL_CHECK_OUTPUT
PUBLISHED_MEMORY = pd.DataFrame({"source": ["rf-detr #1490, 11 resolutions"], "private_gib": [38.2],
                                 "shared_gib": [11.4]})
PUBLISHED_MEMORY["private / shared"] = PUBLISHED_MEMORY.private_gib / PUBLISHED_MEMORY.shared_gib
print(PUBLISHED_MEMORY.round(2).to_string(index=False))

# %%
print(next((c.statement for c in claims if c.claim == "shared_pool_saves_memory"),
           "this run: no GPU, nothing captured (the recorded run is shown below)"))

# %% [markdown]
# **Why the two ratios can differ.** The saving depends on how much of each graph's memory is intermediates
# (shareable) rather than outputs (each graph keeps its own), and on how many graphs there are. A detector at
# eleven resolutions and this small MLP differ in both, so their ratios need not agree.

# %% [markdown]
# ### L. Recorded GPU results
# The timings of section 7 beside the last GPU run committed to this repository (without a GPU: that run's
# table), then that run's verdicts. The full table is `figures/05_pitfalls/results.csv`.

# %%
from cudagraph_kit.course.measuring.claims import load_claims

if m_advise is not None:
    results.beside_recorded(STEM, m_advise.table.assign(case="measured: " + m_advise.table.case))
else:
    results.show_recorded(STEM, columns=["case", "variant", "executed_as", "median_us", "speedup", "speedup_lo",
                                         "speedup_hi", "detected", "reserved_mib"])
recorded = results.load(STEM)
recorded_claims = load_claims(recorded.dir) if recorded is not None else None
if recorded_claims is not None:
    print("\n".join(recorded_claims.statement))

# %% [markdown]
# ## Exercises
# Each exercise takes a pitfall above from "found" to "fixed and proved". Fill in its cell (every `...` is a
# placeholder that runs as it is), then run the check below it: ✔ right, ✘ off (with a hint), … not done yet.
# Parts that need an NVIDIA GPU say so (⏸); on a CPU a check verifies what it can there: the values against
# eager and what `check_capturable` finds.
# Worked solutions, run by the test suite against these checks: `notebooks/solutions/nb05_pitfalls.py` (try
# first).

# %% tags=["nbval-check-output"]
import copy

from cudagraph_kit.course.exercises.nb05_pitfalls import check_clip_without_sync, check_step_counter

# %% [markdown]
# ### Exercise 1: a step counter that a graph replays
# `ScaledByStep` (section 5) counts its calls in a Python number, which a graph freezes at capture. Write
# `ScaledByStepFixed`: the same layer and the same result (call k returns `self.lin(x) / k`), with the counter in a
# GPU tensor updated in place. Register it as a buffer (`self.register_buffer("step", torch.zeros(()))`, so
# `.to(DEVICE)` moves it with the model) and add to it with `self.step.add_(1)`: an in-place kernel is recorded
# into the graph and runs at every replay, while `self.step = self.step + 1` gives the name a new tensor that the
# replays never read. Run `check_capturable` on an instance, then (GPU) capture one and prove it with `verify`
# against an eager copy: `reference = copy.deepcopy(model)` before the capture, and
# `verify(g, reference, x, state=[(model, reference)])`. Why must the reference be a copy, not `model` itself?

# %% tags=["nbval-check-output"]
class ScaledByStepFixed(torch.nn.Module):
    ...  # your code: __init__ (self.lin and the counter) and forward


counter_verify = ...  # GPU: verify(capture(model, x), reference, x, state=[(model, reference)])

# %%
check_step_counter(ScaledByStepFixed, counter_verify)

# %% [markdown]
# ### Exercise 2: clipping without reading the norm on the CPU
# `clip_to_norm` below scales `x` down to norm `max_norm` when it is larger. It reads the norm on the CPU (section
# 1) and decides in Python, so it cannot be captured, and a graph could replay only the branch it saw. Write
# `clip_to_norm_fixed(x, max_norm=1.0)` with the same values for inputs above and below `max_norm`, where the GPU
# decides: scale by `min(1, max_norm / norm)`. `torch.nn.utils.clip_grad_norm_` does exactly this to avoid a host
# synchronization. Run `check_capturable` on it with `X`, then (GPU) capture it and `verify` the graph against it.

# %%
def clip_to_norm(x, max_norm=1.0):
    norm = x.norm().item()           # the CPU waits for the GPU: not capturable
    if norm > max_norm:              # a Python decision, made once at capture
        x = x * (max_norm / norm)
    return x


print(check_capturable(clip_to_norm, X))


def clip_to_norm_fixed(x, max_norm=1.0):
    ...  # your code: no .item(), no if on a tensor


clip_verify = ...  # GPU: verify(capture(clip_to_norm_fixed, X), clip_to_norm_fixed, X)

# %%
check_clip_without_sync(clip_to_norm_fixed, clip_verify)

# %% [markdown]
# ## Appendix A: Python state reached another way
# Section 5's counter lived in `self`; the same pitfall hides in other places.
# A counter need not be a global or an attribute of `self`: it can sit in an object the function holds in a
# closure, in a dict, in a class attribute, or in a helper the function calls. A replay freezes each of them
# the same way. `check_capturable` follows what the function can reach and names the line; `verify` first runs
# eager twice on identical inputs (RNG fixed, tensor state put back): if even eager differs, it reports
# "depends on state that the graph freezes" instead of a mismatch. Tensor state updated in place (BatchNorm's
# running statistics, an optimizer's moments) is not Python state, and neither is a local accumulator.

# %% tags=["nbval-check-output"]
class Box:
    calls = 0                      # a class attribute

    def __init__(self):
        self.n = 0                 # an attribute of an object


def make_scaled(kind):
    box, counts = Box(), {"calls": 0}

    def bump():                    # a helper that changes what the caller reads
        counts["calls"] += 1
        return counts["calls"]

    def scaled(x):
        if kind == "object in a closure":
            box.n += 1
            return x * box.n
        if kind == "dict item":
            counts["calls"] += 1
            return x * counts["calls"]
        if kind == "class attribute":
            Box.calls += 1
            return x * Box.calls
        return x * bump()          # "through a helper"
    return scaled


bn = torch.nn.BatchNorm1d(16).to(DEVICE)
reached = []
for kind in ("object in a closure", "dict item", "class attribute", "through a helper"):
    fn = make_scaled(kind)
    found = [f for f in check_capturable(fn, X).findings if f.kind == "Python state"]
    frozen = verify(capture(fn, X, eager_fallback=True), fn, X, steps=2)  # a real graph on a GPU
    reached.append({"state": kind, "check_capturable": found[0].code if found else "not found",
                    "verify": frozen.frozen_state["what"] if frozen.frozen_state else "not found"})
ordinary = check_capturable(lambda x: bn(x.view(-1, 16)), X)  # running stats change in place: not Python state
print(pd.DataFrame(reached).to_string(index=False))
print("BatchNorm in training mode:", "looks capturable" if ordinary.ok else ordinary)
PITFALLS.record("Python state reached through an object, a container, a class or a helper", "silently wrong",
                "check_capturable: Python state; verify (eager twice)", "keep it in a GPU tensor updated in place",
                "; ".join(f"{r['state']}: {r['check_capturable']}" for r in reached),
                all(r["check_capturable"] != "not found" and r["verify"] != "not found" for r in reached) and ordinary.ok)

# %% [markdown]
# ## Appendix B: `advise`'s formula on what notebooks 01-04 recorded (fitted after the fact)
# Their eager row gives the eager time and the kernels (+ copies) per call, their graph row the floor (the GPU-busy
# time of those kernels replayed from the graph, so no launch gap comes off); the replay cost is the one measured
# in section 7, in this process. Because the floor is the timed graph's own, these rows test the rest of the
# formula (node and replay costs) on more workloads, not whether `advise` can tell beforehand: they are summarized
# per notebook and drawn hollow, apart from section 7's predictions.

# %%
from cudagraph_kit.course.measuring.figures import plot_advise
from cudagraph_kit.course.measuring.predictions import advice_summary, fitted_row, recorded_headlines

fitted = pd.DataFrame([row for stem, cases in recorded_headlines(results).items() for case, base, graph in cases
                       for row in [fitted_row(results, stem, case, base, graph, cost) if CUDA else None] if row])
advice = pd.concat([honest, fitted], ignore_index=True)
if len(advice):
    print(advice_summary(advice).to_string(index=False))
fig_adv = plot_advise(honest, fitted, torch.cuda.get_device_name(0)) if CUDA else None
if fig_adv is not None:
    show_figure(fig_adv)
print("saved again, with the appendix's rows:", save_all(advice, figures={"advise": fig_adv}))
