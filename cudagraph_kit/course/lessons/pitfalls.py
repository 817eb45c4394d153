"""Notebook 05's parts that are not the lesson: the pitfall table, the check that the process still works after a
failure, short causes for tables of errors, the memory claim and figure, the reading of the reduce-overhead
experiment, the workloads of the advise experiment and its reading, the claims "advise's prediction lies within a factor of the measured speedup" and "the measured speedup
goes the way advise's words said" (faster, about as fast, slower), the two-captures summary, the rows fitted after
the fact from notebooks 01-04's records and the advise figure.

Example::

    from cudagraph_kit.course.nb05_parts import PitfallTable, advise_claim
    pitfalls = PitfallTable()
    pitfalls.record("a changing shape", "raises", "check_capturable", "fixed shapes", "seen", True)
    advise_claim("advise_within_1_5x_gelu_small", "GELU small", 4.0, 3.2, 5.1).statement
    advise_words_claim("advise_words_gelu_large", "GELU large", 1.06, 1.08, 1.13).verdict   # 'unclear'
"""
from __future__ import annotations

import re

from .claims import Claim

__all__ = ["PitfallTable", "still_works", "first_line", "short_cause", "show_isolated", "memory_reading",
           "plot_memory", "show_reduce_overhead", "advise_vs_measured", "show_figure", "advise_claim",
           "advise_words_claim", "advise_overall_claim", "closeness", "two_captures_table", "two_captures_verdict",
           "recorded_headlines", "fitted_row", "advice_summary", "advice_from_saved", "plot_advise", "advice_rows",
           "result_table", "eager_step", "advise_workloads", "show_advise", "WITHIN"]

WITHIN = 1.5  # advise's prediction is "within" when it lies within this factor of the measured speedup


def first_line(text, n=160):
    """The first line of ``text``, cut to ``n`` characters."""
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= n else text[: n - 1] + "…"


def short_cause(text, n=80):
    """A short cause for a table cell: an error ``"Type: message"`` becomes its type and the first clause of the
    message's first line (a leading "CUDA error: " dropped, the type says it), cut to ``n`` characters; any other
    text its first line, cut the same way. Values that are not text (True, NaN, an exit code) come back as they are.

    Example::

        short_cause("AcceleratorError: CUDA error: operation not permitted when stream is capturing\\n"
                    "Search for `cudaErrorStreamCaptureUnsupported' in ...")
        # 'AcceleratorError: operation not permitted when stream is capturing'
    """
    if not isinstance(text, str):
        return text
    line = first_line(text, n=10**6)
    error = re.match(r"(\w+(?:Error|Exception|Warning)): (?:CUDA error: )?(.*)", line)
    if error:
        clause = re.split(r"(?<=[.;])\s", error[2], maxsplit=1)[0]
        line = f"{error[1]}: {clause.rstrip('.;')}"
    return line if len(line) <= n else line[: n - 1] + "…"


def show_isolated(rows, columns):
    """Print the runs of an experiment run in fresh processes (``run_isolated``'s dicts) as a table of ``columns``
    (those present), each text cut to a short cause (``short_cause``), then the first error once, as the experiment
    reported it. Returns all the rows, with their full texts, as a DataFrame.

    Example::

        runs = show_isolated([run_isolated(warmup_stream, v) for v in WARMUP_VARIANTS], ["variant", "capture"])
    """
    import pandas as pd

    runs = pd.DataFrame(rows)
    shown = runs[[c for c in columns if c in runs]]
    print(shown.apply(lambda col: col.map(short_cause)).to_string(index=False))
    texts = [v for _, row in shown.iterrows() for v in row if isinstance(v, str)]
    first_error = next((v for v in texts if short_cause(v) != v), None)
    if first_error is not None:
        print("\nThe first error, as the experiment reported it:\n" + first_error)
    return runs


def still_works(fn, device="cuda"):
    """After a failure: eager work and a fresh capture of ``fn`` (an elementwise function), both compared with the
    CPU. None without CUDA (nothing was captured, so nothing is claimed)."""
    import torch

    from ..graphed import capture

    if not torch.cuda.is_available():
        return None
    x = torch.randn(64, device=device)
    g = capture(fn, x)
    y = torch.randn_like(x)
    return bool(torch.allclose(fn(x).cpu(), fn(x.cpu()), atol=1e-6)
                and torch.allclose(g(y).cpu(), fn(y.cpu()), atol=1e-6))


