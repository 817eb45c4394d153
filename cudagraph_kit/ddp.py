"""Data-parallel training (torchrun + DistributedDataParallel) with CUDA graphs, and per-step timing per rank.

PyTorch's CUDA-graphs notes ("Usage with DistributedDataParallel", NCCL >= 2.9.6) give three rules for capturing
a whole DDP training step:

1. NCCL's async error handling off *before* the process group is created
   (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``; before PyTorch 2.2 the name was ``NCCL_ASYNC_ERROR_HANDLING``).
   ``ProcessGroupNCCL`` reads the variable once, in its constructor, so setting it later does nothing. Note
   that ``torchrun`` puts ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` into every worker's environment unless it is set
   where torchrun starts, and the new name takes precedence over the old one.
2. DDP constructed inside a side-stream context. DDP keeps each parameter's ``AccumulateGrad`` node, and an
   autograd node remembers the stream that was current when it was created; one created on the default stream
   makes the captured backward wait on the default stream, which breaks the capture.
3. At least 11 DDP-enabled eager iterations before capture. (Why, as DDP's source shows: its logger times the
   first 10 iterations, and then every 100th, with CUDA events that it synchronizes at the start of the next
   forward; a synchronize inside a capture breaks it.)

This module does 1 and 2 for you (:func:`setup_distributed_for_graphs`, :func:`ddp_for_graphs`);
``capture_train_step`` checks 1, raises the warm-up to 11 for a DDP model (3), and warns when it cannot tell
how the model was constructed (2). What rule 1 costs: with async error handling off, PyTorch no longer tears
the process down when a collective fails or times out (let the job scheduler's time limit catch a hang).

It also measures what data-parallel training is about, step time per rank without a per-step synchronize
(:class:`StepTimer`), and summarises the spread across steps and across ranks (:func:`jitter_summary`).

Example (run with ``torchrun --nproc_per_node=2 train.py``)::

    import torch
    from cudagraph_kit.ddp import setup_distributed_for_graphs, ddp_for_graphs
    from cudagraph_kit.train_step import capture_train_step

    info = setup_distributed_for_graphs()                      # rule 1, then init_process_group
    model = ddp_for_graphs(make_model().to(info.device), device_ids=[info.local_rank])   # rule 2
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    step = capture_train_step(model, opt, torch.nn.functional.cross_entropy, (x0, y0))   # rule 3: 11 warm-ups
    for x, y in batches:
        loss = step(x, y)

Without CUDA the same code runs eagerly with the gloo backend (``capture_train_step(..., eager_fallback=True)``).
"""
from __future__ import annotations

import importlib.util
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass

import torch


if __package__:
    from . import graphed as _graphed  # the capture stream DDP is built on
else:  # this file copied beside graphed.py, outside the package: that graphed.py, never another on sys.path
    _here, _found = os.path.dirname(os.path.realpath(__file__)), importlib.util.find_spec("graphed")
    if not (_found and _found.origin and os.path.dirname(os.path.realpath(_found.origin)) == _here):
        raise ImportError(f"{os.path.basename(__file__)} needs the kit's graphed.py from its own folder {_here}, "
                          f"but `import graphed` finds {_found and _found.origin or 'nothing'}. Fix: copy "
                          "cudagraph_kit/graphed.py beside it, that folder first on sys.path.")
    import graphed as _graphed  # type: ignore[import-not-found, no-redef]
capture_stream, torch_release = _graphed.capture_stream, _graphed.torch_release

__all__ = ["setup_distributed_for_graphs", "ddp_for_graphs", "DistInfo", "StepTimer", "jitter_summary",
           "per_rank_summary", "async_error_handling_value", "free_port", "DDP_MIN_WARMUP"]

DDP_MIN_WARMUP = 11  # PyTorch's CUDA-graphs notes: at least 11 DDP-enabled eager iterations before capture
_ENV_NEW, _ENV_OLD = "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"
_INIT = {}  # the group setup_distributed_for_graphs created and the async error handling it had


