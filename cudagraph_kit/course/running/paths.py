"""Where the course's files live in a source checkout: the notebooks, the recorded figures, the repository.

Example::

    from cudagraph_kit.course.running.paths import notebook_sources
    print([p.stem for p in notebook_sources()])   # ['01_gelu', '02_train_step', ...]
"""
from __future__ import annotations

import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # cudagraph_kit/course/running/paths.py -> the checkout
NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
FIGURES_DIR = PROJECT_ROOT / "figures"


def repository_url() -> str:
    """The project's repository: ``[project.urls] Repository`` of pyproject.toml (or of the installed kit)."""
    pyproject = PROJECT_ROOT / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'(?m)^Repository\s*=\s*"([^"]+)"', pyproject.read_text())
        if m:
            return m.group(1)
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
    """Stop with a clear message when this kit was installed without its notebooks (``pip install``)."""
    if not NOTEBOOKS_DIR.is_dir():
        url = repository_url()
        raise SystemExit(
            f"The notebooks live in a source checkout of cudagraph-kit; this kit was installed without them "
            f"({PROJECT_ROOT / 'cudagraph_kit'}). Get them with:\n"
            f"  git clone {url} cudagraph-kit\n"
            f"  cd cudagraph-kit && pip install -r requirements.txt -e . && python -m cudagraph_kit reproduce")


def notebook_sources(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources (``NN_*.py``) in reading order."""
    return sorted(p for p in Path(notebooks_dir).glob("[0-9][0-9]_*.py"))
