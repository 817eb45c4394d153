"""Experiment behind timing.py's design (issue 8): profiler residue, CUPTI teardown, and what a 'floor' is.

Plain PyTorch only (no kit), so the kit's own choices can be checked against it. Each part runs in its own
process so a crash or a profiler residue in one cannot leak into another:

    python scripts/probes/probe_floor.py            # all parts, prints one table per part

Parts:
- residue: eager and copy+replay times before/after one profiler session, with TEARDOWN_CUPTI unset and with it
  set *inside* the process (os.environ, before the first profile); graphs stay alive across three profiler
  sessions and a capture after teardown, and every replay is checked against eager.
- floor: for small GELU and a small-MLP Adam step, eager and graph: the profiler's busy time (union of kernel and
  copy intervals) as the calls come, and again with the calls queued behind a spin kernel so the GPU runs them back
  to back; plus CUDA-event time of the queued calls without a profiler.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PARTS = ("residue_plain", "residue_teardown", "floor")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # how the probe starts each part's process
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()  # --help and a mistyped option answer here, before PyTorch loads

import torch  # noqa: E402


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def per_call_us(fn, calls, samples=5):
    out = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(out)


def graph_of(fn, warmup=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def profile_busy(fn, calls, queue_behind_us=0.0):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    cycles = None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if queue_behind_us:
            cycles = int(queue_behind_us * SLEEP_CYCLES_PER_US)
            torch.cuda._sleep(cycles)
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    iv, kernels, names = [], 0, {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and "sleep" not in e.name:
            iv.append((e.time_range.start, e.time_range.end))
            kernels += 1
            names[e.name] = names.get(e.name, 0) + e.time_range.elapsed_us()
    iv.sort()
    total, cs, ce = 0.0, None, None
    for s, e in iv:
        if ce is None or s > ce:
            if ce is not None:
                total += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    if ce is not None:
        total += ce - cs
    span = (iv[-1][1] - iv[0][0]) if iv else 0.0
    return total / calls, kernels / calls, span / calls


def queued_event_us(fn, calls, queue_behind_us):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(queue_behind_us * SLEEP_CYCLES_PER_US))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    still_sleeping = not start.query()  # the host finished queueing before the GPU reached the calls
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, still_sleeping


def calibrate_sleep():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e3)


SLEEP_CYCLES_PER_US = None


def part_residue(teardown_inside):
    if teardown_inside:
        os.environ["TEARDOWN_CUPTI"] = "1"
    x = torch.randn(1, 3, 224, 224, device="cuda")
    new = torch.randn_like(x)
    g, out = graph_of(lambda: gelu(x))
    def kit_like():
        x.copy_(new)
        g.replay()
    rows = {}
    for phase in range(4):
        rows[f"eager_{phase}"] = per_call_us(lambda: gelu(x), 3000)
        rows[f"copy+replay_{phase}"] = per_call_us(kit_like, 3000)
        rows[f"replay_{phase}"] = per_call_us(g.replay, 3000)
        if phase < 3:
            busy, k, _ = profile_busy(kit_like, 20)
            rows[f"profiled_kernels_{phase}"] = k
            # a new capture after the teardown, and the old graph still right
            g2, out2 = graph_of(lambda: gelu(x) * 2)
            x.copy_(new)
            g.replay()
            g2.replay()
            torch.cuda.synchronize()
            ok = torch.equal(out, gelu(new)) and torch.allclose(out2, gelu(new) * 2)
            rows[f"correct_after_{phase}"] = bool(ok)
    return rows


def part_floor():
    global SLEEP_CYCLES_PER_US
    SLEEP_CYCLES_PER_US = calibrate_sleep()
    res = {"sleep_cycles_per_us": SLEEP_CYCLES_PER_US}
    x = torch.randn(1, 3, 224, 224, device="cuda")
    xl = torch.randn(32, 3, 224, 224, device="cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    xb, yb = torch.randn(32, 128, device="cuda"), torch.randn(32, 16, device="cuda")

    def step_eager():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    gstep = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(gstep):
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    gs, _ = graph_of(lambda: gelu(x))
    gl, _ = graph_of(lambda: gelu(xl))
    cases = {
        "gelu small eager": (lambda: gelu(x), 3000, 50),
        "gelu small graph": (gs.replay, 3000, 50),
        "gelu large eager": (lambda: gelu(xl), 500, 50),
        "gelu large graph": (gl.replay, 500, 50),
        "mlp adam eager (grads zeroed in place)": (step_eager, 300, 20),
        "mlp adam graph": (gstep.replay, 300, 20),
    }
    # time everything first (no profiler yet), round-robin
    times = {k: [] for k in cases}
    for r in range(5):
        for name, (fn, calls, _) in cases.items():
            times[name].append(per_call_us(fn, calls, samples=1))
    for name, (fn, calls, pcalls) in cases.items():
        t = statistics.median(times[name])
        ev, still = queued_event_us(fn, pcalls, queue_behind_us=3 * t * pcalls + 2000)
        res[name] = {"median_us": t, "queued_event_us": ev, "queued_ok": still}
    os.environ["TEARDOWN_CUPTI"] = "1"
    for name, (fn, calls, pcalls) in cases.items():
        t = res[name]["median_us"]
        busy, k, span = profile_busy(fn, pcalls)
        qbusy, qk, qspan = profile_busy(fn, pcalls, queue_behind_us=3 * t * pcalls + 2000)
        res[name].update({"busy_us": busy, "kernels": k, "span_us": span,
                          "queued_busy_us": qbusy, "queued_span_us": qspan})
    # after all profiling (teardown on): eager gelu again
    res["gelu small eager after profiling"] = per_call_us(lambda: gelu(x), 3000)
    res["gelu small eager before profiling"] = res["gelu small eager"]["median_us"]
    return res


def main(part=None):
    if part is not None:
        out = part_floor() if part == "floor" else part_residue(part == "residue_teardown")
        print("RESULT " + json.dumps(out))
        return
    print(torch.cuda.get_device_name(0), torch.__version__, torch.version.cuda)
    for part in PARTS:
        env = dict(os.environ)
        env.pop("TEARDOWN_CUPTI", None)
        p = subprocess.run([sys.executable, __file__, "--part", part], capture_output=True, text=True, env=env,
                           timeout=300)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        print(f"== {part}: rc={p.returncode}")
        if line:
            print(json.dumps(json.loads(line[0][7:]), indent=1))
        else:
            print(p.stdout[-2000:], p.stderr[-3000:])


if __name__ == "__main__":
    main(ARGS.part)
