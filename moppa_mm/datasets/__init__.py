from .coco import CheckedCocoDataset
from .fgvc import FGVC, FGVC_DATASETS
from .vtab import VTAB1k, VTAB_GROUPS, VTAB_TASKS

__all__ = ['CheckedCocoDataset', 'VTAB1k', 'VTAB_TASKS', 'VTAB_GROUPS', 'FGVC',
           'FGVC_DATASETS']
