"""Every exercise: its solution passes its check, and its check rejects wrong answers with a helpful message.

Solutions (notebooks/solutions/nbNN_*.py) run here with small sizes. On a machine without CUDA the ``cpu`` variant
of each solution test runs (the check must say "CPU part correct": all a CPU can check is right); on the GPU the
``gpu`` variant (``pytest -m gpu``) must say "correct". Wrong answers and placeholders are checked on the CPU;
those that only a GPU can expose (a baked-in learning rate, an overwritten reduce-overhead output, a blocking copy
in a capture) are marked gpu.
"""
import copy
import importlib.util
import math
import re
import types

import pandas as pd
import pytest
import torch

from cudagraph_kit import capture_buckets, capture_train_step, compare
from cudagraph_kit.course.exercises import checking as _machinery
from cudagraph_kit.graphed import capture, fresh_cublas_workspace
from cudagraph_kit.verification import verify
from cudagraph_kit.course.exercises.checking import CORRECT, CPU_PART_CORRECT, EXERCISES, NOT_DONE, NOT_RIGHT, load_all
from cudagraph_kit.course.running.reproduce import NOTEBOOKS_DIR

# every notebook's checks (nb01_gelu ... nb08_llm_decode) and the shared helpers, under one name
exercises = types.SimpleNamespace(**{k: getattr(m, k) for m in (_machinery, *load_all()) for k in dir(m)
                                     if not k.startswith("__")})

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SAMPLES, CALLS = 3, (None if CUDA else 10)


