"""Notebook 06's parts that are not the lesson: the request stream, building and measuring every bucket strategy
(``Strategies``), compiling the reduce-overhead variants, the latency pass, the stream's verdicts
(``stream_verdicts``, for ``measure``), the results table, the trade-off figure, reading the pool of
reduce-overhead's CUDA graph trees, and the label helpers. The notebook makes one call per step and says what it does.

Example::

    from cudagraph_kit.course.nb06_parts import plot_tradeoff, strategy
    strategy("steps of 8 (default) (eager fallback)")   # 'steps of 8 (default)'
    phrase("steps of 8 (default)")                      # 'the default ladder (steps of 8)'
"""
from __future__ import annotations

from .measure import window_medians  # noqa: F401  (the notebook imports it from here)
from .verdicts import covers

__all__ = ["plot_tradeoff", "graph_trees_pool_bytes", "strategy", "phrase", "window_medians", "draw_sizes",
           "request_sizes", "make_mlp", "request_views", "fixed_ladders", "run_stream", "Strategies",
           "compile_variants", "latency_pass", "stream_verdicts", "results_table", "show_results",
           "launches_per_request", "RESULT_COLUMNS", "SHORT", "MiB"]


def strategy(label: str) -> str:
    """A variant's strategy: its label without the "(eager fallback)" a CPU run adds."""
    return str(label).replace(" (eager fallback)", "")


_PHRASES = {"exact sizes": "one graph per size", "single bucket": "a single bucket", "default ladder": "the default ladder",
            "planned": "the planned bucket set", "planned at the best ladder's limits": "the planned bucket set",
            "reduce-overhead, dynamic=True": "reduce-overhead with dynamic=True"}


def phrase(label: str) -> str:
    """A strategy's label as a singular noun phrase for a claim's sentence ("X is 2x faster than Y"): the table's
    short labels ("steps of 8 (default)", "reduce-overhead, dynamic=True") read as plurals or lists there."""
    s = strategy(label)
    base = s.removesuffix(" (default)")
    if base == "pow2" or base.startswith("steps of "):   # a fixed ladder; the kit's default says so
        spacing = "powers of two" if base == "pow2" else base
        return f"the default ladder ({spacing})" if s != base else f"the ladder in {spacing}"
    return _PHRASES.get(s, s)


def graph_trees_pool_bytes():
    """Bytes reserved by the pool of reduce-overhead's CUDA graph trees on this GPU, or None where not readable.

    One pool per GPU and thread, created by the graph trees' manager and shared by every function compiled with
    mode="reduce-overhead" in the thread (torch/_inductor/cudagraph_trees.py: CUDAGraphTreeManager)."""
    import torch

    from ..memory import pool_usage

    try:
        from torch._inductor import cudagraph_trees  # private API: it may move between PyTorch versions
        manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        pool = tuple(manager.cuda_graphs_thread_pool)
    except Exception:
        return None
    return pool_usage().get(pool, {}).get("reserved")


