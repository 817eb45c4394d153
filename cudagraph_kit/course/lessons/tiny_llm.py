"""A tiny decoder-only transformer (LLaMA layout) with a static KV cache: course material for notebook 08.

Random weights, built in place from a seed (nothing is downloaded). The layers are those of a LLaMA model:
token embedding, then per layer RMSNorm, attention with rotary position embeddings (RoPE) and grouped-query
attention (fewer key/value heads than query heads) through ``F.scaled_dot_product_attention``, RMSNorm and a SwiGLU
MLP; a final RMSNorm and the output projection. The parameter names are those of Hugging Face's
``LlamaForCausalLM``, so :func:`to_hf_llama` copies the same weights into one and both compute the same function.

Decoding with a **static KV cache** keeps every shape fixed from one token to the next: the cache holds keys and
values for ``max_batch`` sequences of up to ``max_len`` positions, a decode step writes one position per sequence
and attends over all ``max_len`` positions with a mask (key position <= the sequence's own position). A fixed shape
is what lets one CUDA graph replay every decode step of a batch size.

Row ``i`` of a decode batch is row ``i`` of the cache; each row has its own position, so sequences of different
lengths can share a batch. Rows are independent: a row's output depends on its own token, position and cache row
only, so a decode step can be padded up to a bucket size (the padding rows write into cache rows that no sequence
uses).

Example::

    import torch
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM, greedy_generate, greedy_generate_no_cache

    cfg = TinyConfig(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=128)
    model = TinyLLM(cfg, seed=0).eval()
    cache = StaticKVCache(cfg, max_batch=4, max_len=32)
    prompt = torch.randint(0, cfg.vocab_size, (4, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens = greedy_generate(model, cache, prompt, new_tokens=16)         # (4, 16), static cache
        assert torch.equal(tokens, greedy_generate_no_cache(model, prompt, 16))  # full recompute, same tokens
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TinyConfig", "TinyLLM", "StaticKVCache", "greedy_generate", "greedy_generate_no_cache", "to_hf_llama",
           "hf_generate", "first_divergence"]


@dataclass
class TinyConfig:
    """Sizes of the model. ``heads`` query heads share ``kv_heads`` key/value heads (grouped-query attention)."""
    vocab_size: int = 4096
    dim: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    hidden: int = 1408          # SwiGLU hidden size
    rope_theta: float = 10000.0
    eps: float = 1e-5

    def __post_init__(self):
        if self.dim % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of heads ({self.heads}), and heads a multiple of "
                             f"kv_heads ({self.kv_heads}). Fix: pick sizes that divide.")
        if self.head_dim % 2:
            raise ValueError(f"the head size dim / heads = {self.head_dim} must be even for rotary embeddings.")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as LLaMA's (``LlamaRMSNorm``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(cfg: TinyConfig, max_len: int, device=None, dtype=torch.float32):
    """cos and sin of the rotary embedding for positions 0..max_len-1: two (max_len, head_dim) tensors."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    freqs = torch.outer(torch.arange(max_len, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate ``x`` (..., head_dim) by the angles whose cos/sin broadcast against it (LLaMA's half-split layout)."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)

    def decode(self, h, cos, sin, k_cache, v_cache, rows, pos, mask):
        """One new token per row. h: (b, dim); cos/sin: (b, head_dim); k/v_cache: (b, kv_heads, T, head_dim)
        views of the cache rows; rows, pos: (b,); mask: (b, 1, 1, T), True where a key may be attended to."""
        cfg, b = self.cfg, h.shape[0]
        hd, kv, group = cfg.head_dim, cfg.kv_heads, cfg.heads // cfg.kv_heads
        q = apply_rope(self.q_proj(h).view(b, cfg.heads, hd), cos[:, None], sin[:, None])
        k = apply_rope(self.k_proj(h).view(b, kv, hd), cos[:, None], sin[:, None])
        v = self.v_proj(h).view(b, kv, hd)
        k_cache[rows, :, pos] = k            # write this position of every row (index_put_: no host sync)
        v_cache[rows, :, pos] = v
        # grouped-query attention without copying the cache: the `group` query heads that share a key/value head
        # become `group` queries of it, so the batch dims are (b, kv_heads) and the keys are the cache as it is.
        # Query head j uses key/value head j // group, as in LLaMA.
        a = F.scaled_dot_product_attention(q.view(b, kv, group, hd), k_cache, v_cache, attn_mask=mask)
        return self.o_proj(a.reshape(b, cfg.heads * hd))

    def prefill(self, h, cos, sin, k_cache=None, v_cache=None):
        """A whole prompt per row, causal. h: (b, L, dim); cos/sin: (L, head_dim); the cache views, if given, are
        (b, kv_heads, T >= L, head_dim) and receive positions 0..L-1."""
        cfg = self.cfg
        b, L, _ = h.shape
        hd, group = cfg.head_dim, cfg.heads // cfg.kv_heads
        q = apply_rope(self.q_proj(h).view(b, L, cfg.heads, hd).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(h).view(b, L, cfg.kv_heads, hd).transpose(1, 2), cos, sin)
        v = self.v_proj(h).view(b, L, cfg.kv_heads, hd).transpose(1, 2)
        if k_cache is not None:
            k_cache[:, :, :L] = k
            v_cache[:, :, :L] = v
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, L, cfg.heads * hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.eps)


