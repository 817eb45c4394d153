"""What notebook 05's pitfall experiments found, read for its tables.

The pitfall table (what happens without a fix, what finds it, the fix, what this run saw), the reading of each
core demo (``outcome``: it records the demo's row and, without a GPU, prints what the recorded GPU run saw in that
demo), short forms of a ``check_capturable`` report and of a capture error for the lesson's cells, the check that the
process still works after a failure, short causes for tables of errors, the runs of experiments made in a process of
their own (``pitfall_scripts.py``), the reading of the reduce-overhead and two-captures experiments, and the
notebook's results table.

Example::

    from cudagraph_kit.course.lessons.pitfalls import PITFALLS, outcome, brief, short_cause
    print(brief(check_capturable(fn, x)))      # one line per finding: its kind, where, and the line of code
    outcome("shape", found=report, fixed=report_fixed, refused=None)   # recorded in PITFALLS
    PITFALLS.record("a changing shape", "raises", "check_capturable", "fixed shapes", "seen", True)
    short_cause("RuntimeError: CUDA error: operation not permitted when stream is capturing")
    # 'RuntimeError: operation not permitted when stream is capturing'
"""
from __future__ import annotations

import re

from ..measuring.predictions import advice_rows

__all__ = ["PitfallTable", "PITFALLS", "outcome", "brief", "brief_error", "still_works", "first_line", "short_cause",
           "first_sentence", "show_isolated", "show_reduce_overhead", "two_captures_table", "two_captures_verdict", "result_table"]


def first_line(text, n=160):
    """The first line of ``text``, cut to ``n`` characters."""
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= n else text[: n - 1] + "…"


def first_sentence(text) -> str:
    """The first sentence of ``text``'s first line (up to its first ". "), whole: never cut mid-word.

    Example::

        first_sentence("argument 0: the graph was captured for shape (8, 64). A graph replays fixed shapes.")
        # 'argument 0: the graph was captured for shape (8, 64).'
    """
    line = first_line(text, n=10**6)
    return line.split(". ")[0].rstrip(".") + "." if line else line


def _tidy(text) -> str:
    """A recorded reading made readable: a code comment quoted in it dropped (``code   # comment.``), and a reading
    cut short (ending in "…") taken back to its last whole sentence."""
    text = re.sub(r"\s{2,}#[^.]*", "", str(text))
    if text.endswith("…") and ". " in text:
        text = text[: text.rindex(". ") + 1]
    return text


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

    from ...graphed import capture

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
        self._rows = {}

    @property
    def rows(self) -> list:
        return list(self._rows.values())

    def record(self, pitfall, without_fix, found_by, fix, seen, detected, still_works=None):
        """Record (or, for a cell run again, replace) the row of ``pitfall``."""
        self._rows[pitfall] = {"pitfall": pitfall, "without a fix": without_fix, "found by": found_by, "fix": fix,
                               "this run saw": seen, "detected": detected, "process still works": still_works}

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



PITFALLS = PitfallTable()  # notebook 05's table: ``outcome`` records the core's demos here, Going further the rest

# The core's demos (notebook 05, sections 1-6): key -> (pitfall, what happens without a fix, what finds it, the fix,
# whether the process is checked with ``still_works`` after the demo on a GPU).
DEMOS = {
    "host sync": (".item() / print of a GPU tensor in the graph", "raises (capture fails)",
                  "check_capturable: host sync", "keep values on the GPU; read them after the replay", True),
    "rebinding": ("rebinding a static input instead of copy_", "silently wrong", "verify",
                  "static_input.copy_(new) (the kit's g(x) copies for you)", True),
    "kept output": ("keeping an output across replays", "silently wrong", "verify (outputs reused)",
                    "clone what you keep, or capture(..., clone_outputs=True)", False),
    "shape": ("a changing shape", "raises (kit) / silently wrong (plain copy_ broadcasts)",
              "check_capturable: data-dependent shape; the kit's shape check",
              "fixed shapes (pad, torch.where) or one graph per size", True),
    "counter": ("a Python counter frozen into the graph", "silently wrong", "check_capturable: Python state; verify",
                "keep it in a GPU tensor updated in place", False),
    "rng": ("random numbers: reseeding or another generator in the graph", "raises (capture fails)",
            "check_capturable: RNG", "seed before capture; draw from the default CUDA generator", True),
}


def _gelu(x):
    import torch

    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def brief(report) -> str:
    """A ``check_capturable`` report in a few lines: its verdict, then per finding (one per kind and line of code)
    its kind(s), where, and the line of your code it points at (a comment at the end of that line left out).
    ``print(report)`` has each finding's full text and fix.

    Example::

        print(brief(check_capturable(scale_by_mean, x)))
        # check_capturable(scale_by_mean): not capturable as it is
        #   host sync at cell:2 (scale_by_mean): m = x.mean().item()
    """
    if report.ok:
        return f"check_capturable({report.name}): looks capturable (nothing found)"
    places = {}  # (where, line of code) -> the kinds found there, in order
    for f in report.findings:
        code = re.split(r"\s{2,}#", f.code)[0].strip() if f.code else first_line(f.what, 100)  # its comment aside
        kinds = places.setdefault((f.where, code), [])
        kinds += [f.kind] if f.kind not in kinds else []
    return "\n".join([f"check_capturable({report.name}): not capturable as it is"]
                     + [f"  {', '.join(kinds)} at {where}: {code}" for (where, code), kinds in places.items()])


