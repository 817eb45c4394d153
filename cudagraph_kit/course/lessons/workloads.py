"""What the lessons run and time beyond one call of a model.

The input pipeline against a training step (notebook 04's appendix), the cases of the advise experiment (05), a
stream of requests of varying size (06) and a serving loop whose batch changes every step (08).

The serving loop: requests arrive at random (``make_stream``, seeded), each with a one-token prompt and a length;
at most ``max_batch`` are decoded together; a finished request's hole is filled by the last row (its cache row
too), so the active requests always fill rows ``0..n-1`` and a bucket's padding rows are free rows.

Example (eager, CPU)::

    from cudagraph_kit.course.lessons.workloads import batch_sizes, make_stream, serve_stream
    stream = make_stream(seed=10, steps=30, max_batch=4, max_gen=8)
    tokens = {}
    serve_stream(lambda t, p: model.decode(t, p, cache), stream, cache, 4, cfg.vocab_size, record=tokens)
    batch_sizes(stream, 4)        # the batch size of every step
"""
from __future__ import annotations

import multiprocessing
import time

import torch

from ..measuring.measure import with_window_medians
from .models import detached_eager_step
from .vision import train_batch

__all__ = ["SyntheticImages", "feeding_windows", "limited_by", "overlap", "advise_workloads", "draw_sizes",
           "request_sizes", "request_views", "run_stream", "make_stream", "batch_sizes", "serve_stream",
           "serve_table"]


# --- notebook 04's appendix: the input pipeline against a training step ----------------------------------------


class SyntheticImages(torch.utils.data.Dataset):
    """Random uint8 images and labels, made per sample in the worker (as decoding would be)."""

    def __init__(self, n: int, image: int, classes: int = 1000):
        self.n, self.image, self.classes = n, image, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 256, (3, self.image, self.image), dtype=torch.uint8, generator=g)
        return x, int(torch.randint(0, self.classes, (1,), generator=g))


def _loader(batch: int, steps: int, image: int, workers: int, pin: bool):
    fork = "fork" in multiprocessing.get_all_start_methods()
    workers = workers if fork else 0
    return torch.utils.data.DataLoader(
        SyntheticImages(batch * (steps + 2), image), batch_size=batch, shuffle=False, drop_last=True,
        num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None, prefetch_factor=4 if workers else None)


def _seconds_per_batch(batches, per_batch, steps: int, cuda: bool) -> float:
    """Seconds per batch over ``steps`` batches, after 2 (a fresh epoch's first batches are start-up)."""
    for _ in range(2):
        per_batch(*next(batches))
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        per_batch(*next(batches))
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def feeding_windows(step, batch: int, steps: int, image: int, workers: int, device, windows: int, pause_s: float,
                    case: str, progress=print):
    """Time the input pipeline against a (graphed) training ``step`` in ``windows`` windows: "loader only"
    (iterate a DataLoader with ``workers`` workers, pinned memory, copy each batch to ``device``), "step only" (the
    step on one batch already there) and "loader + step" (the real loop). A loader is a stream with a prefetch
    queue, not a call to repeat, so each window times ``steps`` batches of a fresh epoch, after 2. Returns one
    table per window (case, variant, median_us, speedup over "loader only"), for ``combine_windows``."""
    import pandas as pd

    cuda = torch.device(device).type == "cuda"
    to_dev = lambda x, y: (x.to(device, non_blocking=True), y.to(device, non_blocking=True))  # noqa: E731
    loader = _loader(batch, steps, image, workers, cuda)
    fixed = train_batch(batch, image, device, seed=3)
    frames = []
    for w in range(windows):
        if w:
            time.sleep(pause_s)
        t = {"loader only": _seconds_per_batch(iter(loader), to_dev, steps, cuda),
             "step only": _seconds_per_batch(iter([fixed] * (steps + 2)), step, steps, cuda),
             "loader + step": _seconds_per_batch(iter(loader), lambda x, y: step(*to_dev(x, y)), steps, cuda)}
        base = t["loader only"]
        frames.append(pd.DataFrame([{"case": case, "variant": k, "median_us": v * 1e6, "speedup": base / v}
                                    for k, v in t.items()]))
        if progress is not None:
            progress(f"data feeding window {w + 1}/{windows}: " + ", ".join(f"{k} {v * 1e3:.2f} ms"
                                                                            for k, v in t.items()))
    return frames


def overlap(frames) -> list:
    """Per window: the real loop's time over its slower part's (1.0: the loader and the step overlap fully)."""
    out = []
    for f in frames:
        t = f.set_index("variant").median_us
        out.append(float(t["loader + step"] / max(t["loader only"], t["step only"])))
    return out


def limited_by(frames, verdict: str) -> str:
    """Which part limits the data feeding, in words: the verdict of "the loader alone is faster than the step alone"
    where it is definite, else in how many windows the step was the slower part.

    Example::

        limited_by(frames, "unclear")   # 'neither clearly: the training step was the slower part in 5 of 8 windows'
    """
    if verdict in ("holds", "fails"):
        return "the training step" if verdict == "holds" else "the input pipeline"
    medians = [f.set_index("variant").median_us for f in frames]   # per window
    n = sum(bool(t["step only"] > t["loader only"]) for t in medians)
    return f"neither clearly: the training step was the slower part in {n} of {len(frames)} windows"


# --- notebook 05: the cases of the advise experiment ---------------------------------------------------------


