"""GPU scenarios for tests/test_ddp.py, each in a fresh process (NCCL reads its environment when the process
group is created, so every scenario needs its own process). One process, one GPU, NCCL on 127.0.0.1.

    python tests/ddp_cases.py <scenario>      # prints one line: RESULT {...json...}
"""
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from cudagraph_kit.ddp import ddp_for_graphs, free_port, setup_distributed_for_graphs  # noqa: E402
from cudagraph_kit.train_step import capture_train_step  # noqa: E402


def init_by_hand(backend="nccl"):
    """init_process_group the usual way (not through the kit), rank 0 of 1 on 127.0.0.1."""
    torch.cuda.set_device(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)


def make(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()


def batches(n=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 64, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda()) for _ in range(n)]


def opt_for(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)


def eager_reference(data):
    model = DDP(make(), device_ids=[0])
    opt = opt_for(model)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_graphed(model, data, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = capture_train_step(model, opt_for(model), torch.nn.functional.cross_entropy, data[0], **kw)
    for x, y in data:
        step(x, y)
    torch.cuda.synchronize()
    return step, [str(w.message) for w in caught]


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the scenario reports what was raised
        return f"{type(exc).__name__}: {exc}"
    return None


def keeps_working():
    """After a refused capture the process group and the GPU still work: one all-reduce."""
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return t.sum().item() == 4.0


def scenario(name):
    if name in ("env_on", "env_unset", "old_name_only_but_torchrun_default"):
        os.environ.pop("NCCL_ASYNC_ERROR_HANDLING", None)
        os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        if name == "env_on":
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        if name == "old_name_only_but_torchrun_default":  # the old documented name, with torchrun's default beside it
            os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "0"
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        init_by_hand()
        model = ddp_for_graphs(make(), device_ids=[0])
        err = error_of(lambda: capture_train_step(model, opt_for(model), torch.nn.functional.cross_entropy,
                                                  batches(1)[0]))
        return {"error": err, "keeps_working": keeps_working()}
    if name == "too_late":
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        init_by_hand()
        return {"error": error_of(setup_distributed_for_graphs), "keeps_working": keeps_working()}
    if name == "gloo_cuda":
        init_by_hand("gloo")
        model = DDP(make(), device_ids=[0])
        err = error_of(lambda: capture_train_step(model, opt_for(model), torch.nn.functional.cross_entropy,
                                                  batches(1)[0]))
        return {"error": err}
    if name == "kit":
        setup_distributed_for_graphs()
        data = batches()
        ref = eager_reference(data)
        model = ddp_for_graphs(make(), device_ids=[0])
        step, warned = train_graphed(model, data, warmup=3)
        return {"warmup": step.warmup, "warmup_steps": step.warmup_steps, "state": step.state, "mode": step.mode,
                "max_param_diff": max_diff(ref, model), "moved": max_diff(ref, DDP(make(), device_ids=[0])),
                "warnings": warned, "keeps_working": keeps_working()}
    if name == "hand_side_stream":  # PyTorch's documented recipe: DDP built inside any side-stream context
        setup_distributed_for_graphs()
        data = batches()
        ref = eager_reference(data)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model = DDP(make(), device_ids=[0])
        torch.cuda.current_stream().wait_stream(s)
        err, warned, state, diff = None, [], None, None
        try:
            step, warned = train_graphed(model, data)
            state, diff = step.state, max_diff(ref, model)
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {exc}"
        model._cudagraph_kit = {"stream": s}  # the user says how it was built: no warning then
        model2 = DDP(make(), device_ids=[0])
        model2._cudagraph_kit = {"stream": s}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            capture_train_step(model2, opt_for(model2), torch.nn.functional.cross_entropy, data[0])
        return {"error": err, "state": state, "max_param_diff": diff, "warnings": warned,
                "warnings_with_marker": [str(w.message) for w in caught if "side stream" in str(w.message)]}
    raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    result = scenario(sys.argv[1])
    print("RESULT " + json.dumps(result), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
