"""advise's predictions beside what was measured (notebook 05).

This run's, shown as a table with their claims (or, without a GPU, the recorded GPU run's), the rows fitted after
the fact from notebooks 01-04's recorded timings, their summary per source, and the rows they leave in results.csv.
The claims themselves are in ``claims.py`` (``advise_claim``, ``advise_words_claim``) and ``verdicts.py``
(``advise_vs_measured``, ``advise_overall_claim``); the figure is ``figures.plot_advise``.

Example::

    from cudagraph_kit.course.measuring import results
    from cudagraph_kit.course.measuring.predictions import advice_summary, fitted_row, recorded_headlines
    rows = [fitted_row(results, stem, case, base, graph, cost)
            for stem, heads in recorded_headlines(results).items() for case, base, graph in heads]
"""
from __future__ import annotations

__all__ = ["show_advise", "show_predictions", "recorded_headlines", "fitted_row", "advice_summary", "advice_from_saved",
           "advice_rows"]


def _advise_sentences(pairs, headlines):
    """The sentences of the advise claims among ``pairs`` ((id, sentence)): all of them, or only ``headlines`` (ids,
    in that order) with a last line counting the others."""
    pairs = [(c, st) for c, st in pairs if str(c).startswith("advise_")]
    if headlines is None:
        return [st for _, st in pairs]
    shown = [st for h in headlines for c, st in pairs if c == h]
    rest = len(pairs) - len(shown)
    return shown + ([f"{rest} more verdict{'s' * (rest > 1)} of this experiment: \"Going further\" lists "
                     f"{'them' if rest > 1 else 'it'}."] if rest else [])


def show_advise(table, claims, stem, headlines=None):
    """Print section 7's reading: per case, advise's prediction beside the measured speedup and its interval
    (``table``, from ``advise_vs_measured``), then the sentences of the advise claims in ``claims``: all of them, or
    with ``headlines`` (claim ids) only those, in that order, and a line counting the others. Without a GPU
    (``table`` empty) the recorded GPU run's predictions and sentences instead, under a line naming that run."""
    import pandas as pd

    from .claims import load_claims
    from .results import load

    if len(table):
        print(table[["case", "predicted_speedup", "measured_speedup", "measured_lo", "measured_hi"]].round(2)
              .to_string(index=False))
        print("\n".join(_advise_sentences([(c.claim, c.statement) for c in claims], headlines)))
        return
    rec = load(stem)
    if rec is None:
        print("No GPU here: advise measures on an NVIDIA GPU, and no recorded GPU run was found.")
        return
    rows = rec.df[rec.df.case.astype(str).str.startswith("advise: ")]
    shown = pd.DataFrame({"case": rows.case.str.removeprefix("advise: "), "predicted_speedup": rows.speedup,
                          "measured_speedup": rows.measured_speedup, "measured_lo": rows.measured_speedup_lo,
                          "measured_hi": rows.measured_speedup_hi})
    said = load_claims(rec.dir)
    print(f"No GPU here: advise measures on an NVIDIA GPU. Recorded on {rec.env.get('gpu')}, "
          f"{str(rec.env.get('date'))[:10]}:")
    print(shown.round(2).to_string(index=False))
    if said is not None:
        print("\n".join(_advise_sentences(list(zip(said.claim, said.statement)), headlines)))


def show_predictions(predicted, stem, cost=None):
    """Print advise's predictions, one short line per case (``predicted``: {case: ``Advice``}): the eager time, the
    GPU time of the calls back to back, the predicted speedup and advise's words for it; first, with ``cost``
    (``measure_replay_cost()``), what a replay costs the host here. Without a GPU (``predicted`` empty) the recorded
    GPU run's predictions, from its results, under a line naming its GPU and date."""
    from ...advice import _verdict
    from .results import load

    def line(case, eager_us, floor_us, speedup):
        words = _verdict(speedup).split(":")[0].rstrip(".")   # "Launch-bound", "GPU-bound", ...
        words = words if words.startswith("GPU") else words[:1].lower() + words[1:]
        return f"{case}: eager {eager_us:.0f} µs, GPU busy {floor_us:.0f} µs: {speedup:.2f}x predicted, {words}"

    if predicted:
        if cost is not None:
            print(f"a replay costs the host {cost.launch_us:.1f} µs on this GPU")
        print("\n".join(line(c, a.eager_us, a.floor_us, a.speedup) for c, a in predicted.items()))
        return
    rec = load(stem)
    rows = rec.df[rec.df.case.astype(str).str.startswith("advise: ")] if rec is not None else []
    if not len(rows):
        print("No GPU here: advise measures on an NVIDIA GPU, and no recorded GPU run was found.")
        return
    print(f"Needs an NVIDIA GPU. Recorded on {rec.env.get('gpu')}, {str(rec.env.get('date'))[:10]}, advise predicted:")
    print("\n".join(line(r.case.removeprefix("advise: "), r.eager_us, r.floor_us, r.speedup)
                    for r in rows.itertuples()))