def solutions(stem):
    path = NOTEBOOKS_DIR / "solutions" / f"nb{stem}.py"
    spec = importlib.util.spec_from_file_location(f"solutions_nb{stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


# --- what each notebook has defined by its Exercises section, small -------------------------------------------

@pytest.fixture(scope="module")
def nb01():
    shape = (1, 3, 224, 224) if CUDA else (1, 3, 32, 32)
    x = torch.randn(shape, device=DEVICE)
    g = capture(gelu, x, eager_fallback=True)
    main_table = compare({"eager": lambda: gelu(x), "graph replay": g.replay}, case="small", samples=SAMPLES,
                         calls=CALLS)
    exps = (12, 23) if CUDA else (12, 14)
    frames = []
    for e in range(exps[0], exps[1] + 1):
        xs = torch.randn(2 ** e, device=DEVICE)
        gs = capture(gelu, xs, eager_fallback=True)
        df = compare({"eager": lambda xs=xs: gelu(xs), "graph replay": gs.replay}, case=f"sweep 2^{e}",
                     samples=SAMPLES, calls=CALLS)
        df["numel"] = 2 ** e
        frames.append(df)
    sweep = pd.concat(frames, ignore_index=True)
    return types.SimpleNamespace(inputs={"small": x}, graphs={"small": g}, main_table=main_table, sweep=sweep,
                                 crossover=exercises.crossover_of(sweep), exps=exps, sol=solutions("01_gelu"))


# notebook 02's workload, as the notebook imports it
from cudagraph_kit.course.lessons.models import eager_amp_step, make_model, make_opt  # noqa: E402


@pytest.fixture(scope="module")
def nb02():
    dims = (32, 128, 256, 16)
    n, d_in, h, d_out = dims
    torch.manual_seed(1)
    batches = []
    while len(batches) < 33:  # epochs of 10 full batches and a short one, as notebook 02
        rows = n if (len(batches) + 1) % 11 else 8
        batches.append((torch.randn(rows, d_in, device=DEVICE), torch.randn(rows, d_out, device=DEVICE)))
    loss_fn = torch.nn.MSELoss()
    x, y = torch.randn(n, d_in, device=DEVICE), torch.randn(n, d_out, device=DEVICE)
    base = make_model(d_in, h, d_out)
    m1, m2 = copy.deepcopy(base), copy.deepcopy(base)
    o1 = make_opt("SGD", m1.parameters())

    def eager(x, y):
        o1.zero_grad(set_to_none=True)
        loss_fn(m1(x), y).backward()
        o1.step()

    graphed = capture_train_step(m2, make_opt("SGD", m2.parameters()), loss_fn, (x, y), eager_fallback=True)
    timing = compare({"eager": eager, "whole-step graph": graphed}, x, y, case="MLP 32x128x256x16, SGD",
                     samples=SAMPLES, calls=CALLS)
    return types.SimpleNamespace(dims=dims, batches=batches, loss_fn=loss_fn, timing=timing,
                                 sol=solutions("02_train_step"))


def fresh(fn):
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


from cudagraph_kit.course.lessons.compilers import with_mark_step  # noqa: E402  (notebook 03's)


@pytest.fixture(scope="module")
def nb03():
    x = torch.randn((1, 3, 224, 224) if CUDA else (1, 3, 32, 32), device=DEVICE)
    compiled = torch.compile(fresh(gelu), dynamic=False)
    compiled(x)
    ro = None
    if CUDA:
        ro = torch.compile(fresh(gelu), mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            ro(x)
    return types.SimpleNamespace(x=x, compiled=compiled, ro=ro, sol=solutions("03_jit_compile"))


@pytest.fixture(scope="module")
def nb04():
    """Section 1's sweep at two batch sizes (ResNet-18, small images on a CPU) and section 4's digits loop."""
    import torchvision
    from sklearn.datasets import load_digits

    arch, image, dtype, dname = ("resnet18", 224, torch.float16, "fp16") if CUDA else \
        ("resnet18", 32, torch.float32, "fp32 (CPU)")

    def build_model(dtype):
        torch.manual_seed(0)
        model = getattr(torchvision.models, arch)(weights=None)
        return model.to(DEVICE, dtype=dtype, memory_format=torch.channels_last).eval()

    def image_batch(n, dtype, seed=1):
        x = torch.randn(n, 3, image, image, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype=dtype)
        return x.contiguous(memory_format=torch.channels_last)

    batches = [1, 4]
    model = build_model(dtype)

    def infer(x):
        with torch.no_grad():
            return model(x)

    frames = []
    for bs in batches:
        x = image_batch(bs, dtype)
        g = capture(infer, x, eager_fallback=True)
        df = compare({"eager": infer, "cuda graph (with input copy)": g}, x, case=f"inference {dname} bs{bs}",
                     samples=SAMPLES, calls=CALLS)
        df["batch"] = bs
        frames.append(df)
    inference = pd.concat(frames, ignore_index=True)
    e = inference[inference.variant == "eager"].set_index("batch")
    gr = inference[inference.variant != "eager"].set_index("batch")
    curve = {dname: {"eager": e, "graph": gr, "launch_us": e.median_us[1] / e.kernels_per_call[1] if CUDA
                     else float("nan")}}

    digits = load_digits()
    X = torch.tensor(digits.images[:320], dtype=torch.float32).unsqueeze(1)
    X, Y = (X - X.mean()) / X.std(), torch.tensor(digits.target[:320])

    def small_cnn():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(DEVICE)

    def warmup_cosine(opt, total, warmup):
        s = torch.optim.lr_scheduler
        return s.SequentialLR(opt, [s.LinearLR(opt, start_factor=0.1, total_iters=warmup),
                                    s.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])

    def digits_loader(seed):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32, shuffle=True,
                                           generator=torch.Generator().manual_seed(seed), drop_last=False)

    return types.SimpleNamespace(curve=curve, infer_dtypes={dname: dtype}, batches=batches, build_model=build_model,
                                 image_batch=image_batch, small_cnn=small_cnn, warmup_cosine=warmup_cosine,
                                 digits_loader=digits_loader, steps=len(digits_loader(1)), dname=dname,
                                 sol=solutions("04_resnet50"))


@pytest.fixture(scope="module")
def nb06():
    """Section 1's request sizes and section 2's MLP and transformer block, small."""
    max_rows = 16
    gen = torch.Generator().manual_seed(1)
    history_sizes = (1 + (max_rows * torch.rand(1000, generator=gen) ** 3).floor().long()).tolist()
    torch.manual_seed(0)
    d, h = (256, 1024) if CUDA else (32, 64)
    mlp = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to(DEVICE).eval()
    seq, d_block, heads = (64, 256, 4) if CUDA else (8, 32, 2)
    return types.SimpleNamespace(max_rows=max_rows, history_sizes=history_sizes, mlp=mlp,
                                 sample=torch.randn(max_rows, d, device=DEVICE), Block=Block, d_block=d_block,
                                 heads=heads, block_sample=torch.randn(max_rows, seq, d_block, device=DEVICE),
                                 sol=solutions("06_variable_shapes"))


class Block(torch.nn.Module):
    """Notebook 06, section 2: a pre-norm transformer block, attention within each request."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


@pytest.fixture(scope="module")
def nb07():
    """Per-step, per-rank times like section 4's local run (two ranks, two variants), and section 2's demo."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for variant, base, noise in (("eager", 900.0, 120.0), ("whole-step graph", 300.0, 15.0)):
        for rank in (0, 1):
            for step in range(40):
                rows.append({"case": "mlp", "variant": variant, "rank": rank, "step": step,
                             "step_us": base + noise * float(torch.rand(1, generator=gen)), "host_us": base / 2})

    def demo_model(seed=0):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(DEVICE)
    demo_batches = [(torch.randn(64, 256, generator=gen).to(DEVICE), torch.randint(0, 10, (64,), generator=gen)
                     .to(DEVICE)) for _ in range(2)]
    return types.SimpleNamespace(local_steps=pd.DataFrame(rows), demo_model=demo_model, demo_batches=demo_batches,
                                 sol=solutions("07_data_parallel"))


@pytest.fixture(scope="module")
def nb08():
    """Section 1's model and cache, section 4's capture step and section 10's serving loop, small."""
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyConfig, TinyLLM

    cfg = TinyConfig(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, hidden=176)
    max_batch, max_gen = 8, 6
    # inference: no parameter needs a gradient (never torch.set_grad_enabled(False) in a fixture: it would leak
    # into every test that runs while the fixture is alive)
    model = TinyLLM(cfg, seed=0, device=DEVICE).eval().requires_grad_(False)
    cache = StaticKVCache(cfg, max_batch=max_batch, max_len=max_gen + 1, device=DEVICE)
    graph_step = fresh_cublas_workspace(lambda tokens, pos: model.decode(tokens, pos, cache))   # as notebook 08's

    def make_stream(seed, steps):
        g = torch.Generator().manual_seed(seed)
        arrivals = torch.poisson(torch.full((steps,), 1.5), generator=g).long().tolist()
        lengths = iter((1 + (torch.rand(sum(arrivals) + 1, generator=g) * max_gen).long()).tolist())
        return [[next(lengths) for _ in range(k)] for k in arrivals]

    def serve(step, stream, record=None):
        tokens = torch.zeros(max_batch, dtype=torch.long, device=DEVICE)
        pos = torch.zeros(max_batch, dtype=torch.long, device=DEVICE)
        active, queue, next_id, sizes = [], [], 0, []
        for arriving in stream:
            queue += [(next_id + i, n) for i, n in enumerate(arriving)]
            next_id += len(arriving)
            while queue and len(active) < max_batch:
                rid, n = queue.pop(0)
                tokens[len(active)], pos[len(active)] = 1 + rid % (cfg.vocab_size - 1), 0
                active.append([rid, n])
            if not active:
                continue
            n = len(active)
            sizes.append(n)
            nxt = step(tokens[:n], pos[:n]).argmax(-1)
            tokens[:n] = nxt
            pos[:n] += 1
            if record is not None:
                for (rid, _), t in zip(active, nxt.tolist()):
                    record.setdefault(rid, []).append(t)
            for a in active:
                a[1] -= 1
            for i in reversed([i for i, a in enumerate(active) if a[1] == 0]):
                last = len(active) - 1
                if i != last:
                    cache.move_row(last, i)
                    tokens[i], pos[i], active[i] = tokens[last], pos[last], active[last]
                active.pop()
        return sizes

    stream = make_stream(10, 30)
    eager_tokens = {}
    observed = serve(lambda t, p: model.decode(t, p, cache), stream, record=eager_tokens)
    history = serve(lambda t, p: model.decode(t, p, cache), make_stream(11, 120))
    z = torch.zeros(max_batch, dtype=torch.long, device=DEVICE)
    prompt = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    return types.SimpleNamespace(cfg=cfg, max_batch=max_batch, graph_step=graph_step, serve=serve, stream=stream,
                                observed=observed, history=history, eager_tokens=eager_tokens, sample=z,
                                prompt=prompt, new_tokens=6, sol=solutions("08_llm_decode"), model=model)


@pytest.fixture(scope="module")
def nb05():
    torch.manual_seed(0)
    return types.SimpleNamespace(X=torch.randn(256, device=DEVICE) + 2.0, sol=solutions("05_pitfalls"))


# --- each solution against its check ----------------------------------------------------------------------------

def run_01_1(s):
    return s.sol.exercise_1(s.inputs["small"], SAMPLES, CALLS), {"reference": s.main_table}


def run_01_2(s):
    out = s.sol.exercise_2(gelu, s.exps[0], s.exps[1], DEVICE, SAMPLES, CALLS, s.crossover)
    return out, {"reference_sweep": s.sweep}


def run_01_3(s):
    return s.sol.exercise_3(s.graphs, s.inputs, gelu, CUDA), {}


def run_02_1(s):
    return s.sol.exercise_1(make_model, make_opt, eager_amp_step, s.loss_fn, s.batches, s.dims, 22, SAMPLES,
                            CALLS, CUDA), {}


def run_02_2(s):
    return s.sol.exercise_2(make_model, s.loss_fn, s.batches, s.dims, DEVICE, CUDA), {}


def run_02_3(s):
    return s.sol.exercise_3(make_model, make_opt, s.loss_fn, s.timing, s.dims, DEVICE), {"timing": s.timing}


def run_03_1(s):
    return s.sol.exercise_1(s.compiled, gelu, s.x, SAMPLES, CALLS), {}


def run_03_2(s):
    return s.sol.exercise_2(fresh, with_mark_step, 64, 8, (1, 4, 16), SAMPLES, CALLS, CUDA), {}


def run_03_3(s):
    return s.sol.exercise_3(s.ro, s.compiled, with_mark_step, gelu, s.x, SAMPLES, CALLS, CUDA), {"x": s.x}


def run_03_4(s):
    out = s.sol.exercise_4(fresh, gelu, s.x, SAMPLES, CALLS, CUDA)
    return out, {"x": s.x}


def run_04_1(s):
    out = s.sol.exercise_1(s.curve, s.infer_dtypes, s.batches, s.build_model, s.image_batch,
                           "cuda graph (with input copy)", SAMPLES, CALLS)
    return out, {"sweep": s.curve[s.dname], "sweep_batches": s.batches}


def run_04_2(s):
    out = s.sol.exercise_2(s.small_cnn, s.digits_loader, s.warmup_cosine, torch.nn.CrossEntropyLoss(), s.steps, 1.0,
                           DEVICE, CUDA)
    return out, {"max_norm": 1.0, "steps": s.steps}


def run_05_1(s):
    return s.sol.exercise_1(DEVICE, CUDA), {}


def run_05_2(s):
    return s.sol.exercise_2(s.X, CUDA), {}


def run_06_1(s):
    out = s.sol.exercise_1(s.max_rows, 1000, 0, s.history_sizes, s.mlp, s.sample)
    return out, {"max_rows": s.max_rows, "skewed_sizes": s.history_sizes}


def run_06_2(s):
    return s.sol.exercise_2(s.Block, s.d_block, s.heads, s.block_sample), {"d_block": s.d_block, "heads": s.heads,
                                                                            "sample": s.block_sample}


def run_07_1(s):
    return s.sol.exercise_1(s.local_steps), {"local_steps": s.local_steps}


def run_07_2(s):
    return s.sol.exercise_2(s.demo_model, s.demo_batches, torch.nn.functional.cross_entropy, CUDA, SAMPLES, CALLS), {}


def run_08_1(s):
    out = s.sol.exercise_1(s.history, s.observed, s.max_batch, s.graph_step, s.sample, s.sample.clone(), s.serve,
                           s.stream)
    return out, {"history": s.history, "observed": s.observed, "max_batch": s.max_batch,
                 "eager_tokens": s.eager_tokens}


def run_08_2(s):
    out = s.sol.exercise_2(s.cfg, 0, DEVICE, s.prompt, s.new_tokens)
    return out, {"prompt": s.prompt, "cfg": s.cfg, "seed": 0, "new_tokens": s.new_tokens}


def nb08_k4(s):
    """Exercise 08.3's inputs: a cache long enough for whole blocks of 4 and a stop token that lands mid-block."""
    from cudagraph_kit.course.lessons.decode import mid_block_stop, positions_needed
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, greedy_generate

    length, new = s.prompt.shape[1], 9
    cache = StaticKVCache(s.cfg, s.prompt.shape[0], positions_needed(length, new, 4), device=DEVICE)
    with torch.no_grad():
        stop, _ = mid_block_stop(greedy_generate(s.model, cache, s.prompt, new), 4)
    step = (lambda t, p: s.model.decode(t, p, cache))
    return step, {"model": s.model, "cache": cache, "prompt": s.prompt, "stop_token": stop, "new_tokens": new,
                  "pad_token": 0}


def run_08_3(s):
    step, kw = nb08_k4(s)
    out = s.sol.exercise_3(step, kw["model"], kw["cache"], kw["prompt"], kw["prompt"].shape[1],
                           kw["new_tokens"], kw["stop_token"], 0, DEVICE)
    return out, kw


RUNNERS = {("01_gelu", 1): ("nb01", run_01_1), ("01_gelu", 2): ("nb01", run_01_2), ("01_gelu", 3): ("nb01", run_01_3),
           ("02_train_step", 1): ("nb02", run_02_1), ("02_train_step", 2): ("nb02", run_02_2),
           ("02_train_step", 3): ("nb02", run_02_3),
           ("03_jit_compile", 1): ("nb03", run_03_1), ("03_jit_compile", 2): ("nb03", run_03_2),
           ("03_jit_compile", 3): ("nb03", run_03_3), ("03_jit_compile", 4): ("nb03", run_03_4),
           ("04_resnet50", 1): ("nb04", run_04_1), ("04_resnet50", 2): ("nb04", run_04_2),
           ("05_pitfalls", 1): ("nb05", run_05_1), ("05_pitfalls", 2): ("nb05", run_05_2),
           ("06_variable_shapes", 1): ("nb06", run_06_1), ("06_variable_shapes", 2): ("nb06", run_06_2),
           ("07_data_parallel", 1): ("nb07", run_07_1), ("07_data_parallel", 2): ("nb07", run_07_2),
           ("08_llm_decode", 1): ("nb08", run_08_1), ("08_llm_decode", 2): ("nb08", run_08_2),
           ("08_llm_decode", 3): ("nb08", run_08_3)}
ALL = [(stem, ex) for stem, exs in EXERCISES.items() for ex in exs]


def _solve_and_check(request, stem, ex):
    fixture, runner = RUNNERS[(stem, ex.number)]
    answer, extra = runner(request.getfixturevalue(fixture))
    result = ex.check(**answer, **extra)
    print(result)
    return result


@pytest.mark.parametrize("stem,ex", ALL, ids=[f"{s}-{e.number}" for s, e in ALL])
def test_solution_passes_its_check_cpu_part(request, stem, ex):
    if CUDA:
        pytest.skip("with CUDA the gpu variant checks the whole exercise")
    result = _solve_and_check(request, stem, ex)
    expected = CORRECT if ex.runs_on == "cpu" else CPU_PART_CORRECT
    assert result.status == expected, result


@pytest.mark.gpu
@pytest.mark.parametrize("stem,ex", ALL, ids=[f"{s}-{e.number}" for s, e in ALL])
def test_solution_passes_its_check_on_the_gpu(request, stem, ex):
    result = _solve_and_check(request, stem, ex)
    assert result.status == CORRECT, result


# --- every exercise is wired up: solution, notebook cells, test --------------------------------------------------

@pytest.mark.parametrize("stem", sorted(EXERCISES))
def test_every_exercise_has_a_solution_a_notebook_cell_and_a_test(stem):
    sol = solutions(stem)
    source = (NOTEBOOKS_DIR / f"{stem}.py").read_text()
    assert "## Exercises" in source
    section = source.split("## Exercises", 1)[1]
    for ex in EXERCISES[stem]:
        assert callable(getattr(sol, f"exercise_{ex.number}", None)), f"nb{stem}.py lacks exercise_{ex.number}"
        assert f"{ex.check.__name__}(" in section, f"{stem}: no cell calls {ex.check.__name__}"
        assert (stem, ex.number) in RUNNERS, f"tests/test_exercises.py does not run {stem} exercise {ex.number}"
        assert ex.runs_on in ("cpu", "cpu+gpu", "gpu")
    assert f"notebooks/solutions/nb{stem}.py" in section, "the Exercises section says where the solutions are"


def test_exercise_numbers_are_consecutive():
    for stem, exs in EXERCISES.items():
        assert [e.number for e in exs] == list(range(1, len(exs) + 1)), stem


# --- placeholders say "not done yet"; learner errors become findings ---------------------------------------------

@pytest.mark.parametrize("stem,ex", ALL, ids=[f"{s}-{e.number}" for s, e in ALL])
def test_untouched_exercise_says_not_done(stem, ex):
    import inspect
    params = [p for p in inspect.signature(ex.check).parameters.values() if p.default is inspect.Parameter.empty]
    kwargs = {p.name: ... for p in params}
    if "x" in kwargs:
        kwargs["x"] = torch.randn(4)
    result = ex.check(**kwargs)
    assert result.status == NOT_DONE and not result.ok, result
    assert "…" in repr(result)


def test_a_check_reports_an_exception_in_the_learners_code():
    def fused_gelu(x):
        raise ZeroDivisionError("oops")
    result = exercises.check_fused_gelu(fused_gelu, ...)
    assert result.status == NOT_RIGHT
    assert "ZeroDivisionError: oops" in result.text and "hint:" in result.text


def test_a_report_that_checked_nothing_does_not_pass():
    assert exercises.Report("x").result().status == NOT_DONE


# --- wrong answers are rejected with a useful message (CPU) ------------------------------------------------------

def _off(result, *phrases):
    assert result.status == NOT_RIGHT and not result.ok, result
    for p in phrases:
        assert p in result.text, (p, result.text)


def test_01_1_rejects_the_hand_written_gelu_and_an_approximation(nb01):
    t = nb01.main_table
    _off(exercises.check_fused_gelu(gelu, t), "calls 5 torch functions")
    tanh = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
    _off(exercises.check_fused_gelu(tanh, t), "differs from the hand-written GELU", "approximate")
    reordered = t.iloc[::-1].reset_index(drop=True)
    g = capture(torch.nn.functional.gelu, nb01.inputs["small"], eager_fallback=True)
    _off(exercises.check_fused_gelu(torch.nn.functional.gelu, reordered, g), "baseline 'eager'")


def test_01_1_refuses_a_table_with_no_graph_captured(nb01, monkeypatch):
    """A table whose 'graph replay' row is a name on an eager call proves nothing: the check reads the graph itself.
    Without one it says what to pass; with an eager one (no GPU, or a capture that fell back) it never says ✔ about
    the graph or the table."""
    fused, x = torch.nn.functional.gelu, nb01.inputs["small"]
    named_only = compare({"eager": lambda: fused(x), "graph replay": lambda: fused(x)}, case="small", samples=2,
                         calls=2)
    no_graph = exercises.check_fused_gelu(fused, named_only)     # no captured object: not done, never passed
    assert not no_graph.ok and "g = capture(fused_gelu" in no_graph.text, no_graph
    eager_g = capture(fused, x.cpu(), eager_fallback=True)        # mode == "eager": nothing was captured
    assert eager_g.mode == "eager"
    _off(exercises.check_fused_gelu(fused, named_only, "graph replay"), "not the graph that capture() returns")
    monkeypatch.setattr(checking_module(), "cuda", lambda: True)  # as on a GPU, where the learner's capture fell back
    _off(exercises.check_fused_gelu(..., named_only, eager_g), "nothing was captured")   # (no function run)
    monkeypatch.setattr(checking_module(), "cuda", lambda: False)  # a CPU: the graph part is not checked, and says so
    on_cpu = exercises.check_fused_gelu(fused, named_only, eager_g)
    assert "nothing was captured here" in on_cpu.text and "was checked" in on_cpu.text, on_cpu
    assert not any("table" in text or "graph" in text.split(":")[0] for mark, text in on_cpu.lines if mark == "✔"), on_cpu


def checking_module():
    import sys
    return sys.modules[exercises.check_fused_gelu.__module__]


def test_01_2_rejects_a_float32_table_and_a_wrong_crossover(nb01):
    fp32 = nb01.sweep.assign(dtype="float32")
    _off(exercises.check_fp16_sweep(fp32, None, "same"), "not float16")
    fp16 = nb01.sweep.assign(dtype="float16")
    wrong = 2 ** 40
    _off(exercises.check_fp16_sweep(fp16, wrong, "same"), "but your table says")
    _off(exercises.check_fp16_sweep(fp16, exercises.crossover_of(fp16), "bigger"), '"larger", "smaller" or "same"')


def test_01_3_rejects_a_wrong_explanation_and_a_message_that_is_not_the_kits():
    _off(exercises.check_host_copies("argument 0: the graph was captured for x. Fix: y", ..., "a"),
         '"a" is not it', "hint:")
    _off(exercises.check_host_copies("something went wrong", ..., "b"), "not the kit's error")


def test_02_1_rejects_a_wrong_list_of_eager_parts():
    # each misplaced part gets its concrete next step: the call, its argument, and why
    _off(exercises.check_amp_adam({"backward", "optimizer.step"}, ..., ...), "inside the graph: ['backward']",
         "also eager", "scaler.scale(loss).backward()", "scaler.step(opt)", "read on the CPU", "scaler.update()")
    _off(exercises.check_amp_adam({"the optimiser"}, ..., ...), "not parts of a step")


def test_02_1_says_zero_grad_is_not_run_at_all_after_capture():
    """zero_grad added to the right answer: not "inside the graph" (capture_train_step runs it once before the
    capture and never around a replay; test_train_step checks that); the hint points to the recipe's zero_grad, and
    for a misplaced backward says what the graph captures."""
    right = {"unscale + inf check", "optimizer.step", "scaler.update"}
    result = exercises.check_amp_adam(right | {"zero_grad"}, ..., ...)
    _off(result, "zero_grad is not run at all after capture, neither eagerly nor inside the graph",
         "section 2, point 3")
    assert "inside the graph" not in result.text.replace("neither eagerly nor inside the graph", "")
    _off(exercises.check_amp_adam(right | {"zero_grad", "backward"}, ..., ...), "inside the graph: ['backward']",
         "zero_grad is not run at all", "the whole backward replay")


def test_02_2_rejects_a_float_lr_and_a_schedule_that_never_moved(nb02):
    n, d_in, h, d_out = nb02.dims
    model = make_model(d_in, h, d_out, dropout=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _off(exercises.check_lr_schedule(model, model, opt, [0.1, 0.05]), "Python float", "lr=torch.tensor")
    opt_t = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3, device=DEVICE), capturable=CUDA)
    _off(exercises.check_lr_schedule(model, model, opt_t, [1e-3, 1e-3]), "never changed")
    other = make_model(d_in, h, d_out, dropout=False, seed=1)
    _off(exercises.check_lr_schedule(model, other, opt_t, [1e-3, 5e-4]), "did not follow the schedule")


