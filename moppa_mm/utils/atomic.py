"""Files written whole or not at all: a temporary file in the same folder,
flushed and fsynced, then renamed over the target (``os.replace`` is atomic on
one file system), then the folder fsynced so that the rename survives a crash.

A kill or a full disk at any point leaves either the old file or the new one,
never a partial one under the final name; the temporary file of a killed
write is hidden (``.<name>.<pid>.partial``) and :func:`remove_stale_partials`
clears it.
"""
import errno
import io
import os
import os.path as osp
from typing import Callable, Union

PARTIAL_SUFFIX = '.partial'


def partial_path(path: str) -> str:
    folder, name = osp.split(path)
    return osp.join(folder, f'.{name}.{os.getpid()}{PARTIAL_SUFFIX}')


def fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder or '.', os.O_RDONLY)
    except OSError:  # e.g. a platform without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: Union[bytes, str, Callable[[io.IOBase], None]],
                 what: str = 'file') -> None:
    """Write ``data`` (bytes, text, or a function writing to a binary file
    object) to ``path`` atomically. On any error the temporary file is removed
    and an ``OSError`` names ``path`` (a full disk and a read-only folder
    say so)."""
    path = os.fspath(path)
    folder = osp.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = partial_path(path)
    try:
        with open(tmp, 'wb') as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode('utf-8') if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(error, OSError):
            reason = {errno.ENOSPC: 'the disk is full',
                      errno.EDQUOT: 'the disk quota is exceeded',
                      errno.EROFS: 'the file system is read-only',
                      errno.EFBIG: 'the file is larger than allowed (ulimit -f?)',
                      errno.EACCES: 'permission denied'}.get(error.errno, error.strerror)
            raise OSError(error.errno, f'cannot write the {what} {path!r}: {reason} '
                          '(nothing was left under that name)') from error
        raise
    fsync_dir(folder)


def atomic_torch_save(obj, path: str, what: str = 'checkpoint') -> None:
    """``torch.save`` through :func:`atomic_write`."""
    import torch
    atomic_write(path, lambda f: torch.save(obj, f), what=what)


def remove_stale_partials(folder: str) -> list:
    """Remove the temporary files that killed writes left in ``folder`` (those
    of processes that no longer run); returns their paths."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith('.') and name.endswith(PARTIAL_SUFFIX)):
            continue
        pid = name[:-len(PARTIAL_SUFFIX)].rsplit('.', 1)[-1]
        if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
            continue  # another live process is writing it
        try:
            os.remove(osp.join(folder, name))
            removed.append(osp.join(folder, name))
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
