"""Solutions to the exercises of notebook 07 (data-parallel training with CUDA graphs). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from cudagraph_kit import capture_train_step, compare
from cudagraph_kit.ddp import ddp_for_graphs, free_port, setup_distributed_for_graphs


def exercise_1(local_steps):
    """The spread across ranks, per variant, from the raw per-step times of section 4."""
    rank_spread = {}
    for variant, g in local_steps.groupby("variant", sort=False):
        medians = g.groupby("rank").step_us.median()
        per_step = g.pivot_table(index="step", columns="rank", values="step_us")
        diff = (per_step.max(axis=1) - per_step.min(axis=1)).dropna()
        rank_spread[variant] = (float(medians.max() - medians.min()), float(diff.quantile(0.99)))
    return {"rank_spread": rank_spread}


def exercise_2(demo_model, demo_batches, loss_fn, cuda, samples, calls):
    """Section 2's graphed DDP step timed against eager DDP, with and without a loss.item() per step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    setup_distributed_for_graphs()                              # rank 0 of 1: NCCL with CUDA, gloo without
    ids = [0] if cuda else None
    eager_model = DDP(demo_model(), device_ids=ids)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-3, capturable=cuda)

    def eager(x, y):
        eager_opt.zero_grad(set_to_none=True)
        loss = loss_fn(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        return loss.detach()

    model = ddp_for_graphs(demo_model(), device_ids=ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=cuda)
    step = capture_train_step(model, opt, loss_fn, demo_batches[0], eager_fallback=True)
    x, y = demo_batches[0]
    for _ in range(step.warmup + 2):                            # 11 eager DDP steps, the capture, a replay
        step(x, y)
    item_table = compare({"eager": eager, "whole-step graph": step,
                          "whole-step graph + loss.item()": lambda x, y: step(x, y).item()},
                         x, y, case="DDP MLP, one process", samples=samples, calls=calls)
    rows = item_table.set_index(item_table.variant.str.replace(" (eager fallback)", "", regex=False))
    item_cost_us = float(rows.median_us["whole-step graph + loss.item()"] - rows.median_us["whole-step graph"])
    keeps_lead = bool(rows.speedup["whole-step graph + loss.item()"] > 1)
    del step, model, opt, eager_model, eager_opt                # a graph with NCCL work goes before its group
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()
    return {"item_table": item_table, "item_cost_us": item_cost_us, "keeps_lead": keeps_lead}
