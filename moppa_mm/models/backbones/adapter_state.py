"""What a MoPPA backbone's state dict holds, and what it accepts.

* **Saving.** ``state_dict()`` holds the adapters and the *adapter record*
  (key ``<backbone>._extra_state``, a uint8 tensor of UTF-8 JSON, so that
  every state-dict value stays a tensor for the tools that assume so:
  :func:`read_adapter_record` decodes it): how the adapters were built and
  which pre-trained base they were trained on, with a fingerprint of its
  weights.
  The frozen base is left out whenever it can be restored from a file (the
  base came from a checkpoint): every tool's checkpoints are then adapter-only,
  megabytes instead of the backbone. :func:`full_state` gives the whole state
  where it is wanted (publishing, merging).
* **Loading.** Every loader ends in :meth:`AdapterStateMixin._check_incoming_state`:
  NaN / infinite tensors, shapes, a pre-trained base that lacks keys, and an
  adapter checkpoint whose record disagrees with the model (key, both values,
  the fix) stop with a named error. An adapter-only checkpoint gets its base
  from the recorded file (or ``init_cfg``), verified by the fingerprint.
"""
import contextlib
import hashlib
import json
import os.path as osp
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import print_log

from moppa_mm.operators import MoPPAUnit
from moppa_mm.operators.moppa_unit import FREQ_PARAMS
from moppa_mm.utils.checkpoints import check_finite
from moppa_mm.utils.params import matches

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


def _describe(key: str, theirs: Any, ours: Any) -> str:
    """One difference between a checkpoint's adapter record and the model's."""
    return f'{key}: {theirs!r} in the checkpoint, {ours!r} in the model'


def is_adapter_key(name: str) -> bool:
    """Whether a backbone parameter / state-dict key belongs to an adapter."""
    return matches(name, ADAPTER_PATTERNS)


class PretrainedMismatchError(RuntimeError):
    """A state dict does not fit the MoPPA backbone it is loaded into."""


class AdapterRecordMismatchError(PretrainedMismatchError):
    """An adapter checkpoint was built with other options than the model."""


def _few(keys: Sequence[str], n: int = 5) -> str:
    keys = sorted(keys)
    return ', '.join(keys[:n]) + (f', ... ({len(keys)} in all)' if len(keys) > n else '')


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


