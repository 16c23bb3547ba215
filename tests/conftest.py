"""Shared fixtures: tiny generated data, tiny configs, the repo's python."""
import contextlib
import logging
import os
import os.path as osp
import sys

import pytest

from moppa_mm.utils.malloc import keep_freed_memory

keep_freed_memory()  # as tools/train.py does on CPU: no page faults per step

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOLS = osp.join(REPO, 'tools')
# the tools' own modules (preflight, cpu_distributed, analysis/...) are
# imported by their plain names, as the scripts in tools/ import them; appended,
# so that tools/test.py does not shadow the standard library's ``test``
if TOOLS not in sys.path:
    sys.path.append(TOOLS)
DEMO_CONFIG = osp.join(REPO, 'configs/demo/cascade-mask-rcnn_moppa-swin-demo_fpn_shapes.py')
PYTHON = sys.executable


@pytest.fixture(scope='session')
def shapes_data(tmp_path_factory):
    """4 train / 2 val images of 96 px in COCO format + a small official-format Swin."""
    from demo.coco_shapes import prepare_demo
    root = str(tmp_path_factory.mktemp('shapes'))
    paths = prepare_demo(root, num_train=4, num_val=2, size=96)
    paths['root'] = root
    return paths


# The generated VTAB-1K task (tools/demo/vtab_task.py) at 32 px, as a config's
# data part (``{root}``: its root); one epoch of 40 images, a test of 20.
VTAB_DEMO_DATA = """
data_preprocessor = dict(num_classes=10, mean=[127.5] * 3, std=[127.5] * 3,
                         batch_augments=None)
pipeline = [dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(32, 32)),
            dict(type='PackInputs')]
loader = dict(batch_size=8, num_workers=0, persistent_workers=False,
              sampler=dict(type='DefaultSampler', shuffle=False))
train_dataloader = dict(**loader, dataset=dict(
    _delete_=True, type='VTAB1k', data_root={root!r}, task='eurosat',
    split='train800val200', pipeline=pipeline))
val_dataloader = dict(**loader, dataset=dict(
    _delete_=True, type='VTAB1k', data_root={root!r}, task='eurosat', split='test',
    pipeline=pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator
"""


def tiny_detection_cfg(data, work_dir, max_iters=2, val_interval=None,
                       checkpoint_interval=None):
    """The demo config (itself the real MoPPA Cascade config, inherited), pointed
    at ``data``, iteration-based, with a deterministic pipeline."""
    from mmengine.config import Config, ConfigDict
    cfg = Config.fromfile(DEMO_CONFIG)
    root = data['root'] + '/'
    cfg.model.backbone.init_cfg.checkpoint = data['pretrained']
    no_flip = [t for t in cfg.train_pipeline if t['type'] != 'RandomFlip']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = root
        cfg[key].batch_size = 2
    cfg.train_dataloader.dataset.pipeline = no_flip
    for key in ('val_evaluator', 'test_evaluator'):
        cfg[key].ann_file = data['val']
    cfg.train_cfg = ConfigDict(type='IterBasedTrainLoop', max_iters=max_iters,
                               val_interval=val_interval or max_iters)
    cfg.default_hooks.checkpoint = ConfigDict(
        type='CheckpointHook', by_epoch=False,
        interval=checkpoint_interval or max_iters)
    cfg.default_hooks.logger.interval = 1
    cfg.log_processor = ConfigDict(by_epoch=False, window_size=1)
    cfg.work_dir = str(work_dir)
    return cfg


@contextlib.contextmanager
def logged_messages():
    """The messages mmengine's current logger logs within the block (its
    console handler keeps the stream it started with: capsys misses them)."""
    from mmengine.logging import MMLogger
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    messages = []
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        messages.extend(record.getMessage() for record in records)


def dump_cfg(cfg, path):
    cfg.dump(str(path))
    return str(path)


def child_env():
    env = dict(os.environ)
    env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('OMP_NUM_THREADS', '1')
    return env


# Modules whose tests train a model or run the tools in separate processes:
# marked `slow` (`bash tools/run_tests.sh -m "not slow"` for a quick pass; CI
# runs everything).
SLOW_MODULES = (
    'tests/test_benchmarks/test_transfer.py',
    'tests/test_configs/test_every_config_runs.py',
    'tests/test_engine/test_non_finite_loss_hook.py',
    'tests/test_engine/test_rng_state_hook.py',
    'tests/test_engine/test_route_logging.py',
    'tests/test_engine/test_route_loss_weight.py',
    'tests/test_tools/',
)


def pytest_collection_modifyitems(config, items):
    import torch
    no_gpu = pytest.mark.skip(reason='needs a CUDA GPU (marked `cuda`)')
    for item in items:
        path = osp.relpath(str(item.fspath), REPO)
        if path.startswith(SLOW_MODULES):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker('cuda') is not None and not torch.cuda.is_available():
            item.add_marker(no_gpu)
