"""What the MoPPA backbones share: :class:`AdapterMixin`, the build and
checkpoint contract (units' options: :class:`MoPPAConfig`; the route loss:
:class:`.route_loss.RouteLossMixin`).

* **Build**: freezing; the base ``init_cfg`` names loaded in ``__init__`` (as
  mmpretrain's ``LoRAModel``), or merging (``merged=True``); the adapters' init;
  frozen norms in eval mode; the checks before a training forward; the table.
* **Save**: the backbone's own ``state_dict()`` is whole (mmdet's Swin resizes
  its position-bias tables against it) with the adapter record; the model
  holding it saves adapter-only where :attr:`AdapterMixin.saves_adapters_only`
  (:mod:`.model_hooks`); :func:`full_state_dict` and :func:`adapter_state_dict`
  give either state.
* **Load**: the model's load pre-hook (:func:`.model_hooks.check_load`, or
  :meth:`AdapterMixin._check_load_alone` for the backbone alone) ->
  :meth:`AdapterMixin.load_checked` -> :func:`.adapter_state.checkpoint_problems`;
  then the load gets what it lacks (the model's base for an adapter-only
  checkpoint). It opens nothing and changes no module's structure.
"""
import logging
import math
import os.path as osp
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import print_log
from torch.nn.modules.module import register_module_module_registration_hook

from moppa_mm.operators import MoPPAUnit, moppa_units
from moppa_mm.operators.tracing import is_capturing
from moppa_mm.utils.checkpoints import check_converted, load_checkpoint_file, naming_checkpoint
from moppa_mm.utils.errors import InputValueError, MoPPAInputError
from moppa_mm.utils.params import frozen_norms, parameter_table, set_trainable, short_repr
from ..layers.scale_shift import ScaleShiftLayer
from ..moppa_config import MoPPAConfig
from . import model_hooks
from .adapter_state import (ADAPTER_GROUPS, ADAPTER_PATTERNS, RECORD_FORMAT, RECORD_KEY,
                            AdapterRecordMismatchError, BaseOnlyCheckpoint,
                            PretrainedMismatchError, _as_recorded, base_fingerprint,
                            checkpoint_problems, decode_record, encode_record, frozen_base_keys,
                            is_adapter_key, read_adapter_record, redigest)
from .optimizer_check import watch_first_step, waiting_check
from .route_loss import SCHEDULES, RouteLossMixin

SCOPES = ('window', 'global')  # the Swin's unit scopes


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


# The backbones' own arguments (checked in _pop_adapter_args): name -> (what it must be, test)
BACKBONE_ARGS = {
    **{name: ('True or False', lambda v: isinstance(v, bool)) for name in (
        'use_moppa', 'use_scale_shift', 'use_conv_adapter', 'freeze_pretrained',
        'strict_adapter_record', 'merged', 'random_base')},
    'moppa_heads': ("a positive int, or None for the attention's heads", lambda v: v is None
                    or (isinstance(v, int) and not isinstance(v, bool) and v > 0)),
    'route_loss_weight': ('a number >= 0 (0: no route loss)', lambda v: _number(v) and v >= 0),
    'route_schedule': (f'one of {SCHEDULES}', lambda v: v in SCHEDULES),
    'moppa_scope': (f'one of {SCOPES}', lambda v: v in SCOPES),
    'adapter_ratio': ('a number > 0', lambda v: _number(v) and v > 0),
}


def adapter_patterns(prefix: str = '') -> Tuple[str, ...]:
    """The adapter patterns for names under ``prefix`` (e.g. ``'backbone.'``
    for a whole detector's or classifier's parameters)."""
    return tuple(prefix + p for p in ADAPTER_PATTERNS)


def adapter_components(prefix: str = '') -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """``(name, patterns)`` per adapter kind under ``prefix``, for
    :func:`~moppa_mm.utils.params.parameter_table`."""
    return tuple((prefix + kind, tuple(prefix + p for p in patterns))
                 for kind, patterns, _ in ADAPTER_GROUPS)