def decode_record(value: Any) -> Optional[Dict[str, Any]]:
    """The record from its state-dict value (None if it is not one)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        return None
    try:
        record = json.loads(bytes(value.tolist()).decode('utf-8'))
    except (UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_adapter_record(checkpoint: Dict[str, Any],
                        prefix: str = 'backbone.') -> Optional[Dict[str, Any]]:
    """The adapter record of a checkpoint (``{'state_dict': ...}``) or a state
    dict, for the backbone under ``prefix``; None where it has none::

        record = read_adapter_record(torch.load(path, weights_only=True))
        record['moppa_cfg'], record['base']
    """
    state = checkpoint.get('state_dict', checkpoint)
    return decode_record(state.get(prefix + RECORD_KEY))


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


def _restorable(source: Optional[str]) -> Optional[str]:
    """How the record names the file a base came from: a URL as it is (mmengine
    downloads and caches it), a local file by its absolute path; None for a
    base that came from no file."""
    if not source:
        return None
    if _is_url(source):
        return source
    return osp.abspath(source) if osp.isfile(source) else None


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
    fingerprint).

    Args of the backbones:
        strict_adapter_record (bool): Stop when an adapter checkpoint's record
            disagrees with the model (True, default). False only warns: for a
            checkpoint you have checked by other means.
    """

    PRETRAINED_MAY_LACK: Sequence[str] = ()
    merged: bool = False  # adapters folded in for inference (merge_adapters)
    RESIZES_FREQUENCY_MAPS: bool = False
    RECORD_MAY_DIFFER: Sequence[str] = ()
    FINGERPRINT_SKIPS: Sequence[str] = ()

    def _init_adapter_state(self, strict_adapter_record: bool) -> None:
        """Call at the end of ``__init__``: after the base classes' own load
        pre-hooks (mmpretrain's ViT resizes ``pos_embed`` in one), so that
        shapes are compared as they will be loaded."""
        self.strict_adapter_record = strict_adapter_record
        self._full_state = False
        # the pre-trained base in the model: {'checkpoint', 'prefix',
        # 'fingerprint'}; None while the base is as built (random)
        self._base: Optional[Dict[str, Optional[str]]] = None
        self._checkpoint_source: Optional[str] = None  # the file being loaded
        self._checkpoint_prefix: Optional[str] = None
        self._register_state_dict_hook(self._leave_out_frozen_base)
        self._register_load_state_dict_pre_hook(self._check_incoming_state,
                                                with_module=False)

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

    def _record_differences(self, record: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
        """``(key, checkpoint's value, model's value)`` of every recorded option
        that differs."""
        ours = _flatten({k: v for k, v in self.adapter_record().items()
                         if k not in ('base', 'heads', 'format')})
        theirs = _flatten({k: v for k, v in record.items()
                           if k not in ('base', 'heads', 'format')})
        return [(key, theirs.get(key, '(not recorded)'), ours.get(key, '(none)'))
                for key in sorted(set(ours) | set(theirs))
                if key not in self.RECORD_MAY_DIFFER
                and ours.get(key, '(none)') != theirs.get(key, '(not recorded)')]

    def _record_mismatches(self, record: Dict[str, Any]) -> List[str]:
        """:meth:`_record_differences` in words, one line each."""
        return [_describe(*difference) for difference in self._record_differences(record)]

    # -------------------------------------------------------------- saving
    def _frozen_base_keys(self) -> List[str]:
        """The state keys a fine-tuning run does not change: frozen base
        parameters and the buffers of modules whose parameters are all frozen
        base ones (e.g. Swin's relative position index)."""
        keys = [n for n, p in self.named_parameters()
                if not p.requires_grad and not is_adapter_key(n)]
        for module_name, module in self.named_modules():
            params = list(module.parameters(recurse=False))
            prefix = f'{module_name}.' if module_name else ''
            if params and not any(p.requires_grad for p in params) \
                    and not is_adapter_key(prefix):
                keys += [prefix + b for b, _ in module.named_buffers(recurse=False)
                         if b not in module._non_persistent_buffers_set]
        return keys

    @property
    def saves_adapters_only(self) -> bool:
        """Whether ``state_dict()`` leaves the frozen base out: when the base
        can be restored from a file (the one it came from, or ``init_cfg``'s:
        a copy made before the base was loaded, as mmengine's EMA model, saves
        as the model does), and outside :func:`full_state`."""
        if self._full_state or self.merged:
            return False
        init_cfg = self.init_cfg if isinstance(self.init_cfg, dict) else {}
        configured = init_cfg.get('type') == 'Pretrained' and init_cfg.get('checkpoint')
        return bool((self._base and self._base.get('checkpoint')) or configured)

    def _leave_out_frozen_base(self, module, state_dict, prefix, local_metadata):
        if self.saves_adapters_only:
            for key in self._frozen_base_keys():
                state_dict.pop(prefix + key, None)

    def _own_full_state(self) -> Dict[str, torch.Tensor]:
        full, self._full_state = self._full_state, True
        try:
            return {k: v for k, v in self.state_dict().items() if k != RECORD_KEY}
        finally:
            self._full_state = full

    # ------------------------------------------------------------- loading
    def _base_fingerprint(self, incoming: Dict[str, torch.Tensor]) -> str:
        base = {k: v for k, v in incoming.items() if isinstance(v, torch.Tensor)
                and not is_adapter_key(k) and not matches(k, self.FINGERPRINT_SKIPS)}
        return fingerprint(base)

    def _check_incoming_state(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs) -> None:
        """Every loader ends here (torch's and mmengine's ``load_state_dict``,
        the ``Pretrained`` init, mmdet's Swin ``init_weights``).

        * a NaN or infinite tensor is an error (``NonFiniteCheckpointError``);
        * any shape that differs from the model's is an error;
        * no adapter keys: a pre-trained base; every base parameter must be
          there (except ``PRETRAINED_MAY_LACK``); its fingerprint is recorded;
        * adapter keys: a fine-tuned checkpoint; its record must agree with
          the model, all of the model's adapters must be there, and a base it
          lacks is restored from the recorded file (or ``init_cfg``), verified
          by the recorded fingerprint.
        """
        incoming = {k[len(prefix):]: v for k, v in state_dict.items()
                    if k.startswith(prefix)}
        record = decode_record(incoming.pop(RECORD_KEY, None))
        where = f' from {self._checkpoint_source!r}' if self._checkpoint_source else ''
        name = type(self).__name__
        check_finite(incoming, f'{name}: the state dict{where or " being loaded"}')
        if self._valid_record(record) and (record.get('merged') or self.merged):
            self._accept_merged(incoming, record, where)
            state_dict[prefix + RECORD_KEY] = self.get_extra_state()
            return
        params = [k for k, _ in self.named_parameters()]
        adapters = [k for k in params if is_adapter_key(k)]
        given_adapters = [k for k in incoming if is_adapter_key(k)]
        if given_adapters and self._valid_record(record):
            self._compare_record(record, where)  # before shapes: it names the cause
        own = self._own_full_state()
        self._check_shapes(incoming, own, where)
        if not given_adapters:
            self._accept_base(incoming, params, where)
            for key in adapters:  # init_weights resets them: no missing-key noise
                state_dict.setdefault(prefix + key, own[key])
        else:
            self._accept_adapters(incoming, record, adapters, given_adapters, where)
            lacking = [k for k in own if k not in incoming]
            if lacking:
                own = self._own_full_state()  # the base as restored
                for key in lacking:  # keep the base as loaded: copy it onto itself
                    state_dict[prefix + key] = own[key]
                print_log(f'{name}: {len(incoming)} tensors{where} (adapter-only); '
                          f'{len(lacking)} frozen ones come from the pre-trained weights',
                          logger='current')
        # a strict load of a file without a record (a pre-trained release)
        # must not report the record as missing
        state_dict[prefix + RECORD_KEY] = self.get_extra_state()

    def _accept_merged(self, incoming, record, where: str) -> None:
        """A merged checkpoint (:meth:`merge_adapters`): the model is merged
        first (its values are then all replaced), and the checkpoint must
        hold the whole backbone."""
        name = type(self).__name__
        if not record.get('merged'):
            raise PretrainedMismatchError(
                f'{name} is merged for inference; the checkpoint{where} is not: load '
                'it into a model built from the config, then merge (merge_adapters)')
        if not self.merged:
            print_log(f'{name}: the checkpoint{where} is merged (adapters folded into '
                      'the weights): merging the model to match it', logger='current')
            self.merge_adapters()
        self._compare_record(record, where)
        own = self._own_full_state()
        self._check_shapes(incoming, own, where)
        lacking = [k for k in own if k not in incoming]
        if lacking:
            raise PretrainedMismatchError(
                f'{name}: the merged checkpoint{where} lacks {len(lacking)} of the '
                f'model\'s tensors: {_few(lacking)}')
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
        required = [k for k in base if not matches(k, self.PRETRAINED_MAY_LACK)]
        lacking = [k for k in required if k not in incoming]
        if lacking:
            raise PretrainedMismatchError(
                f'{type(self).__name__}: the pre-trained state dict{where} restores '
                f'{len(required) - len(lacking)} of the {len(required)} frozen base '
                f'parameters; missing: {_few(lacking)}. The frozen backbone '
                'would stay random: is it a checkpoint of this backbone, with '
                f'its keys (given {len(incoming)} keys, e.g. '
                f'{_few(list(incoming), 3) or "none"})?')
        self._base = dict(
            checkpoint=_restorable(self._checkpoint_source),
            prefix=self._checkpoint_prefix,
            fingerprint=self._base_fingerprint(incoming))

    def _accept_adapters(self, incoming, record, adapters, given_adapters,
                         where: str) -> None:
        name = type(self).__name__
        if not self._valid_record(record):
            print_log(f'{name}: the adapter checkpoint{where} has no adapter record '
                      '(saved before moppa_mm recorded one): its options cannot be '
                      'checked against the model\'s', logger='current', level=30)
            record = None
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
        recorded_base = (record or {}).get('base') or {}
        base_given = any(not is_adapter_key(k) for k in incoming)
        if base_given:  # a self-contained checkpoint: its base is the model's now
            self._base = dict(checkpoint=recorded_base.get('checkpoint'),
                              prefix=recorded_base.get('prefix'),
                              fingerprint=self._base_fingerprint(incoming))
            return
        if self._base is None:
            self._restore_base(recorded_base, where)
        expected = recorded_base.get('fingerprint')
        if expected and self._base.get('fingerprint') != expected \
                and recorded_base.get('checkpoint') == self._base.get('checkpoint'):
            self._stop_or_warn(
                f'{name}: the pre-trained file {self._base.get("checkpoint")!r} has changed '
                f'since the adapters{where} were trained on it (fingerprint {expected} '
                f'then, {self._base.get("fingerprint")} now): adapters on another base '
                'give wrong outputs. Restore the original file, or make a '
                'self-contained checkpoint where it still is (publish_model.py '
                '--merge-base).')
        elif expected and self._base.get('fingerprint') != expected:
            self._stop_or_warn(
                f'{name}: the adapters{where} were trained on the pre-trained base '
                f'{recorded_base.get("checkpoint")!r} (fingerprint {expected}), but '
                f'the model\'s base is {self._base.get("checkpoint")!r} (fingerprint '
                f'{self._base.get("fingerprint")}): adapters on another base give '
                'wrong outputs. Point model.backbone.init_cfg.checkpoint at the base '
                'they were trained on.')

    @staticmethod
    def _valid_record(record: Any) -> bool:
        return isinstance(record, dict) and record.get('format') == RECORD_FORMAT

    def _compare_record(self, record: Dict[str, Any], where: str) -> None:
        differences = self._record_differences(record)
        if differences:
            mismatches = [_describe(*difference) for difference in differences]
            # the unit options a command line can set back (e.g. a checkpoint
            # of the earlier default init_mode='identity')
            options = [f'model.backbone.{key}={theirs}' for key, theirs, _ in differences
                       if key.startswith('moppa_cfg.')
                       and isinstance(theirs, (str, int, float, bool))]
            self._stop_or_warn(
                f'{type(self).__name__}: the adapter checkpoint{where} was built with '
                f'other options than this model; {len(mismatches)} differ:\n  '
                + '\n  '.join(mismatches) + '\nSet the checkpoint\'s values in '
                'model.backbone (moppa_cfg.<option> for the unit\'s options'
                + (f'; in a tool: --cfg-options {" ".join(options)}' if options else '')
                + '): its parameters mean something else under the model\'s. To load '
                'it anyway, set model.backbone.strict_adapter_record=False.')

    def _stop_or_warn(self, message: str) -> None:
        if self.strict_adapter_record:
            raise AdapterRecordMismatchError(message)
        print_log(message + ' (strict_adapter_record=False: loading anyway)',
                  logger='current', level=30)

    def _restore_base(self, recorded: Dict[str, Optional[str]], where: str) -> None:
        """Load the frozen base an adapter-only checkpoint lacks: the recorded
        file if it is there, else ``init_cfg``'s checkpoint."""
        name = type(self).__name__
        init_cfg = self.init_cfg if isinstance(self.init_cfg, dict) else {}
        configured = init_cfg.get('checkpoint') if init_cfg.get('type') == 'Pretrained' \
            else None
        recorded_file = recorded.get('checkpoint')
        if recorded_file and (_is_url(recorded_file) or osp.isfile(recorded_file)):
            source, prefix = recorded_file, recorded.get('prefix')
        elif configured and (_is_url(configured) or osp.isfile(configured)):
            source, prefix = configured, init_cfg.get('prefix')
        else:
            named = (f'the recorded base {recorded_file!r} does not exist here, and '
                     if recorded_file else 'it records no base file, and ')
            configured_text = (f'model.backbone.init_cfg.checkpoint = {configured!r} does '
                               'not exist either' if configured else 'model.backbone.init_cfg '
                               'names no Pretrained checkpoint to take them from')
            raise PretrainedMismatchError(
                f'{name}: the checkpoint{where} is adapter-only: it does not hold '
                f'the frozen pre-trained weights; {named}{configured_text}. Set '
                'model.backbone.init_cfg=dict(type=\'Pretrained\', checkpoint=...) '
                'to the base it was trained on, or make a self-contained checkpoint '
                'with tools/model_converters/publish_model.py --merge-base.')
        print_log(f'{name}: adapter-only checkpoint{where}; loading the pre-trained '
                  f'base {source!r} first', logger='current')
        saved_cfg, saved_source = self.init_cfg, self._checkpoint_source
        self.init_cfg = ConfigDict(type='Pretrained', checkpoint=source)
        if prefix:
            self.init_cfg.prefix = prefix
        self._is_init = False  # mmengine skips a module initialised before
        try:
            self.init_weights()
        finally:
            self.init_cfg, self._checkpoint_source = saved_cfg, saved_source
        if self._base is None:  # a loader that bypassed the check
            raise PretrainedMismatchError(
                f'{name}: loading {source!r} did not restore the pre-trained base')

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
