"""What every notebook's first cell does once it has found (or, in Colab, cloned) the kit.

The cell itself (``scripts/setup_cell.py``, copied into every notebook) stays a few lines: it finds a checkout of
cudagraph-kit in the working folder or above it; in Colab, where there is none, it makes a shallow clone of the
ref ``REPO_REF`` first (the branch the Colab badges open), and if that fails it says why and what to do. Then it calls ``setup_notebook(checkout, ref)``, which

- checks that the PyTorch it finds is one the kit supports (``torch>=`` in the checkout's ``pyproject.toml``)
  and otherwise stops with the version found, the version needed and the fix;
- in Colab: installs the clone (editable, ``--no-deps`` so Colab's own torch, numpy, pandas and matplotlib stay
  as they are; with pip's build isolation, so the build uses the setuptools floor of ``pyproject.toml``) unless
  that clone is already the installed kit, and moves into its ``notebooks/`` folder;
- puts the checkout on ``sys.path``.

Run twice (a re-run cell, a restarted kernel) it reuses the clone and the install. In a checkout it prints
nothing. Example (what the cell does after the clone)::

    from cudagraph_kit.course.setup_notebook import setup_notebook
    setup_notebook(Path("cudagraph-kit"), "main", in_colab=True)
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

DIST = "cudagraph-kit"


def run_step(*command) -> None:
    """Run one setup command; if it fails, raise with the command's own error output."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"setup failed (exit {done.returncode}): {' '.join(map(str, command))}\n"
                           + (done.stderr or done.stdout).strip())


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def minimum_torch(checkout: Path) -> str | None:
    """The oldest PyTorch the kit supports: the ``torch>=`` requirement of ``<checkout>/pyproject.toml``."""
    pyproject = Path(checkout) / "pyproject.toml"
    if not pyproject.is_file():
        return None
    m = re.search(r'"torch\s*>=\s*([\d.]+)', pyproject.read_text())
    return m.group(1) if m else None


def check_torch(checkout: Path, found: str | None = None) -> str:
    """Raise a clear error if the PyTorch found is older than the kit supports; return the version found."""
    if found is None:
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError("PyTorch is not installed here. Fix: `pip install torch` (see pytorch.org for "
                               "the build that matches your CUDA), then run this cell again.") from exc
        found = torch.__version__
    needed = minimum_torch(checkout)
    if needed and _version_tuple(found) < _version_tuple(needed):
        raise RuntimeError(f"cudagraph-kit needs PyTorch {needed} or newer; this runtime has {found}. Fix: "
                           f"`pip install --upgrade \"torch>={needed}\"` (in Colab: then Runtime → Restart session) "
                           "and run this cell again.")
    return found


def _installed_from(checkout: Path) -> bool:
    """True if an installed cudagraph-kit is an editable install of ``checkout``.

    Every distribution of that name on ``sys.path`` counts: the checkout itself is on it too, and the
    ``cudagraph_kit.egg-info`` that building the editable install leaves there has no ``direct_url.json``.
    """
    want = Path(checkout).resolve().as_uri()
    for dist in importlib.metadata.distributions():
        if re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "").lower()) != DIST:
            continue
        text = dist.read_text("direct_url.json")
        if text:
            info = json.loads(text)
            if info.get("dir_info", {}).get("editable") and info.get("url") == want:
                return True
    return False


def setup_notebook(checkout, ref: str, in_colab: bool = False) -> None:
    """Check PyTorch; in Colab install ``checkout`` and work in its notebooks/; put it on ``sys.path``."""
    if checkout is None:
        print("No checkout of cudagraph-kit found here or above (and this is not Colab): the notebook uses the "
              "installed kit, if any. Clone the repository and open the notebook from its notebooks/ folder.")
        return
    checkout = Path(checkout).resolve()
    found = check_torch(checkout)
    if in_colab:
        if not _installed_from(checkout):
            run_step(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                     "--editable", str(checkout))
        os.chdir(checkout / "notebooks")  # where the notebooks run; the recorded results are in ../figures
        print(f"cudagraph-kit ({ref}) in {checkout}, installed; working in {Path.cwd()}; PyTorch {found}")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