def async_error_handling_value(environ=None) -> str | None:
    """The value ``ProcessGroupNCCL`` would read now: ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, else the old name.

    None when neither is set (PyTorch then uses its default, 3 = on, without clean-up). Example::

        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        assert async_error_handling_value() == "0"
    """
    env = os.environ if environ is None else environ
    return env.get(_ENV_NEW, env.get(_ENV_OLD))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class DistInfo:
    """Where this process sits in the job: ranks, its device, the backend."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def setup_distributed_for_graphs(backend: str | None = None, **init_kwargs) -> DistInfo:
    """Turn NCCL's async error handling off, then ``init_process_group``; return this process's :class:`DistInfo`.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` as torchrun sets them (a single process without torchrun
    becomes rank 0 of 1 on ``127.0.0.1``). ``backend`` defaults to ``"nccl"`` with CUDA and ``"gloo"`` without;
    with CUDA the process's device is set to ``cuda:LOCAL_RANK`` first. Raises if a process group exists
    already: the variable is read when the group is created, so it would be too late.

    Example::

        info = setup_distributed_for_graphs()
        print(info.rank, info.world_size, info.device)
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "setup_distributed_for_graphs() was called after torch.distributed.init_process_group(): NCCL's "
            "async error handling is read once, when the process group is created, so setting it now is too "
            f"late. Fix: call setup_distributed_for_graphs() instead of init_process_group(), or set "
            f"os.environ['{_ENV_NEW}'] = '0' before init_process_group().")
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    os.environ[_ENV_NEW] = "0"  # overrides torchrun's default of 1; the new name wins over the old one
    if torch_release() < (2, 2):
        os.environ[_ENV_OLD] = "0"  # PyTorch < 2.2 only knows the old name
    if "RANK" not in os.environ:  # a single process, not started by torchrun
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cuda and "nccl" in backend:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world, **init_kwargs)
    _INIT.clear()  # what this group was created with (a group created later by hand is not vouched for)
    _INIT.update(group=dist.distributed_c10d._get_default_group(), async_error_handling=async_error_handling_value())
    return DistInfo(rank, world, local_rank, device, backend)


def ddp_for_graphs(module: torch.nn.Module, stream=None, **ddp_kwargs):
    """Wrap ``module`` in ``DistributedDataParallel`` inside a side-stream context, ready for graph capture.

    By default the side stream is the kit's capture stream (``graphed.capture_stream``), the one
    ``capture_train_step`` warms up and captures on, so the ``AccumulateGrad`` nodes DDP keeps belong to the
    capture stream. The returned model carries a ``_cudagraph_kit`` dict (stream, async error handling at init)
    that ``capture_train_step`` checks. Without CUDA (gloo on the CPU) it is a plain
    ``DistributedDataParallel``. Example::

        model = ddp_for_graphs(model.to(info.device), device_ids=[info.local_rank])
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    params = list(module.parameters())
    if not (torch.cuda.is_available() and params and params[0].is_cuda):
        return DDP(module, **ddp_kwargs)
    device = params[0].device
    stream = capture_stream(device) if stream is None else stream
    if stream == torch.cuda.default_stream(device):
        raise ValueError("ddp_for_graphs needs a side stream, got the default stream: a DDP model constructed on "
                         "the default stream cannot be captured. Fix: pass stream=torch.cuda.Stream() or leave "
                         "stream=None.")
    stream.wait_stream(torch.cuda.current_stream(device))  # the module's initialisation happened on the current stream
    with torch.cuda.stream(stream):
        model = DDP(module, **ddp_kwargs)
    torch.cuda.current_stream(device).wait_stream(stream)  # DDP's broadcast of rank 0's parameters ran on `stream`
    at_init = _INIT.get("async_error_handling") if _INIT.get("group") is model.process_group else None
    model._cudagraph_kit = {"stream": stream, "async_error_handling_at_init": at_init}
    return model


class StepTimer:
    """Per-step times of a training loop, without a synchronize per step (unless asked for).

    With CUDA a timing event is recorded on the current stream after every step; the *step time* is the
    interval between consecutive events on the GPU's timeline: how often a step completes, including time the
    GPU waited for the CPU or, in an all-reduce, for the slowest rank. The host time between step returns is
    kept too (``host_us``): what the CPU spent issuing the step, when the CPU is not blocked. One synchronize
    at the start and one at the end give the window for the throughput. ``sync_each_step=True`` adds
    ``torch.cuda.synchronize()`` after every step, as a loop that calls ``loss.item()`` every step does.
    Without CUDA the host clock is the step time.

    Example::

        timer = StepTimer(steps=len(batches))
        timer.start()
        for x, y in batches:
            step(x, y)
            timer.step_done()
        rows = timer.finish()        # [{"step": 0, "step_us": ..., "host_us": ...}, ...]
        print(timer.window_s)
    """

    def __init__(self, steps: int, sync_each_step: bool = False, device=None):
        self.cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
        self.sync_each_step = sync_each_step
        self.steps = steps
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if self.cuda else []
        self.host = []
        self.window_s = None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self):
        self._sync()
        self.host = [time.perf_counter()]
        if self.cuda:
            self.events[0].record()

    def step_done(self):
        i = len(self.host)
        if self.cuda:
            self.events[i].record()
            if self.sync_each_step:
                torch.cuda.synchronize()
        self.host.append(time.perf_counter())

    def finish(self) -> list:
        """Synchronize once and return one dict per step (``step_us``, ``host_us``, ``clock``)."""
        self._sync()
        self.window_s = time.perf_counter() - self.host[0]
        n = len(self.host) - 1
        if n != self.steps:
            raise RuntimeError(f"StepTimer expected {self.steps} step_done() calls, got {n}.")
        clock = ("cuda events" + (" + sync each step" if self.sync_each_step else "")) if self.cuda else "host (CPU)"
        rows = []
        for i in range(n):
            host_us = (self.host[i + 1] - self.host[i]) * 1e6
            step_us = self.events[i].elapsed_time(self.events[i + 1]) * 1e3 if self.cuda else host_us
            rows.append({"step": i, "step_us": step_us, "host_us": host_us, "clock": clock})
        return rows


def _q(xs, q):
    """Quantile ``q`` in [0, 1] (linear interpolation)."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def per_rank_summary(steps):
    """One row per (case, variant, rank): median, IQR, p99, max and standard deviation of the step time (µs).

    ``steps`` is a DataFrame with columns case, variant, rank, step, step_us (and host_us).
    """
    import pandas as pd

    rows = []
    for (case, variant, rank), g in steps.groupby(["case", "variant", "rank"], sort=False):
        s = list(g.step_us)
        rows.append({"case": case, "variant": variant, "rank": int(rank), "steps": len(s),
                     "median_us": statistics.median(s), "iqr_us": _q(s, 0.75) - _q(s, 0.25),
                     "p99_us": _q(s, 0.99), "max_us": max(s),
                     "std_us": statistics.pstdev(s), "host_median_us": statistics.median(g.host_us)})
    return pd.DataFrame(rows)


def jitter_summary(steps):
    """One row per (case, variant): step time over all ranks and its spread across steps and across ranks.

    Columns: median_us, iqr_us, p99_us, max_us (all ranks pooled); jitter_p99_over_median (p99 / median);
    rank_median_spread_us (slowest minus fastest rank's median); step_rank_diff_median_us and
    step_rank_diff_p99_us (per step, the largest minus the smallest rank's step time; its median and p99 over
    steps); host_median_us (CPU time per step between step returns); ranks; steps (per rank).

    Example::

        table = jitter_summary(steps_df)    # steps_df: case, variant, rank, step, step_us, host_us
    """
    import pandas as pd

    rows = []
    for (case, variant), g in steps.groupby(["case", "variant"], sort=False):
        s = list(g.step_us)
        wide = g.pivot_table(index="step", columns="rank", values="step_us")
        per_step = (wide.max(axis=1) - wide.min(axis=1)).dropna().tolist()
        medians = g.groupby("rank").step_us.median()
        med = statistics.median(s)
        rows.append({
            "case": case, "variant": variant, "ranks": int(g["rank"].nunique()),
            "steps": int(g.groupby("rank").size().min()),
            "median_us": med, "iqr_us": _q(s, 0.75) - _q(s, 0.25), "p99_us": _q(s, 0.99), "max_us": max(s),
            "jitter_p99_over_median": _q(s, 0.99) / med if med > 0 else float("nan"),
            "rank_median_spread_us": float(medians.max() - medians.min()),
            "step_rank_diff_median_us": statistics.median(per_step) if per_step else 0.0,
            "step_rank_diff_p99_us": _q(per_step, 0.99) if per_step else 0.0,
            "host_median_us": statistics.median(g.host_us),
        })
    return pd.DataFrame(rows)
