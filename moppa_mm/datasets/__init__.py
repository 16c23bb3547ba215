from .coco import CheckedCocoDataset
from .fgvc import FGVC, FGVC_DATASETS
from .vtab import VTAB_GROUPS, VTAB_TASKS, VTAB1k
from .worker_init import epoch_seeded_worker_init

__all__ = ['CheckedCocoDataset', 'VTAB1k', 'VTAB_TASKS', 'VTAB_GROUPS', 'FGVC',
           'FGVC_DATASETS', 'epoch_seeded_worker_init']
