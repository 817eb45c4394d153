"""The copy rule (docs/ARCHITECTURE.md): each helper of the library works when its file, with the companions it
states, is copied into an empty folder of a project, without the package. Each case runs in a fresh interpreter
(``python -I``): an import, then a small call of the helper's main function (on a CPU: its eager fallback or its
clear no-CUDA error)."""
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
    "capture": [],
    "env": [],
    "timing": ["capture"],
    "diagnose": [],            # capture.py optional (one explanation table), timing.py for advise()
    "train_step": ["capture"],
    "partial": ["capture"],
    "buckets": ["capture"],    # timing.py for measure_bucket_costs()
    "ddp": ["capture"],
    "show": ["capture"],
    "intervals": [],
}

# a small call of each helper's main function; `cuda` says whether a GPU is there
CALLS = {
    "capture": """
        import capture
        x = torch.randn(4, 3, device=dev)
        g = capture.capture(torch.relu, x, eager_fallback=True)
        y = torch.randn(4, 3, device=dev)
        torch.testing.assert_close(g(y), torch.relu(y))
        assert g.mode == ("graph" if cuda else "eager")
        if not cuda:
            try:
                capture.capture(torch.relu, x)
                raise AssertionError("no NoCudaError without CUDA")
            except capture.NoCudaError as exc:
                assert "NVIDIA GPU" in str(exc) and "Fix:" in str(exc)
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
    "diagnose": """
        import diagnose
        report = diagnose.check_capturable(lambda t: t * 2, torch.randn(3, device=dev))
        assert report.ok, report
        assert "original error" in str(diagnose.explain(RuntimeError("operation not permitted when stream is "
                                                                         "capturing")))
    """,
    "train_step": """
        import capture, train_step
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 8, device=dev), torch.randn(4, 2, device=dev)
        step = train_step.capture_train_step(model, opt, torch.nn.functional.mse_loss, (x, y), warmup=1,
                                             eager_fallback=True)
        assert train_step.NoCudaError is capture.NoCudaError      # one error type: the companion's
        before = model.weight.detach().clone()
        losses = [step(x, y) for _ in range(3)]
        assert all(torch.isfinite(l).all() for l in losses) and not torch.equal(before, model.weight)
        assert step.mode == ("graph" if cuda else "eager")
    """,
    "partial": """
        import capture, partial
        lin = torch.nn.Linear(4, 4).to(dev)
        x = torch.randn(2, 4, device=dev)
        if cuda:
            graphed = partial.graph_modules(lin, (x,))
            torch.testing.assert_close(graphed(x), lin(x))
        else:
            try:
                partial.graph_modules(lin, (x,))
                raise AssertionError("no NoCudaError without CUDA")
            except capture.NoCudaError as exc:
                assert "NVIDIA GPU" in str(exc) and "Fix:" in str(exc)
    """,
    "buckets": """
        import capture, buckets
        serve = buckets.capture_buckets(torch.relu, torch.randn(8, 3, device=dev), eager_fallback=True)
        x = torch.randn(5, 3, device=dev)
        torch.testing.assert_close(serve(x), torch.relu(x))
        assert serve.stats.padded_rows == 3                        # 5 rows served by the bucket of 8
        assert buckets.plan_buckets([1, 2, 3], max_graphs=1).sizes == [3]
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
                import capture
                assert model._cudagraph_kit["stream"] == capture.capture_stream(info.device)
                assert getattr(torch.cuda.graph, "default_capture_stream", None) is None
        finally:
            dist.destroy_process_group()
    """,
}


def _run(folder: Path, body: str) -> subprocess.CompletedProcess:
    code = (f"import sys; sys.path.insert(0, {str(folder)!r})\n"
            "import torch\ncuda = torch.cuda.is_available(); dev = 'cuda' if cuda else 'cpu'\n"
            + textwrap.dedent(body) +
            "\nassert 'cudagraph_kit' not in sys.modules, 'imported the package, not the copies'\nprint('OK')\n")
    env = {k: v for k, v in os.environ.items()  # a fresh process, not a torchrun worker
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize("helper", sorted(COMPANIONS))
def test_helper_works_copied_with_its_companions(tmp_path, helper):
    for name in [helper] + COMPANIONS[helper]:
        shutil.copy(PACKAGE / f"{name}.py", tmp_path / f"{name}.py")
    done = _run(tmp_path, CALLS[helper])
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-4000:]


def test_a_missing_companion_is_a_clear_error(tmp_path):
    """Each helper that needs capture.py, copied without it: the import error names the file and the fix."""
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
        assert errors[helper] and errors[helper].startswith(f"{helper}.py needs the kit's capture.py in the same "
                                                            "folder"), (helper, errors[helper])
        assert "Fix: copy cudagraph_kit/capture.py beside it" in errors[helper]


def _kit_imports_at_top_level(path: Path) -> set:
    """Kit modules a file imports when it is loaded (its module body and the try/except blocks in it), by
    name as a copied file would import them (``from capture import ...``)."""
    library = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Try):
            todo += node.body + [n for h in node.handlers for n in h.body] + node.orelse + node.finalbody
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "") in library:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in library}
    return found


@pytest.mark.parametrize("helper", sorted(COMPANIONS))
def test_stated_companions_are_what_the_file_imports(helper):
    """COMPANIONS (the copy rule as the docs state it) lists every kit module the file needs at import time."""
    imported = _kit_imports_at_top_level(PACKAGE / f"{helper}.py")
    optional = {"diagnose": {"capture"}}.get(helper, set())
    assert imported - optional == set(COMPANIONS[helper])


def test_every_library_module_is_covered():
    library = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    assert library == set(COMPANIONS)
