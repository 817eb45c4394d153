"""The notebooks' setup step (cudagraph_kit.course.setup_notebook): the PyTorch check and what it does in a
checkout. The Colab path (clone, install, working folder) is exercised end to end by tests/test_colab_setup.py."""
import os
import sys
from pathlib import Path

import pytest
import torch

from cudagraph_kit.course import setup_notebook as sn
from cudagraph_kit.course.paths import PROJECT_ROOT


def test_minimum_torch_is_pyprojects_requirement():
    assert sn.minimum_torch(PROJECT_ROOT) == "2.3"
    assert '"torch>=2.3"' in (PROJECT_ROOT / "pyproject.toml").read_text()


def test_an_older_torch_is_refused_with_the_version_needed_and_the_fix():
    with pytest.raises(RuntimeError) as exc:
        sn.check_torch(PROJECT_ROOT, found="2.1.2+cu121")
    message = str(exc.value)
    assert "needs PyTorch 2.3 or newer" in message and "2.1.2+cu121" in message and 'pip install --upgrade "torch>=2.3"' in message
    assert sn.check_torch(PROJECT_ROOT, found="2.3.0") == "2.3.0"
    assert sn.check_torch(PROJECT_ROOT, found="2.11.0+cu130") == "2.11.0+cu130"  # 11 > 3, not "11" < "3"
    assert sn.check_torch(PROJECT_ROOT) == torch.__version__  # the running one passes


def test_in_a_checkout_it_prints_nothing_stays_put_and_puts_the_checkout_on_the_path(capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(PROJECT_ROOT)])
    before = os.getcwd()
    sn.setup_notebook(PROJECT_ROOT, "v0.2.0", in_colab=False)
    assert capsys.readouterr().out == ""
    assert os.getcwd() == before and sys.path[0] == str(PROJECT_ROOT)
    sn.setup_notebook(PROJECT_ROOT, "v0.2.0", in_colab=False)  # run twice: nothing more
    assert sys.path.count(str(PROJECT_ROOT)) == 1


def test_a_failed_step_shows_the_commands_own_error():
    with pytest.raises(RuntimeError, match=r"setup failed \(exit 2\).*no-such-file"):
        sn.run_step(sys.executable, str(Path("no-such-file.py")))
