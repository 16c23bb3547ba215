"""The adapter record: what a MoPPA checkpoint says of itself, under the key
``<backbone>._extra_state`` (UTF-8 JSON in a uint8 tensor: every state-dict
value stays a tensor); the model adds to it (:func:`.model_hooks.save_adapter_state`).
"""
import hashlib
import json
import os.path as osp
import zlib
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from moppa_mm.operators import moppa_units
from moppa_mm.utils.params import matches, short_repr
from .adapter_params import RECORD_KEY, is_adapter_key

RECORD_FORMAT = 'moppa_mm.adapter/1'
# Bounds of a record (a detector's is a few kB, a few levels deep): a larger or
# deeper one is refused before a message or a recursion goes through it.
MAX_RECORD_BYTES = 1 << 20
MAX_RECORD_DEPTH = 16
# The fields and their types: the backbone's, then the model's. ``base`` is null
# for a base as built (random); the OPTIONS are compared with the model's.
_NULL = type(None)
BACKBONE_FIELDS = {'format': (str, ), 'backbone': (str, ), 'arch': (dict, ),
                   'adapters': (dict, ), 'moppa_cfg': (dict, _NULL), 'base': (dict, _NULL),
                   'merged': (bool, )}
MODEL_FIELDS = {'model': (str, ), 'heads': (dict, ), 'digest': (str, )}
BASE_FIELDS = {'fingerprint': (str, ), 'checkpoint': (str, _NULL), 'prefix': (str, _NULL)}
OPTIONS = ('arch', 'adapters', 'moppa_cfg')


def adapter_record(backbone: nn.Module) -> Dict[str, Any]:
    """How ``backbone``'s adapters were built (its ``arch_record()`` and
    ``adapter_options()``, the units' options) and on which base."""
    return dict(format=RECORD_FORMAT, backbone=type(backbone).__name__,
                arch=backbone.arch_record(),
                adapters=dict(backbone.adapter_options(),
                              params_not_in_base=list(backbone.params_not_in_base)),
                moppa_cfg=backbone.moppa_config.to_dict() if moppa_units(backbone) else None,
                base=backbone.pretrained_base, merged=backbone.merged)


def encode_record(record: Dict[str, Any]) -> torch.Tensor:
    data = json.dumps(record, sort_keys=True).encode('utf-8')
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _deeper_than(value: Any, limit: int) -> bool:  # iteratively
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in
                         (item.values() if isinstance(item, dict) else item))
    return False


def _wrong_type(fields: Dict[str, Any], types: Dict[str, Tuple[type, ...]],
                where: str = '') -> Optional[str]:
    """The first field of ``fields`` whose value is none of its ``types``."""
    for field, allowed in types.items():
        if field in fields and not isinstance(fields[field], allowed):
            names = ' or '.join('null' if t is _NULL else t.__name__ for t in allowed)
            return (f'field {where + str(field)!r} is {type(fields[field]).__name__} '
                    f'{short_repr(fields[field])}, not {names}')
    return None


