"""VTAB-1K in the VPT/NOAH folder layout, through mmpretrain's dataset machinery.

    <data_root>/<task>/{train800,val200,train800val200,test}.txt
    <data_root>/<task>/images/...       lines: "images/<split>/000123.jpg <label>"
"""
import os.path as osp
import warnings
from collections import OrderedDict
from typing import List, Optional

from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

from moppa_mm.utils.errors import InputNotFoundError, InputValueError
from .image_files import check_image_file

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


def split_lines(split_file: str):
    """``(line number, line)`` of a split file; a line that is not UTF-8 text
    is named instead of a bare ``UnicodeDecodeError``."""
    with open(split_file, 'rb') as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                yield line_number, raw.decode('utf-8')
            except UnicodeDecodeError as error:
                raise InputValueError(
                    f'{split_file}:{line_number}: not UTF-8 text ({error.reason} at column '
                    f'{error.start + 1}); expected "<image path> <label>" lines') from None


def check_vtab_task(data_root: str, task: str, split: str) -> str:
    """Validate a task and split; returns the split file's path."""
    if task not in VTAB_TASKS:
        raise InputValueError(f'unknown VTAB-1K task {task!r}; the 19 tasks are: '
                              f'{", ".join(VTAB_TASKS)}')
    if split not in VTAB_SPLITS:
        raise InputValueError(f'unknown VTAB-1K split {split!r}, expected one of {VTAB_SPLITS}')
    task_root = osp.join(data_root, task)
    if not osp.isdir(task_root):
        raise InputNotFoundError(f'VTAB-1K task folder not found: {task_root!r} '
                                 f'(data_root={data_root!r}, task={task!r})')
    split_file = osp.join(task_root, f'{split}.txt')
    if not osp.isfile(split_file):
        raise InputNotFoundError(f'VTAB-1K split file not found: {split_file!r}')
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

    def load_data_list(self) -> List[dict]:
        """Parse ``<image path> <label>`` lines; a malformed line, a label
        outside ``[0, num_classes)``, a missing or empty image, or an empty
        split raises naming ``file:line``."""
        num_classes = len(self.metainfo['classes'])
        data_list = []
        first_line = {}  # image path -> its first line number
        repeated = []  # 'line: image (first on line n)'
        for line_number, line in split_lines(self.ann_file):
            where = f'{self.ann_file}:{line_number}'
            tokens = line.split()
            if not tokens:
                continue  # blank lines (a trailing newline) carry nothing
            if len(tokens) != 2:
                raise InputValueError(f'{where}: expected "<image path> <label>", got '
                                      f'{line.rstrip()!r}')
            filename, label = tokens
            try:
                gt_label = int(label)
            except ValueError:
                raise InputValueError(f'{where}: label {label!r} is not an integer') from None
            if not 0 <= gt_label < num_classes:
                raise InputValueError(f'{where}: label {gt_label} is outside [0, {num_classes})'
                                      f' for VTAB-1K task {self.task!r}')
            if filename in first_line:
                repeated.append(f'line {line_number}: {filename} (first on line '
                                f'{first_line[filename]})')
            first_line.setdefault(filename, line_number)
            img_path = osp.join(self.img_prefix, filename)
            check_image_file(img_path, where)
            data_list.append(dict(img_path=img_path, gt_label=gt_label))
        if not data_list:
            raise InputValueError(f'{self.ann_file}: the split lists no image')
        if repeated:
            warnings.warn(f'{self.ann_file}: {len(repeated)} line(s) repeat an image of the '
                          f'split (it counts twice); the first: {"; ".join(repeated[:5])}')
        self._warn_test_leak(first_line)
        return data_list

    def _warn_test_leak(self, images: dict) -> None:
        """A training split that lists images of the test split (same path):
        warn with the count and the first lines."""
        test_file = osp.join(osp.dirname(self.ann_file), 'test.txt')
        if self.split == 'test' or not osp.isfile(test_file):
            return
        leaked = []
        for line_number, line in split_lines(test_file):
            tokens = line.split()
            if tokens and tokens[0] in images:
                leaked.append(f'{tokens[0]} ({osp.basename(self.ann_file)}:'
                              f'{images[tokens[0]]}, test.txt:{line_number})')
        if leaked:
            warnings.warn(f'{self.ann_file}: {len(leaked)} image(s) are also in the test '
                          f'split {test_file}, so the test accuracy is inflated; the '
                          f'first: {"; ".join(leaked[:5])}')

    @staticmethod
    def preflight(cfg: dict) -> None:
        check_vtab_task(cfg['data_root'], cfg['task'],
                        cfg.get('split', 'train800val200'))

    @staticmethod
    def num_classes(cfg: dict) -> int:
        """The classes a dataset config will have (its ``metainfo``'s, else the task's)."""
        classes = (cfg.get('metainfo') or {}).get('classes')
        return len(classes) if classes is not None else VTAB_TASKS[cfg['task']]