def test_02_3_rejects_a_wrong_prediction_and_a_wrong_cost(nb02):
    out = nb02.sol.exercise_3(make_model, make_opt, nb02.loss_fn, nb02.timing, nb02.dims, DEVICE)
    wrong = dict(out, predicted_eager_steps=out["predicted_eager_steps"] + 3)
    _off(exercises.check_short_batches(**wrong, timing=nb02.timing), "you predicted")
    wrong = dict(out, extra_us=out["extra_us"] + 10 * abs(out["extra_us"]) + 1000)
    _off(exercises.check_short_batches(**wrong, timing=nb02.timing), "extra_us =")
    one_size = [b for b in out["short_batches"] if len(b[0]) == nb02.dims[0]][:5]
    model = make_model(*nb02.dims[1:])
    step = capture_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), nb02.loss_fn, one_size[0],
                              eager_fallback=True)
    for xb, yb in one_size:
        step(xb, yb)
    _off(exercises.check_short_batches(one_size, 0, step, 0.0, nb02.timing), "distinct shape")


def test_03_1_rejects_one_call_per_graph_and_an_uncompiled_function(nb03):
    g1 = capture(nb03.compiled, nb03.x, eager_fallback=True)
    _off(exercises.check_compiled_calls_per_graph(g1, ...), "holds 1 call(s) per graph")
    eager10 = capture(gelu, nb03.x, calls_per_graph=10, eager_fallback=True)
    _off(exercises.check_compiled_calls_per_graph(eager10, ...), "torch.compile did not make")


