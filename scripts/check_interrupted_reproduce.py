"""Interrupt a real ``reproduce`` midway on a GPU machine and show that the committed notebooks and figures did
not change: ``git status --porcelain`` and a checksum of every file under notebooks/ and figures/, before and after.

    python scripts/check_interrupted_reproduce.py            # Ctrl-C (SIGINT) 15 s into notebook 01
    python scripts/check_interrupted_reproduce.py --signal TERM --after 15
    python scripts/check_interrupted_reproduce.py --resume   # interrupt `reproduce 01 02` in 02, then --resume

``--resume`` publishes a fresh run of 01 and 02 into notebooks/ and figures/ (what reproduce is for): it checks
that nothing of 02 changed while 02 was interrupted, that the resumed run skips 01 and finishes 02, and shows
``check-figures``. The last line says RESULT: OK or RESULT: FAILED; the exit status is 0 or 1.
"""
import argparse
import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def state() -> dict:
    files = sorted(p for d in ("notebooks", "figures") for p in (ROOT / d).rglob("*")
                   if p.is_file() and ".ipynb_checkpoints" not in p.parts)
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def git_status() -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "notebooks", "figures"],
                              capture_output=True, text=True, timeout=60)
    except OSError:
        return "(git is not installed here)"
    return done.stdout if done.returncode == 0 else f"(no git repository here: {done.stderr.strip()})"


def run_and_interrupt(names, start_marker, after_s, sig) -> int:
    """Start reproduce, wait for ``start_marker`` in its output, let it run ``after_s`` more seconds, signal it."""
    import threading

    command = [sys.executable, "-m", "cudagraph_kit", "reproduce", *names]
    print(f"== {' '.join(command[2:])}; {sig.name} {after_s:g} s after '{start_marker}'", flush=True)
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = threading.Event()

    def echo():
        for line in proc.stdout:
            print("   | " + line, end="", flush=True)
            if start_marker in line:
                started.set()
    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    while not started.wait(0.5):
        if proc.poll() is not None:
            break
    if started.is_set():
        time.sleep(after_s)
        if proc.poll() is None:
            proc.send_signal(sig)
    status = proc.wait()
    reader.join(timeout=10)
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--after", type=float, default=15.0, help="seconds into the notebook (default 15)")
    parser.add_argument("--signal", choices=("INT", "TERM"), default="INT")
    parser.add_argument("--resume", action="store_true", help="interrupt 02 of `reproduce 01 02`, then --resume")
    args = parser.parse_args()
    sig = getattr(signal, "SIG" + args.signal)
    names = ["01", "02"] if args.resume else ["01"]
    target = "02_train_step" if args.resume else "01_gelu"
    print("== before: git status --porcelain -- notebooks figures\n" + (git_status() or "(clean)"), flush=True)
    before = state()
    status = run_and_interrupt(names, f"{target}.py: ", args.after, sig)
    print(f"== reproduce exited with status {status} (130 expected: interrupted)", flush=True)
    print("== after: git status --porcelain -- notebooks figures\n" + (git_status() or "(clean)"), flush=True)
    after = state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    print("== files that changed: " + (", ".join(changed) if changed else "none"), flush=True)
    ok = status == 130
    if not args.resume:
        ok = ok and not changed
        print(f"RESULT: {'OK' if ok else 'FAILED'}: notebooks/ and figures/ "
              f"{'are byte-identical' if not changed else 'CHANGED'} after the interruption")
        return 0 if ok else 1
    touched_02 = [k for k in changed if target in k]
    ok = ok and not touched_02 and any("01_gelu" in k for k in changed)
    print(f"== interrupted run: 01 published {'whole' if any('01_gelu' in k for k in changed) else 'NOT'}; "
          f"02 {'untouched' if not touched_02 else 'TOUCHED: ' + ', '.join(touched_02)}", flush=True)
    resumed = subprocess.run([sys.executable, "-m", "cudagraph_kit", "reproduce", *names, "--resume"], cwd=ROOT,
                             capture_output=True, text=True)
    print(resumed.stdout + resumed.stderr, flush=True)
    ok = ok and resumed.returncode == 0 and "01_gelu.py: published by run" in resumed.stdout
    check = subprocess.run([sys.executable, "-m", "cudagraph_kit", "check-figures"], cwd=ROOT, capture_output=True,
                           text=True)
    print("== check-figures\n" + check.stdout + check.stderr, flush=True)
    print(f"RESULT: {'OK' if ok else 'FAILED'}: interrupted in 02, resumed, 01 and 02 from one run")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
