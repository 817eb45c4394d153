"""Save and load a notebook's results: ``figures/<stem>/results.csv``, ``env.json`` and PNG figures.

GPU runs write to the committed ``figures/`` folder; runs without CUDA write to ``build/figures`` so they never
overwrite recorded GPU results; ``$CGK_RESULTS_DIR`` overrides both (tests use it).

Example::

    from cudagraph_kit import results
    folder = results.save("01_gelu", df, figures={"speedup": fig})
    rec = results.load("01_gelu")           # the recorded GPU run: rec.df, rec.env, rec.pngs
    results.show_recorded("01_gelu")        # in a notebook: caption + table + figures
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .env import describe, has_cuda

__all__ = ["save", "load", "show_recorded", "results_root", "recorded_root", "Recorded", "REQUIRED_COLUMNS"]

REQUIRED_COLUMNS = ("case", "variant", "median_us", "speedup")
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def recorded_root() -> Path:
    """The committed ``figures/`` folder of a source checkout (else ``./figures``)."""
    if (_PACKAGE_PARENT / "notebooks").is_dir():
        return _PACKAGE_PARENT / "figures"
    return Path.cwd() / "figures"


def results_root() -> Path:
    """Where ``save`` writes: ``$CGK_RESULTS_DIR``, else ``figures/`` with CUDA, else ``build/figures``."""
    if os.environ.get("CGK_RESULTS_DIR"):
        return Path(os.environ["CGK_RESULTS_DIR"])
    return recorded_root() if has_cuda() else recorded_root().parent / "build" / "figures"


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
        return (f"Recorded on {where} (driver {e.get('driver') or '-'}), PyTorch {e.get('torch')}, "
                f"CUDA {e.get('cuda') or '-'}, {e.get('date')}")


def save(stem: str, df, figures: dict | None = None, root=None, extra_env: dict | None = None) -> Path:
    """Write ``df`` as ``<root>/<stem>/results.csv`` with ``env.json`` and each figure as ``<name>.png``."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results for {stem!r} lack column(s) {missing}; every row needs "
                         f"{list(REQUIRED_COLUMNS)} (and floor_us where known). Fix: add them before saving.")
    folder = Path(root or results_root()) / stem
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "results.csv", index=False)
    env = describe()
    env["executed_as"] = "cuda" if has_cuda() else "cpu (eager only)"
    env["notebook"] = stem
    env.update(extra_env or {})
    (folder / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    for name, fig in (figures or {}).items():
        fig.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
    return folder


def load(stem: str, root=None) -> Recorded | None:
    """Read back what ``save`` wrote (default: the committed GPU results); None if nothing is recorded."""
    import pandas as pd

    folder = Path(root or recorded_root()) / stem
    if not (folder / "results.csv").is_file():
        return None
    env_path = folder / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    return Recorded(pd.read_csv(folder / "results.csv"), env, folder, sorted(folder.glob("*.png")))


def show_recorded(stem: str, root=None, columns=None) -> Recorded | None:
    """Display the recorded results of ``stem`` in a notebook (caption, table, figures), or say there are none."""
    rec = load(stem, root)
    if rec is None:
        print(f"No recorded results for {stem} under {Path(root or recorded_root())}. "
              "They are committed in the project's figures/ folder (see the README).")
        return None
    try:
        from IPython.display import Image, Markdown, display
    except ImportError:  # plain Python: print the table
        print(rec.caption)
        print(rec.df.to_string(index=False))
        return rec
    display(Markdown(f"**{rec.caption}**"))
    display(rec.df if columns is None else rec.df[[c for c in columns if c in rec.df.columns]])
    for png in rec.pngs:
        display(Image(filename=str(png)))
    return rec
