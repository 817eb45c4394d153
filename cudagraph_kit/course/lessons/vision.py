"""The image models and data of notebook 04.

Torchvision ResNets with random weights (nothing downloaded), synthetic image batches for inference and for
training, the optimizers it compares, the eager AMP training step a graphed one is checked against, and
scikit-learn's 8x8 digits with a small CNN, its loader, learning-rate schedule and accuracy for the accuracy-parity
runs.

The CUDA-graph code (``capture``, ``capture_train_step`` and the training loop) stays in the notebook.

Example::

    from cudagraph_kit.course.lessons import vision
    model = vision.build_model("resnet50", torch.float16, "cuda")
    x = vision.image_batch(8, 224, torch.float16, "cuda")
"""
from __future__ import annotations

import contextlib
import copy

import torch

__all__ = ["OPTIMIZERS", "AMP", "build_model", "image_batch", "ToFloat", "build_train_model", "train_batch",
           "make_optimizer", "eager_train_step", "copies", "digits_split", "small_cnn", "warmup_cosine",
           "digits_loader", "accuracy", "deterministic_runs"]

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


def copies(model):
    """Two independent copies of ``model`` (eager and graphed start from the same weights)."""
    return copy.deepcopy(model), copy.deepcopy(model)


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


def deterministic_runs(train, runs, **kw) -> dict:
    """``{name: train(graphed, **kw)}`` for each ``(name, graphed)`` of ``runs``, with cuDNN's deterministic
    convolutions on (the setting put back after), so that a difference between two runs is a real one."""
    before, torch.backends.cudnn.deterministic = torch.backends.cudnn.deterministic, True
    try:
        return {name: train(graphed, **kw) for name, graphed in runs}
    finally:
        torch.backends.cudnn.deterministic = before


def recorded_checks(rec, which: str) -> str:
    """Without a GPU: what notebook 04's recorded GPU run (``rec``: ``results.load("04_resnet50")``, None if absent)
    checked before timing, labelled with its GPU and date. ``which``: ``"losses"`` (section 2: eager and graphed
    training losses) or ``"parity"`` (section 3: the final parameters of the digits runs).

    >>> recorded_checks(None, "losses")
    'No recorded GPU run of this notebook was found.'
    """
    if rec is None or rec.env.get("executed_as") != "cuda":
        return "No recorded GPU run of this notebook was found."
    df, head = rec.df, f"Recorded on {rec.env.get('gpu')}, {rec.env.get('date')}:"
    if which == "losses":
        rel = df[df.section == "training"].max_rel_loss_diff.dropna()
        return (f"{head} {len(rel)} cases, eager and graphed losses agree within {100 * rel.max():.2f}%."
                if len(rel) else f"{head} no loss check was recorded.")
    if which == "parity":
        rows = df[(df.section == "accuracy parity") & df.max_abs_param_diff.notna()]
        return "\n".join([head] + [f"  {r.case.removeprefix('parity digits CNN final parameters, ')}: max |diff| "
                                   f"{r.max_abs_param_diff:.3g}, bitwise equal: {r.params_bitwise_equal}"
                                   for r in rows.itertuples()])
    raise ValueError(f"unknown check {which!r}: 'losses' or 'parity'")


def _sweeps(table):
    """The inference cases' (dtype, batch) and the training cases' (AMP path, batch) of notebook 04's results."""
    return (table.case.str.extract(r"^inference (.+) bs(\d+)$").dropna(),    # the dtype and batches of the sweep
            table.case.str.extract(r"^train (.+?) bs(\d+), ").dropna())      # the main AMP path first


def first_cases(table) -> tuple:
    """(inference dtype, its smallest batch, training AMP path, its smallest batch) of notebook 04's results (this
    run's or the recorded run's): what its takeaways name."""
    inf, trn = _sweeps(table)
    return inf[0].iloc[0], inf[1].astype(int).min(), trn[0].iloc[0], trn[1].astype(int).min()


def this_run_speedups(table, published, graph_infer: str, graph_train: str) -> list[str]:
    """For each row of notebook 04's published figures (columns ``experiment``, ``batch``), this run's graph speedup
    with its 90% interval at the same batch ("1.23x (1.20-1.26)"; the sweep's dtype, the main AMP path's SGD), or
    "not measured"; ``table``: the run's (or the recorded run's) results."""
    inf, trn = _sweeps(table)

    def one(experiment, batch):
        if (inf if experiment == "inference" else trn).empty:
            return "not measured"
        case, variant = ((f"inference {inf[0].iloc[0]} bs{batch}", graph_infer) if experiment == "inference" else
                         (f"train {trn[0].iloc[0]} bs{batch}, {OPTIMIZERS['SGD momentum']}", graph_train))
        rows = table[(table.case == case) & (table.variant == variant)]
        return ("not measured" if rows.empty else
                f"{rows.speedup.iloc[0]:.2f}x ({rows.speedup_pi_lo.iloc[0]:.2f}-{rows.speedup_pi_hi.iloc[0]:.2f})")
    return [one(e, b) for e, b in zip(published.experiment, published.batch)]