class PitfallTable:
    """One row per pitfall: what happens without a fix, what finds it, the fix, what this run saw, whether this
    run detected it (None: not run here) and whether the process still worked after the failure."""

    def __init__(self):
        self.rows = []

    def record(self, pitfall, without_fix, found_by, fix, seen, detected, still_works=None):
        self.rows.append({"pitfall": pitfall, "without a fix": without_fix, "found by": found_by, "fix": fix,
                          "this run saw": seen, "detected": detected, "process still works": still_works})

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.rows)[["pitfall", "without a fix", "found by", "fix", "detected",
                                        "process still works"]] if self.rows else pd.DataFrame()

    def result_rows(self, cuda: bool) -> list[dict]:
        """The rows for results.csv (case "pitfall: ...")."""
        return [{"case": f"pitfall: {p['pitfall']}", "variant": p["without a fix"], "median_us": float("nan"),
                 "speedup": float("nan"), "executed_as": "cuda graph" if cuda else "eager (checks only)",
                 "found_by": p["found by"], "fix": p["fix"], "seen": p["this run saw"], "detected": p["detected"],
                 "process_still_works": p["process still works"]} for p in self.rows]


def show_figure(fig):
    """Show a matplotlib figure inline as a PNG, whatever the backend, and close it (it can still be saved)."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buffer.getvalue()))


def memory_reading(private, shared, batches):
    """Going further D's reading: ``(rows, claim)`` from the bytes reserved by one graph per batch size in ``batches`` with
    a private pool each (``private``) and in one shared pool (``shared``). The rows are for results.csv (case
    "memory: ..."); the claim "shared_pool_saves_memory" holds when the shared pool reserved less (one reading of
    each, so its interval is the ratio private / shared itself).

    Example::

        rows, claim = memory_reading(600 * 2**20, 200 * 2**20, [512, 256, 128])
        claim.statement  # '3 graphs reserved 200 MiB in one shared pool, 600 MiB with a private pool each (...)'
    """
    case = f"memory: {len(batches)} graphs (batch {batches[0]}..{batches[-1]})"
    rows = [{"case": case, "variant": v, "reserved_mib": used / 2**20}
            for v, used in (("private pool per graph", private), ("one shared pool", shared))]
    ratio = private / shared if shared > 0 else (float("inf") if private > 0 else float("nan"))
    said = f"{len(batches)} graphs reserved {shared / 2**20:.0f} MiB in one shared pool, {private / 2**20:.0f} MiB"
    claim = Claim("shared_pool_saves_memory", lo=ratio, hi=ratio, above=1.0,
                  holds=f"{said} with a private pool each ({{lo:.2f}}x less in the shared pool)",
                  fails=f"{said} with a private pool each (the shared pool saved nothing)")
    return rows, claim


def plot_memory(rows, title):
    """A bar per row of ``memory_reading``: the memory each way of pooling reserved. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar([r["variant"] for r in rows], [r["reserved_mib"] for r in rows], color=["C3", "C2"])
    ax.set(ylabel="memory reserved (MiB)", title=title)
    return fig


def show_reduce_overhead(ro, torch_version):
    """Print what the reduce-overhead experiment (``pitfall_scripts.reduce_overhead_pitfalls``, its dict ``ro`` from
    ``run_isolated``; None when it did not run) found, and return ``(seen, detected, found_by)`` for the pitfall
    table. ``detected``: a skip was logged, a cloned output kept its values, and reading a kept output either raised
    a RuntimeError or silently held the next call's values. ``found_by``: what finds a kept output on this PyTorch.
    """
    if ro is None:
        return ("needs a GPU", None,
                "a RuntimeError for a warm-up's or recording's output; for a replay's, comparing it with a clone")
    if ro.get("exit code"):
        print("the reduce-overhead experiment did not finish:", ro.get("exit code"), ro.get("stderr", ""))
    skips = ro.get("skips", 0)
    print(f"cudagraph_skips: {skips}")
    for msg in ro.get("messages", []):
        print("  ", first_line(msg, 200))
    old_output, clone_keeps = str(ro.get("old output") or ""), ro.get("clone keeps it")
    print("reading an output kept across calls:", ro.get("old output"), "| with .clone():",
          "kept" if clone_keeps else clone_keeps)
    raised, silent = old_output.startswith("RuntimeError"), old_output.startswith("silently")
    print(f"on PyTorch {torch_version}, a kept output read after the next call "
          + ("raised a RuntimeError" if raised else
             "did not raise: it silently held the next call's values" if silent else
             f"gave: {old_output or 'nothing (the experiment did not finish)'}"))
    found_by = ("the RuntimeError on reading it" if raised else
                "comparing it with a clone (a replay's output raises no error)")
    detected = bool(skips) and clone_keeps is True and (raised or silent)
    return f"{skips} skip(s) logged; old output: {old_output}", detected, found_by


