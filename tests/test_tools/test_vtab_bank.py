"""``vtab_sweep.py test-bank``: every task's adapters on one base load give the
metrics that tools/test.py gives per task, in the same files and table."""
import glob
import json
import os.path as osp
import subprocess

import pytest
import torch
from mmengine.fileio import load
from mmengine.runner import Runner

import vtab_table  # tools/
from tests.conftest import PYTHON, REPO, child_env, dump_cfg
from tests.test_tools.test_vtab_pipeline import TASKS, tiny_vtab_cfg, vtab_root  # noqa: F401

PRETRAIN = 'in21k-augreg'
# top-1 and top-2: more than one number per task to agree on
CFG_OPTIONS = ['--cfg-options', 'test_evaluator.topk=(1,2)']


def run(args):
    result = subprocess.run([PYTHON] + args, cwd=REPO, env=child_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def metrics(test_dir):
    """The metrics of the newest run under ``test_dir`` (as collect reads them)."""
    with open(sorted(glob.glob(osp.join(test_dir, '*', '*.json')))[-1]) as f:
        return {k: v for k, v in json.load(f).items() if k.startswith('accuracy/')}


@pytest.fixture(scope='module')
def trained(vtab_root, tmp_path_factory):  # noqa: F811
    """Each task trained one epoch, as `vtab_sweep.py run` leaves it
    (<work_root>/<task>/last_checkpoint); its config in a config folder under
    the name the sweep looks for."""
    root, pretrained = vtab_root
    tmp = tmp_path_factory.mktemp('bank-sweep')
    work_root = tmp / 'work'
    config_dir = tmp / 'configs'
    config_dir.mkdir()
    for task in TASKS:
        cfg = tiny_vtab_cfg(root, pretrained, task, str(work_root / PRETRAIN / task))
        cfg.train_cfg.max_epochs = 1
        Runner.from_cfg(cfg.copy()).train()
        dump_cfg(cfg, config_dir / f'moppa_vit-b-p16_{PRETRAIN}-pre_vtab1k-{task}.py')
    return str(work_root), str(config_dir), tmp


def test_bank_mode_equals_tools_test_per_task(trained):
    work_root, config_dir, tmp = trained
    per_task = {}
    for task in TASKS:
        with open(osp.join(work_root, PRETRAIN, task, 'last_checkpoint')) as f:
            checkpoint = f.read().strip()
        config = osp.join(config_dir, f'moppa_vit-b-p16_{PRETRAIN}-pre_vtab1k-{task}.py')
        test_dir = str(tmp / 'per-task' / task)
        run(['tools/test.py', config, checkpoint, '--work-dir', test_dir,
             '--out', str(tmp / 'per-task' / f'{task}.pkl')] + CFG_OPTIONS)
        per_task[task] = metrics(test_dir)
    out = str(tmp / 'table')
    log = run(['tools/vtab_sweep.py', 'test-bank', '--pretrain', PRETRAIN, '--tasks', *TASKS,
               'cifar', '--work-root', work_root, '--config-dir', config_dir,
               '--no-params', '--out', out, '--out-preds', str(tmp / 'bank')] + CFG_OPTIONS)
    bank = {task: metrics(osp.join(work_root, PRETRAIN, task, 'test')) for task in TASKS}
    assert set(per_task['kitti']) == {'accuracy/top1', 'accuracy/top2'}
    assert bank == per_task
    for task in TASKS:  # every score, bit for bit
        ours = load(str(tmp / 'bank' / f'{task}.pkl'))
        theirs = load(str(tmp / 'per-task' / f'{task}.pkl'))
        assert len(ours) == len(theirs) == 12
        for mine, reference in zip(ours, theirs):
            assert mine['img_path'] == reference['img_path']
            assert torch.equal(mine['pred_score'], reference['pred_score'])
    # the base file was read once, no adapter checkpoint restored it
    assert log.count('load backbone. in model from') == 1
    assert 'adapter-only checkpoint' not in log
    assert 'test-bank: cifar left out: no ' in log
    assert f'test-bank: {len(TASKS)} tasks on one base' in log
    table = open(out + '.md').read()
    for task in TASKS:
        assert f'{per_task[task]["accuracy/top1"]:.1f}' in table
    assert vtab_table.collect(osp.join(work_root, PRETRAIN)) == {
        task: pytest.approx(per_task[task]['accuracy/top1']) for task in TASKS}
