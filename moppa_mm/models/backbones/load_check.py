"""The one check every load into a MoPPA model runs: :func:`checkpoint_problems`
(pure: what comes in and the model -> the problems of :data:`PROBLEMS`), raised
or warned of by :func:`load_checked`, which then gives the load what it lacks."""
import json
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn
from mmengine.logging import print_log

from moppa_mm.operators.moppa_unit import FREQ_PARAMS
from moppa_mm.utils.checkpoints import CheckpointLoadError, check_finite
from moppa_mm.utils.errors import MoPPAInputError
from moppa_mm.utils.params import few, matches, short_repr
from .adapter_params import RECORD_KEY, frozen_base_keys, is_adapter_key
from .adapter_record import (OPTIONS, adapter_record, base_fingerprint, decode_record,
                             read_record, trained_digest)


class PretrainedMismatchError(MoPPAInputError, RuntimeError):
    """A checkpoint does not fit the model it is loaded into."""


class BaseOnlyCheckpoint(PretrainedMismatchError):
    """The base alone into a whole model: right for ``load_from``, so a load
    only warns; the adapter bank refuses."""


class AdapterRecordMismatchError(PretrainedMismatchError):
    """What ``strict_adapter_record=False`` loads anyway, with a warning."""


# The backbone classes (as records hold them) as configs name them
KNOWN_AS = {f'MoPPA{kind}Transformer{suffix}': f"{package}'s MoPPA{kind}Transformer"
            for kind, suffix, package in (
                ('Swin', '', 'MMDetection'), ('Swin', 'Cls', 'MMPretrain'),
                ('Swin', 'Seg', 'MMSegmentation'), ('Vision', '', 'MMPretrain'),
                ('Vision', 'Seg', 'MMSegmentation'))}

