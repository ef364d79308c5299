"""Seeded random state for the parts of a run that happen outside the trainer.

The trainer seeds itself (``seed_everything``) when it starts, but a model's initial
weights are drawn when the model is *built*, before that, from torch's global generator,
which a fresh process seeds at random: two identical runs then start from different
weights. Build models inside :func:`seeded` and draw per-epoch samples with
:func:`epoch_rng`, so a run's randomness depends on its seed alone, and a resumed run
draws what an uninterrupted one would have.

torch's generators, its thread count and its deterministic-algorithms switch belong to the
process, not to a thread: two runs training at once in threads of one process (tuning trials
on the thread runner) would draw each other's random numbers, and their results would depend
on timing. Seeded blocks and trainings hold :data:`RANDOM_STATE_LOCK`, so they take turns in a
process; worker processes (Dask, Ray) still train side by side.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: Held by every seeded block and training of the process (re-entrant: a training may build
#: inside it).
RANDOM_STATE_LOCK = threading.RLock()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU (and CUDA) generators seeded with ``seed``; the
    global random state is restored afterwards, so the block draws the same numbers
    wherever it runs and changes nothing for the code around it (other threads' seeded
    blocks and trainings wait: :data:`RANDOM_STATE_LOCK`)."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with RANDOM_STATE_LOCK, torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """A numpy generator for one epoch of one seeded run (independent of earlier epochs)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