def plot_tradeoff(df, info, curve, trees_pool_mib, models, order, cuda):
    """Time, padding and memory of every strategy of each model, one row of three panels per model: time per
    request against graphs captured (with the prediction interval of the median pass), padded rows with the
    planner's curve, memory held and setup time (``order``: the bucketed strategies, in the legend's order)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import torch

    names = list(models)
    style = {s: (f"C{i}", "osD^v<>P*X"[i % 10]) for i, s in enumerate(order)}   # the same in every panel
    line_style = [("k", "-"), ("C8", "--"), ("C9", ":")]
    fig, axes = plt.subplots(len(names), 3, figsize=(21, 6.4 * len(names)), squeeze=False, layout="constrained",
                             gridspec_kw={"width_ratios": [1.15, 0.95, 1.35]})
    for row, name in enumerate(names):
        d = df[df.case == name].copy()
        d["strategy"] = d.variant.map(strategy)
        buckets = d[d.strategy.isin(order)].copy()
        # strategies with the same number of graphs are drawn a little apart (x 1.06 per neighbour), not on top
        same = buckets.groupby("graphs")
        buckets["x"] = buckets.graphs * 1.06 ** (same.cumcount() - (same.graphs.transform("size") - 1) / 2)
        ax = axes[row][0]
        for r in buckets.itertuples():
            color, marker = style[r.strategy]
            lo, hi = getattr(r, "us_per_request_lo", float("nan")), getattr(r, "us_per_request_hi", float("nan"))
            yerr = ([[max(r.us_per_request - lo, 0)], [max(hi - r.us_per_request, 0)]] if lo == lo and hi == hi
                    else None)
            ax.errorbar([r.x], [r.us_per_request], yerr=yerr, fmt=marker, color=color, ms=7, capsize=3,
                        label=f"{r.strategy} ({r.graphs:.0f} graphs)")
        for (color, ls), r in zip(line_style, d[~d.strategy.isin(order)].itertuples()):
            ax.axhline(r.us_per_request, color=color, ls=ls, lw=1.3, label=f"{r.strategy} ({r.executed_as})")
            lo, hi = getattr(r, "us_per_request_lo", float("nan")), getattr(r, "us_per_request_hi", float("nan"))
            if lo == lo and hi == hi:
                ax.axhspan(lo, hi, color=color, alpha=0.10, lw=0)
        ax.set_xscale("log")
        ax.set(xlabel="graphs captured", ylabel="µs per request (median pass / requests)", title=f"{name}: time")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)

        ax = axes[row][1]
        for r in buckets.itertuples():
            color, marker = style[r.strategy]
            ax.plot([r.x], [100 * r.pad_fraction], marker, color=color, ms=7)
        ax.plot([], [], "o", color="0.5", label="a strategy, on the stream (markers as in the time panel)")
        ax.plot([k for k, _ in curve], [100 * p.pad_fraction for _, p in curve], "-", color="C3", lw=1,
                label="planner's least padding, on the history")
        ax.set_xscale("log")
        ax.set(xlabel="graphs captured", ylabel="padded rows, % of computed rows", title=f"{name}: padding")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)

        ax = axes[row][2]
        mem = pd.DataFrame([{"strategy": k, **v} for k, v in info[name].items()])
        bars = [(k, g, m, s_) for k, g, m, s_ in zip(mem.strategy, mem.graphs, mem.held_mib, mem.setup_s)]
        if trees_pool_mib == trees_pool_mib:   # one pool for every compiled variant of both models
            bars.append(("reduce-overhead: graph trees' pool", float("nan"), trees_pool_mib, float("nan")))
        top = max([m for _, _, m, _ in bars if m == m] or [1.0])
        for yi, (k, g, m, s_) in enumerate(bars):
            shared_trees = k.startswith("reduce-overhead: graph trees")
            color = "C3" if "one pool per graph" in k else "C8" if shared_trees else "C0"
            ax.barh(yi, m if m == m else 0, color=color, hatch="//" if shared_trees else None)
            if shared_trees:
                text = f"{m:.0f} MiB, all compiled variants of both models together"
            elif m == m:
                text = f"{m:.0f} MiB, setup {s_:.2f} s"
            elif cuda:
                text = f"not measurable here (one shared pool), setup {s_:.2f} s"
            else:
                text = f"no GPU memory (CPU run), setup {s_:.2f} s"
            ax.text((m if m == m else 0) + 0.02 * top, yi, text, va="center", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        ax.set_yticks(range(len(bars)), [k if g != g else f"{k}, {g:.0f} graphs" for k, g, _, _ in bars], fontsize=8)
        ax.set_xlim(0, 2.3 * top)
        ax.invert_yaxis()
        ax.set(xlabel="memory held, MiB (pools + static buffers)", title=f"{name}: memory and setup time")
    where = df["device"].iloc[0]
    note = "" if cuda else " (CPU, eager only: not a GPU result)"
    fig.suptitle(f"Variable batch sizes: buckets, planner, reduce-overhead. {where}, PyTorch {torch.__version__}{note}",
                 fontsize=12)  # the constrained layout keeps the legends below the axes inside the figure
    return fig


# ---- the experiment's steps, one call each (the notebook says what each does) ----

MiB = 2 ** 20
SHORT = {"MLP": "mlp", "transformer block": "block"}   # model names in claim ids


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


def make_mlp(d, h):
    """Four linear layers with GELU between them: each output row depends on its own input row alone."""
    from torch import nn

    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, h), nn.GELU(),
                         nn.Linear(h, d))


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


def fixed_ladders(max_rows, spacings):
    """``({label: spacing}, default label)``: powers of two, steps of each spacing and a single bucket (spacing
    None); the kit's default ladder, ``ladder(max_rows)``, is the one labelled "(default)" (or "default ladder")."""
    from ..bucket_graphs import ladder

    fixed = {"pow2": "pow2", **{f"steps of {s}": s for s in spacings}}
    if not any(ladder(max_rows, v) == ladder(max_rows) for v in fixed.values()):
        fixed["default ladder"] = "default"
    fixed = {(f"{k} (default)" if ladder(max_rows, v) == ladder(max_rows) and k != "default ladder" else k): v
             for k, v in fixed.items()}
    default = next(k for k in fixed if "default" in k)
    fixed["single bucket"] = None                      # every request padded to max_rows
    return fixed, default


