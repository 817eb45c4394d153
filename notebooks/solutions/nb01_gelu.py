"""Solutions to the exercises of notebook 01 (GELU on a small vs a large tensor). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import math

import pandas as pd
import torch

from cudagraph_kit import compare
from cudagraph_kit import capture


def exercise_1(x, samples, calls):
    """One fused kernel: ``x = inputs["small"]``."""
    def fused_gelu(x):
        return torch.nn.functional.gelu(x)  # approximate="none": the same function as the hand-written one

    g = capture(fused_gelu, x, eager_fallback=True)
    torch.testing.assert_close(g(x), fused_gelu(x))  # correct before fast
    fused_table = compare({"eager": lambda: fused_gelu(x), "graph replay": g.replay}, case="small",
                          samples=samples, calls=calls)
    return {"fused_gelu": fused_gelu, "fused_table": fused_table, "g": g}


def exercise_2(gelu, sweep_min_exp, sweep_max_exp, device, samples, calls, crossover):
    """The size sweep of section 5 in float16; ``crossover`` is the float32 one from section 5."""
    frames = []
    for e in range(sweep_min_exp, sweep_max_exp + 1):
        n = 2 ** e
        x = torch.randn(n, device=device, dtype=torch.float16)
        g = capture(gelu, x, eager_fallback=True)
        torch.testing.assert_close(g(x), gelu(x))
        df = compare({"eager": lambda x=x: gelu(x), "graph replay": g.replay}, case=f"sweep float16 2^{e}",
                     samples=samples, calls=calls)
        df["numel"], df["dtype"] = n, "float16"
        frames.append(df)
    sweep16 = pd.concat(frames, ignore_index=True)
    graph16 = sweep16[sweep16.variant.str.startswith("graph")]
    below = graph16[graph16.speedup < 1.10]
    crossover16 = int(below.numel.min()) if len(below) else None
    c16, c32 = (math.inf if c is None else c for c in (crossover16, crossover))  # None: beyond the sweep
    answer = "larger" if c16 > c32 else "smaller" if c16 < c32 else "same"
    return {"sweep16": sweep16, "crossover16": crossover16, "answer": answer}


def exercise_3(graphs, inputs, gelu, cuda):
    """The kit's error for a tensor the graph was not captured for; host memory read by a graph."""
    g = graphs["small"]
    bad = inputs["small"].cpu() if cuda else inputs["small"].double()  # on a CPU run: another dtype
    try:
        g(bad)
        kit_message = None
    except (TypeError, ValueError) as exc:
        kit_message = str(exc)

    def host_copy_capture(pinned):
        shape = inputs["small"].shape
        x_host = torch.randn(shape, pin_memory=pinned)  # allocated before the capture; must outlive the graph
        static = torch.empty(shape, device="cuda")
        side = torch.cuda.Stream()                      # warm-up on a side stream, as in section 2
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static.copy_(x_host, non_blocking=True)
            gelu(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static.copy_(x_host, non_blocking=True)  # a blocking copy would synchronize: never captured
                out = gelu(static)
        except RuntimeError as exc:
            torch.cuda.synchronize()
            return {"captured": False, "error": str(exc), "replay_reads_new_values": None}
        x_host.copy_(torch.randn(shape))                 # new values, written after the capture
        graph.replay()
        torch.cuda.synchronize()
        expected = gelu(x_host.to("cuda"))
        return {"captured": True, "error": None,
                "replay_reads_new_values": torch.allclose(out, expected, atol=1e-6)}

    why = "b"
    return {"kit_message": kit_message, "host_copy_capture": host_copy_capture, "why": why}
