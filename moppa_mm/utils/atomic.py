"""Files written whole or not at all: a hidden temporary file in the same
folder (``.<name>.<pid>.partial``), flushed and fsynced, renamed over the
target (``os.replace`` is atomic on one file system), then the folder fsynced
so that the rename survives a crash. A kill or a full disk at any point leaves
the old file or the new one, never a partial one under the final name."""
import contextlib
import errno
import io
import os
import os.path as osp
from typing import Callable, Iterator, List, Union

PARTIAL_SUFFIX = '.partial'
_REASONS = {errno.ENOSPC: 'the disk is full', errno.EDQUOT: 'the disk quota is exceeded',
            errno.EROFS: 'the file system is read-only', errno.EACCES: 'permission denied',
            errno.EFBIG: 'the file is larger than allowed (ulimit -f?)'}


@contextlib.contextmanager
def atomic_path(path: str, what: str = 'file') -> Iterator[str]:
    """The temporary path to write ``path``'s new content to (a writer that
    takes a path: an exporter); on leaving the block it is fsynced and renamed
    over ``path``. On any error the temporary file is removed and an
    ``OSError`` names ``path`` (and a full disk, a read-only folder...)."""
    path = os.fspath(path)
    folder, name = osp.split(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = osp.join(folder, f'.{name}.{os.getpid()}{PARTIAL_SUFFIX}')
    try:
        yield tmp
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(error, OSError):
            reason = _REASONS.get(error.errno, error.strerror)
            raise OSError(error.errno, f'cannot write the {what} {path!r}: {reason} '
                          '(nothing was left under that name)') from error
        raise
    with contextlib.suppress(OSError):  # a platform without directory fds
        fd = os.open(folder or '.', os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str, data: Union[bytes, str, Callable[[io.IOBase], None]],
                 what: str = 'file') -> None:
    """Write ``data`` (bytes, text, or a function writing to a binary file
    object) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path, what) as tmp, open(tmp, 'wb') as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode('utf-8') if isinstance(data, str) else data)


def atomic_torch_save(obj, path: str, what: str = 'checkpoint') -> None:
    """``torch.save`` through :func:`atomic_write`."""
    import torch
    atomic_write(path, lambda f: torch.save(obj, f), what=what)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale_partials(folder: str) -> List[str]:
    """Remove the temporary files that killed writes left in ``folder`` (those
    of processes that no longer run, or this one's); returns their paths."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = name[:-len(PARTIAL_SUFFIX)].rsplit('.', 1)[-1]
            if not (name.startswith('.') and name.endswith(PARTIAL_SUFFIX)) or (
                    pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid))):
                continue  # not ours, or another live process is writing it
            with contextlib.suppress(OSError):
                os.remove(osp.join(folder, name))
                removed.append(osp.join(folder, name))
    return removed
