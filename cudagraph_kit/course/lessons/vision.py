"""Notebook 04's parts that are not the lesson: the ResNet models and batches, the optimizers it compares, the eager
training step and its loss check, the host-time model of the inference sweep, the figures, the digits data set of
the accuracy-parity runs, and the data-feeding study of its appendix.

The CUDA-graph code (``capture``, ``capture_train_step`` and the training loop) stays in the notebook.

Example::

    from cudagraph_kit.course import nb04_resnet as parts
    model = parts.build_model("resnet50", torch.float16, "cuda")
    x = parts.image_batch(8, 224, torch.float16, "cuda")
"""
from __future__ import annotations

import contextlib
import copy
import multiprocessing
import time

import torch

__all__ = ["OPTIMIZERS", "AMP", "build_model", "image_batch", "ToFloat", "build_train_model", "train_batch",
           "make_optimizer", "eager_train_step", "check_losses", "host_time_model", "inference_curves", "plot_inference",
           "plot_training", "plot_parity", "digits_split", "small_cnn", "warmup_cosine", "digits_loader", "accuracy",
           "compare_params", "parity_rows", "cuda_cleanup", "deterministic_runs", "joined", "feeding_windows", "limited_by", "overlap", "copies", "SyntheticImages"]

OPTIMIZERS = {  # name -> the label every table and verdict carries: the settings of both sides
    "SGD momentum": "SGD momentum (default implementation, eager and graph)",
    "AdamW": "AdamW foreach (eager: capturable=False, the default; graph: capturable=True)",
}
AMP = {"bf16": torch.bfloat16, "fp16+GradScaler": torch.float16, "fp32 (CPU)": None}


def build_model(arch: str, dtype, device, seed: int = 0):
    """torchvision ``arch`` with random weights (nothing downloaded), ``dtype``, channels_last, eval mode."""
    import torchvision

    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(weights=None)
    return model.to(device, dtype=dtype, memory_format=torch.channels_last).eval()


def image_batch(n: int, image: int, dtype, device, seed: int = 1):
    """``n`` random images ``image`` x ``image``, channels_last, seeded."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, image, image, generator=g).to(device, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last)


class ToFloat(torch.nn.Module):
    """uint8 images (as a data loader delivers them) -> float in [-1, 1], channels_last, on the model's device."""

    def forward(self, x):
        return (x.float() / 127.5 - 1.0).contiguous(memory_format=torch.channels_last)


def build_train_model(arch: str, device, seed: int = 0):
    """``ToFloat`` then torchvision ``arch`` (1000 classes, random weights), channels_last, train mode."""
    import torchvision

    torch.manual_seed(seed)
    net = getattr(torchvision.models, arch)(weights=None, num_classes=1000)
    return torch.nn.Sequential(ToFloat(), net).to(device, memory_format=torch.channels_last).train()


