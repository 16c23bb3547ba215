"""One training run per work dir.

Two runs in one work dir (a sweep launched twice, a resume started while the
first run still trains) both run to the end: they resume from and overwrite
each other's checkpoints, the last writer's ``epoch_N.pth`` wins, and both exit
0. :func:`lock_work_dir` takes an exclusive ``flock`` on the work-dir folder
itself (a descriptor of the folder, ``os.open(work_dir, O_RDONLY)``), so no
file in it can be deleted to lift the lock; the holder's process id, host,
start time and command are written to ``<work_dir>/.moppa_train.lock`` for
the message a second run stops with (:class:`WorkDirBusyError`, one line, no
traceback). The kernel releases the lock when the process ends, however it
ends: a killed run leaves nothing that blocks the next one.

Our ``tools/train.py`` takes the lock before the Runner is built, before
anything is written into the work dir. Under mmdet's and mmpretrain's own
tools, ``WorkDirLockRunner`` (``runner_type`` in ``moppa_guards.py``) takes it
before it writes its config (after its log folder is made), and
:class:`WorkDirLockHook` alone in ``before_run``, after both (see
docs/checks.md).
"""
import errno
import fcntl
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import Dict, Optional

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import BaseLoop

LOCK_NAME = '.moppa_train.lock'
_HELD: Dict[str, int] = {}  # real path of a work dir -> this process's lock on it


class WorkDirBusyError(SystemExit):
    """Another training run holds the work dir. A ``SystemExit`` (exit status
    1), as argparse's errors: the run stops with its one-line message and no
    traceback, under any tool."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _flock(fd: int) -> bool:
    """Lock ``fd``; False if another process holds the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _lock_file(path: str) -> Optional[int]:
    """Where a folder cannot be locked (NFS emulates ``flock`` with POSIX
    locks, which need a file open for writing): lock the file ``path``,
    re-checked after locking to be the file the name still gives. None if
    another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd):
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # deleted or replaced while we locked it: again


def _holder(path: str) -> dict:
    try:
        with open(path) as f:
            return json.loads(f.read() or '{}')
    except (OSError, ValueError):
        return {}


def lock_work_dir(work_dir: str) -> bool:
    """Take the lock of ``work_dir`` (made if missing) for this process, until
    :func:`unlock_work_dir` or the process's end.

    Returns:
        True where this call took the lock, False where this process held it
        already (our tool took it before the Runner; the hook finds it taken).

    Raises:
        WorkDirBusyError: another process holds it; the message names it.
    """
    os.makedirs(work_dir, exist_ok=True)
    key = osp.realpath(work_dir)
    if key in _HELD:
        return False
    info = osp.join(key, LOCK_NAME)
    fd = os.open(key, os.O_RDONLY)
    writer = None  # where the holder is recorded: the info file, or the lock's
    try:
        locked = _flock(fd)
    except OSError:  # a file system that cannot lock a folder
        os.close(fd)
        fd = writer = _lock_file(info)
        locked = fd is not None
    if not locked:
        if fd is not None:  # the folder's descriptor
            os.close(fd)
        holder = _holder(info)
        who = (f'pid {holder.get("pid")} on host {holder.get("host")}, started '
               f'{holder.get("started")}: {holder.get("command")}' if holder else
               f'its record {LOCK_NAME} was deleted; `lsof {key}` names it')
        raise WorkDirBusyError(
            f'WorkDirLock: the work dir {work_dir!r} is in use by another training '
            f'run ({who}); two runs in one work dir overwrite each other\'s '
            'checkpoints. Wait for it to end, stop it, or pass another --work-dir')
    _HELD[key] = fd
    record = json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                             started=time.strftime('%Y-%m-%d %H:%M:%S'),
                             command=' '.join(sys.argv))).encode()
    if writer is None:
        with open(info, 'wb') as f:
            f.write(record)
    else:  # closing another descriptor of the file would drop a POSIX lock
        os.ftruncate(writer, 0)
        os.pwrite(writer, record, 0)
    return True


def unlock_work_dir(work_dir: str) -> None:
    """Release this process's lock of ``work_dir`` (if it holds one)."""
    fd = _HELD.pop(osp.realpath(work_dir), None)
    if fd is not None:
        os.close(fd)


@HOOKS.register_module()
class WorkDirLockHook(Hook):
    """Refuses a second training run in a work dir while the first is alive
    (:func:`lock_work_dir`), before anything is resumed or trained. Under
    our tools the lock is already taken when the Runner is built; the hook
    finds it held. Test and validation runs are not locked."""

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._taken = False

    def before_run(self, runner) -> None:
        if not isinstance(runner._train_loop, BaseLoop) or not is_main_process():
            return  # not training (runner.test / runner.val), or another rank
        self._taken = lock_work_dir(runner.work_dir)

    def after_run(self, runner) -> None:
        if self._taken:
            unlock_work_dir(runner.work_dir)  # releases the flock
            self._taken = False
