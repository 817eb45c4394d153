"""Render every number the README and docs/RESULTS.md show from the recorded runs in figures/ (never typed).

- README.md: the "start here" table (each notebook's time from figures/reproduce_times*.json, its Colab badge at
  the ref the setup cell clones) and the headline numbers, between their markers;
- docs/RESULTS.md: all results, between the results markers.

    python scripts/update_readme.py --write  # rewrite both files between their markers
    python scripts/update_readme.py --check  # exit 1 if either is stale (the tests run this)
"""
import argparse
import json
import re
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite README.md and docs/RESULTS.md between markers")
    mode.add_argument("--check", action="store_true", help="exit 1 if either is stale; write nothing")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before pandas and the course load

import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
README, RESULTS_DOC = ROOT / "README.md", ROOT / "docs" / "RESULTS.md"

from cudagraph_kit.course.measuring import results  # noqa: E402
from cudagraph_kit.course.running import runs  # noqa: E402
from cudagraph_kit.course.measuring.claims import load_claims  # noqa: E402
from cudagraph_kit.course.running.tables import markdown_table  # noqa: E402
from cudagraph_kit.intervals import stops_clearing  # noqa: E402

START, END = "<!-- results:start -->", "<!-- results:end -->"


def _env_caption(env):
    run = f", run {env['run']['id']}" if env.get("run") else ""
    return f"{env.get('gpu')}, PyTorch {env.get('torch')}, {str(env.get('date', ''))[:10]}{run}"


DIRTY_NOTE = ("A run id is the UTC time `reproduce` started and the first 8 hex digits of the git commit it ran "
              "from; `-dirty` at its end means that `cudagraph_kit/`, `notebooks/*.py` or `scripts/` had uncommitted "
              "changes when it started (`cudagraph_kit/course/running/runs.py`), so the commit alone does not name the code "
              "that ran: the code fingerprint in the run's `env.json` (`run.code_sha`) does.")


def dirty_note(envs) -> str:
    """DIRTY_NOTE when one of these runs' ids ends in "-dirty" (``env.json``'s ``run``), else nothing."""
    ids = [str((env or {}).get("run", {}).get("id", "")) for env in envs]
    return DIRTY_NOTE if any(i.endswith("-dirty") for i in ids) else ""


def provenance_paragraph():
    """Which results come from which run (``check-figures``), so that no reader compares across runs unawares."""
    report = runs.check_figures(ROOT / "figures", ROOT / "notebooks")
    if not report.groups:
        return ""
    note = dirty_note({"run": g.run} for g in report.groups if g.run is not None)
    if report.one_run:
        head = (f"**Where these results come from.** Every notebook's result below comes from one `reproduce` run"
                + (f"; {len(report.apart)} group(s) of results were recorded apart from it, each by a script of its "
                   "own, and each is shown with its own GPU and date; compare numbers within a group, not across "
                   "(`python -m cudagraph_kit check-figures` lists them):" if report.apart else ":"))
    else:
        head = (f"**Where these results come from.** The notebooks' results below come from {len(report.groups)} "
                "groups of GPU runs" + (f", and {len(report.apart)} group(s) were recorded apart, each by a script "
                                        "of its own" if report.apart else "")
                + " (`python -m cudagraph_kit check-figures` lists them); compare numbers within a group, not across:")
    lines = [head, ""]
    lines += [f"- {g.label}: {', '.join(f'`{f}`' for f in g.folders)}" for g in report.groups]
    lines += [f"- notebook and results differ: {m}" for m in report.mismatched]
    lines += [f"- recorded apart, {g.label}: {', '.join(f'`{f}`' for f in g.folders)}" for g in report.apart]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _row(df, case, variant_prefix):
    sel = df[(df.case == case) & df.variant.str.startswith(variant_prefix)]
    return sel.iloc[0] if len(sel) else None


def claims_block(rec, stem):
    """The verdicts a notebook computed and saved to figures/<stem>/claims.csv, as README lines (none if the
    recorded run saved no claims). The README states no comparison of its own: it quotes these."""
    claims = load_claims(rec.dir)
    if claims is None or not len(claims):
        return []
    counts = sorted({int(w) for w in rec.df.windows.dropna()}) if "windows" in rec.df else []
    windows = (f", {counts[0]} windows" if len(counts) == 1 else f", {counts[0]}-{counts[-1]} windows" if counts
               else "")
    return ["", f"Verdicts the notebook computed from its 90% prediction intervals (`figures/{stem}/claims.csv`"
            f"{windows}). Each line is the sentence the notebook printed; the claim's name states what was tested, "
            "and its verdict is `holds`, `fails` or `unclear` (the interval straddles the threshold):", ""] + [f"- {c.statement} (claim `{c.claim}`: {c.verdict})" for c in claims.itertuples()]


def _speedup(r):
    """A row's speedup, with its interval when the run published one."""
    lo, hi = getattr(r, "speedup_lo", None), getattr(r, "speedup_hi", None)
    if r.speedup == 1.0 or lo is None or lo != lo or hi != hi:
        return f"{r.speedup:.2f}x"
    return f"{r.speedup:.2f}x ({lo:.2f}-{hi:.2f})"


def slow_first_windows(df):
    """Graph rows whose first timing window's speedup lies under 0.8x the lowest of the later windows':
    [(row, [speedup per window])]. Read from window_speedups (none in an older run without windows)."""
    if "window_speedups" not in df:
        return []
    slow = []
    for r in df[df.window_speedups.notna() & (df.variant != "eager")].itertuples():
        v = [float(x) for x in str(r.window_speedups).split(";")]
        if len(v) >= 3 and v[0] < 0.8 * min(v[1:]):
            slow.append((r, v))
    return slow


def _windows_text(rows):
    return "; ".join(f"{r.case}, {r.variant} ({'; '.join(f'{x:.2f}x' for x in v)})" for r, v in rows)


def _plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def first_window_note(df):
    """Rows whose first timing window ran far slower: said plainly, since such a window alone can make an interval
    wide, with the cause the probe found and what the reruns with the fix show."""
    slow = slow_first_windows(df)
    if not slow:
        return []
    return ["", f"In {_plural(len(slow), 'row')} the first window's speedup lies far below the later windows' "
            f"(under 0.8x their lowest), which alone widens the interval: {_windows_text(slow)}."
            + first_window_cause() + fixed_rerun_note(slow)]


