"""Graph your own Hugging Face model: a ``transformers`` causal LM's decode step with a ``StaticCache``, captured by
the kit (notebook 08, "Going further" D, "Your own Hugging Face model"; the recipe is also in docs/CHEATSHEET.md).

The recipe: allocate a ``StaticCache`` once; make the decode step a function of two tensors, ``input_ids`` (b, 1)
and ``position_ids`` (b, 1), that calls the model with that cache and returns the last position's logits; prefill
eagerly; capture the step; replay it for every token.

**The trap.** Where a decode step writes its key and value depends on the ``transformers`` version. In 4.x a
static cache writes at the ``cache_position`` it is given. In 5.x (checked with 5.17 and 5.24) every
``StaticLayer`` keeps its own write position, a device tensor (``cumulative_length``) that advances on every
update and ignores ``cache_position``; 5.24's causal mask reads it too. A captured step then advances it at every
replay, and the capture's own warm-up calls advanced it as well: before each new sequence it must go back to
zero (``cache.reset()``, in place), or ``index_copy_`` writes past the cache's end. :func:`write_position_behaviour`
detects which kind this ``transformers`` has, by a probe, not by its version number; :class:`StaticDecoder` resets
the cache before every sequence and checks the write position after every prefill.

Example::

    from transformers import LlamaConfig, LlamaForCausalLM
    from cudagraph_kit.graphed import capture
    from cudagraph_kit.course.lessons.hf_decode import StaticDecoder

    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                         num_attention_heads=4, num_key_value_heads=2)).cuda().eval()
    dec = StaticDecoder(model, batch=1, max_len=128)
    graph = dec.capture(capture)                  # the kit's capture of dec.step, cache reset after it
    tokens = dec.generate(prompt, 64, step=graph)  # == dec.generate(prompt, 64), the eager step
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

__all__ = ["hf_status", "make_static_cache", "WritePosition", "write_position_behaviour", "StaticDecoder",
           "MIN_TRANSFORMERS"]

MIN_TRANSFORMERS = (4, 45)   # StaticCache with reset(), LlamaForCausalLM taking position_ids and a cache object


def _version(text: str) -> tuple:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def hf_status() -> tuple:
    """``(version, reason)``: the ``transformers`` version if this recipe can run with the one installed here, else
    None; the reason says why not (not importable, too old, no ``StaticCache`` with ``reset``) or names the version.

    Example: ``version, why = hf_status(); if version is None: print("skipped:", why)``"""
    import warnings

    try:
        with warnings.catch_warnings():   # in a notebook without ipywidgets, tqdm warns on import; nothing here uses it
            warnings.filterwarnings("ignore", message="IProgress not found")
            import transformers
            has_reset = hasattr(getattr(transformers, "StaticCache", None), "reset")   # a lazy import: inside too
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason means: skip, and say why
        return None, f"transformers is not importable ({type(exc).__name__}: {exc}); pip install transformers"
    version = transformers.__version__
    if _version(version) < MIN_TRANSFORMERS:
        return None, (f"transformers {version} is older than {'.'.join(map(str, MIN_TRANSFORMERS))}, the oldest "
                      "this recipe supports; pip install -U transformers")
    if not has_reset:
        return None, f"transformers {version} has no StaticCache with reset(); pip install -U transformers"
    return version, f"transformers {version}"


def _parameters(fn) -> set:
    return set(inspect.signature(fn).parameters)


def make_static_cache(config, batch: int, max_len: int, device=None, dtype=torch.float32):
    """A ``transformers.StaticCache`` for ``batch`` sequences of ``max_len`` positions, whatever the version's
    constructor takes (4.x: ``max_batch_size``/``batch_size``, ``device``, ``dtype``; 5.x: the sizes come lazily
    from the first update)."""
    from transformers import StaticCache

    params = _parameters(StaticCache.__init__)
    kw = {"config": config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", device), ("dtype", dtype)):
        if name in params:
            kw[name] = value
    return StaticCache(**kw)


def _layers(cache) -> list:
    return list(getattr(cache, "layers", None) or [])


def _counters(cache) -> dict:
    """Every integer scalar tensor the cache or its layers hold, by name: candidates for a write position."""
    found = {}
    for prefix, obj in [("cache", cache)] + [(f"layers[{i}]", layer) for i, layer in enumerate(_layers(cache))]:
        for name, value in vars(obj).items():
            if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
                found[f"{prefix}.{name}"] = value
    return found


@dataclass(frozen=True)
class WritePosition:
    """How this ``transformers``' static cache decides where a decode step writes.

    ``follows_cache_position``: the write lands at the ``cache_position`` passed in (4.x). ``counters``: the names
    of the device tensors a layer advances by itself on each update (5.x: ``cumulative_length``); a captured step
    advances them at every replay, so they must be reset before each sequence."""
    follows_cache_position: bool
    counters: tuple

    def describe(self) -> str:
        if self.counters:
            names = sorted({c.split(".", 1)[1] for c in self.counters})
            return (f"each cache layer keeps its own write position on the device ({', '.join(names)}), advanced by "
                    f"every update{'' if self.follows_cache_position else ', ignoring cache_position'}: reset the "
                    "cache before each sequence (and after capturing, whose warm-up advanced it)")
        return "writes land at the cache_position passed in: a static position input is enough"


def write_position_behaviour(config) -> WritePosition:
    """Probe a tiny ``StaticCache`` of ``config`` on the CPU: update layer 0 once with one position, passing
    ``cache_position=[2]``, and see where the key landed and which integer tensors of the cache moved."""
    cache = make_static_cache(config, batch=1, max_len=4, device="cpu", dtype=torch.float32)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    before = {name: t.clone() for name, t in _counters(cache).items()}
    key = torch.ones(1, heads, 1, head_dim)
    keys, _ = cache.update(key, key.clone(), 0, {"cache_position": torch.tensor([2])})
    written = keys[0, 0, :, 0].nonzero().flatten().tolist()
    after = _counters(cache)
    moved = tuple(sorted(n for n, t in after.items() if n not in before or not torch.equal(before[n], t)))
    return WritePosition(follows_cache_position=written == [2], counters=moved)


class StaticDecoder:
    """Greedy decoding of a ``transformers`` causal LM with a ``StaticCache`` whose decode step can be captured.

    ``step(input_ids, position_ids) -> logits`` ((b, 1), (b, 1) int64 -> (b, vocab)) is the function to capture;
    :meth:`capture` captures it and resets the cache; :meth:`generate` resets, prefills eagerly, checks the write
    position and decodes with ``step`` (eager) or a graph of it. ``behaviour`` is this version's
    :class:`WritePosition`."""

    def __init__(self, model, batch: int, max_len: int):
        version, reason = hf_status()
        if version is None:
            raise RuntimeError(f"the Hugging Face recipe cannot run: {reason}.")
        if batch > 1 and _version(torch.__version__) < (2, 5):
            raise RuntimeError(
                f"a StaticCache at batch {batch} needs PyTorch 2.5 or newer here: on PyTorch {torch.__version__}, "
                "transformers builds its causal mask with an in-place fix for older PyTorch that writes into an "
                "expanded tensor and raises at batch > 1 (seen with transformers 4.57 on PyTorch 2.3). Fix: upgrade "
                "PyTorch, or decode one sequence at a time (batch=1).")
        p = next(model.parameters())
        self.model, self.batch, self.max_len = model, batch, max_len
        self.cache = make_static_cache(model.config, batch, max_len, device=p.device, dtype=p.dtype)
        self.behaviour = write_position_behaviour(model.config)
        params = _parameters(model.forward)
        self._cache_kw = "past_key_values" if "past_key_values" in params else "cache"
        self._takes_cache_position = "cache_position" in params
        self._logits_to_keep = "logits_to_keep" in params

    def _forward(self, input_ids, position_ids):
        kw = {self._cache_kw: self.cache, "use_cache": True, "position_ids": position_ids}
        if self._takes_cache_position:
            kw["cache_position"] = position_ids[0]
        if self._logits_to_keep:
            kw["logits_to_keep"] = 1
        return self.model(input_ids=input_ids, **kw).logits[:, -1]

    def step(self, input_ids, position_ids):
        """One decode step: (b, 1) tokens at (b, 1) positions -> (b, vocab) logits; writes the cache in place."""
        return self._forward(input_ids, position_ids)

    def write_positions(self) -> list:
        """The cache's own write positions (one per layer that keeps one; empty in 4.x). Reads the device."""
        return sorted({int(t) for n, t in _counters(self.cache).items()
                       if n.split(".", 1)[1] in {c.split(".", 1)[1] for c in self.behaviour.counters}})

    def prefill(self, prompt):
        """Reset the cache, run the prompt (b, L) into positions 0..L-1, check the write position; last logits."""
        b, length = prompt.shape
        if b != self.batch or length >= self.max_len:
            raise ValueError(f"a prompt of {b} x {length} tokens does not fit this decoder ({self.batch} rows, "
                             f"{self.max_len} positions). Fix: StaticDecoder(model, batch={b}, max_len=...) larger.")
        self.cache.reset()
        pos = torch.arange(length, device=prompt.device).expand(b, -1)
        logits = self._forward(prompt, pos)
        seen = self.write_positions()
        if seen and seen != [length]:
            raise RuntimeError(f"after a {length}-token prefill the cache's write position is {seen}, not "
                               f"[{length}]: the cache was not reset in place. Fix: call cache.reset() before "
                               "each sequence, never replace the cache object a graph captured.")
        return logits

    def capture(self, capture_fn, fn=None, **kwargs):
        """``capture_fn(fn, input_ids, position_ids, **kwargs)`` (e.g. the kit's ``capture``) on sample inputs;
        ``fn`` defaults to :meth:`step` (pass e.g. ``torch.compile(dec.step)``). One eager call first (a cache that
        allocates on its first update, or a compile, happens there), and ``cache.reset()`` before and after: the
        warm-up calls advanced the write position."""
        fn = fn or self.step
        device = next(self.model.parameters()).device
        ids = torch.zeros(self.batch, 1, dtype=torch.long, device=device)
        pos = ids.clone()   # two tensors, as in the capture: a compiled fn first called with one tensor passed
        fn(ids, pos)        # twice would be recompiled for two (Dynamo guards on the aliasing)
        self.cache.reset()
        graph = capture_fn(fn, ids, pos, **kwargs)
        self.cache.reset()
        return graph

    def generate(self, prompt, new_tokens: int, step=None, logits_out=None):
        """Greedy tokens (b, new_tokens): reset and prefill (eager), then ``step`` (default: the eager step, or
        a graph of it) for each further token. ``logits_out`` (a list) receives each step's logits."""
        step = step or self.step
        if prompt.shape[1] + new_tokens - 1 > self.max_len:
            raise ValueError(f"{prompt.shape[1]} prompt + {new_tokens} new tokens need more than the cache's "
                             f"{self.max_len} positions. Fix: StaticDecoder(..., max_len=...) larger.")
        logits = self.prefill(prompt)
        tokens = [logits.argmax(-1)]
        if logits_out is not None:
            logits_out.append(logits.float().clone())
        pos = torch.full((prompt.shape[0], 1), prompt.shape[1], dtype=torch.long, device=prompt.device)
        for _ in range(new_tokens - 1):
            logits = step(tokens[-1][:, None], pos)
            tokens.append(logits.argmax(-1))
            if logits_out is not None:
                logits_out.append(logits.float().clone())
            pos = pos + 1
        return torch.stack(tokens, dim=1)