def train_batch(n: int, image: int, device, seed: int = 2):
    """Synthetic training data as TorchAcc used it: random uint8 images and labels of 1000 classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, image, image), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 1000, (n,), generator=g)
    return x.to(device), y.to(device)


def make_optimizer(name: str, params, graphed: bool, cuda: bool):
    """``OPTIMIZERS[name]``: SGD momentum (default implementation) or AdamW foreach, eagerly with the default
    ``capturable=False`` and in a graph with ``capturable=True`` (the step count on the GPU)."""
    if name == "SGD momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, foreach=True, capturable=graphed and cuda)


def eager_train_step(model, opt, loss_fn, amp_dtype, scaler, device):
    """The eager AMP step: zero_grad, forward under autocast, backward (through ``scaler`` for fp16), step."""
    def run(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(str(device), dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()
    return run


def check_losses(eager, step, x, y, steps: int):
    """Run ``steps`` eager steps and ``steps`` graphed steps from the same weights on the same batch; return the
    losses (eager, graphed) and their largest relative difference. The first step must match (same weights); later
    steps may drift for AdamW, which is the default implementation eagerly and ``capturable=True`` in the graph (two
    orderings of one update, rounded differently; 6% after 6 steps on one repeated batch, seen on an H200). A wrong
    graph (stale input, frozen LR, missing step) is off by far more than the 10% allowed."""
    le = torch.stack([eager(x, y) for _ in range(steps)]).float().cpu()
    lg = torch.stack([step(x, y) for _ in range(steps)]).float().cpu()
    rel = ((lg - le).abs() / le.abs()).max().item()
    assert abs(lg[0] - le[0]) <= 1e-3 * abs(le[0]), f"first step differs: eager {le[0]:.5f}, graph {lg[0]:.5f}"
    assert rel < 0.1, f"graphed training diverged from eager: {le.tolist()} vs {lg.tolist()}"
    return le, lg, rel


def copies(model):
    """Two independent copies of ``model`` (eager and graphed start from the same weights)."""
    return copy.deepcopy(model), copy.deepcopy(model)


def host_time_model(eager, graph):
    """Section 1's model of an eager forward: ``max(kernels x host time per kernel, floor)``. ``eager`` and
    ``graph`` are the sweep's rows indexed by batch (median_us, median_pi_lo/hi, kernels_per_call; floor_us on the
    graph rows). The host time per kernel is estimated at the smallest batch (where eager is most host-bound):
    eager time / kernels, with the interval of the eager time. Returns ``(host_us, (lo, hi), table)``; NaN where
    the profiler counted no kernels (no GPU)."""
    import pandas as pd

    b0 = eager.index.min()
    k0 = eager.kernels_per_call[b0] if "kernels_per_call" in eager else float("nan")
    ok = pd.notna(k0) and k0 > 0
    host = eager.median_us[b0] / k0 if ok else float("nan")
    span = (eager.median_pi_lo[b0] / k0, eager.median_pi_hi[b0] / k0) if ok else (float("nan"),) * 2
    kernels = eager.kernels_per_call if "kernels_per_call" in eager else pd.Series(float("nan"), eager.index)
    floor = graph.floor_us if "floor_us" in graph else pd.Series(float("nan"), graph.index)
    line = kernels * host
    model = pd.concat([line, floor], axis=1).max(axis=1, skipna=False)
    table = pd.DataFrame({"kernels": kernels, "kernels x host (ms)": line / 1e3, "graph floor (ms)": floor / 1e3,
                          "model (ms)": model / 1e3, "eager measured (ms)": eager.median_us / 1e3,
                          "measured / model": eager.median_us / model, "graph (ms)": graph.median_us / 1e3,
                          "graph / floor": graph.median_us / floor}).round(3)
    table["bound"] = ["launch-bound" if lv > fv else "GPU-bound" if fv == fv else "-" for lv, fv in zip(line, floor)]
    return host, span, table


def inference_curves(inference, pays: float) -> dict:
    """Per dtype of the inference table (columns dtype, batch, variant, ...): the eager and graph rows by batch, the
    host-time model (:func:`host_time_model`; ``launch_us`` is the name exercise 1 reads: the eager host time per
    kernel, not the launch alone) and the batch from which the graph stops paying (None where it never does)."""
    curve = {}
    for dname in dict.fromkeys(inference.dtype):
        rows = inference[inference.dtype == dname].sort_values("batch")
        e, g = rows[rows.variant == "eager"].set_index("batch"), rows[rows.variant != "eager"].set_index("batch")
        host_us, host_span, host_table = host_time_model(e, g)
        stop_at = next((b for b in g.index if (g.speedup_hi.loc[b:] <= pays).all()), None)
        curve[dname] = {"eager": e, "graph": g, "host_us": host_us, "launch_us": host_us, "span": host_span,
                        "model": host_table, "stop": stop_at}
    return curve


def plot_inference(curve: dict, batches, pays: float, title: str, cuda: bool):
    """Time per batch (eager with its interval band, graph, floor, kernels x host time) and the speedup with its
    interval band, per dtype of ``curve`` ({dtype: {"eager", "graph", "host_us", "stop"}})."""
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (dname, c) in enumerate(curve.items()):
        e, g, col = c["eager"], c["graph"], f"C{i}"
        ax_t.plot(e.index, e.median_us / 1e3, "o-", color=col, label=f"{dname} eager")
        ax_t.fill_between(e.index, e.median_pi_lo / 1e3, e.median_pi_hi / 1e3, color=col, alpha=0.15)
        ax_t.plot(g.index, g.median_us / 1e3, "s-", color=col, alpha=0.6,
                  label=f"{dname} {'graph' if cuda else 'kit, eager fallback'}")
        if cuda:
            ax_t.plot(g.index, g.floor_us / 1e3, ":", color=col, label=f"{dname} floor (GPU busy)")
            if c.get("host_us") == c.get("host_us"):
                ax_t.plot(e.index, e.kernels_per_call * c["host_us"] / 1e3, "--", color=col, lw=1,
                          label=f"{dname} kernels x {c['host_us']:.1f} µs eager host time")
        ax_s.plot(g.index, g.speedup, "o-", color=col, label=f"{dname} (band: 90% prediction interval)")
        ax_s.fill_between(g.index, g.speedup_lo, g.speedup_hi, color=col, alpha=0.2)
        if c.get("stop") is not None:
            ax_s.axvline(c["stop"], color=col, ls=":", lw=1)
    ax_t.set(xscale="log", yscale="log", xlabel="batch size", ylabel="time per batch (ms)",
             title="time per batch (band: eager 90% prediction interval)")
    ax_s.axhline(pays, color="grey", lw=1, ls="--", label=f"{pays:.2f}x: the graph pays above")
    ax_s.axhline(1.0, color="black", lw=0.8)
    ax_s.set(xscale="log", yscale="log", xlabel="batch size", ylabel="speedup of the graph over eager (x)",
             title="speedup vs batch size (dotted: where the graph stops paying)")
    for ax in (ax_t, ax_s):
        ax.set_xticks(list(batches), [str(b) for b in batches])
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_training(training, graph_variant: str, title: str, footnote: str = ""):
    """Training throughput per case, eager and graph, with the graph's speedup and interval."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.45 * len(training) + 1.8))
    for i, r in enumerate(training.itertuples()):
        is_graph = r.variant.startswith(graph_variant)
        ax.barh(i, r.images_per_s, color="C1" if is_graph else "C0")
        span = f" ({r.speedup:.2f}x, {r.speedup_lo:.2f}-{r.speedup_hi:.2f}x)" if is_graph and r.speedup_lo == \
            r.speedup_lo else ""
        ax.text(r.images_per_s, i, f" {r.images_per_s:,.0f} img/s, {r.median_us / 1e3:.1f} ms{span}", va="center",
                fontsize=8)
    ax.set_yticks(range(len(training)), [f"{r.case} · {r.variant}" for r in training.itertuples()], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="training throughput (images/s)", title=title)
    ax.set_xlim(0, training.images_per_s.max() * 1.45)
    if footnote:
        fig.text(0.01, 0.005, footnote, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot_parity(losses: dict, accs: dict, title: str):
    """Loss per step and validation accuracy per epoch of the parity runs ({label: values}; the first is eager)."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(12, 4))
    for i, label in enumerate(losses):
        style = dict(lw=2.5, alpha=0.5) if i == 0 else dict(lw=1, ls="--")
        ax_l.plot(losses[label], label=label, **style)
        ax_a.plot(range(1, len(accs[label]) + 1), accs[label], "o-" if i == 0 else "s--", label=label,
                  **({"lw": 2.5, "alpha": 0.5} if i == 0 else {}))
    ax_l.set(yscale="log", xlabel="step", ylabel="training loss (cross-entropy)", title="loss per step")
    ax_a.set(xlabel="epoch", ylabel="validation accuracy", title="validation accuracy per epoch")
    for ax in (ax_l, ax_a):
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def digits_split(device):
    """scikit-learn's 8x8 digits (1,797 images, shipped with it), standardized; 80/20 stratified split with the
    validation part on ``device``: ``(X_train, X_val, Y_train, Y_val)``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    X = (X - X.mean()) / X.std()
    Y = torch.tensor(digits.target)
    X_train, X_val, Y_train, Y_val = train_test_split(X, Y, test_size=0.2, random_state=0, stratify=Y)
    return X_train, X_val.to(device), Y_train, Y_val.to(device)


def small_cnn(device, seed: int = 0):
    """Two conv blocks and two linear layers for 8x8 digits."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)


def warmup_cosine(opt, total: int, warmup: int):
    """Linear warm-up from 0.1x for ``warmup`` steps, then cosine annealing to ``total``."""
    s = torch.optim.lr_scheduler
    return s.SequentialLR(opt, [s.LinearLR(opt, start_factor=0.1, total_iters=warmup),
                                s.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])


def digits_loader(X, Y, batch: int, seed: int, pin_memory: bool):
    """A reshuffling loader whose last batch of an epoch is short (the graphed loop runs it eagerly)."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=batch, shuffle=True,
                                       generator=torch.Generator().manual_seed(seed), pin_memory=pin_memory)