def first_window_cause():
    """What scripts/probes/probe_first_window.py recorded: window 1 against later windows, kit before and after the
    fix."""
    path = ROOT / "figures" / "first_window" / "first_window.csv"
    if not path.is_file():
        return ""
    graph = pd.read_csv(path).query("variant == 'whole-step graph'")

    def span(values, fmt):
        lo, hi = fmt.format(values.min()), fmt.format(values.max())
        return lo if lo == hi else f"{lo}-{hi}"

    def window(kit, first):
        sel = graph[(graph.kit == kit) & ((graph.window == 1) if first else (graph.window > 1))]
        calls = span(sel.calls_per_sample, "{}")
        return f"{calls} {'call' if calls == '1' else 'calls'} per sample ({span(sel.median_us, '{:.0f}')} µs per step)"

    processes = graph[graph.window == 1].groupby("kit").size().min()
    return (f" The cause, found by `scripts/probes/probe_first_window.py` ({graph.gpu.iloc[0]}, {processes} "
            f"processes per kit version): the step captures its graph during the first window's warm-up, and the call that "
            f"captures takes {span(graph.capture_call_ms, '{:.0f}')} ms; the kit read the calls per sample from the "
            f"batch that held it. Window 1 timed {window('before', True)}, later windows {window('before', False)}. "
            f"The kit now times further batches until two agree: window 1 then took {window('fixed', True)}, later "
            f"windows {window('fixed', False)}. The recorded run above predates the fix.")


def fixed_rerun_note(slow):
    """The rows the first window widened: their recorded intervals beside two reruns of 02 with the fix, and which
    rows still have a slow first window there."""
    folder = ROOT / "figures" / "rerun" / "02-calibration-fix-h200"
    reruns = {run: pd.read_csv(folder / run / "02_train_step" / "results.csv") for run in ("run-a", "run-b")
              if (folder / run / "02_train_step" / "results.csv").is_file()}
    if not reruns:
        return ""
    pairs = []
    for r, _ in slow:
        fixed = [df[(df.case == r.case) & (df.variant == r.variant)] for df in reruns.values()]
        if all(len(f) for f in fixed):
            pairs.append(f"{r.case}, {r.variant}: {r.speedup_lo:.2f}-{r.speedup_hi:.2f}x recorded, "
                         + " and ".join(f"{f.iloc[0].speedup_lo:.2f}-{f.iloc[0].speedup_hi:.2f}x" for f in fixed))
    still = {run: slow_first_windows(df) for run, df in reruns.items()}
    left = "; ".join(f"{run}: {_windows_text(rows) if rows else 'none'}" for run, rows in still.items())
    return (f" The {_plural(len(pairs), 'row')}' 90% intervals, recorded and in {_plural(len(reruns), 'rerun')} of "
            f"notebook 02 with the fix (`{folder.relative_to(ROOT)}`, same GPU kind): " + "; ".join(pairs)
            + f". Rows with a first window under 0.8x the others' in those reruns: {left}.")


def _rerun_table(df):
    """rerun_report's per-notebook comparison as a markdown table (a notebook without claims shows dashes)."""
    header = [c for c in ["notebook", "speedups", "inside", "eager_moved", "graph_moved", "claims", "kept",
                          "definite_a", "definite_b", "opposite"] if c in df]

    def cell(column, value):
        if value != value:  # NaN: that notebook saved no claims in one of the runs
            return "-"
        if column.endswith("moved"):
            return f"{value:.2f}"
        return str(int(value)) if isinstance(value, float) else str(value)
    return markdown_table(header, ([cell(c, v) for c, v in zip(header, r)] for r in df[header].itertuples(index=False)))


def _and(items):
    """["01", "02", "08"] -> "01, 02 and 08"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# (second run's code, recorded run's code) whose difference `git diff` showed to touch nothing that is timed
UNTIMED_CODE_DIFFS = {("0e18fa48ed0d", "69f3bd16baa0"), ("ae5316e32209", "69f3bd16baa0")}


def rerun_paragraph():
    """How well a second full run landed on the recorded one, and two runs of 02 with the calibration fix against
    the same pair without it (scripts/rerun_report.py); rendered from the recorded folders."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import rerun_report

    second = ROOT / "figures" / "rerun" / "h200-2026-11-29-run-b"
    df = rerun_report.compare_runs(ROOT / "figures", second)
    if df.empty:
        return ""
    envs = {n: results.load(n, root=second).env for n in df.notebook}
    by_run = {}
    for n, env in envs.items():
        by_run.setdefault((env.get("run") or {}).get("id", "not recorded"), []).append(n[:2])
    runs = "; ".join(f"run {rid}" + (f" for {_and(names)}" if len(by_run) > 1 else "") for rid, names in by_run.items())
    gpu = next(iter(envs.values())).get("gpu")
    names = ", ".join(n[:2] for n in df.notebook)
    first = results.load(df.notebook.iloc[0], root=ROOT / "figures").env.get("run") or {}
    recorded, ids = str(first.get("id") or ""), [str(i) for i in by_run]   # run ids start with their UTC time
    when = ("before the recorded one" if recorded and all(i < recorded for i in ids)
            else "after the recorded one" if recorded and all(i > recorded for i in ids)
            else "apart from the recorded one")
    lines = [f"**Does a second run land inside the intervals below?** A second `reproduce` of notebooks {names} "
             f"on the same GPU kind, in processes of its own {when} ({runs}; {gpu}, in "
             f"`{second.relative_to(ROOT)}`; "
             f"`python scripts/rerun_report.py figures "
             f"{second.relative_to(ROOT)}`): {rerun_report.summary(df)}.", ""] + _rerun_table(df) + [
             "", "`inside`: the second run's speedups inside the first run's intervals; `kept`: claims with the same "
             "verdict in both runs; `definite_a`/`_b`: claims that hold or fail (not unclear) in each run; "
             "`opposite`: holds in one run, fails in the other; `eager_moved` and `graph_moved`: the median factor "
             "by which the second run's eager and graph times differ from the first's.", ""]
    code = first.get("code_sha")
    codes = sorted(map(str, {(env.get("run") or {}).get("code_sha") for env in envs.values()} - {code}))
    if codes:
        untimed = all((c, code) in UNTIMED_CODE_DIFFS for c in codes)
        lines[0] += (f" The second run's code ({_and(codes)}) differs from the recorded run's ({code})"
                     + (" only in what the notebooks print and draw (takeaway wording, verdict decimals, 08's figure "
                        "legends) and in one wait for the capture stream after each capture; what is timed is the "
                        "same." if untimed else "; `git diff` between their commits shows how."))
    note = dirty_note(envs.values())
    if note:
        lines[0] += " " + note
    fix = ROOT / "figures" / "rerun" / "02-calibration-fix-h200"
    pair = rerun_report.compare_runs(fix / "run-a", fix / "run-b", notebooks=["02_train_step"])
    if not pair.empty:
        lines += [f"Notebook 02 was also run twice on an H200 with the kit's calibration fix (the first-window note "
                  f"under notebook 02 explains it; `{fix.relative_to(ROOT)}`):", ""]
        lines += _rerun_table(pair.assign(notebook="02, two H200 runs with the fix")) + [""]
    return "\n".join(lines)


def spread_label(df):
    """What speedup_lo..speedup_hi are in a recorded table: a prediction interval over windows, or (older runs)
    one window's quartiles."""
    return "90% prediction interval" if "windows" in df else "quartiles of one window"


