# Setup. In a fresh Colab runtime: clone the kit at REPO_REF once (with its recorded GPU results) and install that
# clone; `setup` then checks it (elsewhere it uses this checkout, silently) and says what to do if something is off.
import importlib.util, os, subprocess, sys
from pathlib import Path
REPO_URL, REPO_REF = "https://github.com/cudagraph-kit/cudagraph-kit", "main"
if "google.colab" in sys.modules and importlib.util.find_spec("cudagraph_kit") is None:
    # If this fails: REPO_REF must name a branch or tag of REPO_URL, and the runtime needs internet access.
    subprocess.run(f"git clone -q --depth 1 -b {REPO_REF} {REPO_URL} cudagraph-kit && {sys.executable} -m pip install -q --no-deps ./cudagraph-kit", shell=True, check=True)
checkout = importlib.import_module("cudagraph_kit.course.running.setup_notebook").setup(REPO_URL, REPO_REF)