class Backbone(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)


class TinyLLM(nn.Module):
    """The model. ``decode`` runs one token per row against a :class:`StaticKVCache`; ``prefill`` runs prompts
    into it; ``forward`` recomputes whole sequences without a cache (the reference for correctness).

    Weights are drawn in place from ``seed`` (normal, std ``init_std``; norms at 1), on ``device`` in ``dtype``.
    """

    def __init__(self, cfg: TinyConfig, seed: int = 0, device=None, dtype=torch.float32, init_std: float = 0.02):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():      # drawn on the CPU: the same weights on every device
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * init_std)
        self.to(device=device, dtype=dtype)
        self._rope = {}

    def rope(self, max_len: int, device):
        key = (max_len, str(device), self.lm_head.weight.dtype)
        if key not in self._rope:
            self._rope[key] = rope_tables(self.cfg, max_len, device, self.lm_head.weight.dtype)
        return self._rope[key]

    def decode(self, tokens, pos, cache: "StaticKVCache"):
        """Logits (b, vocab) of the next token for each row; writes each row's key/value at its position.

        tokens, pos: (b,) int64 on the cache's device, b <= cache.max_batch; row i is cache row i. Nothing in it
        reads a value on the host, so it can be captured in a CUDA graph (shapes fixed for a given b)."""
        b = tokens.shape[0]
        cos, sin = cache.cos[pos], cache.sin[pos]
        mask = (cache.positions[None, :] <= pos[:, None])[:, None, None, :]
        rows = cache.rows[:b]
        x = self.model.embed_tokens(tokens)
        for i, layer in enumerate(self.model.layers):
            x = x + layer.self_attn.decode(layer.input_layernorm(x), cos, sin, cache.k[i, :b], cache.v[i, :b],
                                           rows, pos, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))

    def prefill(self, prompt, cache: "StaticKVCache"):
        """Run prompts (b, L) into cache rows 0..b-1, positions 0..L-1; returns the last position's logits (b, vocab)."""
        b, L = prompt.shape
        if L > cache.max_len or b > cache.max_batch:
            raise ValueError(f"a prompt batch of {b} x {L} tokens does not fit a cache of {cache.max_batch} rows x "
                             f"{cache.max_len} positions. Fix: build a larger StaticKVCache.")
        cos, sin = cache.cos[:L], cache.sin[:L]
        x = self.model.embed_tokens(prompt)
        for i, layer in enumerate(self.model.layers):
            x = x + layer.self_attn.prefill(layer.input_layernorm(x), cos, sin, cache.k[i, :b], cache.v[i, :b])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x[:, -1]))

    def forward(self, tokens):
        """Logits (b, L, vocab) of whole sequences (b, L), recomputed without a cache."""
        L = tokens.shape[1]
        cos, sin = self.rope(L, tokens.device)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = x + layer.self_attn.prefill(layer.input_layernorm(x), cos[:L], sin[:L])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))


class StaticKVCache(nn.Module):
    """Keys and values for ``max_batch`` rows of ``max_len`` positions, allocated once: fixed addresses and shapes.

    ``k``, ``v``: (layers, max_batch, kv_heads, max_len, head_dim) buffers; ``cos``/``sin``: the rotary tables for
    every position; ``rows``/``positions``: 0..max_batch-1 and 0..max_len-1. Nothing is ever reallocated, so a CUDA
    graph that reads or writes them stays valid.
    """

    def __init__(self, cfg: TinyConfig, max_batch: int, max_len: int, device=None, dtype=torch.float32):
        super().__init__()
        self.cfg, self.max_batch, self.max_len = cfg, max_batch, max_len
        shape = (cfg.layers, max_batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype))
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype))
        cos, sin = rope_tables(cfg, max_len, device, dtype)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("rows", torch.arange(max_batch, device=device))
        self.register_buffer("positions", torch.arange(max_len, device=device))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src``'s keys and values to row ``dst`` (compacting a batch when a sequence finishes)."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])


