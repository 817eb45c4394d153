"""The Colab rehearsal: every notebook at full size through ``reproduce``, under a Colab T4 runtime's limits, on a
bigger GPU (an H100), with each notebook's wall time and peak GPU and host memory in one table.

Colab's free T4 runtime is where most learners first run the notebooks: 2 CPU cores, a GPU with about 15 GiB and no
bf16 tensor cores, about 12.7 GiB of host memory. The rehearsal imposes what can be imposed on a bigger machine:

- **2 CPU cores**: the process (and every kernel and subprocess it starts) is pinned to ``--cpus`` (default
  ``0,1``; ``scripts/colab_rehearsal.sh`` runs it under ``taskset -c 0,1`` as well);
- **what a T4 leaves PyTorch's allocator**: a T4 has 15,360 MiB, and its CUDA context (driver, kernels loaded,
  cuBLAS handles) takes part of that outside the allocator. The probe measures the context on this machine (memory in
  use on the device less what the allocator reserved, after a first matmul) and caps the allocator at 15,360 MiB less
  that, rounded down to 1/16 GiB (``--gpu-memory-gib`` names another cap). Every notebook kernel caps PyTorch's caching
  allocator with ``torch.cuda.set_per_process_memory_fraction(cap / total)`` (:mod:`.kernel_hook`), and where this PyTorch reads
  ``per_process_memory_fraction`` from ``PYTORCH_CUDA_ALLOC_CONF`` (probed first, in a subprocess), that is set too,
  so the notebooks' own subprocesses (05's pitfall scripts, 07's torchrun) are capped as well. The cap binds the
  allocator only: the CUDA context, cuBLAS workspaces and graph executables lie outside it, as they do on a T4;
- **Inductor's compile workers as on 2 cores**: ``TORCHINDUCTOR_COMPILE_THREADS=2``;
- **no bf16**: ``CUDAGRAPH_KIT_NO_BF16=1``, which :func:`cudagraph_kit.env.bf16_supported` honours, so every
  notebook that asks it takes its T4 branch.

Not imposed: the T4's speed (timings are an H100's, only the CPU side is a T4 runtime's), and host memory (the
peaks are recorded, the kernel's own and the kernel's with its subprocesses, and flagged above Colab's 12.7 GiB).
Each kernel records its peaks (:mod:`.kernel_hook`) in ``<out>/kernel_stats/<notebook>.json``; the rehearsal
writes ``<out>/rehearsal.json`` and ``rehearsal.csv`` and prints the table. Output goes to ``build/colab_rehearsal/`` (``--out`` names another folder; never the recorded
``figures/`` or ``notebooks/``). ``--resume`` goes on with the rehearsal recorded there (``reproduce --resume``:
same code, GPU, PyTorch and limits), so a 10-minute-per-command budget can split it::

    bash scripts/colab_rehearsal.sh 01 02          # the first two notebooks
    bash scripts/colab_rehearsal.sh --resume       # the rest of the same run
    bash scripts/colab_rehearsal.sh --dry-run      # what it would do, starting nothing
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from .paths import FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT

T4_CARD_MIB = 15360             # a Colab T4's memory, CUDA context included
T4_GPU_MEMORY_GIB = 15.0        # the cap when no context could be measured (no GPU: nothing is capped then)
COLAB_HOST_MEMORY_GIB = 12.7    # a free Colab runtime's host memory
T4_CPUS = "0,1"                 # 2 cores
COMPILE_THREADS = 2             # Inductor's choice on 2 cores
DEFAULT_OUT = PROJECT_ROOT / "build" / "colab_rehearsal"
REPORT_ENV = ("CUDAGRAPH_KIT_NO_BF16", "TORCHINDUCTOR_COMPILE_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS")
COMMAND = "bash scripts/colab_rehearsal.sh"


def parse_cpus(text: str) -> list[int]:
    """'0,1' or '0-3,8' -> sorted CPU numbers (as taskset -c reads them)."""
    cpus = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus:
        raise ValueError(f"no CPU in {text!r}")
    return sorted(cpus)


# ------------------------------------------------------------------------------------------------ the GPU probe
_PROBE = r"""
import json, torch
info = {"cuda": torch.cuda.is_available(), "torch": torch.__version__}
if info["cuda"]:
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, total_bytes=int(p.total_memory), capability=list(torch.cuda.get_device_capability(0)))
    a = torch.ones(64, 64, device="cuda")
    (a @ a).sum().item()   # the context with cuBLAS loaded, as after a notebook's first matmul
    free, total = torch.cuda.mem_get_info(0)
    info["context_bytes"] = int(total - free - torch.cuda.memory_reserved(0))
