"""The copy rule (docs/ARCHITECTURE.md): each helper of the library works when its file, with the companions it
states, is copied into an empty folder of a project, without the package. Each case runs in a fresh interpreter
(``python -I``): an import, then a small call of the helper's main function (on a CPU: its eager fallback or its
clear no-CUDA error). A helper imports each companion plainly (``from . import graphed`` in a package, ``import
capture`` when copied, after a check that this finds the graphed.py of its own folder): it never runs a module of
the same name found first elsewhere on sys.path, never hides an error raised inside a companion, and shares one
``graphed`` module with every other helper copied there."""
import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cudagraph_kit"

# helper -> the files it needs beside it (what the README and docs/ARCHITECTURE.md tell a user to copy)
COMPANIONS = {
    "graphed": ["guard"],
    "guard": [],
    "env": [],
    "timing": ["graphed"],
    "intervals": [],
    "show": ["graphed"],
    "state_watch": [],
    "check": ["state_watch"],
    "verification": ["state_watch"],
    "advice": ["timing"],
    "train_step": ["graphed"],
    "partial": ["graphed"],
    "bucket_graphs": ["graphed"],
    "bucket_plan": [],
    "memory": [],
    "ddp": ["graphed"],
}
# companions only one function needs, loaded when it runs: helper -> {function: [files]}
OPTIONAL = {"bucket_plan": {"measure_bucket_costs": ["timing"]}, "show": {"timeline": ["timing"]}}
# modules that only re-export the helpers above under their old names, for the package (not for copying): none
PACKAGE_ONLY = set()

