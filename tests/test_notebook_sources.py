"""The notebooks: sources carry the canonical setup cell and one repository address; each committed .ipynb is
the executed form of its source, from a GPU run, without machine paths; opening and saving them is safe."""
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

from cudagraph_kit.course.running.reproduce import PROJECT_ROOT, lab, lab_copies, notebook_sources
from cudagraph_kit.course.running.reproduce import running_as_root as rep_running_as_root

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import sync_setup_cell  # noqa: E402

SOURCES = notebook_sources()
BADGE = re.compile(r"https://colab\.research\.google\.com/github/([^/\s)]+)/([^/\s)]+)/blob/([^/\s)]+)/"
                   r"notebooks/([0-9]{2}_\w+)\.ipynb")


def _cells(nb, kind):
    return [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            for c in nb["cells"] if c["cell_type"] == kind and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]


def _project():
    """pyproject.toml's [project] table."""
    try:
        import tomllib
    except ImportError:  # Python 3.9/3.10: requirements.txt installs tomli there
        import tomli as tomllib
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]


def _project_urls():
    return _project()["urls"]


def _setup_constant(name):
    return dict(zip(("REPO_URL", "REPO_REF"), sync_setup_cell.repo_url_and_ref()))[name]


def test_there_are_notebooks():
    assert SOURCES, "no notebooks/NN_*.py sources found"


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_source_has_parameters_cell_and_the_canonical_setup_cell(source):
    nb = jupytext.read(source)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters' (papermill)"
    assert re.search(r"(?m)^SMOKE = ", tagged[0].source)
    assert sync_setup_cell.setup_cell_of(source) == sync_setup_cell.canonical(), (
        f"{source.name}'s setup cell differs from scripts/setup_cell.py: run "
        "python scripts/sync_setup_cell.py --write --ipynb")
    setup_at = next(i for i, c in enumerate(nb.cells) if "google.colab" in c.source)
    assert setup_at < nb.cells.index(tagged[0]), "the setup cell comes before the parameters cell"


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_source_is_not_paired_with_its_ipynb(source):
    """A `formats: ipynb,py:percent` pairing makes a save in JupyterLab rewrite the committed .ipynb."""
    assert "formats" not in jupytext.read(source).metadata.get("jupytext", {})


def _project_version():
    return _project()["version"]


def test_repository_address_and_ref_are_the_same_everywhere():
    """One address and one ref: the Colab badges and pyproject's Notebooks URL open the notebooks of the ref the
    setup cell clones (so a notebook and the kit it clones are one version). That the ref exists in this
    repository is checked by tests/test_front_door.py."""
    urls = _project_urls()
    repo, ref = _setup_constant("REPO_URL"), _setup_constant("REPO_REF")
    version = _project_version()
    import cudagraph_kit
    assert cudagraph_kit.__version__ == version, "cudagraph_kit.__version__ and pyproject's version differ"
    assert urls["Repository"] == repo, "pyproject [project.urls] Repository and the setup cell's REPO_URL differ"
    assert urls["Notebooks"] == f"{repo}/tree/{ref}/notebooks", "pyproject's Notebooks URL names another ref"
    owner_name = repo.removeprefix("https://github.com/").split("/")
    stems = {s.stem for s in SOURCES}
    badges = []
    for path in [PROJECT_ROOT / "README.md", *SOURCES]:
        for owner, name, badge_ref, stem in BADGE.findall(path.read_text()):
            badges.append(stem)
            assert [owner, name] == owner_name and badge_ref == ref, f"{path.name}: Colab badge for {stem} points elsewhere"
            assert stem in stems, f"{path.name}: Colab badge for a notebook that does not exist ({stem})"
    for source in SOURCES:
        assert source.stem in badges, f"{source.name} has no Colab badge"
    for path in [PROJECT_ROOT / "README.md", PROJECT_ROOT / "scripts" / "setup_cell.py", *SOURCES]:
        for owner, name in re.findall(r"github\.com/([\w.-]+)/([\w-]+)", path.read_text()):
            assert [owner, name] == owner_name or (owner, name) in PUBLISHED_SOURCES, (
                f"{path.name} names another repository: {owner}/{name}")


# Repositories of the published experiments the notebooks quote, linked from their side-by-side sections: not
# addresses of this kit.
PUBLISHED_SOURCES = {("shu65", "blog-pytorch-notebooks"),  # the 2021 K80 blog's measurement notebook (01-03)
                     ("apache", "mxnet"), ("huggingface", "pytorch-image-models"),  # 04: MXNet PR, timm PR
                     ("pytorch", "benchmark"),                                      # 04: pytorch/benchmark issue
                     ("roboflow", "rf-detr"),      # 05/06: the rf-detr issue whose memory figures they quote
                     ("pytorch", "pytorch")}       # 06: a PyTorch issue it quotes


from awaiting_gpu_run import AWAITING_GPU_RUN  # noqa: E402  (the notebooks whose GPU run is owed)


@pytest.mark.parametrize("source", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=AWAITING_GPU_RUN[s.stem]))
                                    if s.stem in AWAITING_GPU_RUN else s for s in SOURCES],
                         ids=[s.stem for s in SOURCES])