def eager_step(model, opt):
    """``models.eager_step`` (MSE loss) whose ``step(x, y)`` returns the loss detached, as a graph's step does."""
    from .models import eager_step as plain_step

    step = plain_step(model, opt)
    return lambda x, y: step(x, y).detach()


def advise_workloads(gelu):
    """Section 7's cases, one at a time: ``(case, claim id, args, eager, capture_graph)``. The GELU of notebook 01 on a
    small and a large tensor, then notebook 02's training steps (two MLP sizes, SGD and ``Adam(capturable=True)``,
    with dropout). ``eager`` is the function ``advise`` predicts for; ``capture_graph()`` captures its graph only when
    called, so a notebook can run ``advise`` first, with nothing captured, and returns ``{variant: graphed fn}`` for
    ``measure`` (the GELU's ``"graph"`` replays the captured input; a step's ``"whole-step graph"`` is the kit's
    ``capture_train_step``, warmed up and captured, which holds its own model and optimizer)."""
    import torch

    from ..graphed import capture
    from ..train_step import capture_train_step

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
            yield f"MLP {size}, {opt_name}", f"{label}_{opt_label}", (x, y), eager_step(*make()), graph_of


def show_advise(table, claims, stem):
    """Print section 7's reading: per case, advise's prediction beside the measured speedup (``table``, from
    ``advise_vs_measured``), then the sentences of the advise claims in ``claims``. Without a GPU (``table`` empty)
    the recorded GPU run's predictions and sentences instead, under a line naming that run."""
    import pandas as pd

    from .claims import load_claims
    from .results import load

    if len(table):
        print(table[["case", "nodes", "predicted_graph_us", "measured_graph_us", "predicted_speedup",
                     "measured_speedup", "measured_lo", "measured_hi"]].round(2).to_string(index=False))
        print("\n".join(c.statement for c in claims if c.claim.startswith("advise_")))
        return
    rec = load(stem)
    if rec is None:
        print("No GPU here: advise measures on an NVIDIA GPU, and no recorded GPU run was found.")
        return
    rows = rec.df[rec.df.case.astype(str).str.startswith("advise: ")]
    shown = pd.DataFrame({"case": rows.case.str.removeprefix("advise: "), "predicted_speedup": rows.speedup,
                          "measured_lo": rows.measured_speedup_lo, "measured_hi": rows.measured_speedup_hi})
    said = load_claims(rec.dir)
    print(f"No GPU here: advise measures on an NVIDIA GPU. The recorded GPU run's predictions: {rec.caption}.")
    print(shown.round(2).to_string(index=False))
    if said is not None:
        print("\n".join(s for c, s in zip(said.claim, said.statement) if str(c).startswith("advise_")))


