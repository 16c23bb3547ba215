"""The tools as users run them: separate processes, real files, real kills."""
import glob
import json
import os.path as osp
import socket
import subprocess
import sys
import time

import pytest
import torch

from moppa_mm.models import read_adapter_record
from tests.conftest import DEMO_CONFIG, PYTHON, REPO, child_env, dump_cfg, tiny_detection_cfg
from tests.test_tools.resume import assert_same_checkpoints, kill_then_resume, train

MMDET_TEST = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim/tools/test.py')
MMDET_TRAIN = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim/tools/train.py')
MMPRETRAIN_TRAIN = osp.join(osp.dirname(__import__('mmpretrain').__file__),
                            '.mim/tools/train.py')


def run(args, timeout=600, **kwargs):
    return subprocess.run(args, cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def val_metrics(work_dir):
    """The last validation metrics the training runs in ``work_dir`` logged
    (run folders are timestamps: sorted, the latest run comes last)."""
    lines = []
    for path in sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            lines += [json.loads(line) for line in f]
    val = [line for line in lines if 'coco/bbox_mAP' in line]
    assert val, f'no validation metrics under {work_dir}'
    return val[-1]


def logged_test_metrics(work_dir):
    paths = sorted(glob.glob(osp.join(work_dir, '*', '*.json')))
    assert paths, f'no test metrics under {work_dir}'
    with open(paths[-1]) as f:
        return json.load(f)


def same_metrics(a, b):
    keys = [k for k in a if k.startswith('coco/')]
    assert keys
    return all(a[k] == b[k] for k in keys)


@pytest.fixture(scope='module')
def trained(shapes_data, tmp_path_factory):
    """An uninterrupted 4-iteration run with checkpoints and validations at 2
    and 4."""
    work = tmp_path_factory.mktemp('uninterrupted')
    cfg = tiny_detection_cfg(shapes_data, work, max_iters=4, val_interval=2,
                             checkpoint_interval=2)
    config = dump_cfg(cfg, work / 'tiny.py')
    result = run([PYTHON, 'tools/train.py', config, '--work-dir', str(work)])
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(config=config, work=str(work), data=shapes_data)


def test_checkpoint_is_adapter_only(trained):
    ckpt = torch.load(osp.join(trained['work'], 'iter_4.pth'), weights_only=False)
    keys = list(ckpt['state_dict'])
    assert read_adapter_record(ckpt)['base']['fingerprint']  # the record
    assert any('.moppa.' in k for k in keys) and any('.conv_adapter.' in k for k in keys)
    frozen = [k for k in keys if k.startswith('backbone.') and '.moppa.' not in k
              and '.conv_adapter.' not in k and k != 'backbone._extra_state']
    assert frozen == []
    assert 'rng_state' in ckpt['meta']


@pytest.mark.parametrize('in_validation', [False, True])
def test_kill_and_resume_reproduces_the_uninterrupted_run(trained, tmp_path,
                                                          in_validation):
    """Killed after the checkpoint and the validation at iteration 2, before
    iteration 4 (validation drew random numbers after the checkpoint); or
    in the middle of that validation, which the resumed run then skips."""
    log = kill_then_resume(trained['config'], tmp_path,
                           before_iter=2 if in_validation else 3,
                           in_validation=in_validation)
    assert 'resumed' in log.lower() and 'iter_2.pth' in log
    assert 'random states restored' in log
    assert_same_checkpoints(tmp_path / 'iter_4.pth',
                            osp.join(trained['work'], 'iter_4.pth'))
    assert same_metrics(val_metrics(str(tmp_path)), val_metrics(trained['work']))


@pytest.mark.parametrize('processes', [1, 2])
def test_kill_and_resume_with_the_shipped_epoch_schedule(shapes_data, tmp_path,
                                                         processes):
    """The demo's own schedule (epochs, validation and a checkpoint after
    each, random flips), killed in the middle of epoch 2: resuming from
    epoch 1 ends bit-identical to the uninterrupted run, with one process
    or two (each restores its own random states: its flips, its proposal
    sampling)."""
    from mmengine.config import Config, ConfigDict
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    shipped = Config.fromfile(DEMO_CONFIG)
    cfg.train_dataloader.dataset.pipeline = shipped.train_pipeline
    cfg.train_dataloader.batch_size = 1  # 4 iterations per epoch (2 per process)
    cfg.train_cfg = shipped.train_cfg
    cfg.default_hooks.checkpoint = ConfigDict(type='CheckpointHook', interval=1)
    cfg.log_processor = ConfigDict(by_epoch=True, window_size=1)
    assert (cfg.train_cfg.max_epochs, cfg.train_cfg.val_interval) == (2, 1)
    config = dump_cfg(cfg, tmp_path / 'epochs.py')
    reference = tmp_path / 'uninterrupted'
    result = train(config, reference, processes=processes)
    assert result.returncode == 0, result.stderr[-3000:]
    log = kill_then_resume(config, tmp_path / 'killed', processes=processes,
                           before_iter=6 if processes == 1 else 3)
    assert 'epoch_1.pth' in log and 'random states restored' in log
    assert_same_checkpoints(tmp_path / 'killed' / 'epoch_2.pth',
                            reference / 'epoch_2.pth')


@pytest.mark.parametrize('tool', ['ours', 'mmdet'])
def test_test_tool_reproduces_training_ap(trained, tmp_path, tool):
    script = 'tools/test.py' if tool == 'ours' else MMDET_TEST
    ckpt = osp.join(trained['work'], 'iter_4.pth')
    result = run([PYTHON, script, trained['config'], ckpt, '--work-dir', str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'adapter-only' not in result.stderr  # the base came when it was built
    assert same_metrics(logged_test_metrics(str(tmp_path)), val_metrics(trained['work']))


def test_test_tool_takes_mmdets_flags(trained, tmp_path):
    """tools/test.py runs mmdet's own tool: --show-dir paints the predictions."""
    ckpt = osp.join(trained['work'], 'iter_4.pth')
    result = run([PYTHON, 'tools/test.py', trained['config'], ckpt, '--work-dir',
                  str(tmp_path), '--show-dir', 'painted', '--out',
                  str(tmp_path / 'preds.pkl')])
    assert result.returncode == 0, result.stderr[-3000:]
    painted = glob.glob(osp.join(str(tmp_path), '*', 'painted', '*.jpg'))
    assert len(painted) == 2  # the two validation images
    assert osp.getsize(tmp_path / 'preds.pkl') > 0
    help_text = run([PYTHON, 'tools/test.py', '--work-dir', str(tmp_path),
                     trained['config'], '--help']).stdout  # options may come first
    for flag in ('--show-dir', '--tta', '--wait-time', '--out'):
        assert flag in help_text


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_visualize_tool_draws_every_unit_of_a_checkpoint(trained, tmp_path):
    ckpt = osp.join(trained['work'], 'iter_4.pth')
    result = run([PYTHON, 'tools/analysis/visualize_moppa.py', trained['config'],
                  ckpt, '--out-dir', str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    units = sorted(osp.basename(p) for p in glob.glob(str(tmp_path / '*.moppa.png')))
    assert len(units) == 8 and units[0] == 'backbone.stages.0.blocks.0.attn.w_msa.moppa.png'
    assert osp.getsize(tmp_path / 'route_weights.png') > 0
    assert 'MoPPA tensors from' in result.stdout


def _without_activated_venv():
    env = child_env()
    env.pop('PYTHON', None)
    env.pop('VIRTUAL_ENV', None)
    env['PATH'] = '/usr/bin:/bin'
    return env


def test_dist_scripts_name_the_interpreter_they_lack(tmp_path):
    env = _without_activated_venv()
    env['VENV'] = str(tmp_path / 'no-venv')
    for script, args in (('dist_train.sh', ['cfg.py', '2']),
                         ('dist_test.sh', ['cfg.py', 'ckpt.pth', '2']),
                         ('slurm_train.sh', ['partition', 'job', 'cfg.py', 'work'])):
        result = subprocess.run(['bash', f'tools/{script}', *args], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, (script, result.stderr)
        assert 'cannot import torch' in result.stderr and 'PYTHON=' in result.stderr


def test_dist_train_two_cpu_processes(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=2)
    config = dump_cfg(cfg, tmp_path / 'tiny.py')
    env = _without_activated_venv()
    env.update(VENV=sys.prefix, PORT=str(_free_port()))  # the script finds python
    result = subprocess.run(
        ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    assert 'Grad strides do not match' not in log  # DDP-friendly parameters
    metrics = val_metrics(str(tmp_path))
    assert 0.0 <= metrics['coco/segm_mAP'] <= 1.0
    assert osp.exists(tmp_path / 'iter_2.pth')


def test_missing_data_root_fails_at_start(trained, tmp_path):
    start = time.time()
    result = run([PYTHON, 'tools/train.py', trained['config'], '--work-dir',
                  str(tmp_path), '--cfg-options',
                  'train_dataloader.dataset.data_root=/nonexistent/coco/'])
    assert result.returncode != 0
    assert "data root not found: train_dataloader.dataset.data_root = " \
        "'/nonexistent/coco/'" in result.stderr
    assert time.time() - start < 120


def test_missing_checkpoint_and_unknown_option_fail_at_start(trained, tmp_path):
    from mmengine.config import Config
    from mmengine.runner import Runner
    from preflight import check_config
    cfg = Config.fromfile(trained['config'])
    cfg.model.backbone.init_cfg.checkpoint = '/nonexistent/swin_b.pth'
    with pytest.raises(FileNotFoundError,
                       match=r"model.backbone.init_cfg.checkpoint = '/nonexistent"):
        check_config(cfg)
    cfg = Config.fromfile(trained['config'])
    cfg.load_from = '/nonexistent/iter_4.pth'
    with pytest.raises(FileNotFoundError, match='load_from'):
        check_config(cfg, mode='test')
    cfg = Config.fromfile(trained['config'])
    cfg.val_evaluator = dict(type='CocoMetric', ann_file=trained['data']['val'])
    cfg.test_dataloader.dataset.ann_file = 'annotations/missing.json'
    with pytest.raises(FileNotFoundError, match='annotations/missing.json'):
        check_config(cfg, mode='test')
    cfg = Config.fromfile(trained['config'])
    cfg.model.backbone.moppa_scope = 'local'
    cfg.work_dir = str(tmp_path)
    with pytest.raises(ValueError, match=r"model.backbone.moppa_scope = 'local': it must be "
                       r"one of \('window', 'global'\)"):
        Runner.from_cfg(cfg)


def test_dist_test_two_cpu_processes_reproduces_training_ap(trained, tmp_path):
    env = child_env()
    env.update(PYTHON=PYTHON, PORT=str(_free_port()))
    ckpt = osp.join(trained['work'], 'iter_4.pth')
    result = subprocess.run(
        ['bash', 'tools/dist_test.sh', trained['config'], ckpt, '2', '--work-dir',
         str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert 'Distributed training: True' in log
    assert same_metrics(logged_test_metrics(str(tmp_path)), val_metrics(trained['work']))