@torch.no_grad()
def accuracy(model, X, Y) -> float:
    model.eval()
    acc = (model(X).argmax(1) == Y).float().mean().item()
    model.train()
    return acc


def compare_params(a, b):
    """(largest |difference| between the two models' parameters, whether they are bitwise equal)."""
    diff = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    return diff, all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def parity_rows(runs: dict, labels: dict, steps_per_epoch: int, finals: dict):
    """The accuracy-parity rows of results.csv: validation accuracy and mean training loss per epoch of every run
    (``runs[name] = {"losses", "accs", "graphed"}``, shown as ``labels[name]``), then the final-parameter
    comparisons (``finals[name] = dict of columns``)."""
    import pandas as pd

    nan = float("nan")
    rows = []
    for name, run in runs.items():
        for epoch, acc in enumerate(run["accs"], 1):
            q = run["losses"][(epoch - 1) * steps_per_epoch: epoch * steps_per_epoch]
            rows.append({"case": f"parity digits CNN epoch {epoch}", "variant": labels[name],
                         "executed_as": run["executed_as"], "median_us": nan, "speedup": nan, "floor_us": nan,
                         "section": "accuracy parity", "epoch": epoch, "val_acc": acc, "train_loss": q.mean().item()})
    for name, cols in finals.items():
        rows.append({"case": f"parity digits CNN final parameters, {name}", "median_us": nan, "speedup": nan,
                     "floor_us": nan, "section": "accuracy parity", **cols})
    return pd.DataFrame(rows)


