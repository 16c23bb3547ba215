"""Data loader workers seeded anew every epoch, as a resumed run seeds them."""
import os
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.registry import FUNCTIONS


@FUNCTIONS.register_module()
def epoch_seeded_worker_init(worker_id: int) -> None:
    """Seeds ``random``, numpy and torch in a data loader worker from the seed
    PyTorch gave it (``torch.initial_seed()``: a base seed drawn from the main
    process's generator each time workers start, plus ``worker_id``) and the
    rank (``RANK``, else ``mmengine.dist.get_rank()``). With
    ``persistent_workers=False`` the seeds change every epoch and follow the
    main process's generator, which ``RNGStateHook`` checkpoints: a resumed run
    draws the uninterrupted run's augmentations. (mmengine's default seeds the
    same every epoch.) Use ``worker_init_fn=dict(type='epoch_seeded_worker_init')``.
    """
    rank = int(os.environ.get('RANK', get_rank()))
    seeds = np.random.SeedSequence([torch.initial_seed(), rank])
    worker_seed = int(seeds.generate_state(1, np.uint64)[0])
    random.seed(worker_seed)
    torch.manual_seed(worker_seed)
    np.random.seed(seeds.generate_state(4))  # 128 bits, as numpy's own seeding
