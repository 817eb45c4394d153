"""course/measure.py on a fake clock: the window loop, its single profiler policy, the short table and claims."""
import pandas as pd
import pytest

import cudagraph_kit.timing as timing
from cudagraph_kit.course.measuring.claims import speedup
from cudagraph_kit.course.measuring.measure import measure


@pytest.fixture
def cpu_clock(clock, monkeypatch):
    """conftest's fake clock, with CUDA hidden so that the kit times on it alone (also on a GPU machine)."""
    monkeypatch.setattr(timing.torch.cuda, "is_available", lambda: False)
    return clock


def test_measure_times_every_case_in_every_window_and_combines_them(cpu_clock, monkeypatch):
    clock = cpu_clock

    def spend(us):
        clock.t += us * 1e-6

    drift = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.95, 1.05]  # the host's state per window: eager moves, the graph does not
    state = {"w": 0}
    slept, lines, profiled, warmups = [], [], [], []
    real_compare = timing.compare

    def spy(variants, *args, floor=True, **kw):
        profiled.append(floor)
        warmups.append(kw["warmup"])
        return real_compare(variants, *args, floor=floor, **kw)

    import cudagraph_kit.course.measuring.measure as measure_module
    monkeypatch.setattr(measure_module, "compare", spy)
    m = measure({"small": {"eager": lambda: spend(100 * drift[state["w"]]), "graph": lambda: spend(20)},
                 "large": ({"eager": lambda n: spend(n), "graph": lambda n: spend(n * 0.9)}, (1000,))},
                windows=8, samples=3, calls=4, pause_s=0.5, sleep=slept.append,
                before_window=lambda w: state.update(w=w), progress=lines.append)
    assert slept == [0.5] * 7 and len(lines) == 8 and lines[0].startswith("window 1/8: small graph ")
    assert profiled == [False] * 14 + [True] * 2   # the profiler in the last window only, once per case
    assert warmups == [None] * 2 + [2] * 14          # warm-up by time in the first window, two calls later
    assert len(m.windows) == 8 and (m.table.windows == 8).all()
    speedups = [f.set_index(["case", "variant"]).loc[("small", m.label("small", "graph")), "speedup"] for f in m.windows]
    assert speedups == pytest.approx([5 * d for d in drift])
    lo, hi = m.interval("small", "graph")
    assert lo < 5 * min(drift) and hi > 5 * max(drift) * 0.95
    assert m.interval("large", "graph") == pytest.approx((1 / 0.9, 1 / 0.9))
    short = m.short()
    # no column that is empty in every row: without a GPU no floor was measured
    assert list(short.columns) == ["case", "variant", "ran as", "median (µs)", "speedup", "90% interval"]
    assert (short.loc[1, "speedup"], short.loc[1, "90% interval"]) == ("-", "ran eagerly")   # no GPU: eager vs eager
    assert (short.loc[0, "speedup"], short.loc[0, "90% interval"]) == ("baseline", "")      # not "1.00-1.00x"
    m.table["floor_us"] = [float("nan"), 12.0, float("nan"), 30.0]    # a floor in some rows: the column stays
    assert list(m.short().columns)[-1] == "floor (µs)"
    r = m.ratio(("large", "eager"), ("small", "graph"))     # any two rows, window by window
    assert r["windows"] == 8 and r["ratio"] == pytest.approx(50.0)
    # on a machine without CUDA the graph rows are eager: the claim about the graph says so
    assert speedup(m, "graph_beats_eager", "small", "graph").verdict == "eager fallback"


def test_measure_shows_its_progress_on_one_short_line(cpu_clock, capsys):
    def spend(us=50):
        cpu_clock.t += us * 1e-6

    measure({"a": {"eager": spend, "graph": spend}}, windows=3, samples=1, calls=1, sleep=lambda s: None)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("timing 3 windows: 1 2 3, ") and out.endswith(" s\n")
    measure({"a": {"eager": spend}}, windows=1, samples=1, calls=1, progress=None)
    assert capsys.readouterr().out == ""


def test_measure_refuses_bad_input(cpu_clock):
    with pytest.raises(ValueError, match="at least one window"):
        measure({"a": {"eager": lambda: None}}, windows=0)
    with pytest.raises(ValueError, match="at least one case"):
        measure({}, windows=2)
    with pytest.raises(TypeError, match="each case is"):
        measure({"a": [lambda: None]}, windows=2)


