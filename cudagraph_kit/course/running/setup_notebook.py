"""What every notebook's first cell calls: ``setup(REPO_URL, REPO_REF)`` finds or fetches the kit and its recorded
results, checks them, and says plainly what to do when something is missing.

The cell itself (``scripts/setup_cell.py``, copied into every notebook by ``scripts/sync_setup_cell.py``) is six
lines of code: in a fresh Colab runtime it gets the kit once, a shallow clone of ``REPO_REF`` into
``./cudagraph-kit`` (the notebooks need the checkout's ``figures/``, the recorded GPU results, not only the
package) installed from that clone (``--no-deps`` so Colab's own torch, numpy, pandas and matplotlib stay as they
are; with pip's build isolation, so the build uses the setuptools floor of ``pyproject.toml``), so that this module
can be imported; then it calls :func:`setup`, which does the rest.

In Colab (``google.colab`` loaded), :func:`setup`

- finds the clone, or makes it where the kit was installed from elsewhere; if ``git clone`` fails it says why (no
  such branch or tag, no such repository, no network) and what to do;
- checks that the clone holds ``ref`` (a re-run after ``REPO_REF`` was changed stops and says so);
- checks that the PyTorch it finds is one the kit supports (``torch>=`` in the checkout's ``pyproject.toml``);
- installs the clone the same way unless it is already the installed kit, and makes the rest of the notebook
  import the kit from the clone;
- moves into the clone's ``notebooks/`` folder and prints one line saying what it did.

In a Jupyter kernel it also draws figures inline where ``MPLBACKEND`` names another backend
(:func:`show_figures_inline`). Anywhere else (a checkout, CI, papermill, nbval) it finds the checkout the working folder is in, checks PyTorch,
makes the notebook import that checkout's kit, and prints nothing; it runs no git, no pip, no network. Run twice
(a re-run cell, a restarted kernel) it reuses the clone and the install. Example (the notebooks' setup cell)::

    REPO_URL, REPO_REF = "https://github.com/cudagraph-kit/cudagraph-kit", "main"
    checkout = importlib.import_module("cudagraph_kit.course.running.setup_notebook").setup(REPO_URL, REPO_REF)
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

DIST = "cudagraph-kit"
PACKAGE = "cudagraph_kit"
CLONE_NAME = "cudagraph-kit"  # the clone's folder, beside the notebook Colab opened (/content)


def in_colab() -> bool:
    """True in a Colab runtime, which loads ``google.colab`` before the first cell runs."""
    return "google.colab" in sys.modules


def run_step(*command) -> None:
    """Run one setup command; if it fails, raise with the command's own error output."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"setup failed (exit {done.returncode}): {' '.join(map(str, command))}\n"
                           + (done.stderr or done.stdout).strip())


def minimum_torch(checkout: Path) -> str | None:
    """The oldest PyTorch the kit supports: the ``torch>=`` floor among the dependencies of
    ``<checkout>/pyproject.toml`` (read with tomllib, the requirement with ``packaging``); None without one."""
    from packaging.requirements import Requirement

    from .paths import pyproject

    for line in pyproject(checkout).get("project", {}).get("dependencies", []):
        requirement = Requirement(line)
        if requirement.name == "torch":
            return next((s.version for s in requirement.specifier if s.operator == ">="), None)
    return None


def check_torch(checkout: Path, found: str | None = None) -> str:
    """Raise a clear error if the PyTorch found is older than the kit supports; return the version found."""
    if found is None:
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError("PyTorch is not installed here. Fix: `pip install torch` (see pytorch.org for "
                               "the build that matches your CUDA), then run this cell again.") from exc
        found = torch.__version__
    from packaging.version import Version

    needed = minimum_torch(checkout)
    if needed and Version(found).release < Version(needed).release:  # 2.11.0+cu130, 2.6.0a0+git...: the release
        raise RuntimeError(f"cudagraph-kit needs PyTorch {needed} or newer; this runtime has {found}. Fix: "
                           f"`pip install --upgrade \"torch>={needed}\"` (in Colab: then Runtime → Restart session) "
                           "and run this cell again.")
    return found


def find_checkout(start: Path | None = None) -> Path | None:
    """The checkout of cudagraph-kit that ``start`` (the working folder) is in, or None."""
    here = Path(start or Path.cwd()).resolve()
    return next((p for p in (here, *here.parents) if (p / PACKAGE).is_dir()), None)


def _why_clone_failed(err: str, repo_url: str, ref: str) -> str:
    """Git's error output in words: the cause and the fix."""
    if re.search(r"Remote branch .* not found", err):
        return (f"the repository has no branch or tag {ref!r}: open the notebook from the README's Colab badge (it "
                f'names a ref the repository holds) or set REPO_REF = "main" in this cell')
    if re.search(r"[Rr]epository .*not found|does not appear to be a git repository|could not read Username", err):
        return (f"there is no public repository at {repo_url}: check REPO_URL in this cell (the README's Colab "
                "badges name the project's address)")
    return (f"the runtime could not reach {repo_url}: check that it has internet access (in Colab: Runtime → "
            "Disconnect and delete runtime, then open the notebook again)")