def recorded_headlines(results) -> dict:
    """{recorded notebook: [(case, eager variant, graph variant)]} for the fitted-after-the-fact check."""
    heads = {
        "01_gelu": [("small", "eager", "graph replay"), ("large", "eager", "graph replay")],
        "02_train_step": [(f"MLP {s}, {o}", "eager", "whole-step graph") for s in ("32x128x256x16", "640x4096x2048x1024")
                          for o in ("SGD", "Adam(capturable)")],
        "03_jit_compile": [(c, "torch.compile", "torch.compile + graph, input in place") for c in ("small", "large")],
    }
    root = results.recorded_root()
    for folder in sorted(root.glob("04_*")) if root is not None else []:
        rec = results.load(folder.name)
        if rec is not None and {"case", "variant"} <= set(rec.df.columns):
            heads[folder.name] = [(c, "eager", v) for c, grp in rec.df.groupby("case", sort=False)
                                  if "eager" in set(grp.variant)
                                  for v in [next((v for v in grp.variant if "graph" in str(v)), None)] if v]
    return heads


def fitted_row(results, stem, case, base_variant, graph_variant, cost):
    """A row fitted after the fact from a recorded notebook: the floor is the timed graph's own (None if something
    is missing)."""
    import pandas as pd

    from ...advice import predict_graph_time

    rec = results.load(stem)
    if rec is None:
        return None
    df = rec.df
    base, graph = df[(df.case == case) & (df.variant == base_variant)], df[(df.case == case) & (df.variant == graph_variant)]
    if base.empty or graph.empty:
        return None
    b, gr = base.iloc[0], graph.iloc[0]
    floor = gr.get("floor_us") if pd.notna(gr.get("floor_us")) else b.get("floor_us")
    copies = b.get("copies_per_call", 0.0)
    nodes = b.get("kernels_per_call", float("nan")) + (copies if pd.notna(copies) else 0.0)
    if floor is None or pd.isna(floor) or pd.isna(nodes) or not b.median_us > 0 or not gr.median_us > 0:
        return None
    pred_graph = predict_graph_time(floor, nodes, cost)
    return {"source": stem, "gpu": rec.env.get("gpu"), "prediction": "fitted after the fact", "case": case,
            "eager_us": b.median_us, "floor_us": floor, "graph_gpu_us": floor, "nodes": nodes,
            "predicted_graph_us": pred_graph, "predicted_speedup": b.median_us / pred_graph,
            "measured_graph_us": gr.median_us, "measured_speedup": b.median_us / gr.median_us,
            "graph_executed_as": gr.get("executed_as", "?")}


def advice_summary(adv):
    """Per source notebook and kind of prediction: cases, median predicted / measured, the farthest case."""
    import pandas as pd

    rows = []
    for (source, kind), grp in adv.groupby(["source", "prediction"], sort=False):
        ratio = grp.predicted_speedup / grp.measured_speedup
        far = ratio.map(lambda r: max(r, 1 / r)).idxmax()
        rows.append({"source": source, "prediction": kind, "cases": len(grp),
                     "median predicted/measured": f"{ratio.median():.2f}",
                     "farthest case": f"{grp.case[far]}: {grp.predicted_speedup[far]:.2f}x predicted, "
                                      f"{grp.measured_speedup[far]:.2f}x measured"})
    return pd.DataFrame(rows)


def advice_from_saved(df):
    """The advise rows of a saved results table as ``advice_summary`` takes them."""
    import pandas as pd

    if "measured_speedup" not in df:
        return pd.DataFrame()
    rows = []
    for r in df[df.case.astype(str).str.startswith(("advise: ", "advise fitted: "))].to_dict("records"):
        if not (pd.notna(r["measured_speedup"]) and r["measured_speedup"] > 0):
            continue
        before = r["variant"] == "predicted (this run)"
        own = r.get("advise_speedup", float("nan"))
        rows.append({"source": "05 (that run)" if before else str(r["variant"]).partition("(")[2].split(" ")[0],
                     "prediction": "before capture" if before else "fitted after the fact",
                     "case": str(r["case"]).partition(": ")[2],
                     "predicted_speedup": own if before and pd.notna(own) else r["speedup"],
                     "measured_speedup": r["measured_speedup"]})
    return pd.DataFrame(rows)


def advice_rows(advice, cost) -> list[dict]:
    """advise's rows for results.csv: "advise: <case>" (predicted before capture in this run) and
    "advise fitted: <case>" (fitted after the fact from a recorded notebook), with the replay cost measured."""
    costs = ({"node_us": cost.graph_node_us, "launch_us": cost.launch_us, "gap_saved_us": cost.gap_saved_us}
             if cost else {})
    rows = []
    for r in advice.to_dict("records"):
        before = r["prediction"] == "before capture"
        rows.append({"case": f"advise: {r['case']}" if before else f"advise fitted: {r['case']}",
                     "variant": "predicted (this run)" if before else f"fitted ({r['source']} ({r['gpu']}))",
                     "prediction": r["prediction"], "median_us": r["predicted_graph_us"],
                     "speedup": r["predicted_speedup"], "executed_as": r["graph_executed_as"],
                     "floor_us": r["floor_us"], "eager_us": r["eager_us"], "nodes_per_call": r["nodes"],
                     "graph_gpu_us": r["graph_gpu_us"],
                     "advise_speedup": r["predicted_speedup"] if before else float("nan"),
                     "measured_speedup": r["measured_speedup"], "measured_graph_us": r["measured_graph_us"],
                     "measured_speedup_lo": r.get("measured_lo", float("nan")),
                     "measured_speedup_hi": r.get("measured_hi", float("nan")), **costs})
    return rows