def read_record(value: Any) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(record, None)`` for a readable record of this format, else ``(None, what
    is wrong)``: sizes and nesting bounded, every field's type checked."""
    if not isinstance(value, torch.Tensor):
        return None, f'is a {type(value).__name__}, not a uint8 tensor of UTF-8 JSON'
    if value.dtype != torch.uint8 or value.dim() != 1:
        return None, (f'is a {value.dtype} tensor of shape {tuple(value.shape)}, not '
                      'a 1-D uint8 tensor of UTF-8 JSON')
    if value.numel() > MAX_RECORD_BYTES:
        return None, (f'is {value.numel():,} bytes, more than the {MAX_RECORD_BYTES:,} '
                      'a record may take (one is a few kB)')
    try:
        record = json.loads(value.cpu().numpy().tobytes().decode('utf-8'))
    except UnicodeDecodeError as error:
        return None, f'is not UTF-8 text ({error.reason} at byte {error.start})'
    except json.JSONDecodeError as error:
        return None, f'is not valid JSON ({error.msg}: line {error.lineno} column {error.colno})'
    except RecursionError:
        return None, f'is nested more than {MAX_RECORD_DEPTH} levels deep'
    if not isinstance(record, dict):
        return None, f'is a JSON {type(record).__name__}, not an object'
    if _deeper_than(record, MAX_RECORD_DEPTH):
        return None, f'is nested more than {MAX_RECORD_DEPTH} levels deep'
    if record.get('format') != RECORD_FORMAT:
        found = (f'has format {short_repr(record["format"])}' if 'format' in record
                 else 'has no \'format\' field')
        return None, (f'{found}; this version of moppa_mm reads {RECORD_FORMAT!r} (a '
                      'checkpoint of another moppa_mm version, or not a MoPPA record)')
    lacking = [field for field in BACKBONE_FIELDS if field not in record]
    if lacking:
        return None, (f'lacks the field(s) {lacking} that this version writes (saved by an '
                      'earlier one, or edited): save the checkpoint again with this version')
    problem = _wrong_type(record, {**BACKBONE_FIELDS, **MODEL_FIELDS})
    if problem is None and record['base'] is not None:
        if 'fingerprint' not in record['base']:
            return None, 'lacks the field \'base.fingerprint\''
        problem = _wrong_type(record['base'], BASE_FIELDS, where='base.')
    return (None, problem) if problem else (record, None)


def decode_record(value: Any) -> Optional[Dict[str, Any]]:
    """The record from its state-dict value; None for none or an unreadable one."""
    return read_record(value)[0] if value is not None else None


def read_adapter_record(checkpoint: Mapping[str, Any],
                        prefix: str = 'backbone.') -> Optional[Dict[str, Any]]:
    """The adapter record of a checkpoint (``{'state_dict': ...}``) or a state
    dict, for the backbone under ``prefix``; None where none can be read::

        record = read_adapter_record(torch.load(path, weights_only=True))
        record['moppa_cfg'], record['base']
    """
    state = checkpoint.get('state_dict', checkpoint)
    return decode_record(state.get(prefix + RECORD_KEY))


def _as_recorded(source: Optional[str]) -> Optional[str]:
    """How a record names a base file: a URL as it is, a local file by its
    absolute path (information for messages, never opened by a load)."""
    return None if not source else source if '://' in source else osp.abspath(source)


def tensors_digest(tensors: Mapping[str, Any]) -> str:
    """A hash of the named tensors among ``tensors``: names, dtypes, shapes and
    a CRC-32 of the bytes of each, in name order."""
    digest = hashlib.sha256()
    for name in sorted(k for k, v in tensors.items() if isinstance(v, torch.Tensor)):
        data = tensors[name].detach().to('cpu').contiguous().reshape(-1)
        crc = zlib.crc32(data.view(torch.uint8).numpy()) if data.numel() else 0
        digest.update(f'{name}|{data.dtype}|{tuple(tensors[name].shape)}|{crc};'.encode())
    return digest.hexdigest()[:32]


def base_fingerprint(backbone: nn.Module, incoming: Mapping[str, torch.Tensor]) -> str:
    """The identity of the base a state dict gives ``backbone`` (the tensors it
    resizes on load, ``FINGERPRINT_SKIPS``, left out)."""
    skips = tuple(backbone.FINGERPRINT_SKIPS) + tuple(backbone.params_not_in_base)
    return tensors_digest({k: v for k, v in incoming.items()
                           if not is_adapter_key(k) and not matches(k, skips)})


def trained_digest(state: Mapping[str, Any], inside: str) -> str:
    """The digest a model's record carries: of every tensor it saves but the
    record (a base it carries too)."""
    return tensors_digest({k: v for k, v in state.items() if k != inside + RECORD_KEY})


def redigest(state: Dict[str, Any], inside: str) -> None:
    """The digest of ``state`` as it is now into a model's record under
    ``inside`` (the base added or left out after the save)."""
    record = decode_record(state.get(inside + RECORD_KEY))
    if record and 'digest' in record:
        state[inside + RECORD_KEY] = encode_record({**record,
                                                    'digest': trained_digest(state, inside)})
