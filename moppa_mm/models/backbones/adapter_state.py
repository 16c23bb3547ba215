"""What a MoPPA backbone's state dict holds, and what a load checks.

* **The base comes when the model is built.** A backbone whose ``init_cfg``
  names a ``Pretrained`` checkpoint loads it in ``__init__`` (as mmpretrain's
  ``LoRAModel`` does; :meth:`.adapter_mixin.AdapterMixin._build_base`), and
  records its fingerprint.
* **Saving.** ``state_dict()`` holds the adapters and the *adapter record*
  (key ``<backbone>._extra_state``, a uint8 tensor of UTF-8 JSON, so that
  every state-dict value stays a tensor for the tools that assume so:
  :func:`read_adapter_record` decodes it): how the adapters were built and
  which pre-trained base they were trained on, with a fingerprint of its
  weights. The frozen base is left out when the config names it (every tool's
  checkpoints are then adapter-only, megabytes); :func:`full_state` gives the
  whole state where it is wanted (publishing, merging).
* **Loading only loads.** One load pre-hook,
  :meth:`AdapterStateMixin._check_incoming_state`, compares what comes in with
  the model and stops with a named error (or warns): NaN / infinite tensors,
  shapes, a pre-trained base that lacks keys, a record whose options differ,
  an adapter-only checkpoint for a model without its base, or on another base
  (by fingerprint), a merged checkpoint for an unmerged model, a record that
  cannot be read (damaged, out of bounds, another format version, a field of
  the wrong type: :func:`record_problem`) or an adapter checkpoint without
  one. It never opens a file, fetches a URL, calls ``init_weights()`` or
  changes the model's structure: the base path a record names is shown in
  messages, never opened.
"""
import contextlib
import hashlib
import json
import os.path as osp
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from moppa_mm.operators import MoPPAUnit
from moppa_mm.operators.moppa_unit import FREQ_PARAMS
from moppa_mm.utils.checkpoints import check_finite
from moppa_mm.utils.errors import MoPPAInputError
from moppa_mm.utils.params import few, frozen_state_keys, matches, short_repr

RECORD_FORMAT = 'moppa_mm.adapter/1'
RECORD_KEY = '_extra_state'  # torch's key for a module's extra state

# The adapters' parameter names (relative to the backbone), by kind: the one
# place they are spelled. Everything else in a MoPPA backbone is the frozen
# pre-trained base. (kind, fnmatch patterns, label of the parameter tables)
ADAPTER_GROUPS = (
    ('moppa', ('*moppa*', ), 'moppa units'),
    ('conv_adapter', ('*conv_adapter*', ), 'conv adapters'),
    ('scale_shift', ('*ssf_*', ), 'scale & shift'),
)
ADAPTER_PATTERNS = tuple(p for _, patterns, _ in ADAPTER_GROUPS for p in patterns)


# Options whose default the backbones changed: a checkpoint that records the
# earlier default was most likely trained before the change. option -> (the
# earlier default, when it stopped being the default)
FORMER_DEFAULTS = {
    'moppa_cfg.init_mode': ('identity', '2026-11-25'),
    'moppa_cfg.heat_param': ('softplus', '2026-11-25, chosen on real images'),
}


def _describe(key: str, theirs: Any, ours: Any) -> str:
    """One difference between a checkpoint's adapter record and the model's."""
    former = FORMER_DEFAULTS.get(key)
    was = (f' (the backbones\' default until {former[1]})'
           if former and theirs == former[0] else '')
    key = key if len(key) <= 200 else f'{key[:200]}...'
    return f'{key}: {short_repr(theirs)} in the checkpoint{was}, {short_repr(ours)} in the model'


def is_adapter_key(name: str) -> bool:
    """Whether a backbone parameter / state-dict key belongs to an adapter."""
    return matches(name, ADAPTER_PATTERNS)


def _prefix_hint(incoming, lacking) -> str:
    """Where the keys given hold the missing ones behind one prefix (a
    whole-model file given as the base), the ``init_cfg`` line that takes them."""
    wanted = set(lacking)
    prefixes = Counter(key[:-len(name)] for key in incoming for name in
                       (key.split('.', 1)[-1], key.split('.', 2)[-1]) if name in wanted)
    prefixes.pop('', None)
    if not prefixes:
        return ''
    prefix, count = prefixes.most_common(1)[0]
    return (f' {count} of the missing keys are in the file behind the prefix {prefix!r}: '
            f"set model.backbone.init_cfg.prefix='{prefix}'")


