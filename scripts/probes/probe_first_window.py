"""Probe: why is the first timing window after a capture slower for small whole-step graphs?

Notebook 02 times its cases in windows; its first window gave the small MLP's whole-step graph a 2-4x lower speedup
than the later ones (3.67x against 12.5x), in two runs. The suspect is the kit's calibration: ``compare`` picks
the calls per sample from its warm-up, and the step captures its graph inside that warm-up. When the batch that
ends the warm-up holds the capture, the estimate says one call per sample, and a one-call sample adds the
synchronize to a replay of about 75 us.

This probe rebuilds notebook 02's case (MLP 32x128x256x16, dropout, SGD): an eager step and ``capture_train_step``,
each called twice first, as the notebook does, so the capture lands in window 1's warm-up. It times them with
``compare`` in ``--windows`` windows a pause apart and records, per window, each variant's median, its calls per
sample and the speedup. It also times, on a second step, the call that captures. Run it once per kit copy::

    python scripts/probes/probe_first_window.py --out build/first_window --label fixed
    python scripts/probes/probe_first_window.py --out build/first_window --label before --kit build/kit-before

``--kit`` is a folder holding another ``cudagraph_kit`` (e.g. ``git archive <commit> cudagraph_kit | tar -x -C
build/kit-before``). Rows are appended to ``first_window.csv`` in ``--out``. Needs CUDA (without it the "graph" runs
eagerly: plumbing only, no result).
"""
import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/probes/ -> root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", required=True, help="names this kit copy in the CSV")
    ap.add_argument("--kit", type=Path, default=ROOT, help="folder that holds the cudagraph_kit to probe")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--pause", type=float, default=1.0)
    args = ap.parse_args()
    sys.path.insert(0, str(args.kit.resolve()))

    import copy

    import torch

    import cudagraph_kit
    from cudagraph_kit import capture_train_step, compare

    kit_dir = Path(cudagraph_kit.__file__).resolve().parent
    kit_path = str(kit_dir.relative_to(ROOT)) if ROOT in kit_dir.parents else kit_dir.name  # no machine paths
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Dropout(0.2), torch.nn.Linear(256, 16),
                               torch.nn.Dropout(0.1)).to(dev)
    x, y = torch.randn(32, 128, device=dev), torch.randn(32, 16, device=dev)
    loss_fn = torch.nn.MSELoss()

    def eager_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def run(x, y):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return run

    def graphed_step(model):
        return capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, (x, y),
                                  eager_fallback=True)

    # how long the call that captures takes (warm-up 3: calls 1-3 eager, call 4 captures and replays)
    probe = graphed_step(copy.deepcopy(base))
    for _ in range(3):
        probe(x, y)
    torch.cuda.synchronize() if dev == "cuda" else None
    t0 = time.perf_counter()
    probe(x, y)
    torch.cuda.synchronize() if dev == "cuda" else None
    capture_ms = (time.perf_counter() - t0) * 1e3
    del probe

    variants = {"eager": eager_step(copy.deepcopy(base)), "whole-step graph": graphed_step(copy.deepcopy(base))}
    for fn in variants.values():  # as notebook 02: two calls each, so the capture falls inside window 1
        for _ in range(2):
            fn(x, y)
    rows = []
    for w in range(args.windows):
        df = compare(variants, x, y, case="MLP 32x128x256x16, SGD", samples=3, floor=False)
        for r in df.itertuples():
            rows.append({"kit": args.label, "gpu": torch.cuda.get_device_name() if dev == "cuda" else "CPU",
                         "torch": torch.__version__, "kit_path": kit_path,
                         "window": w + 1, "variant": r.variant, "median_us": round(r.median_us, 2),
                         "calls_per_sample": r.calls, "speedup": round(r.speedup, 3),
                         "capture_call_ms": round(capture_ms, 1)})
            print(f"{args.label} window {w + 1}: {r.variant:18s} {r.median_us:9.1f} us, {r.calls:5d} calls/sample, "
                  f"speedup {r.speedup:.2f}x")
        time.sleep(args.pause)
    print(f"{args.label}: the call that captures took {capture_ms:.1f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "first_window.csv"
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