class NoPretrainedBaseError(MoPPAInputError, RuntimeError):
    """A backbone with a frozen base was about to train while its base is
    still the random one it was built with."""


class AdapterMixin(RouteLossMixin):
    """Mixed into a backbone subclass (before the base class).

    A subclass calls :meth:`_pop_adapter_args` before the base ``__init__``,
    adds its adapters after it, then :meth:`_finish_build` and
    :meth:`_build_base`; it provides :meth:`arch_record` and
    :meth:`adapter_options` and sets the class attributes below.
    ``params_not_in_base`` (patterns, set before :meth:`_finish_build`) are
    base-class parameters no pre-trained base has (mmpretrain ViT's ``ln2``
    under ``out_type='avg_featmap'``): they train and are saved with the
    adapters, and a base may lack them.

    Args of the backbones:
        freeze_pretrained (bool): Freeze all but the adapters when built, so
            that DDP sees the final trainable set (the head, outside the
            backbone, trains). Defaults to True.
        route_loss_weight, route_schedule: The route loss
            (:class:`~.route_loss.RouteLossMixin`).
        strict_adapter_record (bool): Stop when a checkpoint's record
            disagrees, cannot be read or is absent, or the model around the
            backbone differs (default); False warns (a new task from trained
            adapters, a checkpoint checked by other means).
        merged (bool): Build merged for inference (:meth:`merge_adapters`), to
            load a merged checkpoint (``publish_model.py --merge``). False
            (default): the ``Pretrained`` checkpoint of ``init_cfg`` loads when built.
        random_base (bool): The frozen base is random on purpose (benchmarks,
            tests); otherwise training on a random frozen base stops
            (:class:`NoPretrainedBaseError`). Defaults to False.
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()  # modules with enabled, reset_parameters
    PRETRAINED_LABEL: str = 'pre-trained backbone'  # the rest, in the parameter table
    PRETRAINED_MAY_LACK: Tuple[str, ...] = ()  # base parameters releases lack
    RESIZES_FREQUENCY_MAPS: bool = False  # the units' grid follows the image size
    RECORD_MAY_DIFFER: Tuple[str, ...] = ()  # record keys that may differ (image grid)
    FINGERPRINT_SKIPS: Tuple[str, ...] = ()  # base keys resized on load
    params_not_in_base: Tuple[str, ...] = ()
    merged: bool = False  # adapters folded in for inference (merge_adapters)

    def _pop_adapter_args(self, kwargs: dict, own: Dict[str, Any]) -> MoPPAConfig:
        """The one check of the backbone's arguments (``own``: its ``locals()``;
        ``kwargs``: the base class's, where another backbone's is named), and
        the units' options (returned); an attribute-style ``init_cfg`` for the
        base class (mmdet's Swin reads ``init_cfg.checkpoint``)."""
        name = type(self).__name__
        for arg in sorted(BACKBONE_ARGS.keys() & kwargs.keys()):
            raise InputValueError(f'{name}: model.backbone.{arg} is an argument of another '
                                  'MoPPA backbone, not of this one: remove it')
        for arg, value in own.items():
            if arg in BACKBONE_ARGS and not BACKBONE_ARGS[arg][1](value):
                raise InputValueError(f'{name}: model.backbone.{arg} = {short_repr(value)}: '
                                      f'it must be {BACKBONE_ARGS[arg][0]}')
        if isinstance(kwargs.get('init_cfg'), dict):
            kwargs['init_cfg'] = ConfigDict(kwargs['init_cfg'])
        return MoPPAConfig.build(own['moppa_cfg'])

    def _finish_build(self, freeze_pretrained: bool, route_loss_weight: float,
                      route_schedule: str, strict_adapter_record: bool,
                      random_base: bool = False) -> None:
        """Call after the adapters are added (then :meth:`_build_base`); the
        load check goes after the base classes' own load pre-hooks (mmpretrain's
        ViT resizes ``pos_embed`` in one)."""
        self.freeze_pretrained = freeze_pretrained
        self.random_base = random_base
        self.strict_adapter_record = strict_adapter_record
        # the pre-trained base in the model: {'checkpoint', 'prefix',
        # 'fingerprint'}; None while the base is as built (random)
        self._base: Optional[Dict[str, Optional[str]]] = None
        if freeze_pretrained:
            set_trainable(self, trainable=ADAPTER_PATTERNS + tuple(self.params_not_in_base))
            watch_first_step(self)  # the adapters' lr (.optimizer_check)
        self.register_forward_pre_hook(self._check_before_training)
        self._init_route_loss(route_loss_weight, route_schedule)
        self._register_load_state_dict_pre_hook(self._check_load_alone)

    def _build_base(self, merged: bool) -> None:
        """The last step of ``__init__``: the base ``init_cfg`` names is loaded
        now (:meth:`init_weights`), so that every later load (``runner.test()``,
        ``init_detector``, ``get_model``) finds it; a missing file is a
        warning. ``merged=True`` folds the adapters in instead."""
        init_cfg = self.init_cfg
        if isinstance(init_cfg, dict) and init_cfg.get('checkpoint') and 'type' not in init_cfg:
            raise InputValueError(
                f'{type(self).__name__}: model.backbone.init_cfg = {init_cfg!r} names a '
                "checkpoint but no type (a config without an init_cfg, given only "
                "init_cfg.checkpoint?): set model.backbone.init_cfg.type='Pretrained' "
                "too, and init_cfg.prefix='backbone.' where the file is a whole model's")
        if merged:
            self.merge_adapters()
            return
        checkpoint, _ = self.configured_base()
        if checkpoint is None:
            return
        if '://' not in checkpoint and not osp.isfile(checkpoint):
            print_log(f'{type(self).__name__}: the pre-trained base '
                      f'model.backbone.init_cfg.checkpoint = {checkpoint!r} does not '
                      'exist: the frozen backbone stays random, an adapter-only '
                      'checkpoint will not load into this model, and training stops '
                      'unless a checkpoint with the base is loaded first',
                      logger='current', level=logging.WARNING)
            return
        self.init_weights()
        # mmengine's init_weights() of the model around it applies its init_cfg
        # (mmpretrain's TruncNormal on every Linear) to every submodule, then a
        # child's own init_weights while it is not initialised: ours reloads
        self._is_init = False

    # ------------------------------------------------------------ the base
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

    def init_weights(self) -> None:
        """The base ``init_cfg`` names, loaded (again: the model around may
        have initialised it over; a local file gone since leaves it as it is),
        or the base classes' init without one; then the adapters' init. Logs
        the parameter table when the base comes."""
        self._refuse_if_merged('cannot be initialised again')
        checkpoint, prefix = self.configured_base()
        came = self._base is None
        if checkpoint is None:
            super().init_weights()
            self._base = None
        elif came or '://' in checkpoint or osp.isfile(checkpoint):
            self._load_base(checkpoint, prefix)
        for module in self._adapters():
            module.reset_parameters()
        if came:
            print_log('\n' + self.parameter_report(), logger='current')
        self._is_init = True

    def _load_base(self, checkpoint: str, prefix: Optional[str]) -> None:
        """The base classes' ``Pretrained`` init (their loaders, conversions),
        checked like every load; errors name the file, an unconverted release
        its converter command."""
        what = 'pre-trained checkpoint model.backbone.init_cfg.checkpoint ='
        self._is_init = False  # mmengine's Pretrained init runs once otherwise
        self._base = None
        try:
            with naming_checkpoint(checkpoint, what):
                super().init_weights()
        except AssertionError as error:  # mmengine: "<prefix> is not in the ..."
            if 'is not in the pretrained model' in str(error) and prefix \
                    and osp.isfile(checkpoint):
                check_converted(checkpoint, load_checkpoint_file(checkpoint, what), prefix,
                                backbone=type(self).__name__)
            raise
        if self._base is not None:  # the load names no file: this is where it came from
            self._base.update(checkpoint=_as_recorded(checkpoint), prefix=prefix)

    def check_base_for_training(self) -> None:
        """Raise :class:`NoPretrainedBaseError` where the adapters would train
        on a frozen base that is still random (none from ``init_cfg``, nor from
        a checkpoint since) and not ``random_base=True``."""
        if self._base is not None or not self.freeze_pretrained or self.random_base \
                or self.merged:
            return
        configured, prefix = self.configured_base()
        if configured:
            why = (f'model.backbone.init_cfg names {configured!r}, which was not there '
                   'when the model was built (nor was a checkpoint with the base '
                   'loaded since)')
        else:
            why = (f'model.backbone.init_cfg is {self.init_cfg!r}: no Pretrained '
                   'checkpoint (a config that trains its backbone from scratch?)')
        prefix = f', prefix={prefix!r}' if prefix else ''
        raise NoPretrainedBaseError(
            f'{type(self).__name__}: training with freeze_pretrained=True, but the frozen '
            f'base is random: {why}. The adapters would train on a random backbone. Either '
            "give it a pre-trained base: model.backbone.init_cfg=dict(type='Pretrained', "
            f"checkpoint='/path/to/base.pth'{prefix}) (or load a checkpoint that holds the "
            'base before training: load_from, resume, load_state_dict), or train every '
            'parameter from scratch: model.backbone.freeze_pretrained=False. (A random '
            'frozen base on purpose, as in benchmarks: model.backbone.random_base=True.)')

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
            format=RECORD_FORMAT, backbone=type(self).__name__,
            arch=self.arch_record(), adapters=self.adapter_options(),
            moppa_cfg=self.moppa_config.to_dict() if any(
                isinstance(m, MoPPAUnit) for m in self.modules()) else None,
            base=dict(self._base) if self._base else None)
        if self.merged:  # the weights hold the adapters: a whole, other model
            record['merged'] = True
        return record

    def get_extra_state(self) -> torch.Tensor:
        return encode_record(self.adapter_record())

    def set_extra_state(self, state: Any) -> None:
        """The record was checked before any tensor was copied
        (:meth:`load_checked`); nothing to restore from it."""

    @property
    def saves_adapters_only(self) -> bool:
        """Whether the model holding the backbone saves it adapter-only
        (:func:`~.adapter_state.frozen_base_keys` left out): a frozen base the
        config names (``freeze_pretrained=True``, a ``Pretrained``
        ``init_cfg``), unmerged."""
        return self.freeze_pretrained and not self.merged and \
            self.configured_base()[0] is not None

    # ------------------------------------------------------------- loading
    def _check_load_alone(self, state_dict, prefix: str, *args) -> None:
        """Load pre-hook: a load that starts here (``prefix`` empty: the
        backbone alone, as its base at build) is checked here; one through the
        model holding it was checked there (:func:`.model_hooks.check_load`)."""
        if not prefix:
            self.load_checked(state_dict, '', '')

    def load_checked(self, state_dict: Dict[str, Any], prefix: str, inside: str,
                     around: Optional[Mapping[str, torch.Tensor]] = None) -> None:
        """Check what comes in (:func:`~.adapter_state.checkpoint_problems`):
        stop, or warn where ``strict_adapter_record=False`` allows; then give
        the load what it lacks of the model (its base for an adapter-only
        checkpoint, its adapters for a base; heads of another shape keep
        theirs) and note the base that came.

        Args:
            state_dict: What the load got; keys under ``prefix`` are the model's.
            prefix: The model's prefix in ``state_dict``.
            inside: The backbone's prefix within the model (``''`` alone).
            around: The model's other tensors, None for the backbone alone.
        """
        state = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        for problem in checkpoint_problems(state, self, inside, around,
                                           f'{type(self).__name__}: the checkpoint'):
            if isinstance(problem, AdapterRecordMismatchError) and self.strict_adapter_record:
                raise type(problem)(f'{problem} To load it anyway, set '
                                    'model.backbone.strict_adapter_record=False.') from None
            if not isinstance(problem, (AdapterRecordMismatchError, BaseOnlyCheckpoint)):
                raise problem
            print_log(f'{problem}' if isinstance(problem, BaseOnlyCheckpoint) else  # a base
                      f'{problem} (strict_adapter_record=False: loading anyway)',
                      logger='current', level=logging.WARNING)
        incoming = {k[len(inside):]: v for k, v in state.items() if k.startswith(inside)}
        record = decode_record(incoming.pop(RECORD_KEY, None))
        own = self.state_dict()
        own.pop(RECORD_KEY)
        base = frozen_base_keys(incoming, '', self.params_not_in_base)
        if self.merged:
            self._base = dict(record['base']) if record and record.get('base') else None
        elif not any(is_adapter_key(k) for k in incoming):  # a pre-trained base
            self._base = dict(checkpoint=None, prefix=None,
                              fingerprint=base_fingerprint(self, incoming))
        elif base:  # a self-contained checkpoint: its base is the model's now
            recorded = (record or {}).get('base') or {}
            self._base = dict(checkpoint=recorded.get('checkpoint'),
                              prefix=recorded.get('prefix'),
                              fingerprint=base_fingerprint(self, incoming))
        for key, value in own.items():  # the rest keeps what the model has: no
            state_dict.setdefault(prefix + inside + key, value)  # missing-key noise
        for key, value in (around or {}).items():  # heads of another shape start anew
            given = state_dict.get(prefix + key)
            if isinstance(given, torch.Tensor) and given.shape != value.shape:
                del state_dict[prefix + key]
        # a strict load of a file without a record must not miss it
        state_dict[prefix + inside + RECORD_KEY] = self.get_extra_state()

    # ------------------------------------------------------------ training
    def _check_before_training(self, module, args) -> None:
        """Before a forward that will need gradients, in training mode: a
        frozen base must be a pre-trained one (:meth:`check_base_for_training`)."""
        if self.training and torch.is_grad_enabled() and not is_capturing():
            self.check_base_for_training()

    def _adapters(self):
        return [m for m in self.modules() if isinstance(m, self.ADAPTER_TYPES)]

    @property
    def adapters_enabled(self) -> bool:
        """Whether the adapters run (False: exactly the plain backbone)."""
        return all(m.enabled for m in self._adapters())

    @adapters_enabled.setter
    def adapters_enabled(self, enabled: bool) -> None:
        self._refuse_if_merged('cannot switch its adapters off (they are in its weights)')
        for module in self._adapters():
            module.enabled = enabled

    def train(self, mode: bool = True):
        """As the base class; fully frozen norms stay in eval mode (their
        statistics are the base's). Returns the module (mmpretrain's: None)."""
        super().train(mode)
        if mode:
            for norm in frozen_norms(self):
                norm.eval()
        return self

    # ----------------------------------------------------------------- merging
    def merge_adapters(self) -> 'AdapterMixin':
        """Fold the adapters in for inference, in place; returns the backbone.
        Every scale & shift goes into the weights of the layer whose output it
        scales (plain ``nn.Linear`` / ``nn.Conv2d`` then); every unit's filter
        and field become constants (:meth:`MoPPAUnit.merge_`); the Swin's 3x3
        conv adapters stay (nothing to fold into). One-way: it cannot train or
        load an unmerged checkpoint; its checkpoints are whole, recorded as
        merged, and load into a model built with ``merged=True``."""
        if self.merged:
            return self
        self._check_mergeable()
        for name, module in list(self.named_modules()):  # each with its scale & shift
            if isinstance(module, ScaleShiftLayer):
                parent_name, _, attr = name.rpartition('.')
                self.get_submodule(parent_name)._modules[attr] = module.merged_layer()
        for unit in moppa_units(self):
            unit.merge_()
        for param in self.parameters():
            param.requires_grad_(False)
        self.merged = True
        return self

    def _check_mergeable(self) -> None:
        """Raise where the adapters cannot become constants (subclasses)."""

    def _refuse_if_merged(self, what: str) -> None:
        if self.merged:
            raise RuntimeError(f'{type(self).__name__} is merged for inference '
                               f'(merge_adapters): it {what}. Build the model from its '
                               'config and load the unmerged checkpoint to train it')

    def extra_repr(self) -> str:
        """The base class's, the model's hooks for the backbone
        (:mod:`.model_hooks`) and the waiting first-step check
        (:mod:`.optimizer_check`)."""
        held = self.__dict__.get('_held_as')
        lines = [super().extra_repr()] + [f'{name}=({value})' for name, value in (
            ('model_hooks', held and f'{held[0]}.{held[1]}: loss_route into the loss dict; '
             'adapter-only save, record and digest; the load check'),
            ('optimizer_check', waiting_check(self))) if value]
        return '\n'.join(line for line in lines if line)

    # --------------------------------------------------------- parameters
    def _breakdown(self) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
        not_in_base = ((('not_in_base', tuple(self.params_not_in_base),
                         'new, no base has them'), ) if self.params_not_in_base else ())
        if self._base is not None:
            base = self.PRETRAINED_LABEL
        else:  # as built: not pre-trained, whatever the class calls its base
            base = self.PRETRAINED_LABEL.replace('pre-trained ', '') + ', random'
            base += ' (on purpose)' if self.random_base else ' (no base loaded)'
        return ADAPTER_GROUPS + not_in_base + (('pretrained', ('*', ), base), )

    def parameter_breakdown(self) -> Dict[str, Dict[str, int]]:
        """``{kind: {'total': n, 'trainable': n}}`` for each adapter kind of
        :data:`ADAPTER_GROUPS`, ``'pretrained'`` and ``'total'``."""
        _, counts = parameter_table(self, [(k, p) for k, p, _ in self._breakdown()])
        return counts

    def parameter_report(self) -> str:
        table, _ = parameter_table(self, [(label, p) for _, p, label in self._breakdown()],
                                   title=type(self).__name__)
        return table


