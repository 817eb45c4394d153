"""The decision chart "which CUDA-graph tool fits my step?": docs/decision_chart.png and docs/DECISIONS.md.

Every number on the chart is read here from the recorded results (``figures/<notebook>/results.csv`` and
``env.json``), with the GPU it was measured on; a branch whose result is not recorded is asked as a question
without a number. Nothing is typed by hand.

    python scripts/decision_chart.py --write   # write docs/DECISIONS.md and docs/decision_chart.png
    python scripts/decision_chart.py --check   # exit 1 if docs/DECISIONS.md is stale (the tests run this)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"
DOC = ROOT / "docs" / "DECISIONS.md"
PNG = ROOT / "docs" / "decision_chart.png"
NB = "../notebooks/"


def _load(stem: str, figures: Path):
    folder = figures / stem
    if not (folder / "results.csv").is_file():
        return None, {}
    env_path = folder / "env.json"
    return pd.read_csv(folder / "results.csv"), (json.loads(env_path.read_text()) if env_path.is_file() else {})


class Speedup(float):
    """A recorded speedup with its interval (``lo``/``hi``: the run's 90% prediction interval over timing windows,
    or None where the run measured one window only)."""
    lo = hi = None


def _value(df, column, **where):
    if df is None or column not in df.columns:
        return None
    rows = df
    for key, wanted in where.items():
        if key == "phase" and "phase" not in rows.columns and "window" in rows.columns:
            key = "window"  # runs recorded before 03's phases were named so
        if key not in rows.columns:
            return None
        rows = rows[rows[key] == wanted]
    values = rows[column].dropna()
    if not len(values):
        return None
    if column != "speedup":
        return float(values.iloc[0])
    row = rows.loc[values.index[0]]
    value = Speedup(values.iloc[0])
    if "windows" in rows.columns and pd.notna(row.get("speedup_lo")) and pd.notna(row.get("speedup_hi")):
        value.lo, value.hi = float(row.speedup_lo), float(row.speedup_hi)
    return value


def facts(figures: Path = FIGURES) -> dict:
    """The recorded numbers the chart quotes (None where a result is not recorded), with each notebook's GPU."""
    f = {}
    df, env = _load("01_gelu", figures)
    f["gpu01"] = env.get("gpu")
    f["small_eager"] = _value(df, "median_us", case="small", variant="eager")
    f["small_floor"] = _value(df, "floor_us", case="small", variant="graph replay")
    f["small_speedup"] = _value(df, "speedup", case="small", variant="graph replay")
    f["large_speedup"] = _value(df, "speedup", case="large", variant="graph replay")
    crossover = env.get("crossover_numel")
    f["crossover"] = int(crossover) if crossover else None
    if crossover and df is not None:
        exp = int(crossover).bit_length() - 1
        f["cross_eager"] = _value(df, "median_us", case=f"sweep 2^{exp}", variant="eager")
        f["cross_floor"] = _value(df, "floor_us", case=f"sweep 2^{exp}", variant="graph replay")
        f["cross_speedup"] = _value(df, "speedup", case=f"sweep 2^{exp}", variant="graph replay")
    df, env = _load("02_train_step", figures)
    f["gpu02"] = env.get("gpu")
    case = "MLP 32x128x256x16, SGD"
    f["whole_step"] = _value(df, "speedup", case=case, variant="whole-step graph")
    f["model_only"] = _value(df, "speedup", case=case, variant="make_graphed_callables (model only)")
    f["big_whole_step"] = _value(df, "speedup", case="MLP 640x4096x2048x1024, SGD", variant="whole-step graph")
    df, env = _load("03_jit_compile", figures)
    f["gpu03"] = env.get("gpu")
    f["ro_gelu"] = _value(df, "speedup", case="small", variant="reduce-overhead, naive (y = f(x))",
                          phase="1: before mark_step_begin")
    f["ro_mlp"] = _value(df, "speedup", case="MLP 12x(Linear 256+ReLU), batch 8",
                         variant="reduce-overhead + mark_step_begin")
    f["ro_train"] = _value(df, "speedup", case="MLP 12x(Linear 256+ReLU), batch 8, SGD training step",
                           variant="reduce-overhead forward+backward")
    f["kit_train"] = _value(df, "speedup", case="MLP 12x(Linear 256+ReLU), batch 8, SGD training step",
                            variant="kit whole-step graph")
    df, env = _load("04_resnet50", figures)
    f["gpu04"] = env.get("gpu")
    f["r50_bs1"] = _value(df, "speedup", case="inference fp16 bs1", variant="cuda graph (with input copy)")
    f["r50_bs128"] = _value(df, "speedup", case="inference fp16 bs128", variant="cuda graph (with input copy)")
    df, env = _load("06_variable_shapes", figures)
    f["gpu06"] = env.get("gpu")
    f["planned"] = _value(df, "speedup", case="MLP", variant="planned")
    f["ro_stream"] = _value(df, "speedup", case="MLP", variant="reduce-overhead")
    f["single_bucket"] = _value(df, "speedup", case="MLP", variant="single bucket")
    df, env = _load("08_llm_decode", figures)
    f["gpu08"] = env.get("gpu")
    f["llm_kit"] = _value(df, "speedup", case="decode step, batch 1", variant="kit graph (bucket)")
    f["llm_ro"] = _value(df, "speedup", case="decode step, batch 1", variant="reduce-overhead")
    f["llm_serving"] = _value(df, "speedup", case="serving loop", variant="planned set of graphs")
    return f


