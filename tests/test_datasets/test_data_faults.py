"""Faults in the data a user hands us are named (file and line, or image and
annotation id) when the data set loads, before any training step."""
import json
import shutil
import warnings

import pytest

from moppa_mm.datasets import FGVC, CheckedCocoDataset, VTAB1k


def write_task(root, task, split, lines, images=('a.jpg', 'b.jpg')):
    folder = root / task / 'images'
    folder.mkdir(parents=True, exist_ok=True)
    for name in images:
        (folder / name).write_bytes(b'not empty')  # only the size is checked
    (root / task / f'{split}.txt').write_text(''.join(line + '\n' for line in lines))


@pytest.mark.parametrize('line, message', [
    ('images/b.jpg', r'train800val200.txt:2: expected "<image path> <label>", '
                     r"got 'images/b.jpg'"),
    ('images/b.jpg 1 extra', r'train800val200.txt:2: expected "<image path> <label>"'),
    ('images/b.jpg one', r"train800val200.txt:2: label 'one' is not an integer"),
    ('images/b.jpg 1.0', r"train800val200.txt:2: label '1.0' is not an integer"),
    ('images/b.jpg 4', r'train800val200.txt:2: label 4 is outside \[0, 4\)'),
    ('images/b.jpg -1', r'train800val200.txt:2: label -1 is outside \[0, 4\)'),
])
def test_vtab_malformed_lines_name_file_and_line(tmp_path, line, message):
    write_task(tmp_path, 'kitti', 'train800val200', ['images/a.jpg 0', line])
    with pytest.raises(ValueError, match=message):
        VTAB1k(str(tmp_path), 'kitti')


def test_vtab_label_out_of_range_in_the_test_split_is_not_counted(tmp_path):
    write_task(tmp_path, 'kitti', 'test', ['images/a.jpg 3', '', 'images/b.jpg 7'])
    with pytest.raises(ValueError, match=r'kitti/test.txt:3: label 7 is outside '
                                         r"\[0, 4\) for VTAB-1K task 'kitti'"):
        VTAB1k(str(tmp_path), 'kitti', split='test')


def test_vtab_empty_split(tmp_path):
    write_task(tmp_path, 'dtd', 'test', [''])
    with pytest.raises(ValueError, match=r'dtd/test.txt: the split lists no image'):
        VTAB1k(str(tmp_path), 'dtd', split='test')


def test_vtab_empty_or_missing_image_names_path_and_line(tmp_path):
    write_task(tmp_path, 'dtd', 'test', ['images/a.jpg 0', 'images/b.jpg 1'])
    (tmp_path / 'dtd/images/b.jpg').write_bytes(b'')
    with pytest.raises(ValueError, match=r'dtd/test.txt:2: image file is empty '
                                         r"\(0 bytes\): '.*dtd/images/b.jpg'"):
        VTAB1k(str(tmp_path), 'dtd', split='test')
    (tmp_path / 'dtd/images/b.jpg').unlink()
    with pytest.raises(FileNotFoundError, match=r"dtd/test.txt:2: image not found: "
                                                r"'.*dtd/images/b.jpg'"):
        VTAB1k(str(tmp_path), 'dtd', split='test')


def write_fgvc(root, text, images=('x/a.jpg', 'x/b.jpg')):
    for name in images:
        path = root / 'images' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b'not empty')
    (root / 'train.json').write_text(text)


def test_fgvc_truncated_json_names_file_line_and_column(tmp_path):
    write_fgvc(tmp_path, '{"x/a.jpg": 0,\n "x/b.jpg": ')
    with pytest.raises(ValueError, match=r'train.json:2:\d+: not valid JSON '
                                         r'\(Expecting value\); the file may be '
                                         r'truncated'):
        FGVC(str(tmp_path), 'cub', 'train')


@pytest.mark.parametrize('text, message', [
    ('{}', r'train.json: the split lists no image'),
    ('["x/a.jpg", 0]', r'train.json: expected a JSON object'),
    ('{"x/a.jpg": "3"}', r"train.json, image 'x/a.jpg': label '3' is not an integer"),
    ('{"x/a.jpg": 2.5}', r"train.json, image 'x/a.jpg': label 2.5 is not an integer"),
    ('{"x/a.jpg": 1, "x/b.jpg": 200}', r"image 'x/b.jpg': label 200 is outside "
                                       r'\[0, 200\)'),
])
def test_fgvc_bad_splits(tmp_path, text, message):
    write_fgvc(tmp_path, text)
    with pytest.raises(ValueError, match=message):
        FGVC(str(tmp_path), 'cub', 'train')


