"""The VTAB-1K ablation configs (configs/vtab1k/ablation/, paper Table 4 and
Fig. 5): one per ablation and task, each the shipped per-task MoPPA config with
exactly one backbone option changed."""
import glob
import os.path as osp

import pytest

from moppa_mm.datasets import VTAB_TASKS
from moppa_mm.operators import moppa_units
from tests.conftest import REPO
from tests.test_configs.test_configs import build_tiny, parsed

ABLATIONS = {  # name -> the backbone options it sets
    'moppa-wo-heat': dict(moppa_cfg=dict(experts=('wave', 'poisson'))),
    'moppa-wo-wave': dict(moppa_cfg=dict(experts=('heat', 'poisson'))),
    'moppa-wo-poisson': dict(moppa_cfg=dict(experts=('heat', 'wave'))),
    'moppa-wo-moppa': dict(use_moppa=False),
    'moppa-wo-route-reg': dict(route_loss_weight=0.0),
}


def path_of(ablation, task):
    return osp.join(REPO, 'configs', 'vtab1k', 'ablation',
                    f'{ablation}_vit-b-p16_in21k-augreg-pre_vtab1k-{task}.py')


def test_one_config_per_ablation_and_task():
    found = sorted(glob.glob(osp.join(REPO, 'configs', 'vtab1k', 'ablation', '*.py')))
    assert found == sorted(path_of(a, t) for a in ABLATIONS for t in VTAB_TASKS)


@pytest.mark.parametrize('ablation', ABLATIONS)
def test_ablation_changes_one_backbone_option_of_the_shipped_config(ablation):
    for task in VTAB_TASKS:
        cfg = parsed(path_of(ablation, task))
        shipped = parsed(osp.join(REPO, 'configs', 'vtab1k',
                                  f'moppa_vit-b-p16_in21k-augreg-pre_vtab1k-{task}.py'))
        options = ABLATIONS[ablation]
        backbone = cfg.model.backbone.to_dict()
        for key, value in options.items():
            got = backbone.pop(key)
            assert (dict(got) if isinstance(value, dict) else got) == value, (task, key)
        expected = shipped.model.backbone.to_dict()
        for key in options:
            expected.pop(key, None)
        assert backbone == expected, task
        cfg.model.pop('backbone'), shipped.model.pop('backbone')
        assert cfg.model == shipped.model
        for key in ('train_dataloader', 'test_dataloader', 'optim_wrapper', 'param_scheduler',
                    'train_cfg', 'default_hooks', 'custom_hooks'):
            assert cfg.get(key) == shipped.get(key), (task, key)


@pytest.mark.parametrize('ablation', ABLATIONS)
def test_ablation_builds_what_it_says(ablation):
    model = build_tiny(parsed(path_of(ablation, 'dtd')))
    units = moppa_units(model.backbone)
    if ablation == 'moppa-wo-moppa':
        assert not units and model.backbone.use_scale_shift
        return
    assert len(units) == len(model.backbone.layers)
    experts = {'moppa-wo-heat': ('wave', 'poisson'), 'moppa-wo-wave': ('heat', 'poisson'),
               'moppa-wo-poisson': ('heat', 'wave')}.get(ablation, ('heat', 'wave', 'poisson'))
    assert all(unit.experts == experts for unit in units)
    assert model.backbone.route_loss_weight == (0.0 if ablation == 'moppa-wo-route-reg'
                                                else 1.0)