# a small call of each helper's main function; `cuda` says whether a GPU is there
CALLS = {
    "graphed": """
        import graphed
        x = torch.randn(4, 3, device=dev)
        g = graphed.capture(torch.relu, x, eager_fallback=True)
        y = torch.randn(4, 3, device=dev)
        torch.testing.assert_close(g(y), torch.relu(y))
        assert g.mode == ("graph" if cuda else "eager")
        if not cuda:
            try:
                graphed.capture(torch.relu, x)
                raise AssertionError("no NoCudaError without CUDA")
            except graphed.NoCudaError as exc:
                assert "NVIDIA GPU" in str(exc) and "Fix:" in str(exc)
    """,
    "guard": """
        import guard
        m = torch.nn.Linear(3, 2).to(dev)
        x = torch.randn(4, 3, device=dev)
        with guard.watch_reads(skip=(x,)) as reads:
            m(x)
        g = guard.Guard(m, reads.tensors)
        assert len(g) == 2 and g.unplaced == []
        g.check()
        m.weight = torch.nn.Parameter(torch.zeros(2, 3, device=dev))
        try:
            g.check()
            raise AssertionError("a replaced weight passed")
        except guard.StaleGraphError as exc:
            assert "Linear.weight was replaced" in str(exc) and "Fix:" in str(exc)
    """,
    "env": """
        import env
        assert env.has_cuda() == cuda and "torch" in env.describe()
    """,
    "timing": """
        import timing
        t = timing.timeit(lambda: torch.ones(8, device=dev).sum(), calls=2, samples=3)
        assert t.median_us > 0
    """,
    "state_watch": """
        import state_watch
        box = {"n": 0}
        def fn(x):
            box["n"] += 1
            return x * box["n"]
        watch = state_watch.watch_for(fn)
        before = watch.snapshot(); fn(torch.ones(2, device=dev)); after = watch.snapshot()
        assert [k for k in after if after[k] != before[k]] == ["box['n']"], (before, after)
    """,
    "check": """
        import check
        report = check.check_capturable(lambda t: t * 2, torch.randn(3, device=dev))
        assert report.ok, report
        bad = check.check_capturable(lambda t: t[t > 0], torch.randn(8, device=dev))
        assert "data-dependent shape" in bad.kinds(), bad
        assert all(f.where.startswith("<string>") for f in bad), bad   # the user's line, not the copied files'
    """,
    "verification": """
        import verification
        x = torch.randn(4, 3, device=dev)
        assert verification.verify(lambda t: t * 2, lambda t: t * 2, x).ok
        report = verification.verify(lambda t: t * 3, lambda t: t * 2, x)
        assert not report.ok and "DIVERGES" in str(report), report
    """,
    "advice": """
        import advice
        a = advice.advise(torch.relu, torch.randn(4, device=dev))
        assert isinstance(a, advice.Advice)
        assert (a.eager_us > 0) if cuda else ("NVIDIA GPU" in str(a)), a
        assert os.path.dirname(advice.timing.__file__) == os.path.dirname(advice.__file__)
    """,
    "bucket_plan": """
        import bucket_plan
        assert bucket_plan.plan_buckets([1, 2, 3], max_graphs=1).sizes == [3]
        assert bucket_plan.evaluate_buckets([3, 5], [4, 8])["padded_rows"] == 4
    """,
    "memory": """
        import memory
        ledger = memory.MemoryLedger()
        with ledger.measure("ones"):
            y = torch.ones(1 << 16, device=dev)
        assert ledger.rows[-1]["label"] == "ones"
        assert (ledger.rows[-1]["allocated_delta"] >= y.nbytes) if cuda else (memory.pool_usage() == {})
    """,
    "train_step": """
        import graphed, train_step
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 8, device=dev), torch.randn(4, 2, device=dev)
        step = train_step.capture_train_step(model, opt, torch.nn.functional.mse_loss, (x, y), warmup=1,
                                             eager_fallback=True)
        assert train_step.NoCudaError is graphed.NoCudaError      # one error type: the companion's
        before = model.weight.detach().clone()
        losses = [step(x, y) for _ in range(3)]
        assert all(torch.isfinite(l).all() for l in losses) and not torch.equal(before, model.weight)
        assert step.mode == ("graph" if cuda else "eager")
    """,
    "partial": """
        import graphed, partial
        lin = torch.nn.Linear(4, 4).to(dev)
        x = torch.randn(2, 4, device=dev)
        if cuda:
            graphed = partial.graph_modules(lin, (x,))
            torch.testing.assert_close(graphed(x), lin(x))
        else:
            try:
                partial.graph_modules(lin, (x,))
                raise AssertionError("no NoCudaError without CUDA")
            except graphed.NoCudaError as exc:
                assert "NVIDIA GPU" in str(exc) and "Fix:" in str(exc)
    """,
    "bucket_graphs": """
        import graphed, bucket_graphs
        serve = bucket_graphs.capture_buckets(torch.relu, torch.randn(8, 3, device=dev), eager_fallback=True)
        x = torch.randn(5, 3, device=dev)
        torch.testing.assert_close(serve(x), torch.relu(x))
        assert serve.stats.padded_rows == 3                        # 5 rows served by the bucket of 8
        assert bucket_graphs.graphed is graphed                  # the user's `import graphed` is the same module
    """,
    "intervals": """
        import intervals
        lo, hi = intervals.prediction_interval([6.1, 6.8, 5.4])
        assert lo < 5.4 and hi > 6.8 and intervals.verdict(lo, hi, above=1.0) == "holds"
    """,
    "show": """
        import show
        nodes, edges = show.parse_dot('digraph g { "a" [label="KERNEL\\nk(float*)"]; b [label="EMPTY"]; "a" -> b; }')
        assert [n["kind"] for n in nodes] == ["kernel", "empty"] and edges == [("a", "b")]
    """,
    "ddp": """
        import ddp
        import torch.distributed as dist
        info = ddp.setup_distributed_for_graphs()
        try:
            model = ddp.ddp_for_graphs(torch.nn.Linear(4, 2).to(info.device),
                                       **({"device_ids": [info.local_rank]} if cuda else {}))
            out = model(torch.randn(3, 4, device=info.device))
            assert out.shape == (3, 2) and (info.rank, info.world_size) == (0, 1)
            if cuda:  # built on the kit's capture stream; torch's own default capture stream left alone
                import graphed
                assert model._cudagraph_kit["stream"] == graphed.capture_stream(info.device)
                assert getattr(torch.cuda.graph, "default_capture_stream", None) is None
        finally:
            dist.destroy_process_group()
    """,
}


