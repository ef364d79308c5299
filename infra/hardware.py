"""Choose device, precision and thread counts from the hardware."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def usable_cpus() -> int:
    """CPU cores this process may use (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def set_cpu_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op threads deliberately (default: the usable cores)."""
    import torch

    n = num_threads or usable_cpus()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def auto_precision(accelerator: str = "auto") -> str:
    """The precision for this hardware.

    bf16-mixed on CUDA GPUs with bf16 (Ampere and newer), 16-mixed on older CUDA GPUs,
    32-true on CPU (and whenever the accelerator is forced to cpu).
    """
    import torch

    if accelerator == "cpu" or not torch.cuda.is_available():
        return "32-true"
    if torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "16-mixed"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags the CPU reports (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def inference_precision(device: str | None = None, flags: frozenset[str] | None = None) -> str:
    """``"bf16"`` where this hardware multiplies bfloat16 natively, else ``"fp32"``.

    CUDA GPUs with bf16 (Ampere and newer); CPUs with AMX tiles for bf16 (``amx_bf16``:
    Intel Sapphire Rapids and newer), where oneDNN runs bf16 matmuls several times faster
    than fp32. Elsewhere (AVX2 laptops, AVX-512 without AMX) bf16 is emulated or barely
    faster, so fp32 stays.
    """
    import torch

    if (device or "").startswith("cuda") or (device is None and torch.cuda.is_available()):
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if "amx_bf16" in (cpu_flags() if flags is None else flags) else "fp32"
