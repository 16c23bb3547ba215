"""One training run per work dir.

Two runs in one work dir (a sweep launched twice, a resume started while the
first run still trains) both run to the end: they resume from and overwrite
each other's checkpoints, the last writer's ``epoch_N.pth`` wins, and both exit
0. :class:`WorkDirLockHook` takes an exclusive ``flock`` on
``<work_dir>/.moppa_train.lock`` before the run resumes or trains; a second run
stops naming the first one's process id, host and command. The kernel releases
the lock when the process ends, however it ends: a killed run leaves nothing
that blocks the next one.
"""
import fcntl
import json
import os
import os.path as osp
import socket
import sys
import time

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import BaseLoop

LOCK_NAME = '.moppa_train.lock'


class WorkDirBusyError(RuntimeError):
    pass


def lock_work_dir(work_dir: str):
    """Take the lock of ``work_dir``; returns the open lock file (keep it open:
    closing it releases the lock). Raises :class:`WorkDirBusyError` naming the
    run that holds it."""
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, LOCK_NAME)
    lock = open(path, 'a+')
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        try:
            holder = json.loads(lock.read() or '{}')
        except ValueError:
            holder = {}
        lock.close()
        raise WorkDirBusyError(
            f'the work dir {work_dir!r} is in use by another training run '
            f'(pid {holder.get("pid", "?")} on host {holder.get("host", "?")}, '
            f'started {holder.get("started", "?")}: {holder.get("command", "?")}); '
            'two runs in one work dir overwrite each other\'s checkpoints. Wait '
            'for it to end, stop it, or pass another --work-dir') from None
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps(dict(
        pid=os.getpid(), host=socket.gethostname(),
        started=time.strftime('%Y-%m-%d %H:%M:%S'), command=' '.join(sys.argv))))
    lock.flush()
    return lock


@HOOKS.register_module()
class WorkDirLockHook(Hook):
    """Refuses a second training run in a work dir while the first is alive
    (:func:`lock_work_dir`), before anything is resumed or written. Test and
    validation runs are not locked."""

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._lock = None

    def before_run(self, runner) -> None:
        if not isinstance(runner._train_loop, BaseLoop) or not is_main_process():
            return  # not training (runner.test / runner.val), or another rank
        self._lock = lock_work_dir(runner.work_dir)

    def after_run(self, runner) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
