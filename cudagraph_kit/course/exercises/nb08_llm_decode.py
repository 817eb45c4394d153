"""Checks for notebook 08's exercises (LLM decoding); the machinery is in ``checking.py``.

Example::

    from cudagraph_kit.course.exercises.nb08_llm_decode import check_decode_buckets
"""
from __future__ import annotations

from .checking import (check, cuda, exercise, is_todo)

__all__ = ['check_decode_buckets', 'check_low_precision_ties', 'check_k_step_decode', 'TIE_WHY']


@exercise("08_llm_decode", 1, "buckets for the serving loop, and what a padding row costs", "cpu+gpu")
@check("08.1")
def check_decode_buckets(report, few_buckets, serve_few, few_tokens, pad_fraction, history, observed, max_batch,
                         eager_tokens):
    """``few_buckets``: ``plan_buckets(history, max_graphs=4, max_size=max_batch)``; ``serve_few``: its
    ``capture_buckets`` of the decode step; ``few_tokens``: ``{request id: tokens}`` recorded by the serving loop
    through ``serve_few``; ``pad_fraction``: the share of padding rows on ``observed`` (the stream's batch sizes);
    ``eager_tokens``: the eager loop's record."""
    from ...bucket_plan import evaluate_buckets, plan_buckets

    if is_todo(few_buckets):
        report.todo("few_buckets = plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)")
        return
    if not hasattr(few_buckets, "sizes") or not hasattr(few_buckets, "n_graphs"):
        report.off(f"few_buckets is a {type(few_buckets).__name__}, not the BucketPlan plan_buckets returns")
        return
    if few_buckets.n_graphs > 4 or few_buckets.sizes[-1] != max_batch:
        report.off(f"the plan has {few_buckets.n_graphs} buckets {few_buckets.sizes}; it needs at most 4, the largest "
                   f"at {max_batch}", "plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)")
        return
    best = plan_buckets(list(history), max_graphs=4, max_size=max_batch)
    mine = evaluate_buckets(list(history), few_buckets.sizes)["pad_fraction"]
    if mine > best.pad_fraction + 1e-9:
        report.off(f"on the history your buckets pad {mine:.1%} of the rows; the planner reaches {best.pad_fraction:.1%}",
                   "plan on `history`, the earlier stream's batch sizes.")
        return
    report.right(f"4 buckets {few_buckets.sizes}: {mine:.1%} of the rows padded on the history")
    if is_todo(pad_fraction):
        report.todo('pad_fraction = evaluate_buckets(observed, few_buckets.sizes)["pad_fraction"]')
    else:
        want = evaluate_buckets(list(observed), few_buckets.sizes)["pad_fraction"]
        if not isinstance(pad_fraction, (int, float)) or abs(float(pad_fraction) - want) > 1e-9:
            report.off(f"pad_fraction = {pad_fraction!r}, but on this stream the buckets pad {want:.4f} of the rows",
                       "evaluate_buckets on `observed` (this stream), not on the history.")
        else:
            report.right(f"on this stream {want:.1%} of the computed rows are padding")
    if is_todo(serve_few):
        report.todo("serve_few = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=few_buckets.sizes, "
                    "eager_fallback=True)")
        return
    if list(getattr(serve_few, "sizes", [])) != list(few_buckets.sizes):
        report.off(f"serve_few has buckets {getattr(serve_few, 'sizes', None)}, not the plan's {few_buckets.sizes}",
                   "capture_buckets(..., sizes=few_buckets.sizes)")
        return
    if is_todo(few_tokens):
        report.todo("few_tokens: a dict passed as serve(serve_few, stream, record=few_tokens)")
        return
    if not isinstance(few_tokens, dict) or not few_tokens:
        report.off("few_tokens must be the dict that serve(..., record=...) filled", "few_tokens = {}; "
                   "serve(serve_few, stream, record=few_tokens)")
        return
    same = sum(few_tokens.get(rid) == toks for rid, toks in eager_tokens.items())
    if same != len(eager_tokens):
        report.off(f"{len(eager_tokens) - same} of {len(eager_tokens)} requests decoded differently from eager",
                   "padding rows must only ever write cache rows no request uses: keep the active requests in rows "
                   "0..n-1 (serve does) and pad with token 0 at position 0.")
        return
    report.right(f"all {same} requests decoded exactly as eager through {few_buckets.n_graphs} buckets")
    if not cuda():
        report.needs_gpu("on a CPU the buckets run eagerly; their graphs and shared pool need an NVIDIA GPU")
        return
    if serve_few.mode != "graph" or serve_few.pool is None:
        report.off("serve_few did not capture graphs into one shared pool", "capture_buckets(..., pool='shared'), the "
                   "default, on the GPU.")
        return
    report.right(f"{few_buckets.n_graphs} graphs in one shared pool, captured in {serve_few.capture_seconds:.2f} s")