def advise_vs_measured(predicted, measured, claim_ids):
    """Section 7's table and claims: for each case of ``predicted`` ({case: advise's ``Advice``}), the prediction
    beside the graph's timing in ``measured`` (``measure``'s result: an "eager" variant and one graph variant per
    case), and two claims: ``advise_claim("advise_within_1_5x_" + claim_ids[case], ...)`` (how far off the number
    is) and ``advise_words_claim("advise_words_" + claim_ids[case], ...)`` (whether advise's words, faster / about as
    fast / slower, went the way the measurement did; this one can fail near 1x). Returns ``(table, claims)``: a
    DataFrame with a row per case (empty when nothing was predicted) and the claims, the two of each case in case
    order. ``advise_overall_claim`` takes these claims and reads the within-1.5x ones.
    """
    import pandas as pd

    from ..advice import expected_effect

    rows, case_claims = [], []
    for case, a in predicted.items():
        graph_variant = next(v for v in measured.table[measured.table.case == case].variant if v != "eager")
        graph_row = measured.row(case, graph_variant)
        lo, hi = measured.interval(case, graph_variant)
        within = advise_claim(f"advise_within_1_5x_{claim_ids[case]}", case, a.speedup, lo, hi)
        words = advise_words_claim(f"advise_words_{claim_ids[case]}", case, a.speedup, lo, hi)
        case_claims += [within, words]
        rows.append({"source": "05 (this run)", "prediction": "before capture", "case": case,
                     "nodes": a.kernels_per_call, "eager_us": a.eager_us, "floor_us": a.floor_us,
                     "graph_gpu_us": a.graph_gpu_us, "predicted_graph_us": a.graph_us,
                     "predicted_speedup": a.speedup, "advise_says": expected_effect(a.speedup),
                     "measured_graph_us": graph_row.median_us,
                     "measured_speedup": graph_row.speedup, "measured_lo": lo, "measured_hi": hi,
                     "graph_executed_as": graph_row.executed_as, "verdict": within.verdict,
                     "words_verdict": words.verdict})
    return pd.DataFrame(rows), case_claims


def closeness(p, m):
    """1 when the prediction ``p`` equals the measurement ``m``, 1/x when one is x times the other."""
    return min(p / m, m / p)


def advise_claim(claim_id, case, predicted, lo, hi, within=WITHIN, eager_fallback=False) -> Claim:
    """The claim "advise's prediction ``predicted`` lies within ``within`` x of the measured speedup", whose 90%
    prediction interval is ``lo``-``hi``. The claim's interval is the range of ``closeness(predicted, m)`` for m in
    lo..hi; it holds above 1/within (the whole measured interval within the factor), fails when none of it is."""
    said = f"advise predicted {predicted:.2f}x before capture; the measured speedup is {lo:.2f}-{hi:.2f}x"
    if not (lo == lo and hi == hi and 0 < lo <= hi and predicted > 0):
        return Claim(claim_id, lo=float("nan"), hi=float("nan"), above=1 / within, holds="", fails="",
                     eager_fallback=eager_fallback, subject=f"{case}: advise's prediction")
    ends = (closeness(predicted, lo), closeness(predicted, hi))
    c_lo, c_hi = min(ends), (1.0 if lo <= predicted <= hi else max(ends))
    said = said.replace("{", "{{").replace("}", "}}")
    return Claim(claim_id, lo=c_lo, hi=c_hi, above=1 / within, eager_fallback=eager_fallback,
                 subject=f"{case}: advise's prediction",
                 holds=f"{case}: {said}, all of it within {within:g}x of the prediction",
                 fails=f"{case}: {said}, all of it more than {within:g}x away from the prediction",
                 unclear=f"{case}: {said}, partly within {within:g}x of the prediction and partly beyond")


