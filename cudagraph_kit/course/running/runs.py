"""Which run made a set of results, and whether a results folder (``figures/``) comes from one run.

``reproduce`` names each run: when it started, the commit, a fingerprint of the code that makes the results,
the GPU, PyTorch and CUDA. Every ``env.json`` it records carries that run, and so does each executed
notebook's metadata. :func:`check_figures` groups a results folder by run and says plainly when it mixes runs
(``python -m cudagraph_kit check-figures``). What it checks: each notebook's folder (``figures/<notebook>/``) and
every folder whose ``env.json`` names a run. A folder that names no run and belongs to no notebook was recorded
apart from any run, by its own script (a probe, the two-GPU sweep, a benchmark run by hand); the report lists it
as such, with its GPU and date, and it does not count against one run.

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


def new_run(root: Path, gpu: str | None, smoke: bool, constraints: str | None = None) -> dict:
    """A fresh run record: id, start time, commit (None without git), code fingerprint, GPU, PyTorch, CUDA, and
    ``constraints``: the limits it ran under (the Colab rehearsal's; None for a plain run, and for records written
    before runs carried them)."""
    import torch

    from .paths import git

    started = time.gmtime()
    commit = git(root, "rev-parse", "HEAD")
    dirty = bool(git(root, "status", "--porcelain", "--", "cudagraph_kit", "notebooks/*.py", "scripts")) \
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


# The packages whose versions a run's results depend on (PyTorch and its pair, the data and plotting stack, the
# notebooks' transformers, and what executes and checks the notebooks).
VERSIONED = ("torch", "torchvision", "numpy", "pandas", "matplotlib", "transformers", "papermill", "nbval")
VERSIONS_FILE = "versions.txt"  # beside each results folder's env.json: every version the run had


def installed_versions(packages=VERSIONED) -> dict:
    """``{package: installed version, or None}`` (``importlib.metadata``; nothing is imported).

    Example: ``installed_versions()["numpy"]`` -> ``"2.4.6"``."""
    from importlib import metadata

    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def torch_index(torch_version: str | None) -> str | None:
    """The index that serves this build of PyTorch: ``2.11.0+cu130`` -> PyTorch's ``cu130`` index, ``+cpu`` -> its
    CPU index; None for the package registry's own builds (no ``+`` label)."""
    label = (torch_version or "").partition("+")[2]
    return f"https://download.pytorch.org/whl/{label}" if label else None


def versions_text(run: dict, versions: dict) -> str:
    """A requirements file of the versions a run ran on (``pip install -r`` it), headed by the run, the device,
    Python (this process's) and CUDA, which pip does not install. A package the run did not have is named in a
    comment."""
    where = run.get("gpu") or "CPU only"
    lines = [f"# The versions reproduce run {run.get('id')} ran on ({where}; Python {platform.python_version()}, "
             f"CUDA {run.get('cuda') or '-'}).",
             "# Install them in a virtual environment made with that Python: pip install -r versions.txt"]
    index = torch_index(versions.get("torch"))
    if index:
        lines.append(f"--extra-index-url {index}")
    lines += [f"{name}=={version}" if version else f"# {name}: not installed in this run"
              for name, version in versions.items()]
    return "\n".join(lines) + "\n"


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
    """What :func:`check_figures` found: the runs, the notebooks whose executed copy is from another run, and the
    results recorded apart from any run (no run id, no notebook's folder), grouped like unnamed runs."""
    root: Path
    groups: list
    mismatched: list  # "<stem>: notebook from run A, results from run B"
    apart: list = field(default_factory=list)

    @property
    def one_run(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].run is not None and not self.mismatched

    def group_of(self, folder: str) -> RunGroup | None:
        return next((g for g in [*self.groups, *self.apart] if folder in g.folders), None)

    def text(self) -> str:
        if not self.groups:
            return f"{self.root}: no recorded results (no <name>/env.json)"
        if self.one_run:
            head = f"{self.root}: every " + ("notebook's result, and every result that names a run, comes from "
                                             "one run." if self.apart else "result comes from one run.")
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
            lines.append("To record them as one run (maintainers, on one GPU machine; it rewrites the committed "
                         "notebooks and figures/): python -m cudagraph_kit reproduce (--resume goes on after an "
                         "interruption).")
        if self.apart:
            lines.append("Recorded apart from any run (no run id, no notebook's folder: a probe, the two-GPU "
                         "sweep, a benchmark run by its own script), so not checked; each is shown with its own GPU "
                         "and date:")
            lines += [f"- {g.label}: {', '.join(g.folders)}" for g in self.apart]
        return "\n".join(lines)


def _notebook_run(executed: Path) -> str | None:
    try:
        meta = json.loads(executed.read_text()).get("metadata", {})
    except (OSError, ValueError):
        return None
    return ((meta.get("cudagraph_kit") or {}).get("run") or {}).get("id")


def notebook_stems(root: Path, notebooks_dir=None) -> set:
    """The notebooks whose results folders ``check_figures`` holds to one run: those of ``notebooks_dir``, else of
    the ``notebooks/`` beside ``root``, else of this checkout."""
    from .paths import NOTEBOOKS_DIR, notebook_sources
    for folder in (notebooks_dir, Path(root).parent / "notebooks", NOTEBOOKS_DIR):
        if folder is not None and Path(folder).is_dir():
            return {p.stem for p in notebook_sources(Path(folder))}
    return set()


def check_figures(root=None, notebooks_dir=None) -> FiguresReport:
    """Group the results folders under ``root`` (default: the recorded ``figures/``) by the run that made them.

    Notebooks' folders that name no run (recorded before runs were named) are grouped by GPU, PyTorch and day;
    so are folders that name no run and belong to no notebook, apart (``FiguresReport.apart``). With
    ``notebooks_dir``, each ``<name>.ipynb`` there must come from the same run as ``<root>/<name>/``.
    """
    if root is None:
        from .paths import FIGURES_DIR, NOTEBOOKS_DIR
        root, notebooks_dir = FIGURES_DIR, NOTEBOOKS_DIR if notebooks_dir is None else notebooks_dir
    root = Path(root)
    stems = notebook_stems(root, notebooks_dir)
    groups: dict = {}
    apart: dict = {}
    mismatched = []
    for env_path in sorted(root.glob("*/env.json")):
        folder = env_path.parent.name
        env = json.loads(env_path.read_text())
        run = env.get("run")
        day = str(env.get("date", ""))[:10]
        key = ("run", run["id"]) if run else ("unnamed", env.get("gpu"), env.get("torch"), env.get("cuda"), day)
        where = groups if run or folder in stems else apart
        group = where.setdefault(key, RunGroup(run, env.get("gpu"), env.get("torch"), day))
        group.folders.append(folder)
        group.saved.append(str(env.get("date", "")))
        executed = Path(notebooks_dir) / f"{folder}.ipynb" if notebooks_dir is not None else None
        if executed is not None and executed.is_file():
            nb_run = _notebook_run(executed)
            if (run or {}).get("id") != nb_run:
                mismatched.append(f"{folder}: notebook from run {nb_run or '(none named)'}, results from run "
                                  f"{(run or {}).get('id') or '(none named)'}")
    def ordered(found):
        return sorted(found.values(), key=lambda g: (min(g.saved), g.folders[0]))
    return FiguresReport(root, ordered(groups), mismatched, ordered(apart))
