# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results.
import importlib.util, os, subprocess, sys
from pathlib import Path
REPO_URL = os.environ.get("CGK_REPO_URL", "https://github.com/cudagraph-kit/cudagraph-kit")
REPO_REF = os.environ.get("CGK_REPO_REF", "main")
if "google.colab" in sys.modules and importlib.util.find_spec("cudagraph_kit") is None:  # a fresh Colab runtime
    # If this install fails: REPO_REF must name a branch or tag of REPO_URL, and the runtime needs internet access.
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"git+{REPO_URL}@{REPO_REF}"])
from cudagraph_kit.course.running.setup_notebook import setup
checkout = setup(REPO_URL, REPO_REF)  # elsewhere: this checkout's kit, silently; a failure says why and what to do