def advise_words_claim(claim_id, case, predicted, lo, hi, about=None, eager_fallback=False) -> Claim:
    """The claim "the measured speedup went the way advise's words said": advise calls a predicted speedup above
    ``about`` (``advice.ABOUT``, 1.1) "faster", below ``1 / about`` "slower" and in between "about as fast"
    (``advice.expected_effect``). The claim holds when the whole measured 90% interval ``lo``-``hi`` lies in the band
    the words named, fails when none of it does, and is unclear when it straddles the band's edge. So, unlike the
    within-1.5x claim, it fails when advise says "about as fast" and a graph is measured clearly faster.

    Its interval, on one scale per kind of words so that it is checked against ``above`` like any claim: "faster":
    the measured speedup itself (above ``about``); "slower": how many times slower, 1/hi to 1/lo (above ``about``);
    "about as fast": the range of ``min(m, 1/m)`` for m in lo..hi (above ``1 / about``: within the band).

    Example::

        advise_words_claim("advise_words_gelu_large", "GELU large", 1.06, 1.15, 1.20).verdict  # 'fails'
    """
    from ..advice import ABOUT, expected_effect

    about = ABOUT if about is None else about
    effect = expected_effect(predicted, about)
    subject = f"{case}: advise's words"
    known = lo == lo and hi == hi and 0 < lo <= hi and effect != "unknown"
    if not known:
        return Claim(claim_id, lo=float("nan"), hi=float("nan"), above=about, holds="", fails="",
                     eager_fallback=eager_fallback, subject=subject)
    told = {"faster": "faster than eager", "slower": "slower than eager", "about as fast": "about as fast as eager"}
    band = {"faster": f"more than {about:g}x faster", "slower": f"more than {about:g}x slower",
            "about as fast": f"within {about:g}x of eager either way"}[effect]
    said = (f"{case}: advise predicted {predicted:.2f}x and said a graph would be {told[effect]} (its words for "
            f"{band}); the measured speedup is {lo:.2f}-{hi:.2f}x")
    said = said.replace("{", "{{").replace("}", "}}")
    if effect == "faster":
        c_lo, c_hi, above = lo, hi, about
        outside = f"none of it {band}"
    elif effect == "slower":
        c_lo, c_hi, above = 1 / hi, 1 / lo, about
        outside = f"none of it {band}"
    else:
        ends = (closeness(1.0, lo), closeness(1.0, hi))
        c_lo, c_hi, above = min(ends), (1.0 if lo <= 1.0 <= hi else max(ends)), 1 / about
        outside = f"all of it more than {about:g}x " + ("faster" if lo > 1.0 else "slower")
    return Claim(claim_id, lo=c_lo, hi=c_hi, above=above, eager_fallback=eager_fallback, subject=subject,
                 holds=f"{said}, all of it {band}, as the words said",
                 fails=f"{said}, {outside}: the words were wrong",
                 unclear=f"{said}, partly {band} and partly not: too close to the edge to call")


def advise_overall_claim(case_claims, within=WITHIN) -> Claim:
    """All cases together: holds when every case's claim holds, fails when any fails (the lowest interval). Reads
    the within-``within`` claims of ``case_claims`` (``advise_vs_measured`` also returns the words' claims)."""
    case_claims = [c for c in case_claims if not c.claim.startswith("advise_words_")]
    n = len(case_claims)
    known = all(c.measured for c in case_claims)
    verdicts = [c.verdict for c in case_claims]
    held, failed = verdicts.count("holds"), verdicts.count("fails")
    return Claim("advise_within_1_5x_all", lo=min(c.lo for c in case_claims) if known else float("nan"),
                 hi=min(c.hi for c in case_claims) if known else float("nan"), above=1 / within,
                 subject="advise's predictions",
                 holds=f"advise's predictions made before capture lie within {within:g}x of the measured speedup in "
                       f"all {n} cases",
                 fails=f"advise's predictions made before capture are more than {within:g}x off in {failed} of {n} "
                       f"cases and within {within:g}x in {held}",
                 unclear=f"advise's predictions made before capture: within {within:g}x in {held} of {n} cases, the "
                         f"others partly within and partly beyond")


def two_captures_table(jobs, answers):
    """The two-captures experiment (``pitfall_scripts.two_captures``), one row per try, and a summary per variant
    (tries, crashes, the most tensors graph 1 read from memory it no longer owned)."""
    import pandas as pd

    rows = []
    for (variant, attempt), r in zip(jobs, answers):
        replay = r.get("replay of graph 1") or f"process died (exit code {r['exit code']}): {r.get('stderr', '')}"
        states = r.get("graph 1 memory", {})
        rows.append({"variant": variant, "try": attempt + 1, "replay of graph 1": first_line(replay, 90),
                     "crashed": replay != "ok",
                     "graph 1 reads freed memory": sum(n for k, n in states.items() if not k.endswith(": allocated")),
                     "graph 1 memory": "; ".join(f"{k} {n}" for k, n in sorted(states.items()))})
    two = pd.DataFrame(rows)
    summary = two.groupby("variant", sort=False).agg(tries=("try", "size"), crashed=("crashed", "sum"),
                                                     reads_freed=("graph 1 reads freed memory", "max"))
    return rows, summary


def two_captures_verdict(s) -> tuple[bool, str]:
    """(detected, one line) from ``two_captures_table``'s summary: keeping everything alive never crashed nor read
    freed memory, and dropping the first model's objects left graph 1 reading memory it no longer owned."""
    keep, drop = s.loc["keep everything"], s.loc["drop"]
    detected = bool(keep.crashed == 0 and keep.reads_freed == 0 and drop.reads_freed > 0)
    seen = f"drop: {drop.crashed}/{drop.tries} crashed; keep: {keep.crashed}"
    return detected, seen