TIE_WHY = {
    "a": "The static cache is wrong in bfloat16: it writes keys and values at the wrong positions.",
    "b": "At that step the two best logits were closer than bfloat16 rounding moves them: the cached decode and the "
         "full recompute sum in different orders (grouped queries over the cache vs the whole sequence), round "
         "differently, and a near tie falls the other way; from there on the two texts differ.",
    "c": "bfloat16 cannot hold token ids above 256, so argmax returns a wrong id.",
}


@exercise("08_llm_decode", 2, "bfloat16 and near ties", "cpu")
@check("08.2")
def check_low_precision_ties(report, bf16_tokens, bf16_reference, bf16_divergence, tie_why, prompt, cfg, seed,
                             new_tokens):
    """``bf16_tokens``/``bf16_reference``: greedy tokens of the bfloat16 model with the static cache and without a
    cache, on ``prompt``; ``bf16_divergence``: ``first_divergence`` of the two with their logits; ``tie_why``: "a",
    "b" or "c" (``TIE_WHY``). ``cfg``, ``seed``, ``new_tokens``: the notebook's model and generation length."""
    import math

    import torch

    from ..lessons.tiny_llm import StaticKVCache, TinyLLM, first_divergence, greedy_generate, greedy_generate_no_cache

    if is_todo(bf16_tokens) or is_todo(bf16_reference):
        report.todo("bf16_tokens and bf16_reference: greedy_generate / greedy_generate_no_cache on the bfloat16 model")
        return
    shape = (prompt.shape[0], new_tokens)
    for name, t in (("bf16_tokens", bf16_tokens), ("bf16_reference", bf16_reference)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            report.off(f"{name} must be a tensor of shape {shape} (one row per prompt, NEW_TOKENS tokens), got "
                       f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            return
    with torch.no_grad():
        model = TinyLLM(cfg, seed=seed, device=prompt.device, dtype=torch.bfloat16).eval()
        cache = StaticKVCache(cfg, prompt.shape[0], prompt.shape[1] + new_tokens, device=prompt.device,
                              dtype=torch.bfloat16)
        mine_l, ref_l = [], []
        want = greedy_generate(model, cache, prompt, new_tokens, logits_out=mine_l)
        want_ref = greedy_generate_no_cache(model, prompt, new_tokens, logits_out=ref_l)
    if not torch.equal(bf16_tokens.cpu(), want.cpu()) or not torch.equal(bf16_reference.cpu(), want_ref.cpu()):
        report.off("your tokens are not those of the bfloat16 model built from the notebook's seed",
                   "TinyLLM(CFG, seed=SEED, device=DEVICE, dtype=torch.bfloat16) and a StaticKVCache of the same "
                   "dtype; greedy_generate(model, cache, prompts[MAX_BATCH], NEW_TOKENS).")
        return
    truth = first_divergence(want, want_ref, mine_l, ref_l)
    report.right(f"bfloat16 tokens reproduced; with the static cache and without it they are "
                 f"{'identical' if truth['equal'] else 'different'}")
    if is_todo(bf16_divergence):
        report.todo("bf16_divergence = first_divergence(bf16_tokens, bf16_reference, logits, reference logits)")
        return
    if not isinstance(bf16_divergence, dict) or bf16_divergence.get("equal") != truth["equal"] or \
            bf16_divergence.get("first_step") != truth["first_step"]:
        report.off(f"bf16_divergence says {bf16_divergence!r}; the tokens first differ at step {truth['first_step']}",
                   "first_divergence(bf16_tokens, bf16_reference, <its logits_out>, <the reference's logits_out>)")
        return
    if truth["equal"]:
        report.note("no divergence on this run's prompts: the question below is about what happens when there is one")
    else:
        m, d = bf16_divergence.get("margin", math.nan), bf16_divergence.get("logit_diff", math.nan)
        if not (isinstance(m, float) and isinstance(d, float)) or math.isnan(m) or math.isnan(d):
            report.off("bf16_divergence has no margin and logit_diff: pass both logits lists to first_divergence")
            return
        report.right(f"first difference at step {truth['first_step']}: eager's two best logits {m:.3g} apart, the two "
                     f"computations' logits up to {d:.3g} apart ({'a near tie' if d >= m else 'not a near tie'})")
    if is_todo(tie_why):
        report.todo('tie_why: "a", "b" or "c" (TIE_WHY)')
    elif tie_why != "b":
        report.off(f'"{tie_why}" is not it: {TIE_WHY.get(tie_why, "not one of a, b, c")}',
                   "compare the margin with logit_diff: what decided the token?")
    else:
        report.right("b: rounding decides near ties; compare low-precision variants with a logit tolerance, and "
                     "expect their texts to part at near ties")


@exercise("08_llm_decode", 3, "four tokens per replay, stopping on the GPU", "cpu+gpu")
@check("08.3")
def check_k_step_decode(report, k4_block, k4_graph, k4_tokens, model, cache, prompt, stop_token, new_tokens,
                        pad_token=0):
    """``k4_block(tokens, pos, done, stop) -> (b, 4)``: four greedy decode steps that update their state in place;
    ``k4_graph``: the kit's ``capture`` of it; ``k4_tokens``: ``generate_blocks`` through ``k4_graph`` for
    ``prompt`` with ``stop_token``. ``model``/``cache``: the notebook's (the check decodes one step per token on
    them for the reference)."""
    import torch

    from ..lessons.decode import decode_state, generate_blocks, stop_after
    from ..lessons.tiny_llm import greedy_generate

    if is_todo(k4_block):
        report.todo("k4_block: def k4_block(tokens, pos, done, stop): four steps of decode_step, in place")
        return
    with torch.no_grad():
        want = stop_after(greedy_generate(model, cache, prompt, new_tokens), stop_token, pad_token)
        first = model.prefill(prompt, cache).argmax(-1)
        state = decode_state(first, prompt.shape[1], stop_token)
        try:
            block = k4_block(*state)
        except Exception as exc:  # noqa: BLE001 - a learner's function: report, never raise
            report.off(f"k4_block(tokens, pos, done, stop) raised {type(exc).__name__}: {exc}")
            return
    if not isinstance(block, torch.Tensor) or tuple(block.shape) != (prompt.shape[0], 4):
        report.off(f"k4_block must return the block's tokens, shape {(prompt.shape[0], 4)}, got "
                   f"{tuple(block.shape) if isinstance(block, torch.Tensor) else type(block).__name__}",
                   "torch.stack(the four argmax tokens, dim=1)")
        return
    hint = "each step: nxt = decode_step(tokens, pos).argmax(-1).masked_fill(done, PAD); then done |= nxt == stop"
    if not torch.equal(block.cpu(), want[:, 1:5].cpu()):
        report.off("the block's tokens are not the next four greedy tokens (pad after the stop token)", hint)
        return
    if not (state[1] == prompt.shape[1] + 4).all() or not torch.equal(state[0], block[:, -1]):
        report.off("the state did not move on: after the block, tokens must hold its last tokens and pos the next "
                   "position", "update in place (tokens.copy_(nxt), pos.add_(1), done.logical_or_(...)): a graph "
                   "replays on the same tensors, so an update by rebinding a name is lost")
        return
    with torch.no_grad():
        state = decode_state(first, prompt.shape[1], stop_token)
        eager = generate_blocks(lambda: k4_block(*state), state, first, new_tokens, 4, pad_token)
    if not torch.equal(eager.cpu(), want.cpu()):
        report.off("run block after block, the tokens are not the next greedy tokens with pad after the stop token",
                   hint)
        return
    report.right("four greedy tokens per call, the state updated in place, stopped rows padded")
    if is_todo(k4_graph) or is_todo(k4_tokens):
        report.todo("k4_graph = capture(...) of k4_block, and k4_tokens = generate_blocks(k4_graph.replay, ...)")
        return
    if not hasattr(k4_graph, "replay") or not hasattr(k4_graph, "static_inputs"):
        report.off(f"k4_graph is a {type(k4_graph).__name__}, not what capture() returns")
        return
    if not isinstance(k4_tokens, torch.Tensor) or not torch.equal(k4_tokens.cpu(), want.cpu()):
        report.off("k4_tokens differ from one step per token with the same stop rule",
                   "load_state(k4_graph.static_inputs, decode_state(first, PROMPT_LEN, stop_token)) before "
                   "generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, NEW_TOKENS, 4, PAD)")
        return
    report.right(f"{new_tokens} tokens per sequence through the captured block, identical to one step per token")
    if not cuda():
        report.needs_gpu("on a CPU the block ran eagerly; capturing it in one graph needs an NVIDIA GPU")
    elif getattr(k4_graph, "mode", None) != "graph":
        report.off("k4_graph ran eagerly", "capture(...) on the GPU, without a failure")
    else:
        report.right("one CUDA graph replay per four tokens")
