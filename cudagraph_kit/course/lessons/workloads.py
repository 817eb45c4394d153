"""Notebook 08's parts that are not the lesson: the two compiled variants' builders, the verdicts of its decode-step
and whole-generation timings, the serving loop's scheduler, the figure, the batch-16 kernel table and two small
readers (window medians, Dynamo's compile count).

The serving loop: requests arrive at random (``make_stream``, seeded), each with a one-token prompt and a length;
at most ``max_batch`` are decoded together; a finished request's hole is filled by the last row (its cache row
too), so the active requests always fill rows ``0..n-1`` and a bucket's padding rows are free rows.

Example (eager, CPU)::

    from cudagraph_kit.course.nb08_parts import batch_sizes, make_stream, serve_stream
    stream = make_stream(seed=10, steps=30, max_batch=4, max_gen=8)
    tokens = {}
    serve_stream(lambda t, p: model.decode(t, p, cache), stream, cache, 4, cfg.vocab_size, record=tokens)
    batch_sizes(stream, 4)        # the batch size of every step
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .measure import window_medians

__all__ = ["make_stream", "batch_sizes", "serve_stream", "Runs", "serve_table", "step_mode", "profiled_mode",
           "with_window_medians", "per_batch", "check_row", "first_calls", "setup_table", "attempt", "host_bound",
           "decode_vs_prefill", "step_claims", "generation_claims", "reduce_overhead_step", "compile_then_capture",
           "compiles_so_far", "kernel_table", "plot_decode"]


def make_stream(seed: int, steps: int, max_batch: int, max_gen: int) -> list:
    """Per step: the lengths of the requests arriving then; a deterministic host-side schedule that keeps the batch
    near 80% of ``max_batch`` (lengths uniform in 1..max_gen)."""
    g = torch.Generator().manual_seed(seed)
    rate = max_batch / (max_gen / 2) * 0.8
    arrivals = torch.poisson(torch.full((steps,), rate), generator=g).long().tolist()
    lengths = iter((1 + (torch.rand(sum(arrivals) + 1, generator=g) * max_gen).long()).tolist())
    return [[next(lengths) for _ in range(k)] for k in arrivals]


def batch_sizes(stream, max_batch: int) -> list:
    """The batch size of every step of a stream (the same for every strategy: it depends on the schedule alone)."""
    sizes, active, queue = [], [], []
    for arriving in stream:
        queue += arriving
        while queue and len(active) < max_batch:
            active.append(queue.pop(0))
        if active:
            sizes.append(len(active))
        active = [r - 1 for r in active if r > 1]
    return sizes


def serve_stream(step, stream, cache, max_batch: int, vocab_size: int, record=None) -> list:
    """Run ``stream`` through ``step(tokens, pos) -> logits``; tokens and positions stay on the cache's device and
    the host only counts. With ``record`` (a dict) keep each request's tokens: ``{request id: [tokens]}``."""
    device = cache.k.device
    tokens = torch.zeros(max_batch, dtype=torch.long, device=device)
    pos = torch.zeros(max_batch, dtype=torch.long, device=device)
    active, queue, next_id, log = [], [], 0, []      # active: [request id, tokens left], row i = active[i]
    for arriving in stream:
        for length in arriving:
            queue.append((next_id, length))
            next_id += 1
        while queue and len(active) < max_batch:
            rid, length = queue.pop(0)
            r = len(active)
            tokens[r] = 1 + rid % (vocab_size - 1)       # its one-token prompt
            pos[r] = 0
            active.append([rid, length])
        n = len(active)
        if n == 0:
            continue
        nxt = step(tokens[:n], pos[:n]).argmax(-1)
        tokens[:n] = nxt
        pos[:n] += 1
        if record is not None:
            log.append((nxt, [a[0] for a in active]))
        done = []
        for i, a in enumerate(active):
            a[1] -= 1
            if a[1] == 0:
                done.append(i)
        for i in reversed(done):                         # fill each hole with the last row
            last = len(active) - 1
            if i != last:
                cache.move_row(last, i)
                tokens[i] = tokens[last]
                pos[i] = pos[last]
                active[i] = active[last]
            active.pop()
    if record is not None:
        for nxt, ids in log:
            for rid, t in zip(ids, nxt.tolist()):
                record.setdefault(rid, []).append(t)
    return log


class Runs:
    """``fn()`` as a timed variant that says what it replays: ``mode`` is "eager", or that of ``graphs`` (a kit
    capture or ``BucketedGraphs``: "graph", or "eager" where it fell back), so ``compare`` labels the row
    truthfully in windows without the profiler. Example: ``Runs(lambda: serve(graphs, stream), graphs)``."""

    def __init__(self, fn, graphs="eager"):
        self.fn = fn
        self.mode = graphs if isinstance(graphs, str) else getattr(graphs, "mode", None)

    def __call__(self):
        return self.fn()


