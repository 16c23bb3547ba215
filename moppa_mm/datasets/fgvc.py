"""FGVC with the VPT splits: ``{train,val,test}.json`` map image path -> class id."""
import json
import os.path as osp
import warnings
from collections import OrderedDict
from typing import List, Optional

from mmpretrain.datasets import BaseDataset
from mmpretrain.registry import DATASETS

from moppa_mm.utils.errors import InputNotFoundError, InputValueError
from .image_files import check_image_file

# name -> (classes, image folder that the json paths are relative to, as VPT)
FGVC_DATASETS = OrderedDict([
    ('cub', (200, 'images')),
    ('nabirds', (555, 'images')),
    ('oxford_flowers', (102, '')),
    ('stanford_dogs', (120, 'Images')),
    ('stanford_cars', (196, '')),
])
FGVC_SPLITS = ('train', 'val', 'test')


def _refuse_duplicate_keys(split_file: str):
    """A ``json.load`` ``object_pairs_hook`` that refuses an image listed twice
    (``json`` keeps the last value: the image would take its second label)."""

    def to_dict(pairs):
        mapping = {}
        for key, value in pairs:
            if key in mapping:
                raise InputValueError(f'{split_file}: image {key!r} is listed twice (labels '
                                      f'{mapping[key]!r} and {value!r}); each image needs '
                                      'one label')
            mapping[key] = value
        return mapping

    return to_dict


def check_fgvc(data_root: str, dataset: str, split: str) -> str:
    if dataset not in FGVC_DATASETS:
        raise InputValueError(f'unknown FGVC dataset {dataset!r}; expected one of '
                              f'{", ".join(FGVC_DATASETS)}')
    if split not in FGVC_SPLITS:
        raise InputValueError(f'unknown FGVC split {split!r}, expected one of {FGVC_SPLITS}')
    split_file = osp.join(data_root, f'{split}.json')
    if not osp.isfile(split_file):
        raise InputNotFoundError(f'FGVC split file not found: {split_file!r}')
    return split_file


def read_split(split_file: str) -> dict:
    """A split file's ``{image path: class id}`` object; a file that is not
    JSON (line and column), not UTF-8, nested too deeply, lists an image twice
    or is no object raises naming the file."""
    with open(split_file) as f:
        try:
            mapping = json.load(f, object_pairs_hook=_refuse_duplicate_keys(split_file))
        except json.JSONDecodeError as error:
            raise InputValueError(f'{split_file}:{error.lineno}:{error.colno}: not valid JSON '
                                  f'({error.msg}); the file may be truncated') from None
        except UnicodeDecodeError as error:
            raise InputValueError(f'{split_file}: not a UTF-8 text file ({error.reason} at '
                                  f'byte offset {error.start}); not a split file') from None
        except RecursionError:
            raise InputValueError(f'{split_file}: nested too deeply to parse; not a split '
                                  'file') from None
    if not isinstance(mapping, dict):
        raise InputValueError(f'{split_file}: expected a JSON object {{"image path": class '
                              f'id}}, got a {type(mapping).__name__}')
    return mapping


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
        self.split = split
        num_classes, default_prefix = FGVC_DATASETS[dataset]
        self.image_prefix = default_prefix if image_prefix is None else image_prefix
        metainfo = dict(metainfo or {})
        metainfo.setdefault('classes', tuple(str(i) for i in range(num_classes)))
        super().__init__(ann_file=self.split_file, data_root=data_root,
                         metainfo=metainfo, **kwargs)

    def load_data_list(self) -> List[dict]:
        """Read ``{image path: class id}``; invalid JSON (named with its line
        and column), a non-mapping, an image listed twice, a non-integer or
        out-of-range label, a missing or empty image, or an empty split raise
        naming the file. A train or val split that lists images of a later
        split (val, test) warns with the count and the first images."""
        mapping = read_split(self.split_file)
        if not mapping:
            raise InputValueError(f'{self.split_file}: the split lists no image')
        num_classes = len(self.metainfo['classes'])
        data_list = []
        for path, label in mapping.items():
            where = f'{self.split_file}, image {path!r}'
            if isinstance(label, bool) or not isinstance(label, int):
                raise InputValueError(f'{where}: label {label!r} is not an integer')
            if not 0 <= label < num_classes:
                raise InputValueError(f'{where}: label {label} is outside [0, {num_classes})')
            img_path = osp.join(self.data_root, self.image_prefix, path)
            try:
                check_image_file(img_path, where)
            except FileNotFoundError as error:
                raise InputNotFoundError(f'{error}{self._prefix_hint(path)}') from None
            data_list.append(dict(img_path=img_path, gt_label=label))
        self._warn_split_leaks(mapping)
        return data_list

    def _warn_split_leaks(self, mapping: dict) -> None:
        """Images of this split that a later split lists too (same path, after
        ``normpath``): the train split against val and test, val against test."""
        own = {osp.normpath(path): path for path in mapping}
        for other in FGVC_SPLITS[FGVC_SPLITS.index(self.split) + 1:]:
            other_file = osp.join(osp.dirname(self.split_file), f'{other}.json')
            if not osp.isfile(other_file):
                continue
            leaked = [own[key] for key in map(osp.normpath, read_split(other_file))
                      if key in own]
            if leaked:
                inflated = ('the test accuracy is inflated' if other == 'test' else
                            'the validation accuracy (and the best checkpoint chosen '
                            'by it) is inflated')
                warnings.warn(f'{self.split_file}: {len(leaked)} image(s) are also in '
                              f'the {other} split {other_file}, so {inflated}; the '
                              f'first: {", ".join(leaked[:5])}')

    def _prefix_hint(self, path: str) -> str:
        """What to change when a key repeats the image folder (``images/x.jpg``
        resolved to ``<data_root>/images/images/x.jpg``)."""
        prefix = self.image_prefix.strip('/')
        if not prefix or not path.startswith(prefix + '/'):
            return ''
        return (f'; the JSON keys are relative to {osp.join(self.data_root, prefix)!r} '
                f'(image_prefix={prefix!r}): drop the leading {prefix + "/"!r} from '
                "the keys, or set the data set's image_prefix=''")

    @staticmethod
    def preflight(cfg: dict) -> None:
        check_fgvc(cfg['data_root'], cfg['dataset'], cfg.get('split', 'train'))

    @staticmethod
    def num_classes(cfg: dict) -> int:
        """The classes a dataset config will have (its ``metainfo``'s, else the dataset's)."""
        classes = (cfg.get('metainfo') or {}).get('classes')
        return len(classes) if classes is not None else FGVC_DATASETS[cfg['dataset']][0]
