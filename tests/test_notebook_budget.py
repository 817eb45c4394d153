"""scripts/notebook_budget.py: what it counts, and notebook 01 inside its budget (DESIGN.md: 1,200 prose words and
150 code lines in its core, no code cell over about 40 lines)."""
import sys
import textwrap

import pytest

from cudagraph_kit.course.running.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import notebook_budget  # noqa: E402


def test_it_counts_the_core_going_further_and_exercises_apart(tmp_path):
    source = tmp_path / "99_demo.py"
    source.write_text(textwrap.dedent('''\
        # %% [markdown]
        # # Title with [a link](https://example.com/very/long/address) in it
        # %%
        import setup_stuff
        # %% tags=["parameters"]
        SMOKE = None
        # %% [markdown]
        # ## 1. Core words here
        # %%
        a = 1  # a line
        # a comment is no code line

        b = 2
        # %% [markdown]
        # ## Going further (optional)
        # %%
        c = 3
        # %% [markdown]
        # ## Exercises
        # %%
        d = 4
        e = 5
        '''))
    b = notebook_budget.budget(source)
    assert (b["core_words"], b["core_code"]) == (6 + 4, 2)   # "Title with [a link] in it" + "1. Core words here"
    assert (b["further_words"], b["further_code"]) == (3, 1)
    assert (b["exercise_words"], b["exercise_code"]) == (1, 2)
    assert b["longest_cell"] == 2 and b["longest_starts"] == "a = 1  # a line" and not b["over"]


def test_notebook_01s_core_fits_its_budget():
    b = notebook_budget.budget(PROJECT_ROOT / "notebooks" / "01_gelu.py")
    assert b["core_words"] <= 1200 and b["core_code"] <= 150 and b["longest_cell"] <= 40, b


# the notebooks cut to their budget, all of them (CONTRIBUTING.md, "How a lesson is built")
WITHIN_BUDGET = ["01_gelu", "02_train_step", "03_jit_compile", "04_resnet50", "05_pitfalls", "06_variable_shapes",
                 "07_data_parallel", "08_llm_decode"]


@pytest.mark.parametrize("stem", WITHIN_BUDGET)
def test_a_notebook_cut_to_its_budget_stays_within_it(stem, tmp_path):
    """Prose, code and cells of the source; printed output of the committed GPU run where it ran this source (a
    notebook awaiting its GPU run is counted without printed output: its committed outputs are of older code)."""
    from awaiting_gpu_run import AWAITING_GPU_RUN
    source = PROJECT_ROOT / "notebooks" / f"{stem}.py"
    b = notebook_budget.budget(source, executed=tmp_path if stem in AWAITING_GPU_RUN else None)
    assert not b["over"], b


def test_printed_output_counts_words_and_tables_of_the_core_only(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("setup", outputs=[nbformat.v4.new_output("stream", text="not counted\n")]),
                nbformat.v4.new_code_cell("p", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_markdown_cell("## 1. Core"),
                nbformat.v4.new_code_cell("a", outputs=[
                    nbformat.v4.new_output("stream", text="three words here\n"),
                    nbformat.v4.new_output("display_data", data={"text/html": "<table></table>",
                                                                 "text/plain": "a b"}),
                    nbformat.v4.new_output("display_data", data={"image/png": "", "text/plain": "<Figure>"})]),
                nbformat.v4.new_markdown_cell("## Going further"),
                nbformat.v4.new_code_cell("b", outputs=[nbformat.v4.new_output("stream", text="later words\n")])]
    path = tmp_path / "99_demo.ipynb"
    nbformat.write(nb, path)
    assert notebook_budget.printed(path) == {"words": 3 + 2, "tables": 1}
