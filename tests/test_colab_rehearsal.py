"""The Colab rehearsal, on the CPU where it can be: the no-bf16 switch, the kernel hook's GPU memory cap (applied
when CUDA is there, said when not), the per-notebook peaks JSON and table, --resume, and the script's argument
handling (--dry-run starts nothing). The GPU test at the end runs the cap for real (skipped without CUDA)."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import nbformat
import pytest
import torch

from cudagraph_kit import env as kit_env
from cudagraph_kit.course.running import colab_rehearsal as cr
from cudagraph_kit.course.running import kernel_hook
from cudagraph_kit.course.running import reproduce as rep
from cudagraph_kit.course.running import runs

ROOT = rep.PROJECT_ROOT


# ------------------------------------------------------------------------------------------------ no bf16
@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("0", True), ("false", True),
                                             ("1", False), ("yes", False)])
def test_the_no_bf16_switch(monkeypatch, value, expected):
    monkeypatch.setattr(kit_env, "has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # an H100
    if value is None:
        monkeypatch.delenv(kit_env.NO_BF16_ENV, raising=False)
    else:
        monkeypatch.setenv(kit_env.NO_BF16_ENV, value)
    assert kit_env.bf16_supported() is expected


def test_the_switch_is_documented():
    assert kit_env.NO_BF16_ENV == "CUDAGRAPH_KIT_NO_BF16"
    assert "CUDAGRAPH_KIT_NO_BF16" in kit_env.bf16_supported.__doc__
    assert "CUDAGRAPH_KIT_NO_BF16" in (ROOT / "CONTRIBUTING.md").read_text()


# ------------------------------------------------------------------------------------------------ the kernel hook
def test_the_hook_caps_the_allocator_when_cuda_is_there(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    hook = kernel_hook.KernelHook({"stats": str(tmp_path / "stats.json")})
    cap = hook.apply_gpu_cap(15)
    assert calls == [(15 / 80, 0)]
    assert cap["applied"] and cap["fraction"] == pytest.approx(0.1875) and "stops at 15 GiB" in cap["why"]
    assert kernel_hook.KernelHook({}).apply_gpu_cap(100)["fraction"] == 1.0  # a smaller GPU: all of it


def test_the_hook_leaves_an_alloc_conf_cap_to_the_allocator(monkeypatch, capfd):
    """Where PYTORCH_CUDA_ALLOC_CONF carries the fraction, the hook imports nothing at kernel start."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.187500")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: pytest.fail("set by the hook"))
    cap = kernel_hook.KernelHook({}).apply_gpu_cap(15)
    assert cap["applied"] and cap["via"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.187500" in capfd.readouterr().err


def test_the_hook_says_so_without_cuda(monkeypatch, capfd):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cap = kernel_hook.KernelHook({}).apply_gpu_cap(15)
    assert not cap["applied"] and cap["why"] == "no CUDA device: no GPU memory cap applied"
    assert "no CUDA device: no GPU memory cap applied" in capfd.readouterr().err


def test_a_kernel_records_its_peaks_and_the_limits_it_saw(tmp_path, monkeypatch, capfd):
    """A real kernel with the hook: the stats JSON says what the kernel saw (cap, CPUs, environment, bf16)."""
    monkeypatch.setenv("CUDAGRAPH_KIT_NO_BF16", "1")
    src = tmp_path / "nb.py"
    child = "import time; block = bytearray(300 * 2**20); time.sleep(1.5)"  # a subprocess holding 300 MiB
    src.write_text("# %%\nimport cudagraph_kit.env\nblock = bytearray(600 * 2**20)  # 600 MiB of host memory\n\n"
                   f"# %%\nimport subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n"
                   "print(cudagraph_kit.env.bf16_supported())\n")
    stats = tmp_path / "stats.json"
    rep.execute_notebook(src, tmp_path / "nb.ipynb", kernel_settings={
        "gpu_memory_gib": 15, "stats": str(stats), "report_env": ["CUDAGRAPH_KIT_NO_BF16"], "sample_every_s": 0.2})
    record = json.loads(stats.read_text())
    assert record["cells"] == 3  # kernel start + 2 cells
    assert record["host_max_rss_bytes"] > 600 * 2**20
    assert record["peak_cells"]["host_max_rss_bytes"].startswith("import cudagraph_kit.env")
    # the kernel's 600 MiB block and its child's 300 MiB at once (both private: counted whole), sampled while the
    # child ran
    assert record["tree_max_rss_bytes"] > 850 * 2**20
    assert record["peak_cells"]["tree_max_rss_bytes"] == "import subprocess, sys"
    assert record["environment"] == {"CUDAGRAPH_KIT_NO_BF16": "1"} and record["bf16_supported"] is False
    assert record["cpus"] == sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available():
        assert record["gpu_cap"]["applied"]
    else:
        assert record["gpu_cap"] == {"applied": False, "gib": 15.0,
                                     "why": "no CUDA device: no GPU memory cap applied"}
        assert record["gpu_max_reserved_bytes"] is None
        assert "no CUDA device: no GPU memory cap applied" in capfd.readouterr().err


# ------------------------------------------------------------------------------------------------ the rehearsal
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's /proc/PID/smaps_rollup")
def test_pages_a_forked_child_shares_count_once():
    """A forked child (a DataLoader worker) shares its parent's pages: summed resident sizes would count a block
    the parent wrote once per process, the proportional sizes the tree adds up count it once."""
    block_mib = 256
    before = kernel_hook.tree_rss_bytes(os.getpid())
    block = bytearray(block_mib * 2**20)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))   # touch every page: resident in the parent
    ready_r, ready_w = os.pipe()   # child -> parent: "I am there"
    done_r, done_w = os.pipe()     # parent -> child: "you may go"
    child = os.fork()
    if child == 0:   # the child touches nothing of the block, says it is there, and waits
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        grown = kernel_hook.tree_rss_bytes(os.getpid()) - before
    finally:
        os.write(done_w, b"y")
        os.waitpid(child, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)
    assert block_mib * 0.9 * 2**20 < grown < block_mib * 1.5 * 2**20, grown / 2**20   # summed RSS: about 2x


