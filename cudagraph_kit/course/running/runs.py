"""Which run made a set of results, and whether a results folder (``figures/``) comes from one run.

``reproduce`` names each run: when it started, the commit, a fingerprint of the code that makes the results,
the GPU, PyTorch and CUDA. Every ``env.json`` it records carries that run, and so does each executed
notebook's metadata. :func:`check_figures` groups a results folder by run and says plainly when it mixes runs
(``python -m cudagraph_kit check-figures``).

Example::

    from cudagraph_kit.course.running.runs import check_figures
    report = check_figures("figures", notebooks_dir="notebooks")
    print(report.text())          # one paragraph per run, with its folders
    report.one_run                # False for a mix of runs, or folders that name no run
"""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# The files whose content decides what a run computes; their fingerprint tells whether a run can go on.
CODE_GLOBS = ("cudagraph_kit/**/*.py", "notebooks/[0-9][0-9]_*.py", "scripts/*.py")
# What must be the same for results to count as one run.
SETUP_KEYS = ("code_sha", "gpu", "torch", "cuda", "smoke", "constraints")


def code_fingerprint(root: Path) -> str:
    """SHA-256 (first 12 hex digits) of the code that makes the results (:data:`CODE_GLOBS` under ``root``)."""
    return tree_digest(root, CODE_GLOBS)[:12]


def tree_files(root: Path, patterns=("**/*",)) -> list[Path]:
    """The files under ``root`` that match any of ``patterns`` (``Path.glob`` patterns; all files by default),
    ``__pycache__`` left out, in path order."""
    root = Path(root)
    return sorted({p for pattern in patterns for p in root.glob(pattern)
                   if p.is_file() and "__pycache__" not in p.relative_to(root).parts})


def tree_digest(root: Path, patterns=("**/*",)) -> str:
    """SHA-256 (hex) of a folder's files (:func:`tree_files`): each one's path relative to ``root`` and its content,
    in path order. The one tree hash of the course: the code fingerprint, and whether a folder changed.

    Example::

        before = tree_digest("build/results/01_gelu")
        ...                                          # something that may write there
        changed = tree_digest("build/results/01_gelu") != before
    """
    root = Path(root)
    digest = hashlib.sha256()
    for path in tree_files(root, patterns):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_digests(root: Path, patterns=("**/*",)) -> dict[str, str]:
    """``{path relative to root (posix): SHA-256 hex}`` of a folder's files (:func:`tree_files`): compare two to
    name the files added, removed or changed (an empty dict for a folder that is not there)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in tree_files(root, patterns)}


def _git(root: Path, *args) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def new_run(root: Path, gpu: str | None, smoke: bool, constraints: str | None = None) -> dict:
    """A fresh run record: id, start time, commit (None without git), code fingerprint, GPU, PyTorch, CUDA, and
    ``constraints``: the limits it ran under (the Colab rehearsal's; None for a plain run, and for records written
    before runs carried them)."""
    import torch

    started = time.gmtime()
    commit = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--", "cudagraph_kit", "notebooks/*.py", "scripts")) \
        if commit else None
    code = code_fingerprint(root)
    label = (commit[:8] + ("-dirty" if dirty else "")) if commit else f"code-{code[:8]}"
    run = {"id": f"{time.strftime('%Y%m%dT%H%M%SZ', started)}-{label}",
           "started": time.strftime("%Y-%m-%d %H:%M UTC", started), "commit": commit, "dirty": dirty,
           "code_sha": code, "gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "smoke": bool(smoke)}
    if constraints is not None:  # only then: a plain run's record stays as it was
        run["constraints"] = constraints
    return run


def setup_differences(recorded: dict, now: dict) -> list[str]:
    """What differs between two runs' setups (code, GPU, PyTorch, CUDA, smoke, constraints), as readable lines."""
    return [f"{key}: {recorded.get(key)!r} in run {recorded.get('id')}, {now.get(key)!r} now"
            for key in SETUP_KEYS if recorded.get(key) != now.get(key)]