def recorded_headlines(results) -> dict:
    """{recorded notebook: [(case, eager variant, graph variant)]} for the fitted-after-the-fact check."""
    heads = {
        "01_gelu": [("small", "eager", "graph replay"), ("large", "eager", "graph replay")],
        "02_train_step": [(f"MLP {s}, {o}", "eager", "whole-step graph") for s in ("32x128x256x16", "640x4096x2048x1024")
                          for o in ("SGD", "Adam(capturable)")],
        "03_jit_compile": [(c, "torch.compile", "torch.compile + graph, input in place") for c in ("small", "large")],
    }
    root = results.recorded_root()
    for folder in sorted(root.glob("04_*")) if root is not None else []:
        rec = results.load(folder.name)
        if rec is not None and {"case", "variant"} <= set(rec.df.columns):
            heads[folder.name] = [(c, "eager", v) for c, grp in rec.df.groupby("case", sort=False)
                                  if "eager" in set(grp.variant)
                                  for v in [next((v for v in grp.variant if "graph" in str(v)), None)] if v]
    return heads


def fitted_row(results, stem, case, base_variant, graph_variant, cost):
    """A row fitted after the fact from a recorded notebook: the floor is the timed graph's own (None if something
    is missing)."""
    import pandas as pd

    from ..advice import predict_graph_time

    rec = results.load(stem)
    if rec is None:
        return None
    df = rec.df
    base, graph = df[(df.case == case) & (df.variant == base_variant)], df[(df.case == case) & (df.variant == graph_variant)]
    if base.empty or graph.empty:
        return None
    b, gr = base.iloc[0], graph.iloc[0]
    floor = gr.get("floor_us") if pd.notna(gr.get("floor_us")) else b.get("floor_us")
    copies = b.get("copies_per_call", 0.0)
    nodes = b.get("kernels_per_call", float("nan")) + (copies if pd.notna(copies) else 0.0)
    if floor is None or pd.isna(floor) or pd.isna(nodes) or not b.median_us > 0 or not gr.median_us > 0:
        return None
    pred_graph = predict_graph_time(floor, nodes, cost)
    return {"source": stem, "gpu": rec.env.get("gpu"), "prediction": "fitted after the fact", "case": case,
            "eager_us": b.median_us, "floor_us": floor, "graph_gpu_us": floor, "nodes": nodes,
            "predicted_graph_us": pred_graph, "predicted_speedup": b.median_us / pred_graph,
            "measured_graph_us": gr.median_us, "measured_speedup": b.median_us / gr.median_us,
            "graph_executed_as": gr.get("executed_as", "?")}


def advice_summary(adv):
    """Per source notebook and kind of prediction: cases, median predicted / measured, the farthest case."""
    import pandas as pd

    rows = []
    for (source, kind), grp in adv.groupby(["source", "prediction"], sort=False):
        ratio = grp.predicted_speedup / grp.measured_speedup
        far = ratio.map(lambda r: max(r, 1 / r)).idxmax()
        rows.append({"source": source, "prediction": kind, "cases": len(grp),
                     "median predicted/measured": f"{ratio.median():.2f}",
                     "farthest case": f"{grp.case[far]}: {grp.predicted_speedup[far]:.2f}x predicted, "
                                      f"{grp.measured_speedup[far]:.2f}x measured"})
    return pd.DataFrame(rows)


def advice_from_saved(df):
    """The advise rows of a saved results table as ``advice_summary`` takes them."""
    import pandas as pd

    if "measured_speedup" not in df:
        return pd.DataFrame()
    rows = []
    for r in df[df.case.astype(str).str.startswith(("advise: ", "advise fitted: "))].to_dict("records"):
        if not (pd.notna(r["measured_speedup"]) and r["measured_speedup"] > 0):
            continue
        before = r["variant"] == "predicted (this run)"
        own = r.get("advise_speedup", float("nan"))
        rows.append({"source": "05 (that run)" if before else str(r["variant"]).partition("(")[2].split(" ")[0],
                     "prediction": "before capture" if before else "fitted after the fact",
                     "case": str(r["case"]).partition(": ")[2],
                     "predicted_speedup": own if before and pd.notna(own) else r["speedup"],
                     "measured_speedup": r["measured_speedup"]})
    return pd.DataFrame(rows)


