"""Benchmark: what a kit call costs on the host, per call, beside a hand-written replay and ``reduce-overhead``.

Host time per call, without synchronization: each sample is a burst of calls timed on the host with a synchronize
before and after the burst, never inside it (what a training or decode loop pays to issue a call). The variants of a
case are timed round-robin, the order rotated each round, so drift hits them alike; reported per variant: the median
per-call time over the rounds, its quartiles, and the median and the mean of the per-round differences to the
hand-written ``static.copy_(x); graph.replay()`` (the kit's cost over the raw graph; the mean carries the guard's
scheduled full checks, which fall in some bursts only). Each kit variant has its own guard (its own schedule).

Cases (every graphed or compiled result is compared with eager first):
  mlp48   48 ``Linear(64, 64)`` layers (96 tensors), batch 8: on one graph, hand-written, the kit with its guard
          (default), the kit inside ``weights_fixed`` (one block per burst of calls; a guard of its own over the same
          reads) and the kit without a guard;
          then the kit before this change (``--baseline``) and ``torch.compile(mode="reduce-overhead")``.
  llama   a transformers ``LlamaForCausalLM`` decode step with a ``StaticCache`` (12 layers, hidden 768, random
          weights, bf16, batch 1): the same variants, ``reduce-overhead`` compiling the same step function with the
          same cache. The cache advances its own write position on every call: it is rewound before every burst
          (and every single call below), for every variant alike.
  after_module_mlp48, after_module_llama
          the first call after an unrelated module is built: per round, for each variant, a ``torch.nn.Linear(2, 2)``
          is built (on the CPU; it fires PyTorch's global module registration hooks) and then ONE call is made; the
          build and the call are timed together (a synchronize before, none inside). Reported: the median over the
          rounds of (build + call); ``minus_hand_written_median_us`` is that median minus the hand-written variant's
          (the kit's extra cost on that first call; a difference of medians, not paired per round);
          ``kit_weights_fixed`` is a block around that one call. The modules built are kept alive until the case ends,
          so no release happens inside a timed call.
  train   a whole Adam(capturable) training step of 56 ``Linear(64, 64)`` layers (111 parameters): the host time of
          the step's checks before each replay (nothing launched), now and before this change.
Also: the guard's check alone per call (nothing launched) and per tensor, taken apart: the part every call runs and
the full check the schedule runs every ``full_check_every`` calls.
A variant that fails (capture, compile, the comparison with eager, a call, a sample over 5 s) gets a row with
``status`` "failed: <why>" and no numbers; the rest of the run goes on (``ok; ...`` notes graph breaks or CUDA graphs
skipped by Inductor). The files are rewritten after each section, so a run cut short keeps what it measured.

Run on a GPU (without one it exits 2):  python scripts/bench_overhead.py [--out DIR] [--baseline DIR] [--quick]
(``reproduce`` runs it after the notebooks and publishes figures/00_overhead; ``--quick``: a smoke run)
``--baseline DIR``: a folder holding the kit before the change as the package ``cudagraph_kit_old``
(``git archive <commit> cudagraph_kit | tar -x -C DIR && mv DIR/cudagraph_kit DIR/cudagraph_kit_old``); its
``capture`` is taken from ``cudagraph_kit_old.capture`` (the module's name before the rename to ``graphed``).
Writes rounds.csv, results.csv (the summary, one row per case and variant), checks.csv, env.json; the README's
"what the kit costs" is rendered from results.csv and checks.csv (scripts/update_readme.py).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

DEVICE = "cuda"
VARIANT_ORDER = ["hand_written", "kit", "kit_weights_fixed", "kit_check_off", "kit_before_change", "reduce_overhead"]
FULL = {"rounds": 31, "calls": 50, "after_rounds": 200, "check_calls": 20_000}
QUICK = {"rounds": 5, "calls": 10, "after_rounds": 15, "check_calls": 2_000}
T0 = time.perf_counter()
SLOW_S = 5.0   # a sample (a burst, or one call after a build) longer than this drops its variant as failed
NOTES: dict = {}   # (case, variant) -> a remark for results.csv's status ("ok; ...")


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


# -- timing -----------------------------------------------------------------------------------------------------------
# A variant is (call, block): ``call()`` makes one call; ``block`` is None or a function returning the context
# manager the calls run in (``weights_fixed``: its entry and exit checks are part of the time).
def burst_us(call, block, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if block is None:
        for _ in range(calls):
            call()
    else:
        with block():
            for _ in range(calls):
                call()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def first_call_us(call, block, keep: list) -> float:
    """Build an unrelated ``Linear(2, 2)``, then make one call: both timed (the build is subtracted through the
    hand-written variant's median). The module goes into ``keep``, released after the case."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    module = torch.nn.Linear(2, 2)
    if block is None:
        call()
    else:
        with block():
            call()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    keep.append(module)
    return t * 1e6


def reason(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def fail(failures: dict, case: str, variant: str, why: str) -> None:
    failures[(case, variant)] = why
    log(f"FAILED {case} / {variant}: {why}")


def run_case(case: str, variants: dict, rounds: int, measure, rows: list, failures: dict, before=None) -> None:
    """Round-robin: each round times every live variant once (``measure(call, block)``), the order rotated. A variant
    that raises, or whose sample takes over ``SLOW_S``, is dropped (its rows too) and recorded as failed; the others
    go on."""
    live = dict(variants)
    log(f"{case}: {rounds} rounds of {', '.join(live) or 'nothing'}")
    for r in range(rounds):
        names = list(live)
        if not names:
            break
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if before is not None:
                before()
            t0 = time.perf_counter()
            try:
                us = measure(*live[name])
                took = time.perf_counter() - t0
                if took > SLOW_S:   # a recompile or a re-capture per call would eat the run's time: stop it here
                    raise RuntimeError(f"one sample took {took:.1f} s (limit {SLOW_S:.0f} s)")
            except Exception as exc:  # noqa: BLE001 - one variant never ends the run
                fail(failures, case, name, f"round {r}: {reason(exc)}")
                del live[name]
                rows[:] = [x for x in rows if not (x["case"] == case and x["variant"] == name)]
                continue
            rows.append({"case": case, "variant": name, "round": r, "us_per_call": us})


def summarize(rows: list, failures: dict, cases: list) -> list:
    """One row per case and variant: medians, quartiles, the difference to hand-written; failed ones with status."""
    nan = float("nan")
    out = []
    for case in cases:
        by = {}
        for r in rows:
            if r["case"] == case:
                by.setdefault(r["variant"], {})[r["round"]] = r["us_per_call"]
        base = case[len("after_module_"):] if case.startswith("after_module_") else case
        why = {v: w for (c, v), w in failures.items() if c == base}   # failed while being built: both cases
        why.update({v: w for (c, v), w in failures.items() if c == case})
        names = [v for v in VARIANT_ORDER if v in by or v in why]
        names += [v for v in list(by) + list(why) if v not in names]
        hand = by.get("hand_written")
        for variant in names:
            if variant not in by:
                out.append({"case": case, "variant": variant, "median_us": nan, "q1_us": nan, "q3_us": nan,
                            "minus_hand_written_median_us": nan, "minus_hand_written_mean_us": nan, "rounds": 0,
                            "status": "failed: " + why.get(variant, "no samples")})
                continue
            samples = by[variant]
            xs = list(samples.values())
            med = statistics.median(xs)
            q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [med, med, med]
            if hand is None:
                diff = nan
            elif case.startswith("after_module"):  # single calls: the difference of the medians
                diff = med - statistics.median(hand.values())
            else:  # bursts: the median of the per-round differences
                diffs = [samples[k] - hand[k] for k in samples if k in hand]
                diff = statistics.median(diffs) if diffs else nan
            # the mean carries what a schedule spreads over calls (a full check every full_check_every calls lands
            # in some bursts only, which a median over bursts leaves out)
            mean = (statistics.fmean([samples[k] - hand[k] for k in samples if k in hand])
                    if hand is not None and not case.startswith("after_module") and any(k in hand for k in samples)
                    else nan)
            out.append({"case": case, "variant": variant, "median_us": med, "q1_us": q[0], "q3_us": q[2],
                        "minus_hand_written_median_us": diff, "minus_hand_written_mean_us": mean, "rounds": len(xs),
                        "status": "; ".join(["ok"] + ([NOTES[(case, variant)]] if (case, variant) in NOTES else []))})
    return out


def check_alone_us(check, n: int = 20_000) -> float:
    for _ in range(100):
        check()
    t0 = time.perf_counter()
    for _ in range(n):
        check()
    return (time.perf_counter() - t0) / n * 1e6


# -- models -----------------------------------------------------------------------------------------------------------
def mlp48():
    torch.manual_seed(0)
    layers = []
    for _ in range(48):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(DEVICE).eval()


def build_llama(layers=12, hidden=768, heads=12, max_len=512, dtype=torch.bfloat16):
    import inspect

    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(device=DEVICE, dtype=dtype).eval()
    try:
        cache = StaticCache(config=cfg, max_cache_len=max_len)                        # transformers 5
    except TypeError:
        cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device=DEVICE, dtype=dtype)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode_step(ids, pos):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_kw: cache}).logits
    return model, decode_step, cache


