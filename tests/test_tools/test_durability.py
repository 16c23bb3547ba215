"""Durability through the real tools: a kill while a checkpoint is written
(every config family) or before last_checkpoint names it, two runs in one
work dir."""
import os
import os.path as osp
import re
import signal
import socket
import subprocess
import time

import pytest
import torch
from preflight import load_config  # tools/

from tests.conftest import PYTHON, REPO, child_env, dump_cfg
from tests.test_configs.test_every_config_runs import (  # noqa: F401  fixture
    generated, shrink_classifier, shrink_detector)

MMPRETRAIN_TRAIN = osp.join(osp.dirname(__import__('mmpretrain').__file__),
                            '.mim/tools/train.py')
FAMILIES = {
    'vtab1k': 'configs/vtab1k/moppa_vit-b-p16_in21k-augreg-pre_vtab1k-dtd.py',
    'fgvc': 'configs/fgvc/moppa_vit-b-p16_in21k-pre_fgvc-cub.py',
    'imagenet': 'configs/moppa/moppa_vit-b-p16_in21k-augreg-pre_8xb64-110e_in1k.py',
    'coco': 'configs/cascade_moppa_swin_b_coco.py',
}


def tiny_family_config(path, data, work_dir, max_epochs=3):
    """The shipped config, tiny (as test_every_config_runs), a checkpoint every
    epoch with the config's own checkpoint hook, one kept, no validation."""
    cfg = load_config(osp.join(REPO, path), work_dir=str(work_dir),
                      format_python_code=False)
    if cfg.default_scope == 'mmpretrain':
        shrink_classifier(cfg, data)
    else:
        shrink_detector(cfg, data)
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg.max_epochs = max_epochs
    cfg.train_cfg.val_interval = 100
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=1)
    cfg.default_hooks.logger.interval = 1
    return cfg


