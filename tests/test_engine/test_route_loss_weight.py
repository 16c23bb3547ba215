"""The route-loss weight as the backbone's argument, and the "w/o MoPPA"
switch, through real Configs and Runners (the classification demo config: a
2-layer ViT on a generated VTAB-1K-format task). The old top-level
``route_loss_weight`` and a hook ``loss_weight`` are refused with the fix."""
import math
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.runner import Runner

from demo.vtab_task import prepare_cls_demo
from model_converters.vit_to_mmpretrain import convert, save_backbone
from tests.conftest import REPO

DEMO_CLS = osp.join(REPO, 'configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py')


@pytest.fixture(scope='module')
def demo_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('vtab_demo'))
    paths = prepare_cls_demo(root)
    paths['root'] = root
    paths['checkpoint'] = save_backbone(convert(paths['mae_checkpoint'], 'mae'),
                                        osp.join(root, 'vit_demo_mmpretrain.pth'))
    return paths


def load(path, data, work_dir, cfg_options=None):
    """What tools/train.py does with a config file and --cfg-options."""
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.model.backbone.init_cfg.checkpoint = data['checkpoint']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = data['root']
    cfg.train_cfg.update(max_epochs=1, val_interval=1)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = osp.basename(str(work_dir))  # one message hub per run
    return cfg


def child(tmp_path, text):
    path = tmp_path / 'child.py'
    path.write_text(f'_base_ = {DEMO_CLS!r}\n' + text)
    return str(path)


def first_route_values(runner):
    hub = runner.message_hub
    return (hub.get_scalar('train/route_weight').data[0][0],
            hub.get_scalar('train/loss_route').data[0][0])


def test_child_config_sets_the_route_loss_weight(demo_data, tmp_path):
    cfg = load(child(tmp_path, 'model = dict(backbone=dict(route_loss_weight=0.5))\n'),
               demo_data, tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.train()
    weight, loss_route = first_route_values(runner)
    assert weight == 0.5  # epoch 0 of 1: w * max(1 - 0, 0)
    assert math.isclose(loss_route, 0.5 * math.log(1 / 3), rel_tol=1e-4)  # uniform


def test_cfg_options_set_the_route_loss_weight(demo_data, tmp_path):
    cfg = load(DEMO_CLS, demo_data, tmp_path, {'model.backbone.route_loss_weight': 0.25})
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert first_route_values(runner)[0] == 0.25


def test_without_moppa_trains_with_no_route_loss(demo_data, tmp_path):
    cfg = load(DEMO_CLS, demo_data, tmp_path, {'model.backbone.use_moppa': False})
    runner = Runner.from_cfg(cfg)
    runner.train()
    names = [n for n, p in runner.model.named_parameters() if p.requires_grad]
    assert not any('moppa' in n for n in names) and any('ssf_' in n for n in names)
    hub = runner.message_hub
    assert 'train/loss_route' not in hub.log_scalars
    assert math.isfinite(hub.get_scalar('train/loss').current())
    assert 'val/accuracy/top1' in hub.log_scalars


def test_config_inherited_through_the_package_scope_trains(demo_data, tmp_path):
    """A user config outside the checkout inherits the classification demo as
    ``moppa_mm::...``: mmengine marks the inherited modules with
    ``_scope_='moppa_mm'``, which moppa_mm.registry must resolve (it fell back
    to mmengine's root registry: "ImageClassifier is not in the mmengine::model
    registry")."""
    path = tmp_path / 'my_cls.py'
    path.write_text("_base_ = 'moppa_mm::demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py'\n"
                    'model = dict(backbone=dict(route_loss_weight=0.5))\n')
    cfg = load(str(path), demo_data, tmp_path / 'work')
    assert cfg.model._scope_ == 'moppa_mm'
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert type(runner.model).__name__ == 'ImageClassifier'
    assert first_route_values(runner)[0] == 0.5
