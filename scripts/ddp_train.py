"""Data-parallel training with torchrun + DistributedDataParallel, eager or one CUDA graph per step.

One run (each rank writes ``rank<r>.csv``; rank 0 gathers ``steps.csv`` and ``run.json`` into ``--out``)::

    torchrun --nproc_per_node=2 scripts/ddp_train.py --model mlp --mode graph --steps 1000 --out build/ddp/mlp-graph
    torchrun --nproc_per_node=2 scripts/ddp_train.py --model resnet50 --mode eager --amp bf16 --out build/ddp/r50

The sweep (eager and graph, MLP and ResNet-50, back to back; sized for a few minutes on two GPUs, env.json records
how long it took) writes
``<out>/07_data_parallel_sweep/`` (results.csv, per_rank.csv, steps.csv.gz, env.json, PNGs)::

    python scripts/ddp_train.py --sweep --nproc 2 --out figures

What is measured, per rank and per step: the interval between consecutive step-end CUDA events on the GPU's
timeline (no synchronize per step; see ``cudagraph_kit.ddp.StepTimer``), the host time per step, the loss; per
run: images (samples) per second over a window with one synchronize at each end. ``--sync-each-step`` adds a
``torch.cuda.synchronize()`` after every step to show what that does to the time and its spread.

Synthetic data (a few fixed batches per rank, cycled), AMP (bf16, or fp16 with a GradScaler), AdamW
(capturable on CUDA) with a LambdaLR warm-up + cosine schedule, gradient-norm clipping: the eager loop does
these itself; the graphed step gets them from ``capture_train_step`` (``max_grad_norm=``, and it copies the
scheduler's LR into the GPU tensor the captured optimizer step reads).
Without CUDA the eager path runs with the gloo backend; ``--mode graph`` is refused with the kit's no-CUDA error.
NVLink multicast (NVLS) and symmetric-memory multicast stay off.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Keep NVLink multicast off in every process that could create a NCCL communicator (set before any init).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
os.environ.update(MULTICAST_OFF)

STEM = "07_data_parallel_sweep"  # notebook 07 saves its own run as 07_data_parallel
MODELS = ("mlp", "resnet50")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--mode", choices=("eager", "graph"), default="eager")
    p.add_argument("--steps", type=int, default=500, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=20,
                   help="untimed steps first (graph mode: at least 17 = 11 eager DDP warm-ups + capture + 5)")
    p.add_argument("--batch", type=int, default=64, help="batch per rank")
    p.add_argument("--amp", choices=("bf16", "fp16", "none"), default="none")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup-frac", type=float, default=0.1)
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--sync-each-step", action="store_true")
    p.add_argument("--parity-steps", type=int, default=20, help="graph mode: eager-vs-graph steps first (0: skip)")
    p.add_argument("--distinct-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "build" / "ddp_run"))
    p.add_argument("--sweep", action="store_true", help="run the eager/graph x MLP/ResNet-50 sweep and save results")
    p.add_argument("--nproc", type=int, default=2, help="with --sweep: processes (GPUs) per run")
    p.add_argument("--runs-dir", default=None, help="with --sweep: where the runs' raw files go (build/ddp_runs)")
    p.add_argument("--smoke", action="store_true", help="with --sweep: few steps")
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

MLP_SIZES = (256, 512, 512, 512, 10)  # input, hidden x3, classes


# ----------------------------------------------------------------------------------------------------------------
# models, data, optimizer
# ----------------------------------------------------------------------------------------------------------------
def build_model(name: str, image_size: int):
    """The model and a function making one synthetic batch (x, y) for it."""
    if name == "mlp":
        d_in, *hidden, classes = MLP_SIZES
        layers, prev = [], d_in
        for h in hidden:
            layers += [torch.nn.Linear(prev, h), torch.nn.ReLU()]
            prev = h
        model = torch.nn.Sequential(*layers, torch.nn.Linear(prev, classes))

        def batch(n, gen):
            return torch.randn(n, d_in, generator=gen), torch.randint(0, classes, (n,), generator=gen)
        return model, batch
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(num_classes=100)  # TorchAcc's setup: a 100-class head

        def batch(n, gen):
            x = torch.randn(n, 3, image_size, image_size, generator=gen)
            return x, torch.randint(0, 100, (n,), generator=gen)
        return model, batch
    raise ValueError(f"--model must be one of {MODELS}, got {name!r}")


def lr_factor(step: int, total: int, warmup_frac: float) -> float:
    """Linear warm-up over ``warmup_frac`` of the steps, then cosine decay to 0 (a factor of the base LR)."""
    w = max(1, int(total * warmup_frac))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - w) / max(1, total - w))))


def make_optimizer(model, args, device, total_steps: int):
    """AdamW (capturable on CUDA, so the graphed step reads its LR on the GPU) and a LambdaLR schedule."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, capturable=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total_steps, args.lr_warmup_frac))
    return opt, sched


