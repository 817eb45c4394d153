"""What ``reproduce`` installs inside each notebook's kernel: a stall watchdog, and for the Colab rehearsal a GPU
memory cap and a record of the kernel's peak memory.

``reproduce`` starts every kernel with an IPython startup file (in a temporary ``IPYTHONDIR`` passed through the
kernel's environment) that loads this file by its path and calls :func:`install` with a JSON settings file named
by ``CGK_KERNEL_HOOK``. It uses the standard library only, so that loading it imports neither the kit nor torch
(the notebook's own setup cell does that, and its time stays where it was).

- **Stalls.** Before each cell a ``pre_run_cell`` hook arms ``faulthandler.dump_traceback_later`` with that cell's
  limit (``limits``: SHA-1 of the cell's source -> seconds, else ``default_limit_s``); ``post_run_cell`` disarms
  it. A cell that runs past its limit gets every thread's Python stack written to the ``stacks`` file, by
  faulthandler's own watchdog thread, so it works while the cell holds the GIL in C code. ``SIGUSR1`` writes them
  there at any moment (``reproduce`` sends it at a cell's hard limit, just before it stops the run).
- **GPU memory cap** (``gpu_memory_gib``): ``torch.cuda.set_per_process_memory_fraction(cap / total)`` at kernel
  start, as on a smaller GPU (a T4: 15 GiB). Without CUDA it applies nothing and says so (``stats``, stderr).
- **Peak memory** (``stats``: a JSON file rewritten after every cell): the most GPU memory PyTorch's caching
  allocator reserved (``torch.cuda.max_memory_reserved``, read after each cell, the maximum kept, so a notebook that
  resets the peak statistics cannot hide an earlier peak), the device memory in use at cell ends
  (``torch.cuda.mem_get_info``, also what lies outside the allocator), the kernel's peak resident host memory
  (``VmHWM`` of ``/proc/self/status``: the peak since the kernel's ``exec``; ``ru_maxrss`` would also count the
  pages of the process it was forked from, ``reproduce`` with torch loaded), and the peak resident memory of the
  kernel with all its descendants (05's scripts, 07's torchrun workers, DataLoader workers; proportional, so a page
  they share counts once: what a Colab runtime's host memory must hold at once), sampled every second by a thread of
  the hook. GPU figures are read only once the notebook itself has initialised CUDA; the hook never does, except
  to apply a cap.

Example (what the startup file does; ``settings.json`` written by ``reproduce``)::

    import importlib.util
    spec = importlib.util.spec_from_file_location("cgk_kernel_hook", "cudagraph_kit/course/running/kernel_hook.py")
    hook = importlib.util.module_from_spec(spec); spec.loader.exec_module(hook)
    hook.install(get_ipython(), "settings.json")
"""
from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time

ENV_VAR = "CGK_KERNEL_HOOK"  # path of the settings JSON, in the kernel's environment
DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)  # write every thread's stack now (POSIX only)


def cell_key(source: str) -> str:
    """The key of a cell's limit: SHA-1 of its source as the kernel receives it."""
    return hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest()


def _first_line(source: str, width: int = 60) -> str:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    text = lines[0] if lines else "(comments only)"
    return text if len(text) <= width else text[:width - 3] + "..."


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)  # a reader sees the previous record or this one, never half of one


def _say(text: str) -> None:
    """A line on the kernel's own stderr (which ``reproduce``'s log receives), not in a cell's output."""
    stream = sys.__stderr__
    if stream is not None:
        try:
            stream.write(f"[cudagraph-kit kernel hook] {text}\n")
            stream.flush()
        except (OSError, ValueError):
            pass