def test_cpus_and_alloc_conf():
    assert cr.parse_cpus("0,1") == [0, 1] and cr.parse_cpus("0-2,8") == [0, 1, 2, 8]
    assert cr.alloc_conf_with_fraction(0.1875, "expandable_segments:True,per_process_memory_fraction:0.5") == \
        "expandable_segments:True,per_process_memory_fraction:0.187500"
    assert cr.environment({"alloc_conf": None}) == {"CUDAGRAPH_KIT_NO_BF16": "1", "TORCHINDUCTOR_COMPILE_THREADS": "2"}


def test_the_cap_is_what_a_t4_leaves_after_the_measured_cuda_context(monkeypatch):
    """A T4 has 15,360 MiB, its CUDA context included: the cap is that less the context the probe measured, rounded
    down to 1/16 GiB; a cap given by hand wins."""
    assert cr.t4_cap_gib(0) == 15.0 and cr.t4_cap_gib(530 * 2**20) == 14.4375
    assert cr.t4_cap_gib(530 * 2**20) == cr.t4_cap_gib(540 * 2**20)   # a few MiB apart: the same cap
    probe = {"cuda": True, "torch": "x", "gpu": "NVIDIA H200", "total_bytes": 140 * 2**30, "capability": [9, 0],
             "context_bytes": 530 * 2**20}

    def fake_python(code, env=None, timeout=120):
        out = json.dumps(probe) if code == cr._PROBE else "0.1"
        return SimpleNamespace(returncode=0, stdout=out + "\n", stderr="")
    monkeypatch.setattr(cr, "_python", fake_python)
    gpu = cr.probe_gpu()
    assert gpu["context_mib"] == 530 and gpu["gib"] == 14.4375
    assert gpu["fraction"] == pytest.approx(14.4375 / 140)
    assert "15,360 MiB less this machine's CUDA context (530 MiB)" in gpu["why"]
    assert cr.probe_gpu(10)["gib"] == 10


NOTEBOOK = '''\
# %% tags=["parameters"]
SMOKE = False

# %%
import os
from cudagraph_kit.env import bf16_supported
print(os.environ.get("CUDAGRAPH_KIT_NO_BF16"), bf16_supported(), sorted(os.sched_getaffinity(0)))
'''


