"""Reading a checkpoint file without running code, with errors that name it.

A ``.pth`` file is a pickle: unpickling it with ``weights_only=False`` runs
whatever it names. Every loader of this package therefore uses
``torch.load(weights_only=True)`` (tensors, plain containers, numbers and
strings only); mmengine's own loader calls ``torch.load`` without
``weights_only``, which torch >= 2.6 takes as ``True``.

A file that needs more, is cut short or is no checkpoint is refused with a
:class:`CheckpointLoadError` naming it, and so is one whose weights or
optimizer state hold NaN or infinite values (:func:`check_finite`, which the
MoPPA models' load check runs too). The opt-in, for a file from a source you
trust, is torch's own environment variable ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``;
it applies to mmengine's loader and to ours alike.
"""
import contextlib
import os
import os.path as osp
import pickle
import struct
import urllib.error
import zipfile
from typing import Any, Iterator, List, Tuple

import numpy as np
import torch

from .errors import InputNotFoundError, MoPPAInputError

OPT_IN_ENV = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'
_TRUE_VALUES = ('1', 'y', 'yes', 'true')  # as torch.load reads the variable


class CheckpointLoadError(MoPPAInputError, RuntimeError):
    """A checkpoint cannot be used as it is: refused, cut short, no
    checkpoint, damaged, or holding NaN or infinite values. Another copy of
    the file (or another file) is the fix."""


def _explain(path: str, what: str, error: BaseException) -> CheckpointLoadError:
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) and 'weights_only' in text.replace(
            'Weights only', 'weights_only'):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        first_line = next((line for line in lines if 'nsupported' in line),
                          lines[0] if lines else '')
        first_line = first_line.replace('WeightsUnpickler error: ', '')
        if 'Unsupported global' not in first_line:  # e.g. "Unsupported operand 33"
            return CheckpointLoadError(
                f'{what} {path!r} is not a checkpoint that loads safely: its bytes '
                f'are not a pickle of tensors and plain containers ({first_line}): '
                f'{describe_file(path)}. Is the file corrupt, or not a PyTorch '
                'checkpoint? If it is a '
                f'checkpoint you trust, {OPT_IN_ENV}=1 loads it with '
                'weights_only=False.')
        return CheckpointLoadError(
            f'{what} {path!r} holds Python objects besides tensors and plain '
            f'containers, and loading it could run code ({first_line}). '
            f'Refused. If you trust the file, set {OPT_IN_ENV}=1 to load it with '
            'weights_only=False.')
    if osp.isfile(path) and osp.getsize(path) == 0:
        return CheckpointLoadError(f'{what} {path!r} is empty (0 bytes)')
    if is_npz(path):
        return CheckpointLoadError(
            f'{what} {path!r} is a NumPy .npz archive, not a PyTorch checkpoint '
            '(a JAX ViT release?): convert it once with `python '
            f'tools/model_converters/vit_to_mmpretrain.py jax {path} DST.pth` '
            'and use DST.pth')
    return CheckpointLoadError(
        f'{what} {path!r} could not be read: {describe_file(path)} '
        f'({type(error).__name__}: {text.strip().split(". ")[0][:300]})')  # not torch's advice


