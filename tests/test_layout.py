"""The layout of docs/ARCHITECTURE.md, checked on the source: the library (cudagraph_kit/*.py) never imports the
course (cudagraph_kit/course/), each of the course's folders imports only the folders before it, no module is left
loose in course/ but its ``__init__.py``, the imports between modules have no cycle, and the page's generated blocks
(``scripts/architecture.py --write``) agree with the code: every module, its arrows, its line count within 5%, and
the copy rule. Imports are read with ``ast`` from every module, those inside functions included, by the same
reader that writes the page."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import architecture  # noqa: E402

MODULES = architecture.modules()
# The library: every top-level module but __main__, the command line (``python -m cudagraph_kit reproduce``),
# which opens the course.
LIBRARY = {m for m, p in MODULES.items() if p.parent == architecture.PACKAGE and m != "cudagraph_kit.__main__"}
COURSE_MODULES = {m for m, p in MODULES.items() if architecture.folder_of(p) is not None}
GRAPH = architecture.import_graph()
PAGE = ROOT / "docs" / "ARCHITECTURE.md"


def test_the_tree_is_what_the_architecture_describes():
    assert "cudagraph_kit.graphed" in LIBRARY and "cudagraph_kit.course.exercises.nb05_pitfalls" in COURSE_MODULES
    assert GRAPH["cudagraph_kit.bucket_graphs"] >= {"cudagraph_kit.graphed"}   # `from . import graphed` is seen
    assert GRAPH["cudagraph_kit.check"] >= {"cudagraph_kit.state_watch"}
    assert "cudagraph_kit.graphed" in GRAPH["cudagraph_kit.course.exercises.nb05_pitfalls"]   # `from ...graphed`
    assert "cudagraph_kit.course.lessons.tiny_llm" in GRAPH["cudagraph_kit.course.exercises.nb08_llm_decode"]  # in a function
    assert "cudagraph_kit.course.running.files" in GRAPH["cudagraph_kit.course.measuring.results"]   # `from ..running`


def test_the_course_is_laid_out_in_its_folders():
    """Every folder of the course is one of COURSE_FOLDERS (a package: its own ``__init__.py``), and course/ itself
    holds nothing but its ``__init__.py``: no module is left loose beside the folders."""
    course = architecture.COURSE
    assert sorted(p.name for p in course.iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(architecture.COURSE_FOLDERS)
    assert all((course / f / "__init__.py").is_file() for f in architecture.COURSE_FOLDERS)
    assert [p.name for p in course.glob("*.py")] == ["__init__.py"]
    assert not list(course.glob("*/*/*.py")), "the course's folders hold modules, not folders"


def test_each_course_folder_imports_only_the_folders_before_it():
    """running/ imports no other folder; measuring/ only running/; lessons/ measuring/ and running/; exercises/ any
    of them (and every folder the library), so a folder can be read with only what stands above it."""
    order = architecture.COURSE_FOLDERS
    offenders = []
    for m in sorted(COURSE_MODULES):
        mine = architecture.folder_of(MODULES[m])
        for target in sorted(GRAPH[m] & COURSE_MODULES):
            theirs = architecture.folder_of(MODULES[target])
            if theirs != mine and (theirs == "" or mine == "" or order.index(theirs) > order.index(mine)):
                offenders.append(f"{m} -> {target}")
    assert not offenders, "a course folder imports one below it: " + "; ".join(offenders)


def test_no_library_module_imports_the_course():
    offenders = {m: sorted(GRAPH[m] & COURSE_MODULES) for m in sorted(LIBRARY) if GRAPH[m] & COURSE_MODULES}
    assert not offenders, f"library modules import the course: {offenders}"


def test_no_import_cycles():
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def disagreements(page: str) -> list:
    """What the page's layout and copy rule say that the code does not (empty when they agree)."""
    shown = architecture.parse_layout(page)
    problems = []
    expected = {architecture.page_name(m, p): m for m, p in MODULES.items()}
    for name in sorted(set(expected) - set(shown)):
        problems.append(f"{name} is missing from the layout")
    for name in sorted(set(shown) - set(expected)):
        problems.append(f"{name} is in the layout but not in the code")
    for name in sorted(set(shown) & set(expected)):
        module = expected[name]
        lines, arrows = shown[name]
        actual = architecture.line_count(MODULES[module])
        if abs(lines - actual) > 0.05 * actual:
            problems.append(f"{name}: {lines} lines on the page, {actual} in the code")
        at_load, in_functions = (set(map(architecture._short, s)) for s in architecture.imports(module, MODULES))
        if architecture.arrows_of(arrows) != (at_load, in_functions):
            problems.append(f"{name}: arrows {arrows!r} on the page; the code imports {sorted(at_load)} when it "
                            f"loads and {sorted(in_functions)} inside functions")
    start, end = architecture.MARKERS["copy"]
    if architecture.render_copy_rule() not in page.split(start, 1)[-1].split(end, 1)[0]:
        problems.append("the copy rule differs from what the helpers load")
    return problems


def test_architecture_page_agrees_with_the_code():
    problems = disagreements(PAGE.read_text())
    assert not problems, ("docs/ARCHITECTURE.md disagrees with the code (run python scripts/architecture.py "
                          "--write):\n" + "\n".join(problems))
    assert "docs/ARCHITECTURE.md" in (ROOT / "README.md").read_text()


def test_the_page_check_sees_drift():
    """Each kind of drift is reported: a line count off by more than 5%, a missing arrow, a missing module."""
    page = PAGE.read_text()
    row = next(line for line in page.splitlines() if line.startswith("├── graphed.py"))
    lines = int(row.split()[2])
    assert not disagreements(page.replace(row, row.replace(f" {lines} ", f" {round(lines * 1.04)} ", 1)))
    assert disagreements(page.replace(row, row.replace(f" {lines} ", f" {round(lines * 1.10)} ", 1)))
    exercises = next(line for line in page.splitlines() if "nb08_llm_decode.py" in line)
    assert ", lessons.tiny_llm" in exercises
    assert disagreements(page.replace(exercises, exercises.replace(", lessons.tiny_llm", "")))
    moved = next(line for line in page.splitlines() if "── reproduce.py" in line)
    assert disagreements(page.replace(moved, "")), "a module missing from its folder is seen"
    assert disagreements(page.replace(row, ""))
    assert disagreements(page.replace("| `check.py` | `state_watch.py` |", "| `check.py` | nothing |"))


def test_the_script_is_deterministic():
    """Two runs with different string hashing (set order) print the same page blocks."""
    import os
    import subprocess
    outputs = {subprocess.run([sys.executable, str(ROOT / "scripts" / "architecture.py")], capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2", "3")}
    assert len(outputs) == 1 and "graphed.py" in outputs.pop()