class KernelHook:
    """The installed hook (one per kernel): the stall watchdog's file and limits, the cap, the peak record."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.limits = {str(k): float(v) for k, v in (settings.get("limits") or {}).items()}
        default = settings.get("default_limit_s")
        self.default_limit = float(default) if default else None
        self.stacks = open(settings["stacks"], "a", buffering=1) if settings.get("stacks") else None  # noqa: SIM115
        self.stats_path = settings.get("stats")
        self.started = time.time()
        self.cell_now = "(kernel start)"
        self.lock = threading.Lock()  # the memory sampler's thread keeps maxima too
        self.stats = {"pid": os.getpid(), "kernel_started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                      "cells": 0, "gpu_cap": None, "gpu_max_reserved_bytes": None, "gpu_max_allocated_bytes": None,
                      "gpu_device_used_max_bytes": None, "gpu_total_bytes": None, "host_max_rss_bytes": None,
                      "tree_max_rss_bytes": None, "peak_cells": {}, "torch_threads": None,
                      "environment": {k: os.environ.get(k) for k in settings.get("report_env") or ()}}
        if hasattr(os, "sched_getaffinity"):
            self.stats["cpus"] = sorted(os.sched_getaffinity(0))  # what taskset left this kernel

    # -------------------------------------------------------------------------------------------- stalls
    def limit_for(self, source: str):
        return self.limits.get(cell_key(source), self.default_limit)

    def pre_run_cell(self, info) -> None:
        self.cell_now = _first_line(getattr(info, "raw_cell", "") or "")
        limit = self.limit_for(getattr(info, "raw_cell", "") or "")
        if self.stacks is not None and limit:
            faulthandler.dump_traceback_later(limit, repeat=False, file=self.stacks, exit=False)

    def post_run_cell(self, result) -> None:
        if self.stacks is not None:
            faulthandler.cancel_dump_traceback_later()
        if self.stats_path:
            info = getattr(result, "info", None)
            self.record(_first_line(getattr(info, "raw_cell", "") or ""))

    # -------------------------------------------------------------------------------------------- GPU cap
    def apply_gpu_cap(self, gib: float) -> dict:
        """Cap PyTorch's caching allocator at ``gib`` GiB of this GPU (all of it when it has less).

        Where ``PYTORCH_CUDA_ALLOC_CONF`` already carries ``per_process_memory_fraction`` (the Colab rehearsal sets it
        where this PyTorch reads it), the allocator caps itself when the notebook first uses CUDA: nothing is
        imported here, so the kernel starts as it would on Colab, and the fraction in force is read back after the
        first cell that used CUDA (``fraction_seen``). Otherwise torch is imported and
        ``torch.cuda.set_per_process_memory_fraction`` applied now."""
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "per_process_memory_fraction" in conf:
            cap = {"applied": True, "gib": gib, "via": "PYTORCH_CUDA_ALLOC_CONF",
                   "why": f"PYTORCH_CUDA_ALLOC_CONF={conf}: the caching allocator stops at {gib:g} GiB from the "
                          "notebook's first use of CUDA"}
            self.stats["gpu_cap"] = cap
            _say(cap["why"])
            return cap
        try:
            import torch
        except ImportError:
            cap = {"applied": False, "gib": gib, "why": "torch is not installed: no GPU memory cap applied"}
        else:
            if not torch.cuda.is_available():
                cap = {"applied": False, "gib": gib, "why": "no CUDA device: no GPU memory cap applied"}
            else:
                total = torch.cuda.get_device_properties(0).total_memory
                fraction = min(1.0, gib * 2**30 / total)
                torch.cuda.set_per_process_memory_fraction(fraction, 0)
                cap = {"applied": True, "gib": gib, "via": "set_per_process_memory_fraction",
                       "fraction": round(fraction, 6), "total_bytes": total,
                       "why": f"torch.cuda.set_per_process_memory_fraction({fraction:.4f}) of "
                              f"{total / 2**30:.1f} GiB: the caching allocator stops at {gib:g} GiB"}
        self.stats["gpu_cap"] = cap
        _say(cap["why"])
        return cap

    # -------------------------------------------------------------------------------------------- peaks
    def _keep_max(self, key: str, value, cell: str) -> None:
        if value is None:
            return
        with self.lock:
            old = self.stats.get(key)
            if old is None or value > old:
                self.stats[key] = int(value)
                if old is None or value > old + max(16 * 2**20, old // 100):  # the cell that made the peak, not
                    self.stats["peak_cells"][key] = cell                   # one that added a few pages to it

    def start_sampler(self, every_s: float = 1.0) -> None:
        """Sample the resident memory of the kernel and its descendants every ``every_s`` (Linux only)."""
        if not os.path.isdir("/proc/self"):
            return

        def sample():
            while True:
                time.sleep(every_s)
                try:
                    self._keep_max("tree_max_rss_bytes", tree_rss_bytes(os.getpid()), self.cell_now)
                except Exception:  # noqa: BLE001 -- /proc races with processes that end; never fail the kernel
                    pass
        threading.Thread(target=sample, name="cgk-memory-sampler", daemon=True).start()

    def record(self, cell: str = "") -> dict:
        """Read the peaks now, keep the maxima, rewrite the stats file; returns the record."""
        self._keep_max("host_max_rss_bytes", own_peak_rss_bytes(), cell)
        if os.path.isdir("/proc/self"):
            self._keep_max("tree_max_rss_bytes", tree_rss_bytes(os.getpid()), cell)
        kit_env = sys.modules.get("cudagraph_kit.env")
        if kit_env is not None and hasattr(kit_env, "bf16_supported"):  # what the notebook's branches saw
            try:
                self.stats["bf16_supported"] = bool(kit_env.bf16_supported())
            except Exception as exc:  # noqa: BLE001
                self.stats["bf16_supported"] = f"{type(exc).__name__}: {exc}"
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                self.stats["torch_threads"] = torch.get_num_threads()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    self._keep_max("gpu_max_reserved_bytes", torch.cuda.max_memory_reserved(0), cell)
                    self._keep_max("gpu_max_allocated_bytes", torch.cuda.max_memory_allocated(0), cell)
                    free, total = torch.cuda.mem_get_info(0)
                    self._keep_max("gpu_device_used_max_bytes", total - free, cell)
                    self.stats["gpu_total_bytes"] = int(total)
                    cap, read = self.stats.get("gpu_cap"), getattr(torch.cuda, "get_per_process_memory_fraction", None)
                    if cap and read is not None:  # the cap in force, whichever way it was set
                        cap["fraction_seen"] = round(read(0), 6)
            except Exception as exc:  # noqa: BLE001 -- a broken CUDA context must not fail the notebook's cell
                self.stats["gpu_error"] = f"{type(exc).__name__}: {exc}"
        self.stats["cells"] += 1
        self.stats["kernel_wall_s"] = round(time.time() - self.started, 1)
        if self.stats_path:
            with self.lock:
                snapshot = json.loads(json.dumps(self.stats))
            _write_json(self.stats_path, snapshot)
        return self.stats


def own_peak_rss_bytes() -> int:
    """This process's peak resident memory since its ``exec``: ``VmHWM`` (Linux), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def tree_rss_bytes(pid: int) -> int:
    """Resident memory now of ``pid`` and all its descendants (Linux ``/proc``), each process counted by its
    proportional set size (PSS, ``/proc/PID/smaps_rollup``: a page that N processes share counts 1/N to each), so
    the pages a forked child (a DataLoader worker) shares with the kernel count once, not once per child; a
    process whose ``smaps_rollup`` cannot be read counts its whole resident size."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        size = _resident_bytes(p)
        if size is None:
            continue
        total += size
        todo.extend(children.get(p, ()))
    return total


def _resident_bytes(pid: int) -> int | None:
    """``pid``'s proportional set size (PSS), else its resident set size; None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024   # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def install(shell, settings_path=None) -> KernelHook | None:
    """Install the hook in the IPython ``shell`` (a kernel's) from the settings JSON at ``settings_path`` (default:
    the file ``$CGK_KERNEL_HOOK`` names, a variable it then removes, so an IPython started by the notebook, which
    inherits the IPython directory, installs nothing). Writes ``pid_file`` last, once ``SIGUSR1`` dumps the stacks,
    so a process that reads the pid there can send that signal safely."""
    settings_path = settings_path or os.environ.pop(ENV_VAR, None)
    if not settings_path:
        return None
    with open(settings_path) as f:
        settings = json.load(f)
    hook = KernelHook(settings)
    if hook.stacks is not None or hook.stats_path:
        shell.events.register("pre_run_cell", hook.pre_run_cell)
    if hook.stacks is not None or hook.stats_path:
        shell.events.register("post_run_cell", hook.post_run_cell)
    if settings.get("gpu_memory_gib"):
        hook.apply_gpu_cap(float(settings["gpu_memory_gib"]))
    if hook.stats_path:
        hook.record("(kernel start)")
        hook.start_sampler(float(settings.get("sample_every_s") or 1.0))
    if hook.stacks is not None and DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=hook.stacks, all_threads=True, chain=False)
        if settings.get("pid_file"):
            _write_json(settings["pid_file"], {"pid": os.getpid(), "dump_signal": int(DUMP_SIGNAL)})
    return hook


STARTUP_FILE = '''\
# Written by cudagraph_kit.course.running.reproduce: loads its kernel hook (stall watchdog; Colab rehearsal's limits).
def _cgk_kernel_hook():
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("cudagraph_kit_kernel_hook", {path!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install(get_ipython())
_cgk_kernel_hook()
del _cgk_kernel_hook
'''


def write_ipython_dir(folder, settings: dict) -> dict:
    """Make ``folder`` an IPython directory whose startup file installs this hook with ``settings``; return the
    environment variables that point a kernel at it (``IPYTHONDIR``, ``CGK_KERNEL_HOOK``).

    A fresh IPython directory also keeps a personal IPython profile (its startup files and kernel config) out of
    the run, so every reproduce kernel starts the same way."""
    from pathlib import Path

    folder = Path(folder)
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-cudagraph-kit.py").write_text(STARTUP_FILE.format(path=str(Path(__file__).resolve())))
    settings_path = folder / "cudagraph_kit_hook.json"
    settings_path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return {"IPYTHONDIR": str(folder), ENV_VAR: str(settings_path)}
