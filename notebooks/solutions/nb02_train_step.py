"""Solutions to the exercises of notebook 02 (a whole training step as one CUDA graph). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import copy

import torch

from cudagraph_kit import capture_train_step, compare

GRAPH = "whole-step graph"


def exercise_1(make_model, make_opt, eager_amp_step, loss_fn, batches, dims, amp_steps, samples, calls, cuda):
    """Adam (capturable) with fp16 + GradScaler through ``capture_train_step``; ``dims = (N, D_IN, H, D_OUT)``."""
    still_eager = {"unscale + inf check", "optimizer.step", "scaler.update"}  # scaler.step and scaler.update
    if not cuda:  # AMP through a graph needs an NVIDIA GPU
        return {"still_eager": still_eager, "amp_adam_table": ..., "max_param_diff": ...}
    n, d_in, h, d_out = dims
    base = make_model(d_in, h, d_out, dropout=False)

    def amp_adam(model, graphed, sample):
        opt, scaler = make_opt("Adam(capturable)", model.parameters()), torch.amp.GradScaler("cuda")
        if graphed:
            return capture_train_step(model, opt, loss_fn, sample, amp_dtype=torch.float16, scaler=scaler)
        return eager_amp_step(model, opt, torch.float16, scaler)

    ref, test = copy.deepcopy(base), copy.deepcopy(base)  # parity first
    ref_step, step = amp_adam(ref, False, batches[0]), amp_adam(test, True, batches[0])
    for xb, yb in batches[:amp_steps]:
        ref_step(xb, yb)
        step(xb, yb)
    max_param_diff = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), test.parameters()))

    x, y = torch.randn(n, d_in, device="cuda"), torch.randn(n, d_out, device="cuda")
    amp_adam_table = compare({"eager": amp_adam(copy.deepcopy(base), False, (x, y)),
                              GRAPH: amp_adam(copy.deepcopy(base), True, (x, y))},
                             x, y, case=f"MLP {n}x{d_in}x{h}x{d_out}, Adam(capturable), AMP fp16 + GradScaler",
                             samples=samples, calls=calls)
    return {"still_eager": still_eager, "amp_adam_table": amp_adam_table, "max_param_diff": max_param_diff}


def exercise_2(make_model, loss_fn, batches, dims, device, cuda):
    """A StepLR schedule in the graphed loop: the lr is a tensor that the scheduler updates in place."""
    n, d_in, h, d_out = dims

    def train(graphed):
        model = make_model(d_in, h, d_out, dropout=False)  # same seed: the same initial weights each time
        lr = torch.tensor(1e-2, device=device)            # a tensor: replays read its current value
        opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=cuda)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)

        def eager_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

        step = capture_train_step(model, opt, loss_fn, batches[0], eager_fallback=True) if graphed else eager_step
        lrs = []
        for x, y in batches:
            step(x, y)
            sched.step()
            lrs.append(float(opt.param_groups[0]["lr"]))
        return model, opt, lrs

    graphed_model, optimizer, lrs = train(graphed=True)
    eager_model, _, _ = train(graphed=False)
    return {"graphed_model": graphed_model, "eager_model": eager_model, "optimizer": optimizer, "lrs": lrs}


def exercise_3(make_model, make_opt, loss_fn, timing, dims, device):
    """Three epochs of datasets of 1000, 1010 and 990 rows in batches of N (drop_last=False): short last batches."""
    n, d_in, h, d_out = dims
    short_batches = []
    for rows in (1000, 1010, 990):
        sizes = [n] * (rows // n) + ([rows % n] if rows % n else [])
        short_batches += [(torch.randn(s, d_in, device=device), torch.randn(s, d_out, device=device)) for s in sizes]
    predicted_eager_steps = sum(len(x) != n for x, _ in short_batches)  # only the sample batch's shape is captured

    model = make_model(d_in, h, d_out)
    short_step = capture_train_step(model, make_opt("SGD", model.parameters()), loss_fn, short_batches[0],
                                    eager_fallback=True)
    for x, y in short_batches:
        short_step(x, y)

    t = timing[timing.case == f"MLP {n}x{d_in}x{h}x{d_out}, SGD"]
    eager_us = t[t.variant == "eager"].median_us.iloc[0]
    graph_us = t[t.variant.str.startswith(GRAPH)].median_us.iloc[0]
    extra_us = short_step.eager_steps * (eager_us - graph_us)
    return {"short_batches": short_batches, "predicted_eager_steps": predicted_eager_steps, "short_step": short_step,
            "extra_us": extra_us}
