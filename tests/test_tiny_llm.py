"""The course's tiny LLaMA-style model: static-cache decoding equals full recompute, the transformers copy computes
the same function, bad sizes get clear errors; on a GPU, its decode step captured per bucket equals eager."""
import pytest
import torch

from cudagraph_kit.course.lessons.tiny_llm import (StaticKVCache, TinyConfig, TinyLLM, first_divergence, greedy_generate,
                                           greedy_generate_no_cache, hf_generate, to_hf_llama)

CFG = TinyConfig(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=128)


def prompt(b=3, n=8, seed=1):
    return torch.randint(0, CFG.vocab_size, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return TinyLLM(CFG, seed=0).eval().requires_grad_(False)  # inference; global grad mode left alone


def test_weights_come_from_the_seed(model):
    again, other = TinyLLM(CFG, seed=0), TinyLLM(CFG, seed=1)
    for (n, p), q, r in zip(model.named_parameters(), again.parameters(), other.parameters()):
        assert torch.equal(p, q), n
        if "norm" not in n:
            assert not torch.equal(p, r), n


def test_static_cache_decoding_equals_recomputing_everything(model):
    x = prompt()
    cache = StaticKVCache(CFG, max_batch=4, max_len=32)
    cached_l, ref_l = [], []
    tokens = greedy_generate(model, cache, x, 12, logits_out=cached_l)
    ref = greedy_generate_no_cache(model, x, 12, logits_out=ref_l)
    assert tokens.shape == (3, 12) and torch.equal(tokens, ref)
    assert max((a - b).abs().max().item() for a, b in zip(cached_l, ref_l)) < 1e-5
    assert first_divergence(tokens, ref)["equal"]


def test_rows_are_independent_with_their_own_positions(model):
    """Row i of a decode step depends on its own token, position and cache row only (what bucket padding needs)."""
    cache = StaticKVCache(CFG, max_batch=4, max_len=32)
    model.prefill(prompt(4, 8), cache)
    tok = torch.tensor([5, 6, 7, 8])
    pos = torch.tensor([8, 3, 8, 0])
    full = model.decode(tok, pos, cache)
    cache2 = StaticKVCache(CFG, max_batch=4, max_len=32)
    model.prefill(prompt(4, 8), cache2)
    part = model.decode(tok[:2], pos[:2], cache2)
    torch.testing.assert_close(part, full[:2])


def test_a_divergence_is_located_and_sized():
    ref = torch.tensor([[1, 2, 3], [4, 5, 6]])
    got = torch.tensor([[1, 2, 3], [4, 9, 9]])
    logits = [torch.zeros(2, 10) for _ in range(3)]
    ref_logits = [torch.zeros(2, 10) for _ in range(3)]
    ref_logits[1][1, 5], ref_logits[1][1, 9] = 1.0, 0.99
    logits[1][1, 9] = 1.0
    d = first_divergence(got, ref, logits, ref_logits)
    assert not d["equal"] and d["rows_differing"] == 1 and d["first_step"] == 1
    assert d["margin"] == pytest.approx(0.01) and d["logit_diff"] == pytest.approx(1.0)
    assert d["near_tie"] is True                      # a 0.01 gap, logits 1.0 apart: rounding decided it
    ref_logits[1][1] = torch.full((10,), -5.0)        # a clear winner (gap 6) that the other side missed anyway
    ref_logits[1][1, 5] = 1.0
    logits[1][1, 9] = 0.9                             # logits 5.9 apart at most: less than the gap, not a tie
    far = first_divergence(got, ref, logits, ref_logits)
    assert far["margin"] == pytest.approx(6.0) and far["logit_diff"] < far["margin"] and far["near_tie"] is False
    assert first_divergence(got, ref)["near_tie"] is None          # no logits: the margin is unknown, not "no tie"
    assert first_divergence(ref, ref)["near_tie"] is False


def test_the_hf_probe_records_the_tie_margin_where_tokens_diverge():
    """scripts/probes/probe_hf_decode.py keeps, for a variant whose tokens differ from eager's, the reference's top-2 gap at
    the first differing step and how far the variant's logits were: so a bf16 divergence can be told a near tie."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "probes" / "probe_hf_decode.py"
    spec = importlib.util.spec_from_file_location("probe_hf_decode", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    ref = torch.tensor([[1, 2, 3]])
    ref_logits = [torch.zeros(1, 10) for _ in range(3)]
    ref_logits[2][0, 3], ref_logits[2][0, 7] = 2.0, 1.995

    def tie(logits_out):                          # flips the near tie at step 2
        lg = [x.clone() for x in ref_logits]
        lg[2][0, 7] = 2.01
        logits_out.extend(lg)
        return torch.tensor([[1, 2, 7]])

    def same(logits_out):
        logits_out.extend(ref_logits)
        return ref.clone()
    checks = probe.token_checks({"tie": tie, "same": same}, ref, ref_logits)
    assert checks["same"] == {"tokens_equal": True, "first_step": None, "margin": None, "logit_diff": None,
                              "near_tie": False}
    t = checks["tie"]
    assert not t["tokens_equal"] and t["first_step"] == 2 and t["near_tie"] is True
    assert t["margin"] == pytest.approx(0.005, abs=1e-6) and t["logit_diff"] == pytest.approx(0.015, abs=1e-6)


def test_bad_sizes_get_clear_errors(model):
    with pytest.raises(ValueError, match="multiple of"):
        TinyConfig(dim=65, heads=4)
    cache = StaticKVCache(CFG, max_batch=2, max_len=10)
    with pytest.raises(ValueError, match="does not fit"):
        model.prefill(prompt(3, 4), cache)
    with pytest.raises(ValueError, match="cache positions"):
        greedy_generate(model, cache, prompt(2, 8), 5)


def test_transformers_llama_with_the_same_weights_computes_the_same(model):
    pytest.importorskip("transformers")
    hf = to_hf_llama(model)
    x = prompt()
    torch.testing.assert_close(hf(x).logits, model(x), rtol=1e-5, atol=1e-5)
    cache = StaticKVCache(CFG, max_batch=4, max_len=32)
    ours = greedy_generate(model, cache, x, 10)
    for impl in ("static", None):
        logits = []
        assert torch.equal(hf_generate(hf, x, 10, cache_implementation=impl, logits_out=logits), ours)
        assert len(logits) == 10


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_graphed_per_bucket_equals_eager_on_the_gpu(dtype):
    from cudagraph_kit import capture_buckets

    cfg = TinyConfig(vocab_size=1024, dim=256, layers=2, heads=8, kv_heads=2, hidden=512)
    m = TinyLLM(cfg, seed=0, device="cuda", dtype=dtype).eval()
    cache = StaticKVCache(cfg, max_batch=16, max_len=40, device="cuda", dtype=dtype)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)

    def step(t, p):
        if clear is not None and torch.cuda.is_current_stream_capturing():
            clear()   # the cuBLAS workspace in the graph's own pool (notebook 08, section 4)
        return m.decode(t, p, cache)

    with torch.no_grad():
        z = torch.zeros(16, dtype=torch.long, device="cuda")
        graphs = capture_buckets(step, z, z.clone(), sizes=[1, 4, 8, 16])
        assert graphs.mode == "graph"
        # same shapes run the same kernels: bitwise equal; a padded batch (3, 13) may pick other matmul kernels,
        # whose float32 rounding cannot flip a greedy token here, bfloat16's can (notebook 08, exercise 2)
        for b in ((1, 3, 8, 13) if dtype == torch.float32 else (1, 8)):
            x = prompt(b, 8).cuda()
            eager = greedy_generate(m, cache, x, 20)
            graphed = greedy_generate(m, cache, x, 20, step=graphs)
            assert torch.equal(graphed, eager), b


@pytest.mark.gpu
def test_decode_step_compiled_without_graphs_then_captured_per_bucket_equals_eager_on_the_gpu():
    """Notebook 08's "compile + kit graphs": Inductor's fused kernels (default mode, no CUDA graphs, dynamic batch),
    captured per bucket by the kit, decode eager's greedy tokens (or part from them only at a near tie)."""
    from cudagraph_kit import capture_buckets

    cfg = TinyConfig(vocab_size=1024, dim=256, layers=2, heads=8, kv_heads=2, hidden=512)
    m = TinyLLM(cfg, seed=0, device="cuda").eval()
    cache = StaticKVCache(cfg, max_batch=16, max_len=40, device="cuda")
    fused = torch.compile(lambda t, p: m.decode(t, p, cache), dynamic=True)
    with torch.no_grad():
        z = torch.zeros(16, dtype=torch.long, device="cuda")
        fused(z, z.clone())                                     # the one compile
        graphs = capture_buckets(fused, z, z.clone(), sizes=[1, 4, 8, 16])
        assert graphs.mode == "graph"
        for b in (1, 8, 16):
            x = prompt(b, 8).cuda()
            eager_l, fused_l = [], []
            eager = greedy_generate(m, cache, x, 20, logits_out=eager_l)
            got = greedy_generate(m, cache, x, 20, step=graphs, logits_out=fused_l)
            d = first_divergence(got, eager, fused_l, eager_l)
            # other kernels round differently: tokens equal, or they part at a near tie (logit_diff >= margin)
            assert d["equal"] or d["logit_diff"] >= d["margin"], (b, d)
            assert (fused_l[1] - eager_l[1]).abs().max().item() < 1e-3   # the first decode step, same inputs