def train(config, work_dir, *extra, env=None, timeout=600):
    return subprocess.run(
        [PYTHON, 'tools/train.py', config, '--work-dir', str(work_dir), *extra],
        cwd=REPO, env=env or child_env(), capture_output=True, text=True,
        timeout=timeout)


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_kill_while_saving_leaves_a_checkpoint_to_resume(
        generated, tmp_path, family):  # noqa: F811  the imported fixture
    cfg = tiny_family_config(FAMILIES[family], generated, tmp_path)
    config = osp.join(tmp_path, 'tiny.py')
    cfg.dump(config)
    killed_cfg = cfg.copy()
    killed_cfg.custom_imports = dict(
        imports=list(cfg.custom_imports.imports) + ['tests.test_tools.kill_in_write'],
        allow_failed_imports=False)
    killed_config = osp.join(tmp_path, 'killed.py')
    killed_cfg.dump(killed_config)

    env = child_env()
    env['MOPPA_KILL_IN_WRITE'] = 'epoch_2.pth'
    killed = train(killed_config, tmp_path, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # the run died half-way through writing epoch 2: epoch 1 is still whole
    # and last_checkpoint names it; no partial file under a checkpoint's name
    with open(osp.join(tmp_path, 'last_checkpoint')) as f:
        last = f.read().strip()
    assert osp.basename(last) == 'epoch_1.pth', last
    assert osp.isfile(last), sorted(os.listdir(tmp_path))
    assert torch.load(last, weights_only=True)['meta']['epoch'] == 1
    assert not osp.exists(osp.join(tmp_path, 'epoch_2.pth'))

    resumed = train(config, tmp_path, '--resume')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'removed' in resumed.stdout + resumed.stderr  # the partial file
    names = sorted(os.listdir(tmp_path))
    assert 'epoch_3.pth' in names and 'epoch_1.pth' not in names, names
    assert not [n for n in names if n.endswith('.partial')], names
    with open(osp.join(tmp_path, 'last_checkpoint')) as f:
        assert osp.basename(f.read().strip()) == 'epoch_3.pth'


def upstream_train(config, work_dir, *extra):
    """mmpretrain's own tools/train.py (the config imports moppa_mm)."""
    return subprocess.run(
        [PYTHON, MMPRETRAIN_TRAIN, config, '--work-dir', str(work_dir), *extra],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)


def refusal_line(result):
    """The one line a refused run prints (no traceback)."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr, result.stderr[-3000:]
    # setuptools' warning, hidden by our tools and the install's start-up hook
    assert 'pkg_resources is deprecated' not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if 'is in use by another' in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith('WorkDirLock: the work dir'), lines[0]
    return lines[0]


def test_second_run_in_a_work_dir_is_refused_while_the_first_lives(
        generated, tmp_path):  # noqa: F811  the imported fixture
    """The lock is the work-dir folder's: deleting its file does not lift it.
    Under our tools and mmpretrain's own, the config's WorkDirLockRunner
    refuses in one line before it writes its config (its log folder is made)."""
    work_dir = tmp_path / 'work'
    cfg = tiny_family_config(FAMILIES['vtab1k'], generated, work_dir, max_epochs=1)
    config = dump_cfg(cfg, tmp_path / 'tiny.py')
    second_config = osp.join(tmp_path, 'second', 'run.py')  # the first's name
    os.makedirs(osp.dirname(second_config))
    cfg.optim_wrapper.optimizer.lr *= 2  # another run: another config text
    dump_cfg(cfg, second_config)
    cfg.custom_imports.imports = list(cfg.custom_imports.imports) + [
        'tests.test_tools.hold_run']
    cfg.custom_hooks = list(cfg.custom_hooks) + [dict(type='HoldHook')]
    os.makedirs(tmp_path / 'first')
    held_config = dump_cfg(cfg, tmp_path / 'first' / 'run.py')
    first = subprocess.Popen(
        [PYTHON, 'tools/train.py', held_config, '--work-dir', str(work_dir)],
        cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not osp.exists(osp.join(work_dir, 'held')):
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.5)
        before = sorted(os.listdir(work_dir))
        with open(osp.join(work_dir, 'run.py')) as f:
            first_dump = f.read()

        line = refusal_line(train(second_config, work_dir))
        assert f'another training run (pid {first.pid} on host {socket.gethostname()}' \
            in line, line
        assert [n for n in os.listdir(work_dir) if n not in before
                and not re.fullmatch(r'\d{8}_\d{6}', n)] == []  # a log folder at most
        with open(osp.join(work_dir, 'run.py')) as f:
            assert f.read() == first_dump

        # mmpretrain's own tool: the record deleted, the folder's lock holds
        os.remove(osp.join(work_dir, '.moppa_train.lock'))
        line = refusal_line(upstream_train(second_config, work_dir))
        assert 'its record .moppa_train.lock was deleted' in line, line
        with open(osp.join(work_dir, 'run.py')) as f:
            assert f.read() == first_dump
        assert not osp.exists(osp.join(work_dir, 'epoch_1.pth'))  # nothing trained
    finally:
        first.kill()
        first.wait()
    # the killed run leaves no lock behind
    third = train(config, work_dir)
    assert third.returncode == 0, third.stderr[-3000:]
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))


@pytest.mark.parametrize('tool', ['ours', 'mmpretrain'])
def test_resume_finds_the_checkpoint_last_checkpoint_does_not_name(
        generated, tmp_path, tool):  # noqa: F811  the imported fixture
    """Killed after epoch_1.pth was renamed into place, half-way through the
    first last_checkpoint (mmengine writes it in place): --resume goes on from
    epoch 1, under our tools and mmpretrain's own (the checkpoint hook's
    before_run points last_checkpoint at it)."""
    cfg = tiny_family_config(FAMILIES['vtab1k'], generated, tmp_path, max_epochs=2)
    config = dump_cfg(cfg, tmp_path / 'tiny.py')
    cfg.custom_imports.imports = list(cfg.custom_imports.imports) + [
        'tests.test_tools.kill_in_write']
    env = child_env()
    env['MOPPA_KILL_IN_WRITE'] = 'last_checkpoint'
    killed = train(dump_cfg(cfg, tmp_path / 'killed.py'), tmp_path, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    with open(osp.join(tmp_path, 'last_checkpoint')) as f:
        half = f.read()
    first = osp.join(tmp_path, 'epoch_1.pth')
    assert first.startswith(half) and half != first  # names no file
    assert torch.load(first, weights_only=True)['meta']['epoch'] == 1

    resume = train if tool == 'ours' else upstream_train
    resumed = resume(config, tmp_path, '--resume')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    note = (f'--resume: {tmp_path}/last_checkpoint names {half!r}, which is gone; resuming '
            f'from the newest complete checkpoint in the work dir, {first}')
    assert log.count(note) == 1, log[-3000:]
    assert not re.search(r'Epoch\(train\) +\[1\]', log), log[-3000:]  # not retrained
    assert re.search(r'Epoch\(train\) +\[2\]', log), log[-3000:]
    with open(osp.join(tmp_path, 'last_checkpoint')) as f:
        assert osp.basename(f.read().strip()) == 'epoch_2.pth'


def test_resume_with_a_changed_config_names_what_the_checkpoint_overrides(
        generated, tmp_path):  # noqa: F811  the imported fixture
    cfg = tiny_family_config(FAMILIES['vtab1k'], generated, tmp_path, max_epochs=1)
    config = osp.join(tmp_path, 'tiny.py')
    cfg.dump(config)
    first = train(config, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    lr = cfg.optim_wrapper.optimizer.lr

    resumed = train(config, tmp_path, '--resume', '--cfg-options',
                    f'optim_wrapper.optimizer.lr={lr * 10}', 'train_cfg.max_epochs=2')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert 'the config differs from the one the checkpoint was trained with in 2 ' \
           'value(s)' in log, log[-3000:]
    assert f'optim_wrapper.optimizer.lr: checkpoint {lr!r}, config {lr * 10!r} -> ' \
           "the run uses the checkpoint's (restored with the optimizer state)" in log
    assert "train_cfg.max_epochs: checkpoint 1, config 2 -> the run uses the " \
           "config's for the run's length" in log
    assert f'--resume from {tmp_path}/epoch_1.pth: ' in log
    assert 'load_from=<checkpoint> (without --resume)' in log
    assert osp.isfile(osp.join(tmp_path, 'epoch_2.pth'))

    refused = train(config, tmp_path, '--resume', '--cfg-options',
                    'optim_wrapper.optimizer.type=Adam', 'train_cfg.max_epochs=3')
    assert refused.returncode != 0
    assert 'the checkpoint was trained with the AdamW optimizer, the config has Adam' \
           in refused.stderr, refused.stderr[-3000:]
    assert not osp.exists(osp.join(tmp_path, 'epoch_3.pth'))