def _x(v) -> str:
    """A speedup as the chart prints it: with its prediction interval where the run measured one."""
    if getattr(v, "lo", None) is not None:
        return f"{v:.2f}x ({v.lo:.2f}-{v.hi:.2f})"
    return f"{v:.2f}x"


def _have(f, *keys) -> bool:
    return all(f.get(k) is not None for k in keys)


def branches(f: dict) -> list[dict]:
    """The chart, question by question: each with its yes/no outcome, the evidence and the section measuring it."""
    q1 = {"question": "Is the step host-bound? Is its eager time well above the time the GPU is busy?",
          "how": "Measure both: `cudagraph_kit.compare` (eager time) and `gpu_time` (GPU-busy time), or "
                 "`advise(fn, *args)` (`from cudagraph_kit.advice import advise`) for a prediction.",
          "no": "No graph: the GPU is the bottleneck, and a graph only removes launch time.",
          "no_link": f"[01, section 5]({NB}01_gelu.ipynb) (size sweep); [04, section 1]({NB}04_resnet50.ipynb) "
                     "(batch sweep)"}
    if _have(f, "small_eager", "small_floor", "small_speedup", "gpu01"):
        q1["evidence"] = (f"Small GELU on an {f['gpu01']}: eager {f['small_eager']:.1f} µs per call against "
                          f"{f['small_floor']:.1f} µs of GPU work; the graph is {_x(f['small_speedup'])} faster.")
    if _have(f, "crossover", "cross_eager", "cross_floor", "cross_speedup"):
        q1["no_evidence"] = (f"In 01's size sweep ({f['gpu01']}) the graph's whole 90% interval lies at or below 1.10x "
                             f"(at most 10% gained) from "
                             f"{f['crossover']:,} elements on, where the GPU is busy {f['cross_floor']:.0f} µs of a "
                             f"{f['cross_eager']:.0f} µs eager call ({_x(f['cross_speedup'])}).")
        if _have(f, "r50_bs1", "r50_bs128", "gpu04"):
            q1["no_evidence"] += (f" ResNet-50 inference in fp16 ({f['gpu04']}): {_x(f['r50_bs1'])} at batch 1, "
                                  f"{_x(f['r50_bs128'])} at batch 128.")
    q2 = {"question": "Do the input shapes change from call to call (batch size, sequence length)?",
          "yes": "Is it autoregressive LLM decoding (one token per step, a KV cache)?",
          "yes_yes": "LLM decode: notebook 08.",
          "yes_yes_link": f"[08]({NB}08_llm_decode.ipynb)",
          "yes_no": "Buckets: one graph per bucket size in a shared pool; pad, replay, slice "
                    "(`capture_buckets`, `plan_buckets`).",
          "yes_no_link": f"[06, sections 3-8]({NB}06_variable_shapes.ipynb)"}
    if _have(f, "llm_kit", "llm_ro", "llm_serving", "gpu08"):
        q2["yes_yes_evidence"] = (f"A small LLaMA-style model ({f['gpu08']}): one decode step at batch 1, the kit's "
                                  f"graph {_x(f['llm_kit'])} vs eager, `reduce-overhead` {_x(f['llm_ro'])}; a "
                                  f"serving loop on planned buckets {_x(f['llm_serving'])}.")
    if _have(f, "planned", "ro_stream", "single_bucket", "gpu06"):
        q2["yes_no_evidence"] = (f"MLP on a stream of request sizes ({f['gpu06']}): planned buckets "
                                 f"{_x(f['planned'])} vs eager, a single bucket {_x(f['single_bucket'])}, "
                                 f"`reduce-overhead` {_x(f['ro_stream'])}.")
    q3 = {"question": "Can the whole step be captured (forward, loss, backward and optimizer: static shapes, no CPU "
                      "sync, a capturable optimizer)?",
          "yes": "A whole-step graph: `capture_train_step` (or `torch.cuda.graph` by hand).",
          "yes_link": f"[02, sections 2-5]({NB}02_train_step.ipynb); [03, section 6]({NB}03_jit_compile.ipynb)"}
    if _have(f, "whole_step", "model_only", "gpu02"):
        q3["yes_evidence"] = (f"Small MLP + SGD ({f['gpu02']}): whole step {_x(f['whole_step'])} vs eager, the model "
                              f"alone (`make_graphed_callables`) {_x(f['model_only'])}.")
        if _have(f, "big_whole_step"):
            q3["yes_evidence"] += f" The large MLP (640x4096x2048x1024): {_x(f['big_whole_step'])}."
    q4 = {"question": "Is the model already compiled with `torch.compile`?",
          "yes": "`torch.compile(mode=\"reduce-overhead\")`, with `torch.compiler.cudagraph_mark_step_begin()`.",
          "yes_link": f"[03, sections 4-6]({NB}03_jit_compile.ipynb)",
          "no": "Partial capture: `graph_modules` / `torch.cuda.make_graphed_callables` for the capturable parts; "
                "the rest stays eager.",
          "no_link": f"[02, section 5]({NB}02_train_step.ipynb)"}
    if _have(f, "ro_gelu", "ro_mlp", "ro_train", "kit_train", "gpu03"):
        q4["yes_evidence"] = (f"{f['gpu03']}: a training step of a 12-layer MLP {_x(f['ro_train'])} (the kit's "
                              f"whole-step graph: {_x(f['kit_train'])}); its forward alone {_x(f['ro_mlp'])}; one "
                              f"small GELU {_x(f['ro_gelu'])}. Below 1x it loses to eager.")
    if _have(f, "model_only", "gpu02"):
        q4["no_evidence"] = (f"Small MLP + SGD ({f['gpu02']}): the model alone {_x(f['model_only'])}: the loss, "
                             "`zero_grad` and the optimizer still launch kernel by kernel.")
    return [q1, q2, q3, q4]


