"""What the MoPPA backbones share. Each job has its own piece:

* :class:`MoPPAConfig` (``moppa_mm.models.moppa_config``): the units' options;
* :class:`.adapter_state.AdapterStateMixin`: what the state dict holds and
  accepts (adapter-only saving, the adapter record, checks on load);
* :class:`.route_loss.RouteLossMixin`: the route regularisation;
* :class:`AdapterMixin` (here): the build contract that ties them together:
  freezing, loading the pre-trained base the config names when the model is
  built (or merging, with ``merged=True``), re-initialising the adapters after
  the base class's ``init_weights``, switching the adapters off, keeping frozen
  batch norms in eval mode, the check before a training forward (a frozen
  base that is still random), and the parameter table.
"""
import os.path as osp
from typing import Any, Dict, Optional, Tuple

import torch
from mmengine.config import ConfigDict
from mmengine.logging import print_log

from moppa_mm.operators.tracing import is_capturing
from moppa_mm.utils.checkpoints import check_archive, load_checkpoint_file, naming_checkpoint
from moppa_mm.utils.errors import InputValueError, MoPPAInputError
from moppa_mm.utils.params import frozen_norms, parameter_table, set_trainable
from ..converters import check_converted
from moppa_mm.operators import moppa_units
from ..layers.scale_shift import ScaleShift, _RunsScaleShift
from ..moppa_config import MoPPAConfig
from . import parent_hooks  # noqa: F401  (the backbones' parents get their hooks)
from .optimizer_check import watch_first_step, waiting_check
from .adapter_state import (ADAPTER_GROUPS, ADAPTER_PATTERNS,  # noqa: F401
                            AdapterRecordMismatchError, AdapterStateMixin, _is_url,
                            PretrainedMismatchError, full_state, is_adapter_key,
                            read_adapter_record)
from .route_loss import RouteLossMixin


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


