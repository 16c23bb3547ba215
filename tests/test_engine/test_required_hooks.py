"""A child config that sets ``custom_hooks`` replaces its base's whole list
(ordinary mmengine merging): without the MoPPA hooks a run would train on
with no route loss, full checkpoints, no exact resume and no stop at a NaN
loss, and exit 0. The pre-training check stops it, says how to extend the
base's list, and lets the legitimate opt-outs through. Real child config
files, parsed by mmengine's Config."""
import os.path as osp
import re

import pytest
from mmengine.config import Config

from moppa_mm.demo_cls import prepare_cls_demo
from moppa_mm.models.converters import convert, save_backbone
from preflight import MOPPA_HOOKS, check_config  # tools/
from tests.conftest import DEMO_CONFIG, REPO

DEMO_CLS = osp.join(REPO, 'configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py')
ALL_HOOKS = [name for name, _ in MOPPA_HOOKS]


@pytest.fixture(scope='module')
def cls_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('vtab_demo'))
    prepare = prepare_cls_demo(root)
    checkpoint = save_backbone(convert(prepare['mae_checkpoint'], 'mae'),
                               osp.join(root, 'vit_demo_mmpretrain.pth'))
    return dict(root=root, checkpoint=checkpoint)


def child_config(tmp_path, base, body, data):
    """``body`` in a child config file of ``base``, parsed as tools/train.py
    parses it, then pointed at the generated data."""
    path = tmp_path / 'child.py'
    path.write_text(f'_base_ = {base!r}\n{body}\n')
    cfg = Config.fromfile(str(path))
    if base == DEMO_CLS:
        cfg.model.backbone.init_cfg.checkpoint = data['checkpoint']
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            cfg[key].dataset.data_root = data['root']
        return cfg
    root = data['root'] + '/'
    cfg.model.backbone.init_cfg.checkpoint = data['pretrained']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = root
    for key in ('val_evaluator', 'test_evaluator'):
        cfg[key].ann_file = data['val']
    return cfg


@pytest.fixture(params=['detection', 'classification'])
def demo(request, shapes_data):
    """(base config, data, backbone class) of each demo."""
    if request.param == 'detection':
        return DEMO_CONFIG, shapes_data, 'MoPPASwinTransformer'
    return DEMO_CLS, request.getfixturevalue('cls_data'), 'MoPPAVisionTransformer'


def test_replaced_custom_hooks_stop_before_training(demo, tmp_path):
    base, data, backbone = demo
    cfg = child_config(tmp_path, base, "custom_hooks = [dict(type='EMAHook')]", data)
    with pytest.raises(ValueError) as error:
        check_config(cfg)
    message = str(error.value)
    assert message.startswith(f'model.backbone is a {backbone}, which trains with '
                              'hooks that custom_hooks lacks')
    for name in ALL_HOOKS:
        assert f'\n  {name}: ' in message
    assert "custom_hooks = [*_base_.custom_hooks, dict(type='EMAHook')]" in message
    assert 'route_loss_weight = 0' in message
    assert "dict(type='AdapterCheckpointHook', enabled=False)" in message
    check_config(cfg, mode='test')  # testing needs none of them


def test_the_suggested_extension_keeps_the_hooks(demo, tmp_path):
    """The line the error suggests, written into a child config, parses and
    keeps the base's hooks with the new one."""
    base, data, _ = demo
    cfg = child_config(tmp_path, base, "custom_hooks = [dict(type='EMAHook')]", data)
    with pytest.raises(ValueError) as error:
        check_config(cfg)
    (suggestion, ) = re.findall(r'^  (custom_hooks = .*)$', str(error.value), re.M)
    cfg = child_config(tmp_path, base, suggestion, data)
    assert [hook['type'] for hook in cfg.custom_hooks] == ALL_HOOKS + ['EMAHook']
    check_config(cfg)


def test_going_without_a_hook_on_purpose(shapes_data, tmp_path):
    def without(*names):
        kept = [f"dict(type='{name}')" for name in ALL_HOOKS if name not in names]
        return f'custom_hooks = [{", ".join(kept)}]'

    cfg = child_config(tmp_path, DEMO_CONFIG, without('RouteRegularizationHook'),
                       shapes_data)
    with pytest.raises(ValueError, match=r'lacks; without them the run loses:\n'
                       r'  RouteRegularizationHook: the route loss[^\n]*\nA child'):
        check_config(cfg)
    cfg.route_loss_weight = 0  # the paper's w = 0: no route loss, no hook needed
    check_config(cfg)
    cfg.route_loss_weight = 1.0
    cfg.model.backbone.use_moppa = False  # no MoPPA unit, no route loss
    check_config(cfg)
    # full checkpoints: the hook stays, switched off
    cfg = child_config(tmp_path, DEMO_CONFIG, without('AdapterCheckpointHook')[:-1]
                       + ", dict(type='AdapterCheckpointHook', enabled=False)]",
                       shapes_data)
    check_config(cfg)
    # no opt-out for the others: resume, loading and the NaN stop need them
    cfg = child_config(tmp_path, DEMO_CONFIG, without('PlainCheckpointHook'), shapes_data)
    with pytest.raises(ValueError, match=r'loses:\n  PlainCheckpointHook: [^\n]*\nA child'
                       r"[^\n]*\n  custom_hooks = \[\*_base_.custom_hooks, "
                       r"dict\(type='YourHook'\)\]\n\(in the child config"):
        check_config(cfg)  # (no hook of the user's own: a placeholder)
    # the suggestion keeps the user's own hooks
    cfg = child_config(tmp_path, DEMO_CONFIG,
                       "custom_hooks = [dict(type='SyncBuffersHook'), "
                       "dict(type='EMAHook', momentum=0.001)]", shapes_data)
    with pytest.raises(ValueError, match=r"custom_hooks = \[\*_base_.custom_hooks, "
                       r"dict\(type='SyncBuffersHook'\), "
                       r"dict\(type='EMAHook', momentum=0.001\)\]"):
        check_config(cfg)
