"""reproduce never hangs silently, on the CPU with real papermill kernels: a cell far past its recorded time gets
every thread's Python stack in the log; past its stop limit the run stops with a message naming the cell, its
recorded time and the stacks file (also in the summary). The limits are injected (seconds, not minutes). A
finished kernel is shut down without a SIGINT (no "KeyboardInterrupt caught in kernel" ERROR in the log), and a
--smoke run keeps the full run's time record.

Signals: the stop asks the kernel for its stacks with SIGUSR1, whose handler the kernel installs itself
(faulthandler), and ends it with SIGKILL; neither depends on how this test run was started (a background job
inherits SIGINT as ignored, which these tests do not use)."""
import json
import re
import time

import nbformat
import pytest
import torch
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from cudagraph_kit.course.running import reproduce as rep
from cudagraph_kit.course.running import runs
from cudagraph_kit.course.running import watchdog
from cudagraph_kit.course.running.watchdog import CellLimits

pytestmark = pytest.mark.notebook

SLEEPER = '''\
# %% tags=["parameters"]
SMOKE = False

# %%
import threading, time
def helper_thread_sleeps():
    time.sleep(120)
def slow_cell_sleeps(seconds):
    time.sleep(seconds)
threading.Thread(target=helper_thread_sleeps, name="helper", daemon=True).start()
print("started", flush=True)

# %%
slow_cell_sleeps(120)

# %%
print("never reached")
'''
SLEEPING_CELL = "slow_cell_sleeps(120)"
TINY = CellLimits(dump_factor=5, dump_min_s=1.0, stop_factor=10, stop_min_s=4.0, unrecorded_dump_s=30.0,
                  unrecorded_stop_s=60.0, grace_s=1.5, poll_s=0.2)


def test_limits_follow_the_recorded_time():
    limits = CellLimits()
    assert limits.for_cell(16.0) == (120.0, 300.0)        # at least 2 and 5 minutes
    assert limits.for_cell(100.0) == (500.0, 1000.0)      # 5x and 10x
    assert limits.for_cell(None) == (300.0, 1800.0)       # no recorded time
    assert CellLimits(scale=3).for_cell(100.0) == (1500.0, 3000.0)
    assert CellLimits(unrecorded_stop_s=None).for_cell(None) == (300.0, None)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """notebooks/91_alpha.py sleeps in its third code cell; the committed 91_alpha.ipynb is a recorded run on this
    (stand-in) GPU where that cell took 0.2 s."""
    nbs, figs = tmp_path / "notebooks", tmp_path / "figures"
    nbs.mkdir()
    figs.mkdir()
    (nbs / "91_alpha.py").write_text(SLEEPER)
    recorded = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SLEEPING_CELL)])
    recorded.cells[0].metadata["papermill"] = {"duration": 0.2}
    recorded.metadata["cudagraph_kit"] = {"run": {"gpu": "Stand-in GPU", "smoke": False, "id": "recorded"}}
    nbformat.write(recorded, nbs / "91_alpha.ipynb")
    monkeypatch.setattr(rep, "NOTEBOOKS_DIR", nbs)
    monkeypatch.setattr(rep, "FIGURES_DIR", figs)
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(rep, "run_benchmarks", lambda *a, **k: None)
    # --resume compares the code's fingerprint: pinned, so an edit elsewhere in the checkout during the test
    # does not end the run it resumes
    monkeypatch.setattr(runs, "code_fingerprint", lambda root: "pinned-code")
    return tmp_path


