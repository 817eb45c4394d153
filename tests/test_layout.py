"""The layout of docs/ARCHITECTURE.md, checked on the source: the library (cudagraph_kit/*.py) never imports the
course (cudagraph_kit/course/), the imports between modules have no cycle, and the architecture's tree names
every module. Imports are read with ``ast`` from every module, those inside functions included."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cudagraph_kit"
COURSE = PACKAGE / "course"


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.glob("*.py")) + sorted(COURSE.glob("*.py"))}
# The library: every top-level module but __main__, the command line (``python -m cudagraph_kit reproduce``),
# which opens the course.
LIBRARY = {m for m, p in MODULES.items() if p.parent == PACKAGE and m != "cudagraph_kit.__main__"}
COURSE_MODULES = {m for m, p in MODULES.items() if p.parent == COURSE}


def _imports(module: str) -> set:
    """The modules of the kit that ``module`` imports (any import statement anywhere in the file)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    siblings = {p.stem for p in path.parent.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cudagraph_kit")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").startswith("cudagraph_kit"):
                source = node.module
            elif node.module in siblings:  # a copied helper's same-folder import: `from capture import ...`
                source = f"{package}.{node.module}"
            else:
                continue
            for alias in node.names:  # `from pkg import mod` imports the submodule; otherwise the module itself
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def test_the_tree_is_what_the_architecture_describes():
    assert "cudagraph_kit.capture" in LIBRARY and "cudagraph_kit.course.exercises" in COURSE_MODULES
    assert GRAPH["cudagraph_kit.buckets"] >= {"cudagraph_kit.capture"}       # the reader sees imports at all
    assert "cudagraph_kit.capture" in GRAPH["cudagraph_kit.course.exercises"]


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


def test_architecture_names_every_module():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"([\w]+\.py)", text))
    missing = sorted(p.name for p in MODULES.values() if p.name not in named)
    assert not missing, f"docs/ARCHITECTURE.md does not name {missing}"
    assert "docs/ARCHITECTURE.md" in (ROOT / "README.md").read_text()
