"""mmdet's COCO data set, with the faults of an annotation file named at load.

mmdet's ``CocoDataset`` drops what it cannot use without a word: annotations
of a category the file does not define, boxes of zero width or height. A file
with no image or no annotation fails later with numpy's ``need at least one
array to concatenate``, and a truncated file with a bare ``JSONDecodeError``.
``CheckedCocoDataset`` parses the same way (it only subclasses) and, while the
file is loaded, raises or warns naming the file and the image / annotation id.
"""
import json
import mmap
import os
import re
import warnings
from typing import List, Optional

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from .image_files import check_image_file


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that refuses a broken annotation file.

    Raises ``ValueError`` naming ``ann_file`` when the file is not valid JSON
    (with line and column), lists no image, has no annotation (training only;
    a test-dev file without annotations is fine for ``test_mode``), has an
    annotation whose ``category_id`` is not in its ``categories`` (the image
    and annotation ids are named), every box is degenerate (width or height
    <= 0), or no image is left after mmdet's filtering; raises naming the image
    id when an image file is missing or empty. Warns with a count when only
    some boxes are degenerate (mmdet skips those).
    """

    def load_data_list(self) -> List[dict]:
        self._known_category_ids = None
        self._num_annotations = 0
        self._degenerate = []  # (image id, annotation id)
        self._unknown_category = []  # (image id, annotation id, category id)
        try:
            data_list = super().load_data_list()
        except json.JSONDecodeError as error:
            raise ValueError(
                f'{self.ann_file}:{error.lineno}:{error.colno}: not valid JSON '
                f'({error.msg}); the file may be truncated') from None
        self._check_annotations(data_list)
        return data_list

    def parse_data_info(self, raw_data_info: dict) -> dict:
        if self._known_category_ids is None:
            self._known_category_ids = set(self.coco.cats)
        img_id = raw_data_info['raw_img_info']['img_id']
        for ann in raw_data_info['raw_ann_info']:
            self._num_annotations += 1
            if ann.get('category_id') not in self._known_category_ids:
                self._unknown_category.append(
                    (img_id, ann.get('id'), ann.get('category_id')))
            _, _, width, height = ann['bbox']
            if width <= 0 or height <= 0:
                self._degenerate.append((img_id, ann.get('id')))
        data_info = super().parse_data_info(raw_data_info)
        check_image_file(data_info['img_path'], f'{self.ann_file}, image id {img_id}')
        return data_info

    def _check_annotations(self, data_list: List[dict]) -> None:
        where = self.ann_file
        if not data_list:
            raise ValueError(f'{where}: the annotation file lists no image')
        if self._num_annotations == 0:
            if not self.test_mode:
                raise ValueError(f'{where}: the annotation file has no annotation '
                                 f'for its {len(data_list)} images')
            warnings.warn(f'{where}: no annotation for its {len(data_list)} '
                          'images; evaluation against this file will fail')
        if self._unknown_category:
            img_id, ann_id, category_id = self._unknown_category[0]
            raise ValueError(
                f'{where}: {len(self._unknown_category)} annotation(s) have a '
                f'category_id not in the file\'s categories '
                f'{sorted(self._known_category_ids)}; the first: image id '
                f'{img_id}, annotation id {ann_id}, category_id {category_id}')
        if self._degenerate:
            img_id, ann_id = self._degenerate[0]
            message = (f'{where}: {len(self._degenerate)} of '
                       f'{self._num_annotations} boxes have width or height <= 0 '
                       f'(the first: image id {img_id}, annotation id {ann_id})')
            if len(self._degenerate) == self._num_annotations:
                raise ValueError(message + '; every box is degenerate, so nothing '
                                 'would be learned')
            warnings.warn(message + '; mmdet skips them')

    def filter_data(self) -> List[dict]:
        valid = super().filter_data()
        if self.data_list and not valid:
            raise ValueError(
                f'{self.ann_file}: none of its {len(self.data_list)} images is '
                f'left after filtering ({self.filter_cfg}): no image has a usable '
                f'annotation of the classes {self.metainfo["classes"]}')
        return valid


# a COCO file's category list: its key (not inside a string, where a quote is
# escaped), then the list, parsed by ``json``
_CATEGORIES_KEY = b'"categories"'
_THEN_A_LIST = re.compile(rb'\s*:\s*(?=\[)')


def _is_category_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict) and 'id' in c and isinstance(c.get('name'), str)
        for c in value)


def _json_value_at(data: mmap.mmap, start: int):
    """The JSON value that starts at byte ``start`` of ``data``, parsed from a
    window that grows until the value fits (None if it never does)."""
    decoder = json.JSONDecoder()
    window = 1 << 16
    while True:
        text = data[start:start + window].decode('utf-8', errors='replace')
        try:
            return decoder.raw_decode(text)[0]
        except json.JSONDecodeError:
            if start + window >= len(data):
                return None
            window *= 8


def read_coco_categories(ann_file: str) -> Optional[List[dict]]:
    """The ``categories`` of a COCO annotation file, read without parsing the
    rest of it (COCO's train2017 file is 450 MB; the data set parses it once,
    when it is built).

    The file is mapped, not read, and searched from its end (where COCO files
    keep the list) for the key; the list is parsed by ``json`` alone (nothing
    is evaluated). Returns None when the file has no such list of ``{"id",
    "name", ...}`` objects that parses: the data set's own loader then names
    the fault.
    """
    with open(ann_file, 'rb') as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = len(data)
            while True:  # the last key that holds such a list, as json.load keeps
                key = data.rfind(_CATEGORIES_KEY, 0, end)
                if key < 0:
                    return None
                end = key
                then = _THEN_A_LIST.match(data, key + len(_CATEGORIES_KEY))
                if then is None or (key > 0 and data[key - 1:key] == b'\\'):
                    continue
                value = _json_value_at(data, then.end())
                if _is_category_list(value):
                    return value
