"""Probe: what capturing the default bucket ladder costs (seconds and device memory), for any checkout of the kit.

``capture_buckets(mlp, sample)`` with a sample of 256 rows captures the default ladder up to 256 (1, 2, 4, then steps
of 8: 35 buckets) for a small MLP (256 -> 1024 -> GELU -> 256, fp32). Before each capture the caching allocator is
given a cached block (``--planted-mib`` allocated and freed, so it sits in the cache); after it, the probe reports
``torch.cuda.memory_reserved``/``memory_allocated`` before and after, the peak reserved, and whether the cache was
emptied (the planted block given back to the driver). It also counts the calls to ``torch.cuda.empty_cache``,
``torch.cuda.synchronize`` and ``gc.collect`` made during the capture, by the file that made them (the kit's or
PyTorch's ``torch/cuda/graphs.py``), with counting wrappers installed by this script for the capture only.
Each process captures the ladder ``--repeats`` times (the first includes cuBLAS and kernel warm-up); run it in a fresh
process per checkout.

It imports ``cudagraph_kit`` from wherever PYTHONPATH points, so the same script measures the old and the new code:

    git worktree add /tmp/kit-old 99b433f
    PYTHONPATH=/tmp/kit-old python scripts/probes/probe_ladder_cost.py --out figures/ladder_cost/<gpu>/old
    PYTHONPATH=$PWD         python scripts/probes/probe_ladder_cost.py --out figures/ladder_cost/<gpu>/new

Writes runs.csv (one row per capture of the ladder) and env.json (GPU, versions, the checkout's path and commit).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--planted-mib", type=int, default=256)
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402

import cudagraph_kit  # noqa: E402


class CallCounter:
    """Counts calls to ``owner.name`` by the file of the caller, while active (the script's own measurement aid)."""

    def __init__(self, owner, name):
        self.owner, self.name, self.original = owner, name, getattr(owner, name)
        self.by_file = collections.Counter()

    def __enter__(self):
        original, by_file = self.original, self.by_file

        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            by_file[Path(caller).name if "cudagraph_kit" in caller or "torch" in caller else "other"] += 1
            return original(*args, **kwargs)
        setattr(self.owner, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.original)
        return False


def mib(n: int) -> float:
    return round(n / 2**20, 1)


def one_capture(capture_buckets, mlp, sample, planted_mib: int) -> dict:
    torch.cuda.synchronize()
    block = torch.empty(planted_mib * 2**20, dtype=torch.uint8, device="cuda")
    del block  # now cached by the allocator, not in use
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    stats0 = torch.cuda.memory_stats()
    reserved0, allocated0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    counters = [CallCounter(torch.cuda, "empty_cache"), CallCounter(torch.cuda, "synchronize"),
                CallCounter(gc, "collect")]
    for c in counters:
        c.__enter__()
    try:
        t0 = time.perf_counter()
        serve = capture_buckets(mlp, sample)
        torch.cuda.synchronize()  # counted: one call of this script's, file "probe_ladder_cost.py" -> "other"
        seconds = time.perf_counter() - t0
    finally:
        for c in reversed(counters):
            c.__exit__()
    stats1 = torch.cuda.memory_stats()
    reserved1, allocated1 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    device_frees = stats1.get("num_device_free", 0) - stats0.get("num_device_free", 0)
    sizes = getattr(serve, "sizes", None)
    row = {"seconds": round(seconds, 4), "buckets": len(sizes) if sizes is not None else None,
           "reserved_before_mib": mib(reserved0), "reserved_after_mib": mib(reserved1),
           "allocated_before_mib": mib(allocated0), "allocated_after_mib": mib(allocated1),
           "peak_reserved_mib": mib(torch.cuda.max_memory_reserved()), "planted_cached_mib": planted_mib,
           "device_frees": device_frees,
           "cache_emptied": bool(device_frees > 0 or reserved1 < reserved0 - planted_mib * 2**20 // 2)}
    for c in counters:
        label = c.name  # empty_cache, synchronize (torch.cuda), collect (gc)
        row[f"{label}_calls"] = sum(c.by_file.values())
        row[f"{label}_by_file"] = json.dumps(dict(c.by_file))
    with torch.no_grad():  # the ladder still serves correctly
        x = torch.randn(37, sample.shape[1], device="cuda")
        torch.testing.assert_close(serve(x), mlp(x), rtol=1e-4, atol=1e-4)
    del serve
    return row


def main(args):
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    capture_buckets = cudagraph_kit.capture_buckets
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda().eval()
    sample = torch.randn(256, 256, device="cuda")
    with torch.no_grad():
        mlp(sample)  # CUDA context and cuBLAS made before the first measurement
    rows = []
    for repeat in range(args.repeats):
        row = one_capture(capture_buckets, mlp, sample, args.planted_mib)
        row["repeat"] = repeat
        rows.append(row)
        gc.collect()

    checkout = Path(cudagraph_kit.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "checkout": str(checkout), "commit": commit, "uncommitted_changes": dirty,
           "model": "Linear(256,1024)-GELU-Linear(1024,256) fp32", "sample_rows": 256}
    args.out.mkdir(parents=True, exist_ok=True)
    import pandas as pd
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "runs.csv", index=False)
    (args.out / "env.json").write_text(json.dumps(env, indent=2))
    print(f"{env['gpu']}, PyTorch {env['torch']}, kit at {checkout} ({commit}{' + changes' if dirty else ''})")
    cols = ["repeat", "buckets", "seconds", "reserved_before_mib", "reserved_after_mib", "allocated_after_mib",
            "peak_reserved_mib", "cache_emptied", "empty_cache_calls", "synchronize_calls", "collect_calls"]
    print(df.reindex(columns=cols).to_string(index=False))
    print("by file:", df[[c for c in df.columns if c.endswith("_by_file")]].iloc[-1].to_dict())


if __name__ == "__main__":
    main(ARGS)
