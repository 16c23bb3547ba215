"""Loading checkpoints without running code, and writing ones that load so.

A ``.pth`` file is a pickle: unpickling it with ``weights_only=False`` runs
whatever it names. Every loader of this package therefore uses
``torch.load(weights_only=True)`` (tensors, plain containers, numbers and
strings only), and every checkpoint it writes holds nothing else
(:func:`to_plain` turns the Runner's message-hub buffers and numpy states into
tagged plain containers, :func:`from_plain` turns them back). mmengine's own
loader calls ``torch.load`` without ``weights_only``, which torch >= 2.6 takes
as ``True``.

A file that needs more, is cut short or is no checkpoint is refused with a
:class:`CheckpointLoadError` naming it, and so is one whose weights or
optimizer state hold NaN or infinite values (:func:`check_finite`, which the
MoPPA models' load check runs too). The opt-in, for a file from a source you
trust, is torch's own environment variable ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``;
it applies to mmengine's loader and to ours alike.
"""
import contextlib
import copyreg
import os
import os.path as osp
import pickle
import re
import struct
import urllib.error
import zipfile
from collections import OrderedDict
from typing import Any, Iterator, List, Optional, Tuple

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


def _is_whole_checkpoint(path: str) -> bool:
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
        if osp.isfile(path) and not _is_whole_checkpoint(path):
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


# ------------------------------------------- releases not converted
CONVERTER_TOOL = 'tools/model_converters/vit_to_mmpretrain.py'
# what a file looks like, by the format :func:`identify` finds
LOOKS_LIKE = {
    'jax': 'a JAX/Flax ViT release (cls, embedding/kernel, Transformer/encoderblock_*)',
    'mae': 'a timm / MAE ViT checkpoint (blocks.*, patch_embed.proj.*)',
    'mocov3': 'a MoCo v3 ViT checkpoint (module.base_encoder.*)',
    'swin': 'an official Swin release (layers.*.blocks.*, patch_embed.proj.*)',
    'converted': "already converted to mmpretrain's keys (backbone.*)",
}


class SourceFormatError(MoPPAInputError, ValueError):
    """A checkpoint is not in the format it is used as (an unconverted release
    given to a config, a converted file or another release given to a
    converter)."""


def _tensors_of(checkpoint: Any) -> dict:
    """The state dict a checkpoint wraps (``model``, ``state_dict`` or itself)."""
    if not isinstance(checkpoint, dict):
        return {}
    for key in ('model', 'state_dict'):
        if isinstance(checkpoint.get(key), dict):
            return checkpoint[key]
    return checkpoint


def identify(checkpoint: Any) -> Optional[str]:
    """The format a loaded checkpoint (or ``.npz`` arrays) looks like: a key
    of :data:`LOOKS_LIKE` or None."""
    keys = [k for k in _tensors_of(checkpoint) if isinstance(k, str)]

    def has(pattern):
        return any(re.match(pattern, k) for k in keys)

    if has(r'backbone\.'):
        return 'converted'
    if has(r'module\.base_encoder\.'):
        return 'mocov3'
    if has(r'layers\.\d+\.blocks\.\d+\.'):
        return 'swin'
    if has(r'blocks\.\d+\.') and has(r'patch_embed\.proj\.'):
        return 'mae'
    return 'jax' if 'cls' in keys and 'embedding/kernel' in keys else None


def convert_command(source: str, path: str) -> str:
    """The command that converts ``path`` from ``source`` (output beside it)."""
    stem = re.sub(r'(\.pth)?(\.tar)?$|\.npz$', '', path)
    return f'python {CONVERTER_TOOL} {source} {path} {stem}_mmpretrain.pth'


