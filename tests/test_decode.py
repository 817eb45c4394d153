"""Several tokens per replay (course/decode.py): the K-step block run eagerly on the CPU gives exactly the tokens of
one step per token, including rows that stop mid-block; the host reads the stop flags once per block. On a GPU the
same block captured by the kit gives the same tokens."""
import pytest
import torch

from cudagraph_kit.course.lessons.decode import (NO_STOP, decode_state, generate_blocks, generation, k_step, load_state,
                                         mid_block_stop, positions_needed, stop_after)
from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM, greedy_generate

CFG = TinyConfig(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=128)
PAD, NEW, L = 0, 13, 8


@pytest.fixture(scope="module")
def model():
    return TinyLLM(CFG, seed=0).eval().requires_grad_(False)


def prompt(b, seed=1):
    return torch.randint(1, CFG.vocab_size, (b, L), generator=torch.Generator().manual_seed(seed))


def k_step_tokens(model, cache, x, k, stop, stats=None):
    first = model.prefill(x, cache).argmax(-1)
    state = decode_state(first, x.shape[1], stop)
    block = k_step(lambda t, p: model.decode(t, p, cache), k, pad_token=PAD)
    return generate_blocks(lambda: block(*state), state, first, NEW, k, PAD, stats=stats)


def test_stop_after_keeps_the_stop_token_and_pads_the_rest():
    t = torch.tensor([[5, 7, 9, 7], [1, 2, 3, 4], [7, 1, 1, 1]])
    assert stop_after(t, 7, PAD).tolist() == [[5, 7, 0, 0], [1, 2, 3, 4], [7, 0, 0, 0]]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_k_steps_per_call_equal_one_step_per_token_without_a_stop(model, k):
    x = prompt(3)
    cache = StaticKVCache(CFG, max_batch=3, max_len=positions_needed(L, NEW, k))
    ref = greedy_generate(model, cache, x, NEW)
    stats = {}
    got = k_step_tokens(model, cache, x, k, None, stats)
    assert torch.equal(got, ref)
    blocks = -(-(NEW - 1) // k)
    assert stats == {"blocks": blocks, "host_checks": blocks}   # one host read per block, not per token


@pytest.mark.parametrize("k", [2, 4, 8])
def test_rows_that_stop_mid_block_emit_pad_and_the_others_go_on(model, k):
    x = prompt(4, seed=3)
    cache = StaticKVCache(CFG, max_batch=4, max_len=positions_needed(L, NEW, k))
    ref = greedy_generate(model, cache, x, NEW)
    stop, step = mid_block_stop(ref, k)
    assert (step - 1) % k != k - 1                      # the stop lands inside a block, not at its end
    want = stop_after(ref, stop, PAD)
    assert not torch.equal(want, ref) and (want == ref).all(dim=1).any()   # some rows stop, some do not
    got = k_step_tokens(model, cache, x, k, stop)
    assert torch.equal(got, want)
    assert torch.equal(got, k_step_tokens(model, cache, x, 1, stop))      # == one token per call


def test_the_host_loop_ends_early_once_every_row_has_stopped(model):
    x = prompt(1, seed=5)
    cache = StaticKVCache(CFG, max_batch=1, max_len=positions_needed(L, NEW, 4))
    ref = greedy_generate(model, cache, x, NEW)
    stop, step = mid_block_stop(ref, 4)
    stats = {}
    got = k_step_tokens(model, cache, x, 4, stop, stats)
    assert torch.equal(got, stop_after(ref, stop, PAD))
    blocks_to_stop = -(-step // 4)                     # the block holding step `step`
    assert stats == {"blocks": blocks_to_stop, "host_checks": blocks_to_stop + 1}


def test_a_first_token_that_is_the_stop_token_runs_no_block(model):
    x = prompt(2)
    cache = StaticKVCache(CFG, max_batch=2, max_len=positions_needed(L, NEW, 4))
    first = model.prefill(x, cache).argmax(-1)
    state = decode_state(first, L, int(first[0]))
    state[2].fill_(True)                               # both rows done from the start
    stats = {}
    got = generate_blocks(lambda: pytest.fail("no block may run"), state, first, NEW, 4, PAD, stats=stats)
    assert got[:, 0].tolist() == first.tolist() and (got[:, 1:] == PAD).all()
    assert stats == {"blocks": 0, "host_checks": 1}


def test_state_and_arguments_are_checked():
    first = torch.tensor([3, 4])
    tokens, pos, done, stop = decode_state(first, 8)
    assert pos.tolist() == [8, 8] and not done.any() and int(stop) == NO_STOP
    assert decode_state(first, 8, 4)[2].tolist() == [False, True]
    with pytest.raises(ValueError, match="k .* must be >= 1"):
        k_step(lambda t, p: None, 0)
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        generate_blocks(lambda: None, (tokens, pos, done, stop), first, 0, 2)
    with pytest.raises(ValueError, match="no new token mid-block"):
        mid_block_stop(torch.tensor([[1, 1, 1, 1]]), 2)
    assert positions_needed(8, 13, 4) == 8 + 12 and positions_needed(8, 14, 4) == 8 + 16
    static = tuple(torch.zeros_like(t) for t in (tokens, pos, done, stop))
    load_state(static, (tokens, pos, done, stop))
    assert all(torch.equal(a, b) for a, b in zip(static, (tokens, pos, done, stop)))


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 8])
def test_k_step_block_captured_by_the_kit_equals_one_step_per_token_on_the_gpu(b):
    from cudagraph_kit.graphed import capture

    m = TinyLLM(CFG, seed=0, device="cuda").eval()
    cache = StaticKVCache(CFG, max_batch=8, max_len=positions_needed(L, NEW, 8) + 24, device="cuda")
    x = prompt(b).cuda()
    with torch.no_grad():
        ref = greedy_generate(m, cache, x, NEW)
        stop, _ = mid_block_stop(ref, 8)
        for k in (1, 2, 4, 8):
            block = k_step(lambda t, p: m.decode(t, p, cache), k, pad_token=PAD)
            g = capture(block, *decode_state(torch.zeros(b, dtype=torch.long, device="cuda"), 0), warmup=2)
            assert g.mode == "graph"
            for s in (stop, None):
                first = m.prefill(x, cache).argmax(-1)
                load_state(g.static_inputs, decode_state(first, L, s))
                got = generate_blocks(g.replay, g.static_inputs, first, NEW, k, PAD)
                assert torch.equal(got, ref if s is None else stop_after(ref, stop, PAD)), (k, s)


@pytest.mark.parametrize("k", [1, 4])
def test_a_timed_generation_decodes_the_greedy_tokens_and_can_run_again(model, k):
    x = prompt(2)
    cache = StaticKVCache(CFG, max_batch=2, max_len=positions_needed(L, NEW, k))
    ref = greedy_generate(model, cache, x, NEW)
    first = model.prefill(x, cache).argmax(-1)
    run = generation(first, L, NEW, k, PAD, step=lambda t, p: model.decode(t, p, cache))
    assert torch.equal(run(), ref) and torch.equal(run(), ref)   # each call starts from the same state
    with pytest.raises(ValueError, match="needs a graph to replay or a step"):
        generation(first, L, NEW, k)