def stops_paying_sentence(df):
    """Where the sweep's graph stops saving more than 10%, read from verdicts on its prediction intervals
    (``intervals.stops_clearing``): the smallest size from which every interval lies at or below 1.10x, and the
    size before it if its interval straddles 1.10x (no verdict either way)."""
    sweep = df[df.case.str.startswith("sweep") & df.variant.str.startswith("graph")].set_index("numel")
    where = stops_clearing(zip(sweep.index, sweep.speedup_lo, sweep.speedup_hi), above=1.10)
    if where["from"] is None:
        return "Across the sweep the graph never clearly saves 10% or less (no interval lies at or below 1.10x)."
    text = (f"The graph saves at most 10% over eager (its whole 90% interval at or below 1.10x) from "
            f"{where['from'] / 1e6:.1f} M elements on this GPU")
    if where["unclear_before"] is not None:
        r = sweep.loc[where["unclear_before"]]
        text += (f"; at {where['unclear_before'] / 1e6:.1f} M the interval ({r.speedup_lo:.2f}-{r.speedup_hi:.2f}x) "
                 "straddles 1.10x, so no clear verdict there")
    return text + "."


def gelu_section():
    rec = results.load("01_gelu")
    if rec is None:
        return "_Notebook 01 has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    k80 = {"small": (70.9, 64.9, 1.09), "large": (1320, 1340, 0.99)}
    shapes = {"small": "(1,3,224,224) small", "large": "(32,3,224,224) large"}
    gpu = env.get("gpu", "GPU").replace("NVIDIA ", "")
    rows = []
    for case in ("small", "large"):
        e, g = _row(df, case, "eager"), _row(df, case, "graph replay")
        ke, kg, ks = k80[case]
        rows.append([shapes[case], f"{ke:g} µs", f"{kg:g} µs", f"{ks:.2f}x", f"{e.median_us:.1f} µs",
                     f"{g.median_us:.1f} µs", f"{g.speedup:.2f}x ({g.speedup_lo:.2f}-{g.speedup_hi:.2f})",
                     f"{g.floor_us:.1f} µs"])
    lines = [f"**GELU, eager vs CUDA graph** (notebook 01; {_env_caption(env)}), next to the published Tesla K80 "
             "figures (PyTorch 1.10):", "",
             *markdown_table(["tensor", "K80 eager", "K80 graph", "K80 speedup", f"{gpu} eager", f"{gpu} graph",
                              f"{gpu} speedup (90% prediction interval)", f"{gpu} floor"], rows)]
    lines += claims_block(rec, "01_gelu")
    amort = df[df.calls_per_graph >= 10] if "calls_per_graph" in df else df.iloc[0:0]
    lines += ["", stops_paying_sentence(df)]
    if len(amort):
        best = amort.sort_values("vs_floor").iloc[0]
        lines.append(f"With {int(best.calls_per_graph)} calls captured per graph the small GELU runs at "
                     f"{best.median_us:.1f} µs per call, {best.vs_floor:.2f}x its floor.")
    lines += ["", f"![GELU size sweep on {env.get('gpu')}](figures/01_gelu/size_sweep.png)", ""]
    return "\n".join(lines)


def train_step_section():
    rec = results.load("02_train_step")
    if rec is None:
        return "_Notebook 02 has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    timed = df[df.median_us.notna()]
    rows = []
    for case in timed.case.unique():
        e, g, p = (_row(timed, case, v) for v in ("eager", "whole-step graph", "make_graphed_callables"))
        if e is None or g is None:  # other timed tables of the notebook (e.g. the parts of an eager step)
            continue
        part = f"{p.median_us:.0f} µs ({p.speedup:.2f}x)" if p is not None else "-"
        rows.append([case, f"{e.median_us:.0f} µs", f"{g.median_us:.0f} µs", _speedup(g),
                     "-" if g.vs_floor != g.vs_floor else f"{g.vs_floor:.2f}", part])
    lines = [f"**Training step, eager vs whole-step graph vs `make_graphed_callables`** (notebook 02; "
             f"{_env_caption(env)}). The blog measured 2.36x for the small MLP + SGD on a K80.", "",
             *markdown_table(["case", "eager", "whole-step graph", f"speedup ({spread_label(df)})", "graph / floor",
                              "make_graphed_callables (model only)"], rows)]
    parity = df[df.case.str.startswith("parity")]
    if len(parity) and "max_abs_param_diff" in parity:
        exact = "; ".join(f"{c.replace('parity ', '')}: {'bitwise equal' if b else f'max diff {d:.1e}'}"
                          for c, b, d in zip(parity.case, parity.params_bitwise_equal, parity.max_abs_param_diff))
        lines += ["", "A dash in graph / floor: in this run the kit gave no floor for a step that launched any kernel "
                  "outside its graph. For the dropout MLPs those were PyTorch's own two RNG-state fills before each "
                  "replay (`eager_kernels_per_call` = 2 in the CSV), which the kit now counts as part of the replay; "
                  "for fp16 the GradScaler's eager update."]
        lines += ["", f"Parameters after the parity runs, graph vs eager from the same seed: {exact}."]
    lines += first_window_note(timed)
    lines += claims_block(rec, "02_train_step")
    lines += ["", f"![Loss curves, eager vs graphed, on {env.get('gpu')}](figures/02_train_step/loss_curves.png)", ""]
    return "\n".join(lines)


def jit_compile_section():
    rec = results.load("03_jit_compile")
    if rec is None:
        return "_Notebook 03 has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    lines = [f"**Fusion and graphs: `jit.script`, `torch.compile`, `reduce-overhead`** (notebook 03; "
             f"{_env_caption(env)}), time per call and speedup over eager ({spread_label(df)}); K80 figures from the "
             "blog:", ""]
    k80 = {"eager": ("70.9 µs", "1320 µs"), "cuda graph, input in place": ("64.9 µs (1.09x)", "1340 µs (0.99x)"),
           "jit.script": ("38.9 µs (1.82x)", "425 µs (3.11x)"),
           "jit.script + graph, input in place": ("35.6 µs (1.99x)", "374 µs (3.53x)")}
    order = ["eager", "cuda graph, input in place", "jit.script", "jit.script + graph, input in place",
             "torch.compile", "torch.compile + graph, input in place", "reduce-overhead, naive"]
    rows = []
    for v in order:
        cells = []
        for case in ("small", "large"):
            r = _row(df, case, v)
            cells.append("-" if r is None else f"{r.median_us:.1f} µs ({_speedup(r)})")
        ks, kl = k80.get(v, ("-", "-"))
        rows.append([v, ks, cells[0], kl, cells[1]])
    lines += markdown_table(["variant", "K80 small", "small", "K80 large", "large"], rows)
    lines += claims_block(rec, "03_jit_compile")
    lines += ["", "\"Input in place\" replays on data already in the graph's static input; copying a new input in "
              "costs one more launch (notebook 03 shows both).", ""]
    return "\n".join(lines)


OVERHEAD_CASES = {"mlp48": "48 `Linear(64, 64)` layers", "llama": "HF Llama decode step, 12 layers",
                  "after_module_mlp48": "48 layers, first call after an unrelated module is built",
                  "after_module_llama": "Llama step, first call after an unrelated module is built"}