# ------------------------------------------------------------------------------------------------ the check
@dataclass
class RunGroup:
    """Results folders that come from one run (``run`` set), or that name no run but share GPU, PyTorch and day."""
    run: dict | None
    gpu: str | None
    torch: str | None
    day: str
    folders: list = field(default_factory=list)
    saved: list = field(default_factory=list)  # the env.json dates of its folders

    @property
    def label(self) -> str:
        where = f"{self.gpu or 'CPU only'}, PyTorch {self.torch}"
        if self.run is not None:
            commit = self.run.get("commit") or "no git"
            dirty = " with uncommitted changes" if self.run.get("dirty") else ""
            return f"run {self.run['id']} ({where}, commit {commit[:8]}{dirty}, code {self.run.get('code_sha')})"
        times = sorted(s[11:16] for s in self.saved if len(s) >= 16)
        span = f", saved {times[0]}-{times[-1]} UTC" if len(times) > 1 and times[0] != times[-1] else ""
        return f"no run id recorded ({where}, {self.day}{span}; possibly several runs)"


@dataclass
class FiguresReport:
    """What :func:`check_figures` found: the runs, and the notebooks whose executed copy is from another run."""
    root: Path
    groups: list
    mismatched: list  # "<stem>: notebook from run A, results from run B"

    @property
    def one_run(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].run is not None and not self.mismatched

    def group_of(self, folder: str) -> RunGroup | None:
        return next((g for g in self.groups if folder in g.folders), None)

    def text(self) -> str:
        if not self.groups:
            return f"{self.root}: no recorded results (no <name>/env.json)"
        if self.one_run:
            head = f"{self.root}: every result comes from one run."
        else:
            unnamed = sum(g.run is None for g in self.groups)
            head = (f"{self.root} MIXES RESULTS: {len(self.groups)} group(s) of results, "
                    f"{len(self.groups) - unnamed} named run(s)" + (f" and {unnamed} group(s) that name no run"
                                                                    if unnamed else "")
                    + ". Compare numbers only within a group.")
        lines = [head]
        for g in self.groups:
            lines.append(f"- {g.label}: {', '.join(g.folders)}")
        lines += [f"- notebook and results differ: {m}" for m in self.mismatched]
        if not self.one_run:
            lines.append("To record them as one run: python -m cudagraph_kit reproduce (on one GPU machine; "
                         "--resume goes on after an interruption).")
        return "\n".join(lines)


def _notebook_run(executed: Path) -> str | None:
    try:
        meta = json.loads(executed.read_text()).get("metadata", {})
    except (OSError, ValueError):
        return None
    return ((meta.get("cudagraph_kit") or {}).get("run") or {}).get("id")


def check_figures(root=None, notebooks_dir=None) -> FiguresReport:
    """Group the results folders under ``root`` (default: the recorded ``figures/``) by the run that made them.

    Folders that name no run (recorded before runs were named) are grouped by GPU, PyTorch and day. With
    ``notebooks_dir``, each ``<name>.ipynb`` there must come from the same run as ``<root>/<name>/``.
    """
    if root is None:
        from .paths import FIGURES_DIR, NOTEBOOKS_DIR
        root, notebooks_dir = FIGURES_DIR, NOTEBOOKS_DIR if notebooks_dir is None else notebooks_dir
    root = Path(root)
    groups: dict = {}
    mismatched = []
    for env_path in sorted(root.glob("*/env.json")):
        folder = env_path.parent.name
        env = json.loads(env_path.read_text())
        run = env.get("run")
        day = str(env.get("date", ""))[:10]
        key = ("run", run["id"]) if run else ("unnamed", env.get("gpu"), env.get("torch"), env.get("cuda"), day)
        group = groups.setdefault(key, RunGroup(run, env.get("gpu"), env.get("torch"), day))
        group.folders.append(folder)
        group.saved.append(str(env.get("date", "")))
        executed = Path(notebooks_dir) / f"{folder}.ipynb" if notebooks_dir is not None else None
        if executed is not None and executed.is_file():
            nb_run = _notebook_run(executed)
            if (run or {}).get("id") != nb_run:
                mismatched.append(f"{folder}: notebook from run {nb_run or '(none named)'}, results from run "
                                  f"{(run or {}).get('id') or '(none named)'}")
    ordered = sorted(groups.values(), key=lambda g: (min(g.saved), g.folders[0]))
    return FiguresReport(root, ordered, mismatched)