class PretrainedMismatchError(MoPPAInputError, RuntimeError):
    """A state dict does not fit the MoPPA backbone it is loaded into."""


class AdapterRecordMismatchError(PretrainedMismatchError):
    """An adapter checkpoint was built with other options than the model."""


def _few(keys: Sequence[str], n: int = 5) -> str:
    return few(sorted(keys), n)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: records compare alike however they were
    stored."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _flatten(record: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = _plain(value)
    return flat


def encode_record(record: Dict[str, Any]) -> torch.Tensor:
    """The record as a state-dict value: a uint8 tensor of UTF-8 JSON."""
    data = json.dumps(record, sort_keys=True).encode('utf-8')
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class AdapterRecordError(AdapterRecordMismatchError):
    """A checkpoint's adapter record cannot be read: damaged, out of bounds, of
    another format version, or a field of the wrong type."""


# Bounds of a record: a detector's is a few kB, a few levels deep. A larger or
# deeper one is refused before it is parsed further (a message of its values,
# or a recursion through them, would be as large or as deep).
MAX_RECORD_BYTES = 1 << 20
MAX_RECORD_DEPTH = 16
# The record's fields and the types they hold; the required ones are there in
# every record of RECORD_FORMAT. ``base`` is null for a base as built (random).
_NULL = type(None)
RECORD_FIELDS = {'format': (str, ), 'backbone': (str, ), 'arch': (dict, ),
                 'adapters': (dict, ), 'moppa_cfg': (dict, _NULL), 'base': (dict, _NULL)}
OPTIONAL_RECORD_FIELDS = {'merged': (bool, ), 'heads': (dict, )}
BASE_FIELDS = {'fingerprint': (str, ), 'checkpoint': (str, _NULL), 'prefix': (str, _NULL)}


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iteratively: no
    recursion, and a container that holds itself stops at the limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in
                         (item.values() if isinstance(item, dict) else item))
    return False


def _type_problem(fields: Dict[str, Any], types: Dict[str, Tuple[type, ...]],
                  where: str = '') -> Optional[str]:
    for field, allowed in types.items():
        if field in fields and not isinstance(fields[field], allowed):
            names = ' or '.join('null' if t is _NULL else t.__name__ for t in allowed)
            return (f'field {where + str(field)!r} is {type(fields[field]).__name__} '
                    f'{short_repr(fields[field])}, not {names}')
    return None


