"""Seeds data loader workers so that every epoch draws new augmentations and a
resumed run draws the ones the uninterrupted run drew."""
import os
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.registry import FUNCTIONS


@FUNCTIONS.register_module()
def epoch_seeded_worker_init(worker_id: int) -> None:
    """Seeds ``random``, numpy and torch in a data loader worker from the seed
    PyTorch gave the worker and the process's rank.

    Use it as ``train_dataloader.worker_init_fn=dict(type=
    'epoch_seeded_worker_init')`` with ``persistent_workers=False``.

    A DataLoader draws a base seed from the main process's global torch
    generator each time it starts its workers (every epoch, when they do not
    persist) and seeds worker ``worker_id`` with ``base_seed + worker_id``
    (``torch.initial_seed()`` in the worker) before it calls this function. The
    seed therefore changes every epoch, and follows the main process's
    generator, which ``RNGStateHook`` saves in checkpoints and restores on
    resume: a resumed run starts its workers with the seeds the uninterrupted
    run used. mmengine's default (``seed + worker_id + rank * num_workers``)
    is the same every epoch, so every epoch repeats the same random flips and
    crops. Processes launched with one seed have identical main-process
    generators; the rank (``RANK`` in the environment, as launchers set it,
    else ``mmengine.dist.get_rank()``) goes into the seed so that their
    workers draw differently.

    Args:
        worker_id (int): The worker's index; it is already part of
            ``torch.initial_seed()``.
    """
    rank = int(os.environ.get('RANK', get_rank()))
    seeds = np.random.SeedSequence([torch.initial_seed(), rank])
    worker_seed = int(seeds.generate_state(1, np.uint64)[0])
    random.seed(worker_seed)
    torch.manual_seed(worker_seed)
    np.random.seed(seeds.generate_state(4))  # 128 bits, as numpy's own seeding