# --- the appendix: data feeding -------------------------------------------------------------------------------


class SyntheticImages(torch.utils.data.Dataset):
    """Random uint8 images and labels, made per sample in the worker (as decoding would be)."""

    def __init__(self, n: int, image: int, classes: int = 1000):
        self.n, self.image, self.classes = n, image, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 256, (3, self.image, self.image), dtype=torch.uint8, generator=g)
        return x, int(torch.randint(0, self.classes, (1,), generator=g))


def _loader(batch: int, steps: int, image: int, workers: int, pin: bool):
    fork = "fork" in multiprocessing.get_all_start_methods()
    workers = workers if fork else 0
    return torch.utils.data.DataLoader(
        SyntheticImages(batch * (steps + 2), image), batch_size=batch, shuffle=False, drop_last=True,
        num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None, prefetch_factor=4 if workers else None)


def _seconds_per_batch(batches, per_batch, steps: int, cuda: bool) -> float:
    """Seconds per batch over ``steps`` batches, after 2 (a fresh epoch's first batches are start-up)."""
    for _ in range(2):
        per_batch(*next(batches))
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        per_batch(*next(batches))
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def feeding_windows(step, batch: int, steps: int, image: int, workers: int, device, windows: int, pause_s: float,
                    case: str, progress=print):
    """Time the input pipeline against a (graphed) training ``step`` in ``windows`` windows: "loader only"
    (iterate a DataLoader with ``workers`` workers, pinned memory, copy each batch to ``device``), "step only" (the
    step on one batch already there) and "loader + step" (the real loop). A loader is a stream with a prefetch
    queue, not a call to repeat, so each window times ``steps`` batches of a fresh epoch, after 2. Returns one
    table per window (case, variant, median_us, speedup over "loader only"), for ``combine_windows``."""
    import pandas as pd

    cuda = torch.device(device).type == "cuda"
    to_dev = lambda x, y: (x.to(device, non_blocking=True), y.to(device, non_blocking=True))  # noqa: E731
    loader = _loader(batch, steps, image, workers, cuda)
    fixed = train_batch(batch, image, device, seed=3)
    frames = []
    for w in range(windows):
        if w:
            time.sleep(pause_s)
        t = {"loader only": _seconds_per_batch(iter(loader), to_dev, steps, cuda),
             "step only": _seconds_per_batch(iter([fixed] * (steps + 2)), step, steps, cuda),
             "loader + step": _seconds_per_batch(iter(loader), lambda x, y: step(*to_dev(x, y)), steps, cuda)}
        base = t["loader only"]
        frames.append(pd.DataFrame([{"case": case, "variant": k, "median_us": v * 1e6, "speedup": base / v}
                                    for k, v in t.items()]))
        if progress is not None:
            progress(f"data feeding window {w + 1}/{windows}: " + ", ".join(f"{k} {v * 1e3:.2f} ms"
                                                                            for k, v in t.items()))
    return frames