def test_committed_notebook_matches_source_and_was_executed_on_a_gpu(source):
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.fail(f"{ipynb.name} is missing: run `python -m cudagraph_kit reproduce {source.stem[:2]}` on a GPU")
    executed = json.loads(ipynb.read_text())
    source_nb = jupytext.read(source)
    assert _cells(executed, "code") == _cells(source_nb, "code"), (
        f"{ipynb.name} is stale: its code differs from {source.name}; re-run reproduce on a GPU")
    assert _cells(executed, "markdown") == _cells(source_nb, "markdown"), (
        f"{ipynb.name}'s prose differs from {source.name}: run python scripts/sync_markdown.py --write")
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"], f"{ipynb.name} contains an error output"
    # the environment printout (env_table) names the GPU the outputs came from
    printed = "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    gpu = re.search(r"(?m)^gpu\s+(.+)$", printed)
    assert gpu, f"{ipynb.name} has no environment printout (env_table)"
    assert gpu.group(1).strip() not in ("-", "None"), f"{ipynb.name} was not executed on a GPU"
    # no machine paths: papermill's input/output paths are stripped by reproduce
    papermill = executed["metadata"].get("papermill", {})
    assert "input_path" not in papermill and "output_path" not in papermill, (
        f"{ipynb.name} carries papermill's absolute paths; re-run reproduce (it strips them)")


def test_jupyterlab_save_never_rewrites_a_committed_notebook(tmp_path):
    """Open each source and each notebook in JupyterLab's contents manager (with jupytext) and save it."""
    jupytext_cm = pytest.importorskip("jupytext").TextFileContentsManager  # needs jupyter_server (jupyterlab)
    for source in SOURCES:
        shutil.copy(source, tmp_path)
        if source.with_suffix(".ipynb").is_file():
            shutil.copy(source.with_suffix(".ipynb"), tmp_path)
    before = {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in tmp_path.glob("*.ipynb")}
    cm = jupytext_cm(root_dir=str(tmp_path))
    for source in SOURCES:
        cm.save(cm.get(source.name, content=True, type="notebook"), source.name)
    after = {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in tmp_path.glob("*.ipynb")}
    assert after == before, "saving a source in JupyterLab rewrote (or created) a .ipynb"


def test_lab_working_copies_are_outside_notebooks_and_kept(tmp_path):
    dest = lab_copies(tmp_path / "lab")
    copies = sorted(p.name for p in dest.glob("*.ipynb"))
    assert copies == [f"{s.stem}.ipynb" for s in SOURCES]
    for source in SOURCES:
        committed = source.with_suffix(".ipynb")
        if committed.is_file():  # the learner starts from the recorded GPU outputs
            assert (dest / committed.name).read_bytes() == committed.read_bytes()
    edited = dest / copies[0]
    edited.write_bytes(edited.read_bytes() + b"\n")
    mine = edited.read_bytes()
    command = lab(dest, start=False)
    assert edited.read_bytes() == mine, "a second `lab` overwrote the learner's working copy"
    as_root = ["--allow-root"] if rep_running_as_root() else []  # JupyterLab refuses root without it
    assert command == [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={dest}", *as_root]


def test_nbval_options_come_from_conftest_so_strict_and_disabled_modes_work():
    """`-p no:nbval` must run; the default adds --nbval-lax (notebooks collected); --nbval stays strict. The
    options themselves: tests/test_nbval_plugin.py."""
    def collect(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args,
                               "tests/test_results_env.py", "notebooks"],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    default = collect()
    assert default.returncode == 0, default.stdout + default.stderr
    assert "01_gelu.ipynb::Cell 0" in default.stdout
    disabled = collect("-p", "no:nbval")
    assert disabled.returncode == 0, disabled.stdout + disabled.stderr
    assert "01_gelu.ipynb::Cell" not in disabled.stdout and "test_save_load_round_trip" in disabled.stdout


HOW_LONG = re.compile(r"\*\*How long\*\*: (?P<value>[\d.]+) (?P<unit>s|min) on an (?P<gpu>NVIDIA [\w ]+?) "
                      r"\((?:two of them; )?measured by `reproduce`, (?P<date>\d{4}-\d{2}-\d{2})")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_how_long_quotes_a_recorded_reproduce_run(source):
    """A notebook's "How long" time is one that `reproduce` recorded in figures/reproduce_times*.json (same GPU,
    date and notebook, as the facilitator table rounds it), not a number typed from memory."""
    text = " ".join(line.lstrip("# ").strip() for line in source.read_text().splitlines() if line.startswith("#"))
    m = HOW_LONG.search(text)
    assert m, f"{source.name}: no '**How long**: N s|min on an NVIDIA ... (measured by `reproduce`, DATE' line"
    value = float(m["value"]) * (60 if m["unit"] == "min" else 1)
    tolerance = 3.0 if m["unit"] == "min" else 0.5  # "2.9 min" stands for 171-177 s, "77 s" for 76.5-77.5 s
    records = [json.loads(p.read_text()) for p in sorted((PROJECT_ROOT / "figures").glob("reproduce_times*.json"))]
    seconds = [r["notebooks"].get(source.stem) for r in records
               if r.get("gpu") == m["gpu"] and str(r.get("date", ""))[:10] == m["date"] and not r.get("smoke")]
    assert any(s is not None and abs(s - value) <= tolerance for s in seconds), (
        f"{source.name} says {m['value']} {m['unit']} on an {m['gpu']} ({m['date']}), but the recorded runs of that "
        f"GPU and day give {[s for s in seconds if s is not None]} s: quote figures/reproduce_times*.json")
