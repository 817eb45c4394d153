"""The package as a new user gets it: a wheel with its LICENSE and the course, floors that CI really tests."""
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _floors(lines):
    """{name: version} for every `name>=version` requirement in ``lines``."""
    out = {}
    for line in lines:
        m = re.match(r"\s*\"?([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", line.split("#")[0])
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_every_claimed_floor_is_pinned_in_the_constraints_ci_tests():
    pins = dict(re.findall(r"(?m)^([A-Za-z0-9_.-]+)==([0-9.]+)", (ROOT / "constraints" / "oldest.txt").read_text()))
    pyproject = (ROOT / "pyproject.toml").read_text()
    claimed = {**_floors((ROOT / "requirements.txt").read_text().splitlines()),
               **_floors(re.findall(r'"([^"]+>=[^"]+)"', pyproject))}
    claimed.pop("setuptools", None)  # the build backend's floor, not the kit's
    assert claimed, "no floors found"
    for name, floor in claimed.items():
        assert name in pins and Version(pins[name]) == Version(floor), (
            f"{name}>={floor} is claimed but constraints/oldest.txt pins {pins.get(name)}")
    python_floor = re.search(r'requires-python\s*=\s*">=\s*([0-9.]+)"', pyproject).group(1)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "requires-python" in ci and "constraints/oldest.txt" in ci, ".ci/run must test the floors"
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert python_floor in workflow and "bash .ci/run" in workflow


def test_wheel_has_license_course_and_metadata(tmp_path):
    """Built as pip builds it for a user (build isolation: a fresh build environment with pyproject's setuptools
    floor), verbosely, so that the build backend's warnings show: none may be a deprecation."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                           str(ROOT), "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    log = done.stdout + done.stderr
    assert "Installing build dependencies" in log, "the wheel was not built with build isolation"
    warnings = [line for line in log.splitlines() if "deprecat" in line.lower()]
    assert not warnings, "the build warns of deprecations:\n" + "\n".join(warnings[:20])
    (wheel,) = tmp_path.glob("cudagraph_kit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names
    assert "cudagraph_kit/course/reproduce.py" in names and "cudagraph_kit/capture.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()  # SPDX (PEP 639), not a classifier
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