def check_converted(path: str, checkpoint: Any, prefix: str,
                    key: str = 'model.backbone.init_cfg.checkpoint',
                    backbone: Optional[str] = None) -> None:
    """Raise :class:`SourceFormatError` if ``checkpoint`` (loaded from
    ``path``, given as the config's ``key``) holds no key under ``prefix``,
    which mmengine's ``Pretrained`` init with that prefix requires (its own
    error names neither file nor format): say what the file looks like and
    the converter command, or, where the config's ``backbone`` type is of the
    other family (a Swin release for a ViT), that it is no base for it."""
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    if any(isinstance(k, str) and k.startswith(prefix) for k in state):
        return
    found = identify(checkpoint)
    example = sorted(map(str, _tensors_of(checkpoint)))[:3]
    head = f'pre-trained checkpoint {key} = {path!r} has no {prefix!r} keys (e.g. {example})'
    release = 'Swin' if found == 'swin' else 'ViT'
    if found not in (None, 'converted') and any(word in (backbone or '') for word in (
            'Swin', 'VisionTransformer')) and ('Swin' in backbone) != (release == 'Swin'):
        raise SourceFormatError(
            f'{head}: it is {LOOKS_LIKE[found]}, a {release} release, and this config '
            f'builds a {backbone}: give it a pre-trained '
            f'{"ViT" if release == "Swin" else "Swin"} (README, "Pre-trained checkpoints").')
    if found not in (None, 'converted'):
        raise SourceFormatError(
            f'{head}: it is {LOOKS_LIKE[found]}, not converted to mmpretrain\'s keys. '
            f'Convert it once with\n    {convert_command(found, path)}\n'
            f'and set {key} to the output.')
    raise SourceFormatError(
        f'{head}: not a converted pre-trained checkpoint of this backbone. The ViT '
        f'and Swin releases convert with {CONVERTER_TOOL} (README, "Pre-trained '
        'checkpoints").')


# ------------------------------------------------------ plain checkpoints
_TAG = '__moppa_plain__'
_PLAIN_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.Tensor,
                 torch.Size, torch.dtype, torch.device)


def _encode_ndarray(array: np.ndarray) -> dict:
    if array.dtype.kind in 'biufc':
        try:
            data = torch.from_numpy(np.ascontiguousarray(array).copy())
        except TypeError:  # a dtype torch lacks: keep the numbers as a list
            data = array.tolist()
    else:  # strings: plain lists
        data = array.tolist()
    return {_TAG: 'ndarray', 'dtype': array.dtype.str, 'shape': list(array.shape),
            'data': data}


def _decode_ndarray(item: dict) -> np.ndarray:
    data = item['data']
    array = data.numpy() if isinstance(data, torch.Tensor) else np.array(data)
    return array.astype(np.dtype(item['dtype'])).reshape(item['shape'])


def _plain_key(key: Any) -> bool:
    """Whether a dict key loads with ``weights_only=True`` as it is."""
    if isinstance(key, tuple):
        return all(_plain_key(item) for item in key)
    return isinstance(key, (str, int, float, type(None)))


def _type_name(obj: Any) -> str:
    return f'{type(obj).__module__}.{type(obj).__qualname__}'


def to_plain(obj: Any, where: str = 'checkpoint',
             left_out: Optional[List[Tuple[str, str]]] = None) -> Any:
    """A copy of ``obj`` that ``torch.load(weights_only=True)`` reads: numpy
    arrays and scalars and mmengine's ``HistoryBuffer`` become tagged dicts;
    containers (dicts, lists, tuples) are rebuilt, tensors and other plain
    leaves are kept as they are. Whatever needs no tag stays as it is, so a
    loader that never decodes (mmpretrain's ``get_model``, mmdet's
    ``init_detector`` reading ``meta['dataset_meta']``) sees it as saved.

    Any other object (a function, a class instance, a numpy object array, a
    dict key of such a type) cannot be stored so. With ``left_out`` (a list)
    it is left out: a dict drops the entry, a list or tuple holds ``None`` in
    its place, and ``(where it was, its type)`` is appended to ``left_out``.

    Raises:
        TypeError: without ``left_out``, for such an object, naming where it is.
    """
    from mmengine.logging import HistoryBuffer
    if isinstance(obj, np.ndarray) and obj.dtype.kind in 'biufcUS':
        return _encode_ndarray(obj)
    if isinstance(obj, np.generic) and obj.dtype.kind in 'biufcUS':
        # before the leaves: np.float64 is a float
        return {_TAG: 'npscalar', 'value': _encode_ndarray(np.asarray(obj))}
    if isinstance(obj, _PLAIN_LEAVES):
        return obj
    if isinstance(obj, HistoryBuffer):
        return {_TAG: 'HistoryBuffer', 'max_length': obj.max_length,
                'log': _encode_ndarray(obj._log_history),
                'count': _encode_ndarray(obj._count_history)}
    if isinstance(obj, dict):
        plain = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            if not _plain_key(key):
                _unstorable(key, f'{where}: the key {key!r}', left_out)
                continue
            item = to_plain(value, f'{where}[{key!r}]', left_out)
            if item is not _LEFT_OUT:
                plain[key] = item
        return plain
    if isinstance(obj, (list, tuple)):
        items = [to_plain(v, f'{where}[{i}]', left_out) for i, v in enumerate(obj)]
        items = [None if item is _LEFT_OUT else item for item in items]
        return items if isinstance(obj, list) else tuple(items)
    return _unstorable(obj, where, left_out)


_LEFT_OUT = object()  # what to_plain returns in place of what it leaves out