def run_stream(fn, requests):
    """One pass over the stream: every request through ``fn``, back to back."""
    for x in requests:
        fn(x)


class Strategies:
    """Every bucketed strategy of each model (``built[model][label]``: a ``BucketedGraphs``), each in pools of its
    own, with what it holds read by a ``MemoryLedger`` (``info[model][label]``), and the planner's inputs.

    Each strategy is built between two ``torch.cuda.empty_cache()`` calls, so what the allocator merely cached is
    not counted, and one throwaway build of every size comes first: the first captures of a process load kernels
    and create workspaces once."""

    def __init__(self, models, data, max_rows, cuda):
        from ..memory import MemoryLedger

        self.models, self.data, self.max_rows, self.cuda = models, data, max_rows, cuda
        self.ledger = MemoryLedger()
        self.built = {name: {} for name in models}
        self.info = {name: {} for name in models}
        self.order = []                    # the bucketed strategies, in the tables' order
        self.cost_model, self.mem_model, self.plans = {}, {}, {}

    def clean_cache(self):
        """Return the allocator's cached, unused memory to the driver (pools that graphs still use stay)."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def build(self, name, label, sizes, pool="shared"):
        """Capture ``sizes`` of model ``name`` (eager fallback without CUDA) and record what it holds."""
        from ..bucket_graphs import capture_buckets

        model, _ = self.models[name]
        self.clean_cache()      # start from a clean cache, whatever was built or freed before
        with self.ledger.measure(f"{name}: {label}") as before_after:
            bg = capture_buckets(model, self.data[name][:self.max_rows], sizes=sizes, pool=pool, eager_fallback=True,
                                 measure_memory=True)  # each bucket's pool growth in bg.capture_log
            self.clean_cache()  # what the captures freed and the allocator merely cached is not held
        row = self.ledger.record(f"{name}: {label}", bg)
        self.info[name][label] = {"graphs": len(bg.sizes), "setup_s": bg.capture_seconds,
                                  "held_mib": row.get("held", float("nan")) / MiB,
                                  "pool_mib": row.get("pool_reserved", float("nan")) / MiB,
                                  "device_used_mib": before_after.get("device_used_delta", float("nan")) / MiB}
        return bg

    def build_ladders(self, fixed):
        """One graph per size, every fixed ladder (``fixed_ladders``), and the default ladder once more with one
        pool per graph (measured only, then freed)."""
        import time

        from ..bucket_graphs import capture_buckets, ladder

        every = range(1, self.max_rows + 1)
        for name, (model, _) in self.models.items():  # throwaway: kernels and workspaces load once
            if self.cuda:
                capture_buckets(model, self.data[name][:self.max_rows], sizes=every)  # dropped at once
        self.clean_cache()
        for name in self.models:
            t0 = time.perf_counter()
            self.built[name]["exact sizes"] = self.build(name, "exact sizes", every)
            for label, spacing in fixed.items():
                sizes = [self.max_rows] if spacing is None else ladder(self.max_rows, spacing)
                self.built[name][label] = self.build(name, label, sizes)
            self.build(name, "default ladder, one pool per graph", ladder(self.max_rows), pool="private")
            print(f"{name}: built {len(self.built[name]) + 1} strategies in {time.perf_counter() - t0:.1f} s")
        self.clean_cache()   # frees the pools of the one-pool-per-graph builds
        self.order = ["exact sizes", *fixed]

    def plan_for(self, name, max_graphs, reference, history_sizes):
        """``plan_buckets`` on ``history_sizes`` with at most ``max_graphs`` graphs, the measured cost model and,
        on a GPU, no more memory than the ladder ``reference`` needs by the same memory model."""
        from ..bucket_plan import plan_buckets

        limits = dict(max_graphs=max_graphs, cost=self.cost_model[name], max_size=self.max_rows)
        if self.mem_model[name]:
            budget = sum(self.mem_model[name].get(b, 0) for b in reference)
            limits.update(memory_budget=max(budget, 1), graph_memory=self.mem_model[name])
        return plan_buckets(history_sizes, **limits)

    def plan(self, history_sizes, default, rounds):
        """Measure each model's cost per request size on its exact-size graphs (``measure_bucket_costs``), plan
        as many buckets as the ``default`` ladder has within its memory, and build them as "planned"."""
        from ..bucket_plan import measure_bucket_costs

        for name in self.models:
            exact = self.built[name]["exact sizes"]
            self.cost_model[name] = measure_bucket_costs(exact, self.data[name][:self.max_rows], rounds=rounds)
            self.mem_model[name] = {e["size"]: e["pool_growth_bytes"] for e in exact.capture_log}  # {} on a CPU
            ref = self.built[name][default].sizes
            self.plans[name] = self.plan_for(name, len(ref), ref, history_sizes)
            self.built[name]["planned"] = self.build(name, "planned", self.plans[name].sizes)
            print(f"{name}: planned {self.plans[name].n_graphs} buckets {self.plans[name].sizes}; the default "
                  f"ladder: {list(ref)}")
        self.order = [s for s in self.order if s != "planned"] + ["planned"]

    def memory(self):
        """One row per model and strategy: graphs, setup seconds, memory held (pools + static buffers)."""
        import pandas as pd

        return pd.DataFrame([{"model": m, "strategy": k, **v} for m in self.info for k, v in self.info[m].items()])

    def sharing(self, default):
        """The sharing checks, per model (GPU only): the shared pool of exact sizes and of the default ladder
        against the largest bucket alone (target 1.2 or less), and one pool per graph against the shared pool."""
        if not self.cuda:
            return []
        rows = []
        for name, facts in self.info.items():
            held = {k: v["held_mib"] for k, v in facts.items()}
            for label in ["exact sizes", default]:
                rows.append({"model": name, "check": f"{label} (shared pool) / largest bucket alone",
                             "value": held[label] / held["single bucket"], "target": "<= 1.2"})
            rows.append({"model": name, "check": "default ladder: one pool per graph / shared pool",
                         "value": held["default ladder, one pool per graph"] / held[default],
                         "target": "(how much sharing saves)"})
        return rows

    def variants(self, name, compiled):
        """Every variant of model ``name`` as ``{label: callable(x)}``, eager first; a bucketed strategy that ran
        eagerly (no CUDA) says "(eager fallback)"."""
        out = {"eager": self.models[name][0]}
        for label in self.order:
            out[label if self.cuda else f"{label} (eager fallback)"] = self.built[name][label]
        out.update(compiled.get(name, {}))
        return out


def compile_variants(models, streams, info, enabled):
    """``torch.compile(mode="reduce-overhead")`` of each model, with ``dynamic=None`` and ``dynamic=True``, run
    twice over the stream (a new size runs once to warm up, then is recorded on its next call); the time of those
    passes is the setup. Returns ``({model: {label: fn}}, MiB reserved by the graph trees' one pool or NaN)``.
    PyTorch's warning about many recorded sizes is switched off: the notebook counts the launches itself."""
    import time

    import torch

    from .compilers import fresh

    compiled = {name: {} for name in models}
    if not enabled:
        return compiled, float("nan")
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config.triton, "cudagraph_dynamic_shape_warn_limit"):
        inductor_config.triton.cudagraph_dynamic_shape_warn_limit = None
    for name, (model, _) in models.items():
        for label, dynamic in (("reduce-overhead", None), ("reduce-overhead, dynamic=True", True)):
            def call_model(x, model=model):
                return model(x)
            fn = torch.compile(fresh(call_model), mode="reduce-overhead", dynamic=dynamic)
            t0 = time.perf_counter()
            for _ in range(2):
                run_stream(fn, streams[name])
            torch.cuda.synchronize()
            compiled[name][label] = fn
            info[name][label] = {"graphs": float("nan"), "setup_s": time.perf_counter() - t0,
                                 "held_mib": float("nan"), "pool_mib": float("nan"), "device_used_mib": float("nan"),
                                 "memory_note": "not measurable here: one graph-trees pool shared by all compiled "
                                                "variants"}
            print(f"{name}, {label}: first two passes over the stream (compile + record) "
                  f"{info[name][label]['setup_s']:.1f} s")
    trees_pool = graph_trees_pool_bytes()
    return compiled, trees_pool / MiB if trees_pool is not None else float("nan")


