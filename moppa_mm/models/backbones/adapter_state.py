"""What a MoPPA model's checkpoint holds, and the one check every load runs.

* **The record** (key ``<backbone>._extra_state``: UTF-8 JSON in a uint8 tensor,
  so that every state-dict value stays a tensor; :func:`read_adapter_record`):
  how the adapters were built and on which pre-trained base (its fingerprint);
  the model holding the backbone adds its class, its other tensors' shapes
  (``heads``) and a ``digest`` of all it saves.
* **What an adapter-only checkpoint leaves out**: :func:`frozen_base_keys`.
* **What a load is checked against**: :func:`checkpoint_problems`, pure, run by
  every load of the model, by :class:`~moppa_mm.apis.AdapterBank` and (its
  model-free part, :func:`stored_problems`) by ``publish_model.py``.

Format ``moppa_mm.adapter/1``: fields are only added, as optional ones
(``merged``, ``heads``; ``model``, ``digest`` after 0.1.0: without, no damage
check); a change of meaning changes the number. Earlier versions refuse newer.
"""
import hashlib
import json
import os.path as osp
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from moppa_mm.operators.moppa_unit import FREQ_PARAMS
from moppa_mm.utils.checkpoints import CheckpointLoadError, check_finite
from moppa_mm.utils.errors import MoPPAInputError
from moppa_mm.utils.params import few, matches, short_repr

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

# The backbone classes (as records hold them) as configs name them
KNOWN_AS = {f'MoPPA{kind}Transformer{suffix}': f"{package}'s MoPPA{kind}Transformer"
            for kind, suffix, package in (
                ('Swin', '', 'MMDetection'), ('Swin', 'Cls', 'MMPretrain'),
                ('Swin', 'Seg', 'MMSegmentation'), ('Vision', '', 'MMPretrain'),
                ('Vision', 'Seg', 'MMSegmentation'))}

# Unit options whose default the backbones changed: option -> (the retired
# default, when it was retired). A checkpoint that records it was most likely
# trained before the change, and its message says so.
RETIRED_DEFAULTS = {
    'moppa_cfg.init_mode': ('identity', '2026-11-25'),
    'moppa_cfg.heat_param': ('softplus', '2026-11-25, chosen on real images'),
}


class PretrainedMismatchError(MoPPAInputError, RuntimeError):
    """A checkpoint does not fit the model it is loaded into."""


class BaseOnlyCheckpoint(PretrainedMismatchError):
    """A whole model loaded with its backbone's pre-trained weights alone: right
    before training (``load_from``), so a load warns; the adapter bank refuses."""


class AdapterRecordMismatchError(PretrainedMismatchError):
    """A checkpoint does not fit in a way ``strict_adapter_record=False``
    loads anyway, with a warning: its record disagrees with the model, cannot
    be read or is absent, or the model around the backbone differs."""


def is_adapter_key(name: str) -> bool:
    """Whether a backbone parameter / state-dict key belongs to an adapter."""
    return matches(name, ADAPTER_PATTERNS)


# ------------------------------------------------------------------ record
# Bounds of a record: a detector's is a few kB, a few levels deep. A larger or
# deeper one is refused before it is parsed further (a message of its values,
# or a recursion through them, would be as large or as deep).
MAX_RECORD_BYTES = 1 << 20
MAX_RECORD_DEPTH = 16
# The record's fields and the types they hold; the required ones are in every
# record of RECORD_FORMAT. ``base`` is null for a base as built (random).
_NULL = type(None)
RECORD_FIELDS = {'format': (str, ), 'backbone': (str, ), 'arch': (dict, ),
                 'adapters': (dict, ), 'moppa_cfg': (dict, _NULL), 'base': (dict, _NULL)}
OPTIONAL_RECORD_FIELDS = {'merged': (bool, ), 'heads': (dict, ), 'model': (str, ),
                          'digest': (str, )}
BASE_FIELDS = {'fingerprint': (str, ), 'checkpoint': (str, _NULL), 'prefix': (str, _NULL)}
# the fields that are no option of the adapters (checked on their own, or not)
NOT_OPTIONS = ('format', 'backbone', 'base', 'merged', 'heads', 'model', 'digest')


