"""Each experiment's verdicts: the claims a notebook states about one measurement, built from what ``measure``
returned. A notebook passes one of these functions to ``measure(..., verdicts=...)`` and shows the table and its
sentences with ``results.show(m, stem)``; it builds no claim list of its own. The sentences and their rules are in
``claims.py``; this module says which comparisons each experiment makes, notebook by notebook, and holds the
labels its sentences use (the variants' names, a bucket strategy as a noun phrase).

Example::

    from cudagraph_kit.course.measuring import results, verdicts
    from cudagraph_kit.course.measuring.measure import measure
    m = measure({"small": {...}, "large": {...}}, verdicts=verdicts.gelu_headline)
    results.show(m, "01_gelu")   # the short table, then "small: graph replay is 6.80-9.14x faster than eager", ...
"""
from __future__ import annotations

import re

from .breakdowns import FB
from .claims import (WITHIN, Claim, advise_claim, advise_words_claim, decode_vs_prefill, host_bound, speedup, stops_paying,
                     versus, within_floor)
from .measure import ran_eagerly

__all__ = ["covers", "gelu_headline", "gelu_sweep", "sweep_points", "gelu_calls_per_graph", "train_step", "amp_step",
           "fusion_and_graphs", "reduce_overhead_in_use", "SWEEP_THRESHOLD", "FLOOR_FACTOR", "GRAPH", "GRAPH_FUSED",
           "MODEL_ONLY", "ADAM_DEFAULT", "IP", "RO_MARK", "TRAIN_RO", "TRAIN_KIT", "resnet_inference", "resnet_training",
           "tag", "GRAPH_INFER", "GRAPH_TRAIN", "part_claims", "memory_reading", "advise_vs_measured",
           "advise_overall_claim", "strategy", "phrase", "SHORT", "stream_verdicts", "step_claims", "generation_claims", "as_ran",
           "as_ran_label"]


def covers(cases: str, claims: str):
    """Mark a verdicts function with what its experiment covers, as regular expressions: the ``cases`` of its
    table and the ids of its ``claims``. Where no graph ran, ``results.show`` shows the recorded GPU run's rows and
    verdicts of the whole experiment with them, also those a CPU run does not make (a size or a variant that
    needs a GPU)."""
    def mark(fn):
        fn.cases, fn.claims = re.compile(cases), re.compile(claims)
        return fn
    return mark


SWEEP_THRESHOLD = 1.10   # "stops paying": the graph saves at most 10%
FLOOR_FACTOR = 1.3       # "near the floor": within 1.3x of the GPU-busy time

# notebook 02's variants
GRAPH = "whole-step graph"
GRAPH_FUSED = "whole-step graph, SGD(fused=True)"
MODEL_ONLY = "make_graphed_callables (model only)"
ADAM_DEFAULT = "default eager Adam (capturable=False)"
_SIZE_KEY = {"32x128x256x16": "small", "640x4096x2048x1024": "docs"}
_OPT_KEY = {"SGD": "sgd", "Adam(capturable)": "adam"}


@covers(r"^(small|large)$", r"^(replay|copy_replay)_(beats_eager|saves_10pct)_")
def gelu_headline(m) -> list:
    """Notebook 01, section 4: the graph against eager on the small and the large tensor, replay and ``g(x)``. One
    claim per interval: the large replay's is asked one question, whether it saves more than 10%."""
    return [speedup(m, "replay_beats_eager_small", "small", "graph replay"),
            speedup(m, "copy_replay_beats_eager_small", "small", "graph copy+replay"),
            speedup(m, "replay_saves_10pct_large", "large", "graph replay", above=SWEEP_THRESHOLD)]


def sweep_points(m):
    """A size sweep's table (cases named ``"sweep 2^E"``) with a ``numel`` column, and its crossover: the
    smallest size from which every graph interval lies at or below :data:`SWEEP_THRESHOLD` (None where there is
    none, or where the graph ran eagerly)."""
    from ...intervals import stops_clearing

    table = m.table.copy()
    table["numel"] = [2 ** int(re.search(r"\^(\d+)", c).group(1)) for c in table.case]
    graph = table[table.variant != "eager"]
    if any(ran_eagerly(graph)):
        return table, None
    points = list(zip(graph.numel, graph.speedup_lo, graph.speedup_hi))
    return table, stops_clearing(points, above=SWEEP_THRESHOLD)["from"]


