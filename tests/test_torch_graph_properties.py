"""PyTorch's own CUDA-graph properties (``test/test_cuda.py``, the ``test_graph_*`` tests), checked through the
kit's API: what PyTorch guarantees for ``torch.cuda.graph`` and ``make_graphed_callables`` must still hold when
``capture``, ``graph_modules`` and ``capture_train_step`` arrange the capture. Each test names the PyTorch test
it ports. GPU only.
"""
import copy
import gc

import pytest
import torch

from cudagraph_kit import CaptureError, graph_features, graph_modules, shared_pool
from cudagraph_kit.graphed import capture
from cudagraph_kit.train_step import capture_train_step

pytestmark = pytest.mark.gpu
mse = torch.nn.functional.mse_loss


def _model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)]
    if dropout:
        layers.insert(2, torch.nn.Dropout(dropout))
    return torch.nn.Sequential(*layers).cuda()


def _batches(n, seed=1, bad=()):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        if i in bad:
            x[0, 0] = float("inf")
        out.append((x.cuda(), y.cuda()))
    return out


# ---------------------------------------------------------------------------------------- RNG under replay
@pytest.mark.parametrize("op", [
    lambda x: torch.nn.functional.dropout(x, p=0.3),
    lambda x: x + torch.rand_like(x),
    lambda x: torch.bernoulli(torch.sigmoid(x)),
], ids=["dropout", "rand_like", "bernoulli"])
def test_rng_replays_draw_the_same_sequence_as_eager(op):
    """Ports ``test_graph_rng_functional``: from the same seed, successive replays draw exactly the numbers
    successive eager calls draw (each replay advances the generator's offset as the eager call would)."""
    x = torch.randn(64, 64, device="cuda")
    g = capture(op, x)  # warm-up and capture consume the RNG; the sequences start at the seeds below
    torch.cuda.manual_seed(5)
    graphed = [g(x).clone() for _ in range(3)]
    torch.cuda.manual_seed(5)
    eager = [op(x) for _ in range(3)]
    for a, b in zip(graphed, eager):
        assert torch.equal(a, b)
    assert not torch.equal(graphed[0], graphed[1])  # each replay draws new numbers


def test_draws_from_a_generator_passed_to_capture_replay_like_eager():
    """Ports ``test_graphsafe_set_get_rng_state`` (a generator registered with the graph): a function drawing from
    its own CUDA torch.Generator, captured with ``generators=[gen]``, replays the numbers eager draws after the same
    ``gen.manual_seed``; on a PyTorch that needs the registration, leaving it out is a clear CaptureError."""
    gen = torch.Generator(device="cuda")
    x = torch.randn(64, 64, device="cuda")

    def noisy(a):
        return a + torch.rand(a.shape, device=a.device, generator=gen)

    if not graph_features()["generators_register_themselves"]:
        with pytest.raises(CaptureError, match=r"generators=\[gen\]"):
            capture(noisy, x)
    g = capture(noisy, x, generators=[gen])
    gen.manual_seed(5)
    graphed = [g(x).clone() for _ in range(3)]
    gen.manual_seed(5)
    eager = [noisy(x) for _ in range(3)]
    for a, b in zip(graphed, eager):
        assert torch.equal(a, b)
    assert not torch.equal(graphed[0], graphed[1])


@pytest.mark.skipif(not graph_features()["check_input_liveness"],
                    reason=f"check_input_liveness needs PyTorch 2.13+, this is {torch.__version__}")
def test_check_input_liveness_raises_when_a_tensor_the_graph_reads_was_freed():
    """PyTorch's input-liveness tracker through ``capture(..., check_input_liveness=True)``: replays run while the
    weight lives; once it is freed, the next replay raises instead of reading freed memory."""
    x = torch.randn(64, device="cuda")
    held = {"w": torch.randn(64, device="cuda")}
    g = capture(lambda a: a * held["w"], x, check_input_liveness=True)
    torch.testing.assert_close(g(x), x * held["w"])
    held.clear()
    gc.collect()
    with pytest.raises(RuntimeError, match="dead tensor"):
        g(x)


