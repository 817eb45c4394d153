"""Probe: notebook 05, "Going further" F, where does graph 1's replay fault when every tracked tensor's first byte
lies free in the allocator's cache (still mapped)?

Runs the "drop" variants of ``two_captures`` again, each try in a fresh process, and classifies each tensor graph 1
reads by its **whole span**, first and last byte, against ``torch.cuda.memory_snapshot()``: allocated, free in cache,
or returned to the driver, and whether the span now crosses the end of the segment that holds its first byte.
Run on a GPU: ``python scripts/probes/probe_two_captures.py [--tries 3] > OUT.jsonl``.
"""
import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: scripts/probes/ -> root
from cudagraph_kit.course.lessons.pitfall_scripts import docs_recipe_capture, emit, run_isolated  # noqa: E402

VARIANTS = ("keep everything", "drop", "drop, replay right after capture")


def _state(segments, addr):
    for seg in segments:
        if seg["address"] <= addr < seg["address"] + seg["total_size"]:
            start = seg["address"]
            for block in seg["blocks"]:
                if start <= addr < start + block["size"]:
                    return ("allocated" if block["state"] == "active_allocated" else "free in cache"), seg
                start += block["size"]
    return "returned to the driver", None


def drop_probe(variant: str) -> None:
    import torch

    def build(seed, replay_now=False):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4096, 2048), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(2048, 1024), torch.nn.Dropout(0.1)).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
        x, y = torch.randn(640, 4096, device="cuda"), torch.randn(640, 1024, device="cuda")
        graph, loss = docs_recipe_capture(model, opt, x, y)
        if replay_now:
            graph.replay()
        named = {"inputs": [x, y], "parameters": list(model.parameters()),
                 "gradients": [p.grad for p in model.parameters()],
                 "optimizer state": [v for s in opt.state.values() for v in s.values()]}
        spans = [(k, t.data_ptr(), t.untyped_storage().nbytes()) for k, ts in named.items() for t in ts]
        return graph, loss, spans, (model, opt, x, y)

    # as in two_captures, the static losses stay referenced (their autograd graphs keep the parameters alive)
    g1, loss1, spans, owner1 = build(0, replay_now=variant.endswith("right after capture"))
    if variant != "keep everything":
        del owner1
    g2, loss2, _, owner2 = build(1)
    segments = torch.cuda.memory_snapshot()
    counts = {}
    for kind, ptr, size in spans:
        first, seg = _state(segments, ptr)
        last, _ = _state(segments, ptr + size - 1)
        crosses = seg is not None and ptr + size > seg["address"] + seg["total_size"]
        key = f"{kind}: {first}" + (f" .. {last}" if last != first else "") + (" (crosses its segment's end)"
                                                                               if crosses else "")
        counts[key] = counts.get(key, 0) + 1
    out = {"variant": variant, "graph 1 memory": counts}
    emit(out)
    try:
        g1.replay()
        torch.cuda.synchronize()
        out["replay of graph 1"] = "ok"
    except Exception as e:  # noqa: BLE001 -- the fault is the result
        out["replay of graph 1"] = f"{type(e).__name__}: {str(e)[:100]}"
    emit(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=3, help="fresh processes per variant (default 3)")
    tries = ap.parse_args().tries
    jobs = [v for v in VARIANTS for _ in range(tries)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        for variant, r in zip(jobs, pool.map(lambda v: run_isolated(drop_probe, v, timeout=180), jobs)):
            print(json.dumps({"variant": variant, **r}), flush=True)