def markdown(f: dict) -> str:
    q1, q2, q3, q4 = branches(f)

    def ev(q, key):
        return f" *Recorded:* {q[key]}" if q.get(key) else " *Recorded:* no result yet; measure it on your GPU."

    lines = [
        "# Which CUDA-graph tool fits my step?",
        "",
        "<!-- generated by scripts/decision_chart.py from figures/*/results.csv; do not edit by hand -->",
        "",
        "![decision chart](decision_chart.png)",
        "",
        "The same chart as a list. Every number comes from a recorded run (`figures/<notebook>/results.csv`), with "
        "the GPU it was measured on; each branch links the notebook section that measures it. A speedup is the "
        "median of the per-round ratios eager time / variant time, timed round-robin; in parentheses, where the run "
        "timed several windows, its 90% prediction interval (where one more run should land). Recipes for each "
        "tool: [CHEATSHEET.md](CHEATSHEET.md).",
        "",
        f"1. **{q1['question']}** {q1['how']}{ev(q1, 'evidence')}",
        f"   - **No** → {q1['no']} ({q1['no_link']}){ev(q1, 'no_evidence')}",
        "   - **Yes** → question 2.",
        f"2. **{q2['question']}**",
        f"   - **Yes** → {q2['yes']}",
        f"     - **Yes** → {q2['yes_yes']} ({q2['yes_yes_link']}){ev(q2, 'yes_yes_evidence')}",
        f"     - **No** → {q2['yes_no']} ({q2['yes_no_link']}){ev(q2, 'yes_no_evidence')}",
        "   - **No** → question 3.",
        f"3. **{q3['question']}**",
        f"   - **Yes** → {q3['yes']} ({q3['yes_link']}){ev(q3, 'yes_evidence')}",
        "   - **No** → question 4.",
        f"4. **{q4['question']}**",
        f"   - **Yes** → {q4['yes']} ({q4['yes_link']}){ev(q4, 'yes_evidence')}",
        f"   - **No** → {q4['no']} ({q4['no_link']}){ev(q4, 'no_evidence')}",
        "",
        "Whatever the branch: compare the graphed result with eager first (`cudagraph_kit.verification.verify`), and check "
        "what breaks a capture before you capture (`check_capturable`, notebook 05).",
        "",
    ]
    return "\n".join(lines)


