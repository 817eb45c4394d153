"""Every command under scripts/ (and scripts/probes/) answers ``--help`` (exit 0) and refuses an option it does not
know (exit 2), and neither writes anything: the checkout is the same before and after. A script that rewrites files
does so only when its command line says so (``--write``), so a typo (``--chek``) never rewrites a page.

Each script parses its options before it loads PyTorch, so these runs take a fraction of a second each."""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraph_kit.course.running.paths import git

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
NOT_COMMANDS = {
    "setup_cell.py": "the notebooks' first cell, copied into them by sync_setup_cell.py; not a command",
    "bench_overhead.py": "being rewritten apart from this change; its command-line test comes with the rewrite",
}
# What a script needs on its command line besides the option under test (so argparse reaches the unknown option).
REQUIRED = {
    "probe_bucket_costs.py": ["--out", "{tmp}"], "probe_decode_kernels.py": ["--out", "{tmp}"],
    "probe_hf_decode.py": ["--out", "{tmp}"], "probe_ladder_cost.py": ["--out", "{tmp}"],
    "probe_tiny_graphs.py": ["--out", "{tmp}"], "probe_first_window.py": ["--out", "{tmp}", "--label", "x"],
    "rerun_report.py": ["{tmp}", "{tmp}"],
    "update_readme.py": ["--check"], "decision_chart.py": ["--check"], "facilitator_timings.py": ["--check"],
    "sync_setup_cell.py": ["--check"], "sync_markdown.py": ["--check"],
}
COMMANDS = sorted(p for p in [*SCRIPTS.glob("*.py"), *SCRIPTS.glob("probes/*.py"), *SCRIPTS.glob("*.sh")]
                  if p.name not in NOT_COMMANDS)


def tree_state() -> tuple:
    """What `git status` shows, the content of every changed and untracked file (a file already changed before
    the run and changed again shows up too), and when each file of the checkout was last written (a file
    rewritten with the same text shows up too)."""
    changed = git(ROOT, "ls-files", "--modified", "--others", "--exclude-standard", "-z", check=True).split("\0")
    digests = {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in changed if (ROOT / p).is_file()}
    files = git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z", check=True).split("\0")
    written = {p: (ROOT / p).stat().st_mtime_ns for p in files if (ROOT / p).is_file()}
    return git(ROOT, "status", "--porcelain", "--untracked-files=all", check=True), digests, written


def run(script: Path, *args) -> subprocess.CompletedProcess:
    command = ["bash", str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(ROOT / "build" / "never-written")}
    return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="compares the checkout with git; not a git checkout")
@pytest.mark.parametrize("script", COMMANDS, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_help_and_a_mistyped_option_answer_and_write_nothing(script, tmp_path):
    before = tree_state()
    helped = run(script, "--help")
    assert helped.returncode == 0, (helped.stdout[-1000:], helped.stderr[-2000:])
    assert "usage" in helped.stdout.lower() and len(helped.stdout.splitlines()) >= 3, helped.stdout
    required = [a.replace("{tmp}", str(tmp_path / "out")) for a in REQUIRED.get(script.name, [])]
    typo = run(script, *required, "--chek")
    assert typo.returncode == 2, (typo.stdout[-1000:], typo.stderr[-2000:])
    if script.suffix == ".py":
        assert "unrecognized arguments: --chek" in typo.stderr, typo.stderr[-2000:]
    else:
        assert "--chek" in typo.stderr, typo.stderr[-2000:]
    assert tree_state() == before, f"{script.name} --help or --chek changed the checkout (git status)"
    assert not (tmp_path / "out").exists(), f"{script.name} wrote its output folder before refusing --chek"


@pytest.mark.parametrize("name", ["update_readme.py", "decision_chart.py", "facilitator_timings.py",
                                  "sync_setup_cell.py", "sync_markdown.py"])
def test_a_renderer_without_write_or_check_writes_nothing_and_says_what_to_add(name):
    before = tree_state()
    done = run(SCRIPTS / name)
    assert done.returncode == 2 and "one of the arguments --write --check is required" in done.stderr, done.stderr
    assert tree_state() == before