def eager_step(model, opt, loss_fn, amp_dtype, scaler, device, max_grad_norm):
    """The ordinary eager training step (what the graph replaces), with the same clipping."""
    params = [p for g in opt.param_groups for p in g["params"]]

    def run(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            if max_grad_norm:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm, error_if_nonfinite=False)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm, error_if_nonfinite=False)
            opt.step()
        return loss.detach()
    return run


# ----------------------------------------------------------------------------------------------------------------
# one rank's run
# ----------------------------------------------------------------------------------------------------------------
def make_trainer(args, info, mode, batches, seed, total_steps):
    """A fresh DDP model (same initial weights on every call), its step function in ``mode``, its LR schedule."""
    from cudagraph_kit.ddp import ddp_for_graphs
    from cudagraph_kit.train_step import capture_train_step

    torch.manual_seed(seed)
    net, _ = build_model(args.model, args.image_size)
    net = net.to(info.device)
    if args.model == "resnet50":
        net = net.to(memory_format=torch.channels_last)
    ids = [info.local_rank] if info.device.type == "cuda" else None
    if mode == "graph":
        model = ddp_for_graphs(net, device_ids=ids)  # rule 2: built on the capture stream
    else:
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=ids)
    opt, sched = make_optimizer(model, args, info.device, total_steps)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[args.amp]
    scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None
    loss_fn = torch.nn.CrossEntropyLoss()
    clip = args.clip_grad_norm or None
    if mode == "graph":  # rules 1 and 3 are checked/applied inside (warm-up raised to 11 eager DDP steps)
        step = capture_train_step(model, opt, loss_fn, batches[0], amp_dtype=amp_dtype, scaler=scaler,
                                  max_grad_norm=clip)
    else:
        step = eager_step(model, opt, loss_fn, amp_dtype, scaler, info.device, clip)
    return model, step, sched


def parity(args, info, batches, total):
    """Correct before fast: train eager DDP and graphed DDP from the same weights on the same batches."""
    results = {}
    for mode in ("eager", "graph"):
        model, step, sched = make_trainer(args, info, mode, batches, args.seed, total)
        losses = []
        for i in range(args.parity_steps):
            losses.append(step(*batches[i % len(batches)]))
            sched.step()
        results[mode] = (torch.stack(losses).float().cpu(), [p.detach().float().clone() for p in model.parameters()],
                         getattr(step, "state", None))
        del model, step, sched
        gc.collect()
    (le, pe, _), (lg, pg, state) = results["eager"], results["graph"]
    diff = max((a - b).abs().max().item() for a, b in zip(pe, pg))
    rel = ((lg - le).abs() / le.abs().clamp_min(1e-8)).max().item()
    fp32 = args.amp == "none" and args.model == "mlp"
    ok = state == "captured" and (diff < 1e-4 if fp32 else rel < 0.05)
    return {"parity_steps": args.parity_steps, "parity_max_abs_param_diff": diff, "parity_max_rel_loss_diff": rel,
            "parity_graph_state": state, "parity_ok": bool(ok),
            "parity_rule": "max |param diff| < 1e-4 (fp32 MLP)" if fp32 else "max relative loss diff < 5%"}


