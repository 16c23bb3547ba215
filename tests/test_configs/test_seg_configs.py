"""Every MMSegmentation config of moppa_mm builds the MoPPA backbone inside
MMSegmentation's own model (the released base is not loaded here), with its
paper-sized trainable set; a tiny ViT-UperNet gets ``loss_route``."""
import glob
import os.path as osp

import pytest
import torch

pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402
from mmseg.structures import SegDataSample  # noqa: E402
from mmengine.structures import PixelData  # noqa: E402

import moppa_mm  # noqa: E402,F401
from moppa_mm.models.backbones.adapter_params import parameter_breakdown  # noqa: E402
from tests.conftest import REPO  # noqa: E402

CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs/segmentation/*.py')))
SWIN = 'moppa-swin-base-patch4-window7-in22k-pre_upernet_8xb2-160k_ade20k-512x512.py'
VIT = 'vit_moppa-vit-b16_mln_upernet_8xb2-80k_ade20k-512x512.py'


def build(path, **backbone):
    cfg = Config.fromfile(path)
    init_default_scope(cfg.default_scope)
    cfg.model.pretrained = None
    cfg.model.backbone.init_cfg = None
    cfg.model.backbone.update(backbone)
    return MODELS.build(cfg.model)


def test_the_configs_are_the_packaged_ones():
    assert sorted(osp.basename(p) for p in CONFIGS) == sorted([SWIN, VIT])


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds_its_optimizer_over_the_trainable_set(path):
    """mmseg's configs set a paramwise_cfg: mmengine's default constructor
    would log one warning per frozen parameter (about 120), ours one line."""
    cfg = Config.fromfile(path)
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys  # mmseg's, as it is
    assert cfg.optim_wrapper.constructor == 'TrainableParamsOptimWrapperConstructor'


@pytest.mark.parametrize('name, backbone, trainable', [
    (SWIN, 'MoPPASwinTransformerSeg', 3.21e6),
    (VIT, 'MoPPAVisionTransformerSeg', 0.54e6),
])
def test_config_builds_moppa_in_mmseg_model(name, backbone, trainable):
    model = build(osp.join(REPO, 'configs/segmentation', name))
    assert type(model.backbone).__name__ == backbone
    counts = parameter_breakdown(model.backbone)
    assert counts['total']['trainable'] == pytest.approx(trainable, rel=0.05)
    assert counts['pretrained']['trainable'] == 0


def test_tiny_vit_upernet_trains_with_loss_route():
    cfg = Config.fromfile(osp.join(REPO, 'configs/segmentation', VIT))
    cfg.model.pretrained = None
    cfg.model.backbone.update(init_cfg=None, img_size=(32, 32), embed_dims=32,
                              num_layers=4, num_heads=2, out_indices=(0, 1, 2, 3),
                              random_base=True)  # a step on a random base, on purpose
    cfg.model.neck.update(in_channels=[32] * 4, out_channels=32)
    cfg.model.decode_head.update(in_channels=[32] * 4, channels=16, num_classes=4)
    cfg.model.auxiliary_head.update(in_channels=32, channels=8, num_classes=4)
    model = MODELS.build(cfg.model)
    model.train()
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(32, 32), pad_shape=(32, 32)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 4, (1, 32, 32)))
        samples.append(sample)
    losses = model(torch.randn(2, 3, 32, 32), samples, mode='loss')
    assert 'loss_route' in losses and torch.isfinite(losses['loss_route'])
    sum(v for k, v in losses.items() if 'loss' in k).backward()
    unit = model.backbone.layers[0].moppa
    assert next(unit.parameters()).grad is not None
