"""Decoding for notebook 08: K tokens per replay, the compiled decode steps, each variant's first calls, and
what the recorded GPU run saw where a cell needs a GPU.

Several greedy tokens per replay (K decode steps in one function, and so in one CUDA graph), the compiled
decode-step variants (reduce-overhead; compiled, then captured per bucket by the kit), and each variant's first
calls, checked against a reference and timed.

``k_step(step, k, pad_token)`` builds a function of the decode state ``(tokens, pos, done, stop)`` (tensors on one
device: three (b,) and the stop token, a 0-dim tensor, -1 for none) that runs ``k`` decode steps **in place**: each
step's argmax becomes the next step's input token on the device, a row that has produced the stop token is marked
done and from then on emits ``pad_token``, and the positions advance. It returns the ``k`` tokens of the block,
(b, k). Nothing in it reads a value on the host, so the same function runs eagerly (CPU tests) and captured in one
graph (GPU): because it updates its own inputs, replay after replay continues the sequences with no copy in
between, and because the stop token is a tensor, one graph serves every stop token.

``generate_blocks(run_block, state, first, new_tokens, k)`` is the host loop: one call per block of ``k`` tokens,
and once per block one host read (are all rows done?), never one per token.

Example (eager, CPU)::

    import torch
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM
    from cudagraph_kit.course.lessons.decode import decode_state, generate_blocks, k_step

    cfg = TinyConfig(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=128)
    model, cache = TinyLLM(cfg).eval(), StaticKVCache(cfg, max_batch=2, max_len=32)
    prompt = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        first = model.prefill(prompt, cache).argmax(-1)
        state = decode_state(first, prompt.shape[1], stop_token=7)
        block = k_step(lambda t, p: model.decode(t, p, cache), k=4)
        tokens = generate_blocks(lambda: block(*state), state, first, new_tokens=12, k=4)   # (2, 12)

With the kit: ``g = capture(block, *state)``; per sequence, copy its start state into ``g.static_inputs``
(:func:`load_state`), then ``generate_blocks(g.replay, g.static_inputs, first, ...)``.
"""
from __future__ import annotations

import math

import torch

from .compilers import compiles_so_far
from .tiny_llm import first_divergence

__all__ = ["k_step", "decode_state", "load_state", "generate_blocks", "generation", "stop_after",
           "positions_needed", "mid_block_stop", "NO_STOP", "reduce_overhead_step", "compile_then_capture",
           "check_row", "first_calls", "setup_table", "attempt"]

NO_STOP = -1   # the stop token of a sequence that never stops (no vocabulary id is negative)


def k_step(step, k: int, pad_token: int = 0):
    """``block(tokens, pos, done, stop) -> (b, k) tokens``: ``k`` greedy steps of ``step(tokens, pos) -> logits``.

    ``tokens``, ``pos`` (int64) and ``done`` (bool), all (b,), are the decode state, updated in place: after the
    call they hold the last token, the next position and which rows have stopped. ``stop``: the stop token, a
    0-dim int64 tensor (``NO_STOP`` for none). A done row keeps emitting ``pad_token`` (its row is still
    computed: the shapes stay fixed)."""
    if k < 1:
        raise ValueError(f"k (decode steps per block) must be >= 1, got {k}.")

    def block(tokens, pos, done, stop):
        out = []
        for _ in range(k):
            nxt = step(tokens, pos).argmax(-1).masked_fill(done, pad_token)
            done.logical_or_(nxt == stop)
            tokens.copy_(nxt)
            pos.add_(1)
            out.append(nxt)
        return torch.stack(out, dim=1)
    return block


def decode_state(first, prompt_len: int, stop_token: int | None = None):
    """The start state ``(tokens, pos, done, stop)`` after a prefill that produced ``first`` (b,): the next input
    is ``first`` at position ``prompt_len``; a row whose first token is already the stop token is done."""
    stop = torch.tensor(NO_STOP if stop_token is None else stop_token, dtype=torch.long, device=first.device)
    return first.clone(), torch.full_like(first, prompt_len), first == stop, stop


def load_state(static, state) -> None:
    """Copy a start state into a graph's static inputs (``GraphedCallable.static_inputs``)."""
    for s, v in zip(static, state):
        s.copy_(v)


