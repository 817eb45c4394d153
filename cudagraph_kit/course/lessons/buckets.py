"""Notebook 06's bucket strategies, built, measured and timed on one stream of requests.

Every fixed ladder, one graph per size and the planned bucket set, each in pools of its own with what it holds
(``Strategies``), the reduce-overhead variants compiled over the stream, the latency pass, the graph launches per
request and the results table. The notebook makes one call per step and says what it does; the stream itself is in
``workloads.py``, the strategies' verdicts in ``measuring/verdicts.py``, the trade-off figure in
``measuring/figures.py``.

Example::

    from cudagraph_kit.course.lessons.buckets import Strategies, fixed_ladders
    fixed, default = fixed_ladders(64, [8, 16])   # {"pow2": "pow2", "steps of 8 (default)": 8, ...}, its default
    lab = Strategies(models, data, 64, cuda=True)
    lab.build_ladders(fixed)                        # exact sizes, every ladder, the default one with a pool per graph
"""
from __future__ import annotations

from ..measuring.measure import window_medians
from ..measuring.claims import Claim
from ..measuring.verdicts import SHORT, strategy
from .compilers import fresh, graph_trees_pool_bytes
from .workloads import run_stream

__all__ = ["MiB", "fixed_ladders", "Strategies", "sharing_claims", "compile_variants", "latency_pass", "results_table", "show_results",
           "show_memory", "launches_per_request", "RESULT_COLUMNS"]

MiB = 2 ** 20


def fixed_ladders(max_rows, spacings):
    """``({label: spacing}, default label)``: powers of two, steps of each spacing and a single bucket (spacing
    None); the kit's default ladder, ``ladder(max_rows)``, is the one labelled "(default)" (or "default ladder")."""
    from ...bucket_graphs import ladder

    fixed = {"pow2": "pow2", **{f"steps of {s}": s for s in spacings}}
    if not any(ladder(max_rows, v) == ladder(max_rows) for v in fixed.values()):
        fixed["default ladder"] = "default"
    fixed = {(f"{k} (default)" if ladder(max_rows, v) == ladder(max_rows) and k != "default ladder" else k): v
             for k, v in fixed.items()}
    default = next(k for k in fixed if "default" in k)
    fixed["single bucket"] = None                      # every request padded to max_rows
    return fixed, default