@pytest.fixture
def course(tmp_path, monkeypatch):
    nbs, figs = tmp_path / "notebooks", tmp_path / "figures"
    nbs.mkdir()
    figs.mkdir()
    for stem in ("91_alpha", "92_beta"):
        (nbs / f"{stem}.py").write_text(NOTEBOOK)
    monkeypatch.setattr(rep, "NOTEBOOKS_DIR", nbs)
    monkeypatch.setattr(rep, "FIGURES_DIR", figs)
    monkeypatch.setattr(rep, "STAGING_DIR", tmp_path / "staging")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # --resume compares the code's fingerprint: pinned, so an edit elsewhere in the checkout during the test
    # does not end the run it resumes
    monkeypatch.setattr(runs, "code_fingerprint", lambda root: "pinned-code")
    return tmp_path


@pytest.mark.notebook
def test_a_rehearsal_records_every_notebook_and_goes_on_with_resume(course, capsys):
    out = course / "rehearsal"
    env_before, cpus_before = dict(os.environ), os.sched_getaffinity(0)
    assert cr.main(["91", "--out", str(out), "--cpus", "0"]) == 0
    assert dict(os.environ) == env_before and os.sched_getaffinity(0) == cpus_before  # put back
    printed = capsys.readouterr().out
    report = json.loads((out / "rehearsal.json").read_text())
    row = report["notebooks"]["91_alpha"]
    assert row["status"] == "done" and row["wall_s"] > 0 and row["host_peak_rss_gib"] > 0
    assert row["cpus"] == "0" and row["bf16_supported"] is False and row["flags"] == ""
    assert report["constraints"] == "colab-t4: cpus 0; gpu memory 15 GiB; no bf16; inductor compile threads 2"
    assert report["environment"]["CUDAGRAPH_KIT_NO_BF16"] == "1"
    stats = json.loads((out / "kernel_stats" / "91_alpha.json").read_text())
    assert stats["environment"]["TORCHINDUCTOR_COMPILE_THREADS"] == "2" and stats["cpus"] == [0]
    executed = nbformat.read(out / "notebooks" / "91_alpha.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "1 False [0]\n"  # what the notebook itself saw
    assert "colab rehearsal: run " in printed and "91_alpha" in printed.split("colab rehearsal: run ", 1)[1]
    assert not any(rep.FIGURES_DIR.iterdir())  # nothing recorded touched
    # the same run goes on: 91 is skipped and keeps its row, 92 runs
    assert cr.main(["--resume", "--out", str(out), "--cpus", "0"]) == 0
    report2 = json.loads((out / "rehearsal.json").read_text())
    assert report2["run_id"] == report["run_id"]
    assert report2["notebooks"]["91_alpha"] == row and report2["notebooks"]["92_beta"]["status"] == "done"
    lines = (out / "rehearsal.csv").read_text().splitlines()
    assert lines[0].startswith("notebook,status,wall_s,gpu_peak_reserved_gib") and len(lines) == 3
    # other limits: --resume refuses to mix them into the same run
    with pytest.raises(SystemExit, match="constraints"):
        cr.main(["--resume", "--out", str(out), "--cpus", "0", "--gpu-memory-gib", "40"])


@pytest.mark.notebook
def test_a_failing_notebook_is_in_the_table_and_the_exit_status(course, capsys):
    (course / "notebooks" / "92_beta.py").write_text(NOTEBOOK + "\n# %%\nraise MemoryError('as on a T4')\n")
    out = course / "rehearsal"
    assert cr.main(["--out", str(out), "--cpus", "0"]) == 1
    report = json.loads((out / "rehearsal.json").read_text())
    assert report["notebooks"]["91_alpha"]["status"] == "done"
    assert report["notebooks"]["92_beta"]["status"] == "FAILED"
    assert "at cell 3/3: raise MemoryError('as on a T4')" in report["notebooks"]["92_beta"]["where"]
    assert "92_beta" in capsys.readouterr().out.split("colab rehearsal: run ", 1)[1]


def test_the_report_flags_what_would_not_fit_a_colab_runtime():
    stats = {"gpu_max_reserved_bytes": 16 * 2**30, "host_max_rss_bytes": 13 * 2**30, "bf16_supported": True,
             "gpu_cap": {"applied": True, "gib": 15.0}}
    row = cr.notebook_row("04_resnet50", "done", 12.0, "", stats, 15.0)
    assert row["flags"] == "GPU over 15 GiB; host over Colab's 12.7 GiB; bf16 was NOT switched off"
    assert row["gpu_cap"] == "15 GiB"


def _script(*args, **env):
    return subprocess.run(["bash", str(ROOT / "scripts" / "colab_rehearsal.sh"), *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHON=sys.executable, **env))


def test_the_script_dry_run_says_what_it_would_do_and_starts_nothing(tmp_path):
    out = tmp_path / "rehearsal"
    done = _script("--dry-run", "01", "02", "--resume", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert f"taskset -c 0,1 {sys.executable} -m cudagraph_kit.course.running.colab_rehearsal --cpus 0,1 --dry-run" in text
    assert "dry run: nothing is started" in text and "2 notebook(s): 01_gelu, 02_train_step" in text
    assert "CUDAGRAPH_KIT_NO_BF16=1 TORCHINDUCTOR_COMPILE_THREADS=2" in text
    assert "limits:       colab-t4: cpus 0,1; gpu memory 15 GiB; no bf16" in text and "resume:" in text
    assert not out.exists()
    for args, env in ((["--cpus", "0"], {}), (["--cpus=0"], {}), ([], {"CGK_REHEARSAL_CPUS": "0"})):
        done = _script("--dry-run", "01", "--out", str(out), *args, **env)
        assert done.returncode == 0 and "taskset -c 0 " in done.stdout and "cpus 0;" in done.stdout, done.stdout


@pytest.mark.parametrize("args, code, says", [
    (["--dry-run", "--cpus"], 2, "--cpus needs a CPU list"),
    (["--dry-run", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["--dry-run", "99"], 1, "no notebook matches ['99']"),
    (["--dry-run", "--out", "figures"], 1, "the rehearsal never writes there"),
])
def test_the_script_refuses_bad_arguments(args, code, says):
    done = _script(*args)
    assert done.returncode == code and says in done.stderr, done.stdout + done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("via", ["set_per_process_memory_fraction", "PYTORCH_CUDA_ALLOC_CONF"])
def test_the_cap_binds_in_a_real_kernel(tmp_path, monkeypatch, via):
    """On a GPU: a kernel capped at 1 GiB cannot allocate 2 GiB (the allocator refuses), and records the cap in
    force; either way the rehearsal may set it (the environment variable only where this PyTorch reads it)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    if via == "PYTORCH_CUDA_ALLOC_CONF":
        gpu = cr.probe_gpu(1)
        if not gpu["alloc_conf_supported"]:
            pytest.skip(f"PyTorch {torch.__version__} does not read per_process_memory_fraction there: {gpu['why']}")
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", gpu["alloc_conf"])
    src = tmp_path / "nb.py"
    src.write_text("# %%\nimport torch\ntry:\n    torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\n"
                   "    print('allocated')\nexcept torch.OutOfMemoryError:\n    print('refused')\n"
                   "print(torch.cuda.get_per_process_memory_fraction(0))\n")
    stats = tmp_path / "stats.json"
    executed = rep.execute_notebook(src, tmp_path / "nb.ipynb", kernel_settings={"gpu_memory_gib": 1,
                                                                                 "stats": str(stats)})
    text = nbformat.read(executed, as_version=4).cells[0].outputs[0]["text"]
    total = torch.cuda.get_device_properties(0).total_memory
    assert text.splitlines()[0] == "refused" and float(text.splitlines()[1]) == pytest.approx(2**30 / total, rel=1e-4)
    record = json.loads(stats.read_text())
    assert record["gpu_cap"]["applied"] and record["gpu_cap"]["via"] == via
    assert record["gpu_cap"]["fraction_seen"] == pytest.approx(2**30 / total, rel=1e-4)
    assert record["gpu_max_reserved_bytes"] <= 2**30