def is_npz(path: str) -> bool:
    """Whether ``path`` is a zip of ``.npy`` arrays (``np.savez``), which a
    PyTorch zip checkpoint (``<name>/data.pkl``, ``<name>/data/0``...) is not."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return bool(names) and all(name.endswith('.npy') for name in names)


_MAGIC = ((b'\x89PNG', 'a PNG image'), (b'\xff\xd8\xff', 'a JPEG image'),
          (b'\x1f\x8b', 'a gzip file'), (b'\x89HDF', 'an HDF5 file (Keras / h5py?)'),
          (b'%PDF', 'a PDF'), (b'\x93NUMPY', 'a NumPy .npy array'),
          (b'ELF', 'an executable'))


def describe_file(path: str) -> str:
    """What a file that does not load looks like, from its first bytes (and
    its size; a link says where it points)."""
    real = osp.realpath(path)
    link = f'a link to {real!r}, ' if osp.islink(path) else ''
    try:
        size = osp.getsize(real)
        with open(real, 'rb') as f:
            head = f.read(256)
    except OSError as error:
        return f'{link}unreadable ({error.strerror})'
    where = f'{link}{size} bytes, '
    if not head:
        return where + 'empty'
    if not head.strip(b'\0'):
        return where + ('zero bytes from the start: a file whose write was cut short '
                        '(a kill or a full disk while it was saved) or preallocated')
    if head.startswith(b'PK\x03\x04'):
        if not zipfile.is_zipfile(real):
            return where + ('the start of a zip archive (PyTorch\'s format) without its '
                            'end: truncated, as the half-written file of a killed save '
                            'or an incomplete download')
        with zipfile.ZipFile(real) as archive:
            names = archive.namelist()
        if not any(name.endswith('data.pkl') for name in names):
            return where + f'a zip archive that is not a PyTorch checkpoint ({names[:3]})'
        return where + 'a PyTorch zip checkpoint'
    if head[:1] == b'\x80':
        return where + 'a pickle (PyTorch\'s legacy format, or another program\'s)'
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return where + name
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in '\r\n\t' for c in text):
        first = text.splitlines()[0][:60] if text.strip() else ''
        return where + f'a text file, starting {first!r}'
    return where + f'binary data starting {head[:8].hex(" ")}'


def is_whole_checkpoint(path: str) -> bool:
    """Whether ``path`` is a whole PyTorch zip checkpoint (one cut short is not)."""
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith('data.pkl') for name in archive.namelist())
    except OSError:
        return False


# what torch.load raises on bytes that are not a checkpoint: a text file
# (KeyError: 101, the byte 'e' as a pickle opcode), a link to another file
# (IndexError), a cut-short file (OSError: [Errno 22] Invalid argument)...
_NOT_A_CHECKPOINT = (KeyError, IndexError, ValueError, OSError, struct.error,
                     UnicodeDecodeError, AttributeError, TypeError, OverflowError)


def _unreadable(path: str, what: str, error: BaseException) -> CheckpointLoadError:
    return CheckpointLoadError(
        f'{what} {path!r} is not a checkpoint PyTorch can read: {describe_file(path)} '
        f'({type(error).__name__}: {str(error).strip()[:200]})')


@contextlib.contextmanager
def naming_checkpoint(path: str, what: str = 'checkpoint') -> Iterator[None]:
    """Re-raise a loading failure inside the block as a
    :class:`CheckpointLoadError` that names ``path`` (and the opt-in where the
    file was refused for holding objects); a verdict of ours raised inside
    (a model's load check) gets the file's name in front."""
    try:
        yield
    except MoPPAInputError as error:
        if repr(path) not in str(error):
            error.args = (f'{what} {path!r}: {error}', )
        raise
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile) as error:
        raise _explain(path, what, error) from error
    except RuntimeError as error:  # torch's zip reader: truncated archives, .npz
        if 'PytorchStreamReader' in str(error) or 'zip archive' in str(error) \
                or is_npz(path) or any(  # a zip, not torch's: its reader's words
                    text in str(error) for text in ('hasRecord', 'inline_container')):
            raise _explain(path, what, error) from error
        if 'legacy .tar format' in str(error) and osp.isfile(path):
            raise _unreadable(path, what, error) from error
        raise
    except (FileNotFoundError, PermissionError):
        raise
    except urllib.error.URLError as error:  # a URL and no network (or no server)
        if '://' not in path:
            raise
        raise CheckpointLoadError(
            f'{what} {path!r} could not be downloaded ({error.reason}): without a '
            'network, download it where there is one and give the local file instead '
            '(for the pre-trained base: --cfg-options '
            'model.backbone.init_cfg.checkpoint=/path/to/file.pth)') from None
    except _NOT_A_CHECKPOINT as error:
        # the same exception types can come from code run inside the block
        # (e.g. a model's init_weights): named only when the file is no whole
        # PyTorch checkpoint
        if osp.isfile(path) and not is_whole_checkpoint(path):
            raise _unreadable(path, what, error) from error
        raise


def load_checkpoint_file(path: str, what: str = 'checkpoint',
                         map_location='cpu', mmap: bool = False) -> Any:
    """``torch.load`` a local file with ``weights_only=True`` (unless the user
    opted in), raising :class:`CheckpointLoadError` that names ``path``, also
    for a NaN or infinite tensor (weights, optimizer state: :func:`check_finite`).

    Args:
        path: the local file.
        what: how the error names the file (e.g. ``'pre-trained checkpoint'``).
        map_location: as :func:`torch.load`.
        mmap: map the tensors' storage instead of copying it into memory
            (checks; the finite check still reads every tensor once); files in
            torch's legacy format are read normally.
    """
    path = osp.expanduser(path)
    if not osp.isfile(path):
        raise InputNotFoundError(f'{what} {path!r} not found')
    with naming_checkpoint(path, what):
        if osp.getsize(path) == 0:
            raise EOFError('empty file')
        weights_only = os.getenv(OPT_IN_ENV, '0').lower() not in _TRUE_VALUES
        use_mmap = mmap and zipfile.is_zipfile(path)
        checkpoint = torch.load(path, map_location=map_location,
                                weights_only=weights_only, mmap=use_mmap)
    check_finite(checkpoint, f'{what} {path!r}')
    return checkpoint


# ------------------------------------------------------ non-finite values
# top-level entries of a Runner checkpoint that hold no state to train or
# evaluate with: the logged history (a NaN loss logged once is a fact of the
# past run) and the metadata
NOT_WEIGHTS = ('message_hub', 'meta')


def non_finite_tensors(obj: Any, where: str = '') -> List[Tuple[str, int, int]]:
    """``(key, non-finite count, size)`` of every floating-point tensor or
    array under ``obj`` (nested dicts, lists, tuples) that holds a NaN or an
    infinity; keys are dotted paths (``state_dict.backbone.cls_token``,
    ``optimizer.state.3.exp_avg``)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in 'fc':
            return []
        finite = np.isfinite(obj)
        return [] if finite.all() else [(where, int(finite.size - finite.sum()), obj.size)]
    if isinstance(obj, torch.Tensor):
        if not (obj.is_floating_point() or obj.is_complex()):
            return []
        finite = torch.isfinite(obj)
        return [] if bool(finite.all()) else [
            (where, int(finite.numel() - finite.sum()), obj.numel())]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return []
    found = []
    for key, value in items:
        found += non_finite_tensors(value, f'{where}.{key}' if where else str(key))
    return found


def check_finite(checkpoint: Any, source: str) -> None:
    """Raise :class:`CheckpointLoadError` if any floating-point tensor of
    ``checkpoint`` (weights, optimizer state; not :data:`NOT_WEIGHTS`) holds a
    NaN or an infinity. ``source`` names it (e.g. ``"checkpoint 'x.pth'"``)."""
    if isinstance(checkpoint, dict):
        checkpoint = {k: v for k, v in checkpoint.items() if k not in NOT_WEIGHTS}
    bad = non_finite_tensors(checkpoint)
    if not bad:
        return
    listed = ', '.join(f'{key} ({count} of {size})' for key, count, size in bad[:5])
    more = f', ... ({len(bad)} tensors in all)' if len(bad) > 5 else ''
    raise CheckpointLoadError(
        f'{source} holds NaN or infinite values in {len(bad)} '
        f'tensor{"s" if len(bad) > 1 else ""}: {listed}{more}. Training or testing '
        'with it gives NaN: was it saved by a run that diverged, or damaged? Take '
        'an earlier checkpoint, or the original pre-trained file.')
