"""cudagraph_kit.course.running.tables: the one Markdown table helper of the rendered pages."""
import pytest

from cudagraph_kit.course.running.tables import markdown_table


def test_a_table_has_its_header_rule_and_rows():
    assert markdown_table(["variant", "time"], [["eager", "70.9 µs"], ("graph", 9.8)]) == [
        "| variant | time |", "|---|---|", "| eager | 70.9 µs |", "| graph | 9.8 |"]
    assert markdown_table(["a"], []) == ["| a |", "|---|"]


def test_a_bar_in_a_cell_cannot_split_it_and_a_short_row_is_refused():
    assert markdown_table(["finding"], [["a | b"]])[2] == "| a \\| b |"
    with pytest.raises(ValueError, match="row 1 has 1 cells, the header 2"):
        markdown_table(["a", "b"], [["1", "2"], ["3"]])
