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
from collections import Counter
from typing import List, Optional

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from moppa_mm.utils.params import few
from .image_files import check_image_file


# how many ids a message lists
FIRST = 5


def _first(items) -> str:
    return few(items, FIRST)


def _image_size_on_disk(path: str) -> Optional[tuple]:
    """(width, height) of the image as mmcv loads it, from the file's header
    only (no pixel is decoded): an EXIF orientation of 5-8 (a rotated photo)
    swaps them, as OpenCV applies it. None when PIL cannot read the header
    (the loader then names the file)."""
    try:
        from PIL import Image
        with Image.open(path) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112, 1)
    except Exception:
        return None
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    return width, height


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that refuses a broken annotation file.

    Raises ``ValueError`` naming ``ann_file`` when the file is not valid JSON
    (with line and column), lists no image, has no annotation (training only;
    a test-dev file without annotations is fine for ``test_mode``), has an
    annotation whose ``category_id`` is not in its ``categories`` (the image
    and annotation ids are named), has two annotations with one id, every box
    is degenerate (width or height <= 0), no annotation is left to train on
    (training only: every one crowd, degenerate, outside its image, or, when
    the pipeline loads masks, without a polygon of 3 points or more), or no
    image is left after mmdet's filtering; raises naming the image id when an
    image file is missing or empty.

    Warns once, with counts and the first ids, when only some annotations are
    lost that way (mmdet skips or ignores them), when polygons have fewer than
    3 points or are empty, when image ids repeat (pycocotools keeps the last),
    and when an image's width / height in the file differ from the image file
    (read from its header; an EXIF-rotated JPEG loads rotated).
    """

    def load_data_list(self) -> List[dict]:
        self._known_category_ids = None
        self._num_annotations = 0
        self._degenerate = []  # (image id, annotation id)
        self._unknown_category = []  # (image id, annotation id, category id)
        # annotation faults: kind -> [(image id, annotation id)]
        self._lost = {}
        self._short_polygons = []
        self._num_trainable = 0
        self._size_mismatch = []  # (image id, (w, h) in the file, (w, h) on disk)
        self._duplicate_image_ids = []
        self._with_mask = self._pipeline_loads_masks()
        try:
            data_list = super().load_data_list()
        except json.JSONDecodeError as error:
            raise ValueError(
                f'{self.ann_file}:{error.lineno}:{error.colno}: not valid JSON '
                f'({error.msg}); the file may be truncated') from None
        except RecursionError:
            raise ValueError(f'{self.ann_file}: nested too deeply to parse; not a '
                             'COCO annotation file') from None
        self._check_annotations(data_list)
        return data_list

    def _pipeline_loads_masks(self) -> bool:
        transforms = getattr(self.pipeline, 'transforms', [])
        return any(getattr(t, 'with_mask', False) for t in transforms)

    def _check_ids(self) -> None:
        """Once, on the raw lists: repeated image and annotation ids (the
        pycocotools index keeps one of each)."""
        dataset = self.coco.dataset
        image_ids = Counter(image.get('id') for image in dataset.get('images', []))
        self._duplicate_image_ids = [i for i, n in image_ids.items() if n > 1]
        ann_ids = Counter(ann.get('id') for ann in dataset.get('annotations', []))
        repeated = [i for i, n in ann_ids.items() if n > 1]
        if repeated:
            raise ValueError(
                f'{self.ann_file}: {len(repeated)} annotation id(s) used more than '
                f'once ({_first(repeated)}); pycocotools keeps one annotation per '
                'id, so the others would be lost or counted twice')

    def parse_data_info(self, raw_data_info: dict) -> dict:
        if self._known_category_ids is None:
            self._known_category_ids = set(self.coco.cats)
            self._check_ids()
        img_info = raw_data_info['raw_img_info']
        img_id = img_info['img_id']
        for ann in raw_data_info['raw_ann_info']:
            self._num_annotations += 1
            self._classify(img_id, img_info, ann)
        data_info = super().parse_data_info(raw_data_info)
        check_image_file(data_info['img_path'], f'{self.ann_file}, image id {img_id}')
        on_disk = _image_size_on_disk(data_info['img_path'])
        in_file = (img_info.get('width'), img_info.get('height'))
        if on_disk is not None and on_disk != in_file:
            self._size_mismatch.append((img_id, in_file, on_disk))
        return data_info

    def _classify(self, img_id, img_info, ann) -> None:
        """Count what mmdet's parsing and ``LoadAnnotations`` will drop or
        ignore of this annotation; one that survives is trainable."""
        key = (img_id, ann.get('id'))
        category_id = ann.get('category_id')
        if category_id not in self._known_category_ids:
            self._unknown_category.append((*key, category_id))
        segmentation = ann.get('segmentation')
        has_polygon = True
        if isinstance(segmentation, list) or segmentation is None:
            polygons = segmentation or []
            valid = [p for p in polygons
                     if isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0]
            if len(valid) < len(polygons) or not polygons:
                self._short_polygons.append(key)
            has_polygon = bool(valid)
        x, y, width, height = ann['bbox']
        inter_w = max(0, min(x + width, img_info['width']) - max(x, 0))
        inter_h = max(0, min(y + height, img_info['height']) - max(y, 0))
        if width <= 0 or height <= 0:
            self._degenerate.append(key)
            return
        if ann.get('ignore', False):
            kind = 'marked ignore'
        elif inter_w * inter_h == 0:
            kind = 'box outside its image'
        elif ann.get('area', 1) <= 0 or width < 1 or height < 1:
            kind = 'area <= 0 or a side under 1 px'
        elif category_id not in self.cat_ids:
            return  # a category the config leaves out: dropped on purpose
        elif ann.get('iscrowd', False):
            kind = 'iscrowd=1 (ignored in training)'
        elif self._with_mask and not has_polygon:
            kind = 'no polygon of 3 points or more (instance ignored)'
        else:
            self._num_trainable += 1
            return
        self._lost.setdefault(kind, []).append(key)

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
        problems = []
        if self._degenerate:
            img_id, ann_id = self._degenerate[0]
            message = (f'{where}: {len(self._degenerate)} of '
                       f'{self._num_annotations} boxes have width or height <= 0 '
                       f'(the first: image id {img_id}, annotation id {ann_id})')
            if len(self._degenerate) == self._num_annotations:
                raise ValueError(message + '; every box is degenerate, so nothing '
                                 'would be learned')
            problems.append(message + '; mmdet skips them')
        lost = [f'{len(keys)} {kind} (image id, annotation id: {_first(keys)})'
                for kind, keys in self._lost.items()]
        if not self.test_mode and self._lost and self._num_trainable == 0:
            raise ValueError(
                f'{where}: none of its {self._num_annotations} annotations of the '
                f'classes {self.metainfo["classes"]} is left to train on: '
                + '; '.join(lost))
        if lost:
            problems.append(f'{where}: {sum(map(len, self._lost.values()))} of '
                            f'{self._num_annotations} annotations will not train: '
                            + '; '.join(lost))
        if self._short_polygons:
            problems.append(
                f'{where}: {len(self._short_polygons)} annotations have an empty '
                'polygon or one of fewer than 3 points, which mmdet drops (image '
                f'id, annotation id: {_first(self._short_polygons)})')
        if self._duplicate_image_ids:
            problems.append(
                f'{where}: {len(self._duplicate_image_ids)} image id(s) listed more '
                f'than once ({_first(self._duplicate_image_ids)}); pycocotools '
                'keeps the last entry of each')
        if self._size_mismatch:
            shown = ', '.join(f'{i}: {a[0]}x{a[1]} in the file, {b[0]}x{b[1]} loaded'
                              for i, a, b in self._size_mismatch[:FIRST])
            problems.append(
                f'{where}: {len(self._size_mismatch)} image(s) whose width x height '
                f'differ from the image file as loaded (image id {shown}); boxes '
                'and masks will not match the pixels (an EXIF-rotated JPEG loads '
                'rotated)')
        if problems:
            warnings.warn('\n'.join(problems))

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