def _snapshot(folder):
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stalled_cell_dumps_its_stacks_and_stops_the_run_naming_the_cell(course, capsys):
    before = _snapshot(course / "notebooks"), _snapshot(course / "figures")
    t0 = time.monotonic()
    with pytest.raises(rep.RunStopped) as stopped:
        rep.reproduce(["91"], limits=TINY)
    took = time.monotonic() - t0
    assert stopped.value.code == 1
    assert took < 60, f"the run waited for the sleeping cell ({took:.0f} s) instead of stopping it"
    printed = capsys.readouterr()
    err, out = printed.err, printed.out
    stacks = course / "staging" / "91_alpha" / "91_alpha.stacks.txt"
    # past the stall limit (5x 0.2 s, at least 1 s): every thread's stack, in the log, under a line naming the cell
    assert re.search(rf"reproduce: cell 3/4 `{re.escape(SLEEPING_CELL)}` has run \d+ s, past its stall limit of 1 s "
                     r"\(0\.2 s on the recorded run\); it goes on, and stops at 4 s\. Every thread's Python stack in "
                     rf"the kernel \(also in {re.escape(str(stacks))}\):", err), err
    first_dump = err.split("past its stall limit", 1)[1].split("reproduce:", 1)[0]
    assert "in slow_cell_sleeps" in first_dump and "in helper_thread_sleeps" in first_dump, first_dump
    # at the stop limit: the stacks once more, then the stop, naming the cell, its recorded time and the stacks file
    assert f"`{SLEEPING_CELL}` has run" in err and "its stop limit (4 s): it is being stopped" in err
    message = (f"reproduce: 91_alpha.py: cell 3/4 `{SLEEPING_CELL}` ran past its stop limit of 4 s (0.2 s on the "
               f"recorded run) and was stopped; every thread's Python stack: {stacks} (also in the log above)")
    assert message in err, err
    assert f"its executed copy so far: {course / 'staging' / '91_alpha' / '91_alpha.ipynb'} (cell 3/4: " \
           f"{SLEEPING_CELL})" in err
    assert "in slow_cell_sleeps" in stacks.read_text()
    # the summary says it too
    summary = out[out.index("reproduce: summary of run"):]
    assert re.search(rf"91_alpha\s+STALLED\s+\d+ s\s+at cell 3/4: {re.escape(SLEEPING_CELL)} \(past 4 s, recorded "
                     rf"0\.2 s\); stacks {re.escape(str(stacks))}; staged copy ", summary), summary
    staged = nbformat.read(course / "staging" / "91_alpha" / "91_alpha.ipynb", as_version=4)
    assert not staged.cells[-1].outputs  # the cell after the stalled one never ran
    assert (_snapshot(course / "notebooks"), _snapshot(course / "figures")) == before  # nothing published


def test_the_kernel_hook_dumps_on_its_own_and_leaves_the_namespace_clean(tmp_path, capsys):
    """The stall dump comes from inside the kernel (faulthandler, armed per cell by the startup hook), with no
    help from reproduce's side; the hook defines nothing in the notebook's namespace."""
    src = tmp_path / "nb.py"
    src.write_text("# %%\nprint(sorted(k for k in dir() if 'cgk' in k.lower() or 'hook' in k.lower()))\n\n"
                   "# %%\nimport time\ntime.sleep(2.5)\n")
    limits = CellLimits(unrecorded_dump_s=1.0, unrecorded_stop_s=None, poll_s=0.2)
    executed = rep.execute_notebook(src, tmp_path / "out" / "nb.ipynb", limits=limits)
    nb = nbformat.read(executed, as_version=4)
    assert nb.cells[0].outputs[0]["text"] == "[]\n"
    err = capsys.readouterr().err
    assert "reproduce: cell 2/2 `import time` has run" in err and "stops at no limit" in err
    assert "Timeout (0:00:01)!" in err  # faulthandler's own header: the kernel-side timer fired
    assert (tmp_path / "out" / "nb.stacks.txt").is_file()
    assert not (tmp_path / "out" / ".nb.kernel").exists()  # the hook's IPython folder is gone