def latency_pass(variants, streams, sync):
    """One pass over the stream, each request alone through every variant (who goes first rotates), timed from
    the call to a ``sync()`` after it. The bucket counters are reset before it and copied after it, so padding and
    overflows are for exactly this pass. Returns ``({model: {label: [µs]}}, {model: {label: BucketStats}})``."""
    import copy
    import time

    latency, stats = {}, {}
    for name, fns in variants.items():
        for fn in fns.values():
            if hasattr(fn, "reset_stats"):
                fn.reset_stats()
        lat, labels = {label: [] for label in fns}, list(fns)
        for i, x in enumerate(streams[name]):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                sync()
                t0 = time.perf_counter()
                fns[label](x)
                sync()
                lat[label].append((time.perf_counter() - t0) * 1e6)
        latency[name] = lat
        stats[name] = {label: copy.deepcopy(fn.stats) for label, fn in fns.items() if hasattr(fn, "stats")}
    return latency, stats


_STREAM_CLAIMS = (r"^(mlp|block)_(default_ladder_beats_(eager|single_bucket|reduce_overhead|reduce_overhead_dynamic)|"
                  r"single_bucket_beats_eager|planned_beats_default_ladder|reduce_overhead(_dynamic)?_beats_eager)$")


@covers(r"^(MLP|transformer block)$", _STREAM_CLAIMS)
def stream_verdicts(m) -> list:
    """The stream comparison's claims, per model: the default ladder and a single bucket against eager and against
    each other, the planned buckets against the default ladder, and (where they ran) both reduce-overhead variants
    against eager and against the default ladder. Against eager: the speedup's interval; two variants: the ratio
    of their median passes, window by window."""
    from .claims import speedup, versus

    out = []
    for name, short in SHORT.items():
        labels = [strategy(v) for v in m.table[m.table.case == name].variant]
        if not labels:
            continue
        default = next(v for v in labels if v.endswith("(default)") or v == "default ladder")
        vs_eager = [("default_ladder_beats_eager", default), ("single_bucket_beats_eager", "single bucket")]
        pairs = [("default_ladder_beats_single_bucket", default, "single bucket"),
                 ("planned_beats_default_ladder", "planned", default)]
        if "reduce-overhead" in labels:
            vs_eager += [("reduce_overhead_beats_eager", "reduce-overhead"),
                         ("reduce_overhead_dynamic_beats_eager", "reduce-overhead, dynamic=True")]
            pairs += [("default_ladder_beats_reduce_overhead", default, "reduce-overhead"),
                      ("default_ladder_beats_reduce_overhead_dynamic", default, "reduce-overhead, dynamic=True")]
        out += [speedup(m, f"{short}_{cid}", name, v, subject=f"{name}: {phrase(v)}") for cid, v in vs_eager]
        out += [versus(m, f"{short}_{cid}", (name, fast), (name, slow), subject=f"{name}: {phrase(fast)}",
                       than=phrase(slow)) for cid, fast, slow in pairs]
    return out


