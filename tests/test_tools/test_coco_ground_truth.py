"""COCO ground truth that would be dropped without a word is named through
``tools/train.py`` (the MoPPA detector's ``CheckedCocoDataset``): nothing left
to train on stops the run; some of it lost warns once, with counts and ids."""
import json
import os.path as osp
import shutil
import subprocess

from PIL import Image

from tests.conftest import PYTHON, REPO, child_env, dump_cfg, tiny_detection_cfg


def copy_shapes(shapes_data, tmp_path):
    root = tmp_path / 'data'
    shutil.copytree(shapes_data['root'], root)
    data = dict(shapes_data, root=str(root), val=str(root / 'annotations/val.json'))
    with open(root / 'annotations/train.json') as f:
        return data, json.load(f)


def train_on(data, annotations, tmp_path):
    with open(osp.join(data['root'], 'annotations/train.json'), 'w') as f:
        json.dump(annotations, f)
    cfg = tiny_detection_cfg(data, tmp_path / 'work', max_iters=1)
    config = dump_cfg(cfg, tmp_path / 'tiny.py')
    return subprocess.run([PYTHON, 'tools/train.py', config], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=600)


def test_every_annotation_crowd_stops(shapes_data, tmp_path):
    data, annotations = copy_shapes(shapes_data, tmp_path)
    for ann in annotations['annotations']:
        ann['iscrowd'] = 1
    run = train_on(data, annotations, tmp_path)
    assert run.returncode != 0
    assert 'train.json: none of its' in run.stderr and 'is left to train on' in run.stderr
    assert 'iscrowd=1' in run.stderr, run.stderr[-3000:]


def test_every_polygon_under_three_points_stops(shapes_data, tmp_path):
    data, annotations = copy_shapes(shapes_data, tmp_path)
    for ann in annotations['annotations']:
        ann['segmentation'] = [ann['segmentation'][0][:4]]  # 2 points
    run = train_on(data, annotations, tmp_path)
    assert run.returncode != 0
    assert 'is left to train on' in run.stderr, run.stderr[-3000:]
    assert 'no polygon of 3 points or more' in run.stderr


def test_some_lost_ground_truth_warns_once_with_counts_and_ids(shapes_data, tmp_path):
    data, annotations = copy_shapes(shapes_data, tmp_path)
    images, anns = annotations['images'], annotations['annotations']
    anns[0]['iscrowd'] = 1
    anns[1]['segmentation'] = [[1, 1, 2, 2]]
    anns[2]['bbox'] = [500.0, 500.0, 10.0, 10.0]  # outside the 96 px image
    # image 0 stored 96x64 with EXIF orientation 6: it loads 64x96, not as the
    # file's 96x64 says
    image = images[0]
    path = osp.join(data['root'], 'train', image['file_name'])
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new('RGB', (96, 64), (90, 20, 20)).save(path, exif=exif)
    image.update(width=96, height=64)
    run = train_on(data, annotations, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stderr
    assert out.count('annotations will not train') == 1  # one warning
    assert f'3 of {len(anns)} annotations will not train' in out, out[-3000:]
    assert f"1 iscrowd=1 (ignored in training) (image id, annotation id: " \
           f"({anns[0]['image_id']}, {anns[0]['id']}))" in out
    assert f"1 box outside its image (image id, annotation id: " \
           f"({anns[2]['image_id']}, {anns[2]['id']}))" in out
    assert '1 annotations have an empty polygon or one of fewer than 3 points' in out
    assert f"image id {image['id']}: 96x64 in the file, 64x96 loaded" in out
