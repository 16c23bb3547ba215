"""Every shipped config runs: preflight, one real training iteration and one
validation, through ``tools/preflight.py`` as ``tools/train.py`` does.

Each config keeps its own data set class, pipeline (sizes shrunk), hooks,
evaluator, optimizer and schedule; only the architecture is shrunk (a tiny ViT
or the demo's tiny Swin for detection, a 2-stage Swin for classification, with
tiny checkpoints in the formats the configs load),
the data roots point at small generated data, and training stops after one
epoch of one batch.
"""
import glob
import json
import math
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from preflight import build_runner, load_config  # tools/
from mmpretrain.models.backbones import SwinTransformer, VisionTransformer

from moppa_mm.datasets import FGVC_DATASETS, VTAB_TASKS
from demo.coco_shapes import mmdet_swin_to_official, prepare_demo
from model_converters.vit_to_mmpretrain import convert, save_backbone
from tests.conftest import REPO

BASELINES = ('linear_', 'full_', 'ssf_', 'lora_')
# the baselines run on one VTAB-1K task and one FGVC data set each (their
# configs differ only in the task: tests/test_configs/test_baselines.py)
BASELINE_SAMPLE = ('vtab1k-dtd.py', 'fgvc-cub.py')
# the VTAB-1K ablations (configs/vtab1k/ablation/) run on one task each too:
# each is the shipped per-task config with one backbone option changed
ABLATION_SAMPLE = 'vtab1k-dtd.py'


def _sampled(path: str) -> bool:
    if osp.basename(osp.dirname(path)) == 'ablation':
        return path.endswith(ABLATION_SAMPLE)
    return not osp.basename(path).startswith(BASELINES) or path.endswith(BASELINE_SAMPLE)


CONFIGS = sorted(
    path for path in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in path.split(os.sep) and _sampled(path)
    and 'segmentation' not in path.split(os.sep) and 'upernet' not in osp.basename(path))
# (MMSegmentation's configs run in tests/test_tools/test_seg_tools.py)
VIT_ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)
SWIN_ARCH = dict(embed_dims=16, depths=[2, 2], num_heads=[1, 2])  # 32 output dims
SHAPES = ('square', 'circle', 'triangle')


def test_every_family_is_covered():
    names = [osp.relpath(c, REPO) for c in CONFIGS
             if not osp.basename(c).startswith(BASELINES)]
    assert len(CONFIGS) - len(names) == len(BASELINES) * len(BASELINE_SAMPLE)
    # VTAB-1K ViT-B, Swin-B, ViT-L; FGVC; ImageNet; COCO; the two demos; the
    # five VTAB-1K ablations on one task
    assert len(names) == 57 + 19 + 19 + 10 + 1 + 3 + 2 + 5
    assert 'configs/moppa/moppa_vit-b-p16_in21k-augreg-pre_8xb64-110e_in1k.py' in names


def _write_images(folder, names, rng, size=32):
    for name in names:
        path = osp.join(folder, name)
        os.makedirs(osp.dirname(path), exist_ok=True)
        cv2.imwrite(path, rng.integers(0, 255, (size, size, 3)).astype(np.uint8))


@pytest.fixture(scope='session')
def generated(tmp_path_factory):
    """Two 32 px images per split for every VTAB-1K task, FGVC data set and
    ImageNet; the COCO shapes; a tiny ViT and the demo's tiny Swin."""
    root = str(tmp_path_factory.mktemp('every_config'))
    rng = np.random.default_rng(0)
    paths = {}

    paths['vtab'] = osp.join(root, 'vtab-1k')
    for task in VTAB_TASKS:
        for split in ('train800val200', 'test'):
            names = [f'images/{split}/{i:06d}.jpg' for i in range(2)]
            _write_images(osp.join(paths['vtab'], task), names, rng)
            with open(osp.join(paths['vtab'], task, f'{split}.txt'), 'w') as f:
                f.write(''.join(f'{name} {i}\n' for i, name in enumerate(names)))

    paths['fgvc'] = osp.join(root, 'fgvc')
    for dataset, (_, image_prefix) in FGVC_DATASETS.items():
        dataset_root = osp.join(paths['fgvc'], dataset)
        for split in ('train', 'val', 'test'):
            names = [f'{i:03d}.class/{split}_{i}.jpg' for i in range(2)]
            _write_images(osp.join(dataset_root, image_prefix), names, rng)
            with open(osp.join(dataset_root, f'{split}.json'), 'w') as f:
                json.dump({name: i for i, name in enumerate(names)}, f)

    paths['imagenet'] = osp.join(root, 'imagenet')  # mmpretrain's meta/{split}.txt
    os.makedirs(osp.join(paths['imagenet'], 'meta'))
    for split in ('train', 'val'):
        names = [f'n0000000{i}/{split}_{i}.JPEG' for i in range(2)]
        _write_images(osp.join(paths['imagenet'], split), names, rng)
        with open(osp.join(paths['imagenet'], 'meta', f'{split}.txt'), 'w') as f:
            f.write(''.join(f'{name} {i}\n' for i, name in enumerate(names)))

    paths['coco'] = osp.join(root, 'shapes')
    shapes = prepare_demo(paths['coco'], num_train=2, num_val=2, size=64)
    paths['swin'] = shapes['pretrained']  # official Swin release format
    paths['coco_val'] = shapes['val']

    torch.manual_seed(0)
    vit = VisionTransformer(arch=VIT_ARCH, img_size=32, patch_size=8)
    vit.init_weights()  # mmpretrain format: {'state_dict': {'backbone.' + key}}
    paths['vit'] = save_backbone(vit.state_dict(), osp.join(root, 'vit.pth'), 'test')

    # mmpretrain's Swin as an official release file (final norm 'norm'), then
    # through the 'swin' converter as the Swin-B configs' base says
    swin = SwinTransformer(arch=SWIN_ARCH, img_size=56, window_size=7, out_indices=(1, ))
    swin.init_weights()
    state = {('norm.' + k[len('norm1.'):] if k.startswith('norm1.') else k): v
             for k, v in swin.state_dict().items()}
    official = osp.join(root, 'swin_official.pth')
    torch.save({'model': mmdet_swin_to_official(state)}, official)
    paths['swin_cls'] = save_backbone(convert(official, 'swin'),
                                      osp.join(root, 'swin_cls.pth'), 'swin')
    return paths


