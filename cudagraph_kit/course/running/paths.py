"""Where the course's files live in a source checkout: the notebooks, the recorded figures, the repository; its
``pyproject.toml`` and its git history.

Example::

    from cudagraph_kit.course.running.paths import notebook_sources
    print([p.stem for p in notebook_sources()])   # ['01_gelu', '02_train_step', ...]
"""
from __future__ import annotations

import subprocess
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # cudagraph_kit/course/running/paths.py -> the checkout
NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
FIGURES_DIR = PROJECT_ROOT / "figures"
# What a learner runs in a checkout (the hints name these; `reproduce` without --smoke is the maintainers')
LEARNER_COMMANDS = ("python -m cudagraph_kit lab                 # the notebooks in JupyterLab (working copies)\n"
                    "  python -m cudagraph_kit reproduce --smoke   # every notebook headless and small, into build/")


def pyproject(root: Path = PROJECT_ROOT) -> dict:
    """``<root>/pyproject.toml`` as a dict ({} where there is none), read with tomllib (tomli before Python 3.11).

    Example: ``pyproject()["project"]["version"]`` -> ``"0.4.0.dev0"``."""
    path = Path(root) / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10: tomli, a dependency of the kit there
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def git(root: Path, *args: str, check: bool = False) -> str | None:
    """``git -C root ARGS``'s output, stripped; None where git fails or is missing (with ``check``: raise
    ``RuntimeError`` with git's own message instead). The course's one way to ask git.

    Example: ``git(PROJECT_ROOT, "rev-parse", "HEAD")`` -> ``"614328b..."``."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        if check:
            raise RuntimeError(f"git {' '.join(args)} in {root} could not run: {exc}") from exc
        return None
    if done.returncode != 0:
        if check:
            raise RuntimeError(f"git {' '.join(args)} in {root} failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()}")
        return None
    return done.stdout.strip()


def repository_url() -> str:
    """The project's repository: ``[project.urls] Repository`` of pyproject.toml (or of the installed kit)."""
    url = pyproject().get("project", {}).get("urls", {}).get("Repository")
    if url:
        return url
    try:
        from importlib.metadata import metadata
        for entry in metadata("cudagraph-kit").get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() == "repository":
                return url.strip()
    except Exception:  # not installed
        pass
    return "the cudagraph-kit repository"


def require_checkout() -> None:
    """Stop with a clear message when this kit was installed without its notebooks (``pip install``): where to get
    them, and what a learner runs there (never the maintainers' recording command)."""
    if not NOTEBOOKS_DIR.is_dir():
        url = repository_url()
        raise SystemExit(
            f"The notebooks live in a source checkout of cudagraph-kit; this kit was installed without them "
            f"({PROJECT_ROOT / 'cudagraph_kit'}). Get them with:\n"
            f"  git clone {url} cudagraph-kit\n"
            f"  cd cudagraph-kit && pip install -r requirements.txt -e .\n"
            f"then, in that folder:\n  {LEARNER_COMMANDS}")


def notebook_sources(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources (``NN_*.py``) in reading order."""
    return sorted(p for p in Path(notebooks_dir).glob("[0-9][0-9]_*.py"))
