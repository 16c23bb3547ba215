"""VTAB-1K in the VPT/NOAH folder layout, through mmpretrain's dataset machinery.

    <data_root>/<task>/{train800,val200,train800val200,test}.txt
    <data_root>/<task>/images/...       lines: "images/<split>/000123.jpg <label>"
"""
import os.path as osp
from collections import OrderedDict
from typing import Optional

from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

# task -> number of classes, in the paper's table order, with the three groups
VTAB_GROUPS = OrderedDict([
    ('Natural', OrderedDict([('cifar', 100), ('caltech101', 102), ('dtd', 47),
                             ('oxford_flowers102', 102), ('oxford_iiit_pet', 37),
                             ('svhn', 10), ('sun397', 397)])),
    ('Specialized', OrderedDict([('patch_camelyon', 2), ('eurosat', 10),
                                 ('resisc45', 45), ('diabetic_retinopathy', 5)])),
    ('Structured', OrderedDict([('clevr_count', 8), ('clevr_dist', 6), ('dmlab', 6),
                                ('kitti', 4), ('dsprites_loc', 16), ('dsprites_ori', 16),
                                ('smallnorb_azi', 18), ('smallnorb_ele', 9)])),
])
VTAB_TASKS = OrderedDict(
    (task, classes) for group in VTAB_GROUPS.values() for task, classes in group.items())
VTAB_SPLITS = ('train800', 'val200', 'train800val200', 'test')


def check_vtab_task(data_root: str, task: str, split: str) -> str:
    """Validate a task and split; returns the split file's path."""
    if task not in VTAB_TASKS:
        raise ValueError(f'unknown VTAB-1K task {task!r}; the 19 tasks are: '
                         f'{", ".join(VTAB_TASKS)}')
    if split not in VTAB_SPLITS:
        raise ValueError(f'unknown VTAB-1K split {split!r}, expected one of '
                         f'{VTAB_SPLITS}')
    task_root = osp.join(data_root, task)
    if not osp.isdir(task_root):
        raise FileNotFoundError(f'VTAB-1K task folder not found: {task_root!r} '
                                f'(data_root={data_root!r}, task={task!r})')
    split_file = osp.join(task_root, f'{split}.txt')
    if not osp.isfile(split_file):
        raise FileNotFoundError(f'VTAB-1K split file not found: {split_file!r}')
    return split_file


@DATASETS.register_module()
class VTAB1k(CustomDataset):
    """One VTAB-1K task.

    Args:
        data_root (str): The folder holding the 19 task folders.
        task (str): A task name, e.g. ``'cifar'`` (see ``VTAB_TASKS``).
        split (str): ``'train800'``, ``'val200'``, ``'train800val200'`` or
            ``'test'``. Defaults to ``'train800val200'``.
        **kwargs: Passed to mmpretrain's ``CustomDataset`` (``pipeline``, ...).
    """

    def __init__(self, data_root: str, task: str,
                 split: str = 'train800val200',
                 metainfo: Optional[dict] = None, **kwargs) -> None:
        check_vtab_task(data_root, task, split)
        self.task = task
        self.split = split
        metainfo = dict(metainfo or {})
        metainfo.setdefault('classes', tuple(str(i) for i in range(VTAB_TASKS[task])))
        super().__init__(data_root=osp.join(data_root, task),
                         ann_file=f'{split}.txt', data_prefix='', with_label=True,
                         metainfo=metainfo, **kwargs)

    @staticmethod
    def preflight(cfg: dict) -> None:
        check_vtab_task(cfg['data_root'], cfg['task'],
                        cfg.get('split', 'train800val200'))