@covers(r"^sweep 2\^\d+$", r"^graph_stops_paying$")
def gelu_sweep(m) -> list:
    """Notebook 01, section 5: from which tensor size the graph replay stops paying."""
    table, _ = sweep_points(m)
    graph = table[table.variant != "eager"]
    return [stops_paying("graph_stops_paying", list(zip(graph.numel, graph.speedup_lo, graph.speedup_hi)),
                         SWEEP_THRESHOLD, "the graph replay in the size sweep", " elements",
                         eager_fallback=any(ran_eagerly(graph)))]


@covers(r"^small, calls per graph$", r"^(more_calls_per_graph_faster|many_calls_near_floor)$")
def gelu_calls_per_graph(m) -> list:
    """Notebook 01, section 6: more calls per graph against fewer, and the most calls against the floor. The case
    is the table's first; its graph variants are named ``"graph, K calls/graph"``."""
    case = str(m.table.case.iloc[0])
    ks = sorted(int(re.search(r"(\d+) calls/graph", v).group(1)) for v in m.table.variant if "calls/graph" in v)
    few, many = ks[0], ks[-1]
    return [versus(m, "more_calls_per_graph_faster", (case, f"graph, {many} calls/graph"),
                   (case, f"graph, {few} calls/graph"), subject=f"small: {many} calls per graph",
                   than=f"{few} per graph"),
            within_floor(m, "many_calls_near_floor", case, f"graph, {many} calls/graph", FLOOR_FACTOR,
                         subject=f"small: {many} calls per graph")]


@covers(r"^MLP [^,]+, (SGD|Adam\(capturable\))$", r"^(graph_beats_eager|model_only_beats_eager|graph_beats_model_only|"
        r"graph_within_floor|default_adam_beats_capturable)_")
def train_step(m) -> list:
    """Notebook 02, section 5, per case ``"MLP <size>, <optimizer>"``: the whole-step graph against eager; on a GPU
    also graphing the model only against eager, the whole-step graph against it, the whole-step graph against
    1.1x its floor (where one was measured), and the default eager Adam against the capturable one."""
    claims = []
    for case in dict.fromkeys(m.table.case):
        size, opt_name = case.removeprefix("MLP ").split(", ")
        key = f"{_SIZE_KEY[size]}_{_OPT_KEY[opt_name]}"
        than = "eager" if opt_name == "SGD" else "eager Adam(capturable=True)"
        claims.append(speedup(m, f"graph_beats_eager_{key}", case, GRAPH, than=than))
        variants = set(m.table[m.table.case == case].variant)
        if MODEL_ONLY not in variants:   # without a GPU: no make_graphed_callables row
            continue
        claims += [speedup(m, f"model_only_beats_eager_{key}", case, MODEL_ONLY, than=than),
                   versus(m, f"graph_beats_model_only_{key}", (case, GRAPH), (case, MODEL_ONLY))]
        if m.row(case, GRAPH).floor_us > 0:  # a floor was measured (the graph ran as replays alone)
            claims.append(within_floor(m, f"graph_within_floor_{key}", case, GRAPH, 1.1))
        if ADAM_DEFAULT in variants:
            claims.append(speedup(m, f"default_adam_beats_capturable_{_SIZE_KEY[size]}", case, ADAM_DEFAULT,
                                  than=than))
    return claims


@covers(r"^MLP .*, AMP ", r"^(amp_graph_beats_eager|fused_sgd_graph_beats_plain_sgd_graph)_")
def amp_step(m) -> list:
    """Notebook 02, section 6, per AMP case: the graph against the eager AMP loop; for fp16 with a GradScaler,
    the graph with ``SGD(fused=True)`` against the graph with plain SGD."""
    claims = []
    for case in dict.fromkeys(m.table.case):
        key = "bf16" if "bf16" in case else "fp16"
        claims.append(speedup(m, f"amp_graph_beats_eager_{key}", case, GRAPH, than="the eager AMP loop"))
        if GRAPH_FUSED in set(m.table[m.table.case == case].variant):
            claims.append(versus(m, f"fused_sgd_graph_beats_plain_sgd_graph_{key}", (case, GRAPH_FUSED),
                                 (case, GRAPH)))
    return claims


def part_claims(m, case, key, label):
    """Two claims on ``case``'s parts, window by window: the step without optimizer.step() is faster than the
    whole step (``optimizer_step_adds_time_<key>``), forward + loss alone is faster than it with backward
    (``backward_adds_time_<key>``)."""
    return [versus(m, f"optimizer_step_adds_time_{key}", (case, FB), (case, "whole eager step"),
                   subject=f"eager {label}: the step without optimizer.step()", than="the whole step"),
            versus(m, f"backward_adds_time_{key}", (case, "forward + loss"), (case, FB),
                   subject=f"eager {label}: forward + loss alone", than="forward + loss with zero_grad and backward")]


