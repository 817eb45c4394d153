"""Solutions to the exercises of notebook 08 (LLM decoding with a static KV cache). Try them first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import torch

from cudagraph_kit import capture_buckets, evaluate_buckets, plan_buckets
from cudagraph_kit.course.lessons.tiny_llm import (StaticKVCache, TinyLLM, first_divergence, greedy_generate,
                                                   greedy_generate_no_cache)


def exercise_1(history, observed, max_batch, graph_step, sample_tokens, sample_pos, serve, stream):
    """Four planned buckets for the serving loop: capture them, serve the stream, and read the padding."""
    few_buckets = plan_buckets(history, max_graphs=4, max_size=max_batch)
    serve_few = capture_buckets(graph_step, sample_tokens, sample_pos, sizes=few_buckets.sizes, eager_fallback=True)
    few_tokens = {}
    serve(serve_few, stream, record=few_tokens)
    pad_fraction = evaluate_buckets(observed, few_buckets.sizes)["pad_fraction"]
    print(f"buckets {few_buckets.sizes}: {pad_fraction:.1%} of the computed rows are padding; {serve_few.stats}")
    return {"few_buckets": few_buckets, "serve_few": serve_few, "few_tokens": few_tokens, "pad_fraction": pad_fraction}


def exercise_2(cfg, seed, device, prompt, new_tokens):
    """The same model in bfloat16: static cache against full recompute, and where they part."""
    model = TinyLLM(cfg, seed=seed, device=device, dtype=torch.bfloat16).eval()
    cache = StaticKVCache(cfg, prompt.shape[0], prompt.shape[1] + new_tokens, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        cached_logits, ref_logits = [], []
        bf16_tokens = greedy_generate(model, cache, prompt, new_tokens, logits_out=cached_logits)
        bf16_reference = greedy_generate_no_cache(model, prompt, new_tokens, logits_out=ref_logits)
    bf16_divergence = first_divergence(bf16_tokens, bf16_reference, cached_logits, ref_logits)
    print(bf16_divergence)
    return {"bf16_tokens": bf16_tokens, "bf16_reference": bf16_reference, "bf16_divergence": bf16_divergence,
            "tie_why": "b"}


def exercise_3(decode_step, model, cache, prompt, prompt_len, new_tokens, stop_token, pad, device):
    """Four decode steps in one function and one graph; the stop token handled on the device."""
    from cudagraph_kit import capture
    from cudagraph_kit.graphed import fresh_cublas_workspace
    from cudagraph_kit.course.lessons.decode import decode_state, generate_blocks, load_state

    def k4_block(tokens, pos, done, stop):
        out = []
        for _ in range(4):
            nxt = decode_step(tokens, pos).argmax(-1).masked_fill(done, pad)
            done.logical_or_(nxt == stop)
            tokens.copy_(nxt)
            pos.add_(1)
            out.append(nxt)
        return torch.stack(out, dim=1)

    b = prompt.shape[0]
    with torch.no_grad():
        sample = decode_state(torch.zeros(b, dtype=torch.long, device=device), 0)
        k4_graph = capture(fresh_cublas_workspace(k4_block), *sample, warmup=2, eager_fallback=True)
        first = model.prefill(prompt, cache).argmax(-1)
        load_state(k4_graph.static_inputs, decode_state(first, prompt_len, stop_token))
        k4_tokens = generate_blocks(k4_graph.replay, k4_graph.static_inputs, first, new_tokens, 4, pad)
    return {"k4_block": k4_block, "k4_graph": k4_graph, "k4_tokens": k4_tokens}