def results_table(m, latency, pad_stats, strategies, errors, requests, device):
    """One row per model and variant: the timing row of ``m`` with its window medians, time per request (median
    pass / requests, with the pass's prediction interval), requests per second, p50 and p99 of the latency pass,
    what the strategy built and holds, its padding and overflows on the latency pass, and its largest error.
    ``graph_launches_per_request`` stays NaN until it is counted ("Going further")."""
    import numpy as np
    import pandas as pd

    rows = []
    for name, lats in latency.items():
        for label, lat in lats.items():
            r, lat = m.row(name, label).to_dict(), np.array(lat)
            st, facts = pad_stats[name].get(label), strategies.info[name].get(strategy(label), {})
            built = strategies.built[name].get(strategy(label))
            rows.append({**r, "window_medians_us": window_medians(m.windows, name, r["variant"]),
                         "requests": requests, "us_per_request": r["median_us"] / requests,
                         "us_per_request_lo": r["median_pi_lo"] / requests,
                         "us_per_request_hi": r["median_pi_hi"] / requests,
                         "requests_per_s": requests / (r["median_us"] * 1e-6),
                         "p50_us": np.percentile(lat, 50), "p99_us": np.percentile(lat, 99),
                         "graphs": facts.get("graphs", 0), "setup_s": facts.get("setup_s", 0.0),
                         "held_mib": facts.get("held_mib", float("nan")),
                         "pool_mib": facts.get("pool_mib", float("nan")),
                         "device_used_mib": facts.get("device_used_mib", float("nan")),
                         "memory_note": facts.get("memory_note", ""),
                         "pad_fraction": st.pad_fraction if st else 0.0, "padded_rows": st.padded_rows if st else 0,
                         "eager_overflows": st.eager_overflows if st else 0,
                         "bucket_sizes": " ".join(map(str, built.sizes)) if built is not None else "",
                         "graph_launches_per_request": float("nan"), "max_rel_err": errors[name][label]})
    df = pd.DataFrame(rows)
    df["device"] = device
    return df