# -- variants ---------------------------------------------------------------------------------------------------------
def attempt(failures: dict, case: str, variant: str, make):
    """``make()``, or None with the failure recorded."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001
        fail(failures, case, variant, reason(exc))
        return None


def kit_variants(kit, case: str, make_graph, old_capture, args_now: tuple, check, failures: dict):
    """hand_written, kit, kit_weights_fixed, kit_check_off (the default capture's graph, replayed by hand, by the kit,
    inside ``weights_fixed`` and by a ``GraphedCallable`` without a guard) and kit_before_change (its own graph), each
    graph's output compared with eager first (``check(call)`` raises if it differs). Returns (variants, the default
    graph)."""
    capture, weights_fixed = kit["capture"], kit["weights_fixed"]

    def made(variant, cap):
        def make():
            g = make_graph(cap)
            check(lambda: g(*args_now))
            return g
        return attempt(failures, case, variant, make)

    # every variant of the kit replays one graph, the default capture's: they differ by their host work alone (two
    # graphs captured apart can differ in what the GPU runs, and a burst that fills the launch queue shows that)
    from cudagraph_kit.graphed import GraphedCallable
    variants = {}
    g_on = made("kit", capture)
    if g_on is not None:
        graph, statics = g_on.graph, g_on.static_inputs

        def hand():
            for s, a in zip(statics, args_now):
                s.copy_(a)
            graph.replay()
        g_off = GraphedCallable(g_on.fn, statics, g_on.static_outputs, graph, "graph", g_on.calls_per_graph,
                                g_on.clone_outputs, g_on.pool, no_grad=g_on.no_grad, guard=None)
        # weights_fixed gets a guard of its own over the same reads: two variants sharing one guard would share its
        # schedule, and its full checks would fall in whichever variant's burst crossed the count
        from cudagraph_kit.guard import Guard
        own = Guard(g_on.guard.roots, [t for t in g_on.guard.tensors if t is not None]) if g_on.guard else None
        g_wf = GraphedCallable(g_on.fn, statics, g_on.static_outputs, graph, "graph", g_on.calls_per_graph,
                               g_on.clone_outputs, g_on.pool, no_grad=g_on.no_grad, guard=own)
        variants["hand_written"] = (hand, None)
        variants["kit"] = (lambda: g_on(*args_now), None)
        variants["kit_weights_fixed"] = (lambda: g_wf(*args_now), lambda: weights_fixed(g_wf))
        variants["kit_check_off"] = (lambda: g_off(*args_now), None)
    else:
        for v in ("hand_written", "kit_weights_fixed", "kit_check_off"):
            fail(failures, case, v, "its graph (the default capture) failed")
    if old_capture is not None:
        g_old = old_capture if isinstance(old_capture, str) else made("kit_before_change", old_capture)
        if isinstance(g_old, str):
            fail(failures, case, "kit_before_change", g_old)
        elif g_old is not None:
            variants["kit_before_change"] = (lambda: g_old(*args_now), None)
    return variants, g_on


def compiled_variant(case: str, fn, args_now: tuple, check, failures: dict):
    """``torch.compile(fn, mode="reduce-overhead")`` warmed up (CUDA graph trees record on a later call) and compared
    with eager; None (recorded as failed) if any of it raises. Graph breaks or CUDA graphs skipped by Inductor go into
    the status column."""
    from torch._dynamo.utils import counters
    graphs0, skips0 = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]

    def make():
        compiled = torch.compile(fn, mode="reduce-overhead")
        for _ in range(3):
            compiled(*args_now)
        torch.cuda.synchronize()
        check(lambda: compiled(*args_now))
        return (lambda: compiled(*args_now), None)
    t0 = time.perf_counter()
    variant = attempt(failures, case, "reduce_overhead", make)
    graphs, skips = counters["stats"]["unique_graphs"] - graphs0, counters["inductor"]["cudagraph_skips"] - skips0
    remarks = ([f"{graphs} compiled graphs (graph breaks or recompiles)"] if graphs > 1 else []) + \
        ([f"Inductor skipped CUDA graphs {skips} time(s), see the log"] if skips else [])
    if remarks and variant is not None:
        NOTES[(case, "reduce_overhead")] = NOTES[("after_module_" + case, "reduce_overhead")] = "; ".join(remarks)
    log(f"{case}: reduce-overhead compiled and checked in {time.perf_counter() - t0:.0f} s"
        + ("" if variant is not None else " (failed)") + "".join(f"; {r}" for r in remarks))
    return variant


def load_old(baseline: Path):
    """(capture, capture_train_step) of the kit before the change, or a string saying why not."""
    sys.path.insert(0, str(baseline))
    try:
        try:
            mod = importlib.import_module("cudagraph_kit_old.capture")        # before the rename
        except ModuleNotFoundError as exc:
            if exc.name != "cudagraph_kit_old.capture":
                raise
            mod = importlib.import_module("cudagraph_kit_old.graphed")        # a baseline after the rename
        cap = mod.capture
        if not callable(cap) or isinstance(cap, type(sys)):
            raise TypeError(f"{mod.__name__}.capture is not a function")
        train = importlib.import_module("cudagraph_kit_old.train_step").capture_train_step
        return cap, train
    except Exception as exc:  # noqa: BLE001
        why = f"cannot import the kit before the change from {baseline}: {reason(exc)}"
        log(why)
        return why, why


def dynamo_counters() -> dict:
    """What torch.compile reported (graph breaks, cudagraph skips, graphs), for env.json."""
    try:
        from torch._dynamo.utils import counters
        return {k: {str(kk): vv for kk, vv in v.items()} for k, v in counters.items()
                if k in ("stats", "graph_break", "inductor") and v}
    except Exception as exc:  # noqa: BLE001
        return {"error": reason(exc)}


# -- cases ------------------------------------------------------------------------------------------------------------
def bench_mlp48(kit, old_capture, cfg, rows, checks, failures):
    model = mlp48()
    x = torch.randn(8, 64, device=DEVICE)
    with torch.no_grad():
        expected = model(x).clone()

        def check(call, tol=None):
            torch.testing.assert_close(call(), expected, **(tol or {}))
        # every graph captured through fresh_cublas_workspace: reduce-overhead, compiled next, frees the cuBLAS
        # workspaces of its stream, and a graph that baked one in would write into freed memory (08, section 4)
        from cudagraph_kit.graphed import fresh_cublas_workspace
        wrapped = fresh_cublas_workspace(model)
        variants, g = kit_variants(kit, "mlp48", lambda cap: cap(wrapped, x), old_capture, (x,), check, failures)
        ro = compiled_variant("mlp48", model, (x,),
                              lambda call: check(call, {"rtol": 1e-3, "atol": 1e-3}), failures)
        if ro is not None:
            variants["reduce_overhead"] = ro
        run_case("mlp48", variants, cfg["rounds"], lambda c, b: burst_us(c, b, cfg["calls"]), rows, failures)
        keep = []
        run_case("after_module_mlp48", variants, cfg["after_rounds"], lambda c, b: first_call_us(c, b, keep), rows,
                 failures)
        keep.clear()
    add_check(checks, failures, "mlp48", g, cfg["check_calls"])


def bench_llama(kit, old_capture, cfg, rows, checks, failures):
    t0 = time.perf_counter()
    lm, decode_step, cache = build_llama()
    log(f"llama built in {time.perf_counter() - t0:.0f} s")
    ids = torch.ones(1, 1, dtype=torch.long, device=DEVICE)
    pos = torch.zeros(1, dtype=torch.long, device=DEVICE)

    def rewind():  # transformers 5's StaticLayer advances its own write position on every call: start over
        torch.cuda.synchronize()
        cache.reset()   # in place: every tensor keeps its address (graphs and reduce-overhead read them there)

    with torch.no_grad():
        decode_step(ids, pos)   # the cache's lazy initialisation (and its mark_static_address), outside any capture
        rewind()
        expected = decode_step(ids, pos).float().clone()

        def check(call, rtol=2e-2, atol=2e-2):
            rewind()
            out = call().float()
            torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
        from cudagraph_kit.graphed import fresh_cublas_workspace
        wrapped = fresh_cublas_workspace(decode_step)   # see bench_mlp48: reduce-overhead frees cuBLAS workspaces
        variants, g = kit_variants(kit, "llama", lambda cap: cap(wrapped, ids, pos), old_capture, (ids, pos),
                                   check, failures)
        rewind()
        # Inductor keeps fused bf16 intermediates in fp32: these logits (std 0.56) differ from bf16 eager by up to
        # about 0.03, as fp32 eager does; a wrong result differs by the logits' own size
        ro = compiled_variant("llama", decode_step, (ids, pos), lambda call: check(call, 5e-2, 1e-1), failures)
        if ro is not None:
            variants["reduce_overhead"] = ro
        run_case("llama", variants, cfg["rounds"], lambda c, b: burst_us(c, b, cfg["calls"]), rows, failures,
                 before=rewind)
        keep = []
        run_case("after_module_llama", variants, cfg["after_rounds"], lambda c, b: first_call_us(c, b, keep), rows,
                 failures, before=rewind)
        keep.clear()
        rewind()
    add_check(checks, failures, "llama", g, cfg["check_calls"])


def add_check(checks: list, failures: dict, case: str, g, n: int) -> None:
    """The default graph's guard check alone (nothing launched), into checks.csv."""
    if g is None or g.guard is None:
        return
    def parts():
        guard = g.guard
        every = guard.full_check_every
        row = {"case": case, "tensors": len(guard), "check_us": check_alone_us(guard.check, n),
               "full_check_every": every}
        guard.full_check_every = guard._countdown = 10 ** 9   # the per-call part alone, no scheduled full check
        row["per_call_part_us"] = check_alone_us(guard.check, n)
        row["full_check_us"] = check_alone_us(lambda: guard.check(full=True), max(n // 50, 100))
        guard.full_check_every = guard._countdown = every
        return row
    row = attempt(failures, f"check_{case}", "guard.check", parts)
    if row is not None:
        checks.append(row)


def bench_train(kit, old_train, cfg, checks, failures):
    """The checks a whole Adam step runs before each replay (111 parameters), now and before the change."""
    torch.manual_seed(0)
    xt, yt = torch.randn(32, 64, device=DEVICE), torch.randn(32, 64, device=DEVICE)
    for label, maker in (("now", kit["capture_train_step"]), ("before_change", old_train)):
        case = f"train_step_checks_{label}"
        if maker is None:
            continue
        if isinstance(maker, str):
            fail(failures, case, "checks", maker)
            continue

        def measure(maker=maker, label=label):
            torch.manual_seed(0)
            net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(55)],
                                      torch.nn.Linear(64, 64, bias=False)).to(DEVICE)
            opt = torch.optim.Adam(net.parameters(), lr=1e-4, capturable=True)
            step = maker(net, opt, torch.nn.functional.mse_loss, (xt, yt), warmup=2)
            for _ in range(4):
                step(xt, yt)
            torch.cuda.synchronize()
            extra = getattr(step, "_check_grads_still_static", None) if label != "now" else None
            if extra is None:
                checks_fn = step._check_still_captured
            else:  # the checks a step from before the guard ran before each replay
                def checks_fn(s=step, extra=extra):
                    s._check_still_captured()
                    extra()
            return {"case": case, "tensors": sum(1 for _ in net.parameters()),
                    "check_us": check_alone_us(checks_fn, max(cfg["check_calls"] // 4, 100))}
        row = attempt(failures, case, "checks", measure)
        if row is not None:
            checks.append(row)


def print_summary(summary: list) -> None:
    print("\nhost µs per call (after_module: build + first call); difference to hand-written in the same case")
    print(f"{'case':<20} {'variant':<19} {'µs/call':>10} {'vs hand':>10}  status")
    for r in summary:
        ok = r["status"].startswith("ok")
        med = f"{r['median_us']:.2f}" if ok else "-"
        diff = r["minus_hand_written_median_us"]
        vs = "" if not ok or r["variant"] == "hand_written" or diff != diff else f"{diff:+.2f}"
        print(f"{r['case']:<20} {r['variant']:<19} {med:>10} {vs:>10}  {r['status']}")


def save(out: Path, args, cfg: dict, rows: list, checks: list, failures: dict, cases: list, done: list):
    """Write rounds.csv, results.csv, checks.csv and env.json (after every section, so a run cut short keeps what it
    measured; env.json's ``sections_done`` says how far it got). Returns (summary, checks, env)."""
    import pandas as pd
    summary = summarize(rows, failures, cases)
    pd.DataFrame(rows, columns=["case", "variant", "round", "us_per_call"]).to_csv(out / "rounds.csv", index=False)
    pd.DataFrame(summary).to_csv(out / "results.csv", index=False)   # what the README renders
    checks = [dict(c, per_tensor_us=c["check_us"] / c["tensors"] if c["tensors"] else None) for c in checks]
    pd.DataFrame(checks, columns=["case", "tensors", "check_us", "per_tensor_us", "per_call_part_us", "full_check_us",
                                  "full_check_every"]).to_csv(out / "checks.csv", index=False)
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    env = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": tf_version,
           "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "rounds": cfg["rounds"], "calls_per_burst": cfg["calls"], "after_module_rounds": cfg["after_rounds"],
           "kit_variants_share_one_graph": True,
           "quick": bool(args.quick), "baseline": str(args.baseline or ""), "sections_done": list(done),
           "failures": {f"{c}/{v}": why for (c, v), why in failures.items()},
           "torch_compile": dynamo_counters(), "seconds": round(time.perf_counter() - T0, 1)}
    if os.environ.get("CGK_RUN"):  # under reproduce: the run this benchmark belongs to (check-figures reads it)
        env["run"] = json.loads(os.environ["CGK_RUN"])
    (out / "env.json").write_text(json.dumps(env, indent=2, default=str))
    return summary, checks, env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Needs a CUDA GPU (exits 2 without one). A full run takes about 3 minutes "
                                        "on an H200, most of it torch.compile.")
    ap.add_argument("--out", type=Path, help="default: <results root>/00_overhead ($CGK_RESULTS_DIR under reproduce, "
                    "build/figures otherwise; never the recorded figures/ unless reproduce publishes it)")
    ap.add_argument("--baseline", type=Path, help="a folder holding the kit before the change as cudagraph_kit_old")
    ap.add_argument("--quick", action="store_true", help="a smoke run: %(r)d rounds of %(c)d calls, %(a)d rounds "
                    "after a module is built" % {"r": QUICK["rounds"], "c": QUICK["calls"], "a": QUICK["after_rounds"]})
    ap.add_argument("--rounds", type=int, help=f"rounds of bursts (default {FULL['rounds']})")
    ap.add_argument("--calls", type=int, help=f"calls per burst (default {FULL['calls']})")
    ap.add_argument("--after-rounds", type=int, help="rounds of single calls after a module is built "
                    f"(default {FULL['after_rounds']})")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("rounds", "calls", "after_rounds"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if min(cfg["rounds"], cfg["calls"], cfg["after_rounds"]) < 1:
        ap.error("--rounds, --calls and --after-rounds must be at least 1")
    if not torch.cuda.is_available():
        print("bench_overhead.py needs a CUDA GPU: host costs measured on a CPU machine are not results",
              file=sys.stderr)
        sys.exit(2)

    from cudagraph_kit import capture
    from cudagraph_kit.guard import weights_fixed
    from cudagraph_kit.train_step import capture_train_step
    kit = {"capture": capture, "weights_fixed": weights_fixed, "capture_train_step": capture_train_step}
    if args.out is None:
        from cudagraph_kit.course.measuring import results
        args.out = Path(results.results_root()) / "00_overhead"
    args.out.mkdir(parents=True, exist_ok=True)
    old_capture = old_train = None
    if args.baseline is not None:
        old_capture, old_train = load_old(args.baseline)
    rows, checks, failures, done = [], [], {}, []
    cases = ["mlp48", "llama", "after_module_mlp48", "after_module_llama"]

    for name, bench in (("mlp48", lambda: bench_mlp48(kit, old_capture, cfg, rows, checks, failures)),
                        ("llama", lambda: bench_llama(kit, old_capture, cfg, rows, checks, failures)),
                        ("train", lambda: bench_train(kit, old_train, cfg, checks, failures))):
        try:
            bench()
        except Exception as exc:  # noqa: BLE001 - a case that breaks outside its variants: the others still run
            fail(failures, name, "case", reason(exc))
        gc.collect()   # graphs of the section just done are freed here, not inside a later timed call
        done.append(name)
        save(args.out, args, cfg, rows, checks, failures, cases, done)
        log(f"{name} done, saved")

    import pandas as pd
    summary, checks, env = save(args.out, args, cfg, rows, checks, failures, cases, done)
    print(f"\n{env['gpu']}, PyTorch {env['torch']}, transformers {env['transformers']}; written to {args.out}")
    print_summary(summary)
    if checks:
        print("\nthe guard's check alone, nothing launched:")
        print(pd.DataFrame(checks).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if failures:
        print(f"\n{len(failures)} failed (rows with status 'failed: ...'):")
        for (c, v), why in failures.items():
            print(f"  {c} / {v}: {why}")
    log("done")


if __name__ == "__main__":
    main()