def encode_record(record: Dict[str, Any]) -> torch.Tensor:
    """The record as a state-dict value: a uint8 tensor of UTF-8 JSON."""
    data = json.dumps(record, sort_keys=True).encode('utf-8')
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


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
    """``(record, None)`` for a readable record of this format (decoded from
    its state-dict value), else ``(None, what is wrong)``. Sizes and nesting
    are bounded and every field's type is checked, so what reads the record
    afterwards meets no surprise."""
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
    problem = _wrong_type(record, {**RECORD_FIELDS, **OPTIONAL_RECORD_FIELDS})
    if problem is None and record['base'] is not None:
        if 'fingerprint' not in record['base']:
            return None, 'lacks the field \'base.fingerprint\''
        problem = _wrong_type(record['base'], BASE_FIELDS, where='base.')
    return (None, problem) if problem else (record, None)


def decode_record(value: Any) -> Optional[Dict[str, Any]]:
    """The record from its state-dict value; None for none, or one that
    cannot be read (:func:`read_record` says why)."""
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


def _flatten(record: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = value
    return flat


def record_differences(record: Dict[str, Any], backbone: nn.Module
                       ) -> List[Tuple[str, Any, Any]]:
    """``(key, checkpoint's value, model's value)`` of every recorded option
    that differs from ``backbone``'s, but its ``RECORD_MAY_DIFFER``."""
    ours = json.loads(json.dumps(backbone.adapter_record()))  # as stored: lists
    ours, theirs = (_flatten({k: v for k, v in r.items() if k not in NOT_OPTIONS})
                    for r in (ours, record))
    return [(key, theirs.get(key, '(not recorded)'), ours.get(key, '(none)'))
            for key in sorted(set(ours) | set(theirs))
            if key not in backbone.RECORD_MAY_DIFFER
            and ours.get(key, '(none)') != theirs.get(key, '(not recorded)')]


def describe_difference(key: str, theirs: Any, ours: Any) -> str:
    """One difference of :func:`record_differences` in words."""
    retired = RETIRED_DEFAULTS.get(key)
    was = (f' (the backbones\' default until {retired[1]})'
           if retired and theirs == retired[0] else '')
    key = key if len(key) <= 200 else f'{key[:200]}...'
    return f'{key}: {short_repr(theirs)} in the checkpoint{was}, {short_repr(ours)} in the model'


# ------------------------------------------------------- what is saved
def fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """A hash of named tensors (names, dtypes, shapes and bytes, in name
    order): the identity of a pre-trained base."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f'{name}|{tensor.dtype}|{tuple(tensor.shape)};'.encode())
        data = tensor.to('cpu').contiguous().reshape(-1)
        if data.numel():
            digest.update(data.view(torch.uint8).numpy())
    return digest.hexdigest()


def frozen_base_keys(keys: Sequence[str], inside: str,
                     not_in_base: Sequence[str] = ()) -> List[str]:
    """The keys of the frozen base of the backbone under ``inside``
    (``not_in_base``: patterns of its parameters no base has): what an
    adapter-only checkpoint leaves out; the rest (adapters, heads, neck) is
    what fine-tuning trains."""
    not_in_base = tuple(not_in_base)
    return [k for k in keys if k.startswith(inside) and k != inside + RECORD_KEY
            and not is_adapter_key(k[len(inside):])
            and not matches(k[len(inside):], not_in_base)]


def trained_digest(state: Mapping[str, Any], inside: str) -> str:
    """The digest a record carries: of every tensor of ``state`` but the record,
    a base it carries too (names, dtypes, shapes and a CRC-32 of the bytes of
    each, in name order; a CRC runs at ~4 GB/s, blake2b at a fifth of that)."""
    digest = hashlib.sha256()
    for name in sorted(k for k, v in state.items()
                       if k != inside + RECORD_KEY and isinstance(v, torch.Tensor)):
        data = state[name].detach().to('cpu').contiguous().reshape(-1)
        crc = zlib.crc32(data.view(torch.uint8).numpy()) if data.numel() else 0
        digest.update(f'{name}|{data.dtype}|{tuple(state[name].shape)}|{crc};'.encode())
    return digest.hexdigest()[:32]


def redigest(state: Dict[str, Any], inside: str) -> None:
    """The digest of ``state`` as it is now into a record under ``inside`` that
    has one (the base added or left out after the save)."""
    record = decode_record(state.get(inside + RECORD_KEY))
    if record and record.get('digest'):
        state[inside + RECORD_KEY] = encode_record({**record,
                                                    'digest': trained_digest(state, inside)})


# ------------------------------------------------------- the one check
def _as_recorded(source: Optional[str]) -> Optional[str]:
    """How a record names a base file: a URL as it is, a local file by its
    absolute path (information for messages, never opened by a load)."""
    return None if not source else source if '://' in source else osp.abspath(source)


def base_fingerprint(backbone: nn.Module, incoming: Mapping[str, torch.Tensor]) -> str:
    """The fingerprint of the base tensors a state dict gives ``backbone``
    (those it resizes on load, ``FINGERPRINT_SKIPS``, left out)."""
    skips = tuple(backbone.FINGERPRINT_SKIPS) + tuple(backbone.params_not_in_base)
    return fingerprint({k: v for k, v in incoming.items() if isinstance(v, torch.Tensor)
                        and not is_adapter_key(k) and not matches(k, skips)})


def _prefix_hint(incoming: Sequence[str], lacking: Sequence[str]) -> str:
    """The ``init_cfg`` prefix that takes the missing keys where the keys given
    hold them behind one (a whole-model file given as the base)."""
    prefixes: Dict[str, int] = {}
    for key in incoming:
        for name in {key.split('.', 1)[-1], key.split('.', 2)[-1]} & set(lacking) - {key}:
            prefixes[key[:-len(name)]] = prefixes.get(key[:-len(name)], 0) + 1
    if not prefixes:
        return ''
    prefix = max(prefixes, key=prefixes.get)
    return (f' {prefixes[prefix]} of the missing keys are in the file behind the prefix '
            f"{prefix!r}: set model.backbone.init_cfg.prefix='{prefix}'")


def _misfits(incoming: Mapping[str, Any], own: Mapping[str, torch.Tensor],
             resized_on_load: Sequence[str] = ()) -> List[str]:
    """``key: shapes in the checkpoint and the model`` where they differ; keys
    the model resizes on load (``pos_embed``, a frequency map) need only agree
    in their last dimension (channels, heads)."""
    def fits(key, value):
        return value.shape == own[key].shape or (
            matches(key, resized_on_load) and value.dim() == own[key].dim()
            and value.shape[-1] == own[key].shape[-1])

    return [f'{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model'
            for k, v in incoming.items()
            if k in own and isinstance(v, torch.Tensor) and not fits(k, v)]


def _option_problems(backbone, record, what) -> List[AdapterRecordMismatchError]:
    differences = record_differences(record, backbone)
    # the unit options a command line can set back (e.g. a retired default)
    options = [f'model.backbone.{key}={theirs}' for key, theirs, _ in differences
               if key.startswith('moppa_cfg.') and len(key) < 100
               and isinstance(theirs, (str, int, float, bool)) and len(str(theirs)) < 100]
    return [AdapterRecordMismatchError(
        f'{what} was built with other options than this model; {len(differences)} '
        'differ:\n  ' + few([describe_difference(*d) for d in differences], 20, sep='\n  ')
        + "\nSet the checkpoint's values in model.backbone (moppa_cfg.<option> for the "
        "unit's options" + (f'; in a tool: --cfg-options {" ".join(options[:10])}'
                            if options else '')
        + "): its parameters mean something else under the model's.")] if differences else []


def _base_problems(backbone, record, what, alone) -> List[PretrainedMismatchError]:
    """An adapter-only checkpoint: the model's base (loaded when built) must be
    the one the adapters were trained on (the recorded fingerprint; no record:
    that there is one); given as the base itself (``alone``), it is none."""
    recorded, ours = (record or {}).get('base') or {}, backbone.pretrained_base
    if ours is None and alone:  # e.g. as model.backbone.init_cfg.checkpoint
        return [PretrainedMismatchError(
            f'{what} holds adapters and no pre-trained weights: an adapter checkpoint, not a '
            'pre-trained base. Give it to the whole model (the checkpoint of tools/test.py, '
            'load_from, init_detector / get_model) with the base it was trained on as '
            f"model.backbone.init_cfg.checkpoint (recorded: {recorded.get('checkpoint')!r}).")]
    if ours is None:
        configured, _ = backbone.configured_base()
        why = (f'model.backbone.init_cfg names {configured!r}, which was not loaded '
               '(missing when the model was built?)' if configured else
               "model.backbone.init_cfg names no Pretrained checkpoint (mmdet's "
               'init_detector clears it unless cfg_options is given)')
        trained_on = (f'The adapters were trained on {recorded["checkpoint"]!r} (fingerprint '
                      f'{recorded["fingerprint"]}; the load does not open it). '
                      if recorded.get('checkpoint') else '')
        return [PretrainedMismatchError(
            f'{what} is adapter-only (the adapters and the heads, not the frozen '
            f'pre-trained weights), and this model has no pre-trained base: {why}. '
            f"{trained_on}Build the model with its base: model.backbone.init_cfg=dict(type="
            "'Pretrained', checkpoint=...) (init_detector(config, checkpoint, "
            "cfg_options={}); MMSegmentation's init_model clears init_cfg: cfg_options="
            "{'model.backbone.pretrained': BASE}), or make a self-contained checkpoint "
            'with tools/model_converters/publish_model.py --merge-base.')]
    wrong = 'adapters on another base give wrong outputs'
    if record is not None and record['base'] is None:
        return [AdapterRecordMismatchError(
            f'{what} is adapter-only and records no pre-trained base (its adapters were '
            "trained on a backbone as built, random), but the model's base is "
            f'{ours["checkpoint"]!r}: {wrong}.')]
    theirs = recorded.get('fingerprint')
    if not theirs or theirs == ours['fingerprint']:
        return []
    if recorded.get('checkpoint') == ours['checkpoint']:
        return [AdapterRecordMismatchError(
            f'{what}: the pre-trained file {ours["checkpoint"]!r} has changed since the '
            f'adapters were trained on it (fingerprint {theirs} then, {ours["fingerprint"]} '
            f'now): {wrong}. Restore the original file, or make a self-contained '
            'checkpoint where it still is (publish_model.py --merge-base).')]
    return [AdapterRecordMismatchError(
        f'{what}: the adapters were trained on the pre-trained base '
        f'{recorded.get("checkpoint")!r} (fingerprint {theirs}; named by the checkpoint, '
        f"not opened), but the model's base is {ours['checkpoint']!r} (fingerprint "
        f'{ours["fingerprint"]}): {wrong}. Point model.backbone.init_cfg.checkpoint at '
        'the base they were trained on.')]


def _adapter_problems(backbone, incoming, own, record, record_key, what,
                      alone) -> List[PretrainedMismatchError]:
    """A fine-tuned checkpoint: all of the model's adapters and none it lacks,
    the base they were trained on (adapter-only; ``alone``: as the base), and
    last a missing record (``record_key``: None where there is one)."""
    adapters = [k for k, _ in backbone.named_parameters() if is_adapter_key(k)]
    given = sorted(k for k in incoming if is_adapter_key(k))
    lacking = [k for k in adapters if k not in incoming]
    if lacking:
        none = len(lacking) == len(adapters)
        return [PretrainedMismatchError(
            f"{what} holds adapter tensors, but none of this model's {len(adapters)}: a "
            f'checkpoint of another model or config? (it has e.g. {few(given, 3)}; the '
            f'model expects e.g. {few(adapters, 3)})' if none else
            f"{what} holds adapters but lacks {len(lacking)} of the model's "
            f'{len(adapters)} adapter parameters: {few(lacking)}')]
    problems = []
    foreign = [k for k in given if k not in own]
    if foreign:  # torch would drop them as unexpected keys: another unit
        gate = any(k.endswith('.gate') for k in foreign)
        problems.append(AdapterRecordMismatchError(
            f'{what} holds {len(foreign)} adapter tensors this model does not have: '
            f'{few(foreign)}. The adapters were built with other options (unit experts, '
            'init_mode, switches)' + (": the '.gate' tensors come from moppa_cfg."
                                      "init_mode='identity'" if gate else '')
            + '; build the model with the options they were trained with.'))
    if not frozen_base_keys(incoming, '', backbone.params_not_in_base):
        problems += _base_problems(backbone, record, what, alone)
    if record_key is not None:
        problems.append(AdapterRecordMismatchError(
            f'{what} has no adapter record (key {record_key!r}: saved before moppa_mm '
            'recorded one, or removed): its tensors fit the model, but the options they '
            'were trained with (moppa_cfg, adapter switches) and their base cannot be '
            'checked, and adapters under other options or on another base give wrong '
            'outputs without an error.'))
    return problems


def _around_problems(outside, around, record, what) -> List[AdapterRecordMismatchError]:
    """The trained tensors around the backbone (heads, neck): the model's."""
    extra, lacking = sorted(set(outside) - set(around)), sorted(set(around) - set(outside))
    misfits = _misfits(outside, around)
    anew = ('(to start a new task from its adapters, load it anyway: the heads then '
            'start anew)')
    if extra or lacking:
        saved = f' (it was saved from a {record["model"]})' if (record or {}).get('model') \
            else ''
        return [AdapterRecordMismatchError(
            f'{what} is of another model{saved}: it holds {len(extra)} tensors around the '
            f'backbone that this model does not have ({few(extra, 3) or "none"}) and lacks '
            f'{len(lacking)} that it trains ({few(lacking, 3) or "none"}). Its heads would '
            f'stay random; use the config it was trained with {anew}.')]
    return [AdapterRecordMismatchError(
        f'{what} does not fit the model around its backbone; {len(misfits)} tensors '
        f'differ: {few(misfits, 3)}. A checkpoint of another task (another number of '
        f'classes)? Its heads would stay random; build the model from its config '
        f'{anew}.')] if misfits else []


def _without_adapters(backbone, incoming, outside, what) -> List[PretrainedMismatchError]:
    """A whole model's checkpoint without the adapters: another model's where it
    holds tensors around the backbone, else the pre-trained base alone."""
    adapters = [k for k, _ in backbone.named_parameters() if is_adapter_key(k)]
    if adapters and outside:
        return [AdapterRecordMismatchError(
            f'{what} holds {len(incoming)} backbone tensors and {len(outside)} around it '
            f'({few(sorted(outside), 3)}) but none of the {len(adapters)} adapter tensors of '
            'this model: the checkpoint of another model, such as a linear probe or a full '
            'fine-tuning of the plain backbone. The adapters would keep their initial values; '
            'test it with the config it was trained with.')]
    return [BaseOnlyCheckpoint(
        f'{what} holds only pre-trained weights ({len(incoming)} backbone tensors): the '
        f"{len(adapters)} adapter tensors and the model's tensors around the backbone (heads, "
        'neck) keep their initial values. Right for load_from before training; to test or '
        'predict, give the fine-tuned checkpoint.')] if adapters else []


def stored_problems(state: Mapping[str, Any], inside: str, what: str, digest: bool = True
                    ) -> Tuple[Optional[Dict[str, Any]], List[MoPPAInputError]]:
    """What a checkpoint says of itself (no model needed): its record under
    ``inside`` (None where absent or unreadable), and the problems: a record
    that cannot be read, trained tensors that no longer match its digest
    (``digest=False``: not checked)."""
    value = state.get(inside + RECORD_KEY)
    record, problem = read_record(value) if value is not None else (None, None)
    if problem:
        return None, [AdapterRecordMismatchError(
            f'{what}: its adapter record (key {inside + RECORD_KEY!r}) {problem}. Its '
            "options and base cannot be checked against the model's.")]
    if digest and (record or {}).get('digest') and \
            trained_digest(state, inside) != record['digest']:
        return record, [CheckpointLoadError(
            f'{what} is damaged: its tensors (the adapters, the tensors around the '
            'backbone and any base it carries) do not match the digest its adapter record '
            'took when it was saved (a disk or copy error, or tensors changed after the '
            'save); copy or download it again')]
    return record, []


def checkpoint_problems(state: Mapping[str, Any], backbone: nn.Module, inside: str = '',
                        around: Optional[Mapping[str, torch.Tensor]] = None,
                        what: str = 'the checkpoint') -> List[MoPPAInputError]:
    """What stands against loading ``state`` into ``backbone`` and the model
    around it: pure, it reads and changes nothing.

    Args:
        state: The incoming state dict, keys as in the model being loaded.
        backbone: The MoPPA backbone (its base, options and tensors).
        inside: The backbone's prefix in ``state`` (``''`` loaded alone).
        around: The model's other tensors (heads, neck), keys as in ``state``;
            None for the backbone loaded alone (no digest or head check).
        what: How messages name the checkpoint.

    Returns:
        The problems, as errors to raise, in the order checked: NaN or
        infinite values; the record (readable, the digest, the backbone type,
        merged or not, the options); the model around the backbone; shapes;
        a pre-trained base's keys (then, into the whole model, another model's
        checkpoint or a :class:`BaseOnlyCheckpoint`, which a load only warns
        of) or the adapters (the base they were trained on, then a missing
        record). :class:`AdapterRecordMismatchError` ones are what
        ``strict_adapter_record=False`` loads with a warning.
    """
    incoming = {k[len(inside):]: v for k, v in state.items() if k.startswith(inside)}
    value = incoming.pop(RECORD_KEY, None)
    outside = {} if around is None else \
        {k: v for k, v in state.items() if not k.startswith(inside)}
    try:
        check_finite({**{inside + k: v for k, v in incoming.items()}, **outside}, what)
    except CheckpointLoadError as error:
        return [error]
    # the digest covers the model around the backbone: a backbone alone has none
    record, problems = stored_problems(state, inside, what, digest=around is not None)
    # a whole model's checkpoint given to the backbone alone: its record is one level down
    whole = next((k[:-len(RECORD_KEY)] for k in incoming if k.endswith('.' + RECORD_KEY)
                  and around is None and record is None), None)
    found = decode_record(incoming[whole + RECORD_KEY]) if whole else record
    name, merged = type(backbone).__name__, bool((record or {}).get('merged'))
    if found is not None and found['backbone'] != name:
        return problems + [PretrainedMismatchError(
            f'{what} is a checkpoint of {KNOWN_AS.get(found["backbone"], found["backbone"])}'
            f' (its adapter record says so); this config builds {KNOWN_AS.get(name, name)}')]
    if found is not None and whole:
        return problems + (_base_problems(backbone, found, what, True) if backbone.pretrained_base
                           is None else [PretrainedMismatchError(
                               f"{what} is a whole model's (the backbone's keys under "
                               f'{whole!r}): load it into the model that holds the backbone')])
    if merged != backbone.merged:
        problems.append(PretrainedMismatchError(
            f'{what} is not merged, and {name} is merged for inference: load it into a '
            'model built from the config without model.backbone.merged, then merge '
            '(moppa_mm.merge_adapters)' if backbone.merged else
            f'{what} is merged (its adapters are folded into the weights: publish_model.py'
            ' --merge), and this model is not. Build the model merged: '
            'model.backbone.merged=True in the config (in a tool: --cfg-options '
            'model.backbone.merged=True), or call moppa_mm.merge_adapters(model) before '
            'the load.'))
    given_adapters = any(is_adapter_key(k) for k in incoming)
    if record is not None and (given_adapters or backbone.merged):
        problems += _option_problems(backbone, record, what)  # before shapes: the cause
    if around is not None and (given_adapters or record is not None):
        problems += _around_problems(outside, around, record, what)  # another model, task
    own = backbone.state_dict()
    own.pop(RECORD_KEY)
    resized = tuple(backbone.FINGERPRINT_SKIPS) + (tuple(
        f'*.{p}' for p in FREQ_PARAMS) if backbone.RESIZES_FREQUENCY_MAPS else ())
    misfits = _misfits(incoming, own, resized)
    if misfits:
        return problems + [PretrainedMismatchError(
            f'{what}: {len(misfits)} tensors do not fit the model (a checkpoint of another '
            f'architecture, scope or window size?): {few(misfits, 3)}')]
    if backbone.merged:
        lacking = [k for k in own if k not in incoming]
        problems += [PretrainedMismatchError(
            f"{what} is merged but lacks {len(lacking)} of the model's tensors: "
            f'{few(lacking)}')] if lacking else []
    elif given_adapters:
        problems += _adapter_problems(backbone, incoming, own, record,
                                      None if value is not None else inside + RECORD_KEY, what,
                                      around is None)
    else:  # a pre-trained base: every base parameter
        may_lack = tuple(backbone.PRETRAINED_MAY_LACK) + tuple(backbone.params_not_in_base)
        required = [k for k, _ in backbone.named_parameters()
                    if not is_adapter_key(k) and not matches(k, may_lack)]
        lacking = [k for k in required if k not in incoming]
        problems += [PretrainedMismatchError(
            f'{what} restores {len(required) - len(lacking)} of the {len(required)} frozen '
            f'base parameters; missing: {few(lacking)}. The frozen backbone would stay '
            'random: is it a checkpoint of this backbone, with its keys (given '
            f'{len(incoming)} keys, e.g. {few(list(incoming), 3) or "none"})?'
            f'{_prefix_hint(list(incoming), lacking)}')] if lacking else []
        if around is not None:  # into the whole model
            problems += _without_adapters(backbone, incoming, outside, what)
    return problems