_WRONG = 'adapters on another base give wrong outputs'
_ANEW = '(to start a new task from its adapters, load it anyway: the heads then start anew)'
# Every problem a load can meet: code -> (what it raises, what it says). ``what``
# names the checkpoint; the other fields come from the check that finds it.
PROBLEMS = {
    # what the checkpoint says of itself
    'unreadable_record': (AdapterRecordMismatchError, "{what}: its adapter record (key {key!r}) "
                          "{problem}. Its options and base cannot be checked against the model's."),
    'no_digest': (CheckpointLoadError, "{what}: its adapter record (key {key!r}) has no digest of "
                  "the tensors saved with it, which every model's checkpoint carries: the file "
                  'was edited after the save (the digest removed or emptied). Take the original '
                  'file, or save it again from the model that trained it'),
    'damaged': (CheckpointLoadError, '{what} is damaged: its tensors (the adapters, the tensors '
                'around the backbone and any base it carries) do not match the digest its adapter '
                'record took when it was saved (a disk or copy error, or tensors changed after '
                'the save); copy or download it again'),
    # the backbone it is of
    'other_backbone': (PretrainedMismatchError, '{what} is a checkpoint of {theirs} (its adapter '
                       'record says so); this config builds {ours}'),
    'whole_model': (PretrainedMismatchError, "{what} is a whole model's (the backbone's keys under "
                    '{whole!r}): load it into the model that holds the backbone'),
    'merged_into_unmerged': (PretrainedMismatchError, '{what} is merged (its adapters are folded '
                             'into the weights: publish_model.py --merge), and this model is not. '
                             'Build the model merged: model.backbone.merged=True in the config (in '
                             'a tool: --cfg-options model.backbone.merged=True), or call '
                             'moppa_mm.merge_adapters(model) before the load.'),
    'unmerged_into_merged': (PretrainedMismatchError, '{what} is not merged, and {ours} is merged '
                             'for inference: load it into a model built from the config without '
                             'model.backbone.merged, then merge (moppa_mm.merge_adapters)'),
    'options': (AdapterRecordMismatchError, '{what} was built with other options than this model; '
                "{count} differ:\n  {differences}\nSet the checkpoint's values in model.backbone "
                "(moppa_cfg.<option> for the unit's options{command}): its parameters mean "
                "something else under the model's."),
    # the model around the backbone
    'other_model': (AdapterRecordMismatchError, '{what} is of another model{saved}: it holds '
                    '{extra_count} tensors around the backbone that this model does not have '
                    '({extra}) and lacks {lacking_count} that it trains ({lacking}). Its heads '
                    'would stay random; use the config it was trained with ' + _ANEW + '.'),
    'other_heads': (AdapterRecordMismatchError, '{what} does not fit the model around its '
                    'backbone; {count} tensors differ: {misfits}. A checkpoint of another task '
                    '(another number of classes)? Its heads would stay random; build the model '
                    'from its config ' + _ANEW + '.'),
    # the tensors
    'misfits': (PretrainedMismatchError, '{what}: {count} tensors do not fit the model (a '
                'checkpoint of another architecture, scope or window size?): {misfits}'),
    'merged_lacks': (PretrainedMismatchError, "{what} is merged but lacks {count} of the model's "
                     'tensors: {lacking}'),
    'none_of_the_adapters': (PretrainedMismatchError, '{what} holds adapter tensors, but none of '
                             "this model's {count}: a checkpoint of another model or config? (it "
                             'has e.g. {given}; the model expects e.g. {expected})'),
    'lacks_adapters': (PretrainedMismatchError, "{what} holds adapters but lacks {lacking_count} "
                       "of the model's {count} adapter parameters: {lacking}"),
    'other_adapters': (AdapterRecordMismatchError, '{what} holds {count} adapter tensors this '
                       'model does not have: {foreign}. The adapters were built with other '
                       'options (unit experts, init_mode, switches){gate}; build the model with '
                       'the options they were trained with.'),
    'partial_base': (PretrainedMismatchError, '{what} restores {restored} of the {count} frozen '
                     'base parameters; missing: {lacking}. The frozen backbone would stay random: '
                     'is it a checkpoint of this backbone, with its keys (given {given_count} '
                     'keys, e.g. {given})?{hint}'),
    'no_adapters': (AdapterRecordMismatchError, '{what} holds {count} backbone tensors and '
                    '{outside_count} around it ({outside}) but none of the {adapters} adapter '
                    'tensors of this model: the checkpoint of another model, such as a linear '
                    'probe or a full fine-tuning of the plain backbone. The adapters would keep '
                    'their initial values; test it with the config it was trained with.'),
    'base_only': (BaseOnlyCheckpoint, '{what} holds only pre-trained weights ({count} backbone '
                  "tensors): the {adapters} adapter tensors and the model's tensors around the "
                  'backbone (heads, neck) keep their initial values. Right for load_from before '
                  'training; to test or predict, give the fine-tuned checkpoint.'),
    # the base the adapters were trained on
    'adapters_as_base': (PretrainedMismatchError, '{what} holds adapters and no pre-trained '
                         'weights: an adapter checkpoint, not a pre-trained base. Give it to the '
                         'whole model (the checkpoint of tools/test.py, load_from, init_detector '
                         '/ get_model) with the base it was trained on as '
                         'model.backbone.init_cfg.checkpoint (recorded: {recorded!r}).'),
    'no_base': (PretrainedMismatchError, '{what} is adapter-only (the adapters and the heads, not '
                'the frozen pre-trained weights), and this model has no pre-trained base: {why}. '
                "{trained_on}Build the model with its base: model.backbone.init_cfg=dict(type="
                "'Pretrained', checkpoint=...) (init_detector(config, checkpoint, cfg_options="
                "{{}}); MMSegmentation's init_model clears init_cfg: cfg_options="
                "{{'model.backbone.pretrained': BASE}}), or make a self-contained checkpoint "
                'with tools/model_converters/publish_model.py --merge-base.'),
    'recorded_no_base': (AdapterRecordMismatchError, '{what} is adapter-only and records no '
                         'pre-trained base (its adapters were trained on a backbone as built, '
                         "random), but the model's base is {ours!r}: " + _WRONG + '.'),
    'base_changed': (AdapterRecordMismatchError, '{what}: the pre-trained file {ours!r} has '
                     'changed since the adapters were trained on it (fingerprint {theirs} then, '
                     '{now} now): ' + _WRONG + '. Restore the original file, or make a '
                     'self-contained checkpoint where it still is (publish_model.py '
                     '--merge-base).'),
    'other_base': (AdapterRecordMismatchError, '{what}: the adapters were trained on the '
                   'pre-trained base {recorded!r} (fingerprint {theirs}; named by the checkpoint, '
                   "not opened), but the model's base is {ours!r} (fingerprint {now}): " + _WRONG
                   + '. Point model.backbone.init_cfg.checkpoint at the base they were trained '
                   'on.'),
    'no_record': (AdapterRecordMismatchError, '{what} has no adapter record (key {key!r}: '
                  'removed, or not written by a MoPPA model): its tensors fit the model, but the '
                  'options they were trained with (moppa_cfg, adapter switches) and their base '
                  'cannot be checked, and adapters under other options or on another base give '
                  'wrong outputs without an error.'),
}