def _run(folder: Path, body: str) -> subprocess.CompletedProcess:
    code = (f"import os, sys; sys.path.insert(0, {str(folder)!r})\n"
            "import torch\ncuda = torch.cuda.is_available(); dev = 'cuda' if cuda else 'cpu'\n"
            + textwrap.dedent(body) +
            "\nassert 'cudagraph_kit' not in sys.modules, 'imported the package, not the copies'\nprint('OK')\n")
    env = {k: v for k, v in os.environ.items()  # a fresh process, not a torchrun worker
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=env)


def _with_companions(helper: str) -> list:
    """The helper and every file it needs, its companions' companions too (advice -> timing -> graphed)."""
    todo, seen = [helper], []
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.append(name)
            todo += COMPANIONS.get(name, [])
    return seen


@pytest.mark.parametrize("helper", sorted(COMPANIONS))
def test_helper_works_copied_with_its_companions(tmp_path, helper):
    for name in _with_companions(helper):
        shutil.copy(PACKAGE / f"{name}.py", tmp_path / f"{name}.py")
    done = _run(tmp_path, CALLS[helper])
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]


def test_a_missing_companion_is_a_clear_error(tmp_path):
    """Each helper that needs a companion, copied without it: the import error names the file, its folder and the
    fix."""
    needs = sorted(h for h, c in COMPANIONS.items() if c)
    for helper in needs:  # one folder each, tried in one interpreter (the import fails before anything is cached)
        (tmp_path / helper).mkdir()
        shutil.copy(PACKAGE / f"{helper}.py", tmp_path / helper / f"{helper}.py")
    done = _run(tmp_path, f"""
        import importlib, json
        errors = {{}}
        for helper in {needs!r}:
            sys.path.insert(0, {str(tmp_path)!r} + '/' + helper)
            try:
                importlib.import_module(helper)
                errors[helper] = None
            except ImportError as exc:
                errors[helper] = str(exc)
            sys.path.pop(0)
        print(json.dumps(errors))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-2])
    for helper in needs:
        missing, folder = COMPANIONS[helper][0], os.path.realpath(tmp_path / helper)
        assert errors[helper] == (f"{helper}.py needs the kit's {missing}.py from its own folder {folder}, but "
                                  f"`import {missing}` finds nothing. Fix: copy cudagraph_kit/{missing}.py beside "
                                  "it, that folder first on sys.path."), (helper, errors[helper])


def _copy(folder: Path, *names: str, companions: bool = True) -> Path:
    """Copy the helpers ``names`` into ``folder``, each with the files it needs (COMPANIONS) unless told not to."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in {n: None for name in names for n in (_with_companions(name) if companions else [name])}:
        shutil.copy(PACKAGE / f"{name}.py", folder / f"{name}.py")
    return folder


def test_copied_helpers_share_one_capture_module(tmp_path):
    """Helpers copied into one folder share its graphed.py (one CaptureError class, one capture stream per GPU),
    with the user's own `import graphed` too, whichever is imported first."""
    folder = _copy(tmp_path / "project", "graphed", "guard", "train_step", "partial", "bucket_graphs", "ddp")
    done = _run(folder, """
        import train_step, bucket_graphs
        import graphed
        import partial, ddp
        assert train_step.CaptureError is partial.CaptureError is bucket_graphs.graphed.CaptureError is graphed.CaptureError
        assert train_step.capture_stream is ddp.capture_stream is graphed.capture_stream   # one stream per GPU
        assert sum(getattr(m, "__file__", None) == graphed.__file__ for m in list(sys.modules.values())) == 1
    """)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]


