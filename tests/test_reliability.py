"""Reliability fixes that are honest to test without a GPU: grad mode in eager fallback, one device per
capture, bare tensors refused by graph_modules, and every helper file importable on its own."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cudagraph_kit import capture, graph_modules

HAS_CUDA = torch.cuda.is_available()
PACKAGE = Path(__file__).resolve().parent.parent / "cudagraph_kit"


@pytest.mark.skipif(HAS_CUDA, reason="checks the eager fallback used without CUDA")
def test_eager_fallback_keeps_no_grad_on_later_calls():
    lin = torch.nn.Linear(4, 2)
    g = capture(lin, torch.randn(3, 4), eager_fallback=True)          # no_grad=True (the default)
    assert g.mode == "eager"
    assert not g(torch.randn(3, 4)).requires_grad                     # a later call: no autograd history
    assert not g.replay().requires_grad
    g_train = capture(lin, torch.randn(3, 4), eager_fallback=True, no_grad=False)
    assert g_train(torch.randn(3, 4)).requires_grad                   # asked for grad: gets it


def test_samples_on_several_devices_are_refused():
    with pytest.raises(ValueError, match=r"several devices \(cpu, meta\).*same GPU"):
        capture(torch.add, torch.randn(2), torch.empty(2, device="meta"), eager_fallback=True)


@pytest.mark.parametrize("modules, sample_args, match", [
    (torch.nn.Linear(4, 4), torch.randn(2, 4), r"sample_args is a bare tensor of shape \(2, 4\).*sample_args=\(x,\)"),
    ((torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), (torch.randn(2, 4), torch.randn(2, 4)),
     r"sample_args\[0\] is a bare tensor"),
    (torch.nn.Linear(4, 4), 3.0, "must be a tuple of tensors, got float"),
], ids=["one_module", "two_modules", "number"])
def test_graph_modules_refuses_bare_tensors_before_anything_else(modules, sample_args, match):
    with pytest.raises(TypeError, match=match):
        graph_modules(modules, sample_args)


HELPERS = ["capture", "diagnose", "env", "partial", "show", "timing", "train_step"]  # pitfall_scripts is course code now


@pytest.mark.parametrize("name", HELPERS)
def test_helper_file_imports_alone_when_copied(tmp_path, name):
    """The README's promise: copy one file into a project and import it (only torch needed)."""
    shutil.copy(PACKAGE / f"{name}.py", tmp_path / f"{name}.py")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import {name}; "
            "assert 'cudagraph_kit' not in sys.modules, 'imported the package, not the copy'; "
            f"print(sorted(getattr({name}, '__all__', [])))")
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("[")