class Strategies:
    """Every bucketed strategy of each model (``built[model][label]``: a ``BucketedGraphs``), each in pools of its
    own, with what it holds read by a ``MemoryLedger`` (``info[model][label]``), and the planner's inputs.

    Each strategy is built between two ``torch.cuda.empty_cache()`` calls, so what the allocator merely cached is
    not counted, and one throwaway build of every size comes first: the first captures of a process load kernels
    and create workspaces once."""

    def __init__(self, models, data, max_rows, cuda):
        from ...memory import MemoryLedger

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
        from ...bucket_graphs import capture_buckets

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

        from ...bucket_graphs import capture_buckets, ladder

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
        from ...bucket_plan import plan_buckets

        limits = dict(max_graphs=max_graphs, cost=self.cost_model[name], max_size=self.max_rows)
        if self.mem_model[name]:
            budget = sum(self.mem_model[name].get(b, 0) for b in reference)
            limits.update(memory_budget=max(budget, 1), graph_memory=self.mem_model[name])
        return plan_buckets(history_sizes, **limits)

    def plan(self, history_sizes, default, rounds):
        """Measure each model's cost per request size on its exact-size graphs (``measure_bucket_costs``), plan
        as many buckets as the ``default`` ladder has within its memory, and build them as "planned"."""
        from ...bucket_plan import measure_bucket_costs

        for name in self.models:
            exact = self.built[name]["exact sizes"]
            self.cost_model[name] = measure_bucket_costs(exact, self.data[name][:self.max_rows], rounds=rounds)
            self.mem_model[name] = {e["size"]: e["pool_growth_bytes"] for e in exact.capture_log}  # {} on a CPU
            ref = self.built[name][default].sizes
            self.plans[name] = self.plan_for(name, len(ref), ref, history_sizes)
            self.built[name]["planned"] = self.build(name, "planned", self.plans[name].sizes)
            print(f"{name}: planned {self.plans[name].n_graphs} buckets {self.plans[name].sizes}")
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
                rows.append({"model": name, "check": _shared_pool_check(label),
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


def _shared_pool_check(label: str) -> str:
    """The name of the sharing check of strategy ``label``'s shared pool (a row of ``Strategies.sharing``)."""
    return f"{label} (shared pool) / largest bucket alone"


def sharing_claims(evidence, default):
    """Section 5's verdict per model: the default ladder's shared pool holds at most 1.2x the memory of its largest
    bucket alone. Allocator bytes, one reading: the interval is the reading itself. ``evidence``: the rows of
    ``Strategies.sharing`` ([] without a GPU, so no claim)."""
    out = []
    for e in evidence:
        if e["check"] != _shared_pool_check(default):
            continue
        said = f"{e['model']}: the shared pool held {{hi:.2f}}x the memory of the largest bucket alone"
        out.append(Claim(f"{SHORT[e['model']]}_shared_pool_within_target", lo=e["value"], hi=e["value"], above=1.2,
                         below=True, holds=said + " (target: 1.2x or less)",
                         fails=said + ", over the 1.2x target (fragmentation: Appendix A)",
                         unclear=said + ", at the 1.2x target"))
    return out


def compile_variants(models, streams, info, enabled):
    """``torch.compile(mode="reduce-overhead")`` of each model, with ``dynamic=None`` and ``dynamic=True``, run
    twice over the stream (a new size runs once to warm up, then is recorded on its next call); the time of those
    passes is the setup. Returns ``({model: {label: fn}}, MiB reserved by the graph trees' one pool or NaN)``.
    PyTorch's warning about many recorded sizes is switched off: the notebook counts the launches itself. So is
    Inductor's warning that TensorFloat32 tensor cores are available but not enabled: the course keeps PyTorch's
    default, full float32 matrix multiplies, so that every variant compares with eager at float32 rounding."""
    import time
    import warnings

    import torch

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
            with warnings.catch_warnings():   # the compile runs here, in the first pass
                warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
                for _ in range(2):
                    run_stream(fn, streams[name])
            torch.cuda.synchronize()
            compiled[name][label] = fn
            info[name][label] = {"graphs": float("nan"), "setup_s": time.perf_counter() - t0,
                                 "held_mib": float("nan"), "pool_mib": float("nan"), "device_used_mib": float("nan"),
                                 "memory_note": "not measurable here: one graph-trees pool shared by all compiled "
                                                "variants"}
        print(f"{name}: first two passes over the stream (compile + record): "
              + "; ".join(f"{label} {info[name][label]['setup_s']:.1f} s" for label in compiled[name]))
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
    from ..measuring import results

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


def show_memory(memory, evidence, stem, cuda):
    """Section 5's two tables: the memory each strategy holds per model (with its number of graphs), and the
    sharing checks (``Strategies.sharing``). This run's on a GPU; without one nothing was captured, so the recorded
    GPU run's (its ``<model>: memory`` rows of the section's strategies and the sharing checks saved in
    ``env.json``), under a caption naming that run."""
    import pandas as pd

    from ..measuring import results

    if not cuda:
        rec = results.load(stem)
        if rec is None:
            print("No NVIDIA GPU here: nothing was captured, so no memory is held, and no recorded GPU run was found.")
            return
        df = rec.df
        rows = df[df.case.str.endswith(": memory") & df.held_mib.notna() & df.graphs.notna()  # bucketed strategies
                  & ~df.variant.str.startswith("planned at")]                   # Appendix C's plan is not built here
        memory = pd.DataFrame({"model": rows.case.str.removesuffix(": memory"), "strategy": rows.variant,
                               "graphs": rows.graphs, "held_mib": rows.held_mib})
        evidence = [e for e in rec.env.get("evidence") or [] if "expandable" not in e["check"]]  # Appendix A's
        print(f"No NVIDIA GPU here: nothing was captured, so no memory is held. Below: the recorded GPU run's "
              f"memory. {rec.caption}.")
    held = memory.pivot_table(index="strategy", columns="model", values="held_mib", sort=False).rename(
        columns=lambda name: f"{name}: held (MiB)").rename_axis(columns=None)
    held["graphs"] = memory.groupby("strategy", sort=False).graphs.first().astype(int)
    print(held.to_string(float_format=lambda v: f"{v:.2f}"))
    if evidence:
        print(pd.DataFrame(evidence).to_string(index=False, float_format=lambda v: f"{v:.2f}"))


def launches_per_request(variants, streams, requests, cuda):
    """``cudaGraphLaunch`` calls per request of one pass over the stream, read with the profiler (``gpu_time``), per
    ``(model, label)``; NaN without CUDA."""
    from ...timing import gpu_time

    out = {}
    for name, fns in variants.items():
        for label, fn in fns.items():
            g = gpu_time(lambda fn=fn, reqs=streams[name]: run_stream(fn, reqs), calls=1, warmup=1) if cuda else None
            out[(name, label)] = g.graph_launches / requests if g is not None else float("nan")
    return out
