"""The optimizer holds exactly what trains, and the log has no line per frozen
parameter (mmengine's default constructor writes one each)."""
import glob
import os.path as osp

import torch.nn as nn
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.runner import Runner

from tests.conftest import tiny_detection_cfg


def _optimized(optimizer):
    return {id(p) for group in optimizer.param_groups for p in group['params']}


def test_tiny_detector_run_optimizes_the_trainable_set_quietly(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=1)
    assert cfg.optim_wrapper.constructor == 'TrainableParamsOptimWrapperConstructor'
    assert cfg.optim_wrapper.paramwise_cfg  # the case where mmengine logs per param
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert len(trainable) < len(list(model.parameters()))  # a frozen backbone
    assert _optimized(runner.optim_wrapper.optimizer) == trainable
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert 'requires_grad=False' not in log
    # the backbone's own parameter table, once (logged by its init_weights)
    assert log.count('\nMoPPASwinTransformer\ncomponent') == 1
    assert f'{len(trainable)} trainable parameter tensors' in log


def test_without_paramwise_cfg_frozen_parameters_stay_out():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    constructor = OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
        type='TrainableParamsOptimWrapperConstructor',
        optim_wrapper_cfg=dict(optimizer=dict(type='AdamW', lr=1e-3))))
    optimizer = constructor(model).optimizer
    assert _optimized(optimizer) == {id(p) for p in model[1].parameters()}