# notebook 03's variants and cases
IP = ", input in place"
RO_MARK = "reduce-overhead + mark_step_begin"
TRAIN_RO, TRAIN_KIT = "reduce-overhead forward+backward", "kit whole-step graph"


def _if_timed(build, *args, **kwargs) -> list:
    """The claim, or none where the run did not time one of its variants (no torch.compile, no GPU)."""
    try:
        return [build(*args, **kwargs)]
    except KeyError:
        return []


def fusion_and_graphs(fused: str):
    """Notebook 03, phase 1, per GELU case: a graph against eager, fusion alone (``fused``: "jit.script" where
    TorchScript works, else "torch.compile") against a graph, whether they stack, torch.compile's kernel against
    TorchScript's in a graph, and ``reduce-overhead`` called as ``y = f(x)`` against eager. Returns the verdicts
    function ``measure`` takes."""
    @covers(r"^(small|large)$", r"^(graph_beats_eager|fusion_beats_graph|fusion_adds_to_graph|graph_adds_to_fusion|"
            r"compile_beats_script_graph|ro_naive_beats_eager)_")
    def build(m) -> list:
        claims = []
        for case in dict.fromkeys(m.table.case):
            g, eager5 = f"{case} GELU", "a graph of eager's five kernels"
            claims += _if_timed(speedup, m, f"graph_beats_eager_{case}", case, "cuda graph" + IP,
                                subject=f"{g}: {eager5} (input in place)")
            claims += _if_timed(versus, m, f"fusion_beats_graph_{case}", (case, fused), (case, "cuda graph" + IP),
                                subject=f"{g}: fusion alone ({fused})", than=eager5)
            claims += _if_timed(versus, m, f"fusion_adds_to_graph_{case}", (case, "torch.compile + graph" + IP),
                                (case, "cuda graph" + IP), subject=f"{g}: a graph of torch.compile's one fused kernel",
                                than=eager5)
            claims += _if_timed(versus, m, f"graph_adds_to_fusion_{case}", (case, f"{fused} + graph" + IP),
                                (case, fused), subject=f"{g}: {fused} in a graph (input in place)", than=f"{fused} alone")
            claims += _if_timed(versus, m, f"compile_beats_script_graph_{case}", (case, "torch.compile + graph" + IP),
                                (case, "jit.script + graph" + IP), subject=f"{g}: torch.compile's kernel in a graph",
                                than="TorchScript's")
            claims += _if_timed(speedup, m, f"ro_naive_beats_eager_{case}", case, "reduce-overhead, naive (y = f(x))",
                                subject=f"{g}: reduce-overhead, called as y = f(x)")
        return claims
    return build


@covers(r"(, phase 2$|^MLP )", r"^(ro_static_beats_eager|compiled_graph_slower_mlp|ro_beats_eager_mlp|ro_beats_compile_mlp|"
        r"ro_beats_eager_training|kit_beats_ro_training)")
def reduce_overhead_in_use(m) -> list:
    """Notebook 03, phase 2: ``reduce-overhead`` as documented (marks, a static input) on each GELU case; on the
    deeper MLP a graph of eager's kernels against one of the compiled forward's, ``reduce-overhead`` against eager
    and against default ``torch.compile``; on its training step ``reduce-overhead`` against eager and the kit's
    whole-step graph against ``reduce-overhead``."""
    cases = list(dict.fromkeys(m.table.case))
    claims = []
    for case in [c for c in cases if c.endswith(", phase 2")]:
        base = case.split(",")[0]
        claims += _if_timed(speedup, m, f"ro_static_beats_eager_{base}", case, "reduce-overhead, static input",
                            subject=f"{base} GELU: reduce-overhead with mark_step_begin and a static input")
    mlp = next((c for c in cases if c.startswith("MLP") and not c.endswith("training step")), None)
    train = next((c for c in cases if c.endswith("training step")), None)
    if mlp is not None:
        layers = re.match(r"MLP (\d+)x", mlp).group(1) + "-layer MLP"
        claims += _if_timed(versus, m, "compiled_graph_slower_mlp", (mlp, "cuda graph" + IP),
                            (mlp, "torch.compile + graph" + IP), subject=f"{layers}: a graph of eager's kernels",
                            than="a graph of the compiled forward's kernels", above=1.25)
        claims += _if_timed(speedup, m, "ro_beats_eager_mlp", mlp, RO_MARK,
                            subject=f"{layers} forward: reduce-overhead (with marks)")
        claims += _if_timed(versus, m, "ro_beats_compile_mlp", (mlp, RO_MARK), (mlp, "torch.compile"),
                            subject=f"{layers} forward: reduce-overhead", than="default torch.compile")
        if train is not None:
            claims += _if_timed(speedup, m, "ro_beats_eager_training", train, TRAIN_RO,
                                subject=f"{layers} SGD training step: reduce-overhead (forward and backward graphs, "
                                        "optimizer eager)")
            claims += _if_timed(versus, m, "kit_beats_ro_training", (train, TRAIN_KIT), (train, TRAIN_RO),
                                subject=f"{layers} SGD training step: the kit's whole-step graph (optimizer included)",
                                than="reduce-overhead")
    return claims


