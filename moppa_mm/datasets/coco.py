"""mmdet's COCO data set, with the faults of an annotation file named at load.

mmdet's ``CocoDataset`` drops what it cannot use without a word: annotations
of a category the file does not define, boxes of zero width or height. A file
with no image or no annotation fails later with numpy's ``need at least one
array to concatenate``, and a truncated file with a bare ``JSONDecodeError``.
``CheckedCocoDataset`` parses the same way (it only subclasses) and, while the
file is loaded, raises or warns naming the file and the image / annotation id
(the list: docs/checks.md, "COCO annotation files").
"""
import json
import warnings
from collections import Counter, defaultdict
from typing import List, Optional

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import few
from .image_files import check_image_file


def _image_size_on_disk(path: str) -> Optional[tuple]:
    """(width, height) of the image as mmcv loads it, from the file's header
    only: an EXIF orientation of 5-8 (a rotated photo) swaps them, as OpenCV
    applies it. None when PIL cannot read the header (the loader names it)."""
    try:
        from PIL import Image
        with Image.open(path) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112, 1)
    except Exception:
        return None
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


@DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that refuses a broken annotation file (invalid JSON, no
    image, no annotation for training, unknown category ids, repeated
    annotation ids, only degenerate boxes, nothing left to train on or after
    filtering, a missing or empty image) and warns once, with counts and the
    first ids, about what mmdet would silently drop or misread (some lost
    annotations, short polygons, repeated image ids, image sizes that differ
    from the files)."""

    def load_data_list(self) -> List[dict]:
        self._category_ids = None  # the file's, once it is loaded
        self._num_annotations = self._num_trainable = 0
        # lost annotations by kind, and other faults: [(image id, annotation id, ...)]
        self._lost, self._faults = defaultdict(list), defaultdict(list)
        self._with_mask = any(getattr(t, 'with_mask', False)
                              for t in getattr(self.pipeline, 'transforms', []))
        try:
            data_list = super().load_data_list()
        except json.JSONDecodeError as error:
            raise InputValueError(f'{self.ann_file}:{error.lineno}:{error.colno}: not valid '
                                  f'JSON ({error.msg}); the file may be truncated') from None
        except RecursionError:
            raise InputValueError(f'{self.ann_file}: nested too deeply to parse; not a COCO '
                                  'annotation file') from None
        self._check_annotations(data_list)
        return data_list

    def _check_ids(self) -> None:
        """Once, on the raw lists: repeated image and annotation ids (the
        pycocotools index keeps one of each)."""
        dataset = self.coco.dataset
        counts = Counter(image.get('id') for image in dataset.get('images', []))
        self._faults['image id twice'] = [i for i, n in counts.items() if n > 1]
        counts = Counter(ann.get('id') for ann in dataset.get('annotations', []))
        repeated = [i for i, n in counts.items() if n > 1]
        if repeated:
            raise InputValueError(
                f'{self.ann_file}: {len(repeated)} annotation id(s) used more than once '
                f'({few(repeated)}); pycocotools keeps one annotation per id, so the '
                'others would be lost or counted twice')

    def parse_data_info(self, raw_data_info: dict) -> dict:
        if self._category_ids is None:
            self._category_ids = set(self.coco.cats)
            self._check_ids()
        img_info = raw_data_info['raw_img_info']
        for ann in raw_data_info['raw_ann_info']:
            self._num_annotations += 1
            self._classify(img_info, ann)
        data_info = super().parse_data_info(raw_data_info)
        check_image_file(data_info['img_path'], f'{self.ann_file}, image id {img_info["img_id"]}')
        on_disk = _image_size_on_disk(data_info['img_path'])
        in_file = (img_info.get('width'), img_info.get('height'))
        if on_disk is not None and on_disk != in_file:
            self._faults['size'].append((img_info['img_id'], in_file, on_disk))
        return data_info

    def _classify(self, img_info: dict, ann: dict) -> None:
        """Count what mmdet's parsing and ``LoadAnnotations`` will drop or
        ignore of this annotation; one that survives is trainable."""
        key = (img_info['img_id'], ann.get('id'))
        category_id = ann.get('category_id')
        if category_id not in self._category_ids:
            self._faults['unknown category'].append((*key, category_id))
        polygons = ann.get('segmentation')
        has_polygon = True
        if isinstance(polygons, list) or polygons is None:
            valid = [p for p in polygons or [] if isinstance(p, list) and len(p) >= 6
                     and len(p) % 2 == 0]
            if not polygons or len(valid) < len(polygons):
                self._faults['short polygon'].append(key)
            has_polygon = bool(valid)
        x, y, width, height = ann['bbox']
        inter_w = max(0, min(x + width, img_info['width']) - max(x, 0))
        inter_h = max(0, min(y + height, img_info['height']) - max(y, 0))
        if width <= 0 or height <= 0:
            self._faults['degenerate'].append(key)
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
        self._lost[kind].append(key)

    def _check_annotations(self, data_list: List[dict]) -> None:
        where, total, faults = self.ann_file, self._num_annotations, self._faults
        if not data_list:
            raise InputValueError(f'{where}: the annotation file lists no image')
        if total == 0:
            if not self.test_mode:
                raise InputValueError(f'{where}: the annotation file has no annotation for '
                                      f'its {len(data_list)} images')
            warnings.warn(f'{where}: no annotation for its {len(data_list)} images; '
                          'evaluation against this file will fail')
        if faults['unknown category']:
            img_id, ann_id, category_id = faults['unknown category'][0]
            raise InputValueError(
                f'{where}: {len(faults["unknown category"])} annotation(s) have a category_id '
                f"not in the file's categories {sorted(self._category_ids)}; the first: "
                f'image id {img_id}, annotation id {ann_id}, category_id {category_id}')
        problems = []
        if faults['degenerate']:
            img_id, ann_id = faults['degenerate'][0]
            message = (f'{where}: {len(faults["degenerate"])} of {total} boxes have width or '
                       f'height <= 0 (the first: image id {img_id}, annotation id {ann_id})')
            if len(faults['degenerate']) == total:
                raise InputValueError(message + '; every box is degenerate, so nothing would '
                                      'be learned')
            problems.append(message + '; mmdet skips them')
        lost = '; '.join(f'{len(keys)} {kind} (image id, annotation id: {few(keys)})'
                         for kind, keys in self._lost.items())
        if lost and self._num_trainable == 0 and not self.test_mode:
            raise InputValueError(f'{where}: none of its {total} annotations of the classes '
                                  f'{self.metainfo["classes"]} is left to train on: {lost}')
        if lost:
            problems.append(f'{where}: {sum(map(len, self._lost.values()))} of {total} '
                            f'annotations will not train: {lost}')
        if faults['short polygon']:
            problems.append(f'{where}: {len(faults["short polygon"])} annotations have an '
                            'empty polygon or one of fewer than 3 points, which mmdet drops '
                            f'(image id, annotation id: {few(faults["short polygon"])})')
        if faults['image id twice']:
            problems.append(f'{where}: {len(faults["image id twice"])} image id(s) listed '
                            f'more than once ({few(faults["image id twice"])}); pycocotools '
                            'keeps the last entry of each')
        if faults['size']:
            shown = ', '.join(f'{i}: {a[0]}x{a[1]} in the file, {b[0]}x{b[1]} loaded'
                              for i, a, b in faults['size'][:5])
            problems.append(f'{where}: {len(faults["size"])} image(s) whose width x height '
                            f'differ from the image file as loaded (image id {shown}); boxes '
                            'and masks will not match the pixels (an EXIF-rotated JPEG loads '
                            'rotated)')
        if problems:
            warnings.warn('\n'.join(problems))

    def filter_data(self) -> List[dict]:
        valid = super().filter_data()
        if self.data_list and not valid:
            raise InputValueError(
                f'{self.ann_file}: none of its {len(self.data_list)} images is left after '
                f'filtering ({self.filter_cfg}): no image has a usable annotation of the '
                f'classes {self.metainfo["classes"]}')
        return valid
