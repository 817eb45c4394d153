"""Solutions to the exercises of notebook 06 (variable shapes: buckets, planner, memory ledger). Try them first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import statistics

import torch

from cudagraph_kit import capture_buckets, evaluate_buckets, ladder, plan_buckets


def exercise_1(max_rows, history, seed, history_sizes, mlp, sample):
    """Plan buckets for uniform traffic with as many graphs as the default ladder; capture and verify them."""
    gen = torch.Generator().manual_seed(seed + 3)
    uniform_sizes = torch.randint(1, max_rows + 1, (history,), generator=gen).tolist()
    k = len(ladder(max_rows))
    uniform_plan = plan_buckets(uniform_sizes, max_graphs=k, max_size=max_rows)
    skewed_plan = plan_buckets(history_sizes, max_graphs=uniform_plan.n_graphs, max_size=max_rows)
    for name, sizes in (("default ladder", ladder(max_rows)), ("planned on the history", skewed_plan.sizes),
                        ("planned on uniform traffic", uniform_plan.sizes)):
        print(f"{name:28s} {sizes}: {evaluate_buckets(uniform_sizes, sizes)['pad_fraction']:.1%} padded on uniform "
              f"traffic, {evaluate_buckets(history_sizes, sizes)['pad_fraction']:.1%} on the history")
    a, b = statistics.mean(uniform_plan.sizes), statistics.mean(skewed_plan.sizes)
    moved = "larger" if a > b else "smaller" if a < b else "same"

    serve_uniform = capture_buckets(mlp, sample, sizes=uniform_plan.sizes, eager_fallback=True)
    padded = [n for n in range(1, max_rows + 1) if n not in uniform_plan.sizes]
    worst = max(serve_uniform.verify(sample[:n]) for n in padded)  # NaN padding: correct before fast
    assert worst < 1e-4, worst
    return {"uniform_sizes": uniform_sizes, "uniform_plan": uniform_plan, "moved": moved,
            "serve_uniform": serve_uniform}


def exercise_2(block_class, d_block, heads, sample):
    """Section 2's block with attention across the requests: its rows see each other, and padding leaks."""
    class BatchMixingBlock(block_class):
        def forward(self, x):                                  # x: (requests, seq, d)
            return super().forward(x.transpose(0, 1)).transpose(0, 1)   # the requests become the sequence

    model = BatchMixingBlock(d_block, heads).to(sample.device).eval()
    serve = capture_buckets(model, sample, eager_fallback=True)
    n = next(n for n in range(2, sample.shape[0]) if n not in serve.sizes)   # a size that gets padded
    mixing_leak = serve.verify(sample[:n])
    why = "b"
    return {"BatchMixingBlock": BatchMixingBlock, "mixing_leak": mixing_leak, "why": why}
