"""FGVC with the VPT splits: ``{train,val,test}.json`` map image path -> class id."""
import json
import os.path as osp
from collections import OrderedDict
from typing import List, Optional

from mmpretrain.datasets import BaseDataset
from mmpretrain.registry import DATASETS

# name -> (classes, image folder that the json paths are relative to, as VPT)
FGVC_DATASETS = OrderedDict([
    ('cub', (200, 'images')),
    ('nabirds', (555, 'images')),
    ('oxford_flowers', (102, '')),
    ('stanford_dogs', (120, 'Images')),
    ('stanford_cars', (196, '')),
])
FGVC_SPLITS = ('train', 'val', 'test')


def check_fgvc(data_root: str, dataset: str, split: str) -> str:
    if dataset not in FGVC_DATASETS:
        raise ValueError(f'unknown FGVC dataset {dataset!r}; expected one of '
                         f'{", ".join(FGVC_DATASETS)}')
    if split not in FGVC_SPLITS:
        raise ValueError(f'unknown FGVC split {split!r}, expected one of {FGVC_SPLITS}')
    split_file = osp.join(data_root, f'{split}.json')
    if not osp.isfile(split_file):
        raise FileNotFoundError(f'FGVC split file not found: {split_file!r}')
    return split_file


@DATASETS.register_module()
class FGVC(BaseDataset):
    """One FGVC dataset with VPT's json splits.

    Args:
        data_root (str): The dataset's folder (holding ``{split}.json``).
        dataset (str): One of ``FGVC_DATASETS``.
        split (str): ``'train'``, ``'val'`` or ``'test'``.
        image_prefix (str, optional): Folder under ``data_root`` the json paths
            are relative to; defaults to VPT's for the dataset.
    """

    def __init__(self, data_root: str, dataset: str, split: str = 'train',
                 image_prefix: Optional[str] = None,
                 metainfo: Optional[dict] = None, **kwargs) -> None:
        self.split_file = check_fgvc(data_root, dataset, split)
        num_classes, default_prefix = FGVC_DATASETS[dataset]
        self.image_prefix = default_prefix if image_prefix is None else image_prefix
        metainfo = dict(metainfo or {})
        metainfo.setdefault('classes', tuple(str(i) for i in range(num_classes)))
        super().__init__(ann_file=self.split_file, data_root=data_root,
                         metainfo=metainfo, **kwargs)

    def load_data_list(self) -> List[dict]:
        with open(self.split_file) as f:
            mapping = json.load(f)
        num_classes = len(self.metainfo['classes'])
        data_list = []
        for path, label in mapping.items():
            if not 0 <= int(label) < num_classes:
                raise ValueError(f'{self.split_file}: label {label} of {path!r} is '
                                 f'outside [0, {num_classes})')
            data_list.append(dict(
                img_path=osp.join(self.data_root, self.image_prefix, path),
                gt_label=int(label)))
        return data_list

    @staticmethod
    def preflight(cfg: dict) -> None:
        check_fgvc(cfg['data_root'], cfg['dataset'], cfg.get('split', 'train'))