def record_problem(value: Any) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(record, None)`` for a readable record of this version's format (the
    record decoded from its state-dict value), else ``(None, what is wrong)``.
    Sizes and nesting are bounded; every field's type is checked, so what
    reads the record afterwards meets no surprise."""
    if isinstance(value, torch.Tensor):
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
            return None, (f'is not valid JSON ({error.msg}: line {error.lineno} column '
                          f'{error.colno})')
        except RecursionError:
            return None, f'is nested more than {MAX_RECORD_DEPTH} levels deep'
    elif isinstance(value, dict):
        record = value
    else:
        return None, f'is a {type(value).__name__}, not a uint8 tensor of UTF-8 JSON'
    if not isinstance(record, dict):
        return None, f'is a JSON {type(record).__name__}, not an object'
    if _deeper_than(record, MAX_RECORD_DEPTH):
        return None, f'is nested more than {MAX_RECORD_DEPTH} levels deep'
    if record.get('format') != RECORD_FORMAT:
        found = (f'has format {short_repr(record["format"])}' if 'format' in record
                 else 'has no \'format\' field')
        return None, (f'{found}; this version of moppa_mm reads {RECORD_FORMAT!r} (a '
                      'checkpoint of another moppa_mm version, or not a MoPPA record)')
    lacking = [field for field in RECORD_FIELDS if field not in record]
    if lacking:
        return None, f'lacks the field(s) {lacking}'
    problem = _type_problem(record, {**RECORD_FIELDS, **OPTIONAL_RECORD_FIELDS})
    if problem is None and record['base'] is not None:
        if 'fingerprint' not in record['base']:
            return None, 'lacks the field \'base.fingerprint\''
        problem = _type_problem(record['base'], BASE_FIELDS, where='base.')
    return (None, problem) if problem else (record, None)


def check_adapter_record(value: Any, key: str, what: str) -> Optional[Dict[str, Any]]:
    """The record of a state dict (``value``: what it holds under ``key``),
    checked: None where there is none; a record that cannot be read (see
    :func:`record_problem`) raises :class:`AdapterRecordError` naming ``what``
    (the file), the key and what is wrong. The backbones' load and
    :class:`~moppa_mm.apis.AdapterBank` read records through it."""
    if value is None:
        return None
    record, problem = record_problem(value)
    if problem:
        raise AdapterRecordError(f'{what}: its adapter record (key {key!r}) {problem}')
    return record


def decode_record(value: Any) -> Optional[Dict[str, Any]]:
    """The record from its state-dict value (None if it is none, or one that
    cannot be read: :func:`check_adapter_record` says why)."""
    return record_problem(value)[0] if value is not None else None


def read_adapter_record(checkpoint: Dict[str, Any],
                        prefix: str = 'backbone.') -> Optional[Dict[str, Any]]:
    """The adapter record of a checkpoint (``{'state_dict': ...}``) or a state
    dict, for the backbone under ``prefix``; None where it has none or one that
    cannot be read::

        record = read_adapter_record(torch.load(path, weights_only=True))
        record['moppa_cfg'], record['base']
    """
    state = checkpoint.get('state_dict', checkpoint)
    return decode_record(state.get(prefix + RECORD_KEY))


def is_adapter_record(record: Any) -> bool:
    """Whether ``record`` (decoded) is an adapter record this version of
    moppa_mm reads."""
    return isinstance(record, dict) and record_problem(record)[1] is None


def fingerprint(tensors: Dict[str, torch.Tensor]) -> str:
    """A hash of named tensors (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f'{name}|{tensor.dtype}|{tuple(tensor.shape)};'.encode())
        data = tensor.to('cpu').contiguous().reshape(-1)
        if data.numel():
            digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _is_url(path: str) -> bool:
    return '://' in path


def _as_recorded(source: Optional[str]) -> Optional[str]:
    """How the record names the file a base came from (information for
    messages, never opened by a load): a URL as it is, a local file by its
    absolute path."""
    if not source:
        return None
    return source if _is_url(source) else osp.abspath(source)


