"""The package as a new user gets it: a wheel with its LICENSE and the whole course, an sdist without the tests (they
read the notebooks and figures, which stay in the repository), floors that CI really tests."""
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(lines):
    """The requirements in ``lines`` (requirement-file lines or pyproject strings), comments and blanks left out."""
    return [Requirement(text) for text in (line.split("#")[0].strip() for line in lines) if text]


def _floors(lines):
    """{name: version} for each requirement with a ``>=`` floor in ``lines``: "torch>=2.3" -> {"torch": "2.3"}."""
    return {canonicalize_name(r.name): s.version for r in _requirements(lines) for s in r.specifier if s.operator == ">="}


def test_every_claimed_floor_is_pinned_in_the_constraints_ci_tests():
    pins = {canonicalize_name(r.name): s.version
            for r in _requirements((ROOT / "constraints" / "oldest.txt").read_text().splitlines())
            for s in r.specifier if s.operator == "=="}
    project = PYPROJECT["project"]
    claimed = {**_floors((ROOT / "requirements.txt").read_text().splitlines()),
               **_floors(project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                                    for r in extra])}
    assert claimed, "no floors found"
    for name, floor in claimed.items():
        assert name in pins and Version(pins[name]) == Version(floor), (
            f"{name}>={floor} is claimed but constraints/oldest.txt pins {pins.get(name)}")
    python_floor = next(s.version for s in Requirement(f"python{project['requires-python']}").specifier
                        if s.operator == ">=")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "requires-python" in ci and "constraints/oldest.txt" in ci, ".ci/run must test the floors"
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert python_floor in workflow and "bash .ci/run" in workflow


def _declared(requirements) -> dict:
    """{name: "specifier; marker"} of requirements: the same text for the same requirement however it is spelled."""
    return {canonicalize_name(r.name): (str(r.specifier) or "any version") + (f"; {r.marker}" if r.marker else "")
            for r in requirements}


def agreement(requirements_txt: str, project: dict) -> list:
    """What requirements.txt and pyproject's [project] say differently: a requirement of requirements.txt that
    pyproject does not declare, or declares otherwise (specifier, marker); a dependency of the package that
    requirements.txt leaves out; a requirement two extras declare differently."""
    listed = _declared(_requirements(requirements_txt.splitlines()))
    groups = {"dependencies": project["dependencies"], **project.get("optional-dependencies", {})}
    declared, problems = {}, []
    for group, lines in groups.items():
        for name, spec in _declared(_requirements(lines)).items():
            if name in declared and declared[name][1] != spec:
                problems.append(f"{name}: {declared[name][0]} says {declared[name][1]}, {group} says {spec}")
            declared.setdefault(name, (group, spec))
    for name, spec in listed.items():
        if name not in declared:
            problems.append(f"{name}: in requirements.txt, not in pyproject.toml")
        elif declared[name][1] != spec:
            problems.append(f"{name}: requirements.txt says {spec}, pyproject.toml ({declared[name][0]}) says "
                            f"{declared[name][1]}")
    problems += [f"{name}: a dependency of the package, missing from requirements.txt"
                 for name in _declared(_requirements(project["dependencies"])) if name not in listed]
    return problems


def test_requirements_txt_and_pyproject_agree_on_every_shared_requirement():
    problems = agreement((ROOT / "requirements.txt").read_text(), PYPROJECT["project"])
    assert not problems, "requirements.txt and pyproject.toml disagree:\n" + "\n".join(problems)
    listed = _declared(_requirements((ROOT / "requirements.txt").read_text().splitlines()))
    assert (listed["torch"], listed["torchvision"]) == (">=2.3", ">=0.18"), "torch 2.3's pair is torchvision 0.18"


def test_the_agreement_check_names_each_kind_of_difference():
    project = {"dependencies": ["torch>=2.3", "tomli; python_version < '3.11'"],
               "optional-dependencies": {"a": ["torchvision>=0.18"], "b": ["torchvision"]}}
    assert agreement('torch>=2.3\ntomli; python_version<"3.11"  # spelled otherwise\n', project) == [
        "torchvision: a says >=0.18, b says any version"]
    project["optional-dependencies"]["b"] = ["torchvision>=0.18"]
    assert agreement("torch>=2.4\ntomli; python_version < '3.11'\nnumpy\n", project) == [
        "torch: requirements.txt says >=2.4, pyproject.toml (dependencies) says >=2.3",
        "numpy: in requirements.txt, not in pyproject.toml"]
    assert agreement("torch>=2.3\n", project) == ["tomli: a dependency of the package, missing from requirements.txt"]


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
    assert "cudagraph_kit/course/running/reproduce.py" in names and "cudagraph_kit/graphed.py" in names
    # the course ships whole, every folder of it (docs/ARCHITECTURE.md, "The course ships in the wheel")
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cudagraph_kit").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert package <= set(names), sorted(package - set(names))
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()  # SPDX (PEP 639), not a classifier
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_sdist_holds_the_package_and_leaves_the_tests_in_the_repository(tmp_path):
    """The sdist, built as `python -m build --sdist` builds it (pyproject's build backend at its floor, in a build
    environment of its own), holds what builds the wheel: every module of cudagraph_kit/, pyproject.toml, README.md,
    LICENSE. It leaves out the tests, notebooks, figures, docs and scripts (MANIFEST.in): the tests read the
    notebooks and figures, so they run from a clone (CONTRIBUTING.md)."""
    backend = tmp_path / "backend"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(backend),
                          *PYPROJECT["build-system"]["requires"]], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    hook = "import sys, setuptools.build_meta as backend; backend.build_sdist(sys.argv[1])"
    built = subprocess.run([sys.executable, "-c", hook, str(tmp_path / "dist")], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(backend)})
    assert built.returncode == 0, built.stderr[-2000:]
    (sdist,) = (tmp_path / "dist").glob("cudagraph_kit-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    top = {n.split("/")[0] for n in names}
    assert not top & {"tests", "notebooks", "figures", "docs", "scripts"}, sorted(top)
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cudagraph_kit").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert package and package <= names, sorted(package - names)
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= names, sorted(names)
