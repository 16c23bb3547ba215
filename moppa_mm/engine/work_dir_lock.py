"""One training run per work dir: two runs in one (a sweep launched twice, a
resume started while the first still trains) overwrite each other's
checkpoints and both exit 0. The lock is an exclusive ``flock`` on the
work-dir folder itself (deleting a file cannot lift it; the kernel drops it
when the process ends, however it ends); ``<work_dir>/.moppa_train.lock``
names the holder. Taken in one place, :class:`WorkDirLockRunner` (the
config's ``runner_type``, set by ``configs/_base_/safe_training.py``), under
every tool.
"""
import contextlib
import errno
import fcntl
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import Dict, Iterator, Optional

from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

LOCK_NAME = '.moppa_train.lock'
_HELD: Dict[str, int] = {}  # real path of a work dir -> this process's locked descriptor


def _flock(fd: int) -> bool:
    """Lock ``fd``; False if another process holds the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def _lock_record_file(path: str) -> Optional[int]:
    """Where a folder cannot be locked (NFS emulates ``flock`` with POSIX
    locks, which need a file open for writing): lock the record file, checked
    after locking to be the file its name still gives. None if held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd):
            os.close(fd)
            return None
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        os.close(fd)  # deleted or replaced while we locked it: again


def _holder(record: str, folder: str) -> str:
    try:
        with open(record) as f:
            holder = json.loads(f.read() or '{}')
    except (OSError, ValueError):
        holder = None
    if not holder or not isinstance(holder, dict):
        return f'its record {LOCK_NAME} was deleted; `lsof {folder}` names it'
    return (f'pid {holder.get("pid")} on host {holder.get("host")}, started '
            f'{holder.get("started")}: {holder.get("command")}')


def _take(work_dir: str, folder: str) -> int:
    """Lock ``folder`` and record this process as its holder; the locked fd."""
    record = osp.join(folder, LOCK_NAME)
    by_record = False
    fd = os.open(folder, os.O_RDONLY)
    try:
        held = not _flock(fd)
    except OSError:  # a file system that cannot lock a folder
        os.close(fd)
        by_record = True
        fd = _lock_record_file(record)
        held = fd is None
    if held:
        if fd is not None:
            os.close(fd)
        raise SystemExit(
            f'WorkDirLock: the work dir {work_dir!r} is in use by another training run '
            f'({_holder(record, folder)}); two runs in one work dir overwrite each '
            "other's checkpoints. Wait for it to end, stop it, or pass another --work-dir")
    holder = json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                             started=time.strftime('%Y-%m-%d %H:%M:%S'),
                             command=' '.join(sys.argv))).encode()
    if by_record:  # closing another descriptor of the file would drop a POSIX lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder, 0)
    else:
        with open(record, 'wb') as f:
            f.write(holder)
    return fd


@contextlib.contextmanager
def work_dir_lock(work_dir: str) -> Iterator[None]:
    """Hold the lock of ``work_dir`` (made if missing) within the block; a
    block inside another of this process's on the same folder changes nothing.

    Raises:
        SystemExit: another process holds it (exit status 1, one line naming
            it and no traceback, under any tool).
    """
    os.makedirs(work_dir, exist_ok=True)
    folder = osp.realpath(work_dir)
    if folder in _HELD:
        yield
        return
    _HELD[folder] = _take(work_dir, folder)
    try:
        yield
    finally:
        os.close(_HELD.pop(folder))


def main_process_lock(work_dir: str):
    """:func:`work_dir_lock` in the main process, nothing in the others."""
    return work_dir_lock(work_dir) if is_main_process() else contextlib.nullcontext()


@RUNNERS.register_module()
class WorkDirLockRunner(Runner):
    """``Runner`` (same arguments) whose ``train()`` holds the work dir's lock
    (:func:`work_dir_lock`). ``Runner.__init__`` dumps its config into the
    work dir, before any hook runs, and whether the Runner will train is not
    known there (the test tools build it from the same config): the dump waits
    for ``train()`` (under the lock), ``val()`` or ``test()``."""

    def dump_config(self) -> None:
        self._config_pending = True

    def _dump_pending_config(self) -> None:
        if getattr(self, '_config_pending', False):
            self._config_pending = False
            super().dump_config()

    def train(self):
        with main_process_lock(self.work_dir):
            self._dump_pending_config()
            return super().train()

    def val(self) -> dict:
        self._dump_pending_config()
        return super().val()

    def test(self) -> dict:
        self._dump_pending_config()
        return super().test()