print(json.dumps(info))
"""
_PROBE_ALLOC_CONF = r"""
import torch
torch.zeros(1, device="cuda")  # the allocator reads PYTORCH_CUDA_ALLOC_CONF here (and rejects unknown options)
print(torch.cuda.get_per_process_memory_fraction(0))
"""


def _python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def alloc_conf_with_fraction(fraction: float, existing: str | None = None) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` with ``per_process_memory_fraction`` set (other options kept)."""
    kept = [o for o in (existing or "").split(",") if o.strip() and not o.strip().startswith("per_process_memory_")]
    return ",".join(kept + [f"per_process_memory_fraction:{fraction:.6f}"])


def t4_cap_gib(context_bytes: int) -> float:
    """What a T4 leaves PyTorch's allocator once a CUDA context of ``context_bytes`` is loaded, in GiB, rounded down
    to 1/16 GiB (so that a context a few MiB larger on another call gives the same cap, and ``--resume`` goes on).

    Example::

        t4_cap_gib(530 * 2**20)    # 14.4375
    """
    return int((T4_CARD_MIB * 2**20 - context_bytes) / 2**30 * 16) / 16


def probe_gpu(gib: float | None = None) -> dict:
    """This machine's GPU (in a subprocess), its CUDA context, the cap (``gib``, or what a T4 leaves after that
    context: :func:`t4_cap_gib`) as a fraction of it, and whether this PyTorch takes that fraction from
    ``PYTORCH_CUDA_ALLOC_CONF`` (then the notebooks' subprocesses are capped too)."""
    done = _python(_PROBE)
    if done.returncode != 0:
        return {"cuda": False, "why": f"the probe failed: {done.stderr.strip()[-300:]}"}
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if not info["cuda"]:
        info["why"] = "no CUDA device: nothing to cap (the kernels say so too)"
        return info
    context = info.get("context_bytes")
    info["context_mib"] = round(context / 2**20) if context is not None else None
    info["gib"] = gib = gib if gib is not None else (t4_cap_gib(context) if context is not None else T4_GPU_MEMORY_GIB)
    info["fraction"] = min(1.0, gib * 2**30 / info["total_bytes"])
    conf = alloc_conf_with_fraction(info["fraction"], os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    check = _python(_PROBE_ALLOC_CONF, {"PYTORCH_CUDA_ALLOC_CONF": conf})
    try:
        seen = float(check.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        seen = None
    info["alloc_conf_supported"] = seen is not None and abs(seen - info["fraction"]) < 1e-4
    info["alloc_conf"] = conf if info["alloc_conf_supported"] else None
    info["why"] = ((f"a T4's {T4_CARD_MIB:,} MiB less this machine's CUDA context ({info['context_mib']:,} MiB): "
                    if context is not None and gib == t4_cap_gib(context) else "")
                   + f"{gib:g} GiB of {info['total_bytes'] / 2**30:.1f} GiB = fraction {info['fraction']:.4f}: in every "
                   "kernel (set_per_process_memory_fraction)" + (
                       " and, through PYTORCH_CUDA_ALLOC_CONF, in the notebooks' subprocesses"
                       if info["alloc_conf_supported"] else
                       f"; PyTorch {info['torch']} does not take it from PYTORCH_CUDA_ALLOC_CONF "
                       f"({(check.stderr.strip().splitlines() or ['no error'])[-1][:160]}), so the notebooks' "
                       "subprocesses (05's scripts, 07's torchrun) run uncapped"))
    return info


# ------------------------------------------------------------------------------------------------ the limits
def environment(gpu: dict, compile_threads: int = COMPILE_THREADS) -> dict:
    """The environment variables of the rehearsal (for the kernels and everything they start)."""
    env = {"CUDAGRAPH_KIT_NO_BF16": "1", "TORCHINDUCTOR_COMPILE_THREADS": str(compile_threads)}
    if gpu.get("alloc_conf"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = gpu["alloc_conf"]
    return env


def constraints_label(cpus: list[int], gib: float, compile_threads: int) -> str:
    """The limits, as recorded in the run (``--resume`` goes on only under the same)."""
    return (f"colab-t4: cpus {','.join(map(str, cpus))}; gpu memory {gib:g} GiB; no bf16; "
            f"inductor compile threads {compile_threads}")


@contextlib.contextmanager
def constrained(env: dict, cpus: list[int] | None):
    """Within: ``env`` set and this process pinned to ``cpus`` (inherited by every kernel); both restored after."""
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cpus = os.sched_getaffinity(0) if cpus and hasattr(os, "sched_getaffinity") else None
    try:
        os.environ.update(env)
        if saved_cpus is not None:
            os.sched_setaffinity(0, cpus)
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if saved_cpus is not None:
            os.sched_setaffinity(0, saved_cpus)


# ------------------------------------------------------------------------------------------------ the report
COLUMNS = ("notebook", "status", "wall_s", "gpu_peak_reserved_gib", "gpu_peak_allocated_gib",
           "gpu_device_used_peak_gib", "host_peak_rss_gib", "tree_peak_rss_gib", "bf16_supported", "cpus",
           "gpu_cap", "flags", "where")


def _gib(value) -> float | None:
    return None if value is None else round(value / 2**30, 2)


def notebook_row(stem: str, status: str, seconds, where: str, stats: dict | None, gib: float) -> dict:
    """One notebook's line of the report, from reproduce's summary and its kernel's stats (None: none written)."""
    stats = stats or {}
    cap = stats.get("gpu_cap") or {}
    row = {"notebook": stem, "status": status, "wall_s": None if seconds is None else round(seconds, 1),
           "gpu_peak_reserved_gib": _gib(stats.get("gpu_max_reserved_bytes")),
           "gpu_peak_allocated_gib": _gib(stats.get("gpu_max_allocated_bytes")),
           "gpu_device_used_peak_gib": _gib(stats.get("gpu_device_used_max_bytes")),
           "host_peak_rss_gib": _gib(stats.get("host_max_rss_bytes")),
           "tree_peak_rss_gib": _gib(stats.get("tree_max_rss_bytes")),
           "bf16_supported": stats.get("bf16_supported"),
           "cpus": ",".join(map(str, stats["cpus"])) if stats.get("cpus") else None,
           "gpu_cap": (f"{cap.get('gib'):g} GiB" if cap.get("applied") else cap.get("why")) if cap else None,
           "where": where}
    flags = []
    if row["gpu_peak_reserved_gib"] is not None and row["gpu_peak_reserved_gib"] > gib:
        flags.append(f"GPU over {gib:g} GiB")
    host = max((v for v in (row["host_peak_rss_gib"], row["tree_peak_rss_gib"]) if v is not None), default=None)
    if host is not None and host > COLAB_HOST_MEMORY_GIB:
        flags.append(f"host over Colab's {COLAB_HOST_MEMORY_GIB} GiB")
    if stats and stats.get("bf16_supported") is True:
        flags.append("bf16 was NOT switched off")
    row["flags"] = "; ".join(flags)
    return row


def build_report(out: Path, summary, gib: float, previous: dict | None = None) -> dict:
    """Merge this invocation's rows (reproduce's summary + kernel stats) into the rehearsal's report: a notebook
    skipped because this run published it before keeps its earlier row."""
    rows = dict((previous or {}).get("notebooks", {})) if (previous or {}).get("run_id") == summary.run_id else {}
    for stem, status, seconds, where in summary.rows:
        if status == "skipped" and stem in rows:
            continue
        if status == "not run" and stem in rows and rows[stem]["status"] == "done":
            continue
        stats_path = out / "kernel_stats" / f"{stem}.json"
        ran = status not in ("skipped", "not run")
        stats = json.loads(stats_path.read_text()) if ran and stats_path.is_file() else None
        rows[stem] = notebook_row(stem, status, seconds, where, stats, gib)
    return {"run_id": summary.run_id, "notebooks": dict(sorted(rows.items()))}


def table(report: dict) -> str:
    """The report as an aligned text table (pandas')."""
    import pandas as pd

    heads = ("notebook", "status", "wall s", "GPU reserved", "GPU in use", "kernel RSS", "with children", "bf16",
             "flags")
    keys = ("notebook", "status", "wall_s", "gpu_peak_reserved_gib", "gpu_device_used_peak_gib", "host_peak_rss_gib",
            "tree_peak_rss_gib", "bf16_supported", "flags")

    def cell(key, value):
        if value is None:
            return "-"
        if key.endswith("_gib"):
            return f"{value:.2f} GiB"
        if key == "wall_s":
            return f"{value:.0f}"
        return str(value)
    rows = [[cell(k, r.get(k)) for k in keys] for r in report["notebooks"].values()]
    return pd.DataFrame(rows, columns=heads).to_string(index=False)


def write_report(out: Path, report: dict, header: dict) -> None:
    from .files import write_text_atomic

    data = dict(header, **report)
    write_text_atomic(out / "rehearsal.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for row in report["notebooks"].values():
        writer.writerow({k: row.get(k) for k in COLUMNS})
    write_text_atomic(out / "rehearsal.csv", buf.getvalue())


# ------------------------------------------------------------------------------------------------ the command
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Run every notebook at full size through reproduce under a Colab T4 runtime's "
        "limits (2 CPU cores, the GPU memory a T4 leaves after its CUDA context, no bf16, Inductor's compile threads as on 2 cores) and record "
        "each notebook's wall time and peak GPU and host memory. Writes build/colab_rehearsal/ unless --out says "
        "where; never figures/ or notebooks/.")
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 02 (default: all)")
    parser.add_argument("--resume", action="store_true", help="go on with the rehearsal recorded in --out")
    parser.add_argument("--dry-run", action="store_true", help="say what would run, with which limits; start nothing")
    parser.add_argument("--out", default=None, help=f"output folder (default: {DEFAULT_OUT.relative_to(PROJECT_ROOT)})")
    parser.add_argument("--cpus", default=T4_CPUS, help="CPUs to pin to, as taskset -c reads them (default: 0,1)")
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help=f"GPU memory cap (default: a T4's {T4_CARD_MIB:,} MiB less the CUDA context measured here)")
    parser.add_argument("--compile-threads", type=int, default=COMPILE_THREADS,
                        help="TORCHINDUCTOR_COMPILE_THREADS (default 2, as Inductor picks on 2 cores)")
    parser.add_argument("--limit-scale", type=float, default=2.0,
                        help="loosen reproduce's per-cell stall/stop limits by this factor (2 cores compile and "
                             "load more slowly than the recorded run's machine; default 2)")
    return parser


def _output_folder(given) -> Path:
    out = Path(given).resolve() if given else DEFAULT_OUT
    for kept in (FIGURES_DIR, NOTEBOOKS_DIR, PROJECT_ROOT):
        if out == Path(kept).resolve():
            raise SystemExit(f"colab rehearsal: --out {out} is the recorded {kept.name}/ (or the checkout); the "
                             "rehearsal never writes there. Fix: name another folder, e.g. build/colab_rehearsal.")
    return out


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from . import reproduce as rep
    from .watchdog import CellLimits

    out = _output_folder(args.out)
    cpus = parse_cpus(args.cpus) if args.cpus else None
    sources = [s.stem for s in rep.notebook_sources(rep.NOTEBOOKS_DIR)
               if not args.names or any(s.stem.startswith(n) for n in args.names)]
    if not sources:
        raise SystemExit(f"colab rehearsal: no notebook matches {args.names!r}")
    gpu = probe_gpu(args.gpu_memory_gib)
    gib = gpu.get("gib", args.gpu_memory_gib or T4_GPU_MEMORY_GIB)
    env = environment(gpu, args.compile_threads)
    label = constraints_label(cpus or [], gib, args.compile_threads)
    limits = CellLimits(scale=args.limit_scale)
    now_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"colab rehearsal{' (dry run: nothing is started)' if args.dry_run else ''}: {len(sources)} notebook(s): "
          f"{', '.join(sources)}\n"
          f"  limits:       {label}\n"
          f"  CPUs:         {args.cpus} (this process has {','.join(map(str, now_cpus or [])) or 'unknown'}"
          f"{'' if now_cpus == cpus or cpus is None else '; it pins itself'})\n"
          f"  GPU:          {gpu.get('gpu') or 'none'}: {gpu['why']}\n"
          f"  environment:  {' '.join(f'{k}={v}' for k, v in env.items())}\n"
          f"  cell limits:  {limits.describe()}\n"
          f"  output:       {out}/ (notebooks/, figures/, kernel_stats/, rehearsal.json, rehearsal.csv)"
          + ("\n  resume:       going on with the run recorded in " + str(out / "figures" / rep.TIMES_FILE)
             if args.resume else ""), flush=True)
    if args.dry_run:
        return 0
    summary = rep.RunSummary("")
    code = 0
    try:
        with constrained(env, cpus):
            rep.reproduce(args.names, out_dir=out / "notebooks", results_dir=out / "figures", resume=args.resume,
                          limits=limits, kernel={"gpu_memory_gib": gib,
                                                 "stats_dir": str(out / "kernel_stats"), "report_env": REPORT_ENV},
                          benchmarks=False, constraints=label, summary=summary,
                          command=" ".join([COMMAND, *([f"--out {args.out}"] if args.out else []),
                                            *([] if args.cpus == T4_CPUS else [f"--cpus {args.cpus}"]),
                                            *([] if args.gpu_memory_gib is None else
                                              [f"--gpu-memory-gib {args.gpu_memory_gib:g}"]),
                                            *([] if args.compile_threads == COMPILE_THREADS else
                                              [f"--compile-threads {args.compile_threads}"])]))
    except SystemExit as exc:  # RunStopped (a notebook failed, stalled or was interrupted), a refused --resume
        code = exc.code if isinstance(exc.code, int) else 1
        if not summary.rows:
            raise
    previous = json.loads((out / "rehearsal.json").read_text()) if (out / "rehearsal.json").is_file() else None
    report = build_report(out, summary, gib, previous)
    write_report(out, report, {"constraints": label, "gpu": gpu, "environment": env,
                               "cell_limits": limits.describe()})
    print(f"\ncolab rehearsal: run {summary.run_id} ({label}); {out / 'rehearsal.json'}, {out / 'rehearsal.csv'}\n"
          + table(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
