"""Plug-and-play: MMDetection's and MMPretrain's own packaged configs, with only
``custom_imports`` and the backbone type changed, trained and tested with the
**upstream** ``tools/train.py`` / ``tools/test.py`` (and ``mim train``): the
method is the backbone's, so no hook is needed.

The user's two lines are a child config of the packaged one (``USER_LINES``);
the tests add a second child that only makes the run tiny (a small Swin / ViT
of the demo's pre-trained format, the generated shapes / VTAB-format data,
two epochs).
"""
import glob
import json
import math
import os
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch

from demo.coco_shapes import prepare_demo
from demo.vtab_task import prepare_cls_demo
from model_converters.vit_to_mmpretrain import convert, save_backbone
from moppa_mm.models import read_adapter_record
from tests.conftest import REPO, VTAB_DEMO_DATA, child_env

MMDET_TOOLS = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim', 'tools')
MMPRETRAIN_TOOLS = osp.join(osp.dirname(__import__('mmpretrain').__file__), '.mim',
                            'tools')
MIM = osp.join(osp.dirname(sys.executable), 'mim')

USER_LINES = """_base_ = {base!r}
custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)
model = dict(backbone=dict(type={backbone!r}))
"""

TINY_SWIN = """
_base_ = './user.py'
model = dict(
    backbone=dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                  drop_path_rate=0.0, init_cfg=dict(checkpoint={pretrained!r})),
    neck=dict(in_channels={neck_in}))
classes = ('square', 'circle', 'triangle')
pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask={masks}),
    dict(type='Resize', scale=(96, 96), keep_ratio=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape',
                                          'img_shape', 'scale_factor')),
]
loader = dict(batch_size=2, num_workers=0, persistent_workers=False)
train_dataloader = dict(**loader, dataset=dict(
    data_root={root!r}, ann_file='annotations/train.json', data_prefix=dict(img='train/'),
    metainfo=dict(classes=classes), pipeline=pipeline))
val_dataloader = dict(**loader, dataset=dict(
    data_root={root!r}, ann_file='annotations/val.json', data_prefix=dict(img='val/'),
    metainfo=dict(classes=classes), pipeline=pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file={root!r} + 'annotations/val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=2, val_interval=2)
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
log_processor = dict(window_size=1)
randomness = dict(seed=0)
"""

TINY_RETINANET = """_base_ = './tiny.py'
model = dict(bbox_head=dict(num_classes=3, in_channels=64, feat_channels=64),
             neck=dict(out_channels=64),
             test_cfg=dict(score_thr=0.0, max_per_img=20))  # boxes after 4 steps
"""
TINY_MASK_RCNN = """_base_ = './tiny.py'
model = dict(
    neck=dict(out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=64, num_classes=3),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=3)),
    test_cfg=dict(rpn=dict(nms_pre=100, max_per_img=50),
                  rcnn=dict(score_thr=0.0, max_per_img=20)))  # boxes after 4 steps
"""

TINY_VIT = """
_base_ = './user.py'
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=4,
                            feedforward_channels=64),
                  img_size=32, patch_size=8, drop_path_rate=0.0,
                  init_cfg=dict(_delete_=True, type='Pretrained', checkpoint={pretrained!r},
                                prefix='backbone.')),
    head=dict(num_classes=10, in_channels=32),
    init_cfg=None, train_cfg=None)
""" + VTAB_DEMO_DATA + """
optim_wrapper = dict(optimizer=dict(lr=1e-2), clip_grad=None)
train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=2)
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
log_processor = dict(window_size=1)
randomness = dict(seed=0)
"""

DETECTION = {
    'mask_rcnn': ('mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
                  [32, 64, 128, 256], True, TINY_MASK_RCNN, 'coco/segm_mAP'),
    'retinanet': ('mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
                  [64, 128, 256], False, TINY_RETINANET, 'coco/bbox_mAP'),
}
VIT_BASE = 'mmpretrain::vision_transformer/vit-base-p16_64xb64_in1k-384px.py'


def run(args, cwd=REPO, timeout=900):
    result = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def scalars(work_dir):
    paths = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    assert paths, f'no scalars under {work_dir}'
    with open(paths[-1]) as f:
        return [json.loads(line) for line in f]


def metrics_of_test(work_dir):
    paths = sorted(glob.glob(osp.join(work_dir, '*', '*.json')))
    assert paths, f'no test metrics under {work_dir}'
    with open(paths[-1]) as f:
        return json.load(f)


def write_configs(tmp_path, base, backbone, tiny, heads=None):
    """user.py: the user's two lines; tiny.py (and heads.py): the test's."""
    (tmp_path / 'user.py').write_text(USER_LINES.format(base=base, backbone=backbone))
    (tmp_path / 'tiny.py').write_text(tiny)
    if heads is None:
        return str(tmp_path / 'tiny.py')
    (tmp_path / 'heads.py').write_text(heads)
    return str(tmp_path / 'heads.py')


