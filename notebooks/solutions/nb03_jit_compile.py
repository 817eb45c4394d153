"""Solutions to the exercises of notebook 03 (jit.script / torch.compile with CUDA graphs). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import pandas as pd
import torch

from cudagraph_kit import compare
from cudagraph_kit import capture


def exercise_1(compiled, gelu, x, samples, calls):
    """Ten calls of the compiled GELU in one graph; ``x = inputs["small"]``."""
    g1 = capture(compiled, x, eager_fallback=True)
    g10 = capture(compiled, x, calls_per_graph=10, eager_fallback=True)
    torch.testing.assert_close(g10(x), gelu(x), rtol=1e-4, atol=1e-4)  # correct before fast
    # pass g10.replay itself: compare() divides its time by g10.calls_per_graph
    table = compare({"eager": lambda: gelu(x), "compiled graph, 1 call": g1.replay,
                     "compiled graph, 10 calls": g10.replay}, case="small", samples=samples, calls=calls)
    return {"g10": g10, "table": table}


def exercise_2(fresh, with_mark_step, mlp_width, mlp_batch, depths, samples, calls, cuda):
    """The section-6 MLP at several depths: eager vs torch.compile vs reduce-overhead, one compare() per depth."""
    def make_mlp(layers, width):
        torch.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods).to("cuda" if cuda else "cpu").requires_grad_(False)

    if not cuda:  # reduce-overhead builds CUDA graphs: the sweep needs an NVIDIA GPU
        return {"make_mlp": make_mlp, "depth_table": ..., "ro_wins_from": ...}
    frames = []
    for layers in depths:
        mlp = make_mlp(layers, mlp_width)
        x = torch.randn(mlp_batch, mlp_width, device="cuda")

        def forward(x, mlp=mlp):
            return mlp(x)

        variants = {"eager": mlp, "torch.compile": torch.compile(fresh(forward), dynamic=False),
                    "reduce-overhead + mark_step_begin": with_mark_step(
                        torch.compile(fresh(forward), mode="reduce-overhead", dynamic=False))}
        ref = mlp(x)
        for fn in variants.values():
            for _ in range(3):  # compile, record, replay
                fn(x)
            torch.testing.assert_close(fn(x), ref, rtol=1e-4, atol=1e-4)  # correct before fast
        df = compare(variants, x, case=f"MLP {layers}x(Linear {mlp_width}+ReLU), batch {mlp_batch}",
                     samples=samples, calls=calls)
        df["layers"] = layers
        frames.append(df)
    depth_table = pd.concat(frames, ignore_index=True)
    ro_wins_from = None
    for layers, d in depth_table.groupby("layers"):  # sorted by depth
        r = d[d.variant == "reduce-overhead + mark_step_begin"].iloc[0]
        c = d[d.variant == "torch.compile"].iloc[0]
        if r.speedup > 1 and r.median_us < c.median_us:
            ro_wins_from = int(layers)
            break
    return {"make_mlp": make_mlp, "depth_table": depth_table, "ro_wins_from": ro_wins_from}


def exercise_3(ro, compiled, with_mark_step, gelu, x, samples, calls, cuda):
    """Keep reduce-overhead outputs across calls with .clone(), and what that costs per call."""
    f = with_mark_step(ro) if cuda else compiled  # on a CPU there is no reduce-overhead graph to call

    def keep_output(x):
        return f(x).clone()  # the next replay overwrites f's output; the clone is ours

    if not cuda:
        return {"keep_output": keep_output, "clone_table": ..., "clone_cost_us": ...}
    clone_table = compare({"eager": gelu, "reduce-overhead, y = f(x)": f,
                           "reduce-overhead, y = f(x).clone()": keep_output}, x, case="small",
                          samples=samples, calls=calls)
    t = clone_table.set_index("variant")
    clone_cost_us = t.loc["reduce-overhead, y = f(x).clone()", "median_us"] - t.loc["reduce-overhead, y = f(x)",
                                                                                    "median_us"]
    return {"keep_output": keep_output, "clone_table": clone_table, "clone_cost_us": clone_cost_us}


def exercise_4(fresh, gelu, x, samples, calls, cuda):
    """torch.compile(mode="max-autotune-no-cudagraphs") against the default mode: compare their floors."""
    autotuned = torch.compile(fresh(gelu), mode="max-autotune-no-cudagraphs", dynamic=False)
    torch.testing.assert_close(autotuned(x), gelu(x), rtol=1e-4, atol=1e-4)  # compiles, then checks
    if not cuda:  # floors come from graph replays on a GPU
        return {"autotuned": autotuned, "autotune_table": ...}
    default = torch.compile(fresh(gelu), dynamic=False)
    default(x)
    g_default, g_auto = capture(default, x), capture(autotuned, x)
    autotune_table = compare({"eager": lambda: gelu(x), "torch.compile + graph, input in place": g_default.replay,
                              "max-autotune + graph, input in place": g_auto.replay}, case="small",
                             samples=samples, calls=calls)
    return {"autotuned": autotuned, "autotune_table": autotune_table}
