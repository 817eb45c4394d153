"""``reproduce`` never hangs silently: per-cell limits from the recorded run, stacks in the log, a clear stop.

A notebook that stalls under papermill shows nothing: no output, no error, until an outer ``timeout`` kills the
kernel ("Kernel died"). :class:`CellWatch` gives every cell two limits, computed by :class:`CellLimits` from the
cell's time on a recorded run of the same kind (same GPU, same size):

- **stall** (5x its recorded time, at least 2 minutes): the kernel writes every thread's Python stack into a file
  (``faulthandler``, armed per cell by :mod:`.kernel_hook`), and the watch copies it into the run's log (stderr)
  under a line naming the cell. The cell goes on running.
- **stop** (10x, at least 5 minutes): the watch asks the kernel for the stacks once more (``SIGUSR1``), then
  nbclient's per-cell timeout stops the cell and :class:`CellStalled` says which cell, its recorded time, its limit
  and where the stacks are. ``reproduce`` prints that and puts it in its summary.

Cells with no recorded time get fixed limits (5 and 30 minutes). ``CellLimits(scale=3)`` loosens all of them (a
slower setup: the Colab rehearsal's two CPU cores); tests inject limits of a second or two.

The watch also shuts a finished kernel down without a ``SIGINT``: jupyter_client interrupts every kernel before it
asks it to shut down (meant for a busy one); when the kernel is still finishing its last reply, ipykernel catches
that interrupt inside its message handler and logs ``[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.``
(about one run in ten). The kernel manager of :meth:`CellWatch.kernel_manager_class` interrupts only a kernel that
is still running a cell (Ctrl-C, a stop limit), where the interrupt is what ends the cell.

Example::

    from cudagraph_kit.course.running.watchdog import CellLimits
    CellLimits().for_cell(16.0)      # (120.0, 300.0): stacks after 2 minutes, stop after 5
    CellLimits().for_cell(None)      # (300.0, 1800.0): no recorded time
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import kernel_hook


@dataclass(frozen=True)
class CellLimits:
    """When a cell counts as stalled (stacks into the log) and when the run stops it, in seconds."""
    dump_factor: float = 5.0        # stall: this many times the cell's recorded time ...
    dump_min_s: float = 120.0       # ... and at least this long
    stop_factor: float = 10.0       # stop: this many times its recorded time ...
    stop_min_s: float = 300.0       # ... and at least this long
    unrecorded_dump_s: float = 300.0          # a cell with no recorded time (new, or no run of this kind)
    unrecorded_stop_s: float | None = 1800.0  # None: never stopped
    scale: float = 1.0              # multiplies every limit (a slower machine than the recorded one)
    grace_s: float = 5.0            # from the stop limit's stack dump to the stop (the kernel writes its stacks)
    poll_s: float = 0.5             # how often the watch looks at the stacks file and the clock

    def for_cell(self, recorded_s: float | None) -> tuple[float, float | None]:
        """(stall, stop) limits of a cell that took ``recorded_s`` on the recorded run (None: not recorded)."""
        if recorded_s is None:
            dump, stop = self.unrecorded_dump_s, self.unrecorded_stop_s
        else:
            dump = max(self.dump_factor * recorded_s, self.dump_min_s)
            stop = max(self.stop_factor * recorded_s, self.stop_min_s)
        dump *= self.scale
        stop = None if stop is None else max(stop * self.scale, dump)
        return dump, stop

    def describe(self) -> str:
        scale = f", all x{self.scale:g}" if self.scale != 1 else ""
        return (f"stacks into the log at {self.dump_factor:g}x a cell's recorded time (at least "
                f"{self.dump_min_s:g} s), stop at {self.stop_factor:g}x (at least {self.stop_min_s:g} s); "
                f"unrecorded cells {self.unrecorded_dump_s:g} s / "
                f"{'never' if self.unrecorded_stop_s is None else f'{self.unrecorded_stop_s:g} s'}{scale}")


class CellStalled(RuntimeError):
    """A cell ran past its stop limit; the run stopped it. The message names the cell, its recorded time, the limit
    and where its stacks are."""

    def __init__(self, index: int, total: int, first_line: str, recorded_s, stop_s: float, stacks: Path,
                 dumped: bool):
        self.index, self.total, self.first_line = index, total, first_line
        self.recorded_s, self.stop_s, self.stacks = recorded_s, stop_s, Path(stacks)
        took = "no recorded time" if recorded_s is None else f"{recorded_s:.1f} s on the recorded run"
        where = (f"every thread's Python stack: {self.stacks} (also in the log above)" if dumped
                 else f"no stack was written (the kernel hook did not answer); expected in {self.stacks}")
        super().__init__(f"cell {index}/{total} `{first_line}` ran past its stop limit of {stop_s:.0f} s "
                         f"({took}) and was stopped; {where}")

    @property
    def cell_text(self) -> str:
        """'cell N/M: <first code line>', as ``reproduce`` names a failing cell."""
        return f"cell {self.index}/{self.total}: {self.first_line}"

    def short(self) -> str:
        """The summary line's text: cell, its limit and recorded time, the stacks file."""
        took = "unrecorded" if self.recorded_s is None else f"recorded {self.recorded_s:.1f} s"
        return f"at {self.cell_text} (past {self.stop_s:.0f} s, {took}); stacks {self.stacks}"