def advise_workloads(gelu):
    """Section 7's cases, one at a time: ``(case, claim id, args, eager, capture_graph)``. The GELU of notebook 01 on a
    small and a large tensor, then notebook 02's training steps (two MLP sizes, SGD and ``Adam(capturable=True)``,
    with dropout). ``eager`` is the function ``advise`` predicts for; ``capture_graph()`` captures its graph only when
    called, so a notebook can run ``advise`` first, with nothing captured, and returns ``{variant: graphed fn}`` for
    ``measure`` (the GELU's ``"graph"`` replays the captured input; a step's ``"whole-step graph"`` is the kit's
    ``capture_train_step``, warmed up and captured, which holds its own model and optimizer)."""
    import torch

    from ...graphed import capture
    from ...train_step import capture_train_step

    for case, claim_id, shape in (("GELU small", "gelu_small", (1, 3, 224, 224)),
                                  ("GELU large", "gelu_large", (32, 3, 224, 224))):
        x = torch.randn(shape, device="cuda")

        def graph_of(x=x):
            g = capture(gelu, x)
            return {"graph": lambda t, g=g: g.replay()}
        yield case, claim_id, (x,), gelu, graph_of

    for size, label, (n, d_in, h, d_out) in (("32x128x256x16", "mlp_small", (32, 128, 256, 16)),
                                             ("640x4096x2048x1024", "mlp_large", (640, 4096, 2048, 1024))):
        for opt_name, opt_label in (("SGD", "sgd"), ("Adam(capturable)", "adam")):
            torch.manual_seed(0)
            x, y = torch.randn(n, d_in, device="cuda"), torch.randn(n, d_out, device="cuda")

            def make(seed=0, d_in=d_in, h=h, d_out=d_out, opt_name=opt_name):
                torch.manual_seed(seed)
                m = torch.nn.Sequential(torch.nn.Linear(d_in, h), torch.nn.Dropout(0.2),
                                        torch.nn.Linear(h, d_out), torch.nn.Dropout(0.1)).cuda()
                o = (torch.optim.SGD(m.parameters(), lr=0.1) if opt_name == "SGD"
                     else torch.optim.Adam(m.parameters(), lr=1e-3, capturable=True))
                return m, o

            def graph_of(make=make, x=x, y=y):
                step = capture_train_step(*make(), torch.nn.functional.mse_loss, (x, y))
                for _ in range(5):
                    step(x, y)                              # warm-up, capture, replays
                return {"whole-step graph": step}
            yield f"MLP {size}, {opt_name}", f"{label}_{opt_label}", (x, y), detached_eager_step(*make()), graph_of


# --- notebook 06: a stream of requests of varying size -------------------------------------------------------


def draw_sizes(n, seed, max_rows, overflow_share):
    """``n`` request sizes: 1..``max_rows``, skewed small (uniform cubed), and a share ``overflow_share`` of them
    above ``max_rows`` (no bucket covers those)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    sizes = 1 + (max_rows * torch.rand(n, generator=gen) ** 3).floor().long()
    over = torch.rand(n, generator=gen) < overflow_share
    big = max_rows + 1 + (torch.rand(n, generator=gen) * max_rows / 2).floor().long()
    return torch.where(over, big, sizes).tolist()


def request_sizes(requests, history, max_rows, overflow_share, seed):
    """The timed stream's sizes (at least one above ``max_rows``, so the overflow path runs) and a separate draw
    ``history`` (another seed) for the planner; prints what they look like."""
    import numpy as np

    stream = draw_sizes(requests, seed, max_rows, overflow_share)
    if max(stream) <= max_rows:  # make sure the overflow path is exercised
        stream[len(stream) // 2] = max_rows + 1 + max_rows // 4
    past = draw_sizes(history, seed + 1, max_rows, overflow_share)
    s = np.array(stream)
    print(f"stream: {len(s)} requests, {len(set(stream))} distinct sizes, rows per request: median "
          f"{np.median(s):.0f}, p90 {np.percentile(s, 90):.0f}, max {s.max()}; {(s > max_rows).sum()} request(s) "
          f"above MAX_ROWS={max_rows}\nhistory: {history} sizes, {len(set(past))} distinct")
    return stream, past


def request_views(models, stream_sizes, max_rows, device, seed):
    """Per model: one input tensor of ``2 * max_rows`` rows on the device, and the stream's requests as views into
    it (no host-to-device copy is timed). Returns ``(data, streams)``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    offsets = [int(torch.randint(0, 2 * max_rows - n + 1, (1,), generator=gen)) for n in stream_sizes]
    data, streams = {}, {}
    for name, (model, row_shape) in models.items():
        model.to(device).eval()
        data[name] = torch.randn(2 * max_rows, *row_shape, device=device)
        streams[name] = [data[name][o:o + n] for o, n in zip(offsets, stream_sizes)]
        print(f"{name}: rows of shape {row_shape}, {sum(p.numel() for p in model.parameters()):,} parameters")
    return data, streams


def run_stream(fn, requests):
    """One pass over the stream: every request through ``fn``, back to back."""
    for x in requests:
        fn(x)


# --- notebook 08: the serving loop ---------------------------------------------------------------------------


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


def serve_table(m_serve, strategies: dict, sizes_of: dict, observed: list, same: dict, ledger):
    """The serving loop's table: ``with_window_medians(m_serve)`` plus, per strategy, time per step, tokens per
    second, the share of requests decoded as eager (``same``), its number of graphs, capture time, the memory they
    hold (``ledger.record``), its bucket sizes and the padding share of the computed rows on ``observed``. A strategy
    whose graphs ran eagerly (no GPU) gets no speedup: it would compare eager with eager."""
    from ...bucket_plan import evaluate_buckets
    from ..measuring.measure import ran_eagerly

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
