"""The committed notebooks: each .ipynb is the executed form of its jupytext source, with GPU outputs."""
import json

import jupytext
import pytest

from cudagraph_kit.reproduce import NOTEBOOKS_DIR, notebook_sources

SOURCES = notebook_sources()


def _cells(nb, kind):
    return [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            for c in nb["cells"] if c["cell_type"] == kind and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert SOURCES, "no notebooks/NN_*.py sources found"


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_source_has_parameters_cell_and_colab_setup(source):
    nb = jupytext.read(source)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters' (papermill)"
    assert "SMOKE" in tagged[0].source
    text = source.read_text()
    assert "colab-badge.svg" in text and "google.colab" in text


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_committed_notebook_matches_source_and_was_executed(source):
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.fail(f"{ipynb.name} is missing: run `python -m cudagraph_kit reproduce {source.stem[:2]}` on a GPU")
    executed = json.loads(ipynb.read_text())
    source_nb = jupytext.read(source)
    assert _cells(executed, "code") == _cells(source_nb, "code"), (
        f"{ipynb.name} is stale: its code differs from {source.name}; re-run reproduce on a GPU")
    assert _cells(executed, "markdown") == _cells(source_nb, "markdown"), (
        f"{ipynb.name}'s prose differs from {source.name}: run python scripts/sync_markdown.py")
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outputs, f"{ipynb.name} has no outputs"
    assert not [o for o in outputs if o.get("output_type") == "error"], f"{ipynb.name} contains an error output"
    text = json.dumps(executed)
    assert "NVIDIA" in text, f"{ipynb.name} was not executed on a GPU"