def serve_table(m_serve, strategies: dict, sizes_of: dict, observed: list, same: dict, ledger):
    """The serving loop's table: ``with_window_medians(m_serve)`` plus, per strategy, time per step, tokens per
    second, the share of requests decoded as eager (``same``), its number of graphs, capture time, the memory they
    hold (``ledger.record``), its bucket sizes and the padding share of the computed rows on ``observed``. A strategy
    whose graphs ran eagerly (no GPU) gets no speedup: it would compare eager with eager."""
    from ..bucket_plan import evaluate_buckets
    from .measure import ran_eagerly

    df = with_window_medians(m_serve)
    name = df.variant.str.replace(" (eager fallback)", "", regex=False)
    df["us_per_step"] = df.median_us / len(observed)
    df["tokens_per_s"] = sum(observed) / (df.median_us * 1e-6)
    df["same_tokens_as_eager"] = name.map(same)
    df["graphs"] = name.map(lambda n: len(sizes_of[n]))
    df["setup_s"] = name.map(lambda n: getattr(strategies[n], "capture_seconds", 0.0))
    df["held_mib"] = name.map(lambda n: ledger.record(n, strategies[n]).get("held", float("nan")) / 2 ** 20
                              if sizes_of[n] else 0.0)
    df["bucket_sizes"] = name.map(lambda n: " ".join(map(str, sizes_of[n])))
    df["pad_fraction"] = name.map(lambda n: evaluate_buckets(observed, sizes_of[n])["pad_fraction"]
                                  if sizes_of[n] else 0.0)
    df.loc[ran_eagerly(df), [c for c in ("speedup", "speedup_lo", "speedup_hi") if c in df]] = float("nan")
    return df


def step_mode(m, case: str, variant: str) -> str:
    """What ``variant`` ran as in ``case`` of a profiled ``Measured`` ``m`` (the decode step's), as a ``Runs`` mode:
    "graph" where the profiler saw graph launches, else "eager" (also where the row is missing). A whole generation
    of that step then needs no profiler of its own to say what it ran as."""
    try:
        return "graph" if m.row(case, variant).executed_as == "cuda graph" else "eager"
    except KeyError:
        return "eager"


def profiled_mode(fn) -> str:
    """Call ``fn()`` once under the profiler (after one warm call) and return "graph" if it launched a CUDA graph,
    else "eager"; "eager" without CUDA. For a variant whose graphs are made inside it (``generate`` compiled by
    ``transformers``): one profiled call of graph replays is cheap, unlike profiling eager generations."""
    from ..timing import gpu_time

    g = gpu_time(fn, calls=1, warmup=1)
    return "graph" if g is not None and g.graph_launches > 0 else "eager"


def with_window_medians(m):
    """``m.table`` (a ``Measured``) with each row's per-window medians, ";"-joined (``window_medians_us``), so a
    saved table lets anyone recompute a ratio between two of its rows window by window."""
    t = m.table.copy()
    t["window_medians_us"] = [window_medians(m.windows, c, v, ".6g") for c, v in zip(t.case, t.variant)]
    return t


def per_batch(m, case_of: dict, tokens_per_row: int = 1):
    """``with_window_medians(m)`` with a ``batch`` column (``case_of``: {batch: case}) and ``tokens_per_s``: every
    row of the batch makes ``tokens_per_row`` tokens per timed call. Example: ``per_batch(m_gen, GEN_CASE, 32)``."""
    df = with_window_medians(m)
    df["batch"] = df.case.map({c: b for b, c in case_of.items()})
    df["tokens_per_s"] = df.batch * tokens_per_row / (df.median_us * 1e-6)
    return df


def check_row(variant: str, tokens, logits: list, reference, reference_logits: list, batch=None, **extra) -> dict:
    """One row of a correctness table: ``variant`` (and ``batch``, if given), its greedy tokens against the
    reference's (``first_divergence``: equal, or where they first differ and whether that is a near tie), the largest
    |logit difference| over all steps, then ``extra`` columns (e.g. the first call's time)."""
    from .tiny_llm import first_divergence

    d = first_divergence(tokens, reference, logits, reference_logits)
    return {"variant": variant, **({} if batch is None else {"batch": batch}), "tokens_equal": d["equal"],
            "first_step": d["first_step"], "rows_differing": d["rows_differing"], "margin": d["margin"],
            "logit_diff": d["logit_diff"], "near_tie": bool(d["near_tie"]),
            "max_logit_diff": max((a.float() - r.float()).abs().max().item() for a, r in zip(logits, reference_logits)),
            **extra}