def test_beside_recorded_puts_this_run_next_to_the_recorded_one(tmp_path, capsys):
    import pandas as pd

    from cudagraph_kit.course.measuring import results
    recorded = pd.DataFrame({"case": ["small", "small"], "variant": ["eager", "graph"], "median_us": [100.0, 20.0],
                             "speedup": [1.0, 5.0], "speedup_lo": [1.0, 4.5], "speedup_hi": [1.0, 5.5]})
    results.save("01_gelu", recorded, root=tmp_path)
    fresh = recorded.assign(variant=["eager", "graph (eager fallback)"], median_us=[300.0, 290.0],
                            speedup=[1.0, 1.03], speedup_lo=[1.0, 0.9], speedup_hi=[1.0, 1.2])
    out = results.beside_recorded("01_gelu", fresh, root=tmp_path)
    row = out.set_index("variant").loc["graph"]
    assert row["speedup (90% interval) now"] == "- (ran eagerly)"          # eager against eager: no speedup shown
    assert out.set_index("variant").loc["eager", "speedup (90% interval) now"] == "1.00x (1.00-1.00)"
    assert row["speedup (90% interval) recorded"] == "5.00x (4.50-5.50)"
    assert "Recorded on" in capsys.readouterr().out
    assert results.beside_recorded("02_train_step", fresh, root=tmp_path) is None


def test_one_call_per_experiment_gives_the_table_and_its_verdicts(cpu_clock, capsys):
    """``measure(..., verdicts=...)`` builds the experiment's claims. Without a GPU ``show`` prints no CPU time (they
    say nothing about graphs): with the notebook's stem, the recorded GPU run's rows for the same cases and its
    verdicts for the same claims, under a caption naming that run; without one, it says so."""
    import json

    from cudagraph_kit.course.measuring import verdicts
    from cudagraph_kit.course.running.paths import FIGURES_DIR
    from cudagraph_kit.course.measuring.results import show

    def spend(us):
        cpu_clock.t += us * 1e-6
    m = measure({"small": {"eager": lambda: spend(100), "graph replay": lambda: spend(20),
                           "graph copy+replay": lambda: spend(30)},
                 "large": {"eager": lambda: spend(1000), "graph replay": lambda: spend(900),
                           "graph copy+replay": lambda: spend(950)}},
                windows=3, samples=2, calls=4, pause_s=0, sleep=lambda s: None, progress=None,
                verdicts=verdicts.gelu_headline)
    assert [c.claim for c in m.claims] == ["replay_beats_eager_small", "copy_replay_beats_eager_small",
                                           "replay_saves_10pct_large"]   # one claim per interval
    show(m)
    out = capsys.readouterr().out
    assert out.startswith("No GPU here: no graph ran, so no times are shown") and "µs" not in out
    show(m, "01_gelu")
    out = capsys.readouterr().out
    env = json.loads((FIGURES_DIR / "01_gelu" / "env.json").read_text())
    assert out.startswith("No GPU here") and env["gpu"] in out and env["date"] in out
    recorded = pd.read_csv(FIGURES_DIR / "01_gelu" / "claims.csv").set_index("claim")
    assert all(f"- {recorded.loc[c.claim, 'statement']}" in out for c in m.claims)
    rows = pd.read_csv(FIGURES_DIR / "01_gelu" / "results.csv")
    replay = rows[(rows.case == "small") & (rows.variant == "graph replay")].iloc[0]
    assert f"{replay.speedup_pi_lo:.2f}-{replay.speedup_pi_hi:.2f}x" in out   # the recorded row, its interval
    assert "sweep" not in out                                                  # only the cases of this experiment
    # a core shows a part: the cases and claims it names, here and read from the recorded run alike
    part = m.part(cases="^small$", claims=["copy_replay_beats_eager_small"])
    assert set(part.table.case) == {"small"} and [c.claim for c in part.claims] == ["copy_replay_beats_eager_small"]
    show(part, "01_gelu")
    out = capsys.readouterr().out
    assert f"- {recorded.loc['copy_replay_beats_eager_small', 'statement']}" in out and "large" not in out
    assert f"- {recorded.loc['replay_beats_eager_small', 'statement']}" not in out
    # a CPU run that timed fewer cases still shows the whole recorded experiment (the cases and claims it covers)
    small_only = measure({"small": {"eager": lambda: spend(100), "graph replay": lambda: spend(20)}},
                         windows=2, samples=2, calls=4, pause_s=0, sleep=lambda s: None, progress=None,
                         verdicts=lambda m: [])
    small_only.verdicts = verdicts.gelu_headline   # what the experiment covers, as a notebook passes it
    show(small_only, "01_gelu")
    out = capsys.readouterr().out
    assert "large" in out and all(f"- {s}" in out for s in recorded.statement[recorded.index.str.contains("_large")])
    show(None, "01_gelu", verdicts.gelu_calls_per_graph)    # an experiment this machine could not run at all
    out = capsys.readouterr().out
    assert "calls per graph" in out and f"- {recorded.loc['many_calls_near_floor', 'statement']}" in out


def test_show_figure_names_the_recorded_run_or_says_where_it_looked(capsys, tmp_path):
    from cudagraph_kit.course.measuring.results import show_figure
    from cudagraph_kit.course.running.paths import FIGURES_DIR
    assert show_figure("01_gelu", "timeline") == FIGURES_DIR / "01_gelu" / "timeline.png"
    assert "Recorded on NVIDIA" in capsys.readouterr().out
    assert show_figure("01_gelu", "no_such_picture") is None
    assert "No recorded figure 'no_such_picture' of 01_gelu" in capsys.readouterr().out