def limited_by(frames, verdict: str) -> str:
    """Which part limits the data feeding, in words: the verdict of "the loader alone is faster than the step alone"
    where it is definite, else in how many windows the step was the slower part.

    Example::

        limited_by(frames, "unclear")   # 'neither clearly: the training step was the slower part in 5 of 8 windows'
    """
    if verdict in ("holds", "fails"):
        return "the training step" if verdict == "holds" else "the input pipeline"
    medians = [f.set_index("variant").median_us for f in frames]   # per window
    n = sum(bool(t["step only"] > t["loader only"]) for t in medians)
    return f"neither clearly: the training step was the slower part in {n} of {len(frames)} windows"


def overlap(frames) -> list:
    """Per window: the real loop's time over its slower part's (1.0: the loader and the step overlap fully)."""
    out = []
    for f in frames:
        t = f.set_index("variant").median_us
        out.append(float(t["loader + step"] / max(t["loader only"], t["step only"])))
    return out


def cuda_cleanup() -> None:
    """Between experiments on a GPU: wait for it and hand the allocator's cached memory back."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def deterministic_runs(train, runs, **kw) -> dict:
    """``{name: train(graphed, **kw)}`` for each ``(name, graphed)`` of ``runs``, with cuDNN's deterministic
    convolutions on (the setting put back after), so that a difference between two runs is a real one."""
    before, torch.backends.cudnn.deterministic = torch.backends.cudnn.deterministic, True
    try:
        return {name: train(graphed, **kw) for name, graphed in runs}
    finally:
        torch.backends.cudnn.deterministic = before


def joined(measured: list, verdicts):
    """One ``Measured`` from several (cases timed in groups, a smaller GPU's way): their tables and their windows
    joined, and the claims of ``verdicts`` built on the whole."""
    import pandas as pd

    from .measure import Measured

    m = Measured(pd.concat([m.table for m in measured], ignore_index=True),
                 [pd.concat(ws, ignore_index=True) for ws in zip(*(m.windows for m in measured))], verdicts=verdicts)
    m.claims = verdicts(m)
    return m