def brief_error(exc) -> str:
    """A failed capture in three lines: the kit's cause, what CUDA or PyTorch said first (the error the capture
    failed on, not the ones that followed from it), and the fix (``explain``'s cause and fix)."""
    from ...graphed import explain

    e = explain(exc)
    original = str(e.original or "")
    first = original.rpartition("(while handling ")[2] if "(while handling " in original else original
    return f"cause: {e.cause}\nthe error: {short_cause(first, 120)}\nfix: {e.fix}"


def _read_host_sync(found=(), fixed=None, error=None):
    if error is not None:
        from ...graphed import explain
        seen = f"CaptureError: {explain(error).cause}"
    else:
        seen = "captured without error (unexpected)" if _cuda() else "not captured (no GPU)"
    return seen, all("host sync" in r.kinds() for r in found) and bool(found) and fixed is not None and fixed.ok


def _read_rebinding(bad=None, good=None):
    if bad is None:
        return "needs a GPU", None
    return first_line(bad), (not bad.ok) and good.ok


def _read_kept_output(kept=None, eager=None, report=None, fixed=None):
    if report is None:
        return "needs a GPU", None
    return (f"three calls, three kept outputs: {kept}; eager: {eager}",
            report.outputs_reused and not fixed.outputs_reused)


def _read_shape(found=None, fixed=None, refused=None):
    seen = "check_capturable: data-dependent shape" + (f"; the kit refused another shape: {first_sentence(refused)}"
                                                       if refused is not None else "")
    return seen, "data-dependent shape" in found.kinds() and fixed.ok


def _read_counter(found=None, frozen=None):
    detected = "Python state" in found.kinds()
    if frozen is None:
        return "needs a GPU", detected
    state = frozen.frozen_state
    seen = f"verify: {state['what']}; {state['cause']}" if state else first_line(frozen)
    return _tidy(first_line(seen, 220)), detected and not frozen.ok


def _read_rng(found=None, own_generator=None, error=None, masks_differ=None, same_as_eager=None):
    seen, detected = "check_capturable: RNG (reseeding)", "RNG" in found.kinds()
    if own_generator is None:
        return seen, detected
    if error is None:
        return seen + "; own generator captured without error", False
    seen += (f"; own generator: CaptureError; two replays of a graphed dropout: masks differ in {masks_differ} of "
             f"1000 positions; graph vs eager from the same RNG state: "
             f"{'same numbers' if same_as_eager is not None and same_as_eager.ok else 'differ'}")
    return seen, (detected and "RNG" in own_generator.kinds() and bool(masks_differ)
                  and same_as_eager is not None and same_as_eager.ok)


_READINGS = {"host sync": _read_host_sync, "rebinding": _read_rebinding, "kept output": _read_kept_output,
             "shape": _read_shape, "counter": _read_counter, "rng": _read_rng}


def recorded_outcome(key: str, stem: str = "05_pitfalls") -> str:
    """What the recorded GPU run (``figures/<stem>/``) saw in the demo ``key``, in one line labelled with its GPU
    and date; a line saying so where nothing is recorded."""
    from ..measuring.results import load

    rec = load(stem)
    pitfall = DEMOS[key][0]
    rows = rec.df[rec.df.case.astype(str) == f"pitfall: {pitfall}"] if rec is not None else []
    if not len(rows):
        return "No GPU here, and no recorded GPU run of this demo was found: run it on an NVIDIA GPU to see it."
    seen = _tidy(rows.seen.iloc[0])
    return f"Needs an NVIDIA GPU. Recorded on {rec.env.get('gpu') or 'a GPU'}, {str(rec.env.get('date'))[:10]}: {seen}"


def outcome(key: str, **found) -> None:
    """The end of one of notebook 05's core demos: read what it found (``found``: the demo's reports and errors,
    None for the parts that need a GPU), record its row in ``PITFALLS`` (what happens without the fix, what finds
    it, the fix, what this run saw, whether it was detected, and on a GPU whether eager work and a fresh capture
    still work afterwards), and, without a GPU, print what the recorded GPU run saw in this demo, labelled with its
    GPU and date. On a GPU it prints nothing: the demo printed what it found.

    Example::

        outcome("rebinding", bad=verify(replay_rebinding, gelu, x), good=verify(replay_copying, gelu, x))
    """
    pitfall, without_fix, found_by, fix, check_after = DEMOS[key]
    seen, detected = _READINGS[key](**found)
    recovered = still_works(_gelu) if check_after and _cuda() else None
    PITFALLS.record(pitfall, without_fix, found_by, fix, seen, detected, recovered)
    if not _cuda():
        print(recorded_outcome(key))

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