OVERHEAD_VARIANTS = [("hand_written", "hand-written `copy_` + `replay()`"), ("kit", "kit `g(x)`, guard on (default)"),
                     ("kit_weights_fixed", "kit in `weights_fixed` (a block per burst)"),
                     ("kit_check_off", "kit, `check_weights=False`"), ("kit_before_change", "kit before this change"),
                     ("reduce_overhead", "`reduce-overhead`")]


def _overhead_cell(df, case, variant):
    sel = df[(df.case == case) & (df.variant == variant)]
    if not len(sel):
        return "-"
    r = sel.iloc[0]
    if r.median_us != r.median_us:   # NaN: the variant failed (results.csv's status says why)
        return "-"
    return f"{r.median_us:.1f} µs" + ("" if variant == "hand_written" else f" ({r.minus_hand_written_median_us:+.1f})")


def _checks(rec) -> dict:
    import pandas as pd
    path = rec.dir / "checks.csv"
    return {r.case: r for r in pd.read_csv(path).itertuples()} if path.is_file() else {}


def overhead_section():
    rec = results.load("00_overhead")
    if rec is None or "minus_hand_written_median_us" not in rec.df.columns:
        return ""
    df, checks = rec.df, _checks(rec)
    lines = [f"**What the kit costs** (`scripts/bench_overhead.py`; {_env_caption(rec.env)}): host time per call, "
             f"without synchronization, median of {rec.env.get('rounds')} interleaved bursts of "
             f"{rec.env.get('calls_per_burst')} calls; in brackets the median difference to the hand-written replay in "
             "the same round.", ""]
    rows = [[name + (f" (reads {checks[case].tensors} tensors)" if case in checks else ""),
             *(_overhead_cell(df, case, v) for v, _ in OVERHEAD_VARIANTS)] for case, name in OVERHEAD_CASES.items()]
    one_graph = rec.env.get("kit_variants_share_one_graph")   # else kit_check_off replayed a graph of its own
    lines += markdown_table(["model", *(("kit without a guard, same graph" if v == "kit_check_off" and one_graph
                                         else name) for v, name in OVERHEAD_VARIANTS)], rows)
    parts = [f"{OVERHEAD_CASES[c]}: {checks[c].check_us:.1f} µs for {checks[c].tensors} tensors, of which the part "
             f"every call runs {checks[c].per_call_part_us:.1f} µs and a full check {checks[c].full_check_us:.0f} µs "
             f"every {checks[c].full_check_every:.0f} calls" for c in OVERHEAD_CASES if c in checks
             and getattr(checks[c], "per_call_part_us", float("nan")) == getattr(checks[c], "per_call_part_us", 0)]
    if parts:
        from cudagraph_kit.guard import FULL_CHECK_EVERY
        recorded = {int(checks[c].full_check_every) for c in OVERHEAD_CASES if c in checks
                    and checks[c].full_check_every == checks[c].full_check_every}
        lines += ["", "The guard's check alone, nothing launched: " + "; ".join(parts) + "."
                  + (f" The kit now runs a full check every {FULL_CHECK_EVERY} calls; this run predates that change."
                     if recorded and recorded != {FULL_CHECK_EVERY} else "")]
    if "minus_hand_written_mean_us" in df.columns:
        means = "; ".join(f"{OVERHEAD_CASES[c]}: kit {r.minus_hand_written_mean_us:+.1f} µs" for c in ("mlp48", "llama")
                          for r in df[(df.case == c) & (df.variant == "kit")].itertuples())
        lines += ["", "A bracket is the median over the rounds: a round whose burst held one of the guard's scheduled "
                  f"full checks costs more, and the mean carries them ({means})."
                  + (" In this run the kit and the kit in `weights_fixed` shared one guard, so the full checks fell in "
                     "either one's bursts; the benchmark now gives each its own."
                     if rec.env.get("kit_and_weights_fixed_share_one_guard") else "")]
    if "after_module_mlp48" in set(df.case):
        lines += ["", f"The first-call rows time one call right after an unrelated `nn.Linear(2, 2)` is built, "
                  f"{rec.env.get('after_module_rounds')} times per variant; the build is inside every variant's time "
                  "(so the bracket, a difference of medians, is what the variant adds)."]
    now, before = checks.get("train_step_checks_now"), checks.get("train_step_checks_before_change")
    if now is not None and before is not None:
        lines.append(f"A whole-step graph's checks before each replay (Adam, {now.tensors} parameters): "
                     f"{now.check_us:.0f} µs, {before.check_us:.0f} µs before this change.")
    return "\n".join(lines) + "\n"


def resnet_section():
    rec = results.load("04_resnet50")
    if rec is None:
        return "_Notebook 04 has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    inf = df[df.section == "inference"]
    lines = [f"**ResNet-50 inference, eager vs CUDA graph with the input copy** (notebook 04; {_env_caption(env)}), "
             "channels_last, random weights, time per batch; the published V100 figures (MXNet PR) were +17% at "
             "batch 1 and +0.3% at batch 128:", ""]
    rows = []
    for (dtype, batch), g in inf.groupby(["dtype", "batch"], sort=False):
        e, c = g[g.variant == "eager"], g[g.variant != "eager"]
        if len(e) and len(c):
            c = c.iloc[0]
            rows.append([dtype, int(batch), f"{e.median_us.iloc[0] / 1e3:.2f} ms", f"{c.median_us / 1e3:.2f} ms",
                         f"{c.speedup:.2f}x ({c.speedup_lo:.2f}-{c.speedup_hi:.2f})", f"{c.vs_floor:.2f}"])
    lines += markdown_table(["dtype", "batch", "eager", "graph", f"speedup ({spread_label(df)})", "graph / floor"],
                            rows)
    train = df[(df.section == "training") & df.median_us.notna()]
    if len(train):
        lines += ["", "Whole training step (`capture_train_step`), synthetic data; the pytorch/benchmark V100 fp32 "
                  "figure was 1.77x at batch 1 and no gain from batch 8:", ""]
        rows = []
        for case, g in train.groupby("case", sort=False):
            e, c = g[g.variant == "eager"], g[g.variant != "eager"]
            if len(e) and len(c):
                c = c.iloc[0]
                rows.append([case, f"{e.median_us.iloc[0] / 1e3:.1f} ms", f"{c.median_us / 1e3:.1f} ms",
                             f"{c.speedup:.2f}x ({c.speedup_lo:.2f}-{c.speedup_hi:.2f})", f"{c.images_per_s:,.0f}"])
        lines += markdown_table(["case", "eager", "graph", f"speedup ({spread_label(df)})", "images/s, graph"], rows)
    lines += claims_block(rec, "04_resnet50")
    lines += ["", f"![ResNet-50 inference sweep on {env.get('gpu')}](figures/04_resnet50/inference_sweep.png)", ""]
    return "\n".join(lines)