def assert_trained_the_method(work_dir, metric, epochs=2):
    """loss_route logged every iteration, with the paper's decay over epochs
    (w = 1: T = 0 -> 1, T = 1 of 2 -> 0); adapter-only checkpoints that load
    with weights_only=True and record their adapter; the base stayed frozen."""
    lines = scalars(work_dir)
    train = [line for line in lines if 'loss_route' in line]
    assert train, 'loss_route was never logged'
    by_epoch = {}
    for line in train:
        by_epoch.setdefault(line['epoch'], []).append(line)
    assert sorted(by_epoch) == list(range(1, epochs + 1))
    assert all(math.isclose(line['loss_route'], math.log(1 / 3), rel_tol=0.05)
               for line in by_epoch[1])  # about uniform early on, weight 1
    assert all(line['loss_route'] == 0 for line in by_epoch[2])  # weight 0
    assert all(line['route_weight'] == 1.0 for line in by_epoch[1])
    ckpts = [osp.join(work_dir, f'epoch_{e}.pth') for e in (1, epochs)]
    first, last = (torch.load(c, weights_only=True, map_location='cpu') for c in ckpts)
    state = last['state_dict']
    record = read_adapter_record(state)
    assert record['format'] == 'moppa_mm.adapter/1' and record['base']['fingerprint']
    assert record['heads'], 'the head shapes are recorded'
    base_keys = [k for k in state if k.startswith('backbone.') and not any(
        tag in k for tag in ('.moppa.', '.conv_adapter.', 'ssf_', '_extra_state'))]
    assert base_keys == [], base_keys[:5]  # adapter-only
    moved = [k for k in state if '.moppa.' in k
             and not torch.equal(first['state_dict'][k], state[k])]
    assert moved, 'the MoPPA units did not train'
    values = [line for line in lines if metric in line]
    assert values, f'no {metric} logged'
    return values[-1]


def detection_configs(tmp_path, name, shapes):
    base, neck_in, masks, heads, _ = DETECTION[name]
    tiny = TINY_SWIN.format(pretrained=shapes['pretrained'], neck_in=neck_in,
                            masks=masks, root=shapes['root'])
    return write_configs(tmp_path, base, 'MoPPASwinTransformer', tiny, heads)


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('shapes'))
    paths = prepare_demo(root, num_train=4, num_val=2, size=96)
    return dict(root=root + '/', pretrained=paths['pretrained'])


@pytest.mark.parametrize('name', sorted(DETECTION))
def test_mmdet_config_with_two_lines_trains_and_tests_upstream(name, shapes, tmp_path):
    config = detection_configs(tmp_path, name, shapes)
    metric = DETECTION[name][-1]
    work = str(tmp_path / 'work')
    run([sys.executable, osp.join(MMDET_TOOLS, 'train.py'), config, '--work-dir', work])
    val = assert_trained_the_method(work, metric)
    # the upstream test tool reproduces the last validation from the adapter-only
    # checkpoint (the backbone loaded its base from init_cfg when built)
    run([sys.executable, osp.join(MMDET_TOOLS, 'test.py'), config,
         osp.join(work, 'epoch_2.pth'), '--work-dir', str(tmp_path / 'test')])
    tested = metrics_of_test(str(tmp_path / 'test'))
    keys = [k for k in val if k.startswith('coco/')]
    assert keys and all(tested[k] == val[k] for k in keys), (tested, val)


def test_mmpretrain_vit_config_with_two_lines_trains_and_tests_upstream(tmp_path):
    data = prepare_cls_demo(str(tmp_path / 'vtab'))
    pretrained = save_backbone(convert(data['mae_checkpoint'], 'mae'),
                               str(tmp_path / 'vit_mmpretrain.pth'))
    tiny = TINY_VIT.format(pretrained=pretrained, root=str(tmp_path / 'vtab'))
    config = write_configs(tmp_path, VIT_BASE, 'MoPPAVisionTransformer', tiny)
    work = str(tmp_path / 'work')
    run([sys.executable, osp.join(MMPRETRAIN_TOOLS, 'train.py'), config,
         '--work-dir', work])
    val = assert_trained_the_method(work, 'accuracy/top1')
    run([sys.executable, osp.join(MMPRETRAIN_TOOLS, 'test.py'), config,
         osp.join(work, 'epoch_2.pth'), '--work-dir', str(tmp_path / 'test')])
    assert metrics_of_test(str(tmp_path / 'test'))['accuracy/top1'] == val['accuracy/top1']


def test_mim_train_of_a_two_line_config(shapes, tmp_path):
    config = detection_configs(tmp_path, 'retinanet', shapes)
    metric = DETECTION['retinanet'][-1]
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # the install's
    env.setdefault('OMP_NUM_THREADS', '1')
    result = subprocess.run([MIM, 'train', 'mmdet', config, '--work-dir', 'work'],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained_the_method(str(tmp_path / 'work'), metric)


def test_init_detector_with_an_adapter_checkpoint_predicts_what_test_evaluates(
        shapes, tmp_path):
    """mmdet's init_detector clears the backbone's init_cfg unless cfg_options
    is given: with cfg_options={} the base comes from the config when the model
    is built, verified by the checkpoint's fingerprint."""
    from mmdet.apis import inference_detector, init_detector
    config = detection_configs(tmp_path, 'retinanet', shapes)
    work = str(tmp_path / 'work')
    run([sys.executable, osp.join(MMDET_TOOLS, 'train.py'), config, '--work-dir', work,
         '--cfg-options', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1'])
    checkpoint = osp.join(work, 'epoch_1.pth')
    out = str(tmp_path / 'predictions.pkl')
    run([sys.executable, osp.join(MMDET_TOOLS, 'test.py'), config, checkpoint,
         '--work-dir', str(tmp_path / 'test'), '--out', out,
         '--cfg-options', 'test_dataloader.batch_size=1'])  # no batch padding
    with open(out, 'rb') as f:  # written by this test's own run
        tested = {osp.basename(p['img_path']): p['pred_instances'] for p in pickle.load(f)}
    model = init_detector(config, checkpoint, device='cpu', cfg_options={})
    for image, expected in tested.items():
        result = inference_detector(model, osp.join(shapes['root'], 'val', image))
        predicted = result.pred_instances
        assert len(predicted) == len(expected['scores'])
        torch.testing.assert_close(predicted.scores, expected['scores'])
        torch.testing.assert_close(predicted.bboxes, expected['bboxes'])