# notebook 04's variants
GRAPH_INFER = "cuda graph (with input copy)"
GRAPH_TRAIN = "whole-step graph"


def tag(name: str) -> str:
    """A name as part of a claim id: 'fp16+GradScaler' -> 'fp16gradscaler', 'SGD momentum' -> 'sgdmomentum'."""
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def resnet_inference(pays: float):
    """Notebook 04, section 1, cases ``"inference <dtype> bs<b>"``: at each batch, whether the graph pays (its
    speedup interval above ``pays``), and per dtype from which batch on it stops paying. Returns the verdicts
    function ``measure`` takes."""
    @covers(r"^inference .+ bs\d+$", r"^infer_")
    def build(m) -> list:
        parsed = [(c, *re.match(r"inference (.+) bs(\d+)$", c).groups()) for c in dict.fromkeys(m.table.case)]
        claims = []
        for dname in dict.fromkeys(d for _, d, _ in parsed):
            batches = sorted((int(b), c) for c, d, b in parsed if d == dname)
            points = []
            for b, case in batches:
                claims.append(speedup(m, f"infer_{tag(dname)}_bs{b}_graph_pays", case, GRAPH_INFER,
                                      subject=f"{dname} batch {b}: the graph", above=pays))
                points.append((b, *m.interval(case, GRAPH_INFER)))
            fallback = any(ran_eagerly(m.table[m.table.case.isin([c for _, c in batches])]))
            claims.append(stops_paying(f"infer_{tag(dname)}_pays_at_large_batches", points, pays,
                                       f"the {dname} inference graph", " images per batch", eager_fallback=fallback))
        return claims
    return build


def resnet_training(pays: float, optimizers: dict):
    """Notebook 04, section 2, cases ``"train <amp> bs<b>, <optimizer label>"`` (``optimizers``: name -> label):
    whether each whole-step graph pays against eager, and, where both ran, whether the bf16 graph beats the
    fp16 + GradScaler graph at a batch size. Returns the verdicts function."""
    name_of = {label: name for name, label in optimizers.items()}

    @covers(r"^train .+ bs\d+, ", r"^train_")
    def build(m) -> list:
        parsed = [(c, *re.match(r"train (.+) bs(\d+), (.+)$", c).groups()) for c in dict.fromkeys(m.table.case)]
        claims = [speedup(m, f"train_{tag(amp)}_bs{b}_{tag(name_of[label])}_graph_pays", case, GRAPH_TRAIN,
                          subject=f"training {amp} batch {b}, {name_of[label]}: the graph", above=pays)
                  for case, amp, b, label in parsed]
        cases = {(amp, b, label) for _, amp, b, label in parsed}
        for _, amp, b, label in parsed:
            if amp == "bf16" and ("fp16+GradScaler", b, label) in cases:
                bf16, fp16 = (f"train {a} bs{b}, {label}" for a in ("bf16", "fp16+GradScaler"))
                claims.append(versus(m, f"train_bs{b}_{tag(name_of[label])}_graph_bf16_faster", (bf16, GRAPH_TRAIN),
                                     (fp16, GRAPH_TRAIN), subject=f"training batch {b}, {name_of[label]}: the bf16 graph",
                                     than="the fp16 + GradScaler graph"))
        return claims
    return build


# notebook 05: the memory of shared pools, advise's predictions against the measured speedups
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

    from ...advice import expected_effect

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


# notebook 06: the bucket strategies' labels and the stream comparison
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


SHORT = {"MLP": "mlp", "transformer block": "block"}   # model names in claim ids
_STREAM_CLAIMS = (r"^(mlp|block)_(default_ladder_beats_(eager|single_bucket|reduce_overhead|reduce_overhead_dynamic)|"
                  r"single_bucket_beats_eager|planned_beats_default_ladder|reduce_overhead(_dynamic)?_beats_eager)$")


