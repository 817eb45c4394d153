"""Probe: where does run-to-run drift come from, and which control narrows it?

Eager (host-bound) times moved 0.55-2.16x between two full runs on one GPU kind while graph replays hardly moved.
This probe starts many fresh Python processes, each timing the small GELU eagerly and as a graph replay with the
kit's ``compare`` (round-robin, three windows), under one *control* each:

- ``baseline``: nothing changed;
- ``gc_off``: Python's cyclic garbage collector collected, then disabled for the timings;
- ``threads_1``: one intra-op thread (``torch.set_num_threads(1)``, OMP/MKL threads 1);
- ``warm_20s``: 20 s of eager launches first (the process's first minutes: clocks, caches, allocator);
- ``after_profiler``: a ``torch.profiler`` session first, without the CUPTI teardown (what ran before);
- ``nice``: a higher scheduling priority (``os.nice(-10)``, needs root; recorded as not applied otherwise).

Processes run control by control in rotating order, so the host's drift over minutes hits every control alike.
For each control it reports the eager and graph medians across processes, their spread (max/min), the 90%
prediction interval of one more process's eager time and speedup (``cudagraph_kit.intervals``), and it writes
``drift.csv`` (one row per process and window) and ``drift.png`` into ``--out``.

Run on a GPU machine from the project root (about 6 minutes with the defaults)::

    python scripts/probes/probe_drift.py --out build/drift
    python scripts/probes/probe_drift.py --processes 4 --controls baseline gc_off   # shorter

Without CUDA the "graph" runs eagerly (the kit's eager fallback): that checks the plumbing only, no result.
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/probes/ -> root
sys.path.insert(0, str(ROOT))

CONTROLS = ["baseline", "gc_off", "threads_1", "warm_20s", "after_profiler", "nice"]


def gelu(x):
    import torch
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def child(control: str, windows: int) -> dict:
    """Runs in a fresh process: apply the control, then time eager vs graph replay in ``windows`` windows."""
    import gc

    if control == "threads_1":
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    import torch

    from cudagraph_kit.graphed import capture
    from cudagraph_kit.timing import compare

    applied = True
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(1, 3, 224, 224, device=dev)
    g = capture(gelu, x, eager_fallback=True)
    if control == "threads_1":
        torch.set_num_threads(1)
    elif control == "gc_off":
        gc.collect()
        gc.disable()
    elif control == "warm_20s":
        end = time.perf_counter() + 20
        while time.perf_counter() < end:
            for _ in range(200):
                gelu(x)
            if dev == "cuda":
                torch.cuda.synchronize()
    elif control == "after_profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                    + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])):
            for _ in range(50):
                gelu(x)
    elif control == "nice":
        try:
            os.nice(-10)
        except OSError:
            applied = False
    rows = []
    for w in range(windows):
        df = compare({"eager": lambda: gelu(x), "graph": g.replay}, case="small gelu", samples=9, floor=False)
        e, r = df.iloc[0], df.iloc[1]
        rows.append({"window": w, "eager_us": e.median_us, "graph_us": r.median_us, "speedup": r.speedup,
                     "eager_event_us": e.event_median_us, "graph_event_us": r.event_median_us,
                     "graph_executed_as": r.executed_as})
        time.sleep(1.0)
    return {"control": control, "applied": applied, "pid": os.getpid(), "rows": rows,
            "device": torch.cuda.get_device_name(0) if dev == "cuda" else "CPU (plumbing only, no result)"}


def per_process(df):
    """One row per (control, process): the median of its windows."""
    return df.groupby(["control", "process"], sort=False).median(numeric_only=True).reset_index()


def summarise(df, per_proc):
    """One row per control: medians across processes, spreads and 90% prediction intervals."""
    import pandas as pd

    from cudagraph_kit.intervals import prediction_interval

    rows = []
    for control, d in per_proc.groupby("control", sort=False):
        e_lo, e_hi = prediction_interval(d.eager_us)
        s_lo, s_hi = prediction_interval(d.speedup)
        rows.append({"control": control, "processes": len(d),
                     "eager_us": d.eager_us.median(), "eager_spread": d.eager_us.max() / d.eager_us.min(),
                     "eager_pi_lo": e_lo, "eager_pi_hi": e_hi,
                     "graph_us": d.graph_us.median(), "graph_spread": d.graph_us.max() / d.graph_us.min(),
                     "speedup": d.speedup.median(), "speedup_spread": d.speedup.max() / d.speedup.min(),
                     "speedup_pi_lo": s_lo, "speedup_pi_hi": s_hi,
                     "within_process_eager_spread": statistics.median(
                         df[df.control == control].groupby("process").eager_us.agg(lambda s: s.max() / s.min()))})
    return pd.DataFrame(rows)


def plot(per_proc, summary, device, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    controls = list(summary.control)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, col, label in zip(axes, ["eager_us", "graph_us", "speedup"],
                              ["eager µs per call", "graph replay µs per call", "speedup (eager / graph)"]):
        for i, c in enumerate(controls):
            ys = per_proc[per_proc.control == c][col]
            ax.scatter([i] * len(ys), ys, s=18, alpha=0.7)
        ax.set_xticks(range(len(controls)), controls, rotation=25, ha="right", fontsize=8)
        ax.set(ylabel=label, title=f"{label}: one dot per fresh process")
    fig.suptitle(f"Run-to-run drift of a small GELU, eager vs graph replay: {device}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(out, rows, device, args):
    """(Re)write drift.csv, drift_summary.csv, drift.png and drift_env.json from the processes done so far."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df.to_csv(out / "drift.csv", index=False)
    per_proc = per_process(df)
    summary = summarise(df, per_proc)
    summary.to_csv(out / "drift_summary.csv", index=False)
    plot(per_proc, summary, device, out / "drift.png")
    (out / "drift_env.json").write_text(json.dumps({"device": device, "processes": int(per_proc.process.max()) + 1,
                                                    "windows": args.windows, "controls": args.controls}, indent=1))
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/drift")
    ap.add_argument("--processes", type=int, default=6, help="fresh processes per control")
    ap.add_argument("--windows", type=int, default=3, help="timing windows per process")
    ap.add_argument("--controls", nargs="+", default=CONTROLS, choices=CONTROLS)
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop starting new rounds after this many seconds (results are written after every round)")
    ap.add_argument("--child", choices=CONTROLS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.windows)))
        return
    import pandas as pd

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, device, started = [], None, time.time()
    for p in range(args.processes):
        if p and time.time() - started > args.budget_s:
            print(f"stopping after {p} rounds: --budget-s {args.budget_s:g} spent")
            break
        k = p % len(args.controls)
        for control in itertools.chain(args.controls[k:], args.controls[:k]):
            done = subprocess.run([sys.executable, __file__, "--child", control, "--windows", str(args.windows)],
                                  capture_output=True, text=True, cwd=ROOT, timeout=300)
            line = next((s for s in done.stdout.splitlines() if s.startswith("RESULT ")), None)
            if done.returncode or line is None:
                sys.exit(f"probe_drift: the {control} process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            res = json.loads(line[len("RESULT "):])
            device = res["device"]
            rows += [{"control": control, "process": p, "applied": res["applied"], **r} for r in res["rows"]]
            print(f"[{time.time() - started:5.0f} s] process {p + 1}/{args.processes} {control:15s} eager "
                  f"{statistics.median(r['eager_us'] for r in res['rows']):7.2f} us, graph "
                  f"{statistics.median(r['graph_us'] for r in res['rows']):6.2f} us", flush=True)
        write(out, rows, device, args)  # after each round: a run cut short still leaves its results
    summary = write(out, rows, device, args)
    with pd.option_context("display.width", 200, "display.float_format", lambda v: f"{v:.3g}"):
        print(f"\n{device}\n{summary.to_string(index=False)}")
    print(f"wrote {out}/drift.csv, drift_summary.csv, drift.png")

if __name__ == "__main__":
    main()
