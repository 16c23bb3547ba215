"""The pre-training check of detection heads against the data set's classes:
a mismatch otherwise fails at the first iteration (IndexError in mmdet's
losses) or after a whole epoch (IndexError in CocoMetric.results2json)."""
import json

import pytest

from moppa_mm.datasets.coco import CheckedCocoDataset
from preflight import check_config, read_coco_categories  # tools/
from tests.conftest import logged_messages, tiny_detection_cfg

TWO = ('square', 'circle')  # of the demo's square, circle, triangle


def set_head_classes(cfg, num_classes):
    for head in cfg.model.roi_head.bbox_head:  # the three cascade stages
        head.num_classes = num_classes
    cfg.model.roi_head.mask_head.num_classes = num_classes


def set_classes(cfg, classes):
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.metainfo = dict(classes=classes)


def test_heads_smaller_than_the_data_set(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    check_config(cfg)
    set_head_classes(cfg, 2)
    heads = (r'model.roi_head.bbox_head\[0\].num_classes = 2, '
             r'model.roi_head.bbox_head\[1\].num_classes = 2, '
             r'model.roi_head.bbox_head\[2\].num_classes = 2, '
             r'model.roi_head.mask_head.num_classes = 2, ')
    with pytest.raises(ValueError, match=heads + r'but train_dataloader.dataset has 3 '
                       r"classes \('square', 'circle', 'triangle'; "
                       r'train_dataloader.dataset.metainfo.classes\).*Set those '
                       r'num_classes to 3'):
        check_config(cfg)
    with pytest.raises(ValueError, match=heads + 'but test_dataloader.dataset has 3'):
        check_config(cfg, mode='test')


def test_a_class_subset_needs_heads_of_its_size(shapes_data, tmp_path):
    """Training on some of a file's categories is mmdet's documented way (it
    drops the others' annotations); heads still sized for all of them are not."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    set_classes(cfg, TWO)
    with pytest.raises(ValueError, match=r'model.roi_head.bbox_head\[2\].num_classes = 3'
                       r".*but train_dataloader.dataset has 2 classes \('square', "
                       r"'circle'; .*or the data set's metainfo=dict\(classes=...\)"):
        check_config(cfg)
    set_head_classes(cfg, 2)
    with logged_messages() as messages:
        check_config(cfg)
    log = '\n'.join(messages)
    assert 'train_dataloader.dataset: the classes are 2 of the 3 categories of ' in log
    assert 'leaves out the annotations of the others: triangle' in log


def test_without_metainfo_the_data_set_class_names_the_classes(shapes_data, tmp_path):
    """CocoDataset without ``metainfo`` takes COCO's 80 classes: none is a
    category of the demo's file."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.pop('metainfo')
    with pytest.raises(ValueError, match=r'num_classes = 3, but train_dataloader.dataset '
                       r"has 80 classes \('person', .*CheckedCocoDataset.METAINFO, "
                       r'as train_dataloader.dataset sets no metainfo'):
        check_config(cfg)
    set_head_classes(cfg, 80)
    with pytest.raises(ValueError, match=r"the classes \('person', .* name 'person', "
                       r"'bicycle', .*\(80 in all\), which the file does not define.*"
                       r"train.json defines the categories 'square', 'circle', 'triangle'"):
        check_config(cfg)


class CocoWithoutClasses(CheckedCocoDataset):
    METAINFO = {}


def test_without_any_class_list_the_file_names_the_classes(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.pop('metainfo')
        cfg[key].dataset.type = CocoWithoutClasses
    check_config(cfg)
    set_head_classes(cfg, 2)
    with pytest.raises(ValueError, match=r"has 3 classes \('square', 'circle', 'triangle'; "
                       r'the categories of .*annotations/train.json\)'):
        check_config(cfg)


def test_classes_must_be_categories_of_the_file_in_its_order(shapes_data, tmp_path):
    """mmdet numbers the labels in the file's order and finds a class by its
    name: a misspelt name or another order would train quietly with names
    and labels that do not match."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    set_classes(cfg, ('square', 'circle', 'triangel'))
    with pytest.raises(ValueError, match=r"name 'triangel', which the file does not "
                       r'define.*annotations/train.json defines the categories'):
        check_config(cfg)
    set_classes(cfg, ('circle', 'square', 'triangle'))
    with pytest.raises(ValueError, match="in another order than the file's"):
        check_config(cfg)
    set_classes(cfg, ('square', 'square', 'triangle'))
    with pytest.raises(ValueError, match="name 'square' twice"):
        check_config(cfg)


def coco_file(path, categories, first=False, images=()):
    body = dict(images=list(images), annotations=[])
    data = dict(categories=categories, **body) if first else dict(body, categories=categories)
    path.write_text(json.dumps(data))
    return str(path)


def test_read_coco_categories_without_parsing_the_rest(tmp_path):
    cats = [dict(id=1, name='a'), dict(id=7, name='b')]
    # a file name holding the key's text is inside a string: not the list
    decoy = [dict(id=1, file_name='"categories": [{"id": 3, "name": "x"}]')]
    assert read_coco_categories(coco_file(tmp_path / '1.json', cats, images=decoy)) == cats
    assert read_coco_categories(coco_file(tmp_path / '2.json', cats, first=True,
                                          images=decoy * 20000)) == cats
    # keys of the same name that hold no category list, after the real one
    (tmp_path / 'other.json').write_text(json.dumps(dict(
        categories=cats, info={'categories': 'none'}, licenses=[{'categories': [1, 2]}],
        extra={'x"categories': [{'id': 1, 'name': 'no'}]})))
    assert read_coco_categories(str(tmp_path / 'other.json')) == cats
    (tmp_path / 'none.json').write_text('{"images": [], "annotations": []}')
    assert read_coco_categories(str(tmp_path / 'none.json')) is None
    (tmp_path / 'cut.json').write_text('{"categories": [{"id": 1, "name": "a"')
    assert read_coco_categories(str(tmp_path / 'cut.json')) is None
    (tmp_path / 'empty.json').write_text('')
    assert read_coco_categories(str(tmp_path / 'empty.json')) is None
