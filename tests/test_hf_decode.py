"""The Hugging Face recipe (course/hf_decode.py): a transformers LlamaForCausalLM built from a tiny config decodes,
through StaticDecoder's capturable step, exactly the tokens of transformers' own greedy generate; the cache's
write-position behaviour is detected by a probe; the trap it guards against is real; on a GPU the step captured
by the kit (and compiled without graphs, then captured) gives the same tokens."""
import pytest
import torch

from cudagraph_kit.graphed import capture
from cudagraph_kit.course.lessons.hf_decode import (MIN_TRANSFORMERS, StaticDecoder, _version, hf_status,
                                            write_position_behaviour)

VERSION, WHY = hf_status()
needs_hf = pytest.mark.skipif(VERSION is None, reason=f"the Hugging Face recipe cannot run here: {WHY}")
L, NEW = 8, 10


def tiny_llama(device="cpu", dtype=torch.float32, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)


def prompt(b, device="cpu"):
    return torch.randint(1, 256, (b, L), generator=torch.Generator().manual_seed(2)).to(device)


def hf_greedy(model, x, n):
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[:, x.shape[1]:]


def test_versions_are_compared_by_their_numbers():
    assert _version("4.45.0") == (4, 45) and _version("5.24.0.dev0") == (5, 24) and _version("4.9") < (4, 45)
    assert (5, 0) > MIN_TRANSFORMERS
    assert (VERSION is None) != (WHY == f"transformers {VERSION}")


@needs_hf
def test_the_probe_finds_where_this_version_writes():
    model = tiny_llama()
    wp = write_position_behaviour(model.config)
    if wp.counters:   # 5.x: a device counter per layer that update() advances, so cache_position is not followed
        assert all(name.endswith("cumulative_length") for name in wp.counters)
        assert "reset the cache before each sequence" in wp.describe()
    else:             # 4.x: writes land at the cache_position given
        assert wp.follows_cache_position
    assert wp.follows_cache_position or wp.counters, "a static cache that neither follows cache_position nor counts"


@needs_hf
@pytest.mark.parametrize("b", [1, 3])
def test_the_capturable_step_decodes_transformers_own_greedy_tokens(b):
    from cudagraph_kit.graphed import torch_release
    model, x = tiny_llama(), prompt(b)
    if b > 1 and torch_release() < (2, 5):  # transformers' older-PyTorch mask raises there (CI's oldest leg)
        with pytest.raises(RuntimeError, match="needs PyTorch 2.5 or newer"):
            StaticDecoder(model, batch=b, max_len=L + NEW)
        return
    with torch.no_grad():
        ref = hf_greedy(model, x, NEW)
        dec = StaticDecoder(model, batch=b, max_len=L + NEW)
        assert torch.equal(dec.generate(x, NEW), ref)
        graph = dec.capture(capture, eager_fallback=True)     # on a CPU: the kit's eager stand-in, same calls
        assert dec.write_positions() in ([], [0])              # the warm-up's writes were undone
        for _ in range(2):                                     # a second sequence: reset again, same tokens
            assert torch.equal(dec.generate(x, NEW, step=graph), ref)


@needs_hf
def test_without_the_reset_the_write_position_runs_on():
    """The trap itself: in a version with a write counter, a second sequence without a reset starts where the first
    ended; StaticDecoder.prefill resets, and its check catches a cache that was replaced or not reset."""
    model, x = tiny_llama(), prompt(1)
    dec = StaticDecoder(model, batch=1, max_len=L + NEW + 4)
    if not dec.behaviour.counters:
        pytest.skip(f"transformers {VERSION} writes at cache_position: no counter to forget")
    with torch.no_grad():
        dec.generate(x, 4)
        assert dec.write_positions() == [L + 3]
        dec.step(x[:, :1], torch.zeros(1, 1, dtype=torch.long))   # a naive "new sequence" at position 0
        assert dec.write_positions() == [L + 4]                    # it wrote at L + 3, not at 0
        dec.cache.reset = lambda: None                             # a reset that does nothing
        with pytest.raises(RuntimeError, match="write position is .* not reset in place"):
            dec.prefill(x)


@needs_hf
def test_bad_sizes_get_clear_errors():
    dec = StaticDecoder(tiny_llama(), batch=1, max_len=L + 2)
    with pytest.raises(ValueError, match="does not fit this decoder"):
        dec.prefill(prompt(2))
    with pytest.raises(ValueError, match="need more than the cache's"):
        dec.generate(prompt(1), 10)


@pytest.mark.gpu
@needs_hf
@pytest.mark.parametrize("compiled", [False, True])
def test_hf_step_captured_by_the_kit_gives_eager_tokens_on_the_gpu(compiled):
    model, x = tiny_llama("cuda"), prompt(1, "cuda")
    with torch.no_grad():
        dec = StaticDecoder(model, batch=1, max_len=L + NEW)
        eager = dec.generate(x, NEW)
        fn = torch.compile(dec.step) if compiled else None     # default mode: fused kernels, no CUDA graphs
        graph = dec.capture(capture, fn=fn)
        assert graph.mode == "graph"
        for _ in range(2):
            assert torch.equal(dec.generate(x, NEW, step=graph), eager)
        assert torch.equal(eager, hf_greedy(model, x, NEW))