def buckets_section():
    rec = results.load("06_variable_shapes")
    if rec is None:
        return "_Notebook 06 has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    main = df[df.requests.notna() & df.p50_us.notna()] if "requests" in df else df.iloc[0:0]
    lines = [f"**Variable batch sizes: bucketed graphs in one shared pool** (notebook 06; {_env_caption(env)}), a "
             "seeded stream of requests, time per request (speedup over eager with its "
             f"{spread_label(df)}; p99 latency: one pass, no interval), memory the graphs hold:", "",
             *markdown_table(["model", "variant", "graphs", "µs per request", "speedup", "p99 latency", "held"],
                             ([r.case, r.variant, "-" if r.graphs != r.graphs else f"{int(r.graphs)}",
                               f"{r.us_per_request:.1f}", _speedup(r), f"{r.p99_us:.0f} µs",
                               "-" if r.held_mib != r.held_mib else f"{r.held_mib:.1f} MiB"]
                              for r in main.itertuples()))]
    for ev in env.get("evidence", []):
        if "largest bucket alone" in ev["check"]:
            lines.append("")
            lines.append(f"{ev['model']}: {ev['check']} = {ev['value']:.2f} (target {ev['target']}).")
    for c in env.get("planned_vs_best", []):
        lines.append("")
        lines.append(f"{c['model']}: planned buckets ({c['planned graphs']} graphs) against {c['best fixed ladder']} "
                     f"({c['ladder graphs']} graphs, the fixed ladder with the lowest median), same stream: ladder / "
                     f"planned time {c['ladder / planned time']:.3f} " + (
                         f"(90% prediction interval {c['interval']})" if "interval" in c
                         else f"(quartiles of one window {c['quartiles']})")
                     + f", holding {c['planned held MiB']:.1f} MiB against {c['ladder held MiB']:.1f} MiB.")
    if env.get("graph_trees_pool_mib") is not None:
        lines += ["", f"`reduce-overhead`: the graph trees' one pool, all four compiled variants together: "
                  f"{env['graph_trees_pool_mib']:.0f} MiB (they share it, so no per-variant number; notebook 06, "
                  "'Going further' C)."]
    frag = env.get("allocator_fragmentation") or []
    if frag:
        lines += ["", "Transformer block, shared pool of the default ladder against its largest bucket alone, by "
                  "allocator setting: " + "; ".join(f"`{r['allocator']}` {r['ladder / alone']:.2f}x" for r in frag)
                  + " (the kit leaves `PYTORCH_CUDA_ALLOC_CONF` to you; notebook 06, Appendix A)."]
    lines += claims_block(rec, "06_variable_shapes")
    lines += ["", f"![Bucket spacing trade-off on {env.get('gpu')}](figures/06_variable_shapes/tradeoff.png)", ""]
    return "\n".join(l for l in lines if l is not None)


def llm_decode_section():
    rec = results.load("08_llm_decode")
    if rec is None:
        return "_Notebook 08 (LLM decoding) has no recorded GPU run yet._\n"
    df, env = rec.df, rec.env
    gen = df[df.case.astype(str).str.startswith("generate, batch") & df.median_us.notna()]
    steps = df[df.case.astype(str).str.startswith("decode step, batch") & df.median_us.notna()]
    lines = [f"**LLM decoding with a static KV cache** (notebook 08; {_env_caption(env)}; a "
             f"{env.get('config', {}).get('layers', '?')}-layer LLaMA-style model with random weights, "
             f"{env.get('dtype')}, greedy, {env.get('new_tokens')} tokens after a {env.get('prompt_len')}-token prompt), "
             "whole generations timed round-robin" + (f" in {int(gen.windows.max())} windows" if "windows" in gen else "")
             + f"; time per token and speedup over eager ({spread_label(df)}):", "",
             *markdown_table(["batch", "variant", "runs as", "µs per token", "speedup", "tokens/s",
                              "first call (compile/record)"],
                             ([int(r.batch), r.variant, r.executed_as, f"{r.us_per_token:.0f}", _speedup(r),
                               f"{r.tokens_per_s:,.0f}",
                               "-" if r.first_call_s != r.first_call_s else f"{r.first_call_s:.1f} s"]
                              for r in gen.itertuples()))]
    floors = steps.drop_duplicates("batch")
    if len(floors) and "floor_step_us" in floors:
        lines += ["", "GPU-busy floor of one decode step (the kit's graph replayed, profiler): " + ", ".join(
            f"batch {int(r.batch)}: {r.floor_step_us:.0f} µs" for r in floors.itertuples() if r.floor_step_us == r.floor_step_us)
            + "."]
    serve = df[(df.case == "serving loop") & df.median_us.notna()]
    if len(serve):
        lines += ["", "Serving loop (batch size changing every step): " + "; ".join(
            f"{r.variant}: {r.us_per_step:.0f} µs per step ({_speedup(r)})" for r in serve.itertuples())
            + ". Which strategy is faster than which: the verdicts below."]
    errors = env.get("variant_errors") or {}
    if errors:
        lines += ["", "Variants that failed in that run: " + "; ".join(f"{k}: {v}" for k, v in errors.items()) + "."]
    lines += claims_block(rec, "08_llm_decode")
    lines += ["", f"![LLM decoding on {env.get('gpu')}](figures/08_llm_decode/decode.png)", ""]
    return "\n".join(lines)


def advise_section():
    rec = results.load("05_pitfalls")
    claims = load_claims(rec.dir) if rec is not None else None
    if claims is None:
        return ""
    adv = claims[claims.claim.str.startswith("advise_within_1_5x_")]
    cases = adv[adv.claim != "advise_within_1_5x_all"]
    if cases.empty:
        return ""
    n = {v: int((cases.verdict == v).sum()) for v in ("holds", "fails", "unclear")}
    fitted = int(rec.df.case.astype(str).str.startswith("advise fitted: ").sum())
    windows = int(rec.df.windows.max()) if "windows" in rec.df and rec.df.windows.notna().any() else 1
    text = (f"**Will a graph help? `advise` before capturing** (notebook 05, section 7; {_env_caption(rec.env)}): "
            f"predictions made from the eager function alone, before any capture, against the speedup then measured "
            f"in {windows} windows: within 1.5x over the whole measured interval in {n['holds']} of {len(cases)} "
            f"cases, off by more in {n['fails']}, no clear verdict in {n['unclear']}.")
    overall = adv[adv.claim == "advise_within_1_5x_all"]
    if len(overall):
        text += f" Overall: {overall.statement.iloc[0]} [{overall.verdict.iloc[0]}]."
    words = claims[claims.claim.str.startswith("advise_words_")]
    if len(words):  # did the measured interval go the way advise's words (faster, about as fast, slower) said?
        w = {v: int((words.verdict == v).sum()) for v in ("holds", "fails", "unclear")}
        text += (f" `advise`'s words (faster, about as fast, slower) against the whole measured interval: as they "
                 f"said in {w['holds']} of {len(words)} cases, wrong in {w['fails']}, too close to call in "
                 f"{w['unclear']}.")
        wrong = words[words.verdict == "fails"]
        if len(wrong):
            text += " Wrong: " + "; ".join(wrong.statement) + "."
    if fitted:
        text += (f" The {fitted} rows read from notebooks 01-04 are fitted after the fact (their floor is the timed "
                 "graph's own) and shown apart in the notebook, not counted here.")
    return text + "\n\n![advise vs measured](figures/05_pitfalls/advise.png)\n"