def _hook_the_model(model: nn.Module, name: str, child: Optional[nn.Module]) -> None:
    """torch's module-registration hook (every ``model.<name> = child``): a
    MoPPA backbone hooks the model that holds it (:mod:`.model_hooks`);
    another module in its place unhooks it."""
    model_hooks.attach(model, name, child if isinstance(child, AdapterMixin) else None)


register_module_module_registration_hook(_hook_the_model)


def _moppa_backbones(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, AdapterMixin):
            yield (f'{name}.' if name else ''), module


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold the adapters of every MoPPA backbone in ``model`` into its weights
    (:meth:`AdapterMixin.merge_adapters`; outputs equal the unmerged model's
    up to float rounding), in place; returns ``model`` in eval mode::

        model = init_model(config, adapter_checkpoint)  # any loader
        torch.save({'state_dict': merge_adapters(model).state_dict()}, 'merged.pth')
    """
    backbones = [backbone for _, backbone in _moppa_backbones(model)]
    if not backbones:
        raise ValueError(f'{type(model).__name__} holds no MoPPA backbone: nothing to merge')
    for backbone in backbones:
        backbone.merge_adapters()
    return model.eval()


def full_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Every tensor of ``model``, the frozen base of its MoPPA backbones too
    (``model.state_dict()`` leaves it out where they save adapter-only): a
    self-contained checkpoint, for publishing or merging::

        torch.save({'state_dict': full_state_dict(model)}, 'full.pth')
    """
    state = model.state_dict()
    for inside, backbone in _moppa_backbones(model):
        for key, value in backbone.state_dict().items():
            state.setdefault(inside + key, value)
        redigest(state, inside)  # the digest covers the base it now carries
    return state


def adapter_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """``model``'s state dict without the frozen base of its MoPPA backbones
    (:func:`~.adapter_state.frozen_base_keys`), whatever their config:
    the adapters, the model's heads and neck, the records."""
    state = model.state_dict()
    for inside, backbone in _moppa_backbones(model):
        for key in frozen_base_keys(state, inside, backbone.params_not_in_base):
            del state[key]
        redigest(state, inside)
    return state


__all__ = ['AdapterMixin', 'AdapterRecordMismatchError', 'PretrainedMismatchError',
           'NoPretrainedBaseError', 'full_state_dict', 'adapter_state_dict', 'merge_adapters',
           'read_adapter_record', 'is_adapter_key', 'adapter_patterns',
           'adapter_components', 'ADAPTER_GROUPS', 'ADAPTER_PATTERNS']