@covers(r"^(MLP|transformer block)$", _STREAM_CLAIMS)
def stream_verdicts(m) -> list:
    """The stream comparison's claims, per model: the default ladder and a single bucket against eager and against
    each other, the planned buckets against the default ladder, and (where they ran) both reduce-overhead variants
    against eager and against the default ladder. Against eager: the speedup's interval; two variants: the ratio
    of their median passes, window by window."""
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


# notebook 08: the decode step and whole generations
def as_ran_label(variant: str, executed_as) -> str:
    """A label true to what ran: one that promises compiled graphs ("... (compiled...)") on a row whose
    ``executed_as`` is "eager" (no CUDA graph launched: a compile that fell back, a recorded run before a fix) reads
    "<label without the promise> (ran eagerly)"; any other label stays as it is."""
    variant = str(variant)
    if " (compiled" in variant and str(executed_as) == "eager":
        return variant.split(" (compiled")[0] + " (ran eagerly)"
    return variant


def as_ran(m, case: str, variant: str) -> str:
    """``variant`` of ``case`` in a sentence, named by ``as_ran_label`` from its row's ``executed_as``."""
    return as_ran_label(variant, m.row(case, variant).get("executed_as", ""))


@covers(r"^(decode step, batch \d+|prefill, .+)$", r"^(step_|prefill_graph_saves_10pct$|decode_gains_more_than_prefill$)")
def step_claims(m, step_case: dict, step_cases: dict, floors: dict, prefill_case: str, kit: str, fused: str,
                eager_fallback: bool) -> list:
    """Section 7's verdicts from its ``Measured`` ``m``: per batch (``step_case``: {batch: case}; ``step_cases``: {case:
    (timed variants, inputs)}) the kit's graph (``kit``) against eager, ``reduce-overhead`` against the kit's graph,
    the compiled step captured by the kit (``fused``) against ``reduce-overhead`` (the aim: more than 5% faster),
    eager against twice the floor (``floors``: {batch: GPU-busy µs}); then the graph against eager on prefill (the
    aim: more than 10% faster), and the graph's speedup on a decode step at the largest batch against prefill's."""
    out = []
    for b, case in step_case.items():
        timed = step_cases[case][0]
        out.append(speedup(m, f"step_graph_beats_eager_b{b}", case, kit))
        for cid, fast, slow, above in ((f"step_reduce_overhead_beats_graph_b{b}", "reduce-overhead", kit, 1.0),
                                       (f"step_fused_graph_beats_reduce_overhead_b{b}", fused, "reduce-overhead", 1.05)):
            if {fast, slow} <= set(timed):
                out.append(versus(m, cid, (case, fast), (case, slow), above=above))
        if b in floors:
            out.append(host_bound(m, f"step_eager_host_bound_b{b}", case, floors[b]))
    out.append(speedup(m, "prefill_graph_saves_10pct", prefill_case, "graph", above=1.10))
    b = max(step_case)
    out.append(decode_vs_prefill(m, "decode_gains_more_than_prefill", (step_case[b], kit), (prefill_case, "graph"),
                                 f"a decode step at batch {b}", eager_fallback=eager_fallback))
    return out


@covers(r"^generate, batch \d+$", r"^generate_")
def generation_claims(m, gen_case: dict, gen_cases: dict, kit: str, hf_static: str, hf_dynamic: str) -> list:
    """Section 8's verdicts from its ``Measured`` ``m``, per batch (``gen_case``: {batch: case}): the kit's graphs
    (``kit``) against eager, ``reduce-overhead`` against the kit's graphs, the kit's graphs against ``transformers``'
    static-cache ``generate``, and that against its dynamic cache; each only where both variants were timed. A
    sentence names each variant as it ran (``as_ran``): a static-cache ``generate`` labelled compiled that ran
    eagerly is called so."""
    out = []
    for b, case in gen_case.items():
        timed = gen_cases[case][0]
        out.append(speedup(m, f"generate_graphs_beat_eager_b{b}", case, kit))
        for cid, fast, slow in ((f"generate_reduce_overhead_beats_graphs_b{b}", "reduce-overhead", kit),
                                (f"generate_graphs_beat_hf_static_b{b}", kit, hf_static),
                                (f"generate_hf_static_beats_hf_dynamic_b{b}", hf_static, hf_dynamic)):
            if {fast, slow} <= set(timed):
                out.append(versus(m, cid, (case, fast), (case, slow), subject=f"{case}: {as_ran(m, case, fast)}",
                                  than=as_ran(m, case, slow)))
    return out
