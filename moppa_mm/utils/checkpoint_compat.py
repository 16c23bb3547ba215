"""Loading mmengine Runner checkpoints with torch >= 2.6.

torch 2.6 made ``torch.load(weights_only=True)`` the default. Runner checkpoints
hold mmengine objects (``HistoryBuffer`` in the message hub, numpy scalars that
unpickle through ``getattr``), so resuming, and ``load_from`` in mmengine 0.10.x,
fail with "Unsupported global". Allow-listing ``getattr`` would void
``weights_only`` anyway, so instead :func:`load_local_checkpoint` replaces
mmengine's loader for local files: it tries ``weights_only=True`` first (plain
weight files, e.g. official releases, load that way) and only where that refuses
an mmengine object does it load the file with ``weights_only=False``, logging
which file. Load only checkpoints you trust, as with any pickle. With torch < 2.6
the first attempt succeeds and nothing changes.
"""
import os.path as osp
import pickle

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader


def load_local_checkpoint(filename: str, map_location=None):
    """mmengine's local-file loader, with the fallback described above."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    try:
        return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if 'weights_only' not in str(error) and 'Weights only' not in str(error):
            raise
    print_log(f'{filename} holds Python objects besides weights (an mmengine '
              'Runner checkpoint); loading it with weights_only=False',
              logger='current')
    return torch.load(filename, map_location=map_location, weights_only=False)


def register() -> None:
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint,
                                     force=True)
