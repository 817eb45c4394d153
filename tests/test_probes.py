"""The one-off probes in scripts/probes/: each is indexed in scripts/probes/README.md, loads from any working folder
with the checkout's kit (the probe puts the checkout on sys.path itself: nothing else has to), and no file outside
the notebooks and the recorded figures still names the old scripts/probe_*.py paths."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "scripts" / "probes"
PLAIN_TORCH = {"probe_floor.py", "probe_queue.py"}     # plain PyTorch: no kit to find
FROM_PYTHONPATH = {"probe_ladder_cost.py"}            # measures whichever kit PYTHONPATH names, on purpose

# Loads each probe as a module (its top level: imports and sys.path set-up, not its main), with the editable
# install's finder removed and the working folder elsewhere, so only the probe's own sys.path handling can find the
# kit; reports, per probe, the checkout folders it put on sys.path and its ROOT.
LOADER = r"""
import json, runpy, sys
from pathlib import Path
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
base = list(sys.path)
out = {}
for path in sys.argv[1:]:
    sys.path[:] = base
    for name in [m for m in sys.modules if m.split(".")[0] in ("cudagraph_kit", "test_buckets")]:
        del sys.modules[name]
    try:
        g = runpy.run_path(path, run_name="probe_check")
        out[Path(path).name] = {"added": [str(Path(p).resolve()) for p in sys.path if p not in base],
                                "root": str(Path(g["ROOT"]).resolve()) if "ROOT" in g else None}
    except Exception as exc:
        out[Path(path).name] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def _load(paths, tmp_path, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", LOADER, *map(str, paths)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_probe_loads_and_finds_the_checkouts_kit_from_any_folder(tmp_path):
    probes = sorted(PROBES.glob("probe_*.py"))
    assert probes, "no probes in scripts/probes/"
    loaded = _load([p for p in probes if p.name not in FROM_PYTHONPATH], tmp_path)
    loaded.update(_load([p for p in probes if p.name in FROM_PYTHONPATH], tmp_path, pythonpath=str(ROOT)))
    for name, got in loaded.items():
        assert "error" not in got, (name, got)
        if name in PLAIN_TORCH or name in FROM_PYTHONPATH:
            continue
        assert str(ROOT) in got["added"] or got["root"] == str(ROOT), (name, got)


def test_every_probe_is_indexed_with_what_it_found():
    index = (PROBES / "README.md").read_text()
    rows = {m[1]: m[0] for m in re.finditer(r"^\| \[`(probe_\w+\.py)`\]\(\1\) \|.*$", index, re.M)}
    on_disk = {p.name for p in PROBES.glob("probe_*.py")}
    assert set(rows) == on_disk, (sorted(on_disk - set(rows)), sorted(set(rows) - on_disk))
    for name, row in rows.items():
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 3 and all(cells), (name, cells)   # probe, what it measured, what it found
    for link in re.findall(r"\]\((\.\./\.\./[^)]+)\)", index):  # every linked record exists
        assert (PROBES / link).resolve().exists(), link


def test_no_file_names_the_old_probe_paths():
    """Notebooks (their prose is edited apart), figures/ (records of past runs) and the CHANGELOG's released
    sections (as they were released, never edited) aside."""
    old = re.compile(r"scripts/probe_\w+\.py")
    stale = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if (not path.is_file() or rel.parts[0] in {".git", "build", "figures", "notebooks", ".baseline", ".whl"}
                or "egg-info" in rel.parts[0] or "__pycache__" in rel.parts or path.suffix in {".png", ".whl"}):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if rel.as_posix() == "CHANGELOG.md":
            text = re.split(r"(?m)^## \S+ \(\d{4}-\d{2}-\d{2}\)$", text)[0]  # up to the newest release
        stale += [f"{rel}: {m}" for m in old.findall(text)]
    assert not stale, stale