def test_fgvc_empty_image_is_named(tmp_path):
    write_fgvc(tmp_path, '{"x/a.jpg": 0, "x/b.jpg": 1}')
    (tmp_path / 'images/x/b.jpg').write_bytes(b'')
    with pytest.raises(ValueError, match=r"train.json, image 'x/b.jpg': image file "
                                         r"is empty \(0 bytes\): '.*images/x/b.jpg'"):
        FGVC(str(tmp_path), 'cub', 'train')


@pytest.fixture
def coco(shapes_data, tmp_path):
    """A copy of the generated shapes' train split whose json a test edits."""
    root = tmp_path / 'coco'
    shutil.copytree(shapes_data['root'] + '/train', root / 'train')
    (root / 'annotations').mkdir()
    with open(shapes_data['train']) as f:
        annotations = json.load(f)
    return root, annotations


def load_coco(root, annotations=None, text=None, test_mode=False):
    path = root / 'annotations' / 'train.json'
    path.write_text(json.dumps(annotations) if text is None else text)
    return CheckedCocoDataset(
        data_root=str(root), ann_file='annotations/train.json',
        data_prefix=dict(img='train/'), test_mode=test_mode,
        metainfo=dict(classes=('square', 'circle', 'triangle')),
        filter_cfg=dict(filter_empty_gt=True, min_size=32), pipeline=[])


def test_coco_good_file_loads(coco):
    root, annotations = coco
    assert len(load_coco(root, annotations)) == len(annotations['images'])