def plot_advise(honest, fitted, gpu_name, within=WITHIN):
    """advise's predicted speedup against the measured one: this run's predictions made before capture (with the
    measured 90% interval) and the rows fitted after the fact (hollow). None when there is nothing to plot."""
    import matplotlib.pyplot as plt

    values = [v for frame in (honest, fitted) for col in ("predicted_speedup", "measured_speedup", "measured_lo",
                                                          "measured_hi") if col in frame for v in frame[col]
              if v == v and v > 0]
    if not values:
        return None
    fig, ax = plt.subplots(figsize=(5.8, 5))
    lo, hi = min(values) * 0.8, max(values) * 1.25
    ax.fill_between([lo, hi], [lo / within, hi / within], [lo * within, hi * within], color="C2", alpha=0.15,
                    label=f"within {within:g}x")
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    for i, (source, grp) in enumerate(fitted.groupby("source", sort=False) if len(fitted) else []):
        ax.scatter(grp.measured_speedup, grp.predicted_speedup, facecolors="none", edgecolors=f"C{i + 1}",
                   label=f"{source} (recorded): fitted after the fact", zorder=3)
    if len(honest):
        ax.errorbar(honest.measured_speedup, honest.predicted_speedup,
                    xerr=[(honest.measured_speedup - honest.measured_lo).clip(lower=0),
                          (honest.measured_hi - honest.measured_speedup).clip(lower=0)],
                    fmt="o", color="C0", ecolor="C0", capsize=3, zorder=4,
                    label="this run: predicted before capture (measured: 90% interval)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured speedup (eager / graph)",
           ylabel="advise: predicted best speedup", title=f"advise vs measured on {gpu_name}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def advice_rows(advice, cost) -> list[dict]:
    """advise's rows for results.csv: "advise: <case>" (predicted before capture in this run) and
    "advise fitted: <case>" (fitted after the fact from a recorded notebook), with the replay cost measured."""
    costs = ({"node_us": cost.graph_node_us, "launch_us": cost.launch_us, "gap_saved_us": cost.gap_saved_us}
             if cost else {})
    rows = []
    for r in advice.to_dict("records"):
        before = r["prediction"] == "before capture"
        rows.append({"case": f"advise: {r['case']}" if before else f"advise fitted: {r['case']}",
                     "variant": "predicted (this run)" if before else f"fitted ({r['source']} ({r['gpu']}))",
                     "prediction": r["prediction"], "median_us": r["predicted_graph_us"],
                     "speedup": r["predicted_speedup"], "executed_as": r["graph_executed_as"],
                     "floor_us": r["floor_us"], "eager_us": r["eager_us"], "nodes_per_call": r["nodes"],
                     "graph_gpu_us": r["graph_gpu_us"],
                     "advise_speedup": r["predicted_speedup"] if before else float("nan"),
                     "measured_speedup": r["measured_speedup"], "measured_graph_us": r["measured_graph_us"],
                     "measured_speedup_lo": r.get("measured_lo", float("nan")),
                     "measured_speedup_hi": r.get("measured_hi", float("nan")), **costs})
    return rows


def result_table(pitfalls, memory_rows, measured, advice, cost, two_rows, cuda):
    """Notebook 05's results.csv: a row per pitfall, the memory reading, section 7's timings ("measured: ..."), the
    advise rows and the two-captures tries."""
    import pandas as pd

    rows = pitfalls.result_rows(cuda)
    rows += [{**r, "median_us": float("nan"), "speedup": float("nan"), "executed_as": "cuda graph"}
             for r in memory_rows]
    if measured is not None:
        rows += measured.table.assign(case="measured: " + measured.table.case).to_dict("records")
    rows += advice_rows(advice, cost)
    rows += [{"case": f"two captures: {r['variant']}", "variant": f"try {r['try']}", "median_us": float("nan"),
              "speedup": float("nan"), "executed_as": "cuda graph", "seen": r["replay of graph 1"],
              "crashed": r["crashed"], "reads_freed": r["graph 1 reads freed memory"], "memory": r["graph 1 memory"]}
             for r in two_rows]
    return pd.DataFrame(rows)