def test_dropout_in_a_graphed_training_step_draws_new_masks_each_replay():
    """Ports ``test_graph_rng_distributions`` (dropout side): a captured training step with dropout trains
    like eager from the same seed, so every replay drew the mask eager drew."""
    ref, test = _model(dropout=0.3), _model(dropout=0.3)
    batches = _batches(8)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2, capturable=True)
    opt_t = torch.optim.AdamW(test.parameters(), lr=1e-2, capturable=True)
    step = capture_train_step(test, opt_t, mse, batches[0], warmup=2)
    torch.cuda.manual_seed(7)
    losses_t = [step(x, y) for x, y in batches]
    torch.cuda.manual_seed(7)
    losses_r = []
    for x, y in batches:
        opt_r.zero_grad(set_to_none=True)
        loss = mse(ref(x), y)
        loss.backward()
        opt_r.step()
        losses_r.append(loss.detach())
    assert step.replays == 6
    torch.testing.assert_close(torch.stack(losses_t), torch.stack(losses_r), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------- pools and memory
def test_successive_captures_sharing_a_pool_replay_correctly_and_reuse_memory():
    """Ports ``test_graph_two_successive``: two graphs captured one after the other into one pool, replayed
    in capture order, each reading the other's output, give eager's results; sharing the pool reserves no more
    memory than two private pools."""
    def reserved_for(share):
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        x = torch.randn(1 << 20, device="cuda")
        pool = shared_pool() if share else None
        g1 = capture(lambda a: (a * 2).relu() + 1, x, pool=pool)
        g2 = capture(lambda b: (b * 3).sin() - 1, g1.static_outputs, pool=pool if share else None)
        for _ in range(3):
            new = torch.randn_like(x)
            out = g2(g1(new)).clone()
            torch.testing.assert_close(out, (((new * 2).relu() + 1) * 3).sin() - 1)
        used = torch.cuda.memory_reserved() - before
        del g1, g2, x
        return used

    shared, separate = reserved_for(True), reserved_for(False)
    assert shared <= separate, (shared, separate)


def test_memory_is_released_when_a_graph_is_deleted_and_results_stay_usable():
    """Ports ``test_graph_memory_stats_and_use_result_after_destroy_graph``: deleting the GraphedCallable frees
    its private pool; an output the caller still holds stays valid until dropped."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    x = torch.randn(1 << 22, device="cuda")  # 16 MiB
    g = capture(lambda a: a * 2 + 1, x)
    out = g(x)
    expected = x * 2 + 1
    held = torch.cuda.memory_allocated()
    assert held > base
    del g  # the caller still holds `out`, which lives in the graph's pool
    gc.collect()
    torch.testing.assert_close(out, expected)  # still valid
    del out, x, expected
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base < (1 << 20)  # the 16 MiB buffers are back (RNG state: bytes)
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------- make_graphed_callables
@pytest.mark.parametrize("with_amp", [False, True], ids=["fp32", "amp_fp16"])
def test_graph_modules_match_eager_forward_and_backward(with_amp):
    """Ports ``test_graph_make_graphed_callables`` (with_amp, cache_enabled=False): two graphed sections of a
    model, forward and backward, match the eager model (autocast fp16 inside and outside the capture)."""
    torch.manual_seed(5)
    sections = (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.0)).cuda(),
                torch.nn.Sequential(torch.nn.Linear(32, 4)).cuda())
    eager = copy.deepcopy(sections)
    x = torch.randn(8, 16, device="cuda")
    # the second section's input is the first one's output: fp16 under autocast, and it needs a gradient
    h = torch.randn(8, 32, device="cuda", dtype=torch.float16 if with_amp else torch.float32, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False, enabled=with_amp):
        g1, g2 = graph_modules(sections, ((x,), (h,)))
    for _ in range(3):
        data, target = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        for m in (g1, g2, *eager):
            m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False, enabled=with_amp):
            out_g = g2(g1(data))
            out_e = eager[1](eager[0](data))
        mse(out_g.float(), target).backward()
        mse(out_e.float(), target).backward()
        tol = dict(rtol=1e-3, atol=1e-3) if with_amp else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out_g, out_e, **tol)
        for pg, pe in zip([*g1.parameters(), *g2.parameters()], [*eager[0].parameters(), *eager[1].parameters()]):
            torch.testing.assert_close(pg.grad, pe.grad, **tol)


def test_graph_modules_refuses_a_module_with_hooks_and_keeps_working():
    """Ports the hook rule of ``make_graphed_callables`` (``test_graph_make_graphed_callables`` asserts hooks
    are refused): a module with a forward hook is refused with a CaptureError naming the fix; without the hook
    it graphs."""
    block = torch.nn.Linear(16, 16).cuda()
    handle = block.register_forward_hook(lambda m, i, o: None)
    with pytest.raises(CaptureError, match="hooks") as info:
        graph_modules(block, (torch.randn(4, 16, device="cuda"),))
    assert "remove the module's hooks" in str(info.value)
    handle.remove()
    g = graph_modules(block, (torch.randn(4, 16, device="cuda"),))
    x = torch.randn(4, 16, device="cuda")
    torch.testing.assert_close(g(x), torch.nn.functional.linear(x, block.weight, block.bias))


# ---------------------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("options", [dict(capturable=True, foreach=False), dict(capturable=True, foreach=True),
                                     dict(capturable=True, fused=True)], ids=["single", "foreach", "fused"])
@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_capturable_and_fused_optimizers_step_like_eager(cls, options):
    """Ports ``test_graph_optims`` / ``test_graph_scaling_fused_optimizers`` (no scaler): a captured step of a
    capturable, foreach or fused Adam/AdamW trains like the eager optimizer."""
    ref, test = _model(), _model()
    make = lambda m: getattr(torch.optim, cls)(m.parameters(), lr=1e-2, weight_decay=0.01, **options)  # noqa: E731
    opt_r, opt_t = make(ref), make(test)
    batches = _batches(10)
    step = capture_train_step(test, opt_t, mse, batches[0], warmup=3)
    for x, y in batches:
        step(x, y)
        opt_r.zero_grad(set_to_none=True)
        mse(ref(x), y).backward()
        opt_r.step()
    assert step.replays == 7
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


def test_param_groups_made_capturable_after_construction_are_accepted():
    """Ports ``test_graph_optims_with_explicitly_capturable_param_groups``: capturability is per param group."""
    ref, test = _model(), _model()
    batches = _batches(6)

    def make(m):
        opt = torch.optim.Adam([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 5e-3}], lr=1e-2)
        for group in opt.param_groups:
            group["capturable"] = True
        return opt

    opt_r, opt_t = make(ref), make(test)
    step = capture_train_step(test, opt_t, mse, batches[0], warmup=2)
    for x, y in batches:
        step(x, y)
        opt_r.zero_grad(set_to_none=True)
        mse(ref(x), y).backward()
        opt_r.step()
    assert step.replays == 4
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


def test_grad_scaling_skips_steps_with_inf_like_eager():
    """Ports ``test_graph_grad_scaling``: with fp16 and a GradScaler, a batch whose gradients hold inf skips the
    optimizer step and backs the scale off, exactly as eager (the scaler's check runs eagerly after the replay)."""
    ref, test = _model(), _model()
    batches = _batches(10, bad={5})
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)  # noqa: E731
    opt_r, opt_t = make(ref), make(test)
    scaler_r, scaler_t = torch.amp.GradScaler("cuda", init_scale=2.0 ** 10), torch.amp.GradScaler("cuda", init_scale=2.0 ** 10)
    step = capture_train_step(test, opt_t, mse, batches[0], warmup=2, amp_dtype=torch.float16, scaler=scaler_t)
    scales_t, scales_r = [], []
    for x, y in batches:
        step(x, y)
        scales_t.append(scaler_t.get_scale())
        opt_r.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = mse(ref(x), y)
        scaler_r.scale(loss).backward()
        scaler_r.step(opt_r)
        scaler_r.update()
        scales_r.append(scaler_r.get_scale())
    assert scales_t == scales_r and scales_t[5] < scales_t[4]  # the inf batch backed the scale off
    assert step.replays == 8
    for p in test.parameters():
        assert torch.isfinite(p).all()
    torch.testing.assert_close(list(test.parameters()), list(ref.parameters()), rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------------------------------- errors during capture
@pytest.mark.parametrize("bad", [
    lambda x: x * x.sum().item(),                       # a host sync
    lambda x: x[x > 0].sum() + x,                       # a data-dependent shape
], ids=["item", "boolean_mask"])
def test_an_error_during_capture_is_explained_and_the_process_keeps_working(bad):
    """Ports ``test_graph_error`` / ``test_graph_capture_oom`` (an illegal op during capture raises, and CUDA
    and its RNG keep working): the kit raises CaptureError with cause and fix, and a later capture with random
    numbers works."""
    x = torch.randn(32, device="cuda")
    with pytest.raises(CaptureError) as info:
        capture(bad, x, warmup=1)
    assert "Fix:" in str(info.value)
    torch.rand(4, device="cuda")  # the default generator is usable again
    g = capture(lambda a: torch.nn.functional.dropout(a, 0.5), x)
    assert g(x).shape == x.shape
