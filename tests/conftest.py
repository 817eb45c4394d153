import pytest
import torch

from cudagraph_kit.reproduce import NOTEBOOKS_DIR, execute_notebook

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def run_notebook(tmp_path):
    """Execute ``notebooks/<stem>.py`` with papermill; return the folder its results were saved in.

    Usage: ``results_dir = run_notebook("01_gelu", SMOKE=True)``; the notebook's ``results.save(STEM, ...)``
    lands in ``results_dir`` (= ``tmp/results/<stem>``), and the executed notebook in ``tmp/<stem>.ipynb``.
    """
    def run(stem, **parameters):
        out = execute_notebook(NOTEBOOKS_DIR / f"{stem}.py", tmp_path / f"{stem}.ipynb", parameters,
                               results_dir=tmp_path / "results", timeout_s=900)
        assert out.exists()
        return tmp_path / "results" / stem
    return run