def data_parallel_section():
    rec = results.load("07_data_parallel_sweep")
    if rec is None:
        return "_The data-parallel sweep has no recorded run yet._\n"
    df, env = rec.df, rec.env
    gpus = env.get("gpus_per_rank", {})
    where = f"{len(gpus)} x {next(iter(gpus.values()))}" if gpus else env.get("gpu")
    lines = [f"**Data-parallel training, torchrun + DDP, eager vs whole-step graph** (`scripts/ddp_train.py --sweep`; "
             f"{where}, PyTorch {env.get('torch')}, {str(env.get('date', ''))[:10]}); step time from CUDA events per "
             "rank, jitter as p99 / median step time, and how far the ranks' step times sit apart:", "",
             *markdown_table(["case", "variant", "step (median)", "images/s", "speedup", "p99 / median",
                              "rank-to-rank gap (median)"],
                             ([r.case, r.variant, f"{r.median_us / 1e3:.2f} ms", f"{r.images_per_s:,.0f}",
                               f"{r.throughput_speedup:.2f}x", f"{r.jitter_p99_over_median:.2f}",
                               f"{r.step_rank_diff_median_us:.1f} µs"] for r in df.itertuples()))]
    lines += ["", "![Per-rank step-time distributions](figures/07_data_parallel_sweep/step_time_distributions.png)", ""]
    return "\n".join(lines)


KIT_CALL_ROWS = "kit g(x)"  # cross-check rows of the kit call: its cost is measured by bench_overhead alone


def crosscheck_section():
    """Does the kit's timing (``compare``) agree with a plain loop? The kit call's own cost is not read from this
    table: its g(x) rows time `compare` against a plain loop at different moments of a round, so they mix the
    timing method with the call; ``overhead_section`` (interleaved pairs) is the one figure of what the kit costs."""
    rec = results.load("00_crosscheck")
    if rec is None:
        return ""
    df = rec.df[~rec.df.variant.astype(str).str.startswith(KIT_CALL_ROWS)]
    inside = ((df.ratio >= 0.85) & (df.ratio <= 1.15)).sum()
    left_out = len(rec.df) - len(df)
    lines = [f"**Cross-check: the kit's timing method against plain PyTorch** (`scripts/crosscheck.py`, run by "
             f"`reproduce`; {_env_caption(rec.env)}). Each round times a case with `compare` (profiler and floor "
             "included) and with a hand-written capture and loop (no kit, no profiler), one right after the other; "
             f"`ratio` is the median over {rec.env.get('rounds', 'several')} rounds of each round's kit / plain, "
             "with its quartiles, so it can differ from the ratio of the two medians beside it when rounds drift. "
             f"{inside} of {len(df)} rows lie within 0.85-1.15. `recorded` is the notebook's value from the same "
             "`reproduce` run, minutes earlier."
             + (f" The {left_out} rows of the kit call `g(x)` are left out: what the kit costs is the interleaved "
                "benchmark above, not a comparison of two timing methods." if left_out else ""), "",
             *markdown_table(["case", "variant", "kit", "plain PyTorch", "ratio (quartiles)", "recorded in notebook"],
                             ([r.case, r.variant, f"{r.kit_us:.1f} µs", f"{r.reference_us:.1f} µs",
                               f"{r.ratio:.2f} ({r.ratio_lo:.2f}-{r.ratio_hi:.2f})",
                               "-" if r.recorded_us != r.recorded_us else f"{r.recorded_us:.1f} µs"]
                              for r in df.itertuples()))]
    return "\n".join(lines) + "\n"


def noise_paragraph():
    """How much the numbers move, computed from the recorded CSVs (the README must not assert it by hand)."""
    frames = [(stem, results.load(stem)) for stem in ("01_gelu", "03_jit_compile", "00_crosscheck")]
    eager_small = []
    for stem, rec in frames:
        if rec is None:
            continue
        if frames[0][1] is not None and rec.env.get("gpu") != frames[0][1].env.get("gpu"):
            continue  # only readings of one GPU kind say how much the host moves
        df = rec.df
        col = "kit_us" if stem == "00_crosscheck" else "median_us"
        case = "GELU small" if stem == "00_crosscheck" else "small"
        sel = df[(df.case.astype(str) == case) & (df.variant.astype(str) == "eager")]
        if len(sel):
            eager_small.append((stem, float(sel[col].iloc[0])))
    spreads = []
    for folder in sorted((ROOT / "figures").glob("*/results.csv")):
        rec = results.load(folder.parent.name)
        if rec is not None and "spread_pct" in rec.df:
            spreads += [v for v in rec.df.spread_pct.dropna()]
    if len(eager_small) < 2 or not spreads:
        return drift_paragraph()
    lo, hi = min(v for _, v in eager_small), max(v for _, v in eager_small)
    noisy = sum(v > 10 for v in spreads)
    where = ", ".join(f"{v:.1f} µs ({s})" for s, v in eager_small)
    report = runs.check_figures(ROOT / "figures")
    sources = [report.group_of(stem) for stem, _ in eager_small]
    one_run = all(g is sources[0] for g in sources) and sources[0] is not None and sources[0].run is not None
    when = "in this very run" if one_run else "across the recorded runs named above"
    return (f"How much the host moves, {when}: eager small GELU read {where}, a spread of "
            f"{100 * (hi / lo - 1):.0f}% between moments minutes apart, while graph replays barely move. Within a "
            f"table, {noisy} of {len(spreads)} timed rows have an IQR over 10% of their median (their `note` says "
            "so). Hence every speedup here is the median of per-round ratios, never two medians from different "
            "moments.\n\n" + drift_paragraph())


def drift_paragraph():
    """The drift study (scripts/probes/probe_drift.py), rendered from its recorded summary."""
    drift = results.drift_summary(ROOT / "figures" / "drift")
    if drift is None:
        return ""
    rows = markdown_table(
        ["control", "eager, median of processes", "eager spread (max/min)", "eager 90% PI, one more process",
         "graph replay", "graph spread", "speedup (90% PI)"],
        ([r.control, f"{r.eager_us:.1f} µs", f"{r.eager_spread:.2f}x", f"{r.eager_pi_lo:.1f}-{r.eager_pi_hi:.1f} µs",
          f"{r.graph_us:.2f} µs", f"{r.graph_spread:.2f}x",
          f"{r.speedup:.2f}x ({r.speedup_pi_lo:.2f}-{r.speedup_pi_hi:.2f})"] for r in drift["table"].itertuples()))
    return (f"**Where the drift comes from** (`scripts/probes/probe_drift.py`, {drift['gpu']}, {drift['processes']} "
            f"fresh processes per control): {drift['sentence']}. Notebook 01 shows it; speedups are therefore quoted with "
            "prediction intervals over windows. Per control (`figures/drift/drift_summary.csv`):\n\n"
            + "\n".join(rows) + f"\n\n![Run-to-run drift on {drift['gpu']}](figures/drift/drift.png)\n")