def test_a_quick_notebook_leaves_no_stacks_file(tmp_path):
    src = tmp_path / "nb.py"
    src.write_text("# %%\nx = 1\n")
    rep.execute_notebook(src, tmp_path / "nb.ipynb", limits=TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb", "nb.py"]


@pytest.fixture
def signals_sent(monkeypatch):
    """Every signal jupyter_client sends a kernel (LocalProvisioner.send_signal), recorded."""
    sent = []
    real = LocalProvisioner.send_signal

    async def spy(self, signum):
        sent.append(signum)
        return await real(self, signum)
    monkeypatch.setattr(LocalProvisioner, "send_signal", spy)
    return sent


@pytest.mark.parametrize("manager", ["kit", "stock"])
def test_a_finished_kernel_is_shut_down_without_sigint(tmp_path, capfd, monkeypatch, signals_sent, manager):
    """jupyter_client interrupts every kernel before it asks it to shut down; a kernel still finishing its last
    reply then logs "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." (1 run in 10 or so). The kit's
    kernel manager sends no SIGINT to a kernel that runs no cell; jupyter_client's own ("stock") does."""
    import signal

    if manager == "stock":
        from jupyter_client.manager import AsyncKernelManager
        monkeypatch.setattr(watchdog.CellWatch, "kernel_manager_class", lambda self: AsyncKernelManager)
    src = tmp_path / "nb.py"
    src.write_text("# %%\nx = 1\n\n# %%\nprint(x)\n")
    rep.execute_notebook(src, tmp_path / "nb.ipynb")
    if manager == "kit":
        assert signal.SIGINT not in signals_sent, signals_sent
        assert "ERROR" not in capfd.readouterr().err
    else:
        assert signal.SIGINT in signals_sent, (  # what the kit's manager leaves out; also: the spy sees signals
            "jupyter_client sent no SIGINT before shutting the kernel down: either it no longer interrupts first "
            "(then the kit's kernel manager can go) or the spy on LocalProvisioner.send_signal misses signals")


# ------------------------------------------------------------------------------------------------ time records
class FakeKernel:
    def __init__(self):
        self.ran = []

    def __call__(self, src, output, params, results_dir, progress=False, run=None, **kernel):
        self.ran.append((src.stem, params))
        output.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), output)
        return output


def test_a_smoke_run_keeps_the_cpu_time_record_of_a_full_run(course, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    build = course / "build"
    out, results = build / "notebooks", build / "figures"
    rep.reproduce(["91"], out_dir=out, results_dir=results)  # a full CPU run
    full = (results / "reproduce_times.json").read_text()
    assert json.loads(full)["smoke"] is False and "91_alpha" in json.loads(full)["notebooks"]
    rep.reproduce(["91"], out_dir=out, results_dir=results, smoke=True)
    assert (results / "reproduce_times.json").read_text() == full  # untouched by the smoke run
    smoke = json.loads((results / "reproduce_times_smoke.json").read_text())
    assert smoke["smoke"] is True and "91_alpha" in smoke["notebooks"]
    src = course / "notebooks" / "91_alpha.py"
    assert rep._forecast(src, None, False, results).startswith("a recorded run on the CPU took")
    assert rep._forecast(src, None, True, results).startswith("a recorded run on the CPU took")
    # each kind resumes its own run
    capsys.readouterr()
    rep.reproduce(["91"], out_dir=out, results_dir=results, smoke=True, resume=True)
    assert f"published by run {smoke['run']['id']} already; skipped" in capsys.readouterr().out
    rep.reproduce(["91"], out_dir=out, results_dir=results, resume=True)
    assert f"published by run {json.loads(full)['run']['id']} already; skipped" in capsys.readouterr().out


def test_a_smoke_run_recorded_before_it_had_its_own_file_can_resume(course, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rep, "execute_notebook", FakeKernel())
    results = course / "build" / "figures"
    rep.reproduce(["91"], out_dir=course / "build" / "notebooks", results_dir=results, smoke=True)
    (results / "reproduce_times_smoke.json").rename(results / "reproduce_times.json")  # as an older kit wrote it
    run_id = json.loads((results / "reproduce_times.json").read_text())["run"]["id"]
    capsys.readouterr()
    rep.reproduce(["91"], out_dir=course / "build" / "notebooks", results_dir=results, smoke=True, resume=True)
    assert f"published by run {run_id} already; skipped" in capsys.readouterr().out


def test_cell_records_come_from_a_run_of_the_same_kind(course):
    src = course / "notebooks" / "91_alpha.py"
    assert rep.cell_records(src, "Stand-in GPU", False) == {SLEEPING_CELL: 0.2}
    assert rep.cell_records(src, "Stand-in GPU", True) == {}       # a --smoke run is not that size
    assert rep.cell_records(src, "Another GPU", False) == {}
    assert rep.cell_records(src, None, False) == {}                 # the CPU
    build = course / "build" / "notebooks"
    build.mkdir(parents=True)
    cpu = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = 2")])
    cpu.cells[0].metadata["papermill"] = {"duration": 3.0}
    cpu.metadata["cudagraph_kit"] = {"run": {"gpu": None, "smoke": True, "id": "cpu"}}
    nbformat.write(cpu, build / "91_alpha.ipynb")
    assert rep.cell_records(src, None, True, build) == {"y = 2": 3.0}
