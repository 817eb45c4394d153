"""cudagraph_kit.course.running.paths: the course's one way to ask git, and pyproject.toml read with tomllib."""
import pytest

from cudagraph_kit.course.running.paths import PROJECT_ROOT, git, pyproject


def test_git_answers_or_says_none_or_raises_with_gits_words(tmp_path):
    if git(PROJECT_ROOT, "rev-parse", "--git-dir") is None:
        pytest.skip("not a git checkout")
    head = git(PROJECT_ROOT, "rev-parse", "HEAD")
    assert head is not None and len(head) == 40 and head == head.strip()
    assert git(tmp_path, "rev-parse", "HEAD") is None  # not a repository
    with pytest.raises(RuntimeError, match=r"git rev-parse HEAD in .* failed \(exit \d+\): .*not a git repository"):
        git(tmp_path, "rev-parse", "HEAD", check=True)


def test_pyproject_is_read_whole_and_a_folder_without_one_gives_nothing(tmp_path):
    project = pyproject()["project"]
    assert project["name"] == "cudagraph-kit" and project["urls"]["Repository"].startswith("https://")
    assert any(d.startswith("torch>=") for d in project["dependencies"])
    assert pyproject(tmp_path) == {}
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.0"\ndependencies = ["torch>=9.1"]\n')
    assert pyproject(tmp_path)["project"]["version"] == "1.0"