def test_03_2_rejects_a_wrong_model():
    def trainable(layers, width):
        return torch.nn.Sequential(*[m for _ in range(layers)
                                     for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]).to(DEVICE)
    _off(exercises.check_mlp_depth(trainable, ..., ...), "require grad")

    def no_relu(layers, width):
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).requires_grad_(False)
    _off(exercises.check_mlp_depth(no_relu, ..., ...), "expected 3 x (Linear(16, 16), ReLU)")


def test_03_3_rejects_an_output_that_the_next_call_overwrites(nb03):
    buffer = torch.empty_like(nb03.x)

    def reuses_its_output(x):  # what a CUDA graph's static output does
        buffer.copy_(gelu(x))
        return buffer
    _off(exercises.check_clone_cost(reuses_its_output, ..., ..., nb03.x), "no longer holds f(x1)", ".clone()")


def test_03_4_rejects_a_function_that_is_not_compiled(nb03):
    _off(exercises.check_max_autotune(gelu, ..., nb03.x), "not a function returned by torch.compile")


def test_04_1_rejects_a_measured_batch_a_wrong_graph_and_a_reordered_table(nb04):
    _off(exercises.check_batch_prediction(nb04.batches[0], ..., ..., ..., ..., sweep=nb04.curve[nb04.dname],
                                          sweep_batches=nb04.batches), "INFER_BATCHES")
    x = nb04.image_batch(3, nb04.infer_dtypes[nb04.dname])
    model = nb04.build_model(nb04.infer_dtypes[nb04.dname])

    def infer(t):
        with torch.no_grad():
            return model(t)
    other_batch = capture(infer, nb04.image_batch(5, nb04.infer_dtypes[nb04.dname]), eager_fallback=True)
    _off(exercises.check_batch_prediction(3, ..., other_batch, ..., ..., sweep=nb04.curve[nb04.dname],
                                          sweep_batches=nb04.batches), "captured at batch 5, not 3")
    g = capture(infer, x, eager_fallback=True)
    table = compare({"eager": infer, "cuda graph (with input copy)": g}, x, case="bs3", samples=SAMPLES, calls=CALLS)
    _off(exercises.check_batch_prediction(3, ..., g, table.iloc[::-1].reset_index(drop=True), ...,
                                          sweep=nb04.curve[nb04.dname], sweep_batches=nb04.batches), "baseline 'eager'")