class AdapterMixin(AdapterStateMixin, RouteLossMixin):
    """Mixed into a backbone subclass (before the base class).

    A subclass calls :meth:`_pop_adapter_args` before the base ``__init__``,
    adds its adapters after it, then :meth:`_finish_build`. It sets
    ``ADAPTER_TYPES`` (modules with ``enabled`` and ``reset_parameters``) and
    ``PRETRAINED_LABEL``, the name of the frozen rest in the parameter table.

    Args of the backbones:
        random_base (bool): The frozen base is random on purpose (benchmarks
            that time training steps, tests of the adapters' mechanics). With
            ``freeze_pretrained=True`` and no pre-trained base in the model
            (none loaded from ``init_cfg`` when built, nor by a checkpoint
            since), the first training forward stops otherwise
            (:class:`NoPretrainedBaseError`). Defaults to False.
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()
    PRETRAINED_LABEL: str = 'pre-trained backbone'

    @staticmethod
    def _pop_adapter_args(moppa_cfg: Optional[Any], kwargs: dict) -> MoPPAConfig:
        """The units' options, validated, and an attribute-style ``init_cfg``
        for the base class (mmdet's Swin reads ``init_cfg.checkpoint``)."""
        if isinstance(kwargs.get('init_cfg'), dict):
            kwargs['init_cfg'] = ConfigDict(kwargs['init_cfg'])
        return MoPPAConfig.build(moppa_cfg)

    def _finish_build(self, freeze_pretrained: bool, route_loss_weight: float,
                      route_schedule: str, strict_adapter_record: bool,
                      random_base: bool = False) -> None:
        """Call after the adapters are added (then :meth:`_build_base`)."""
        self.freeze_pretrained = freeze_pretrained
        self.random_base = random_base
        if freeze_pretrained:
            set_trainable(self, trainable=ADAPTER_PATTERNS + tuple(self.fresh_params))
            watch_first_step(self)  # the adapters' lr (.optimizer_check)
        self.register_forward_pre_hook(self._check_before_training)
        self._init_route_loss(route_loss_weight, route_schedule)
        self._init_adapter_state(strict_adapter_record)

    def _build_base(self, merged: bool) -> None:
        """The last step of ``__init__``. The pre-trained base that ``init_cfg``
        names is loaded now (:meth:`init_weights`, as mmpretrain's ``LoRAModel``
        does), so that every later load (``runner.test()``, ``init_detector``,
        ``get_model``) finds it there; a file that is missing is a warning.
        With ``merged=True`` the adapters are folded in instead
        (:meth:`merge_adapters`): the model then takes a merged checkpoint,
        which holds the whole backbone."""
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
        if not _is_url(checkpoint) and not osp.isfile(checkpoint):
            print_log(f'{type(self).__name__}: the pre-trained base '
                      f'model.backbone.init_cfg.checkpoint = {checkpoint!r} does not '
                      'exist: the frozen backbone stays random, an adapter-only '
                      'checkpoint will not load into this model, and training stops '
                      'unless a checkpoint with the base is loaded first',
                      logger='current', level=30)
            return
        self.init_weights()
        # mmengine's init_weights() of the model around it skips a child already
        # initialised, after applying its own init_cfg to every submodule (e.g.
        # mmpretrain's TruncNormal on every Linear): let it call ours, which
        # checks that the base is still the one loaded here
        self._is_init = False

    @property
    def moppa_cfg(self) -> Dict[str, Any]:
        """The units' options as a dict (``moppa_config`` holds them)."""
        return self.moppa_config.to_dict()

    def _check_before_training(self, module, args) -> None:
        """Before a forward that will need gradients, in training mode: a
        frozen base must be a pre-trained one (:meth:`check_base_for_training`)."""
        if not torch.is_grad_enabled() or is_capturing():
            return
        if self.training:
            self.check_base_for_training()

    def check_base_for_training(self) -> None:
        """Raise :class:`NoPretrainedBaseError` when the adapters would train
        on a frozen base that is still random: ``freeze_pretrained=True``, no
        pre-trained base in the model (none loaded from ``init_cfg`` when the
        backbone was built, nor by a checkpoint since: a whole-model one,
        ``load_from``, a resume) and not ``random_base=True``."""
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
            f'{type(self).__name__}: training with freeze_pretrained=True, but the '
            f'frozen base is random: {why}. The adapters would train on a random '
            'backbone. Either give it a pre-trained base: model.backbone.init_cfg='
            f"dict(type='Pretrained', checkpoint='/path/to/base.pth'{prefix}) (or load "
            'a checkpoint that holds the base before training: load_from, resume, '
            'load_state_dict), or train every parameter from scratch: '
            'model.backbone.freeze_pretrained=False. (A random frozen base on '
            'purpose, as in benchmarks: model.backbone.random_base=True.)')

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
        """As the base class, and normalisation layers whose parameters are all
        frozen stay in eval mode (batch norms' statistics are part of the
        frozen base). Returns the module (mmpretrain's ``train`` returns None)."""
        super().train(mode)
        if mode:
            for norm in frozen_norms(self):
                norm.eval()
        return self

    def init_weights(self) -> None:
        """The base classes' ``init_weights`` (the ``Pretrained`` checkpoint of
        ``init_cfg``; without one they re-initialise every Linear), then the
        adapters' init. Once a pre-trained base is in the model (loaded when it
        was built, or by a checkpoint) the base is left as it is: only the
        adapters start anew. Errors while reading the pre-trained checkpoint
        name the file; an unconverted release (no keys under
        ``init_cfg.prefix``) is named with its converter command. Logs the
        parameter table with the base."""
        self._refuse_if_merged('cannot be initialised again')
        base_in_model = self._base is not None and not self._base_overwritten()
        if not base_in_model:
            # the base classes' own init reads self.state_dict() whole (mmdet's
            # Swin resizes its position-bias tables against it)
            full, self._full_state = self._full_state, True
            try:
                self._init_base_weights()
            finally:
                self._full_state = full
            if self._base is not None:  # the base as it sits in the model: a file
                # may hold keys the model has not (MAE's final norm under
                # final_norm=False), which the recorded fingerprint counts
                self._base_as_loaded = (self._base,
                                        self._base_fingerprint(self._own_full_state()))
        for module in self._adapters():
            module.reset_parameters()
        if not base_in_model:  # logged once: when the base came
            print_log('\n' + self.parameter_report(), logger='current')
        self._is_init = True

    def _base_overwritten(self) -> bool:
        """Whether the base loaded from the config's file has changed since:
        mmengine applies the init_cfg of the model around the backbone (e.g.
        a classifier's ``TruncNormal`` on every ``Linear``) to every submodule
        before it calls the backbone's ``init_weights()``. Logs it; the base is
        then loaded again from the same file."""
        recorded = self._base.get('fingerprint') if self._base else None
        if not recorded or not self._base.get('checkpoint'):
            return False
        loaded_base, as_loaded = self.__dict__.get('_base_as_loaded', (None, None))
        if loaded_base is self._base:  # the base init_weights loaded, as it was then
            recorded = as_loaded
        if self._base_fingerprint(self._own_full_state()) == recorded:
            return False
        print_log(f'{type(self).__name__}: the pre-trained base was re-initialised '
                  'after it was loaded (by the init_cfg of the model around the '
                  f'backbone); loading {self._base["checkpoint"]!r} again',
                  logger='current')
        self._base = None
        return True

    def _init_base_weights(self) -> None:
        checkpoint, prefix = self.configured_base()
        if checkpoint is None:
            super().init_weights()
        else:
            self._checkpoint_source, self._checkpoint_prefix = checkpoint, prefix
            what = 'pre-trained checkpoint model.backbone.init_cfg.checkpoint ='
            self._is_init = False  # mmengine's Pretrained init runs once otherwise
            try:
                with naming_checkpoint(checkpoint, what):
                    if osp.isfile(checkpoint):  # mmengine's loader ignores the CRCs
                        check_archive(checkpoint, what)
                    super().init_weights()
            except AssertionError as error:  # mmengine: "<prefix> is not in the ..."
                if 'is not in the pretrained model' in str(error) and prefix \
                        and osp.isfile(checkpoint):
                    check_converted(checkpoint, load_checkpoint_file(checkpoint, what),
                                    prefix)
                raise
            finally:
                self._checkpoint_source = self._checkpoint_prefix = None

    # ----------------------------------------------------------------- merging
    def merge_adapters(self) -> 'AdapterMixin':
        """Fold the adapters into the backbone for inference, in place; returns
        the backbone. :func:`moppa_mm.merge_adapters` does it for a whole model.

        * every scale & shift goes into the weights of the layer whose output it
          scales (the linear layers, the patch embedding's projection), which
          become plain ``nn.Linear`` / ``nn.Conv2d`` with new frozen tensors;
          the scale & shift modules are gone;
        * every MoPPA unit's filter and field become constant buffers
          (:meth:`MoPPAUnit.merge_`); its two DCTs stay, they are the unit;
        * the 3x3 conv adapters (Swin) stay as they are: a nonlinear branch has
          no weights to fold into.

        One-way: the merged backbone cannot train, switch its adapters off or
        load an unmerged checkpoint. Its ``state_dict()`` is the whole model,
        recorded as merged; it loads into a model built merged (the backbone
        option ``merged=True``, e.g. ``--cfg-options model.backbone.merged=True``
        for ``tools/test.py``, or ``cfg_options`` of ``init_detector``).
        """
        if self.merged:
            return self
        self._check_mergeable()
        for kind in (_RunsScaleShift, ScaleShift):  # the layers, then their parameters
            for name, module in list(self.named_modules()):
                if isinstance(module, kind):
                    parent_name, _, attr = name.rpartition('.')
                    parent = self.get_submodule(parent_name)
                    if kind is ScaleShift:
                        del parent._modules[attr]
                    else:
                        parent._modules[attr] = module.merged_layer()
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
        """The base class's, the hooks the model holding this backbone runs
        for it (:mod:`.parent_hooks`) and the optimizer step check that waits
        for its first step (:mod:`.optimizer_check`)."""
        text = super().extra_repr()
        for name, value in (('parent_hooks', self.__dict__.get('_parent_hooks')),
                            ('optimizer_check', waiting_check(self))):
            if value:
                text += ('\n' if text else '') + f'{name}=({value})'
        return text

    def _breakdown(self) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
        fresh = ((('fresh', tuple(self.fresh_params), 'new, no base has them'), )
                 if self.fresh_params else ())
        if self._base is not None:
            base = self.PRETRAINED_LABEL
        else:  # as built: not pre-trained, whatever the class calls its base
            base = self.PRETRAINED_LABEL.replace('pre-trained ', '') + ', random'
            base += ' (on purpose)' if self.random_base else ' (no base loaded)'
        return ADAPTER_GROUPS + fresh + (('pretrained', ('*', ), base), )

    def parameter_breakdown(self) -> Dict[str, Dict[str, int]]:
        """``{kind: {'total': n, 'trainable': n}}`` for each adapter kind of
        :data:`ADAPTER_GROUPS`, ``'pretrained'`` and ``'total'``."""
        _, counts = parameter_table(self, [(k, p) for k, p, _ in self._breakdown()])
        return counts

    def parameter_report(self) -> str:
        table, _ = parameter_table(self, [(label, p) for _, p, label in self._breakdown()],
                                   title=type(self).__name__)
        return table


__all__ = ['AdapterMixin', 'AdapterRecordMismatchError', 'PretrainedMismatchError',
           'NoPretrainedBaseError',
           'full_state', 'read_adapter_record', 'is_adapter_key', 'adapter_patterns',
           'adapter_components', 'ADAPTER_GROUPS', 'ADAPTER_PATTERNS']