def test_a_capture_module_elsewhere_on_sys_path_is_never_used(tmp_path):
    """A user's own `graphed.py` earlier on sys.path (a decoy that fails if it is ever imported) is never run: the
    copied helper's import stops with an ImportError naming both files and the fix. With the helpers' folder first,
    they load its graphed.py and share it; the decoy later on sys.path is left alone."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "graphed.py").write_text("raise AssertionError('the decoy graphed.py was imported')\n")
    folder = _copy(tmp_path / "project", "graphed", "guard", "train_step", "bucket_graphs")
    found, here = os.path.realpath(decoy / "graphed.py"), os.path.realpath(folder)
    done = _run(folder, f"""
        sys.path.insert(0, {str(decoy)!r})                 # the decoy comes first
        try:
            import train_step
            raise AssertionError("imported with the decoy first on sys.path")
        except ImportError as exc:
            assert str(exc) == ("train_step.py needs the kit's graphed.py from its own folder {here}, but `import "
                                "graphed` finds {found}. Fix: copy cudagraph_kit/graphed.py beside it, that folder "
                                "first on sys.path."), exc
        assert "graphed" not in sys.modules and "train_step" not in sys.modules   # the decoy never ran
        sys.path.remove({str(decoy)!r}); sys.path.append({str(decoy)!r})      # now it comes after the folder
        import train_step, bucket_graphs
        assert train_step.CaptureError is bucket_graphs.graphed.CaptureError
        assert bucket_graphs.graphed.__file__ == os.path.join({str(folder)!r}, "graphed.py")
    """)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.parametrize("defect, raised", [
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('boom inside graphed.py')\n", "RuntimeError: boom inside graphed.py"),
    ("import a_module_that_does_not_exist_4711\n", "ModuleNotFoundError: No module named 'a_module_that_does_not_exist_4711'"),
])
def test_an_error_inside_the_copied_capture_is_raised_not_hidden(tmp_path, defect, raised):
    """A defect inside graphed.py surfaces as itself, in a plain folder and inside a package of the user's; it is
    never turned into "graphed.py is missing" nor replaced by another capture module."""
    plain = _copy(tmp_path / "plain", "graphed", "train_step")
    package = _copy(tmp_path / "mypkg", "graphed", "train_step")
    (package / "__init__.py").write_text("")
    for folder in (plain, package):
        text = (folder / "graphed.py").read_text()
        (folder / "graphed.py").write_text(text + "\n" + defect)
    for module, cwd in (("train_step", plain), ("mypkg.train_step", tmp_path)):
        done = _run(cwd, f"import {module}")
        assert done.returncode != 0 and raised in done.stderr, (module, done.stderr[-3000:])
        assert "needs the kit's" not in done.stderr


def test_inside_a_package_of_the_users(tmp_path):
    """Copied into a package of the user's: the package's graphed.py (a relative import), and without it Python's
    own ImportError naming graphed."""
    with_capture = _copy(tmp_path / "withcap", "graphed", "train_step", "bucket_graphs")
    without = _copy(tmp_path / "nocap", "train_step", companions=False)
    for pkg in (with_capture, without):
        (pkg / "__init__.py").write_text("")
    done = _run(tmp_path, """
        import withcap.graphed, withcap.train_step, withcap.bucket_graphs
        assert withcap.train_step.CaptureError is withcap.graphed.CaptureError is withcap.bucket_graphs.graphed.CaptureError
        try:
            import nocap.train_step
            raise AssertionError("imported without graphed.py")
        except ImportError as exc:
            assert str(exc).startswith("cannot import name 'graphed' from 'nocap'"), exc
    """)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]


def _is_idiom(node) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "__package__"


def _companion_imports(path: Path) -> tuple:
    """How a file imports its companions: (at import, {function: [names]} inside functions, the `if __package__:`
    blocks that import them)."""
    tree = ast.parse(path.read_text())
    at_import, in_functions, blocks = set(), {}, []

    def record(block, where):
        first = block.body[0]
        assert isinstance(first, ast.ImportFrom) and first.level == 1 and not first.module, ast.unparse(block)
        blocks.append(block)
        name = first.names[0].name
        where.append(name) if isinstance(where, list) else where.add(name)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for fn in [n for n in ast.walk(node) if isinstance(n, ast.FunctionDef)]:
                for block in [n for n in ast.walk(fn) if _is_idiom(n)]:
                    record(block, in_functions.setdefault(fn.name, []))
        else:
            for block in [n for n in ast.walk(node) if _is_idiom(n)]:
                record(block, at_import)
    return at_import, in_functions, blocks


@pytest.mark.parametrize("helper", sorted(COMPANIONS))
def test_stated_companions_are_what_the_file_loads(helper):
    """COMPANIONS and OPTIONAL (the copy rule as the docs state it) are exactly what the file imports, and it
    imports a kit module only inside the companion idiom (`if __package__: from . import graphed` / `else:` the
    checked `import graphed`): no bare `import graphed` or `from capture import ...` that any module named capture
    would satisfy."""
    path = PACKAGE / f"{helper}.py"
    at_import, in_functions, _ = _companion_imports(path)
    assert at_import == set(COMPANIONS[helper])
    assert in_functions == OPTIONAL.get(helper, {})
    library = {p.stem for p in PACKAGE.glob("*.py")}
    tree = ast.parse(path.read_text())
    inside = {id(n) for block in ast.walk(tree) if _is_idiom(block) for n in ast.walk(block)}
    bare = [n.lineno for n in ast.walk(tree) if id(n) not in inside and (
            (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").split(".")[0] in library))
            or (isinstance(n, ast.Import) and any(a.name.split(".")[0] in library for a in n.names)))]
    assert not bare, (f"{helper}.py imports a kit module outside the companion idiom at lines {bare}; import it as "
                      "docs/ARCHITECTURE.md shows (`if __package__: from . import name`, else the checked "
                      "`import name`)")


def test_one_companion_idiom_in_every_file():
    """Every companion import is the idiom of docs/ARCHITECTURE.md: `if __package__:` the relative import alone;
    `else:` first `find_spec("name")` (which runs nothing) and an ImportError naming the fix ("copy
    cudagraph_kit/name.py beside it") where that does not find the file beside this one, then `import name` under
    the same alias, last. The tests above check what it does; this one, that every file does it the same way."""
    users = set()
    for path in sorted(PACKAGE.glob("*.py")):
        for block in _companion_imports(path)[2]:
            users.add(path.stem)
            alias = block.body[0].names[0]
            name, where = alias.name, f"{path.name}, line {block.lineno}"
            assert len(block.body) == 1 and len(block.body[0].names) == 1, f"{where}: one relative import alone"
            last = block.orelse[-1] if block.orelse else None
            assert isinstance(last, ast.Import) and [(a.name, a.asname) for a in last.names] == [(name, alias.asname)], (
                f"{where}: the `else:` branch must end with `import {name}` (as {alias.asname})")
            before = ast.Module(body=block.orelse[:-1], type_ignores=[])
            assert any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "find_spec"
                       and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == name
                       for n in ast.walk(before)), f"{where}: no find_spec({name!r}) check before `import {name}`"
            raises = [n for n in ast.walk(before) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
                      and getattr(n.exc.func, "id", "") == "ImportError"]
            assert raises and f"cudagraph_kit/{name}.py beside it" in ast.unparse(raises[0]), (
                f"{where}: the check must raise ImportError naming the fix (copy cudagraph_kit/{name}.py beside it)")
            imports = [n for n in ast.walk(before) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert all(a.name.split(".")[0] != name for n in imports for a in n.names), (
                f"{where}: {name} is imported before the check")
    assert users == {h for h, c in COMPANIONS.items() if c or h in OPTIONAL}


def test_every_library_module_is_covered():
    library = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    assert library == set(COMPANIONS) | PACKAGE_ONLY