def first_calls(variants, batches, generate, reference: dict, errors: dict, ledger, skip=lambda label, batch: None):
    """Each variant's first call at each batch size, checked against the reference and timed (a compile or a
    recording included): ``generate(label, batch, logits_out)`` returns the tokens, ``reference[batch]`` is
    (tokens, logits). A variant that fails (``attempt``) or that ``skip(label, batch)`` skips (it returns the
    reason) stops there, its error in ``errors``. Returns (the ``check_row`` rows, {(variant, batch): seconds},
    {variant: graph-pool growth in bytes during its first calls, ``MemoryLedger.measure``}).

    Example::

        rows, first_s, pool_growth = first_calls(["eager", "graphs"], [1, 4], generate, eager_ref, {}, MemoryLedger())
    """
    import time

    rows, seconds, growth = [], {}, {}
    for label in variants:
        with ledger.measure(f"first calls, {label}") as mem:
            for b in batches:
                reason = skip(label, b)
                if reason:
                    errors.setdefault(label, reason)
                if label in errors:
                    break
                t0, logits = time.perf_counter(), []
                tokens = attempt(label, lambda: generate(label, b, logits), errors)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if tokens is None:
                    break
                seconds[label, b] = time.perf_counter() - t0
                rows.append(check_row(label, tokens, logits, *reference[b], batch=b, first_call_s=seconds[label, b]))
        growth[label] = mem.get("graph_pool_growth", float("nan"))
    return rows, seconds, growth


def setup_table(rows: list):
    """What each graphed variant cost to set up, one row per variant: ``rows`` of {variant, compile_s, capture_s,
    graph_mib[, compiles_in_capture]} (missing values NaN); printed, and returned with ``case`` "setup" for the saved
    results."""
    import pandas as pd

    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return df.assign(case="setup", median_us=float("nan"), speedup=float("nan"))


def attempt(label: str, fn, errors: dict):
    """``fn()``, or None if it raised: the error goes into ``errors[label]`` (for the tables) and is printed with
    the last frames of its traceback, so that one failing variant does not stop the others.

    Example::

        compiled = attempt("reduce-overhead", build_compiled, variant_errors)
    """
    import traceback

    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure of one variant is reported, the notebook goes on
        errors[label] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        print(f"{label}: failed, {errors[label]}\n"
              + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4)[-6:-1]))
        return None


def host_bound(m, claim_id: str, case: str, floor_us: float):
    """The claim "eager is host-bound in ``case``": eager's time interval over the GPU-busy ``floor_us`` of the
    step is above 2x, so the GPU sits idle most of each eager step."""
    from .claims import Claim

    eager, times = m.row(case, "eager"), "an eager step takes {lo:.1f}-{hi:.1f}x the GPU's busy time"
    return Claim(claim_id, lo=eager.median_pi_lo / floor_us, hi=eager.median_pi_hi / floor_us, above=2.0,
                 subject=f"{case}: eager against the floor",
                 holds=f"{case}: {times}: host-bound, the GPU sits idle most of each step",
                 fails=f"{case}: {times}: at most 2x, so not host-bound by this test",
                 unclear=f"{case}: {times}: too close to 2x to call")


def decode_vs_prefill(m, claim_id: str, decode: tuple, prefill: tuple, what: str, eager_fallback: bool):
    """The claim "a graph buys a decode step more than it buys prefill": the decode row's speedup over the prefill
    row's, window by window (``decode`` and ``prefill`` are (case, variant) of ``m``; ``what`` names the decode
    step in the sentence, e.g. "a decode step at batch 64")."""
    from ..intervals import prediction_interval
    from .claims import Claim

    ratios = [float(d) / float(p) for d, p in zip(m.row(*decode).window_speedups.split(";"),
                                                  m.row(*prefill).window_speedups.split(";"))]
    lo, hi = prediction_interval(ratios)
    gains = f"a graph's speedup on {what} is {{lo:.2f}}-{{hi:.2f}}x its speedup on prefill"
    return Claim(claim_id, lo=lo, hi=hi, eager_fallback=eager_fallback,
                 subject="a graph's speedup on a decode step against prefill's", holds=gains,
                 fails=f"a graph's speedup on prefill is {{inv_lo:.2f}}-{{inv_hi:.2f}}x its speedup on {what}",
                 unclear=gains + ": too close to call")