def _unstorable(obj: Any, where: str, left_out: Optional[list]) -> Any:
    if left_out is None:
        raise TypeError(f'{where} holds a {_type_name(obj)}, which '
                        'torch.load(weights_only=True) cannot read')
    left_out.append((where, _type_name(obj)))
    return _LEFT_OUT


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`. Dicts and lists are decoded in place
    (a reference kept to one of them sees the decoded values); values that
    were never encoded are returned unchanged, so decoding twice is harmless."""
    from mmengine.logging import HistoryBuffer
    if isinstance(obj, dict):
        kind = obj.get(_TAG)
        if kind == 'ndarray':
            return _decode_ndarray(obj)
        if kind == 'npscalar':
            return _decode_ndarray(obj['value'])[()]
        if kind == 'HistoryBuffer':
            return HistoryBuffer(_decode_ndarray(obj['log']),
                                 _decode_ndarray(obj['count']),
                                 max_length=obj['max_length'])
        for key in list(obj):
            obj[key] = from_plain(obj[key])
        return obj
    if isinstance(obj, list):
        obj[:] = [from_plain(v) for v in obj]
    elif isinstance(obj, tuple):  # rebuilt: its items may hold tagged values
        return tuple(from_plain(v) for v in obj)
    return obj


# ----------------------------------------- Runner checkpoints, weights_only
def _reduce_history_buffer(buffer) -> tuple:
    """``HistoryBuffer`` as its constructor call: its own ``__getstate__``
    adds the class's statistics functions, which pickle as ``getattr`` calls
    that no safe loader may allow; they are registered at import anyway."""
    return type(buffer), (buffer._log_history, buffer._count_history, buffer.max_length)


def allow_runner_checkpoints() -> None:
    """Checkpoints written by any mmengine Runner (with or without our hooks)
    load with ``torch.load(weights_only=True)``, as mmdet's and mmpretrain's own
    tools load them under torch >= 2.6: what they hold besides tensors and
    plain containers (the message hub's ``HistoryBuffer``, the numpy arrays,
    scalars and dtypes of logged values and random states) is allow-listed
    (torch's ``add_safe_globals``), and ``HistoryBuffer`` pickles as its
    constructor call (a ``copyreg`` registration, read by any loader)."""
    from mmengine.logging import HistoryBuffer
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals(
        [HistoryBuffer, multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype]
        + [getattr(np.dtypes, name) for name in dir(np.dtypes)
           if name.endswith('DType') and isinstance(getattr(np.dtypes, name), type)])


# ------------------------------------------------------ what --resume takes
# the names mmengine's CheckpointHook gives interval checkpoints (its default
# filename_tmpl), the number being the epoch or iteration
_INTERVAL_CHECKPOINT = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


def checkpoint_to_resume(work_dir: str) -> Tuple[Optional[str], str]:
    """What ``--resume`` without a file resumes from, for a local work dir:
    the checkpoint ``<work_dir>/last_checkpoint`` names (mmengine's
    ``find_latest_checkpoint``) or, when that file is missing or names a file
    that is gone, the newest interval checkpoint (``epoch_N.pth``,
    ``iter_N.pth``: the largest N, then the newest) that is a whole PyTorch
    zip archive (a file cut short by a kill is not): a run killed after a
    checkpoint's rename
    but before ``last_checkpoint`` was written, or a work dir copied without
    it, goes on from its last checkpoint instead of starting over.

    Returns:
        ``(path, note)``: ``path`` is None where there is nothing to resume
        (mmengine then trains from scratch), and is the named, missing file
        where no complete checkpoint replaces it (the loader then says it is
        missing); ``note`` is a line saying which checkpoint was taken
        instead of ``last_checkpoint``'s, empty where it was followed.
    """
    pointer = osp.join(work_dir, 'last_checkpoint')
    named = None
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    if named is not None and ('://' in named or osp.isfile(named)):
        return named, ''
    paths = [osp.join(work_dir, n) for n in (os.listdir(work_dir) if osp.isdir(work_dir)
                                             else []) if _INTERVAL_CHECKPOINT.match(n)]
    found = sorted((int(_INTERVAL_CHECKPOINT.match(osp.basename(p)).group(1)),
                    osp.getmtime(p), p) for p in paths
                   if osp.isfile(p) and _is_whole_checkpoint(p))
    if not found:
        return named, ''
    why = f'{pointer} names {named!r}, which is gone' if named else f'no {pointer}'
    return found[-1][2], (f'--resume: {why}; resuming from the newest complete '
                          f'checkpoint in the work dir, {found[-1][2]}')
