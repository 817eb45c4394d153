"""docs/CHEATSHEET.md: every ```python block runs. A block whose first line is ``# needs a CUDA GPU`` runs on the
GPU (``-m gpu``), each in a fresh interpreter; on any machine every block must compile and every ``torch.*`` name
it uses must exist in the running PyTorch."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SHEET = ROOT / "docs" / "CHEATSHEET.md"
GPU_MARK = "# needs a CUDA GPU"
BLOCKS = re.findall(r"```python\n(.*?)```", SHEET.read_text(), re.S)
IDS = [f"block{i + 1}" for i in range(len(BLOCKS))]


def test_the_sheet_has_every_recipe_and_links_from_the_readme():
    text = SHEET.read_text()
    for needed in ("torch.cuda.graph(", "side.wait_stream", ".copy_(", "opt.step()", "torch.cuda.make_graphed_callables(",
                   "torch.cuda.graph_pool_handle()", 'mode="reduce-overhead"', "torch.compiler.cudagraph_mark_step_begin()",
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING", "DistributedDataParallel", "range(11)", "StaticCache(",
                   "cache.reset()"):
        assert needed in text, f"the cheat sheet lacks {needed}"
    assert len(BLOCKS) == 7
    assert all(block.startswith((GPU_MARK, "# runs on a CPU")) for block in BLOCKS), "each block says what it needs"
    assert "docs/CHEATSHEET.md" in (ROOT / "README.md").read_text()


def _torch_names(code):
    return sorted(set(re.findall(r"\btorch(?:\.[A-Za-z_]\w*)+", code)))


@pytest.mark.parametrize("code", BLOCKS, ids=IDS)
def test_block_compiles_and_names_only_apis_this_pytorch_has(code):
    compile(code, "<cheatsheet>", "exec")
    for name in _torch_names(code):
        obj = torch
        for part in name.split(".")[1:]:
            if not hasattr(obj, part):
                import importlib
                try:  # a submodule not imported by `import torch`
                    obj = importlib.import_module(f"{obj.__name__}.{part}")
                    continue
                except (ImportError, AttributeError):
                    pytest.fail(f"{name}: this PyTorch ({torch.__version__}) has no {part!r}")
            obj = getattr(obj, part)


def _run(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"the block failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("code", [c for c in BLOCKS if not c.startswith(GPU_MARK)])
def test_cpu_blocks_run(code, tmp_path):
    _run(code, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("code", [c for c in BLOCKS if c.startswith(GPU_MARK)],
                         ids=[i for i, c in zip(IDS, BLOCKS) if c.startswith(GPU_MARK)])
def test_gpu_blocks_run(code, tmp_path):
    _run(code, tmp_path)