@contextlib.contextmanager
def full_state(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``model.state_dict()`` holds the frozen base of every
    MoPPA backbone inside ``model`` too (publishing a self-contained checkpoint,
    merging)::

        with full_state(model):
            torch.save({'state_dict': model.state_dict()}, 'full.pth')
    """
    backbones = [m for m in model.modules() if isinstance(m, AdapterStateMixin)]
    saved = [m._full_state for m in backbones]
    for module in backbones:
        module._full_state = True
    try:
        yield model
    finally:
        for module, value in zip(backbones, saved):
            module._full_state = value


class AdapterStateMixin:
    """The state-dict contract of a MoPPA backbone (see the module docstring).

    Subclasses provide :meth:`arch_record` and :meth:`adapter_options`, and set
    ``PRETRAINED_MAY_LACK`` (base parameters that releases legitimately lack),
    ``RESIZES_FREQUENCY_MAPS`` (the units' grid follows the image size, so
    frequency maps of another grid are resized, not refused),
    ``RECORD_MAY_DIFFER`` (record keys that may differ, e.g. the image size)
    and ``FINGERPRINT_SKIPS`` (base keys resized on load, left out of the
    fingerprint). ``fresh_params`` (patterns, set before the backbone freezes)
    are parameters of the base class that no pre-trained base holds (created
    for the fine-tuning output path, e.g. mmpretrain ViT's ``ln2`` under
    ``out_type='avg_featmap'``): they train with the adapters from their init
    (or from the base, where it has them), a base may lack them, and they are
    neither part of its fingerprint nor make a checkpoint self-contained.

    Args of the backbones:
        strict_adapter_record (bool): Stop when an adapter checkpoint's record
            disagrees with the model, cannot be read, or is absent (True,
            default). False only warns: for a checkpoint you have checked by
            other means.
    """

    PRETRAINED_MAY_LACK: Sequence[str] = ()
    merged: bool = False  # adapters folded in for inference (merge_adapters)
    RESIZES_FREQUENCY_MAPS: bool = False
    RECORD_MAY_DIFFER: Sequence[str] = ()
    FINGERPRINT_SKIPS: Sequence[str] = ()
    fresh_params: Sequence[str] = ()

    def _init_adapter_state(self, strict_adapter_record: bool) -> None:
        """Call at the end of ``__init__``: after the base classes' own load
        pre-hooks (mmpretrain's ViT resizes ``pos_embed`` in one), so that
        shapes are compared as they will be loaded."""
        self.strict_adapter_record = strict_adapter_record
        self._full_state = False
        # the pre-trained base in the model: {'checkpoint', 'prefix',
        # 'fingerprint'}; None while the base is as built (random)
        self._base: Optional[Dict[str, Optional[str]]] = None
        # the base file init_weights is loading now, for its messages
        self._checkpoint_source: Optional[str] = None
        self._checkpoint_prefix: Optional[str] = None
        self._register_state_dict_hook(self._leave_out_frozen_base)
        self._register_load_state_dict_pre_hook(self._check_incoming_state,
                                                with_module=False)

    @property
    def pretrained_base(self) -> Optional[Dict[str, Optional[str]]]:
        """The pre-trained base in the model (``checkpoint``, ``prefix``,
        ``fingerprint``), None while it is as built (random)."""
        return dict(self._base) if self._base else None

    def configured_base(self) -> Tuple[Optional[str], Optional[str]]:
        """``(checkpoint, prefix)`` of the ``Pretrained`` ``init_cfg``;
        ``(None, None)`` when the config names no pre-trained base."""
        init_cfg = self.init_cfg if isinstance(self.init_cfg, dict) else {}
        if init_cfg.get('type') != 'Pretrained' or not init_cfg.get('checkpoint'):
            return None, None
        return init_cfg['checkpoint'], init_cfg.get('prefix')

    # -------------------------------------------------------------- record
    def arch_record(self) -> Dict[str, Any]:
        """The base architecture (dims, depths, heads, patch, window...)."""
        raise NotImplementedError

    def adapter_options(self) -> Dict[str, Any]:
        """The adapters' switches and shapes (``use_*``, heads, scope, grid...)."""
        raise NotImplementedError

    def adapter_record(self) -> Dict[str, Any]:
        """How this backbone's adapters were built, and on which base: what
        every checkpoint records and what loading compares."""
        record = dict(
            format=RECORD_FORMAT,
            backbone=type(self).__name__,
            arch=_plain(self.arch_record()),
            adapters=_plain(self.adapter_options()),
            moppa_cfg=self.moppa_config.to_dict() if self._has_units() else None,
            base=dict(self._base) if self._base else None,
        )
        if self.merged:  # the weights hold the adapters: a whole, other model
            record['merged'] = True
        return record

    def _has_units(self) -> bool:
        return any(isinstance(m, MoPPAUnit) for m in self.modules())

    def get_extra_state(self) -> torch.Tensor:
        return encode_record(self.adapter_record())

    def set_extra_state(self, state: Any) -> None:
        """The record was checked before any tensor was copied
        (:meth:`_check_incoming_state`); nothing to restore from it."""

    def record_differences(self, record: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
        """``(key, checkpoint's value, model's value)`` of every recorded option
        that differs from this model's (the base and the heads are compared
        apart)."""
        ours = _flatten({k: v for k, v in self.adapter_record().items()
                         if k not in ('base', 'heads', 'format')})
        theirs = _flatten({k: v for k, v in record.items()
                           if k not in ('base', 'heads', 'format')})
        return [(key, theirs.get(key, '(not recorded)'), ours.get(key, '(none)'))
                for key in sorted(set(ours) | set(theirs))
                if key not in self.RECORD_MAY_DIFFER
                and ours.get(key, '(none)') != theirs.get(key, '(not recorded)')]

    # -------------------------------------------------------------- saving
    @property
    def saves_adapters_only(self) -> bool:
        """Whether ``state_dict()`` leaves the frozen base out: when the base in
        the model came from the file the config names, outside
        :func:`full_state`, unmerged."""
        return bool(self._base and self._base.get('checkpoint')) and \
            not self._full_state and not self.merged

    def _leave_out_frozen_base(self, module, state_dict, prefix, local_metadata):
        if self.saves_adapters_only:
            for key in frozen_state_keys(self, keep=ADAPTER_PATTERNS):
                state_dict.pop(prefix + key, None)

    def _own_full_state(self) -> Dict[str, torch.Tensor]:
        full, self._full_state = self._full_state, True
        try:
            return {k: v for k, v in self.state_dict().items() if k != RECORD_KEY}
        finally:
            self._full_state = full

    # ------------------------------------------------------------- loading
    def _base_fingerprint(self, incoming: Dict[str, torch.Tensor]) -> str:
        skips = tuple(self.FINGERPRINT_SKIPS) + tuple(self.fresh_params)
        base = {k: v for k, v in incoming.items() if isinstance(v, torch.Tensor)
                and not is_adapter_key(k) and not matches(k, skips)}
        return fingerprint(base)

    def _check_incoming_state(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs) -> None:
        """Every loader ends here (torch's and mmengine's ``load_state_dict``,
        the ``Pretrained`` init, mmdet's Swin ``init_weights``). It compares,
        and stops or warns; it opens nothing and changes no module.

        * a NaN or infinite tensor is an error (``NonFiniteCheckpointError``);
        * a merged checkpoint needs a merged model, and the other way round;
        * any shape that differs from the model's is an error;
        * no adapter keys: a pre-trained base; every base parameter must be
          there (except ``PRETRAINED_MAY_LACK``); its fingerprint is recorded;
        * adapter keys: a fine-tuned checkpoint; its record must agree with
          the model and all of the model's adapters must be there; one without
          the frozen base needs the model's base to be the one it was trained
          on (the recorded fingerprint);
        * a record that cannot be read (:func:`record_problem`), or none in an
          adapter checkpoint (after the checks above), stops unless
          ``strict_adapter_record=False``.
        """
        incoming = {k[len(prefix):]: v for k, v in state_dict.items()
                    if k.startswith(prefix)}
        where = f' from {self._checkpoint_source!r}' if self._checkpoint_source else ''
        name = type(self).__name__
        given_record = incoming.pop(RECORD_KEY, None)
        check_finite(incoming, f'{name}: the state dict{where or " being loaded"}')
        record = self._incoming_record(given_record, prefix + RECORD_KEY, where)
        params = [k for k, _ in self.named_parameters()]
        adapters = [k for k in params if is_adapter_key(k)]
        given_adapters = [k for k in incoming if is_adapter_key(k)]
        if self.merged or (record or {}).get('merged'):
            self._check_merged(record, where)
        elif given_adapters and record:
            self._compare_record(record, where)  # before shapes: it names the cause
        own = self._own_full_state()
        self._check_shapes(incoming, own, where)
        if self.merged:
            self._accept_merged(incoming, own, record, where)
        elif not given_adapters:
            self._accept_base(incoming, params, where)
            for key in adapters:  # they keep their init: no missing-key noise
                state_dict.setdefault(prefix + key, own[key])
        else:
            self._accept_adapters(incoming, record, adapters, given_adapters, where)
            if given_record is None:  # after every check the tensors allow
                self._refuse_unrecorded(prefix + RECORD_KEY, where)
            lacking = [k for k in own if k not in incoming]
            for key in lacking:  # the base in the model stays: load it onto itself
                state_dict[prefix + key] = own[key]
        # a strict load of a file without a record (a pre-trained release)
        # must not report the record as missing
        state_dict[prefix + RECORD_KEY] = self.get_extra_state()

    def _incoming_record(self, value: Any, key: str,
                         where: str) -> Optional[Dict[str, Any]]:
        """The record a state dict holds (None if none); one that cannot be
        read stops the load, or, under ``strict_adapter_record=False``, is
        left out with a warning (the load then checks what the tensors
        allow)."""
        try:
            return check_adapter_record(value, key,
                                        f'{type(self).__name__}: the checkpoint{where}')
        except AdapterRecordError as error:
            self._stop_or_warn(
                f'{error}. Its options and base cannot be checked against the '
                'model\'s. To load it anyway, built with the options it was trained '
                'with, set model.backbone.strict_adapter_record=False.', AdapterRecordError)
            return None

    def _refuse_unrecorded(self, key: str, where: str) -> None:
        """An adapter checkpoint without a record: its options and its base
        cannot be checked; it loads only under ``strict_adapter_record=False``
        (its tensors were checked: finite, shapes, the model's adapters, a
        base in the model for an adapter-only one)."""
        self._stop_or_warn(
            f'{type(self).__name__}: the adapter checkpoint{where} has no adapter '
            f'record (key {key!r}: saved before moppa_mm recorded one, or removed): '
            'its tensors fit the model, but the options they were trained with '
            '(moppa_cfg, adapter switches) and the base they were trained on cannot '
            'be checked, and adapters under other options or on another base give '
            'wrong outputs without an error. To load it anyway, built with the '
            'options it was trained with, set model.backbone.strict_adapter_record=False.')

    def _check_merged(self, record: Optional[Dict[str, Any]], where: str) -> None:
        """A merged checkpoint (:meth:`merge_adapters`) loads only into a model
        built merged, and an unmerged one only into an unmerged model."""
        name = type(self).__name__
        if self.merged and not (record or {}).get('merged'):
            raise PretrainedMismatchError(
                f'{name} is merged for inference; the checkpoint{where} is not: load '
                'it into a model built from the config without model.backbone.merged, '
                'then merge (moppa_mm.merge_adapters)')
        if not self.merged:
            raise PretrainedMismatchError(
                f'{name}: the checkpoint{where} is merged (its adapters are folded into '
                'the weights: publish_model.py --merge), and this model is not. Build '
                'the model merged: model.backbone.merged=True in the config (in a '
                'tool: --cfg-options model.backbone.merged=True), or call '
                'moppa_mm.merge_adapters(model) before the load.')
        self._compare_record(record, where)

    def _accept_merged(self, incoming, own, record, where: str) -> None:
        """A merged checkpoint into a merged model: it must hold the whole
        backbone."""
        lacking = [k for k in own if k not in incoming]
        if lacking:
            raise PretrainedMismatchError(
                f'{type(self).__name__}: the merged checkpoint{where} lacks '
                f'{len(lacking)} of the model\'s tensors: {_few(lacking)}')
        self._base = dict(record['base']) if isinstance(record.get('base'), dict) else None

    def _check_shapes(self, incoming, own, where: str) -> None:
        # where the units' grid follows the image size, a frequency map
        # (grid, grid, heads) saved on another grid is resized by the unit
        # itself when it loads it: only the heads must agree
        resized_on_load = {f'{name}.{param}' for name, unit in self.named_modules()
                           if isinstance(unit, MoPPAUnit)
                           for param in FREQ_PARAMS if hasattr(unit, param)
                           } if self.RESIZES_FREQUENCY_MAPS else set()

        def fits(key, value):
            if value.shape == own[key].shape:
                return True
            return key in resized_on_load and value.dim() == 3 and \
                value.shape[2] == own[key].shape[2]

        mismatched = [f'{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} '
                      'in the model' for k, v in incoming.items()
                      if k in own and hasattr(v, 'shape') and not fits(k, v)]
        if mismatched:
            raise PretrainedMismatchError(
                f'{type(self).__name__}: {len(mismatched)} tensors of the state '
                f'dict{where} do not fit the model (a checkpoint of another '
                f'architecture, scope or window size?): {_few(mismatched, 3)}')

    def _accept_base(self, incoming, params, where: str) -> None:
        """A pre-trained base (no adapter keys)."""
        base = [k for k in params if not is_adapter_key(k)]
        required = [k for k in base if not matches(
            k, tuple(self.PRETRAINED_MAY_LACK) + tuple(self.fresh_params))]
        lacking = [k for k in required if k not in incoming]
        if lacking:
            raise PretrainedMismatchError(
                f'{type(self).__name__}: the pre-trained state dict{where} restores '
                f'{len(required) - len(lacking)} of the {len(required)} frozen base '
                f'parameters; missing: {_few(lacking)}. The frozen backbone '
                'would stay random: is it a checkpoint of this backbone, with '
                f'its keys (given {len(incoming)} keys, e.g. '
                f'{_few(list(incoming), 3) or "none"})?{_prefix_hint(incoming, lacking)}')
        self._base = dict(
            checkpoint=_as_recorded(self._checkpoint_source),
            prefix=self._checkpoint_prefix,
            fingerprint=self._base_fingerprint(incoming))

    def _accept_adapters(self, incoming, record, adapters, given_adapters,
                         where: str) -> None:
        name = type(self).__name__
        lacking_adapters = [k for k in adapters if k not in incoming]
        if len(lacking_adapters) == len(adapters):
            raise PretrainedMismatchError(
                f'{name}: the state dict{where} holds adapter tensors, but none of '
                f'this model\'s {len(adapters)}: a checkpoint of another model or '
                f'config? (it has e.g. {_few(given_adapters, 3)}; the model expects '
                f'e.g. {_few(adapters, 3)})')
        if lacking_adapters:
            raise PretrainedMismatchError(
                f'{name}: the state dict{where} holds adapters but lacks '
                f'{len(lacking_adapters)} of the model\'s {len(adapters)} adapter '
                f'parameters: {_few(lacking_adapters)}')
        known = set(adapters)
        foreign = [k for k in given_adapters if k not in known]
        if foreign:  # torch would drop them as unexpected keys: another unit
            gate = any(k.endswith('.gate') for k in foreign)
            self._stop_or_warn(
                f'{name}: the state dict{where} holds {len(foreign)} adapter tensors '
                f'this model does not have: {_few(foreign)}. The adapters were built '
                'with other options (unit experts, init_mode, switches)'
                + (": the '.gate' tensors come from moppa_cfg.init_mode='identity'"
                   if gate else '') + '; build the model with the options they were '
                'trained with.')
        if any(not is_adapter_key(k) and not matches(k, self.fresh_params)
               for k in incoming):
            # a self-contained checkpoint: its base is the model's now
            recorded = (record or {}).get('base') or {}
            self._base = dict(checkpoint=recorded.get('checkpoint'),
                              prefix=recorded.get('prefix'),
                              fingerprint=self._base_fingerprint(incoming))
            return
        self._check_base_of_adapters(record, where)

    def _check_base_of_adapters(self, record: Optional[Dict[str, Any]],
                                where: str) -> None:
        """An adapter-only checkpoint: the model's base (loaded when it was
        built) must be the one the adapters were trained on (by the recorded
        fingerprint; without a record, that there is a base). The recorded
        path is named, not opened."""
        name = type(self).__name__
        recorded = (record or {}).get('base') or {}
        trained_on = (f'The adapters were trained on {recorded["checkpoint"]!r} '
                      f'(fingerprint {recorded.get("fingerprint")}; the load does not '
                      'open it). ' if recorded.get('checkpoint') else '')
        if self._base is None:
            configured, _ = self.configured_base()
            why = (f'model.backbone.init_cfg names {configured!r}, which was not loaded '
                   '(missing when the model was built?)' if configured else
                   'model.backbone.init_cfg names no Pretrained checkpoint (mmdet\'s '
                   'init_detector clears it unless cfg_options is given)')
            raise PretrainedMismatchError(
                f'{name}: the checkpoint{where} is adapter-only (the adapters and the '
                f'heads, not the frozen pre-trained weights), and this model has no '
                f'pre-trained base: {why}. {trained_on}Build the model with its base: '
                'model.backbone.init_cfg=dict(type=\'Pretrained\', checkpoint=...) '
                '(with init_detector: init_detector(config, checkpoint, '
                'cfg_options={}); with MMSegmentation\'s init_model, which always '
                'clears init_cfg: cfg_options={\'model.backbone.pretrained\': BASE}), '
                'or make a self-contained checkpoint with '
                'tools/model_converters/publish_model.py --merge-base.')
        if record is not None and record['base'] is None:
            self._stop_or_warn(
                f'{name}: the adapter-only checkpoint{where} records no pre-trained base '
                '(its adapters were trained on a backbone as built, random), but the '
                f'model\'s base is {self._base.get("checkpoint")!r}: adapters on another '
                'base give wrong outputs.')
            return
        expected, ours = recorded.get('fingerprint'), self._base.get('fingerprint')
        if not expected or expected == ours:
            return
        if recorded.get('checkpoint') == self._base.get('checkpoint'):
            self._stop_or_warn(
                f'{name}: the pre-trained file {self._base.get("checkpoint")!r} has changed '
                f'since the adapters{where} were trained on it (fingerprint {expected} '
                f'then, {ours} now): adapters on another base give wrong outputs. '
                'Restore the original file, or make a self-contained checkpoint where '
                'it still is (publish_model.py --merge-base).')
        else:
            self._stop_or_warn(
                f'{name}: the adapters{where} were trained on the pre-trained base '
                f'{recorded.get("checkpoint")!r} (fingerprint {expected}; named by the '
                f'checkpoint, not opened), but the model\'s base is '
                f'{self._base.get("checkpoint")!r} (fingerprint {ours}): adapters on '
                'another base give wrong outputs. Point model.backbone.init_cfg.checkpoint '
                'at the base they were trained on.')

    def record_mismatches(self, record: Dict[str, Any]) -> List[str]:
        """:meth:`record_differences` in words, one line each."""
        return [_describe(*difference) for difference in self.record_differences(record)]

    def _compare_record(self, record: Dict[str, Any], where: str) -> None:
        differences = self.record_differences(record)
        if differences:
            mismatches = [_describe(*difference) for difference in differences]
            # the unit options a command line can set back (e.g. a checkpoint
            # of an earlier default, FORMER_DEFAULTS)
            options = [f'model.backbone.{key}={theirs}' for key, theirs, _ in differences
                       if key.startswith('moppa_cfg.') and len(key) < 100
                       and isinstance(theirs, (str, int, float, bool))
                       and len(str(theirs)) < 100][:10]
            self._stop_or_warn(
                f'{type(self).__name__}: the adapter checkpoint{where} was built with '
                f'other options than this model; {len(mismatches)} differ:\n  '
                + few(mismatches, 20, sep='\n  ') + '\nSet the checkpoint\'s values in '
                'model.backbone (moppa_cfg.<option> for the unit\'s options'
                + (f'; in a tool: --cfg-options {" ".join(options)}' if options else '')
                + '): its parameters mean something else under the model\'s. To load '
                'it anyway, set model.backbone.strict_adapter_record=False.')

    def _stop_or_warn(self, message: str,
                      error: type = AdapterRecordMismatchError) -> None:
        if self.strict_adapter_record:
            raise error(message)
        print_log(message + ' (strict_adapter_record=False: loading anyway)',
                  logger='current', level=30)

    # ----------------------------------------------- the model around it
    def _record_heads(self, name: str, parent: nn.Module, state_dict, prefix: str,
                      local_metadata) -> None:
        """State-dict hook of the parent (``parent.<name>`` is this backbone):
        the shapes of the parent's other tensors (heads, neck) join the record."""
        key = f'{prefix}{name}.{RECORD_KEY}'
        record = decode_record(state_dict.get(key))
        if parent._modules.get(name) is not self or record is None:
            return
        inside = f'{prefix}{name}.'
        record['heads'] = {k[len(prefix):]: list(value.shape)
                           for k, value in state_dict.items()
                           if k.startswith(prefix) and not k.startswith(inside)
                           and isinstance(value, torch.Tensor)}
        state_dict[key] = encode_record(record)

    def _check_heads(self, name: str, parent: nn.Module, state_dict, prefix: str,
                     *args) -> None:
        """Load pre-hook of the parent: an adapter checkpoint (it holds this
        backbone's adapters) whose heads have other shapes than the model's
        stops, instead of leaving them random with a warning."""
        inside = f'{prefix}{name}.'
        if parent._modules.get(name) is not self or not any(
                key.startswith(inside) and is_adapter_key(key[len(inside):])
                for key in state_dict):
            return
        own = dict(parent.named_parameters())
        own.update(parent.named_buffers())
        mismatched = [
            f'{key}: {tuple(state_dict[prefix + key].shape)} in the checkpoint, '
            f'{tuple(value.shape)} in the model'
            for key, value in own.items() if not key.startswith(f'{name}.')
            and isinstance(state_dict.get(prefix + key), torch.Tensor)
            and state_dict[prefix + key].shape != value.shape]
        if not mismatched:
            return
        where = f' {self._checkpoint_source!r}' if self._checkpoint_source else ''
        message = (f'{type(parent).__name__}: the adapter checkpoint{where} does not fit '
                   f'the model around its backbone; {len(mismatched)} tensors differ: '
                   f'{_few(mismatched, 3)}. Is it a checkpoint of another task (another '
                   'number of classes)? Its head would stay random.')
        if self.strict_adapter_record:
            raise PretrainedMismatchError(
                message + ' To start a new task from these adapters, set '
                'model.backbone.strict_adapter_record=False (the heads then start anew).')
        print_log(message + ' (strict_adapter_record=False: the adapters load, the '
                  'mismatched heads start anew)', logger='current', level=30)
        for key, value in own.items():
            if state_dict.get(prefix + key) is not None and not key.startswith(f'{name}.') \
                    and isinstance(state_dict[prefix + key], torch.Tensor) \
                    and state_dict[prefix + key].shape != value.shape:
                del state_dict[prefix + key]
