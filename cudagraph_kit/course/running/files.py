"""Write files and folders whole or not at all, so an interrupted run never leaves half of something behind.

A file is written next to its target and renamed onto it (``os.replace``); a folder is built beside its target
and swapped in. Short steps that must not be cut in two run with Ctrl-C and SIGTERM held back until they end.

Example::

    from cudagraph_kit.course.running.files import write_text_atomic, replace_folder, interrupts_deferred
    write_text_atomic(Path("out/times.json"), "{}\\n")
    with interrupts_deferred():
        replace_folder(Path("build/stage/01_gelu"), Path("figures/01_gelu"))
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def copy_file_atomic(src: Path, dst: Path) -> Path:
    """Copy ``src`` to ``dst`` through a temporary file beside ``dst`` (never a half-copied ``dst``)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def move_file(src: Path, dst: Path) -> Path:
    """Move ``src`` onto ``dst`` in one rename (through a temporary file beside ``dst`` across file systems)."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError:  # another file system: copy beside the target first, then rename
        copy_file_atomic(src, dst)
        src.unlink()
    return dst


def replace_folder(new: Path, target: Path) -> Path:
    """Put the folder ``new`` at ``target``, replacing what was there whole (no stale file of the old one stays).

    ``new`` is first moved beside ``target`` (same file system), then the old folder is renamed away, the new
    one renamed in, and the old one removed. Run it inside :func:`interrupts_deferred`.
    """
    new, target = Path(new), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    incoming = target.with_name(f".{target.name}.incoming")
    outgoing = target.with_name(f".{target.name}.outgoing")
    for leftover in (incoming, outgoing):  # from a process killed in this very step (SIGKILL, power loss)
        if leftover.exists():
            shutil.rmtree(leftover)
    shutil.move(str(new), str(incoming))
    if target.exists():
        os.replace(target, outgoing)
    os.replace(incoming, target)
    shutil.rmtree(outgoing, ignore_errors=True)
    return target


@contextlib.contextmanager
def interrupts_deferred(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold back Ctrl-C (SIGINT) and SIGTERM while the block runs; deliver them when it ends.

    Outside the main thread (where Python cannot set signal handlers) the block simply runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)