# ------------------------------------------------------------------------------------------------ README blocks
HEADLINE = ("<!-- headline:start -->", "<!-- headline:end -->")
START_HERE = ("<!-- start-here:start -->", "<!-- start-here:end -->")
NOTEBOOKS = {  # title and what each notebook teaches, in one line (prose; every number comes from figures/)
    "01_gelu": ("GELU, small vs large", "capture and replay by hand; when a graph pays and when it stops"),
    "02_train_step": ("training step", "a whole step as one graph vs `make_graphed_callables` vs eager; AMP"),
    "03_jit_compile": ("jit.script / torch.compile", "fusion with graphs; what `reduce-overhead` costs"),
    "04_resnet50": ("ResNet-50", "inference batch sweep; an AMP training step with schedule and clipping"),
    "05_pitfalls": ("pitfalls", "what breaks a graph or makes it silently wrong; `check_capturable`, `verify`"),
    "06_variable_shapes": ("variable shapes", "one graph per batch-size bucket in a shared pool; a planner"),
    "07_data_parallel": ("data parallel", "DDP + torchrun under graphs (two GPUs; otherwise the recorded run)"),
    "08_llm_decode": ("LLM decoding", "a static KV cache; graphs per bucket vs `reduce-overhead` vs transformers"),
}


def _times_records():
    """The non-smoke records of figures/reproduce_times*.json, the recorded run's (reproduce_times.json) first."""
    paths = sorted((ROOT / "figures").glob("reproduce_times*.json"), key=lambda p: (p.name != "reproduce_times.json",
                                                                                      p.name))
    records = [json.loads(p.read_text()) for p in paths]
    return [r for r in records if not r.get("smoke")]


def notebook_time(stem):
    """(seconds, gpu, date) of ``stem`` from the recorded run, else from the newest other record; None if none."""
    records = _times_records()
    main, others = records[:1], sorted(records[1:], key=lambda r: str(r.get("date")), reverse=True)
    for r in main + others:
        if r.get("notebooks", {}).get(stem) is not None:
            return r["notebooks"][stem], r.get("gpu"), str(r.get("date"))[:10]
    return None


def _duration(seconds):
    """As the notebooks' "How long" lines round it: "77 s", "2.9 min"."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


REHEARSAL = ROOT / "figures" / "colab_rehearsal" / "rehearsal.csv"
def _rehearsal_record() -> dict:
    """figures/colab_rehearsal/rehearsal.json ({} where there is none)."""
    path = REHEARSAL.with_name("rehearsal.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def _rehearsal_gpus(runs) -> list[str]:
    """The GPUs the rehearsal's runs name, sorted ("NVIDIA H200")."""
    return sorted({(r.get("gpu") or {}).get("gpu") for r in runs} - {None})


def rehearsal_note() -> str:
    """How the recorded rehearsal ran (GPU, cap), read from figures/colab_rehearsal/rehearsal.json."""
    record = _rehearsal_record()
    runs = record.get("runs", [])
    gpus = _rehearsal_gpus(runs) or ["a GPU"]
    caps = sorted({re.search(r"gpu memory ([\d.]+) GiB", r.get("constraints", "")).group(1) for r in runs
                   if re.search(r"gpu memory ([\d.]+) GiB", r.get("constraints", ""))})
    contexts = sorted({(r.get("gpu") or {}).get("context_mib") for r in runs} - {None})
    cap = (f"PyTorch's allocator capped at {' and '.join(caps)} GiB"
           + (f" (a T4's 15,360 MiB less the CUDA context measured there, {', '.join(map(str, contexts))} MiB)"
              if contexts else "") if caps else "PyTorch's allocator capped")
    gpu = " and ".join(gpus)
    return (f"The rehearsal column ran each notebook at full size on an {gpu} under a Colab runtime's limits: 2 CPU "
            f"cores, {cap}, no bf16, Inductor's compile threads as on 2 cores (`bash scripts/colab_rehearsal.sh`; "
            f"`figures/colab_rehearsal/`). It is {gpu} compute with Colab's constraints, not a T4 time. \"host "
            "memory\" flags a notebook whose kernel and child processes together held more than Colab's 12.7 GiB. "
            + ("The recorded rehearsal added up their resident sizes, which count the pages a forked child shares "
               "with the kernel (04's six DataLoader workers) once per child, so that figure overstates; the "
               "rehearsal now adds proportional sizes, which count a shared page once."
               if "resident sizes (RSS)" in record.get("note", "")
               else "It adds proportional sizes, which count a page a forked child shares with the kernel once.")
            + peak_memory_sentence())


def peak_memory_sentence() -> str:
    """The sentence on the most GPU memory a notebook held under the cap, from the recorded rehearsal's table
    ("" without one)."""
    if not REHEARSAL.is_file():
        return ""
    table = pd.read_csv(REHEARSAL)
    done = table[table.status == "done"]
    if done.empty:
        return ""
    top = done.loc[done.gpu_peak_reserved_gib.idxmax()]
    finished = f"All {len(done)}" if len(done) == len(table) else f"{len(done)} of {len(table)}"
    return (f" {finished} notebooks finished under the cap; the most GPU memory PyTorch held was "
            f"{top.notebook[:2]}'s {top.gpu_peak_reserved_gib:.2f} GiB reserved ({top.gpu_cap} cap), for tensors "
            f"that peaked at {top.gpu_peak_allocated_gib:.2f} GiB: its allocator kept freed blocks cached up to the "
            "cap, and frees them for a new allocation when the cap is reached.")


def rehearsal_gpu() -> str:
    """The recorded rehearsal's GPU, short ("H200"), from figures/colab_rehearsal/rehearsal.json."""
    names = _rehearsal_gpus(_rehearsal_record().get("runs", []))
    return " and ".join(n.replace("NVIDIA ", "").split()[0] for n in names) or "GPU"


def rehearsal_rows() -> dict:
    """``{stem: "48 s"}`` from the recorded Colab rehearsal (figures/colab_rehearsal/rehearsal.csv), with a flag."""
    if not REHEARSAL.is_file():
        return {}
    rows = {}
    for r in pd.read_csv(REHEARSAL).itertuples():
        text = _duration(r.wall_s) if r.status == "done" else r.status
        if isinstance(r.flags, str) and "host over" in r.flags:
            text += f" (host memory {r.tree_peak_rss_gib:.1f} GiB)"
        rows[r.notebook] = text
    return rows


