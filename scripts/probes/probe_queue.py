"""Experiments behind timing.py's floor (issue 8): profiler sessions with CUPTI teardown, kernels queued behind a
spin kernel, and the SM clock while eager code leaves the GPU mostly idle. Each case in its own process.

    python scripts/probes/probe_queue.py
"""
import argparse, os, subprocess, sys, time, statistics

CASES = {
    "A_teardown_plain": dict(TEARDOWN_CUPTI="1"),
    "B_teardown_spin_before_session": dict(TEARDOWN_CUPTI="1"),
    "C_teardown_nolazy_spin_inside": dict(TEARDOWN_CUPTI="1", DISABLE_CUPTI_LAZY_REINIT="1"),
    "D_no_teardown_spin_inside": dict(),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=[*CASES, "clocks"], help=argparse.SUPPRESS)  # each case's own process
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    xb, yb = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")
    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return step, g.replay


def busy(fn, calls, spin, where):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    if spin and where == "before":
        torch.cuda._sleep(40_000_000)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if spin and where == "inside":
            torch.cuda._sleep(40_000_000)
        for _ in range(calls): fn()
        torch.cuda.synchronize()
    iv = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                if e.device_type == DeviceType.CUDA and "spin" not in e.name)
    tot, cs, ce = 0.0, None, None
    for s_, e_ in iv:
        if ce is None or s_ > ce:
            if ce is not None: tot += ce - cs
            cs, ce = s_, e_
        else: ce = max(ce, e_)
    if ce is not None: tot += ce - cs
    return round(tot / calls, 1), len(iv) / calls


def child(name):
    eager, graph = build()
    spin = name != "A_teardown_plain"
    where = "before" if name.startswith("B") else "inside"
    for i in range(3):
        t0 = time.perf_counter()
        for label, fn in (("eager", eager), ("graph", graph)):
            b, k = busy(fn, 10, spin, where)
            print(f"{name} session {i} {label}: busy {b} us/call, {k:.0f} kernels/call", flush=True)
        print(f"  sessions took {time.perf_counter() - t0:.1f} s", flush=True)


def clocks():
    eager, graph = build()
    for label, fn, n in (("eager", eager, 600), ("graph", graph, 6000), ("eager", eager, 600)):
        rates = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.5:
            for _ in range(20): fn()
            rates.append(torch.cuda.clock_rate())
        torch.cuda.synchronize()
        print(f"clock while {label} runs: median {statistics.median(rates)} MHz (min {min(rates)}, max {max(rates)})", flush=True)


if __name__ == "__main__":
    if ARGS.case:
        clocks() if ARGS.case == "clocks" else child(ARGS.case)
        sys.exit(0)
    for name, extra in list(CASES.items()) + [("clocks", {})]:
        env = {k: v for k, v in os.environ.items() if k not in ("TEARDOWN_CUPTI", "DISABLE_CUPTI_LAZY_REINIT")}
        env.update(extra, PYTHONUNBUFFERED="1")
        try:
            p = subprocess.run([sys.executable, __file__, "--case", name], env=env, capture_output=True, text=True,
                               timeout=60)
            print(p.stdout, f"[{name}: rc={p.returncode}]", flush=True)
        except subprocess.TimeoutExpired as e:
            print((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), f"[{name}: TIMEOUT 60 s]", flush=True)
