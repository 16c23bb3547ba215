"""Runner state as tensors and plain containers: what a Runner checkpoint
holds besides the weights (message hub, optimizer, schedulers, meta) encoded
so that ``torch.load(weights_only=True)`` reads it without moppa_mm
(:func:`to_plain`, :func:`from_plain`), and a digest of it
(:func:`runner_state_digest`) that a resume checks before it restores it."""
import hashlib
from collections import OrderedDict
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

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


# the top-level key of a checkpoint that holds :func:`runner_state_digest`
RUNNER_STATE_DIGEST = 'runner_state_digest'


def runner_state_digest(checkpoint: dict) -> str:
    """A digest of every entry of a plain-encoded checkpoint but the model
    weights (``state_dict``, ``ema_state_dict``...: the MoPPA backbone's
    adapter record digests its own) and the digest itself: the optimizer and
    scheduler states, the message hub and ``meta``, i.e. what a resume
    restores. Tensors count by dtype, shape and bytes, containers by their
    order, everything else by its ``repr``."""
    digest = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            data = obj.detach().cpu().contiguous().reshape(-1)
            digest.update(f'T{data.dtype}{tuple(obj.shape)};'.encode())
            digest.update(data.view(torch.uint8).numpy())
        elif isinstance(obj, dict):
            digest.update(f'D{len(obj)};'.encode())
            for key, value in obj.items():
                digest.update(f'{key!r}:'.encode())
                feed(value)
        elif isinstance(obj, (list, tuple)):
            digest.update(f'{type(obj).__name__}{len(obj)};'.encode())
            for value in obj:
                feed(value)
        else:
            digest.update(f'{type(obj).__name__}:{obj!r};'.encode())

    for key, value in checkpoint.items():
        if key != RUNNER_STATE_DIGEST and not key.endswith('state_dict'):
            feed({key: value})
    return digest.hexdigest()[:32]
