# Setup: use the kit of this checkout; in Colab first make a shallow clone of the branch REPO_REF (the kit and
# its recorded GPU results). cudagraph_kit.course.setup_notebook then checks PyTorch and, in Colab, installs it.
import os, subprocess, sys
from pathlib import Path

REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")
try:
    import google.colab  # noqa: F401  (importable only in Colab)
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
here = Path.cwd().resolve()
checkout = next((p for p in (here, *here.parents) if (p / "cudagraph_kit").is_dir()), None)
if checkout is None and IN_COLAB:
    checkout = here / "cudagraph-kit"
    if not checkout.is_dir():
        cloned = subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", REPO_REF, REPO_URL,
                                 str(checkout)], capture_output=True, text=True)
        if cloned.returncode != 0:
            err = cloned.stderr.strip()
            why = (f"the repository has no branch or tag {REPO_REF!r}: open the notebook from the README's Colab "
                   'badge (it names a ref the repository holds) or write REPO_REF = "main" in this cell'
                   if "not found" in err else "the runtime could not reach the repository: check that it has "
                   "internet access")
            raise RuntimeError(f"setup failed: git clone --branch {REPO_REF} {REPO_URL}\n{err}\n"
                               f"Why and what to do: {why}; then run this cell again.")
if checkout is not None and str(checkout) not in sys.path:
    sys.path.insert(0, str(checkout))
from cudagraph_kit.course.setup_notebook import setup_notebook  # noqa: E402
setup_notebook(checkout, REPO_REF, in_colab=IN_COLAB)