def test_04_predicted_speedup_interpolates_the_floor_and_the_kernels():
    idx = pd.Index([1, 4], name="batch")
    sweep = {"eager": pd.DataFrame({"kernels_per_call": [100.0, 120.0]}, index=idx),
             "graph": pd.DataFrame({"floor_us": [200.0, 800.0]}, index=idx), "launch_us": 5.0}
    # batch 2: floor 400, kernels 106.67 -> launches 533: launch-bound, 533/400
    assert math.isclose(exercises.predicted_speedup_at(2, sweep), (106.0 + 2 / 3) * 5 / 400)
    assert math.isclose(exercises.predicted_speedup_at(4, sweep), 1.0)  # GPU-bound: the graph cannot beat the floor


def test_04_2_rejects_norms_that_disagree_a_wrong_count_and_a_shared_tensor():
    eager = [torch.tensor(v) for v in (3.0, 2.0, 0.5, 0.4)]
    _off(exercises.check_clip_norms(eager, [3.0, 2.0, 0.5], ..., 1.0, 4), "one epoch has 4 steps")
    _off(exercises.check_clip_norms(eager, [3.0, 2.5, 0.5, 0.4], ..., 1.0, 4), "differ from the eager loop")
    _off(exercises.check_clip_norms(eager, [3.0, 2.0, 0.5, 0.4], 0.25, 1.0, 4), "2 of 4 norms are above 1.0")
    one = torch.tensor(0.4)
    _off(exercises.check_clip_norms(eager, [torch.tensor(3.0), torch.tensor(2.0), one, one], 0.5, 1.0, 4),
         "one and the same tensor", ".clone()")
    result = exercises.check_clip_norms(eager, [3.0, 2.0, 0.5, 0.4], 0.5, 1.0, 4)
    assert result.ok and "2 of 4 steps" in result.text, result


class ScaledByStep(torch.nn.Module):  # notebook 05, section 5: the counter is a Python number
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.step = 0

    def forward(self, x):
        self.step += 1
        return self.lin(x) / self.step


class CounterRebound(torch.nn.Module):  # a buffer, but a new tensor at every call
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x):
        self.step = self.step + 1
        return self.lin(x) / self.step