def _shrink_sizes(node, factor, minimum):
    """Scale every ``scale`` / ``scales`` / ``crop_size`` in a pipeline."""
    def shrink(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return max(minimum, int(value * factor))
        if isinstance(value, (list, tuple)):
            return type(value)(shrink(v) for v in value)
        return value

    if isinstance(node, dict):
        for key, value in node.items():
            if key in ('scale', 'scales', 'crop_size'):
                node[key] = shrink(value)
            else:
                _shrink_sizes(value, factor, minimum)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _shrink_sizes(value, factor, minimum)


def _loaders(cfg):
    return [cfg[key] for key in ('train_dataloader', 'val_dataloader',
                                 'test_dataloader')]


def shrink_classifier(cfg, data):
    if 'Swin' in cfg.model.backbone.type:  # 224 -> 56: 14x14 and 7x7 windows
        cfg.model.backbone.update(arch=SWIN_ARCH, img_size=56, out_indices=(1, ),
                                  drop_path_rate=0.0)
        cfg.model.backbone.init_cfg.checkpoint = data['swin_cls']
        image_factor = 1 / 4
    else:
        cfg.model.backbone.update(arch=VIT_ARCH, img_size=32, patch_size=8,
                                  drop_path_rate=0.0)
        cfg.model.backbone.init_cfg.checkpoint = data['vit']
        image_factor = 1 / 7  # 224 -> 32
    cfg.model.head.in_channels = 32
    for loader in _loaders(cfg):
        dataset = loader.dataset
        if dataset.type == 'VTAB1k':
            dataset.data_root = data['vtab']
        elif dataset.type == 'FGVC':
            dataset.data_root = osp.join(data['fgvc'], dataset.dataset)
        else:
            assert dataset.type == 'ImageNet', dataset.type
            dataset.data_root = data['imagenet']
        _shrink_sizes(dataset.pipeline, image_factor, 8)


def shrink_detector(cfg, data):
    model = cfg.model
    model.backbone.update(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                          window_size=7, drop_path_rate=0.0)
    model.backbone.init_cfg.checkpoint = data['swin']
    model.neck.update(in_channels=[32, 64, 128, 256], out_channels=64)
    model.rpn_head.update(in_channels=64, feat_channels=64)
    model.roi_head.bbox_roi_extractor.out_channels = 64
    model.roi_head.mask_roi_extractor.out_channels = 64
    for head in model.roi_head.bbox_head:  # the shapes' classes (preflight checks)
        head.update(in_channels=64, fc_out_channels=128, num_classes=len(SHAPES))
    model.roi_head.mask_head.update(in_channels=64, conv_out_channels=64,
                                    num_classes=len(SHAPES))
    model.test_cfg.rpn.update(nms_pre=300, max_per_img=100)  # as the demo
    model.test_cfg.rcnn.max_per_img = 20
    for loader, split in zip(_loaders(cfg), ('train', 'val', 'val')):
        loader.dataset.update(data_root=data['coco'] + '/',
                              ann_file=f'annotations/{split}.json',
                              data_prefix=dict(img=f'{split}/'),
                              metainfo=dict(classes=SHAPES))
        _shrink_sizes(loader.dataset.pipeline, 1 / 12, 64)  # 1333 -> 111
    for key in ('val_evaluator', 'test_evaluator'):
        cfg[key].ann_file = data['coco_val']


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_config_trains_one_iteration_and_validates(generated, tmp_path, path):
    # yapf formatting of the logged and dumped config would take most of the time
    cfg = load_config(path, work_dir=str(tmp_path), format_python_code=False)
    lora = cfg.model.backbone if cfg.model.backbone.type == 'LoRAModel' else None
    if lora:  # the LoRA baseline: shrink the ViT it wraps
        cfg.model.backbone = lora.module
    if cfg.default_scope == 'mmpretrain':
        shrink_classifier(cfg, generated)
        metric = 'val/accuracy/top1'
    else:
        shrink_detector(cfg, generated)
        # an untrained detector may predict nothing: CocoMetric then reports
        # no AP, but the validation loop still ran and timed its iteration
        metric = 'val/time'
    if cfg.model.backbone.get('frozen_stages') == 12:  # the linear probe: all layers
        cfg.model.backbone.frozen_stages = VIT_ARCH['num_layers']
    if lora:
        lora.module = cfg.model.backbone
        cfg.model.backbone = lora
    for loader in _loaders(cfg):
        loader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_cfg.update(max_epochs=1, val_interval=1)  # 2 images: one batch

    runner = build_runner(cfg, 'train')  # preflight, as tools/train.py
    runner.train()

    hub = runner.message_hub
    assert runner.iter == 1
    loss = hub.get_scalar('train/loss').current()
    assert math.isfinite(loss)
    assert metric in hub.log_scalars, sorted(hub.log_scalars)
    if cfg.model.backbone.type.startswith('MoPPA'):
        assert 'NonFiniteLossHook' in [type(hook).__name__ for hook in runner.hooks]
    assert glob.glob(osp.join(str(tmp_path), '*.pth')), 'no checkpoint written'
