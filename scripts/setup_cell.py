# Setup. In a checkout of cudagraph-kit (this folder or one above it has cudagraph_kit/): use its kit. In Colab:
# first make a shallow clone (the kit and its recorded GPU results), install it, and work in its notebooks/.
import importlib.util, os, subprocess, sys
from pathlib import Path

REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")


def setup_run(*command):
    """Run one setup command; if it fails, raise with the command's own error output."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"setup failed (exit {done.returncode}): {' '.join(command)}\n"
                           + (done.stderr or done.stdout).strip())


try:
    import google.colab  # noqa: F401  (importable only in Colab)
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
cwd = Path.cwd().resolve()
checkout = next((p for p in (cwd, *cwd.parents) if (p / "cudagraph_kit" / "__init__.py").is_file()), None)
if checkout is None and IN_COLAB:
    checkout = cwd / "cudagraph-kit"
    if not checkout.is_dir():
        setup_run("git", "clone", "--quiet", "--depth", "1", "--branch", REPO_REF, REPO_URL, str(checkout))
    installed = importlib.util.find_spec("cudagraph_kit")
    if installed is None or checkout not in Path(installed.origin).resolve().parents:
        # --no-deps: Colab's own torch, numpy, pandas and matplotlib stay as they are
        setup_run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                  "--editable", str(checkout))
    os.chdir(checkout / "notebooks")  # where the notebooks run; the recorded results are in ../figures
    print(f"cudagraph-kit ({REPO_REF}) in {checkout}, installed; working in {Path.cwd()}")
if checkout is not None and str(checkout) not in sys.path:
    sys.path.insert(0, str(checkout))
