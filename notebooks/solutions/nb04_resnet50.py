"""Solutions to the exercises of notebook 04 (ResNet-50). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import numpy as np
import torch

from cudagraph_kit import capture_train_step, compare
from cudagraph_kit import capture


def exercise_1(curve, infer_dtypes, infer_batches, build_model, image_batch, graph_infer, samples, calls):
    """Predict the speedup at a batch size between two of the sweep from section 1's host-time model, then measure
    it."""
    batches = sorted(infer_batches)
    between = [b for lo, hi in zip(batches, batches[1:]) for b in [(lo + hi) // 2] if lo < b < hi]
    new_batch = between[-2] if len(between) > 1 else between[0] if between else batches[-1] + 1  # full sweep: 48
    dname, dtype = next(iter(infer_dtypes.items()))
    c = curve[dname]
    floor = np.interp(new_batch, c["graph"].index, c["graph"].floor_us)          # before measuring
    kernels = np.interp(new_batch, c["eager"].index, c["eager"].kernels_per_call)
    predicted_speedup = float(max(kernels * c["launch_us"], floor) / floor)

    model = build_model(dtype)

    def infer(x, model=model):
        with torch.no_grad():
            return model(x)

    x = image_batch(new_batch, dtype)
    new_graph = capture(infer, x, eager_fallback=True)
    fresh = image_batch(new_batch, dtype, seed=200)
    ref = infer(fresh).float()
    assert (new_graph(fresh).float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item() + 1e-3
    new_table = compare({"eager": infer, graph_infer: new_graph}, fresh, case=f"inference {dname} bs{new_batch}",
                        samples=samples, calls=calls)
    e, g = new_table.iloc[0], new_table.iloc[1]
    bound = "launch-bound" if e.kernels_per_call * c["launch_us"] > g.floor_us else "GPU-bound"
    return {"new_batch": new_batch, "predicted_speedup": predicted_speedup, "new_graph": new_graph,
            "new_table": new_table, "bound": bound}


def exercise_2(small_cnn, digits_loader, warmup_cosine, loss_fn, steps_per_epoch, max_norm, device, cuda):
    """One epoch of section 4's loop, eager and graphed, recording the gradient norm before clipping."""
    def one_epoch(graphed):
        model = small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=cuda)
        sched = warmup_cosine(opt, steps_per_epoch, warmup=max(1, steps_per_epoch // 10))
        step, norms = None, []
        for x, y in digits_loader(seed=1):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if graphed:
                if step is None:
                    step = capture_train_step(model, opt, loss_fn, (x, y), max_grad_norm=max_norm,
                                              eager_fallback=True)
                step(x, y)
                norms.append(step.grad_norm.clone())  # the graph writes the next norm into the same tensor
            else:
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
                opt.step()
            sched.step()
        return norms

    torch.backends.cudnn.deterministic, before = True, torch.backends.cudnn.deterministic
    norms_eager, norms_graphed = one_epoch(False), one_epoch(True)
    torch.backends.cudnn.deterministic = before
    clipped_fraction = sum(float(n) > max_norm for n in norms_graphed) / len(norms_graphed)
    return {"norms_eager": norms_eager, "norms_graphed": norms_graphed, "clipped_fraction": clipped_fraction}