def positions_needed(prompt_len: int, new_tokens: int, k: int) -> int:
    """Cache positions a generation of ``new_tokens`` (the first from prefill) in blocks of ``k`` writes: whole
    blocks run even when fewer tokens are kept."""
    return prompt_len + math.ceil(max(new_tokens - 1, 0) / k) * k


def generate_blocks(run_block, state, first, new_tokens: int, k: int, pad_token: int = 0, stats: dict | None = None):
    """Host loop: ``run_block()`` (a graph's ``replay`` or the eager block on ``state``) once per ``k`` tokens.

    ``state``: the ``(tokens, pos, done)`` tensors the block updates (for a graph: its static inputs, loaded with
    :func:`load_state`). Before each block the host reads ``done.all()`` once and stops when every row has
    stopped. Returns (b, new_tokens): ``first`` then the blocks' tokens (``pad_token`` after a row's stop token).
    ``stats`` (a dict) receives ``blocks`` (blocks run) and ``host_checks`` (host reads of ``done``)."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}.")
    done = state[2]
    out, have, checks = [first[:, None].clone()], 1, 0
    while have < new_tokens:
        checks += 1
        if bool(done.all()):                     # the one host read of a block
            break
        out.append(run_block().clone())          # the graph's output buffer is overwritten by the next replay
        have += k
    if stats is not None:
        stats.update(blocks=len(out) - 1, host_checks=checks)
    tokens = torch.cat(out, dim=1)
    if tokens.shape[1] < new_tokens:             # every row stopped: the rest is padding
        rest = torch.full_like(tokens[:, :1], pad_token).expand(-1, new_tokens - tokens.shape[1])
        tokens = torch.cat([tokens, rest], dim=1)
    return tokens[:, :new_tokens]


def generation(first, prompt_len: int, new_tokens: int, k: int, pad_token: int = 0, graph=None, step=None):
    """A callable that decodes one whole generation from ``first`` (b,) in blocks of ``k``, no stop token (for
    timing): with ``graph`` (a kit capture of ``k_step(step, k)``) it loads the start state into the graph's static
    inputs and replays once per block; without, it runs ``k_step(step, k)`` eagerly on a fresh copy of that state.

    Example::

        run = generation(first, 16, 32, 4, graph=k_graphs[1, 4])
        tokens = run()       # (b, 32)
    """
    start = decode_state(first, prompt_len)
    if graph is not None:
        def run():
            load_state(graph.static_inputs, start)
            return generate_blocks(graph.replay, graph.static_inputs, first, new_tokens, k, pad_token)
        return run
    if step is None:
        raise ValueError("generation needs a graph to replay or a step to run eagerly; got neither.")
    block = k_step(step, k, pad_token)

    def run():
        state = tuple(t.clone() for t in start)
        return generate_blocks(lambda: block(*state), state, first, new_tokens, k, pad_token)
    return run


def stop_after(tokens, stop_token: int, pad_token: int = 0):
    """The reference rule on plain greedy tokens (b, n): keep each row up to and including its first
    ``stop_token``, then ``pad_token``. Decoding with stops must give exactly this (rows are independent)."""
    hit = (tokens == stop_token).int()
    after = (hit.cumsum(1) - hit) > 0            # strictly after the first stop token
    return torch.where(after, torch.full_like(tokens, pad_token), tokens)


def mid_block_stop(tokens, k: int, row: int = 0) -> tuple:
    """``(stop_token, step)`` for a test of stopping mid-block: the first step ``s >= 2`` of ``row`` of greedy
    tokens (b, n) whose token did not occur earlier in that row and that is not the last step of a block of ``k``
    (token 0 comes from prefill, block j holds steps 1 + j*k .. (j+1)*k). Raises if there is none."""
    seq = tokens[row].tolist()
    for s in range(2, len(seq)):
        if seq[s] not in seq[:s] and (k == 1 or (s - 1) % k != k - 1):
            return seq[s], s
    raise ValueError(f"row {row} has no new token mid-block (k={k}) after step 1: generate more tokens.")


# --- the compiled decode-step variants, and each variant's first calls --------------------------------------------


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

    from ...bucket_graphs import capture_buckets
    from ...graphed import fresh_cublas_workspace

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


def check_row(variant: str, tokens, logits: list, reference, reference_logits: list, batch=None, **extra) -> dict:
    """One row of a correctness table: ``variant`` (and ``batch``, if given), its greedy tokens against the
    reference's (``first_divergence``: equal, or where they first differ and whether that is a near tie), the largest
    |logit difference| over all steps, then ``extra`` columns (e.g. the first call's time)."""
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


def report_checks(checks, unexplained, errors: dict) -> None:
    """Print section 6 of notebook 08 from its correctness table ``checks`` (``check_row`` rows with
    ``first_call_s``): whether every variant decoded eager's greedy tokens or parted from them at a near tie; each
    variant's first call per batch size (seconds, a compile or a recording included); the ``unexplained`` rows
    (tokens that differ, not at a near tie); and each variant's error or reason for being skipped (``errors``)."""
    print("eager's greedy tokens, or a near tie:", "NOT every variant (below)" if len(unexplained) else
          "every variant, every batch size", "\nfirst call of each variant, a compile or a recording included:")
    print(checks.pivot_table(index="variant", columns="batch", values="first_call_s", sort=False).rename(
        columns=lambda b: f"batch {b} (s)").to_string(float_format=lambda v: f"{v:.2f}"))
    if len(unexplained):
        print("\n>>> NOT a near tie: these variants decode differently from eager; their timings below are not "
              "comparable:")
        print(unexplained[["variant", "batch", "first_step", "margin", "logit_diff"]].to_string(index=False))
    for label, error in errors.items():
        print(f"{label}: {error}")


def recorded_reading(stem: str, what: str, batch: int = 1) -> str:
    """Without a GPU: what notebook 08 measures at this point on a GPU, read from its recorded GPU run
    (``results.load``) and labelled with that run (GPU, date). ``what``: "kernels" (what one eager decode step at
    ``batch`` launched), "capture" (the kit's buckets: how many graphs, their capture time, the memory they hold) or
    "floors" (the GPU-busy time of one replay of the kit's graph at each batch size). Says so where no recorded run
    is found.

    Example::

        print(recorded_reading("08_llm_decode", "kernels", batch=1))
        # Recorded on NVIDIA H100 80GB HBM3 (...), 2026-11-27 16:21 UTC, ...:
        #   one eager decode step at batch 1 launched 175 kernels and 4 copies/fills, one by one
    """
    from ..measuring import results

    rec = results.load(stem)
    if rec is None:
        return f"No recorded GPU run of {stem} was found (the repository's figures/ folder has it)."
    df = rec.df
    steps = df[df.case.astype(str).str.startswith("decode step, batch ")]
    if what == "kernels":
        rows = steps[(steps.case == f"decode step, batch {batch}") & (steps.variant == "eager")]
        if not len(rows):
            return f"{rec.caption}: no eager decode step at batch {batch}."
        r = rows.iloc[0]
        found = (f"one eager decode step at batch {batch} launched {r.kernels_per_call:.0f} kernels and "
                 f"{r.copies_per_call:.0f} copies/fills, one by one")
    elif what == "capture":
        kit = df[(df.case == "setup") & (df.variant == "kit graph per bucket")]
        if not len(kit):
            return f"{rec.caption}: no capture of the kit's buckets."
        found = (f"{int((df.case == 'capture').sum())} graphs captured in {kit.capture_s.iloc[0]:.2f} s; they hold "
                 f"{kit.graph_mib.iloc[0]:.1f} MiB (shared pool + static buffers)")
    elif what == "floors":
        kit = steps[(steps.variant == "kit graph (bucket)") & steps.floor_step_us.notna()]
        found = "floors (µs, GPU busy per replay of the kit's graph): " + str(
            {int(b): round(float(f), 1) for b, f in zip(kit.batch, kit.floor_step_us)})
    else:
        raise ValueError(f"what must be 'kernels', 'capture' or 'floors', not {what!r}")
    return f"{rec.caption}:\n  {found}"


def show_floors(floors: dict, stem: str) -> None:
    """Print section 7's floors of notebook 08 ({batch: GPU-busy µs per replay of the kit's graph}); without any
    (no GPU), the recorded GPU run's, labelled (``recorded_reading``)."""
    if floors:
        print("floors (µs, GPU busy per replay of the kit's graph):", {b: round(f, 1) for b, f in floors.items()})
    else:
        print("No GPU here: no floors measured.", recorded_reading(stem, "floors"))