class CounterNotABuffer(torch.nn.Module):  # updated in place, but .to(DEVICE) does not move it
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.step = torch.zeros((), device=DEVICE)

    def forward(self, x):
        self.step.add_(1)
        return self.lin(x) / self.step


class CounterFromOne(CounterRebound):
    def __init__(self):
        super().__init__()
        self.step.fill_(1)

    def forward(self, x):
        self.step.add_(1)
        return self.lin(x) / self.step


def test_05_1_rejects_a_python_counter_a_rebound_buffer_and_a_plain_attribute():
    _off(exercises.check_step_counter(ScaledByStep, ...), "check_capturable still finds", "Python state",
         "register_buffer")
    _off(exercises.check_step_counter(CounterRebound, ...), "new tensor after each call", "add_(1)")
    _off(exercises.check_step_counter(CounterNotABuffer, ...), "plain tensor attribute", "register_buffer")
    _off(exercises.check_step_counter(CounterFromOne, ...), "not by 1, 2, 3")


def test_05_1_an_empty_class_is_not_done():
    class ScaledByStepFixed(torch.nn.Module):
        ...
    result = exercises.check_step_counter(ScaledByStepFixed, ...)
    assert result.status == NOT_DONE and "placeholder" in result.text, result


def clip_to_norm(x, max_norm=1.0):  # notebook 05, exercise 2: the version with a host read
    norm = x.norm().item()
    if norm > max_norm:
        x = x * (max_norm / norm)
    return x


def test_05_2_rejects_a_host_read_an_if_on_a_tensor_and_a_clip_that_always_scales():
    _off(exercises.check_clip_without_sync(clip_to_norm, ...), "check_capturable finds", "host sync")

    def if_on_a_tensor(x, max_norm=1.0):
        norm = x.norm()
        return x * (max_norm / norm) if norm > max_norm else x
    _off(exercises.check_clip_without_sync(if_on_a_tensor, ...), "host sync")

    def always_scales(x, max_norm=1.0):
        return x * (max_norm / x.norm())
    _off(exercises.check_clip_without_sync(always_scales, ...), "norm below max_norm", "torch.clamp")


def test_05_2_the_fixed_clip_gives_the_values_of_the_one_with_a_host_read():
    fixed = solutions("05_pitfalls").exercise_2(torch.randn(64, device=DEVICE), False)["clip_to_norm_fixed"]
    for scale in (0.001, 0.1, 1.0, 10.0):
        x = torch.randn(64, device=DEVICE) * scale
        torch.testing.assert_close(fixed(x), clip_to_norm(x), rtol=1e-4, atol=1e-6)


def test_06_1_rejects_skewed_sizes_a_plan_on_the_history_and_a_wrong_direction(nb06):
    from cudagraph_kit import plan_buckets
    m = nb06.max_rows
    _off(exercises.check_uniform_plan(nb06.history_sizes, ..., ..., ..., m, nb06.history_sizes), "uniform traffic")
    out = nb06.sol.exercise_1(m, 1000, 0, nb06.history_sizes, nb06.mlp, nb06.sample)
    wrong_plan = plan_buckets(nb06.history_sizes, max_graphs=out["uniform_plan"].n_graphs, max_size=m)
    _off(exercises.check_uniform_plan(out["uniform_sizes"], wrong_plan, ..., ..., m, nb06.history_sizes),
         "the planner reaches", "not on history_sizes")
    other = {"larger": "smaller", "smaller": "larger", "same": "larger"}[out["moved"]]
    _off(exercises.check_uniform_plan(**dict(out, moved=other), max_rows=m, skewed_sizes=nb06.history_sizes),
         "you answered")
    ladder_serve = capture_buckets(nb06.mlp, nb06.sample, eager_fallback=True)
    _off(exercises.check_uniform_plan(**dict(out, serve_uniform=ladder_serve), max_rows=m,
                                      skewed_sizes=nb06.history_sizes), "not the plan's")


def test_06_1_the_uniform_plan_moves_its_buckets_to_larger_sizes(nb06):
    """The claim behind exercise 06.1's question, on the notebook's SMOKE sizes."""
    assert nb06.sol.exercise_1(nb06.max_rows, 1000, 0, nb06.history_sizes, nb06.mlp, nb06.sample)["moved"] == "larger"


def test_06_2_rejects_the_unchanged_block_and_a_wrong_why(nb06):
    class NoForward(Block):
        ...
    result = exercises.check_batch_mixing(NoForward, ..., ..., nb06.d_block, nb06.heads, nb06.block_sample)
    assert result.status == NOT_DONE and "placeholder" in result.text, result

    class SameAsBlock(Block):
        def forward(self, x):
            return super().forward(x)
    _off(exercises.check_batch_mixing(SameAsBlock, 0.0, "b", nb06.d_block, nb06.heads, nb06.block_sample),
         "still do not see each other", "mixing_leak = 0.0")
    out = nb06.sol.exercise_2(Block, nb06.d_block, nb06.heads, nb06.block_sample)
    _off(exercises.check_batch_mixing(**dict(out, why="a"), d_block=nb06.d_block, heads=nb06.heads,
                                      sample=nb06.block_sample), '"a" is not it', "hint:")


def test_07_1_rejects_a_spread_that_is_not_the_scripts(nb07):
    out = nb07.sol.exercise_1(nb07.local_steps)["rank_spread"]
    pooled = {v: (m, float(g.step_us.quantile(0.99) - g.step_us.quantile(0.01)))
              for (v, (m, _)), (_, g) in zip(out.items(), nb07.local_steps.groupby("variant", sort=False))}
    _off(exercises.check_rank_spread(pooled, nb07.local_steps), "p99 over steps of (slowest - fastest rank)",
         "pivot_table")
    _off(exercises.check_rank_spread({"eager": out["eager"]}, nb07.local_steps), "one entry per variant")
    means = {v: (float(g.groupby("rank").step_us.mean().agg(lambda s: s.max() - s.min())), p)
             for (v, (_, p)), (_, g) in zip(out.items(), nb07.local_steps.groupby("variant", sort=False))}
    _off(exercises.check_rank_spread(means, nb07.local_steps), "spread of the ranks' medians")


def test_07_1_says_when_the_local_run_had_one_rank(nb07):
    """A one-GPU machine runs the local run as one rank: every spread is 0, and the check says why."""
    one = nb07.local_steps[nb07.local_steps["rank"] == 0]
    result = exercises.check_rank_spread(nb07.sol.exercise_1(one)["rank_spread"], one)
    assert result.status == CORRECT and "one rank" in result.text, result
    result = exercises.check_rank_spread(nb07.sol.exercise_1(nb07.local_steps)["rank_spread"], nb07.local_steps)
    assert "one rank" not in result.text, result


