import glob
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from moppa_mm.utils.params import parameter_table
from tests.conftest import REPO

CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True))


def test_there_are_configs():
    names = [osp.relpath(c, REPO) for c in CONFIGS]
    assert 'configs/cascade_moppa_swin_b_coco.py' in names


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_config_parses_and_imports_moppa(path):
    cfg = Config.fromfile(path)
    assert cfg.model.type
    if 'moppa' in osp.basename(path):
        assert cfg.custom_imports == dict(imports=['moppa_mm'],
                                          allow_failed_imports=False)
        assert cfg.model.backbone.type.startswith('MoPPA')


def test_paper_detector_builds_with_the_paper_budget():
    from mmdet.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs/cascade_moppa_swin_b_coco.py'))
    assert cfg.train_cfg.max_epochs == 36
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert 'CascadeRoIHead' == cfg.model.roi_head.type
    assert cfg.model.backbone.init_cfg.checkpoint.endswith(
        'swin_base_patch4_window7_224_22k.pth')
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)  # weights are not loaded at build time
    table, counts = parameter_table(model, (
        ('moppa', ('backbone.*moppa*', )),
        ('conv_adapter', ('backbone.*conv_adapter*', )),
        ('backbone', ('backbone.*', ))))
    print('\n' + table)
    backbone_trainable = sum(counts[k]['trainable']
                             for k in ('moppa', 'conv_adapter', 'backbone'))
    assert abs(backbone_trainable / 3.18e6 - 1) < 0.05
    assert counts['backbone']['trainable'] == 0
    assert counts['other']['trainable'] == counts['other']['total']  # neck, heads


def test_user_config_inherits_through_the_package_scope(tmp_path):
    user = tmp_path / 'my_moppa.py'
    user.write_text(
        "_base_ = 'moppa_mm::moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'\n"
        "model = dict(backbone=dict(moppa_scope='global'))\n")
    cfg = Config.fromfile(str(user))
    assert cfg.model.backbone.type == 'MoPPASwinTransformer'
    assert cfg.model.backbone.moppa_scope == 'global'
    assert cfg.model.backbone.embed_dims == 128