def problem(code: str, **fields: Any) -> MoPPAInputError:
    """The error of :data:`PROBLEMS` ``code``, its message filled in."""
    kind, message = PROBLEMS[code]
    return kind(message.format(**fields))


def _flatten(record: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
    flat = {}
    for key, value in record.items():
        flat.update(_flatten(value, f'{prefix}{key}.') if isinstance(value, dict) and value
                    else {f'{prefix}{key}': value})
    return flat


def _option_problems(backbone, record, what) -> List[MoPPAInputError]:
    """The recorded options that differ from the model's (but its
    ``RECORD_MAY_DIFFER``), with the command line that sets the units' back."""
    ours, theirs = (_flatten({k: r[k] for k in OPTIONS if k in r}) for r in (
        json.loads(json.dumps(adapter_record(backbone))), record))  # as stored: lists
    differences = [(key, theirs.get(key, '(not recorded)'), ours.get(key, '(none)'))
                   for key in sorted(set(ours) | set(theirs))
                   if key not in backbone.RECORD_MAY_DIFFER
                   and ours.get(key, '(none)') != theirs.get(key, '(not recorded)')]
    if not differences:
        return []
    options = [f'model.backbone.{key}={value}' for key, value, _ in differences
               if key.startswith('moppa_cfg.') and len(key) < 100
               and isinstance(value, (str, int, float, bool)) and len(str(value)) < 100]
    listed = [f'{key if len(key) <= 200 else key[:200] + "..."}: {short_repr(value)} in the '
              f'checkpoint, {short_repr(own)} in the model' for key, value, own in differences]
    return [problem('options', what=what, count=len(differences),
                    differences=few(listed, 20, sep='\n  '),
                    command=f'; in a tool: --cfg-options {" ".join(options[:10])}'
                    if options else '')]


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
    """``key: shapes in the checkpoint and the model`` where they differ; keys the
    model resizes on load need only agree in their last dimension."""
    def fits(key, value):
        return value.shape == own[key].shape or (
            matches(key, resized_on_load) and value.dim() == own[key].dim()
            and value.shape[-1] == own[key].shape[-1])

    return [f'{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model'
            for k, v in incoming.items()
            if k in own and isinstance(v, torch.Tensor) and not fits(k, v)]


def _base_problems(backbone, record, what, alone) -> List[MoPPAInputError]:
    """An adapter-only checkpoint needs the model's base to be the one its
    adapters were trained on; given as the base itself (``alone``), it is none."""
    recorded, ours = (record or {}).get('base') or {}, backbone.pretrained_base
    if ours is None and alone:  # e.g. as model.backbone.init_cfg.checkpoint
        return [problem('adapters_as_base', what=what, recorded=recorded.get('checkpoint'))]
    if ours is None:
        configured, _ = backbone.configured_base()
        why = (f'model.backbone.init_cfg names {configured!r}, which was not loaded (missing '
               'when the model was built?)' if configured else "model.backbone.init_cfg names no "
               "Pretrained checkpoint (mmdet's init_detector drops it unless cfg_options is given)")
        trained_on = (f'The adapters were trained on {recorded["checkpoint"]!r} (fingerprint '
                      f'{recorded["fingerprint"]}; the load does not open it). '
                      if recorded.get('checkpoint') else '')
        return [problem('no_base', what=what, why=why, trained_on=trained_on)]
    if record is not None and record['base'] is None:
        return [problem('recorded_no_base', what=what, ours=ours['checkpoint'])]
    theirs, now = recorded.get('fingerprint'), ours['fingerprint']
    if not theirs or theirs == now:
        return []
    code = 'base_changed' if recorded.get('checkpoint') == ours['checkpoint'] else 'other_base'
    return [problem(code, what=what, ours=ours['checkpoint'], theirs=theirs, now=now,
                    recorded=recorded.get('checkpoint'))]


def _adapter_problems(backbone, incoming, own, record, record_key, what,
                      alone) -> List[MoPPAInputError]:
    """A fine-tuned checkpoint: the model's adapters, all and no others, the base
    they were trained on, last the record (``record_key``: None where there is one)."""
    adapters = [k for k, _ in backbone.named_parameters() if is_adapter_key(k)]
    given = sorted(k for k in incoming if is_adapter_key(k))
    lacking = [k for k in adapters if k not in incoming]
    if lacking:
        code = 'none_of_the_adapters' if len(lacking) == len(adapters) else 'lacks_adapters'
        return [problem(code, what=what, count=len(adapters), lacking_count=len(lacking),
                        lacking=few(lacking), given=few(given, 3), expected=few(adapters, 3))]
    problems, foreign = [], [k for k in given if k not in own]
    if foreign:  # torch would drop them as unexpected keys: another unit
        gate = ": the '.gate' tensors come from moppa_cfg.init_mode='identity'"
        problems.append(problem('other_adapters', what=what, count=len(foreign),
                                foreign=few(foreign), gate=gate if any(
                                    k.endswith('.gate') for k in foreign) else ''))
    if not frozen_base_keys(incoming, '', backbone.params_not_in_base):
        problems += _base_problems(backbone, record, what, alone)
    if record_key is not None:
        problems.append(problem('no_record', what=what, key=record_key))
    return problems


def _around_problems(outside, around, record, what) -> List[MoPPAInputError]:
    """The trained tensors around the backbone (heads, neck): the model's."""
    extra, lacking = sorted(set(outside) - set(around)), sorted(set(around) - set(outside))
    if extra or lacking:
        saved = f' (it was saved from a {record["model"]})' if (record or {}).get('model') \
            else ''
        return [problem('other_model', what=what, saved=saved, extra_count=len(extra),
                        extra=few(extra, 3) or 'none', lacking_count=len(lacking),
                        lacking=few(lacking, 3) or 'none')]
    misfits = _misfits(outside, around)
    return [problem('other_heads', what=what, count=len(misfits),
                    misfits=few(misfits, 3))] if misfits else []


def stored_problems(state: Mapping[str, Any], inside: str, what: str, digest: bool = True
                    ) -> List[MoPPAInputError]:
    """A record under ``inside`` that cannot be read; with ``digest`` (a model's
    checkpoint) no digest, or tensors that no longer match it."""
    value = state.get(inside + RECORD_KEY)
    if value is None:
        return []
    record, unreadable = read_record(value)
    if unreadable:
        return [problem('unreadable_record', what=what, key=inside + RECORD_KEY,
                        problem=unreadable)]
    if not digest:
        return []
    if not record.get('digest'):
        return [problem('no_digest', what=what, key=inside + RECORD_KEY)]
    return [problem('damaged', what=what)] \
        if trained_digest(state, inside) != record['digest'] else []


def checkpoint_problems(state: Mapping[str, Any], backbone: nn.Module, inside: str = '',
                        around: Optional[Mapping[str, torch.Tensor]] = None,
                        what: str = 'the checkpoint') -> List[MoPPAInputError]:
    """What stands against loading ``state`` (keys as in the model; the
    backbone's under ``inside``) into ``backbone`` and the model around it
    (``around``: its other tensors; None for the backbone alone: no digest or
    head check); ``what`` names the checkpoint. In the order checked: values,
    the record, the model around, shapes, then a base's keys or the adapters."""
    incoming = {k[len(inside):]: v for k, v in state.items() if k.startswith(inside)}
    value = incoming.pop(RECORD_KEY, None)
    outside = {} if around is None else \
        {k: v for k, v in state.items() if not k.startswith(inside)}
    try:
        check_finite({**{inside + k: v for k, v in incoming.items()}, **outside}, what)
    except CheckpointLoadError as error:
        return [error]
    # the digest covers the model around the backbone: a backbone alone has none
    problems = stored_problems(state, inside, what, digest=around is not None)
    record = decode_record(value)
    # a whole model's checkpoint given to the backbone alone: its record is one level down
    whole = next((k[:-len(RECORD_KEY)] for k in incoming if k.endswith('.' + RECORD_KEY)
                  and around is None and record is None), None)
    found = decode_record(incoming[whole + RECORD_KEY]) if whole else record
    name = type(backbone).__name__
    if found is not None and found['backbone'] != name:
        return problems + [problem('other_backbone', what=what, ours=KNOWN_AS.get(name, name),
                                   theirs=KNOWN_AS.get(found['backbone'], found['backbone']))]
    if found is not None and whole:
        return problems + (_base_problems(backbone, found, what, True)
                           if backbone.pretrained_base is None
                           else [problem('whole_model', what=what, whole=whole)])
    if record is not None and record['merged'] != backbone.merged:
        problems.append(problem('unmerged_into_merged' if backbone.merged
                                else 'merged_into_unmerged', what=what, ours=name))
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
        return problems + [problem('misfits', what=what, count=len(misfits),
                                   misfits=few(misfits, 3))]
    if backbone.merged:
        lacking = [k for k in own if k not in incoming]
        problems += [problem('merged_lacks', what=what, count=len(lacking),
                             lacking=few(lacking))] if lacking else []
    elif given_adapters:
        problems += _adapter_problems(backbone, incoming, own, record,
                                      None if value is not None else inside + RECORD_KEY, what,
                                      around is None)
    else:  # a pre-trained base: every base parameter
        may_lack = tuple(backbone.PRETRAINED_MAY_LACK) + tuple(backbone.params_not_in_base)
        required = [k for k, _ in backbone.named_parameters()
                    if not is_adapter_key(k) and not matches(k, may_lack)]
        lacking = [k for k in required if k not in incoming]
        problems += [problem(
            'partial_base', what=what, restored=len(required) - len(lacking),
            count=len(required), lacking=few(lacking), given_count=len(incoming),
            given=few(list(incoming), 3) or 'none',
            hint=_prefix_hint(list(incoming), lacking))] if lacking else []
        adapters = sum(is_adapter_key(k) for k, _ in backbone.named_parameters())
        if around is not None and adapters:  # no adapters into the whole model
            problems.append(problem(
                'no_adapters' if outside else 'base_only', what=what, count=len(incoming),
                outside_count=len(outside), outside=few(sorted(outside), 3), adapters=adapters))
    return problems


def load_checked(backbone: nn.Module, state_dict: Dict[str, Any], prefix: str, inside: str,
                 around: Optional[Mapping[str, torch.Tensor]] = None) -> None:
    """Check ``state_dict`` (the model's keys under ``prefix``, the backbone's
    under ``inside`` in it; ``around`` as :func:`checkpoint_problems`'s): stop,
    or warn where ``strict_adapter_record=False`` allows; then give the load what
    it lacks (the base; heads of another shape keep theirs), note the base."""
    state = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    for found in checkpoint_problems(state, backbone, inside, around,
                                     f'{type(backbone).__name__}: the checkpoint'):
        if isinstance(found, AdapterRecordMismatchError) and backbone.strict_adapter_record:
            raise type(found)(f'{found} To load it anyway, set '
                              'model.backbone.strict_adapter_record=False.') from None
        if not isinstance(found, (AdapterRecordMismatchError, BaseOnlyCheckpoint)):
            raise found
        print_log(f'{found}' if isinstance(found, BaseOnlyCheckpoint) else  # a base
                  f'{found} (strict_adapter_record=False: loading anyway)',
                  logger='current', level=logging.WARNING)
    incoming = {k[len(inside):]: v for k, v in state.items() if k.startswith(inside)}
    record = decode_record(incoming.pop(RECORD_KEY, None))
    recorded = (record or {}).get('base') or {}
    # the base now in the model (what the mixin's pretrained_base reports)
    if backbone.merged:
        backbone._base = dict(recorded) or None
    elif frozen_base_keys(incoming, '', backbone.params_not_in_base) or \
            not any(is_adapter_key(k) for k in incoming):  # a base, or one with adapters
        backbone._base = dict(checkpoint=recorded.get('checkpoint'), prefix=recorded.get('prefix'),
                              fingerprint=base_fingerprint(backbone, incoming))
    for key, value in backbone.state_dict().items():  # the rest keeps the model's: no
        state_dict.setdefault(prefix + inside + key, value)  # missing-key noise
    for key, value in (around or {}).items():  # heads of another shape start anew
        given = state_dict.get(prefix + key)
        if isinstance(given, torch.Tensor) and given.shape != value.shape:
            del state_dict[prefix + key]
    # a strict load of a file without a record must not miss it
    state_dict[prefix + inside + RECORD_KEY] = backbone.get_extra_state()


def check_load_alone(backbone: nn.Module, state_dict, prefix: str, *args) -> None:
    """The backbone's own load pre-hook: checks a load of the backbone alone
    (``prefix`` empty; through a model, the model's hook checked it)."""
    if not prefix:
        load_checked(backbone, state_dict, '', '')