def test_coco_truncated_json_names_file_line_and_column(coco):
    root, annotations = coco
    text = json.dumps(annotations, indent=1)
    with pytest.raises(ValueError, match=r'annotations/train.json:\d+:\d+: not valid '
                                         r'JSON .*truncated'):
        load_coco(root, text=text[:len(text) // 2])


def test_coco_no_image_or_no_annotation(coco):
    root, annotations = coco
    with pytest.raises(ValueError, match=r'train.json: the annotation file lists no '
                                         r'image'):
        load_coco(root, dict(annotations, images=[], annotations=[]))
    num_images = len(annotations['images'])
    with pytest.raises(ValueError, match=rf'train.json: the annotation file has no '
                                         rf'annotation for its {num_images} images'):
        load_coco(root, dict(annotations, annotations=[]))
    with pytest.warns(UserWarning, match='evaluation against this file will fail'):
        load_coco(root, dict(annotations, annotations=[]), test_mode=True)


def test_coco_unknown_category_names_image_and_annotation(coco):
    root, annotations = coco
    bad = annotations['annotations'][1]
    bad['category_id'] = 99
    with pytest.raises(ValueError, match=rf"1 annotation\(s\) have a category_id not "
                                         rf"in the file's categories \[1, 2, 3\]; the "
                                         rf"first: image id {bad['image_id']}, "
                                         rf"annotation id {bad['id']}, category_id 99"):
        load_coco(root, annotations)


def test_coco_degenerate_boxes_warn_with_a_count_or_stop_when_all(coco):
    root, annotations = coco
    anns = annotations['annotations']
    anns[0]['bbox'][2] = 0.0
    with pytest.warns(UserWarning, match=rf'1 of {len(anns)} boxes have width or '
                                         rf"height <= 0 \(the first: image id "
                                         rf"{anns[0]['image_id']}, annotation id "
                                         rf"{anns[0]['id']}\); mmdet skips them"):
        load_coco(root, annotations)
    for ann in anns:
        ann['bbox'][3] = -1.0
    with pytest.raises(ValueError, match=rf'{len(anns)} of {len(anns)} boxes .*every '
                                         r'box is degenerate'):
        load_coco(root, annotations)


def test_coco_empty_or_missing_image_names_the_image_id(coco):
    root, annotations = coco
    image = annotations['images'][1]
    (root / 'train' / image['file_name']).write_bytes(b'')
    with pytest.raises(ValueError, match=rf"train.json, image id {image['id']}: image "
                                         rf"file is empty \(0 bytes\): "
                                         rf"'.*train/{image['file_name']}'"):
        load_coco(root, annotations)
    (root / 'train' / image['file_name']).unlink()
    with pytest.raises(FileNotFoundError, match=rf"image id {image['id']}: image not "
                                                rf'found'):
        load_coco(root, annotations)


def test_coco_nothing_left_after_filtering_is_named(coco):
    root, annotations = coco
    annotations['categories'].append(dict(id=4, name='hexagon'))
    for ann in annotations['annotations']:
        ann['category_id'] = 4  # a known category, but not one of the classes
    with pytest.raises(ValueError, match=r'train.json: none of its \d+ images is '
                                         r'left after filtering'):
        load_coco(root, annotations)


def test_preflight_names_a_missing_evaluator_annotation_file(tmp_path):
    from mmengine.config import Config
    from preflight import check_config
    missing = str(tmp_path / 'instances_val2017.json')
    cfg = Config(dict(val_dataloader=dict(dataset=dict(type='CocoDataset')),
                      val_cfg=dict(), val_evaluator=dict(type='CocoMetric',
                                                         ann_file=missing),
                      test_evaluator=[dict(type='CocoMetric', ann_file=missing)]))
    with pytest.raises(FileNotFoundError, match=r'annotation file not found: '
                                                r"val_evaluator.ann_file = '.*val2017"):
        check_config(cfg, mode='train')
    with pytest.raises(FileNotFoundError, match=r'test_evaluator\[0\].ann_file'):
        check_config(cfg, mode='test')


def test_coco_repeated_ids(coco):
    root, annotations = coco
    anns, images = annotations['annotations'], annotations['images']
    anns[1]['id'] = anns[0]['id']
    with pytest.raises(ValueError, match=rf"train.json: 1 annotation id\(s\) used more "
                                         rf"than once \({anns[0]['id']}\)"):
        load_coco(root, annotations)
    anns[1]['id'] = max(a['id'] for a in anns) + 1
    images.append(dict(images[0]))
    with pytest.warns(UserWarning, match=rf"1 image id\(s\) listed more than once "
                                         rf"\({images[0]['id']}\)"):
        load_coco(root, annotations)


def test_coco_nested_too_deeply_names_the_file(coco):
    root, _ = coco
    with pytest.raises(ValueError, match=r'train.json: nested too deeply'):
        load_coco(root, text='[' * 100000 + ']' * 100000)


def test_vtab_repeated_train_lines_and_test_leaks_warn(tmp_path):
    images = ('a.jpg', 'b.jpg', 'c.jpg')
    write_task(tmp_path, 'dtd', 'test', ['images/c.jpg 2'], images=images)
    write_task(tmp_path, 'dtd', 'train800val200',
               ['images/a.jpg 0', 'images/b.jpg 1', 'images/a.jpg 0', 'images/c.jpg 2'],
               images=images)
    with pytest.warns(UserWarning) as record:
        VTAB1k(str(tmp_path), 'dtd')
    messages = '\n'.join(str(w.message) for w in record)
    assert 'train800val200.txt: 1 line(s) repeat an image of the split (it counts ' \
           'twice); the first: line 3: images/a.jpg (first on line 1)' in messages
    assert '1 image(s) are also in the test split' in messages
    assert 'images/c.jpg (train800val200.txt:4, test.txt:1)' in messages


def test_fgvc_images_shared_between_splits_warn(tmp_path):
    images = ('x/a.jpg', 'x/b.jpg', 'x/c.jpg', 'x/d.jpg')
    write_fgvc(tmp_path, '{"x/a.jpg": 0, "x/b.jpg": 1, "x/c.jpg": 2}', images=images)
    (tmp_path / 'val.json').write_text('{"x/b.jpg": 1, "x/d.jpg": 3}')
    (tmp_path / 'test.json').write_text('{"./x/c.jpg": 2, "x/d.jpg": 3}')
    with pytest.warns(UserWarning) as record:
        FGVC(str(tmp_path), 'cub', 'train')
    messages = '\n'.join(str(w.message) for w in record)
    assert '1 image(s) are also in the val split' in messages
    assert 'validation accuracy (and the best checkpoint chosen by it) is ' \
           'inflated; the first: x/b.jpg' in messages
    assert '1 image(s) are also in the test split' in messages
    assert 'the test accuracy is inflated; the first: x/c.jpg' in messages
    with pytest.warns(UserWarning, match=r'val.json: 1 image\(s\) are also in the '
                                         r'test split .*test.json.*the first: x/d.jpg'):
        FGVC(str(tmp_path), 'cub', 'val')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        FGVC(str(tmp_path), 'cub', 'test')


def test_vtab_split_that_is_not_text_names_file_and_line(tmp_path):
    write_task(tmp_path, 'dtd', 'test', ['images/a.jpg 0'])
    with open(tmp_path / 'dtd/test.txt', 'ab') as f:
        f.write(b'images/b.jpg \xff\xfe1\n')
    with pytest.raises(ValueError, match=r'dtd/test.txt:2: not UTF-8 text \(invalid '
                                         r'start byte at column 14\)'):
        VTAB1k(str(tmp_path), 'dtd', split='test')


@pytest.mark.parametrize('text, message', [
    (b'{"x/a.jpg": 0, "x/b.jpg\xff": 1}',
     r'train.json: not a UTF-8 text file \(invalid start byte at byte offset 23\)'),
    (b'{"x/a.jpg": ' + b'[' * 100000 + b']' * 100000 + b'}',
     r'train.json: nested too deeply to parse; not a split file'),
])
def test_fgvc_split_that_is_not_text_or_too_deep_names_the_file(tmp_path, text, message):
    write_fgvc(tmp_path, '')
    (tmp_path / 'train.json').write_bytes(text)
    with pytest.raises(ValueError, match=message):
        FGVC(str(tmp_path), 'cub', 'train')