def start_here_block():
    """The notebooks in reading order, each with what it teaches, its time on a recorded run and its Colab badge."""
    import sync_setup_cell
    from cudagraph_kit.course.running.paths import notebook_sources, repository_url

    base = repository_url().replace("https://github.com/", "https://colab.research.google.com/github/")
    ref = sync_setup_cell.repo_ref()
    rehearsal = rehearsal_rows()
    rows = []
    total, gpus = 0.0, set()
    for source in notebook_sources(ROOT / "notebooks"):
        stem = source.stem
        took = notebook_time(stem)
        when = "-" if took is None else f"{_duration(took[0])} on an {took[1]} ({took[2]})"
        if took is not None:
            total += took[0]
            gpus.add(took[1])
        badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                 f"({base}/blob/{ref}/notebooks/{stem}.ipynb)")
        title, what = NOTEBOOKS.get(stem, (stem[3:].replace("_", " "), ""))
        rows.append([stem[:2], f"[{title}](notebooks/{stem}.ipynb): {what}", when, rehearsal.get(stem, "-"), badge])
    lines = markdown_table(["#", "notebook: what you learn", "time (recorded run)",
                            f"under Colab's limits, {rehearsal_gpu()} compute (rehearsal)", "Colab"], rows)
    lines += ["", f"Together about {total / 60:.0f} min on the {' and '.join(sorted(gpus))} GPUs named above (times "
              "measured by `reproduce`, read from `figures/reproduce_times*.json`); a Colab T4 has not been timed."]
    if rehearsal:
        lines += ["", rehearsal_note()]
    return "\n".join(lines)


def _interval(r):
    """'6.75x (4.12-9.44x), faster': the speedup over eager, its 90% prediction interval and what that allows
    saying (faster or slower only where the whole interval is on one side of 1x)."""
    verdict = "faster" if r.speedup_lo > 1 else "slower" if r.speedup_hi < 1 else "no clear difference"
    return f"{r.speedup:.2f}x ({r.speedup_lo:.2f}-{r.speedup_hi:.2f}x), {verdict}"


# Notebook 02's headline is the small MLP with SGD (its claim graph_beats_eager_small_sgd, first in its summary);
# the README quotes that row, and the large MLP with the same optimizer (graph_beats_eager_docs_sgd).
STEP_HEADLINE = {"graph_beats_eager_small_sgd": "MLP 32x128x256x16, SGD",
                 "graph_beats_eager_docs_sgd": "MLP 640x4096x2048x1024, SGD"}


def headline_block():
    """Three results of the recorded run, with its GPU, and the one figure of what the kit costs."""
    lines = []
    gelu, step, llm = (results.load(s) for s in ("01_gelu", "02_train_step", "08_llm_decode"))
    if gelu is not None:
        small, large = _row(gelu.df, "small", "graph replay"), _row(gelu.df, "large", "graph replay")
        lines.append(f"- **GELU on a small tensor** (1x3x224x224, notebook 01): {_interval(small)}; on a 32x larger "
                     f"one: {_interval(large)}.")
    if step is not None:
        small, big = (_row(step.df, case, "whole-step graph") for case in STEP_HEADLINE.values())
        if small is not None and big is not None:
            lines.append(f"- **A whole training step as one graph** (forward, backward, SGD; notebook 02): a small "
                         f"MLP {_interval(small)}; a large one {_interval(big)}.")
    if llm is not None:
        graph = _row(llm.df, "generate, batch 1", "kit graph per bucket")
        if graph is not None:
            lines.append(f"- **LLM decoding at batch 1** (a static KV cache, one graph per batch bucket; notebook "
                         f"08): {_interval(graph)}.")
    runs_ = {_env_caption(r.env) for r in (gelu, step, llm) if r is not None}
    if runs_:
        note = dirty_note(r.env for r in (gelu, step, llm) if r is not None)
        lines[:0] = [f"Speedup of the CUDA graph over eager, with the 90% prediction interval of where a further "
                     f"timing window lands, on {'; '.join(sorted(runs_))}:", ""]
        if note:
            lines += ["", note]
    cost = results.load("00_overhead")
    if cost is not None and "minus_hand_written_median_us" in cost.df.columns:
        df = cost.df

        def over(case, variant, column="minus_hand_written_median_us"):
            sel = df[(df.case == case) & (df.variant == variant)]
            return sel.iloc[0][column] if len(sel) and column in sel.columns else float("nan")

        def kit(case):   # the median burst, and the mean where recorded (it carries the scheduled full checks)
            mean = over(case, "kit", "minus_hand_written_mean_us")
            return f"{over(case, 'kit'):+.1f} µs" + (f" ({mean:+.1f} µs on average)" if mean == mean else "")
        lines += ["", f"**What the kit costs** on the host, per call, over a hand-written `static_x.copy_(x); "
                  f"graph.replay()` (`scripts/bench_overhead.py`; {_env_caption(cost.env)}): on 48 `Linear` layers "
                  f"{kit('mlp48')} with the guard that refuses stale weights, against "
                  f"{over('mlp48', 'reduce_overhead'):+.1f} µs for `reduce-overhead`; on a 12-layer Llama decode "
                  f"step holding a `StaticCache` {kit('llama')}, against "
                  f"{over('llama', 'reduce_overhead'):+.1f} µs; on the first call after an unrelated module is built "
                  f"{_first_call(over('after_module_llama', 'kit'))} (Llama; "
                  f"{over('after_module_llama', 'kit_before_change'):+.1f} µs before this change) "
                  "([details](docs/RESULTS.md))."]
    return "\n".join(lines)


def _first_call(us: float) -> str:
    """The kit's extra cost on the first call after a module is built: a difference of medians, which can fall
    below zero when the kit adds less than the rounds' spread."""
    return f"{us:+.1f} µs" if us >= 0 else f"nothing measurable ({us:+.1f} µs, a difference of medians)"


def render():
    body = "\n".join([START, provenance_paragraph(), noise_paragraph(), rerun_paragraph(), gelu_section(),
                      train_step_section(), jit_compile_section(), resnet_section(), advise_section(),
                      buckets_section(), data_parallel_section(), llm_decode_section(), overhead_section(),
                      crosscheck_section(), END])
    return body.replace("](figures/", "](../figures/")  # docs/RESULTS.md links up to the checkout's figures/


def _between(text, markers, block, name):
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{name} lacks the markers {start} ... {end}: put them where the block goes")
    head, rest = text.split(start, 1)
    return head + start + "\n" + block + "\n" + end + rest.split(end, 1)[1]


def rendered() -> dict:
    """{path: the text it should have}."""
    readme = README.read_text()
    readme = _between(readme, START_HERE, start_here_block(), "README.md")
    readme = _between(readme, HEADLINE, headline_block(), "README.md")
    doc = RESULTS_DOC.read_text()
    head, rest = doc.split(START, 1)
    return {README: readme, RESULTS_DOC: head + render() + rest.split(END, 1)[1]}


def main(args: argparse.Namespace):
    stale = [path for path, text in rendered().items() if path.read_text() != text]
    if args.check:
        if stale:
            sys.exit(f"{', '.join(p.name for p in stale)}: stale; run python scripts/update_readme.py --write")
        return
    for path, text in rendered().items():
        if path in stale:
            path.write_text(text)
            print(f"rewrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main(ARGS)