def step_claims(m, step_case: dict, step_cases: dict, floors: dict, prefill_case: str, kit: str, fused: str,
                eager_fallback: bool) -> list:
    """Section 7's verdicts from its ``Measured`` ``m``: per batch (``step_case``: {batch: case}; ``step_cases``: {case:
    (timed variants, inputs)}) the kit's graph (``kit``) against eager, ``reduce-overhead`` against the kit's graph,
    the compiled step captured by the kit (``fused``) against ``reduce-overhead`` (the aim: more than 5% faster),
    eager against twice the floor (``floors``: {batch: GPU-busy µs}); then the graph against eager on prefill (the
    aim: more than 10% faster), and the graph's speedup on a decode step at the largest batch against prefill's."""
    from .claims import speedup, versus

    out = []
    for b, case in step_case.items():
        timed = step_cases[case][0]
        out.append(speedup(m, f"step_graph_beats_eager_b{b}", case, kit))
        for cid, fast, slow, above in ((f"step_reduce_overhead_beats_graph_b{b}", "reduce-overhead", kit, 1.0),
                                       (f"step_fused_graph_beats_reduce_overhead_b{b}", fused, "reduce-overhead", 1.05)):
            if {fast, slow} <= set(timed):
                out.append(versus(m, cid, (case, fast), (case, slow), above=above))
        if b in floors:
            out.append(host_bound(m, f"step_eager_host_bound_b{b}", case, floors[b]))
    out.append(speedup(m, "prefill_graph_saves_10pct", prefill_case, "graph", above=1.10))
    b = max(step_case)
    out.append(decode_vs_prefill(m, "decode_gains_more_than_prefill", (step_case[b], kit), (prefill_case, "graph"),
                                 f"a decode step at batch {b}", eager_fallback=eager_fallback))
    return out


def generation_claims(m, gen_case: dict, gen_cases: dict, kit: str, hf_static: str, hf_dynamic: str) -> list:
    """Section 8's verdicts from its ``Measured`` ``m``, per batch (``gen_case``: {batch: case}): the kit's graphs
    (``kit``) against eager, ``reduce-overhead`` against the kit's graphs, the kit's graphs against ``transformers``'
    static-cache ``generate``, and that against its dynamic cache; each only where both variants were timed."""
    from .claims import speedup, versus

    out = []
    for b, case in gen_case.items():
        timed = gen_cases[case][0]
        out.append(speedup(m, f"generate_graphs_beat_eager_b{b}", case, kit))
        for cid, fast, slow in ((f"generate_reduce_overhead_beats_graphs_b{b}", "reduce-overhead", kit),
                                (f"generate_graphs_beat_hf_static_b{b}", kit, hf_static),
                                (f"generate_hf_static_beats_hf_dynamic_b{b}", hf_static, hf_dynamic)):
            if {fast, slow} <= set(timed):
                out.append(versus(m, cid, (case, fast), (case, slow)))
    return out


def reduce_overhead_step(step, cache):
    """``torch.compile(step, mode="reduce-overhead")`` of a decode step on ``cache``: the cache's buffers are marked as
    static addresses (``torch._dynamo.mark_static_address``, as ``transformers`` does), so the graphs may write them
    in place, and every call starts a new step (``cudagraph_mark_step_begin``): the previous step's outputs may then
    be overwritten."""
    for buf in (cache.k, cache.v):
        torch._dynamo.mark_static_address(buf)
    fn = torch.compile(step, mode="reduce-overhead")

    def compiled(tokens, pos):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(tokens, pos)
    return compiled