def test_07_1_matches_the_notebooks_table_on_a_real_local_run_shape(nb07):
    """The check's reference is the script's own summary (cudagraph_kit.ddp.jitter_summary)."""
    from cudagraph_kit.ddp import jitter_summary
    table = jitter_summary(nb07.local_steps).set_index("variant")
    out = nb07.sol.exercise_1(nb07.local_steps)["rank_spread"]
    for v, (m, p) in out.items():
        assert math.isclose(m, table.rank_median_spread_us[v]) and math.isclose(p, table.step_rank_diff_p99_us[v])


def test_07_2_rejects_a_wrong_cost_and_a_table_without_the_synced_row(nb07):
    t = pd.DataFrame({"case": "c", "variant": ["eager", "whole-step graph", "whole-step graph + loss.item()"],
                      "executed_as": ["eager", "cuda graph", "cuda graph"], "median_us": [100.0, 40.0, 55.0],
                      "speedup": [1.0, 2.5, 1.8]})
    _off(exercises.check_item_per_step(t, 5.0, True), "the table says 15.0 µs")
    _off(exercises.check_item_per_step(t.iloc[:2], 15.0, True), "'whole-step graph + loss.item()'")


# --- wrong answers only a GPU can expose -------------------------------------------------------------------------

@pytest.mark.gpu
def test_01_3_a_blocking_copy_in_a_capture_is_rejected():
    shape = (4, 4)

    def host_copy_capture(pinned):
        x_host = torch.randn(shape, pin_memory=pinned)
        static = torch.empty(shape, device="cuda")
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static.copy_(x_host)  # blocking: synchronizes
        except RuntimeError as exc:
            torch.cuda.synchronize()
            return {"captured": False, "error": str(exc), "replay_reads_new_values": None}
        return {"captured": True, "error": None, "replay_reads_new_values": False}
    _off(exercises.check_host_copies(..., host_copy_capture, "b"), "non_blocking=True")


@pytest.mark.gpu
def test_02_2_a_float_lr_follows_the_schedule_through_the_kit(nb02):
    """The claim of exercise 02.2: with Adam(capturable=True) and a Python-number lr, capture_train_step's replays
    follow the scheduler (the kit copies each new lr into the GPU tensor the graph reads)."""
    n, d_in, h, d_out = nb02.dims

    def train(graphed):
        model = make_model(d_in, h, d_out, dropout=False)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.1)
        step = capture_train_step(model, opt, nb02.loss_fn, nb02.batches[0]) if graphed else None
        lrs = []
        for x, y in nb02.batches:
            if step is None:
                opt.zero_grad(set_to_none=True)
                nb02.loss_fn(model(x), y).backward()
                opt.step()
            else:
                step(x, y)
            sched.step()
            lrs.append(float(opt.param_groups[0]["lr"]))
        return model, opt, lrs

    graphed_model, opt, lrs = train(True)
    eager_model, _, _ = train(False)
    result = exercises.check_lr_schedule(graphed_model, eager_model, opt, lrs)
    assert result.ok and "Python float" in result.text and "follows the schedule" in result.text, result


@pytest.mark.gpu
def test_02_2_claim_sgd_reads_a_tensor_lr_on_the_host(nb02):
    """The hint of exercise 02.2: SGD's default implementation turns a tensor lr into a number (a host sync), so its
    step cannot be captured with one."""
    n, d_in, h, d_out = nb02.dims
    model = make_model(d_in, h, d_out, dropout=False)
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1, device="cuda"))
    step = capture_train_step(model, opt, nb02.loss_fn, nb02.batches[0], warmup=1)
    step(*nb02.batches[0])  # eager warm-up
    with pytest.raises(RuntimeError):
        step(*nb02.batches[0])  # the capture
    x, y = nb02.batches[0]
    torch.cuda.synchronize()  # the process keeps working
    assert torch.isfinite(model(x)).all()


@pytest.mark.gpu
def test_03_3_a_reduce_overhead_output_is_not_kept_without_clone(nb03):
    naive = with_mark_step(nb03.ro)
    _off(exercises.check_clone_cost(naive, ..., ..., nb03.x), ".clone()")


@pytest.mark.gpu
def test_04_1_a_graph_that_is_not_the_eager_function_is_rejected(nb04):
    dtype = nb04.infer_dtypes[nb04.dname]
    model = nb04.build_model(dtype)

    def infer(t):
        with torch.no_grad():
            return model(t)
    wrong = capture(lambda t: infer(t) * 1.5, nb04.image_batch(2, dtype))
    wrong.fn = infer  # a graph of another function than the one it names
    _off(exercises.check_batch_prediction(2, ..., wrong, ..., ..., sweep=nb04.curve[nb04.dname],
                                          sweep_batches=nb04.batches), "differs from eager")


@pytest.mark.gpu
def test_04_2_norms_kept_without_clone_are_rejected(nb04):
    """The trap of exercise 04.2: step.grad_norm after a replay is the graph's output, overwritten by the next."""
    model = nb04.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    batches = [(x.cuda(), y.cuda()) for x, y in nb04.digits_loader(1)]
    step = capture_train_step(model, opt, torch.nn.CrossEntropyLoss(), batches[0], max_grad_norm=1.0)
    kept = []
    for x, y in batches[:8]:
        step(x, y)
        kept.append(step.grad_norm)
    out = nb04.sol.exercise_2(nb04.small_cnn, lambda seed: batches[:8], nb04.warmup_cosine,
                              torch.nn.CrossEntropyLoss(), 8, 1.0, "cuda", True)
    _off(exercises.check_clip_norms(out["norms_eager"], kept, ..., 1.0, 8), "one and the same tensor")


@pytest.mark.gpu
def test_05_1_a_verify_against_the_graphed_model_itself_is_rejected():
    """The trap of exercise 05.1: the graph and its eager reference share one counter, so they disagree."""
    Fixed = solutions("05_pitfalls").exercise_1("cuda", False)["ScaledByStepFixed"]
    model = Fixed().cuda()
    x = torch.randn(4, 16, device="cuda")
    g = capture(model, x)
    shared = verify(g, model, x)
    _off(exercises.check_step_counter(Fixed, shared), "your verify() finds a divergence", "copy.deepcopy")


@pytest.mark.gpu
def test_05_1_a_python_counter_diverges_in_a_graph():
    """The claim of exercise 05.1: a graph freezes ScaledByStep's Python counter (verify against an eager copy)."""
    model = ScaledByStep().cuda()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16, device="cuda")
    g = capture(model, x)
    reference.step = model.step
    assert not verify(g, reference, x, state=[(model, reference)]).ok


@pytest.mark.gpu
def test_05_2_a_host_read_does_not_capture():
    from cudagraph_kit import CaptureError
    with pytest.raises(CaptureError):
        capture(clip_to_norm, torch.randn(256, device="cuda"))
    assert torch.isfinite(torch.randn(4, device="cuda") * 2).all()  # the process keeps working