def _first_line(source: str, width: int = 64) -> str:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    text = lines[0] if lines else "(comments only)"
    return text if len(text) <= width else text[:width - 3] + "..."


class CellWatch:
    """One notebook's watchdog on ``reproduce``'s side (see the module's docstring).

    ``folder``: where the kernel hook's files go (its IPython directory, settings, pid file; the stacks file is
    ``stacks``). ``recorded``: seconds per cell source on the recorded run. ``code_cells``: how many code cells the
    notebook runs (for "cell N/M"). ``kernel_settings``: more settings for :mod:`.kernel_hook` (GPU cap, stats).
    Use as a context manager around the notebook's execution.
    """

    def __init__(self, folder, stacks, recorded: dict | None = None, limits: CellLimits | None = None,
                 code_cells: int = 0, kernel_settings: dict | None = None, stream=None, cap_s: float | None = None):
        self.folder, self.stacks = Path(folder), Path(stacks)
        self.recorded = dict(recorded or {})
        self.limits = limits or CellLimits()
        self.code_cells, self.cap_s = code_cells, cap_s
        self.stream = stream
        self.pid_file = self.folder / "kernel_pid.json"
        self.kernel_settings = dict(kernel_settings or {})
        self.index, self.cell, self.started, self.busy = 0, None, None, False
        self.stop_signalled = self.stop_reached = False
        self.dumps = 0
        self._offset, self._seen_size = 0, 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = None

    # ------------------------------------------------------------------------------------------------ limits
    def limits_for(self, source) -> tuple[float, float | None]:
        """(stall, stop) limits of the cell with this source (None: a cell with no recorded time)."""
        dump, stop = self.limits.for_cell(self.recorded.get(source) if source is not None else None)
        if self.cap_s is not None:  # the caller's own per-cell timeout (execute_notebook's timeout_s)
            stop = self.cap_s if stop is None else min(stop, self.cap_s)
            dump = min(dump, stop)
        return dump, stop

    def settings(self) -> dict:
        """The kernel hook's settings: the stacks file, the pid file and each recorded cell's stall limit."""
        limits = {kernel_hook.cell_key(src): self.limits_for(src)[0] for src in self.recorded if src is not None}
        return dict(self.kernel_settings, stacks=str(self.stacks), pid_file=str(self.pid_file), limits=limits,
                    default_limit_s=self.limits_for(None)[0])

    def environment(self) -> dict:
        """Environment variables that make a kernel install the hook (a fresh IPython directory under ``folder``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stacks.parent.mkdir(parents=True, exist_ok=True)
        self.stacks.write_text("")
        self.pid_file.unlink(missing_ok=True)
        return kernel_hook.write_ipython_dir(self.folder / "ipython", self.settings())

    # ------------------------------------------------------------------------------------------------ nbclient hooks
    def on_cell_start(self, cell) -> None:
        if cell.cell_type != "code":
            return
        self._read_stacks(final=True)  # a dump of the previous cell belongs under its own header
        with self._lock:
            self.index += 1
            self.cell, self.started, self.busy = cell, time.monotonic(), True
            self.stop_signalled = self.stop_reached = False

    def on_cell_executed(self, **kwargs) -> None:
        with self._lock:
            self.busy = False

    def timeout_func(self, cell):
        """nbclient's per-cell timeout: the stop limit plus the grace for the last stack dump."""
        stop = self.limits_for(cell.source)[1]
        return None if stop is None else stop + self.limits.grace_s

    def kernel_manager_class(self):
        """jupyter_client's AsyncKernelManager, except that shutting down a kernel that is not running a cell sends no
        SIGINT first (see the module's docstring), and a kernel stopped at a cell's stop limit is killed at once
        (with its process group) rather than interrupted and asked to shut down, which a stuck kernel ignores."""
        from jupyter_client.manager import AsyncKernelManager
        watch = self

        class KernelManager(AsyncKernelManager):
            async def shutdown_kernel(self, now: bool = False, restart: bool = False):
                if watch.stop_reached:  # a stalled cell: its stacks are written; end it and its children now
                    now = True
                return await super().shutdown_kernel(now=now, restart=restart)

            async def _async_interrupt_kernel(self):  # jupyter_client calls it first thing in every shutdown
                if getattr(self, "shutting_down", False) and (watch.stop_reached or not watch.busy):
                    return  # idle: the shutdown request alone ends it, and no SIGINT races its last reply
                await super()._async_interrupt_kernel()
        return KernelManager

    # ------------------------------------------------------------------------------------------------ the thread
    def __enter__(self):
        self._done.clear()
        self._thread = threading.Thread(target=self._run, name="cgk-cell-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._read_stacks(final=True)
        return False

    def _run(self) -> None:
        while not self._done.wait(self.limits.poll_s):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 -- the watch must never take the run down
                self._say(f"reproduce: the cell watch stumbled ({type(exc).__name__}: {exc}); going on")

    def _tick(self) -> None:
        with self._lock:
            cell, started, busy = self.cell, self.started, self.busy
        if busy and cell is not None:
            stop = self.limits_for(cell.source)[1]
            if stop is not None and time.monotonic() - started >= stop:
                self.stop_reached = True
                if not self.stop_signalled:
                    self.stop_signalled = True
                    self._signal_kernel()
        self._read_stacks()

    def _kernel_pid(self):
        try:
            data = json.loads(self.pid_file.read_text())
        except (OSError, ValueError):
            return None, None
        return data.get("pid"), data.get("dump_signal")

    def _signal_kernel(self) -> None:
        pid, sig = self._kernel_pid()
        if pid is None or sig is None:  # the hook never confirmed: an unhandled SIGUSR1 would kill the kernel
            self._say("reproduce: cannot ask the kernel for its stacks (its hook wrote no pid file)")
            return
        try:
            os.kill(int(pid), signal.Signals(int(sig)))
        except (OSError, ValueError) as exc:
            self._say(f"reproduce: could not signal the kernel {pid} for its stacks: {exc}")

    def _read_stacks(self, final: bool = False) -> None:
        """Copy a finished stack dump (the file stopped growing) into the log under a line naming the cell."""
        with self._lock:
            try:
                size = self.stacks.stat().st_size
            except OSError:
                return
            if size <= self._offset:
                return
            if size != self._seen_size and not final:  # still being written: take it on the next look
                self._seen_size = size
                return
            with open(self.stacks, "rb") as f:
                f.seek(self._offset)
                text = f.read(size - self._offset).decode("utf-8", "replace")
            self._offset = self._seen_size = size
            self.dumps += 1
            cell, started = self.cell, self.started
            signalled = self.stop_signalled
        source = cell.source if cell is not None else ""
        ran = f"{time.monotonic() - started:.0f} s" if started is not None else "?"
        dump, stop = self.limits_for(source)
        recorded = self.recorded.get(source)
        took = "no recorded time" if recorded is None else f"{recorded:.1f} s on the recorded run"
        why = (f"its stop limit ({stop:.0f} s): it is being stopped" if signalled else
               f"past its stall limit of {dump:.0f} s ({took}); it goes on, and stops at "
               f"{'no limit' if stop is None else f'{stop:.0f} s'}")
        self._say(f"reproduce: cell {self.index}/{self.code_cells} `{_first_line(source)}` has run {ran}, {why}. "
                  f"Every thread's Python stack in the kernel (also in {self.stacks}):\n"
                  + "\n".join("    " + line for line in text.rstrip("\n").splitlines()))

    def _say(self, text: str) -> None:
        stream = self.stream or sys.stderr
        print(text, file=stream, flush=True)

    # ------------------------------------------------------------------------------------------------ the stop
    def stalled(self) -> CellStalled | None:
        """The :class:`CellStalled` for the current cell if it ran past its stop limit (else None)."""
        with self._lock:
            cell, started = self.cell, self.started
        if cell is None or started is None:
            return None
        stop = self.limits_for(cell.source)[1]
        if stop is None or not (self.stop_reached or time.monotonic() - started >= stop):
            return None
        self._read_stacks(final=True)
        return CellStalled(self.index, self.code_cells, _first_line(cell.source), self.recorded.get(cell.source),
                           stop, self.stacks, dumped=self.dumps > 0)