def clone(repo_url: str, ref: str, dest: Path) -> Path:
    """Make a shallow clone of branch or tag ``ref`` of ``repo_url`` at ``dest``; on failure, say why and what to do."""
    command = ["git", "clone", "--quiet", "--depth", "1", "--branch", ref, repo_url, str(dest)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except FileNotFoundError:
        raise RuntimeError("setup failed: git is not installed in this runtime, so the kit cannot be cloned. Fix: "
                           "install git (`apt-get install -y git`), then run this cell again.") from None
    if done.returncode != 0:
        err = done.stderr.strip()
        raise RuntimeError(f"setup failed: git clone --branch {ref} {repo_url}\n{err}\n"
                           f"Why and what to do: {_why_clone_failed(err, repo_url, ref)}; then run this cell again.")
    return Path(dest)


def check_ref(checkout: Path, ref: str) -> None:
    """Raise a clear error if the git checkout ``checkout`` does not hold ``ref`` (its HEAD is not that branch or
    tag), or is a clone that never finished. A folder without ``.git`` is not checked."""
    from .paths import git

    if not (Path(checkout) / ".git").exists():
        return
    head = git(checkout, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head is None:
        raise RuntimeError(f"setup failed: {checkout} is an unfinished clone (it has no commit). Fix: delete it "
                           f"(`!rm -rf {checkout}`) and run this cell again; it clones {ref!r} afresh.")
    if git(checkout, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") == head:
        return
    held = git(checkout, "symbolic-ref", "--quiet", "--short", "HEAD") or git(
        checkout, "describe", "--tags", "--exact-match", "HEAD") or head[:12]
    raise RuntimeError(f"setup failed: {checkout} holds {held!r}, but this notebook asks for {ref!r} (REPO_REF). "
                       f"Fix: delete it (`!rm -rf {checkout}`), restart the session (Colab: Runtime → Restart "
                       f"session) and run this cell again, which clones {ref!r}; or set REPO_REF = \"{held}\" in "
                       "this cell to keep it.")


def _installed_from(checkout: Path) -> bool:
    """True if an installed cudagraph-kit was installed from ``checkout`` (the setup cell's install; an editable
    install of it counts too).

    Every distribution of that name on ``sys.path`` counts: the checkout itself is on it too, and the
    ``cudagraph_kit.egg-info`` that building an install leaves there has no ``direct_url.json``.
    """
    from packaging.utils import canonicalize_name

    want = Path(checkout).resolve().as_uri()
    for dist in importlib.metadata.distributions():
        if canonicalize_name(dist.metadata["Name"] or "") != DIST:
            continue
        text = dist.read_text("direct_url.json")
        if text and json.loads(text).get("url") == want:
            return True
    return False


def stale_kit_modules(checkout: Path, modules=None) -> list:
    """The names of the kit's loaded modules (``modules``: ``sys.modules``) if the kit was imported from
    somewhere other than ``checkout`` (the copy pip installed to start the setup, another checkout), else []."""
    modules = sys.modules if modules is None else modules
    kit = modules.get(PACKAGE)
    if kit is None:
        return []
    where = getattr(kit, "__file__", None)
    if where is not None and Path(where).resolve().parent.parent == Path(checkout).resolve():
        return []
    return [name for name in modules if name == PACKAGE or name.startswith(PACKAGE + ".")]


def use_kit_from(checkout: Path) -> None:
    """Make every later ``import cudagraph_kit`` of this process load the kit of ``checkout``: put the checkout
    first on ``sys.path`` and forget a kit loaded from elsewhere."""
    path = str(Path(checkout).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    stale = stale_kit_modules(checkout)
    if stale:
        sys.path.remove(path)
        sys.path.insert(0, path)  # ahead of the folder the stale copy came from
        for name in stale:
            del sys.modules[name]
        importlib.invalidate_caches()


def show_figures_inline() -> bool:
    """In a Jupyter kernel, draw matplotlib figures into the notebook (as ``%matplotlib inline`` does) where the
    environment's ``MPLBACKEND`` names another backend: CI often sets ``Agg``, under which a notebook shows no
    figure and nbval finds none to compare. Elsewhere, or with ``MPLBACKEND`` unset or inline, it does nothing.
    Returns whether it switched. Example: ``show_figures_inline()`` in a notebook's first cell."""
    backend = os.environ.get("MPLBACKEND", "")
    if not backend or "inline" in backend.lower():
        return False
    ipython = sys.modules.get("IPython")  # a kernel has it loaded already; a plain script has not
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    shell.run_line_magic("matplotlib", "inline")
    return True


def setup(repo_url: str, ref: str, *, colab: bool | None = None, cwd: Path | None = None) -> Path | None:
    """Get the notebook ready: in Colab clone ``ref`` of ``repo_url`` and install it; elsewhere use the checkout the
    working folder is in, silently. Returns the checkout (None outside one, outside Colab). ``colab`` (default: is
    ``google.colab`` loaded?) and ``cwd`` (default: the working folder) are there for tests."""
    colab = in_colab() if colab is None else colab
    show_figures_inline()
    try:
        here = Path(cwd or Path.cwd()).resolve()
    except FileNotFoundError:  # the folder the notebook worked in was deleted (an old clone, removed)
        raise RuntimeError("setup failed: this notebook's working folder no longer exists (was the clone deleted?). "
                           "Fix: restart the session (Colab: Runtime → Restart session) and run this cell again."
                           ) from None
    checkout = find_checkout(here)
    if checkout is None and not colab:
        print("No checkout of cudagraph-kit found here or above (and this is not Colab): the notebook uses the "
              "installed kit, if any. Clone the repository and open the notebook from its notebooks/ folder.")
        return None
    if checkout is None:
        checkout = here / CLONE_NAME
        if not checkout.exists():
            clone(repo_url, ref, checkout)
    if colab:
        check_ref(checkout, ref)
    found = check_torch(checkout)
    if colab and not _installed_from(checkout):
        run_step(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", str(checkout))
    use_kit_from(checkout)
    if colab:
        os.chdir(checkout / "notebooks")  # where the notebooks run; the recorded results are in ../figures
        print(f"cudagraph-kit ({ref}) in {checkout}, installed; working in {Path.cwd()}; PyTorch {found}")
    return checkout
