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