def compile_then_capture(model, cache, sample_tokens, sample_pos, sizes, ledger, setup: dict):
    """The decode step compiled in the default mode (Inductor's fused kernels, no CUDA graphs; ``dynamic=True``, so
    one compile serves every bucket), then captured per bucket by ``capture_buckets`` in one shared pool. It is
    compiled first on the kind of input the capture passes, views shorter than their buffer (half the largest
    batch), and at size 1 (PyTorch specializes it), so the capture compiles nothing. ``setup`` receives compile_s,
    compiles, capture_s, compiles_in_capture and graph_mib (``ledger.record``: pool plus static buffers)."""
    import time

    from ..bucket_graphs import capture_buckets
    from ..graphed import fresh_cublas_workspace

    def fused_decode(tokens, pos):   # a function of its own: Dynamo keeps one cache per function
        return model.decode(tokens, pos, cache)
    step = fresh_cublas_workspace(torch.compile(fused_decode, dynamic=True))
    t0, n0 = time.perf_counter(), compiles_so_far()
    for n in (max(2, len(sample_tokens) // 2), 1):
        step(sample_tokens[:n], sample_pos[:n])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    setup.update(compile_s=time.perf_counter() - t0, compiles=compiles_so_far() - n0)
    n0 = compiles_so_far()
    graphs = capture_buckets(step, sample_tokens, sample_pos, sizes=sizes)
    setup.update(capture_s=graphs.capture_seconds, compiles_in_capture=compiles_so_far() - n0,
                 graph_mib=ledger.record("compile + kit buckets", graphs).get("held", float("nan")) / 2 ** 20)
    return graphs


def compiles_so_far() -> int:
    """How many graphs Dynamo has compiled in this process (``torch._dynamo``'s own counter); 0 if unreadable."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a counter PyTorch may rename: then no count
        return 0


def _matmul_kernel(name: str) -> str:
    """A cuBLAS kernel's family and tile shape, e.g. 'gemm 32x128x8' (the full names run to 200 characters)."""
    tile = re.search(r"tilesize(\d+x\d+x\d+)", name)
    return ("gemv" if "gemv" in name else "gemm") + (f" {tile.group(1)}" if tile else "")


def kernel_table(folder):
    """The recorded batch-16 study (``scripts/probes/probe_decode_kernels.py``) in ``folder``: each batch's and variant's top
    matmul kernel with its time per step and the step's GPU-busy time, and one sentence; ``(None, why)`` if absent."""
    import pandas as pd

    folder = Path(folder)
    if not (folder / "decode_kernels.csv").is_file():
        return None, (f"not recorded ({folder / 'decode_kernels.csv'} is missing): on a GPU, run\n"
                      "    python scripts/probes/probe_decode_kernels.py --out figures/08_decode_kernels")
    kernels, steps = pd.read_csv(folder / "decode_kernels.csv"), pd.read_csv(folder / "decode_steps.csv")
    gemm = kernels[kernels.name.str.contains("gemm|gemv", case=False)].copy()
    gemm["kernel"] = gemm.name.map(_matmul_kernel)
    top = gemm.sort_values("total_us", ascending=False).groupby(["variant", "batch"]).head(1)
    table = top.merge(steps, on=["variant", "batch"]).sort_values(["batch", "variant"])
    table = table[["batch", "variant", "kernel", "total_us", "busy_us"]].rename(
        columns={"total_us": "top matmul µs/step", "busy_us": "GPU busy µs/step"}).reset_index(drop=True)
    graph = table[table.variant == "graph"].set_index("batch")
    slow = graph["GPU busy µs/step"].idxmax()
    later = graph[graph.index > slow]
    if not len(later):
        return table, ""
    fast = later["GPU busy µs/step"].idxmin()
    same = (table.groupby("batch").kernel.nunique() == 1).all()
    return table, (f"Batch {slow} keeps the GPU busy {graph.loc[slow, 'GPU busy µs/step']:.0f} µs per step and batch "
                   f"{fast} {graph.loc[fast, 'GPU busy µs/step']:.0f} µs; their top matmul kernels are "
                   f"{graph.loc[slow, 'kernel']} and {graph.loc[fast, 'kernel']}. Eager and the graph run "
                   f"{'the same' if same else 'different'} top kernels at each batch.")


def plot_decode(step_df, gen_df, serve_df, title: str):
    """Three panels: time per decode step against the batch (with the floor), tokens per second of whole
    generations, and the serving loop's time per step per strategy."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8))
    ax = axes[0]
    for v, d in step_df.groupby("variant", sort=False):
        ax.plot(d.batch, d.us_per_step, "o-", label=f"{v} ({d.executed_as.iloc[0]})")
    f = step_df.drop_duplicates("batch")
    if f.floor_step_us.notna().any():
        ax.plot(f.batch, f.floor_step_us, "k--", label="floor (GPU busy, kit graph)")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per decode step (= per token of a sequence)",
           title="decode step")
    ax.legend(fontsize=7)
    ax = axes[1]
    for v, d in gen_df.groupby("variant", sort=False):
        ax.plot(d.batch, d.tokens_per_s, "o-", label=v)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens / s (whole generation)",
           title="whole generations")
    ax.legend(fontsize=7)
    ax = axes[2]
    y = np.arange(len(serve_df))
    ax.barh(y, serve_df.us_per_step, color="C0")
    ax.set_yticks(y, [f"{v} ({int(g)} graphs)" for v, g in zip(serve_df.variant, serve_df.graphs.fillna(0))],
                  fontsize=7)
    for yi, (t, s) in enumerate(zip(serve_df.us_per_step, serve_df.speedup)):
        ax.text(t, yi, f" {t:.0f} µs, {s:.2f}x", va="center", fontsize=7)
    ax.set(xlabel="µs per decode step (median pass / steps)", title="serving loop, batch size changing every step")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
