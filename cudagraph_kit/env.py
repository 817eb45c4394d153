"""What hardware and software is this? CUDA present? bf16 supported?

Example::

    from cudagraph_kit.env import describe, env_table, has_cuda
    print(env_table())          # a small table: GPU, capability, driver, torch, CUDA, cuDNN, CPU, Python
    info = describe()           # the same as a dict (saved next to every result)
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess

import torch


def has_cuda() -> bool:
    """True when PyTorch can use an NVIDIA GPU through CUDA."""
    return torch.cuda.is_available()


NO_BF16_ENV = "CUDAGRAPH_KIT_NO_BF16"  # set to 1: bf16_supported() says False on any GPU (a T4 rehearsal)


def bf16_supported(device: int = 0) -> bool:
    """True when the GPU computes bf16 natively (compute capability 8.0 or newer; a T4 is 7.5).

    ``CUDAGRAPH_KIT_NO_BF16=1`` in the environment makes it False on every GPU, so code that asks it takes its
    no-bf16 (T4) branch on a newer GPU too; ``scripts/colab_rehearsal.sh`` sets it. Unset, empty, ``0``, ``false``
    or ``no`` leave the answer to the GPU::

        CUDAGRAPH_KIT_NO_BF16=1 python -c "from cudagraph_kit import bf16_supported; print(bf16_supported())"
    """
    if os.environ.get(NO_BF16_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return False
    return has_cuda() and torch.cuda.get_device_capability(device) >= (8, 0)


def usable_gpu_memory(device: int = 0) -> int:
    """Bytes of GPU memory this process may use: the GPU's total, times the per-process fraction where one is set
    (``torch.cuda.set_per_process_memory_fraction``; the Colab rehearsal caps it at a T4's 15 GiB). 0 without CUDA.

    Example::

        roomy = usable_gpu_memory() >= 60 * 2**30     # an H100 yes, a T4 (or its rehearsal) no
    """
    if not has_cuda():
        return 0
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0)(device)  # PyTorch 2.6+
    return int(torch.cuda.get_device_properties(device).total_memory * fraction)


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: int = 0) -> dict:
    """The machine a result came from, as a plain dict (JSON-ready)."""
    cuda = has_cuda()
    info = {
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if cuda else None,
        "bf16": bf16_supported(device),
        "gpu_memory_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1) if cuda else None,
        "driver": _driver_version() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cpu": _cpu_model(),
        "cpu_count": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if not cuda:
        info["note"] = "no CUDA device: CUDA graphs need an NVIDIA GPU; anything timed here ran eagerly on the CPU"
    return info


def env_table(info: dict | None = None) -> str:
    """``describe()`` as an aligned two-column table (what ``python -m cudagraph_kit env`` prints)."""
    info = describe() if info is None else info
    width = max(map(len, info))
    return "\n".join(f"{k:<{width}}  {'-' if v is None else v}" for k, v in info.items())
