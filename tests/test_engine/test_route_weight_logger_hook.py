"""Route weights per stage reach the visualizer's backends (scalars.json and a
TensorBoard event file) during a real tiny training run."""
import glob
import json
import os.path as osp

import pytest
from mmengine.config import ConfigDict
from mmengine.runner import Runner

from moppa_mm.engine.hooks.route_weight_logger_hook import stage_of
from tests.conftest import tiny_detection_cfg

EXPERTS = ('heat', 'wave', 'poisson')


def test_stage_of():
    assert stage_of('backbone.stages.2.blocks.1.moppa') == 'stage2'
    assert stage_of('backbone.layers.3.moppa') == 'all'


def test_route_weights_in_scalars_and_tensorboard(shapes_data, tmp_path):
    pytest.importorskip('tensorboard')  # the [vis] extra
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=2)
    cfg.visualizer.vis_backends = [ConfigDict(type='LocalVisBackend'),
                                   ConfigDict(type='TensorboardVisBackend')]
    # a visualizer is a process-wide instance per name: mmdet's runtime names it
    # 'visualizer', and an earlier Runner's would write into its own work_dir
    cfg.visualizer.name = f'route-logging-{tmp_path.name}'
    cfg.custom_hooks.append(ConfigDict(type='RouteWeightLoggerHook'))  # opt-in logging
    runner = Runner.from_cfg(cfg)
    runner.train()
    units = runner.model.backbone.stages
    keys = {f'route/stage{i}/{e}' for i in range(len(units)) for e in EXPERTS}

    with open(glob.glob(osp.join(str(tmp_path), '*', 'vis_data', 'scalars.json'))[0]) as f:
        records = [json.loads(line) for line in f]
    routes = [r for r in records if 'route/stage0/heat' in r]
    assert [r['step'] for r in routes] == [1, 2]
    assert keys <= set(routes[-1])
    for i in range(len(units)):
        total = sum(routes[-1][f'route/stage{i}/{e}'] for e in EXPERTS)
        assert total == pytest.approx(1.0, abs=1e-5)  # softmax weights

    events = EventAccumulator(glob.glob(osp.join(
        str(tmp_path), '*', 'vis_data', 'events.out.tfevents.*'))[0])
    events.Reload()
    assert keys <= set(events.Tags()['scalars'])
    stage0 = runner.model.backbone.stages[0]
    heat = [u.attn.w_msa.moppa.route_weights()[0].item() for u in stage0.blocks]
    logged = events.Scalars('route/stage0/heat')
    assert [e.step for e in logged] == [1, 2]
    assert logged[-1].value == pytest.approx(sum(heat) / len(heat), abs=1e-6)
