"""A version people can pin: pyproject.toml's version against the CHANGELOG, and released sections left as they
were on their release (CONTRIBUTING.md, "Releases")."""
import re
from pathlib import Path

import pytest
from packaging.version import Version

from cudagraph_kit.course.running.paths import git

try:
    import tomllib
except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DATED = re.compile(r"(?m)^## (\S+) \((\d{4}-\d{2}-\d{2})\)$")


def sections(text: str) -> dict:
    """``{heading: the section's text up to the next "## " heading}`` of a changelog."""
    parts = re.split(r"(?m)^(?=## )", text)
    return {part.splitlines()[0][3:]: part for part in parts if part.startswith("## ")}


def changelog_state(version: str, text: str) -> str:
    """What is wrong with ``text`` (a CHANGELOG) for a package at ``version``, or "" when nothing is.

    A release (``X.Y.Z``) is the newest dated heading; a development version (``X.Y.Z.devN``) comes after the
    newest dated heading, and its changes sit under "Unreleased", the first heading."""
    headings = list(sections(text))
    releases = [(Version(m[1]), m[0][3:]) for m in map(DATED.match, (f"## {h}" for h in headings)) if m]
    if not releases:
        return "the CHANGELOG has no dated release heading (## X.Y.Z (YYYY-MM-DD))"
    newest, heading = releases[0]
    if headings[0] != "Unreleased":
        return f"the CHANGELOG's first heading is {headings[0]!r}, not 'Unreleased'"
    if headings[1] != heading:
        return f"the newest release, {heading!r}, does not follow 'Unreleased'"
    if Version(version).is_devrelease or Version(version).is_prerelease:
        if Version(version) <= newest:
            return f"pyproject.toml's {version} is not after the newest release {newest}"
        return ""
    if Version(version) != newest:
        return (f"pyproject.toml says {version}, the CHANGELOG's newest release is {heading!r}: release the Unreleased "
                "section as that version, or give main a development version (CONTRIBUTING.md, Releases)")
    return ""


def test_the_version_and_the_changelog_agree():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    text = (ROOT / "CHANGELOG.md").read_text()
    assert changelog_state(version, text) == ""
    unreleased = sections(text)["Unreleased"].splitlines()[1:]
    if any(line.startswith("- ") for line in unreleased):  # changes after the newest release: not that release
        assert Version(version).is_devrelease, (
            f"pyproject.toml says {version}, but the CHANGELOG lists unreleased changes: a checkout of main is not "
            f"{version}; give it a development version (e.g. {Version(version).major}."
            f"{Version(version).minor + 1}.0.dev0)")


def test_the_check_tells_a_release_from_a_development_version():
    log = "# Changelog\n\n## Unreleased\n\n- a change\n\n## 0.3.0 (2026-11-27)\n\n- released\n\n## 0.2.0\n"
    assert changelog_state("0.4.0.dev0", log) == ""
    assert changelog_state("0.3.0", log) == ""
    assert "not after the newest release" in changelog_state("0.3.0.dev0", log)
    assert "release the Unreleased section" in changelog_state("0.4.0", log)
    assert "first heading" in changelog_state("0.4.0.dev0", log.replace("## Unreleased\n\n- a change\n\n", ""))


def test_a_released_section_is_never_edited_after_its_release():
    """Each dated section reads as it did in the commit that first carried its heading (the release commit)."""
    if git(ROOT, "rev-parse", "--is-shallow-repository") != "false":
        pytest.skip("needs the repository's whole history (a clone without --depth)")
    current = sections((ROOT / "CHANGELOG.md").read_text())
    dated = [h for h in current if DATED.match(f"## {h}")]
    assert dated
    for heading in dated:
        first = git(ROOT, "log", "--reverse", "--format=%H", "-S", f"## {heading}", "--", "CHANGELOG.md").split()
        if not first:  # released in this very working tree, not committed yet
            continue
        released = sections(git(ROOT, "show", f"{first[0]}:CHANGELOG.md", check=True))[heading]
        assert current[heading].rstrip() == released.rstrip(), (
            f"CHANGELOG.md's section {heading!r} was edited after its release (commit {first[0][:12]}): restore it "
            "as released and put the change under 'Unreleased'")
