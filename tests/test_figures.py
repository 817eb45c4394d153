"""figures.speedups: every variant's speedup over its case's baseline with its interval, from a measure table or a
recorded results.csv; a graph that ran eagerly is never drawn as a graph result. And results.show(figure=True): the
figure from the same rows as the table, titled with where they were measured, at most the headline verdicts."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from cudagraph_kit.course.measuring import figures, results, verdicts  # noqa: E402
from cudagraph_kit.course.measuring.measure import Measured  # noqa: E402


def table(graph_ran_as="cuda graph"):
    rows = [("small", "eager", "eager", 40.0, 1.0, 1.0, 1.0),
            ("small", "cuda graph", graph_ran_as, 10.0, 4.0, 3.0, 5.5),
            ("small", "torch.compile", "eager", 30.0, 1.3, 0.9, 1.8),
            ("large", "eager", "eager", 70.0, 1.0, 1.0, 1.0),
            ("large", "cuda graph", graph_ran_as, 65.0, 1.08, 1.05, 1.1)]
    return pd.DataFrame(rows, columns=["case", "variant", "executed_as", "median_us", "speedup", "speedup_pi_lo",
                                       "speedup_pi_hi"])


def drawn(fig):
    """Per panel (title): the variants drawn as a point with a whisker, and the variants said to have run eagerly."""
    out = {}
    for ax in fig.axes:
        if not ax.get_title(loc="left"):
            continue
        labels = [t.get_text() for t in ax.get_yticklabels()]
        points = sorted(round(c.lines[0].get_xdata()[0], 3) for c in ax.containers)
        eager = [t for t in ax.texts if "ran eagerly" in t.get_text()]
        out[ax.get_title(loc="left")] = (labels, points, len(eager))
    return out


def test_one_point_per_variant_with_its_interval_and_a_line_at_1x():
    fig = figures.speedups(table(), "This run, on a test GPU, 2026-11-28", cuda=True)
    got = drawn(fig)
    assert set(got) == {"small", "large"}   # one panel per case, the baseline (eager, 1x) not drawn
    assert got["small"] == (["torch.compile", "cuda graph"], [1.3, 4.0], 0)
    assert got["large"] == (["cuda graph"], [1.08], 0)
    for ax in fig.axes:
        if ax.get_title(loc="left"):
            assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.lines)   # the marker at 1x
            lo, hi = ax.get_xlim()
            assert lo < 1.0 < hi
    # the whisker spans the interval, and the label states it
    small = next(ax for ax in fig.axes if ax.get_title(loc="left") == "small")
    assert any(t.get_text() == "4.00x (3.00-5.50)" for t in small.texts)
    assert "This run, on a test GPU, 2026-11-28" in fig._suptitle.get_text()
    plt.close(fig)


def test_a_graph_that_ran_eagerly_is_not_drawn_as_a_graph_result():
    # without CUDA every row named for a graph ran eagerly: no point, the words "ran eagerly" instead
    fig = figures.speedups(table(graph_ran_as="eager"), "CPU", cuda=False)
    got = drawn(fig)
    assert got["small"] == (["torch.compile", "cuda graph"], [1.3], 1)
    assert got["large"] == (["cuda graph"], [], 1)
    plt.close(fig)
    # a capture that fell back on a GPU says so in its label
    t = table()
    t.loc[1, "variant"] = "cuda graph (eager fallback)"
    got = drawn(figures.speedups(t, "GPU", cuda=True))
    assert got["small"] == (["torch.compile", "cuda graph"], [1.3], 1)
    plt.close("all")


def test_a_recorded_results_csv_draws_with_its_own_interval_columns():
    rec = results.load("03_jit_compile")
    if rec is None:
        pytest.skip("no recorded results in this checkout")
    phase_1 = rec.df[rec.df.phase.str.startswith("1")]
    fig = figures.speedups(phase_1.drop(columns=["speedup_pi_lo", "speedup_pi_hi"]), "recorded", cuda=True)
    got = drawn(fig)
    assert set(got) == {"small", "large"}
    assert len(got["small"][1]) == (phase_1.case == "small").sum() - 1   # every variant but eager, drawn
    plt.close(fig)


def test_show_on_a_cpu_draws_the_recorded_gpu_rows_and_states_only_the_headlines(monkeypatch, capsys):
    rec = results.load("03_jit_compile")
    if rec is None:
        pytest.skip("no recorded results in this checkout")
    from cudagraph_kit.course.measuring import measure as measure_module

    monkeypatch.setattr(measure_module, "_cuda", lambda: False)
    titles = []

    def keep(fig):
        titles.append((fig._suptitle.get_text(), drawn(fig)))
        plt.close(fig)
    monkeypatch.setattr(figures, "show_figure", keep)
    cpu = Measured(table(graph_ran_as="eager"), verdicts=verdicts.fusion_and_graphs("jit.script"))
    results.show(cpu, "03_jit_compile", figure=True, table="times",
                 headlines=["graph_beats_eager_small", "fusion_adds_to_graph_large"])
    out = capsys.readouterr().out
    (title, got), = titles
    assert f"Recorded on {rec.env['gpu']}" in title and "(not this run)" in title   # never a CPU timing
    recorded_small = rec.df[(rec.df.case == "small")]
    assert len(got["small"][1]) == len(recorded_small) - 1 and got["small"][2] == 0
    bullets = [line for line in out.splitlines() if line.startswith("- ")]
    assert bullets[0].startswith("- small GELU: a graph of eager's five kernels") and len(bullets) == 3
    assert "more verdicts of this experiment" in bullets[-1]
    # the time table: one row per variant, one column per case, each with its unit
    eager_small = rec.df[(rec.df.case == "small") & (rec.df.variant == "eager")].median_us.iloc[0]
    assert "small (µs)" in out and "large (µs)" in out and f"{eager_small:.1f}" in out   # the recorded run's value


def test_the_times_table_names_a_graph_that_ran_eagerly():
    t = table()
    t.loc[1, "variant"] = "cuda graph (eager fallback)"
    times = results._times(t, cuda=True)
    assert list(times.columns) == ["variant", "small (µs)", "large (µs)"]
    assert list(times.variant) == ["eager", "cuda graph (ran eagerly)", "torch.compile", "cuda graph"]
    assert times.loc[2, "large (µs)"] == "-" and times.loc[1, "small (µs)"] == "10.0"
    # per= names what one timed call is in every column
    assert list(results._times(t, cuda=True, per="pass").columns) == ["variant", "small (µs per pass)",
                                                                      "large (µs per pass)"]


def test_a_recorded_row_labelled_compiled_that_ran_eagerly_is_named_as_it_ran(monkeypatch, capsys, tmp_path):
    # a recorded run whose "static cache (compiled)" rows launched no graph: table, figure and sentences say eager
    from cudagraph_kit.course.measuring import measure as measure_module
    from cudagraph_kit.course.measuring.claims import faster, save_claims

    t = table()
    t.loc[2, ["variant", "executed_as"]] = ["generate, static cache (compiled)", "eager"]
    folder = tmp_path / "99_demo"
    folder.mkdir()
    t.to_csv(folder / "results.csv", index=False)
    (folder / "env.json").write_text('{"gpu": "Test GPU", "date": "2026-11-27"}')
    save_claims(folder, [faster("graph_beats_static_small", 2.0, 3.0, "small: cuda graph",
                                "generate, static cache (compiled)", 1.0)])
    monkeypatch.setattr(results, "recorded_root", lambda: tmp_path)
    monkeypatch.setattr(measure_module, "_cuda", lambda: False)
    shown = []
    monkeypatch.setattr(figures, "show_figure", lambda fig: shown.append(drawn(fig)) or plt.close(fig))
    builder = verdicts.covers(r"^(small|large)$", r"^graph_beats_")(lambda m: [])   # what the experiment covers
    results.show(Measured(t, verdicts=builder), "99_demo", figure=True, table="times")
    out = capsys.readouterr().out
    assert "(compiled)" not in out and "generate, static cache (ran eagerly)" in out
    assert "faster than generate, static cache (ran eagerly)" in out
    assert shown[0]["small"][0][0] == "generate, static cache (ran eagerly)"
