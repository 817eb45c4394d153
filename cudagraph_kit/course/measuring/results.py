"""Save and load a notebook's results: ``<stem>/results.csv``, ``env.json`` and PNG figures.

Recorded and fresh results never share a folder:

- **recorded** results are the committed ``figures/`` of a source checkout (a real GPU run, made by
  ``python -m cudagraph_kit reproduce``); ``load`` and ``show_recorded`` read them;
- **fresh** results (a learner's run, a test, a CPU run) go to ``results_root()``: ``$CGK_RESULTS_DIR`` if set,
  else ``<checkout>/build/figures``, else ``./cudagraph-kit-results`` outside a checkout. ``save`` never
  writes to ``figures/`` unless it is told to (``reproduce`` on a GPU passes it explicitly).

Example::

    from cudagraph_kit.course.measuring import results
    folder = results.save("01_gelu", df, figures={"speedup": fig})   # fresh: build/figures/01_gelu
    rec = results.load("01_gelu")           # the recorded GPU run: rec.df, rec.env, rec.pngs
    results.show_recorded("01_gelu")        # in a notebook: caption + table + figures
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ...env import describe, has_cuda
from ..running.files import interrupts_deferred, replace_folder

__all__ = ["save", "load", "show_recorded", "show_figure", "shown", "show", "show_takeaways", "beside_recorded", "results_root",
           "recorded_root", "checkout_root", "Recorded",
           "REQUIRED_COLUMNS"]

REQUIRED_COLUMNS = ("case", "variant", "median_us", "speedup")
_PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # the checkout holding cudagraph_kit/course/measuring/


def _is_checkout(path: Path) -> bool:
    return all((path / name).is_dir() for name in ("cudagraph_kit", "notebooks", "figures"))


def checkout_root() -> Path | None:
    """The source checkout in use: the one this kit was imported from, else the one the working directory
    is in (a notebook running in ``<checkout>/notebooks`` or a Colab clone); None if there is none."""
    cwd = Path.cwd().resolve()
    return next((p for p in (_PACKAGE_PARENT, cwd, *cwd.parents) if _is_checkout(p)), None)


def recorded_root() -> Path | None:
    """The committed ``figures/`` folder with the recorded GPU results, or None outside a checkout."""
    root = checkout_root()
    return root / "figures" if root is not None else None


def results_root() -> Path:
    """Where ``save`` writes fresh results: ``$CGK_RESULTS_DIR``, else ``<checkout>/build/figures``,
    else ``./cudagraph-kit-results``. Never the recorded ``figures/`` by default, with or without a GPU."""
    if os.environ.get("CGK_RESULTS_DIR"):
        return Path(os.environ["CGK_RESULTS_DIR"])
    root = checkout_root()
    return root / "build" / "figures" if root is not None else Path.cwd() / "cudagraph-kit-results"


@dataclass
class Recorded:
    """A saved result: the table, the machine it came from, its folder and figures."""
    df: object
    env: dict
    dir: Path
    pngs: list = field(default_factory=list)

    @property
    def caption(self) -> str:
        e = self.env
        where = e.get("gpu") or "CPU only (no CUDA)"
        run = f", run {e['run']['id']}" if isinstance(e.get("run"), dict) and e["run"].get("id") else ""
        return (f"Recorded on {where} (driver {e.get('driver') or '-'}), PyTorch {e.get('torch')}, "
                f"CUDA {e.get('cuda') or '-'}, {e.get('date')}{run}")


def save(stem: str, df, figures: dict | None = None, root=None, extra_env: dict | None = None) -> Path:
    """Write ``df`` as ``<root>/<stem>/results.csv`` with ``env.json`` and each figure as ``<name>.png``.

    ``root`` defaults to ``results_root()`` (fresh results, never the recorded ``figures/``). The folder is
    written whole: built beside its place and swapped in, replacing an older ``<stem>`` folder entirely, so an
    interruption leaves the old folder or the new one, never a table and figures from different runs. Under
    ``reproduce``, ``env.json`` also names the run (``$CGK_RUN``: commit, GPU, PyTorch, date).
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results for {stem!r} lack column(s) {missing}; every row needs "
                         f"{list(REQUIRED_COLUMNS)} (and floor_us where known). Fix: add them before saving.")
    target = Path(root or results_root()) / stem
    building = target.with_name(f".{stem}.saving-{os.getpid()}")
    if building.exists():
        shutil.rmtree(building)
    building.mkdir(parents=True)
    try:
        df.to_csv(building / "results.csv", index=False)
        env = describe()
        env["executed_as"] = "cuda" if has_cuda() else "cpu (eager only)"
        env["notebook"] = stem
        if os.environ.get("CGK_RUN"):
            env["run"] = json.loads(os.environ["CGK_RUN"])
        env.update(extra_env or {})
        (building / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
        for name, fig in (figures or {}).items():
            fig.savefig(building / f"{name}.png", dpi=110, bbox_inches="tight")
        with interrupts_deferred():
            replace_folder(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def load(stem: str, root=None) -> Recorded | None:
    """Read back what ``save`` wrote (default: the recorded GPU results); None if there is nothing."""
    import pandas as pd

    root = root if root is not None else recorded_root()
    if root is None:
        return None
    folder = Path(root) / stem
    if not (folder / "results.csv").is_file():
        return None
    env_path = folder / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    return Recorded(pd.read_csv(folder / "results.csv"), env, folder, sorted(folder.glob("*.png")))


def _where_recorded_results_live() -> str:
    try:
        from ..running.paths import repository_url
        return f"the figures/ folder of the repository ({repository_url()})"
    except Exception:  # a copied results.py without the rest of the kit
        return "the project's figures/ folder"


def _notebook():
    """``IPython.display`` where this runs in a notebook (an IPython shell is running), else None: print instead."""
    try:
        from IPython import display, get_ipython
    except ImportError:
        return None
    return display if get_ipython() is not None else None


def show_recorded(stem: str, root=None, columns=None, digits: int | None = None) -> Recorded | None:
    """Display the recorded results of ``stem`` in a notebook (caption, table, figures), or say where it
    looked and where they are when there are none. ``columns``: the columns to show (those present);
    ``digits``: round the table's numbers to that many decimals."""
    rec = load(stem, root)
    if rec is None:
        if root is None and recorded_root() is None:
            looked = (f"no source checkout found (looked beside the installed kit, {_PACKAGE_PARENT}, and in "
                      f"{Path.cwd()} and its parents)")
        else:
            looked = f"nothing under {Path(root if root is not None else recorded_root()) / stem}"
        print(f"No recorded results for {stem}: {looked}. They are in {_where_recorded_results_live()}; "
              "run the notebook from a clone of it (in Colab the notebook's first cell makes one).")
        return None
    table = rec.df if columns is None else rec.df[[c for c in columns if c in rec.df.columns]]
    table = table.round(digits) if digits is not None else table
    nb = _notebook()
    if nb is None:  # plain Python: print the caption, the table and where the figures are
        print(rec.caption)
        print(table.to_string(index=False))
        for png in rec.pngs:
            print(f"figure: {png}")
        return rec
    nb.display(nb.Markdown(f"**{rec.caption}**"))
    nb.display(table)
    for png in rec.pngs:
        nb.display(nb.Image(filename=str(png)))
    return rec


def shown(fig, stem: str, name: str):
    """Return ``fig`` to be shown where a graph ran. Where none ran (no GPU) this run's figure only shows CPU times,
    which say nothing about graphs: it is closed (``results.save`` still writes it) and the recorded GPU run's
    figure ``name`` of ``stem`` is shown instead, under a caption naming that run.

    Example::

        fig_sweep = shown(figures.size_sweep(sweep, crossover, "GELU"), "01_gelu", "size_sweep")
    """
    import torch

    if torch.cuda.is_available():
        return fig
    import matplotlib.pyplot as plt

    plt.close(fig)
    show_figure(stem, name)
    return fig


def show_figure(stem: str, name: str, root=None) -> Path | None:
    """Show one recorded figure of ``stem`` (``figures/<stem>/<name>.png``) under a caption naming the run that
    drew it (GPU, date, run id); say where it should be when it is missing. Returns its path (None if missing).

    Example::

        show_figure("01_gelu", "timeline")   # the eager-versus-graph timeline of the recorded GPU run
    """
    rec = load(stem, root)
    png = rec.dir / f"{name}.png" if rec is not None else None
    if png is None or not png.is_file():
        where = png if png is not None else f"{_where_recorded_results_live()}, {stem}/{name}.png"
        print(f"No recorded figure {name!r} of {stem}: looked for {where}. Run the notebook from a clone of the "
              "repository (in Colab the notebook's first cell makes one).")
        return None
    nb = _notebook()
    if nb is None:
        print(f"{rec.caption}\nfigure: {png}")
    else:
        nb.display(nb.Markdown(f"*{rec.caption}*"))
        nb.display(nb.Image(filename=str(png)))
    return png


def show(m, stem: str | None = None, verdicts=None, *, figure: bool = False, headlines=None,
         table: str = "short", per: str | None = None) -> None:
    """Show an experiment's result (``m``, from ``measure``) in a notebook: the short table, then one sentence per
    verdict. Where no graph ran (no GPU, or ``m`` is None: the experiment needs one) CPU times say nothing about
    graphs, so none are shown: with ``stem``, the recorded GPU run's rows and verdicts of the whole experiment
    follow instead (the cases and claims its ``verdicts`` function covers, ``verdicts.covers``), under a
    caption naming that run.

    ``figure``: also draw the speedups with their intervals (``figures.speedups``) from the same rows, titled with
    the GPU and date they were measured on (never a CPU timing). ``headlines``: the ids of the verdicts to state
    here, in that order (a notebook's core states at most five per experiment); a last line counts the others,
    which are saved in ``claims.csv`` (``claims.summary`` lists them). ``table``: ``"short"`` (``Measured.short``), ``"times"`` (the median time of
    each variant, one column per case: the speedups are in the figure) or None. ``per``: what one timed call is,
    named in the times table's columns ("<case> (µs per <per>)"), e.g. ``per="pass"``.

    Example::

        m = measure(cases, verdicts=verdicts.gelu_headline)
        show(m, "01_gelu")
        show(m, "03_jit_compile", figure=True, headlines=["graph_beats_eager_small"], table="times")
    """
    from .claims import load_claims
    from .measure import Measured, _cuda

    if m is not None and _cuda():
        import datetime

        import torch

        pairs = [(c.claim, c.statement) for c in m.claims]
        where = (f"This run, on {torch.cuda.get_device_name(0)}, "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
        _show_parts(m, None, table, pairs, headlines, figure, where, cuda=None, stem=stem, per=per)
        return
    rec = load(stem) if stem else None
    if rec is None:
        _display(None, [], f"No GPU here: no graph ran, so no times are shown (CPU times say nothing about graphs), "
                           f"and no recorded GPU run of {stem or 'this notebook'} was found.")
        return
    builder = verdicts or getattr(m, "verdicts", None)
    cases = getattr(builder, "cases", None)
    ours = rec.df.case.map(lambda c: bool(cases.search(str(c)))) if cases is not None else rec.df.case.isin(
        set(m.table.case) if m is not None else set())
    recorded = Measured(rec.df[ours].reset_index(drop=True))
    said = load_claims(rec.dir)
    ids = getattr(builder, "claims", None)
    if said is None:
        pairs = []
    elif ids is not None:
        pairs = [(c, s) for c, s in zip(said.claim, said.statement) if ids.search(str(c))]
    else:
        pairs = [(c.claim, s) for c in (m.claims if m is not None else []) for s in said[said.claim == c.claim].statement]
    pairs = _named_as_ran(recorded, pairs)
    caption = (f"No GPU here: no graph ran, so this run's CPU times are not shown (they say nothing about graphs). "
               f"The recorded GPU run's rows and verdicts: {rec.caption}.")
    where = f"Recorded on {rec.env.get('gpu') or 'a GPU'}, {rec.env.get('date')} (not this run)"
    _show_parts(recorded, caption, table, pairs, headlines, figure, where, cuda=True, stem=stem, per=per)


def _named_as_ran(m, pairs):
    """A recorded run's rows and sentences with every label true to what ran (``verdicts.as_ran_label``): a row
    labelled compiled whose ``executed_as`` says it ran eagerly is renamed in the table and in the sentences."""
    from .verdicts import as_ran_label

    if "executed_as" not in m.table:
        return pairs
    renamed = {str(v): as_ran_label(v, r) for v, r in zip(m.table.variant, m.table.executed_as)}
    renamed = {old: new for old, new in renamed.items() if old != new}
    if renamed:
        m.table = m.table.assign(variant=[renamed.get(str(v), v) for v in m.table.variant])
        for old, new in renamed.items():
            pairs = [(c, s.replace(old, new)) for c, s in pairs]
    return pairs


def _show_parts(m, caption, table, pairs, headlines, figure, where, cuda, stem, per=None) -> None:
    """``show``'s output: the caption and table, the speedups figure, then the verdict sentences (``pairs``: (claim
    id, sentence)), the ``headlines`` alone where given, with a line counting the others."""
    shown = pairs if headlines is None else [(c, s) for h in headlines for c, s in pairs if c == h]
    sentences = [s for _, s in shown]
    rest = len(pairs) - len(shown)
    if rest:
        sentences.append(f"{rest} more verdict{'s' * (rest > 1)} of this experiment, saved with the results in "
                         "`claims.csv`.")
    rows = (m.short(cuda=cuda) if table == "short" else _times(m.table, cuda, per) if table == "times" else None)
    if not figure:
        _display(rows, sentences, caption)
        return
    from .figures import show_figure, speedups

    _display(rows, [], caption)
    show_figure(speedups(m.table, f"{stem + ': ' if stem else ''}speedup over eager. {where}", cuda=cuda))
    _display(None, sentences)


def _times(t, cuda=None, per=None):
    """The median time of one timed call of each variant (rows) in each case (columns, "<case> (µs)"), "-" where a
    case has no such variant; a graph that ran eagerly says so in its row's name."""
    import pandas as pd

    from .measure import ran_eagerly

    names = [str(v).replace(" (eager fallback)", "") + (" (ran eagerly)" if e and ("graph" in str(v).lower() or
             "reduce-overhead" in str(v) or "(eager fallback)" in str(v)) else "")
             for v, e in zip(t.variant, ran_eagerly(t, cuda))]
    cases, variants = list(dict.fromkeys(map(str, t.case))), list(dict.fromkeys(names))
    cell = {(str(c), n): f"{us:.1f}" for c, n, us in zip(t.case, names, t.median_us)}
    return pd.DataFrame([[v] + [cell.get((c, v), "-") for c in cases] for v in variants],
                        columns=["variant"] + [f"{c} (µs{' per ' + per if per else ''})" for c in cases])


def show_takeaways(stem: str, claims, lines, root=None, missing: str = "raise") -> list[str]:
    """Show a notebook's takeaways (``claims.takeaways``) as a Markdown list under a line that names the run they come
    from: this run where a graph ran, else the recorded GPU run of ``stem`` (its GPU and date), so a CPU learner
    reads the recorded findings. ``missing``: as in ``claims.takeaways``. Returns the lines shown.

    Example::

        show_takeaways("01_gelu", claims, ["A graph made the small GELU {replay_beats_eager_small} faster."])
    """
    import torch

    from .claims import EAGER_FALLBACK, load_claims, takeaways

    ran_graphs = torch.cuda.is_available() and any(c.verdict != EAGER_FALLBACK for c in claims)
    if ran_graphs:
        source, label = claims, f"**This run, on {torch.cuda.get_device_name(0)}:**"
    else:
        rec = load(stem, root)
        if rec is None:
            print(f"No graph ran here and no recorded run of {stem} was found: the takeaways need one of the two.")
            return []
        recorded = load_claims(rec.dir)   # a run without claims (a recorded sweep) renders lines without any
        source = recorded if recorded is not None else []
        label = (f"**{'No graph ran here; the' if not torch.cuda.is_available() else 'The'} recorded run's "
                 f"takeaways.** {rec.caption}:")
    shown = takeaways(lines, source, missing)
    text = label + "\n\n" + "\n".join(f"{i}. {line}" for i, line in enumerate(shown, 1))
    nb = _notebook()
    if nb is None:
        print(text.replace("**", ""))
    else:
        nb.display(nb.Markdown(text))
    return shown


def _display(table, sentences, caption: str | None = None) -> None:
    """A caption, a table and a list of sentences: as Markdown and a DataFrame in a notebook, as text elsewhere."""
    nb = _notebook()
    if nb is not None:
        if caption:
            nb.display(nb.Markdown(f"*{caption}*"))
        if table is not None:
            nb.display(table)
        if sentences:
            nb.display(nb.Markdown("\n".join(f"- {s}" for s in sentences)))
        return
    if caption:
        print(caption)
    if table is not None:
        print(table.to_string(index=False))
    for s in sentences:
        print(f"- {s}")


def _speedups(df, now: bool = False):
    """case, variant, time and speedup (with its interval) per row; ``now``: this run's rows, where a graph that ran
    eagerly shows no speedup (it would compare eager with eager)."""
    import pandas as pd

    from .measure import ran_eagerly

    eager = ran_eagerly(df) if now else [False] * len(df)
    span = ["- (ran eagerly)" if e else f"{s:.2f}x ({lo:.2f}-{hi:.2f})" if lo == lo and hi == hi else f"{s:.2f}x"
            for s, lo, hi, e in zip(df.speedup, df.get("speedup_lo", df.speedup), df.get("speedup_hi", df.speedup),
                                    eager)]
    return pd.DataFrame({"case": df.case.values, "variant": df.variant.str.replace(" (eager fallback)", "",
                                                                                 regex=False).values,
                         "median (µs)": df.median_us.round(1).values, "speedup (90% interval)": span})


def beside_recorded(stem: str, table, root=None):
    """This run's ``table`` (a ``combine_windows``/``measure`` table) beside the recorded GPU run of ``stem``: one
    row per case and variant, time and speedup now and as recorded, under a caption naming the recorded run.
    Returns the DataFrame (None when nothing is recorded: then it says where to find the figures).

    Example::

        beside_recorded("01_gelu", m.table)
    """
    rec = load(stem, root)
    if rec is None:
        show_recorded(stem, root)
        return None
    now, then = _speedups(table, now=True), _speedups(rec.df)
    out = now.merge(then, on=["case", "variant"], how="left", suffixes=(" now", " recorded"))
    caption = f"Now: {'this GPU' if has_cuda() else 'this CPU (graphs ran eagerly)'}. {rec.caption}."
    nb = _notebook()
    if nb is None:
        print(caption)
        print(out.to_string(index=False))
    else:
        nb.display(nb.Markdown(f"**{caption}**"))
        nb.display(out)
    return out


def drift_summary(folder) -> dict | None:
    """The recorded drift study (``scripts/probes/probe_drift.py``) in ``folder`` (e.g. ``figures/drift``), read once for
    the notebook and the README alike: ``{"table", "gpu", "processes", "sentence"}``, or None if not recorded.
    ``sentence`` states the eager and graph spreads across fresh processes without a profiler before, and how
    much slower a profiler session earlier in the process made both, all from ``drift_summary.csv``."""
    import pandas as pd

    folder = Path(folder)
    if not (folder / "drift_summary.csv").is_file():
        return None
    table = pd.read_csv(folder / "drift_summary.csv")
    gpu = json.loads((folder / "drift_env.json").read_text())["device"]
    by = table.set_index("control")
    quiet = by.drop(index="after_profiler", errors="ignore")
    span = lambda col: (f"{quiet[col].max():.2f}x" if round(quiet[col].min(), 2) == round(quiet[col].max(), 2)  # noqa: E731
                        else f"{quiet[col].min():.2f}-{quiet[col].max():.2f}x")
    sentence = (f"without a profiler before, the small GELU's eager median spread {span('eager_spread')} across "
                f"fresh processes under every control tried ({', '.join(quiet.index)}), the graph replay "
                f"{span('graph_spread')}")
    if {"after_profiler", "baseline"} <= set(by.index):
        prof, base = by.loc["after_profiler"], by.loc["baseline"]
        sentence += (f"; a profiler session earlier in the process made eager {prof.eager_us / base.eager_us:.2f}x "
                     f"and the replay {prof.graph_us / base.graph_us:.2f}x slower (medians against baseline)")
    return {"table": table, "gpu": gpu, "processes": int(table.processes.min()), "sentence": sentence}