def graph_launches_per_step(step, batches, start: int, steps: int = 3) -> float:
    """After the timing: run a few more steps under torch.profiler and count cudaGraphLaunch calls per step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):  # every rank runs the same steps: their all-reduces pair up
            step(*batches[(start + i) % len(batches)])
        torch.cuda.synchronize()
    return sum("GraphLaunch" in e.name for e in prof.events() if e.device_type != DeviceType.CUDA) / steps


def run_rank(args):
    """What one torchrun worker does: set up, check parity (graph mode), time the steps, gather on rank 0."""
    import torch.distributed as dist

    from cudagraph_kit.graphed import NO_CUDA_MESSAGE, NoCudaError
    from cudagraph_kit.ddp import DDP_MIN_WARMUP, StepTimer, async_error_handling_value, setup_distributed_for_graphs

    if args.mode == "graph" and not torch.cuda.is_available():
        raise NoCudaError(NO_CUDA_MESSAGE + " In this script: --mode eager runs the eager path (gloo on the CPU).")
    info = setup_distributed_for_graphs()  # rule 1: async error handling off, then init_process_group
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator().manual_seed(args.seed * 1000 + info.rank)  # each rank its own data
    _, make_batch = build_model(args.model, args.image_size)
    fmt = torch.channels_last if args.model == "resnet50" else torch.contiguous_format
    batches = []
    for _ in range(args.distinct_batches):
        x, y = make_batch(args.batch, gen)
        batches.append((x.to(info.device).contiguous(memory_format=fmt) if x.dim() == 4 else x.to(info.device),
                        y.to(info.device)))
    untimed = max(args.warmup_steps, DDP_MIN_WARMUP + 1 + 5) if args.mode == "graph" else args.warmup_steps
    if 0 < args.parity_steps < DDP_MIN_WARMUP + 2:  # the parity run must reach the capture and a replay
        args.parity_steps = DDP_MIN_WARMUP + 2
    total = untimed + args.steps

    check = parity(args, info, batches, total) if args.mode == "graph" and args.parity_steps > 0 else {}
    if check and not check["parity_ok"]:
        raise RuntimeError(f"rank {info.rank}: graphed DDP training differs from eager: {check}")
    if info.device.type == "cuda":
        torch.cuda.empty_cache()

    model, step, sched = make_trainer(args, info, args.mode, batches, args.seed, total)
    for i in range(untimed):  # graph mode: 11 eager warm-ups, the capture, then replays
        step(*batches[i % len(batches)])
        sched.step()
    timer = StepTimer(args.steps, sync_each_step=args.sync_each_step, device=info.device)
    losses = []
    timer.start()
    for i in range(args.steps):
        losses.append(step(*batches[(untimed + i) % len(batches)]))
        sched.step()  # a Python float per group; the graphed step copies it to the GPU before its next replay
        timer.step_done()
    rows = timer.finish()
    losses = torch.stack(losses).float().cpu().tolist()
    launches = graph_launches_per_step(step, batches, untimed + args.steps) if info.device.type == "cuda" else 0.0
    executed_as = "cuda graph" if launches >= 1 else "eager"  # from the profiler, never from the mode's name
    for r, loss in zip(rows, losses):
        r.update(rank=info.rank, loss=loss)
    kit_step = repr(step) if hasattr(step, "mode") else "eager loop"
    warmup_before_capture = getattr(step, "warmup_steps", None)
    eager_steps = getattr(step, "eager_steps", 0)
    del step, model, sched  # graphs that captured NCCL work go before the process group does
    gc.collect()
    if info.device.type == "cuda":
        torch.cuda.synchronize()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / f"rank{info.rank}.csv", rows)
    summary = {
        "rank": info.rank, "local_rank": info.local_rank, "device": str(info.device),
        "gpu": torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else None,
        "window_s": timer.window_s, "executed_as": executed_as,
        "kit_step": kit_step, "warmup_steps_before_capture": warmup_before_capture,
        "eager_steps_during_timing": eager_steps, "graph_launches_per_step": launches,
        "first_loss": losses[0], "last_loss": losses[-1], **check,
    }
    gathered = [None] * info.world_size if info.rank == 0 else None
    dist.gather_object((rows, summary), gathered, dst=0)
    if info.rank == 0:
        all_rows = [row for rank_rows, _ in gathered for row in rank_rows]
        summaries = [s for _, s in gathered]
        _write_csv(out / "steps.csv", all_rows)
        window = max(s["window_s"] for s in summaries)
        run = {
            "model": args.model, "mode": args.mode, "amp": args.amp, "batch_per_rank": args.batch,
            "image_size": args.image_size if args.model == "resnet50" else None,
            "steps": args.steps, "untimed_steps": untimed, "sync_each_step": args.sync_each_step,
            "world_size": info.world_size, "backend": info.backend,
            "images_per_s": info.world_size * args.batch * args.steps / window, "window_s": window,
            "executed_as": sorted({s["executed_as"] for s in summaries}),
            "clock": rows[0]["clock"], "lr": args.lr, "lr_schedule": f"LambdaLR: linear warm-up {args.lr_warmup_frac:.0%}, cosine",
            "clip_grad_norm": args.clip_grad_norm, "optimizer": "AdamW" + (" (capturable)" if info.device.type == "cuda" else ""),
            "torch": torch.__version__, "nccl": _nccl_version() if info.backend == "nccl" else None,
            "env": {k: os.environ.get(k) for k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", *MULTICAST_OFF)},
            "async_error_handling_at_init": async_error_handling_value(),
            "ranks": summaries,
        }
        (out / "run.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
        print(f"[{args.model} {args.mode}{' sync' if args.sync_each_step else ''}] {info.world_size} rank(s): "
              f"{run['images_per_s']:,.0f} images/s, executed as {run['executed_as']}, -> {out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _write_csv(path: Path, rows: list):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# ----------------------------------------------------------------------------------------------------------------
# launching and collecting runs (no torchrun needed here)
# ----------------------------------------------------------------------------------------------------------------
def torchrun_command(nproc: int, script_args: list, port: int | None = None) -> list:
    """The torchrun command line for one run, on 127.0.0.1 only."""
    from cudagraph_kit.ddp import free_port

    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={port or free_port()}", str(Path(__file__).resolve()),
            *map(str, script_args)]


def launch(nproc: int, script_args: list, timeout_s: int = 600, quiet: bool = False,
           port: int | None = None) -> subprocess.CompletedProcess:
    """Run one torchrun job and wait for it; raises ``RuntimeError`` with its output if it fails."""
    env = dict(os.environ, **MULTICAST_OFF)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo and NCCL's bootstrap on the loopback interface
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = torchrun_command(nproc, script_args, port)
    started = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 and not _gathered_on_gloo(script_args, started):
        raise RuntimeError(f"torchrun failed (exit {proc.returncode}): {' '.join(cmd)}\n--- stdout\n"
                           f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}")
    if proc.returncode != 0:  # every rank's results were gathered and written; a rank then failed in shutdown
        why = next((line.strip() for line in proc.stderr.splitlines() if "terminate" in line or "Signal" in line),
                   "see its stderr")
        print(f"torchrun: exit {proc.returncode} after rank 0 had gathered every rank's results into run.json: a "
              f"gloo rank failed while shutting down ({why}). The run's results are complete.", flush=True)
    if not quiet:
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)", flush=True)
    return proc


def _gathered_on_gloo(script_args: list, started: float) -> bool:
    """Whether this launch's gloo run wrote its ``run.json`` (rank 0 writes it once every rank's results are in)."""
    args = [str(a) for a in script_args]
    if "--out" not in args or args.index("--out") + 1 >= len(args):
        return False
    path = Path(args[args.index("--out") + 1]) / "run.json"
    try:
        return path.stat().st_mtime >= started - 1 and json.loads(path.read_text()).get("backend") == "gloo"
    except (OSError, ValueError):
        return False


AMP_LABEL = {"none": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler"}


def case_name(run: dict) -> str:
    if run["model"] == "mlp":
        what = f"MLP {'x'.join(map(str, MLP_SIZES))}, batch {run['batch_per_rank']}/rank"
    else:
        what = f"ResNet-50 {run['image_size']}px, batch {run['batch_per_rank']}/rank"
    return f"{what}, {AMP_LABEL[run['amp']]}, {run['world_size']} rank(s)"


def variant_name(run: dict) -> str:
    name = "whole-step graph" if run["mode"] == "graph" else "eager"
    if run["mode"] == "graph" and "cuda graph" not in run["executed_as"]:
        name += " (eager fallback)"
    return name + (", sync each step" if run["sync_each_step"] else "")


def collect(run_dirs: list):
    """Read runs written by ``run_rank``: (results table, per-rank table, all steps)."""
    import pandas as pd

    from cudagraph_kit.ddp import jitter_summary, per_rank_summary

    steps, meta = [], []
    for d in map(Path, run_dirs):
        run = json.loads((d / "run.json").read_text())
        s = pd.read_csv(d / "steps.csv")
        s.insert(0, "variant", variant_name(run))
        s.insert(0, "case", case_name(run))
        steps.append(s)
        meta.append(run)
    steps = pd.concat(steps, ignore_index=True)
    table = jitter_summary(steps)
    by_key = {(case_name(r), variant_name(r)): r for r in meta}
    table["executed_as"] = [", ".join(by_key[k]["executed_as"]) for k in zip(table.case, table.variant)]
    table["images_per_s"] = [by_key[k]["images_per_s"] for k in zip(table.case, table.variant)]
    table["clock"] = [by_key[k]["clock"] for k in zip(table.case, table.variant)]
    for col in ("model", "amp", "batch_per_rank", "world_size", "sync_each_step"):
        table[col] = [by_key[k][col] for k in zip(table.case, table.variant)]
    for col in ("parity_ok", "parity_max_abs_param_diff", "parity_max_rel_loss_diff"):
        table[col] = [by_key[k]["ranks"][0].get(col) for k in zip(table.case, table.variant)]
    table["gpus"] = [", ".join(sorted({str(s["gpu"]) for s in by_key[k]["ranks"]})) for k in zip(table.case, table.variant)]
    # speedup within each case: the case's first (eager, no sync) row over this row, and the same for images/s
    base = table.groupby("case").median_us.transform("first")
    table["speedup"] = base / table.median_us
    table["throughput_speedup"] = table.images_per_s / table.groupby("case").images_per_s.transform("first")
    table["floor_us"] = float("nan")  # not measured: a profiler session inside DDP ranks would skew the timing
    first = ["case", "variant", "executed_as", "median_us", "speedup", "images_per_s", "throughput_speedup",
             "iqr_us", "p99_us", "max_us", "jitter_p99_over_median", "rank_median_spread_us",
             "step_rank_diff_median_us", "step_rank_diff_p99_us", "host_median_us"]
    table = table[first + [c for c in table.columns if c not in first]]
    return table, per_rank_summary(steps), steps, meta


ISSUE_STEPS = (1, 5)  # steps 1-4 of the timed window: the GPU's queue is still short, the CPU has not waited yet
CPU_BOUND_SHARE = 0.8  # issuing a step takes at least 80% of the step: the CPU has no room to get ahead


def issue_times(steps, first: int = ISSUE_STEPS[0], last: int = ISSUE_STEPS[1]):
    """How long the CPU takes to *issue* one step, per (case, variant), against the step time.

    The host time between step returns (``host_us``) includes the time the CPU waits (a full launch queue, a
    blocking call, a synchronize), so over a whole run it is about the step time whether the CPU is busy or
    idle. The timed window opens with a synchronize, though: in its first steps the GPU's queue is short and
    the CPU has not waited yet, so their host time is the time to issue a step. ``issue_us``: the median host
    time of steps ``first`` .. ``last - 1`` on each rank, the slowest rank's (an all-reduce waits for it);
    ``issue_share``: ``issue_us`` / the median step time. A share near 1 (at least ``CPU_BOUND_SHARE``) means
    the CPU never gets ahead of its GPU: the step is CPU-bound. Runs with a synchronize per step wait from the
    first step on, so they get no value (NaN); with the host clock (no CUDA) host time is the step time.

    Example::

        issue_times(pd.read_csv("figures/07_data_parallel_sweep/steps.csv.gz"))
    """
    head = steps[(steps.step >= first) & (steps.step < last)]
    per_rank = head.groupby(["case", "variant", "rank"], sort=False).host_us.median()
    out = per_rank.groupby(["case", "variant"], sort=False).max().rename("issue_us").reset_index()
    step_us = steps.groupby(["case", "variant"], sort=False).step_us.median().rename("step_median_us")
    out = out.merge(step_us.reset_index(), on=["case", "variant"])
    out.loc[out.variant.str.contains("sync each step"), "issue_us"] = float("nan")
    out["issue_share"] = out.issue_us / out.step_median_us
    out["cpu_bound"] = [bool(v >= CPU_BOUND_SHARE) if v == v else None for v in out.issue_share]
    return out


def plot_step_times(steps, title: str = ""):
    """Per-rank step-time distributions (right) and step time against step (left), one row per case."""
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    cases = list(dict.fromkeys(steps.case))
    fig, axes = plt.subplots(len(cases), 2, figsize=(15, 3.9 * len(cases)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.3, 1]})
    for (ax_t, ax_d), case in zip(axes, cases):
        g = steps[steps.case == case]
        ranks, data, groups = [], [], []   # one violin per (variant, rank); the variant named once under its ranks
        for ci, variant in enumerate(dict.fromkeys(g.variant)):
            first = len(data) + 1
            for rank in sorted(g[g.variant == variant]["rank"].unique()):
                s = g[(g.variant == variant) & (g["rank"] == rank)].sort_values("step")
                ax_t.plot(s.step, s.step_us / 1e3, lw=0.7, alpha=0.8, color=f"C{ci}",
                          ls="-" if rank == 0 else "--", label=f"{variant}, rank {rank}")
                ranks.append(f"rank {rank}")
                data.append(s.step_us.to_numpy() / 1e3)
            groups.append(((first + len(data)) / 2, textwrap.fill(variant, 16), f"C{ci}"))
        ax_t.set(yscale="log", xlabel="timed step", ylabel="step time (ms)", title=case)
        ax_t.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the lines, not over them
        parts = ax_d.violinplot(data, showmedians=True, showextrema=True)
        for body in parts["bodies"]:
            body.set_alpha(0.5)
        for i, d in enumerate(data, 1):
            ax_d.scatter([i], [np.percentile(d, 99)], marker="_", s=200, color="k", zorder=3)
        ax_d.set_xticks(range(1, len(ranks) + 1), ranks, fontsize=7)
        for x, name, color in groups:
            ax_d.annotate(name, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -22),
                          textcoords="offset points", ha="center", va="top", fontsize=7, color=color)
        ax_d.set(yscale="log", ylabel="step time (ms)", title="distribution per rank (black tick: p99)")
        for ax in (ax_t, ax_d):
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_locator(LogLocator(subs=(2, 5)))   # 0.2, 0.5, 2, 5, ...: labelled, never crowded
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
            ax.tick_params(axis="y", which="minor", labelsize=7)
    fig.suptitle(title or "Per-rank step time")
    fig.tight_layout()
    return fig


def plot_throughput(table, title: str = ""):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.45 * len(table)))
    labels = [f"{c.split(',')[0]} · {v}" for c, v in zip(table.case, table.variant)]
    ax.barh(range(len(table)), table.images_per_s, color=[f"C{i % 10}" for i in range(len(table))])
    for i, (ips, sp) in enumerate(zip(table.images_per_s, table.throughput_speedup)):
        ax.text(ips, i, f" {ips:,.0f}/s ({sp:.2f}x)", va="center", fontsize=8)
    ax.set_yticks(range(len(table)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="images (samples) per second, all ranks", title=title or "Throughput")
    fig.tight_layout()
    return fig


SWEEP = [  # (model, mode, extra args); all on the same number of ranks
    ("mlp", "eager", []), ("mlp", "graph", []),
    ("mlp", "eager", ["--sync-each-step"]), ("mlp", "graph", ["--sync-each-step"]),
    ("resnet50", "eager", []), ("resnet50", "graph", []),
]


def sweep(nproc: int, out: Path, runs_dir: Path | None = None, smoke: bool = False) -> Path:
    """Run eager and graph for the MLP and ResNet-50 back to back, then save ``<out>/07_data_parallel_sweep/``."""
    from cudagraph_kit.env import has_cuda

    if not has_cuda():
        raise SystemExit("the sweep compares CUDA graphs with eager on GPUs: it needs CUDA. On a CPU run "
                         "`torchrun --nproc_per_node=2 scripts/ddp_train.py --mode eager` (gloo) instead.")
    if torch.cuda.device_count() < nproc:
        raise SystemExit(f"--nproc {nproc} needs {nproc} GPUs, this machine has {torch.cuda.device_count()}.")
    runs_dir = Path(runs_dir or ROOT / "build" / "ddp_runs")
    dirs, t0 = [], time.perf_counter()
    for model, mode, extra in SWEEP:
        if model == "mlp":
            args = ["--batch", 64, "--steps", 100 if smoke else 1000, "--amp", "none"]
        else:
            args = ["--batch", 64, "--steps", 20 if smoke else 200, "--amp", "bf16"]
        tag = f"{model}-{mode}" + ("-sync" if extra else "")
        d = runs_dir / tag
        launch(nproc, ["--model", model, "--mode", mode, *args, *extra, "--out", d])
        dirs.append(d)
    return save_sweep(dirs, out, seconds=time.perf_counter() - t0)


def save_sweep(run_dirs: list, out: Path, seconds: float | None = None) -> Path:
    """Collect finished runs into ``<out>/07_data_parallel_sweep/``: results.csv, per_rank.csv, steps.csv.gz, env.json, PNGs."""
    from cudagraph_kit.course.measuring import results

    table, per_rank, steps, meta = collect(run_dirs)
    world = meta[0]["world_size"]
    gpus = sorted({str(s["gpu"]) for r in meta for s in r["ranks"]})
    where = f"{world} x {', '.join(gpus)}" if meta[0]["backend"] == "nccl" else f"{world} CPU processes (gloo, eager)"
    figs = {"step_time_distributions": plot_step_times(steps, f"Per-rank step time, eager vs CUDA graph, on {where}"),
            "throughput": plot_throughput(table, f"DDP throughput on {where}")}
    folder = results.save(STEM, table, figures=figs, root=out, extra_env={
        "world_size": world, "gpus_per_rank": {s["rank"]: s["gpu"] for s in meta[0]["ranks"]},
        "nccl": meta[0]["nccl"], "distributed_env": meta[0]["env"],
        "sweep_seconds": None if seconds is None else round(seconds),
        "runs": [{k: r[k] for k in ("model", "mode", "amp", "batch_per_rank", "steps", "sync_each_step", "clock")}
                 for r in meta]})
    per_rank.to_csv(folder / "per_rank.csv", index=False)
    steps.drop(columns=["clock"]).to_csv(folder / "steps.csv.gz", index=False, float_format="%.6g")  # every step
    print(table[["case", "variant", "executed_as", "median_us", "speedup", "images_per_s", "p99_us",
                 "rank_median_spread_us"]].round(1).to_string(index=False))
    print(f"saved to {folder}" + ("" if seconds is None else f"; the sweep took {seconds:.0f} s"))
    return folder


def main(args: argparse.Namespace):
    if args.sweep:
        sweep(args.nproc, Path(args.out), args.runs_dir, smoke=args.smoke)
        return
    run_rank(args)


if __name__ == "__main__":
    try:
        main(ARGS)
    except Exception as exc:  # one clear line per rank on stderr, then the traceback
        print(f"ddp_train.py: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
