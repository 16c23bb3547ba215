"""The work-dir lock against another real process: the folder's own flock
(deleting the record file does not lift it), the record file where a folder
cannot be locked (NFS), and WorkDirLockRunner, which writes its config into
the work dir only once its training holds the lock (validation and testing
take no lock). The tools' side, with two training processes, is in
tests/test_tools/test_durability.py."""
import errno
import fcntl
import glob
import json
import os
import os.path as osp
import re
import stat
import subprocess

import pytest
from mmengine.evaluator import Evaluator

from moppa_mm.engine.work_dir_lock import LOCK_NAME, WorkDirLockRunner, work_dir_lock
from tests.conftest import PYTHON
from tests.test_engine.test_rng_state_hook import (MeanError, RandomlyAugmented,
                                                   RandomlyWeightedRegression)

HOLD = '''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print('held', flush=True)
time.sleep(120)
'''


@pytest.fixture
def held_by_another_process(tmp_path):
    """``tmp_path/work`` locked by another process as lock_work_dir locks it."""
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    holder = subprocess.Popen([PYTHON, '-c', HOLD, str(work_dir)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        yield str(work_dir)
    finally:
        holder.kill()
        holder.wait()


def toy_runner(work_dir, name, runner=WorkDirLockRunner, **kwargs):
    loader = dict(dataset=RandomlyAugmented(), batch_size=2,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'))
    return runner(
        model=RandomlyWeightedRegression(), work_dir=work_dir, experiment_name=name,
        train_dataloader=loader, val_dataloader=loader, val_cfg=dict(),
        val_evaluator=Evaluator(MeanError()),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=1), default_hooks=dict(checkpoint=None),
        **kwargs)


def configs_in(work_dir):
    return glob.glob(osp.join(work_dir, '*.py'))


def test_the_lock_is_the_folder_s_not_its_file(held_by_another_process):
    work_dir = held_by_another_process
    open(osp.join(work_dir, LOCK_NAME), 'w').close()
    os.remove(osp.join(work_dir, LOCK_NAME))  # what a user might try
    refusal = (rf"^WorkDirLock: the work dir '{re.escape(work_dir)}' is in use by another "
               r"training run \(its record \.moppa_train\.lock was deleted; `lsof "
               rf"{re.escape(work_dir)}` names it\)")
    with pytest.raises(SystemExit, match=refusal), work_dir_lock(work_dir):
        pass
    assert os.listdir(work_dir) == []  # a refused run leaves nothing


def another_process_can_lock(path):
    result = subprocess.run([PYTHON, '-c', HOLD.replace('LOCK_EX)', 'LOCK_EX | fcntl.LOCK_NB)')
                             .replace('time.sleep(120)', ''),
                             path], capture_output=True, text=True)
    return result.stdout == 'held\n'


def test_lock_is_reentrant_in_its_process_and_released(tmp_path):
    work_dir = str(tmp_path / 'work')
    with work_dir_lock(work_dir):  # made, taken, the holder recorded
        assert json.load(open(osp.join(work_dir, LOCK_NAME)))['pid'] == os.getpid()
        with work_dir_lock(work_dir):  # the Runner's, inside the tool's
            pass
        assert not another_process_can_lock(work_dir)  # the inner block kept it
    assert another_process_can_lock(work_dir)  # released


def test_a_folder_that_cannot_be_locked_locks_its_record_file(tmp_path, monkeypatch):
    """NFS emulates flock with POSIX locks, which a folder's read-only
    descriptor cannot take (EBADF): the record file is locked instead."""
    flock = fcntl.flock

    def nfs_flock(fd, operation):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return flock(fd, operation)

    monkeypatch.setattr(fcntl, 'flock', nfs_flock)
    work_dir = str(tmp_path / 'work')
    record = osp.join(work_dir, LOCK_NAME)
    with work_dir_lock(work_dir):
        assert json.load(open(record))['pid'] == os.getpid()
        assert not another_process_can_lock(record)
    assert another_process_can_lock(record)


def test_runner_writes_its_config_only_under_the_lock(held_by_another_process):
    work_dir = held_by_another_process
    runner = toy_runner(work_dir, 'lock refused')
    assert configs_in(work_dir) == []  # held back by __init__
    with pytest.raises(SystemExit, match='is in use by another training run'):
        runner.train()
    assert configs_in(work_dir) == []  # the running run's config is safe

    runner = toy_runner(work_dir, 'lock not needed')
    runner.val()  # no lock to validate or test
    assert len(configs_in(work_dir)) == 1