RESULT_COLUMNS = ["case", "variant", "us_per_request", "p50_us", "p99_us", "graphs", "setup_s", "held_mib",
                  "pad_fraction", "eager_overflows"]


def show_results(df, stem, cuda):
    """The results table a reader needs (``RESULT_COLUMNS``, rounded): this run's on a GPU; without one, the
    recorded GPU run's rows of the same cases, under a caption naming that run (CPU times say nothing about
    graphs)."""
    from . import results

    if cuda:
        results._display(df[RESULT_COLUMNS].round(3), [])
        return
    rec = results.load(stem)
    if rec is None:
        print("No GPU here and no recorded GPU run found: no results table.")
        return
    recorded = rec.df[rec.df.case.isin(set(df.case))]
    results._display(recorded[[c for c in RESULT_COLUMNS if c in recorded]].round(3), [],
                     f"No GPU here: the recorded GPU run's results table. {rec.caption}.")


def launches_per_request(variants, streams, requests, cuda):
    """``cudaGraphLaunch`` calls per request of one pass over the stream, read with the profiler (``gpu_time``), per
    ``(model, label)``; NaN without CUDA."""
    from ..timing import gpu_time

    out = {}
    for name, fns in variants.items():
        for label, fn in fns.items():
            g = gpu_time(lambda fn=fn, reqs=streams[name]: run_stream(fn, reqs), calls=1, warmup=1) if cuda else None
            out[(name, label)] = g.graph_launches / requests if g is not None else float("nan")
    return out
