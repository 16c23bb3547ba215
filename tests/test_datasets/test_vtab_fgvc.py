import json
import os

import pytest

from moppa_mm.datasets import FGVC, VTAB_GROUPS, VTAB_TASKS, VTAB1k


def test_the_19_tasks_and_their_groups():
    assert len(VTAB_TASKS) == 19
    assert [len(g) for g in VTAB_GROUPS.values()] == [7, 4, 8]
    assert VTAB_TASKS['sun397'] == 397 and VTAB_TASKS['patch_camelyon'] == 2


def make_task(root, task, lines):
    os.makedirs(root / task / 'images' / 'train', exist_ok=True)
    for line in lines:  # the data set checks that each listed image is there
        (root / task / line.split()[0]).write_bytes(b'jpeg')
    (root / task / 'train800val200.txt').write_text('\n'.join(lines) + '\n')


def test_loads_the_vpt_layout(tmp_path):
    make_task(tmp_path, 'kitti', ['images/train/000001.jpg 3', 'images/train/000002.jpg 0'])
    ds = VTAB1k(str(tmp_path), 'kitti', lazy_init=False)
    assert len(ds) == 2
    assert ds.metainfo['classes'] == ('0', '1', '2', '3')
    assert ds.get_data_info(0)['img_path'] == str(tmp_path / 'kitti/images/train/000001.jpg')
    assert ds.get_data_info(0)['gt_label'] == 3


def test_bad_tasks_and_splits(tmp_path):
    with pytest.raises(ValueError, match="unknown VTAB-1K task 'cifar100'.*cifar, caltech101"):
        VTAB1k(str(tmp_path), 'cifar100')
    with pytest.raises(FileNotFoundError, match='task folder not found'):
        VTAB1k(str(tmp_path), 'dtd')
    make_task(tmp_path, 'dtd', ['images/train/1.jpg 0'])
    with pytest.raises(FileNotFoundError, match=r'dtd/test.txt'):
        VTAB1k(str(tmp_path), 'dtd', split='test')
    with pytest.raises(ValueError, match="split 'train1000'"):
        VTAB1k(str(tmp_path), 'dtd', split='train1000')


def test_fgvc_json_splits(tmp_path):
    for name in ('001.Albatross/a.jpg', '200.Wren/b.jpg'):
        os.makedirs(tmp_path / 'images' / os.path.dirname(name), exist_ok=True)
        (tmp_path / 'images' / name).write_bytes(b'jpeg')
    (tmp_path / 'train.json').write_text(json.dumps({'001.Albatross/a.jpg': 0,
                                                     '200.Wren/b.jpg': 199}))
    ds = FGVC(str(tmp_path), 'cub', 'train')
    assert len(ds) == 2
    assert ds.get_data_info(1)['img_path'] == str(tmp_path / 'images/200.Wren/b.jpg')
    (tmp_path / 'val.json').write_text(json.dumps({'x.jpg': 200}))
    with pytest.raises(ValueError, match='outside'):
        FGVC(str(tmp_path), 'cub', 'val')
    with pytest.raises(FileNotFoundError, match='test.json'):
        FGVC(str(tmp_path), 'cub', 'test')
    with pytest.raises(ValueError, match="unknown FGVC dataset 'cars'"):
        FGVC(str(tmp_path), 'cars', 'train')


def test_preflight_uses_the_dataset_class_from_the_registry(tmp_path):
    from mmengine.config import Config
    from preflight import check_config
    cfg = Config(dict(train_dataloader=dict(dataset=dict(
        type='VTAB1k', data_root=str(tmp_path), task='svhn10'))))
    with pytest.raises(ValueError, match="unknown VTAB-1K task 'svhn10'"):
        check_config(cfg)
    cfg.train_dataloader.dataset.task = 'svhn'
    with pytest.raises(FileNotFoundError, match='task folder not found'):
        check_config(cfg)


def test_preflight_reads_fgvc_dataset_name_as_an_argument(tmp_path):
    """FGVC's ``dataset='cub'`` is an argument, not a wrapped data set."""
    from preflight import load_config
    from preflight import check_config

    from tests.conftest import REPO
    cfg = load_config(f'{REPO}/configs/fgvc/moppa_vit-b-p16_in21k-pre_fgvc-cub.py')
    cfg.model.backbone.init_cfg.checkpoint = None
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = str(tmp_path)
    (tmp_path / 'train.json').write_text('{}')
    with pytest.raises(FileNotFoundError, match=r'FGVC split file not found: '
                                                r"'.*/val.json'"):
        check_config(cfg, mode='train')
    with pytest.raises(FileNotFoundError, match=r"'.*/test.json'"):
        check_config(cfg, mode='test')


def test_preflight_stops_a_head_smaller_than_the_task(tmp_path):
    """A child config that changes the task but not the head (or the other way
    round) would fail at the first batch with an IndexError naming no key."""
    from mmengine.config import Config
    from preflight import check_config
    make_task(tmp_path, 'eurosat', ['images/train/1.jpg 9'])
    cfg = Config(dict(model=dict(head=dict(num_classes=5)), train_dataloader=dict(
        dataset=dict(type='VTAB1k', data_root=str(tmp_path), task='eurosat'))))
    with pytest.raises(ValueError, match=r'model.head.num_classes = 5, but '
                       r'train_dataloader.dataset has 10 classes'):
        check_config(cfg)
    cfg.model.head.num_classes = 10
    check_config(cfg)
    cfg.model.head.num_classes = 3  # the dataset's own metainfo counts
    cfg.train_dataloader.dataset.metainfo = dict(classes=('a', 'b', 'c'))
    check_config(cfg)
    fgvc = Config(dict(model=dict(head=dict(num_classes=100)), train_dataloader=dict(
        dataset=dict(type='FGVC', data_root=str(tmp_path), dataset='cub'))))
    (tmp_path / 'train.json').write_text('{}')
    with pytest.raises(ValueError, match='num_classes = 100, but .* has 200 classes'):
        check_config(fgvc)


def test_fgvc_refuses_an_image_listed_twice(tmp_path):
    """``json`` keeps the last of two equal keys without a word: the image
    would train with its second label only."""
    (tmp_path / 'images').mkdir()
    (tmp_path / 'images' / 'a.jpg').write_bytes(b'jpeg')
    (tmp_path / 'train.json').write_text('{"a.jpg": 3, "a.jpg": 4}')
    with pytest.raises(ValueError, match=r"train.json: image 'a.jpg' is listed "
                                         r'twice \(labels 3 and 4\)'):
        FGVC(str(tmp_path), 'cub', 'train')


def test_fgvc_names_the_image_folder_a_key_repeats(tmp_path):
    """CUB's keys are relative to ``<data_root>/images/``: a key that starts
    with ``images/`` points at ``images/images/``; the error says what to change."""
    (tmp_path / 'images').mkdir()
    (tmp_path / 'images' / 'a.jpg').write_bytes(b'jpeg')
    (tmp_path / 'train.json').write_text(json.dumps({'images/a.jpg': 0}))
    with pytest.raises(FileNotFoundError, match=r"images/images/a.jpg'; the JSON "
                       r"keys are relative to '.*/images' .*drop the leading 'images/'"):
        FGVC(str(tmp_path), 'cub', 'train')
    assert len(FGVC(str(tmp_path), 'cub', 'train', image_prefix='')) == 1