def greedy_generate(model: TinyLLM, cache: StaticKVCache, prompt, new_tokens: int, step=None, logits_out=None):
    """Greedy decoding with the static cache: prefill (eager), then ``new_tokens - 1`` decode steps.

    ``step(tokens, pos)`` runs one decode step and returns logits (b, vocab); default ``model.decode`` on ``cache``.
    Pass a CUDA graph of it (``capture``/``capture_buckets``) or a compiled version instead: the loop is the same.
    ``logits_out``, a list, receives each step's logits (float32 copies) for tolerance checks. Returns (b, new_tokens).
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}.")
    step = step or (lambda t, p: model.decode(t, p, cache))
    b, L = prompt.shape
    if L + new_tokens - 1 > cache.max_len:
        raise ValueError(f"{L} prompt + {new_tokens} new tokens need {L + new_tokens - 1} cache positions; the cache "
                         f"has {cache.max_len}. Fix: StaticKVCache(..., max_len=...) large enough.")
    logits = model.prefill(prompt, cache)
    out = [logits.argmax(-1)]
    if logits_out is not None:
        logits_out.append(logits.float().clone())
    pos = torch.full((b,), L, dtype=torch.long, device=prompt.device)
    for _ in range(new_tokens - 1):
        logits = step(out[-1], pos)
        out.append(logits.argmax(-1))
        if logits_out is not None:
            logits_out.append(logits.float().clone())
        pos = pos + 1
    return torch.stack(out, dim=1)


def greedy_generate_no_cache(model: TinyLLM, prompt, new_tokens: int, logits_out=None):
    """Greedy decoding by recomputing the whole sequence for every new token (no cache): the reference."""
    seq = prompt
    for _ in range(new_tokens):
        logits = model(seq)[:, -1]
        if logits_out is not None:
            logits_out.append(logits.float().clone())
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompt.shape[1]:]


def first_divergence(tokens, reference, logits=None, reference_logits=None) -> dict:
    """Where two greedy token tensors (b, n) first differ, and whether that is a near tie.

    Returns ``{"equal": bool, "rows_differing": int, "first_step": int | None, "margin": float, "logit_diff": float,
    "near_tie": bool | None}``: at the first differing step, ``margin`` is the reference's gap between its top two
    logits in the differing row, and ``logit_diff`` the largest |logits - reference_logits| there (both NaN without
    logits). A divergence with ``logit_diff >= margin`` is a near tie that rounding decided (different kernels round
    differently): ``near_tie`` True; after it the two continuations are different texts and are no longer compared.
    ``near_tie`` is False for equal tokens and None for a divergence without logits (pass them to know).

    Example::

        d = first_divergence(tokens, ref, logits, ref_logits)
        if not d["equal"] and not d["near_tie"]: raise AssertionError(f"decodes differently: {d}")
    """
    tokens, reference = tokens.cpu(), reference.cpu()
    diff = tokens != reference
    out = {"equal": not bool(diff.any()), "rows_differing": int(diff.any(dim=1).sum()), "first_step": None,
           "margin": math.nan, "logit_diff": math.nan, "near_tie": False}
    if out["equal"]:
        return out
    steps = diff.any(dim=0).nonzero().flatten()
    s = int(steps[0])
    out["first_step"] = s
    out["near_tie"] = None
    if logits is not None and reference_logits is not None:
        row = int(diff[:, s].nonzero()[0])
        ref = reference_logits[s][row].float().cpu()
        top2 = ref.topk(2).values
        out["margin"] = float(top2[0] - top2[1])
        out["logit_diff"] = float((logits[s][row].float().cpu() - ref).abs().max())
        out["near_tie"] = out["logit_diff"] >= out["margin"]
    return out


# ------------------------------------------------------------------------------------------------ Hugging Face
def to_hf_llama(model: TinyLLM, max_position_embeddings: int = 4096):
    """A ``transformers.LlamaForCausalLM`` with this model's configuration and a copy of its weights (same device
    and dtype), in eval mode. Needs ``transformers``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden,
                  num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                  head_dim=cfg.head_dim, max_position_embeddings=max_position_embeddings, rms_norm_eps=cfg.eps,
                  hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=0)
    try:   # transformers 5: rope settings in rope_parameters
        hf_cfg = LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    except TypeError:   # transformers 4
        hf_cfg = LlamaConfig(**common, rope_theta=cfg.rope_theta)
    theta = (getattr(hf_cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(hf_cfg, "rope_theta", None))
    if theta != cfg.rope_theta:
        raise RuntimeError(f"this transformers version did not take rope_theta={cfg.rope_theta} (it has {theta}).")
    hf_cfg._attn_implementation = "sdpa"
    p = model.lm_head.weight
    hf = LlamaForCausalLM(hf_cfg).to(device=p.device, dtype=p.dtype)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise RuntimeError(f"weights do not map onto LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    return hf.eval()


def hf_generate(hf_model, prompt, new_tokens: int, cache_implementation: str | None = "static", logits_out=None,
                **kwargs):
    """Greedy ``generate`` of exactly ``new_tokens`` tokens (no end-of-sequence token): returns (b, new_tokens).

    ``cache_implementation="static"`` makes transformers allocate a static cache; on a GPU its ``generate`` then
    compiles the decoding forward with ``torch.compile(mode="reduce-overhead")`` by itself (transformers 4.48+).
    ``None`` uses its default dynamic cache (eager). ``logits_out``, a list, receives each step's logits."""
    from transformers import GenerationConfig

    extra = dict(return_dict_in_generate=True, output_logits=True) if logits_out is not None else {}
    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              eos_token_id=None, pad_token_id=0, cache_implementation=cache_implementation,
                              **extra, **kwargs)
    mask = torch.ones_like(prompt)
    out = hf_model.generate(prompt, attention_mask=mask, generation_config=config)
    if logits_out is not None:
        logits_out.extend(lg.float() for lg in out.logits)
        out = out.sequences
    return out[:, prompt.shape[1]:]