@pytest.mark.gpu
def test_07_2_a_wrong_answer_about_the_lead_is_rejected():
    t = pd.DataFrame({"case": "c", "variant": ["eager", "whole-step graph", "whole-step graph + loss.item()"],
                      "executed_as": ["eager", "cuda graph", "cuda graph"], "median_us": [100.0, 40.0, 55.0],
                      "speedup": [1.0, 2.5, 1.8]})
    _off(exercises.check_item_per_step(t, 15.0, False), "keeps_lead = False")
    assert exercises.check_item_per_step(t, 15.0, True).status == CORRECT


def test_exercise_cells_use_only_placeholders_the_checks_understand():
    """Each notebook's exercise cells assign ``...`` (never a half-written solution) to what its checks read."""
    for stem in EXERCISES:
        section = (NOTEBOOKS_DIR / f"{stem}.py").read_text().split("## Exercises", 1)[1]
        assert re.search(r"^\w+ = \.\.\.", section, flags=re.M), stem


def test_crossover_of_reads_the_first_size_below_ten_percent():
    df = pd.DataFrame({"variant": ["eager", "graph replay"] * 3, "speedup": [1, 3.0, 1, 1.05, 1, 1.2],
                       "numel": [1, 1, 2, 2, 4, 4]})
    assert exercises.crossover_of(df) == 2
    assert exercises.crossover_of(df[df.numel == 1]) is None
    assert math.isclose(df.speedup.iloc[1], 3.0)


def test_table_rows_is_the_one_table_check():
    """exercises.table_rows: the placeholder, a wrong table, a missing row and a failed extra condition each give
    one line; a good table gives its rows (a name ending in * is a prefix)."""
    table = pd.DataFrame({"case": ["c", "c"], "variant": ["eager", "graph replay (eager fallback)"],
                          "executed_as": ["eager", "eager"], "median_us": [2.0, 1.0], "speedup": [1.0, 2.0]})

    def lines(tab, variants=(), **kw):
        report = exercises.Report("x")
        rows = exercises.table_rows(report, tab, variants, todo="fill in the table", missing="a row is missing",
                                    hint="the hint", **kw)
        return rows, report.result()

    rows, result = lines(..., ["graph*"])
    assert rows is None and result.status == NOT_DONE and "fill in the table" in result.text
    rows, result = lines([1, 2], ["graph*"])
    _off(result, "expected the DataFrame that compare() returns, got a list", "hint: the hint")
    rows, result = lines(table.drop(columns="speedup"), ["graph*"])
    _off(result, "lacks column(s) ['speedup']")
    rows, result = lines(table.iloc[::-1], ["graph*"])
    _off(result, "first row must be the baseline 'eager'")
    rows, result = lines(table, ["graph*", "cuda graph"])
    _off(result, "a row is missing", "hint: the hint")
    rows, result = lines(table, ["graph*"], ok=lambda r: r[0]["executed_as"] == "cuda graph")
    _off(result, "a row is missing")
    rows, result = lines(table, ["graph*", "eager"])
    assert [r["variant"] for r in rows] == ["graph replay (eager fallback)", "eager"]
    assert len(result.lines) == 1 and "nothing was checked" in result.text      # it reported nothing itself
    rows, result = lines(table.assign(numel=[1, 2]), columns=exercises.COMPARE_COLUMNS + ("numel",), baseline=None)
    assert rows == []


def test_08_1_rejects_a_plan_on_the_stream_and_tokens_that_differ(nb08):
    from cudagraph_kit import plan_buckets
    out = nb08.sol.exercise_1(nb08.history, nb08.observed, nb08.max_batch, nb08.graph_step, nb08.sample,
                              nb08.sample.clone(), nb08.serve, nb08.stream)
    kw = {"history": nb08.history, "observed": nb08.observed, "max_batch": nb08.max_batch,
          "eager_tokens": nb08.eager_tokens}
    too_many = plan_buckets(nb08.history, max_graphs=6, max_size=nb08.max_batch)
    if too_many.n_graphs > 4:
        _off(exercises.check_decode_buckets(**dict(out, few_buckets=too_many), **kw), "at most 4")
    _off(exercises.check_decode_buckets(**dict(out, pad_fraction=out["pad_fraction"] + 0.1), **kw), "pad_fraction")
    wrong = {rid: [t + 1 for t in toks] for rid, toks in out["few_tokens"].items()}
    _off(exercises.check_decode_buckets(**dict(out, few_tokens=wrong), **kw), "decoded differently")


def test_08_2_rejects_float32_tokens_and_a_wrong_why(nb08):
    from cudagraph_kit.course.lessons.tiny_llm import StaticKVCache, TinyLLM, greedy_generate
    kw = {"prompt": nb08.prompt, "cfg": nb08.cfg, "seed": 0, "new_tokens": nb08.new_tokens}
    model = TinyLLM(nb08.cfg, seed=0, device=DEVICE).eval()
    cache = StaticKVCache(nb08.cfg, 4, 32, device=DEVICE)
    with torch.no_grad():
        fp32 = greedy_generate(model, cache, nb08.prompt, nb08.new_tokens) + 1   # not the bfloat16 model's tokens
    out = nb08.sol.exercise_2(nb08.cfg, 0, DEVICE, nb08.prompt, nb08.new_tokens)
    _off(exercises.check_low_precision_ties(**dict(out, bf16_tokens=fp32), **kw), "not those of the bfloat16 model")
    _off(exercises.check_low_precision_ties(**dict(out, tie_why="a"), **kw), '"a" is not it', "hint:")


def test_08_3_rejects_a_block_that_does_not_update_its_state_or_pad(nb08):
    import torch as _torch
    out, kw = run_08_3(nb08)
    step = (lambda t, p: kw["model"].decode(t, p, kw["cache"]))

    def rebinding(tokens, pos, done, stop):     # rebinds names instead of updating in place
        out = []
        for _ in range(4):
            tokens = step(tokens, pos).argmax(-1).masked_fill(done, 0)
            done = done | (tokens == stop)
            pos = pos + 1
            out.append(tokens)
        return _torch.stack(out, dim=1)

    def no_pad(tokens, pos, done, stop):        # never masks the stopped rows
        out = []
        for _ in range(4):
            nxt = step(tokens, pos).argmax(-1)
            tokens.copy_(nxt)
            pos.add_(1)
            out.append(nxt)
        return _torch.stack(out, dim=1)
    _off(exercises.check_k_step_decode(**dict(out, k4_block=rebinding), **kw), "did not move on")
    _off(exercises.check_k_step_decode(**dict(out, k4_block=no_pad), **kw), "pad after the stop token")
    _off(exercises.check_k_step_decode(**dict(out, k4_tokens=out["k4_tokens"] + 1), **kw), "differ from one step")