def draw(f: dict, path: Path = PNG):
    """The chart as a figure: questions on the left, the tools they lead to on the right."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q1, q2, q3, q4 = branches(f)

    def short(q, key):
        return q.get(key, "no recorded result yet")

    fig, ax = plt.subplots(figsize=(13, 10.5))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 10.5)
    ax.axis("off")
    qstyle = dict(boxstyle="round,pad=0.5", fc="#deebf7", ec="#3182bd")
    tstyle = dict(boxstyle="round,pad=0.5", fc="#e5f5e0", ec="#31a354")
    nstyle = dict(boxstyle="round,pad=0.5", fc="#f0f0f0", ec="#636363")

    def box(x, y, text, style, width=40, size=9):
        wrapped = "\n".join(textwrap.fill(part, width) for part in text.split("\n"))
        return ax.text(x, y, wrapped, ha="center", va="center", fontsize=size, bbox=style)

    def arrow(x0, y0, x1, y1, label):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="-|>", color="#636363", lw=1.2))
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, ha="center", fontsize=9, color="#636363", weight="bold",
                bbox=dict(fc="white", ec="none", pad=1.0))  # the label sits on the line, not struck through

    strip = lambda s: s.replace("`", "")  # noqa: E731
    qx, tx = 2.7, 9.0
    ys = [9.4, 7.0, 4.4, 1.9]
    for q, y in zip((q1, q2, q3, q4), ys):
        box(qx, y, strip(q["question"]), qstyle, width=36)
    for y0, y1 in zip(ys, ys[1:]):
        arrow(qx, y0 - 0.6, qx, y1 + 0.6, "no" if y0 != ys[0] else "yes")
    box(tx, 9.4, f"{strip(q1['no'])}\n{strip(short(q1, 'no_evidence'))}\n→ 01 §5, 04 §1", nstyle, width=58, size=8)
    arrow(qx + 2.1, 9.4, tx - 2.5, 9.4, "no")
    box(tx, 7.55, f"{strip(q2['yes_yes'])}\n{strip(short(q2, 'yes_yes_evidence'))}", tstyle, width=58, size=8)
    box(tx, 6.3, f"{strip(q2['yes_no'])}\n{strip(short(q2, 'yes_no_evidence'))}\n→ 06 §3-8", tstyle, width=58, size=8)
    arrow(qx + 2.1, 7.0, tx - 2.5, 7.55, "yes, LLM decode")
    arrow(qx + 2.1, 7.0, tx - 2.5, 6.3, "yes, other")
    box(tx, 4.4, f"{strip(q3['yes'])}\n{strip(short(q3, 'yes_evidence'))}\n→ 02 §2-5, 03 §6", tstyle, width=58, size=8)
    arrow(qx + 2.1, 4.4, tx - 2.5, 4.4, "yes")
    box(tx, 2.6, f"{strip(q4['yes'])}\n{strip(short(q4, 'yes_evidence'))}\n→ 03 §4-6", tstyle, width=58, size=8)
    box(tx, 0.8, f"{strip(q4['no'])}\n{strip(short(q4, 'no_evidence'))}\n→ 02 §5", tstyle, width=58, size=8)
    arrow(qx + 2.1, 1.9, tx - 2.5, 2.6, "yes")
    arrow(qx + 2.1, 1.9, tx - 2.5, 0.8, "no")
    ax.set_title("Which CUDA-graph tool fits my step? (numbers: recorded runs, GPU named)", fontsize=12)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite docs/DECISIONS.md and docs/decision_chart.png")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/DECISIONS.md is stale; write nothing")
    args = ap.parse_args(argv)
    f = facts()
    text = markdown(f)
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python scripts/decision_chart.py --write")
            return 1
        return 0
    DOC.write_text(text)
    draw(f)
    print(f"wrote {DOC.relative_to(ROOT)} and {PNG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
