"""What the MoPPA backbones share: :class:`AdapterMixin`, their build and merge."""
import logging
import os.path as osp
import weakref
from itertools import chain
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import print_log
from torch.nn.modules.module import register_module_module_registration_hook
from torch.utils.hooks import RemovableHandle

from moppa_mm.operators import moppa_units
from moppa_mm.utils.checkpoints import load_checkpoint_file, naming_checkpoint
from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import frozen_norms, set_trainable
from moppa_mm.utils.release_formats import check_converted
from ..layers.scale_shift import ScaleShiftLayer
from ..moppa_config import MoPPAConfig
from . import load_check, model_hooks, training_checks
from .adapter_params import ADAPTER_PATTERNS, frozen_base_keys, is_adapter_key, parameter_report
from .adapter_record import _as_recorded, adapter_record, encode_record, redigest
from .arguments import check_arguments
from .route_loss import RouteLossMixin

# The base each backbone read when built, until the model calls its init_weights()
# (or train()): keyed weakly by the backbone, so that a deepcopy (EMA) leaves it.
_BASE_READ_WHEN_BUILT: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()


class AdapterMixin(RouteLossMixin):
    """Mixed into a backbone subclass (before the base class): its build and
    merge. A subclass calls :meth:`_pop_adapter_args` before the base
    ``__init__``, adds its adapters after it, then :meth:`_finish_build` and
    :meth:`_build_base`; it provides ``arch_record()`` and ``adapter_options()``
    (:mod:`.adapter_record`). ``params_not_in_base``: patterns of base-class
    parameters no pre-trained base has (mmpretrain ViT's ``ln2`` under
    ``out_type='avg_featmap'``): they train and are saved with the adapters.

    Args of the backbones:
        freeze_pretrained (bool): Freeze all but the adapters when built, so
            that DDP sees the final trainable set. Defaults to True.
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
            tests); otherwise training on a random frozen base stops. Defaults
            to False.
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()  # modules with enabled, reset_parameters
    PRETRAINED_LABEL: str = 'pre-trained backbone'  # the rest, in the parameter table
    PRETRAINED_MAY_LACK: Tuple[str, ...] = ()  # base parameters releases lack
    RESIZES_FREQUENCY_MAPS: bool = False  # the units' grid follows the image size
    RECORD_MAY_DIFFER: Tuple[str, ...] = ()  # record keys that may differ (image grid)
    FINGERPRINT_SKIPS: Tuple[str, ...] = ()  # base keys resized on load
    params_not_in_base: Tuple[str, ...] = ()
    merged: bool = False  # adapters folded in for inference (merge_adapters)
    held_by: Optional[model_hooks.HeldBy] = None  # the model it hooks (model_hooks.attach)

    def _pop_adapter_args(self, kwargs: dict, own: Dict[str, Any]) -> MoPPAConfig:
        """Check the arguments (``own``: the ``__init__``'s ``locals()``; ``kwargs``:
        the base class's) and return the units' options; an attribute-style
        ``init_cfg`` for the base class (mmdet's Swin reads ``init_cfg.checkpoint``)."""
        check_arguments(type(self), own, kwargs)
        self._refuse_uncovered(kwargs)
        if isinstance(kwargs.get('init_cfg'), dict):
            kwargs['init_cfg'] = ConfigDict(kwargs['init_cfg'])
        return MoPPAConfig.build(own['moppa_cfg'])

    def _refuse_uncovered(self, kwargs: dict) -> None:
        """Raise :class:`InputValueError` where the base class's arguments
        describe a network the class does not cover (subclasses)."""

    def _finish_build(self, freeze_pretrained: bool, route_loss_weight: float,
                      route_schedule: str, strict_adapter_record: bool,
                      random_base: bool = False) -> None:
        """After the adapters are added: freezing, the checks as training starts,
        the route loss, the load check (after the base classes' load pre-hooks:
        mmpretrain's ViT resizes ``pos_embed`` in one), the hook on the model."""
        self.freeze_pretrained, self.random_base, self.strict_adapter_record = \
            freeze_pretrained, random_base, strict_adapter_record
        # the base in the model: {'checkpoint', 'prefix', 'fingerprint'}, None while
        # random; set by _load_base and by every load (load_check.load_checked)
        self._base: Optional[Dict[str, Optional[str]]] = None
        if freeze_pretrained:
            set_trainable(self, trainable=ADAPTER_PATTERNS + tuple(self.params_not_in_base))
            training_checks.watch_first_step(self)
        self.register_forward_pre_hook(training_checks.check_base)
        self._init_route_loss(route_loss_weight, route_schedule)
        self.register_load_state_dict_pre_hook(load_check.check_load_alone)
        _hook_models_once()

    def _build_base(self, merged: bool) -> None:
        """The last step of ``__init__``: load the base ``init_cfg`` names, for
        every later load to find (a missing file warns), or merge (``merged``)."""
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
            print_log(f'{type(self).__name__}: the pre-trained base model.backbone.init_cfg.'
                      f'checkpoint = {checkpoint!r} does not exist: the frozen backbone stays '
                      'random, an adapter-only checkpoint will not load into this model, and '
                      'training stops unless a checkpoint with the base is loaded first',
                      logger='current', level=logging.WARNING)
            return
        self.init_weights()
        # the model's init_weights() applies its init_cfg (mmpretrain's TruncNormal on
        # every Linear) to every submodule, then calls ours (not is_init): ours copies
        # back the base read now (the file is read once)
        _BASE_READ_WHEN_BUILT[self] = {name: tensor.detach().clone()
                                       for name, tensor in self._base_tensors()}
        self.is_init = False

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
        """The base ``init_cfg`` names: the one read when built, copied back (the
        model around may have initialised over it), else loaded (a local file gone
        since leaves it); or the base classes' init without one; then the adapters'
        init. Logs the parameter table when the base comes."""
        self._refuse_if_merged('cannot be initialised again')
        checkpoint, prefix = self.configured_base()
        came = self._base is None
        read_when_built = _BASE_READ_WHEN_BUILT.pop(self, None)
        if checkpoint is None:
            super().init_weights()
            self._base = None
        elif read_when_built is not None:
            with torch.no_grad():
                for name, tensor in self._base_tensors():
                    tensor.copy_(read_when_built[name])
        elif came or '://' in checkpoint or osp.isfile(checkpoint):
            self._load_base(checkpoint, prefix)
        for module in self._adapters():
            module.reset_parameters()
        if came:
            print_log('\n' + parameter_report(self), logger='current')
        self.is_init = True

    def _base_tensors(self):  # the parameters and buffers not the adapters'
        return [(name, tensor) for name, tensor in chain(
            self.named_parameters(), self.named_buffers()) if not is_adapter_key(name)]

    def _load_base(self, checkpoint: str, prefix: Optional[str]) -> None:
        """The base classes' ``Pretrained`` init, checked like every load; errors
        name the file, an unconverted release its converter command."""
        what = 'pre-trained checkpoint model.backbone.init_cfg.checkpoint ='
        self.is_init = False  # mmengine's Pretrained init runs once otherwise
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

    def get_extra_state(self) -> torch.Tensor:  # the adapter record, in every state dict
        return encode_record(adapter_record(self))

    def set_extra_state(self, state: Any) -> None:
        """Nothing to restore: the load check read the record."""

    @property
    def saves_adapters_only(self) -> bool:
        """Whether the model saves the backbone adapter-only: a frozen base
        the config names (a ``Pretrained`` ``init_cfg``), unmerged."""
        return self.freeze_pretrained and not self.merged and \
            self.configured_base()[0] is not None

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
        _BASE_READ_WHEN_BUILT.pop(self, None)  # no init_weights() before a run
        if mode:
            for norm in frozen_norms(self):
                norm.eval()
        return self

    def merge_adapters(self) -> 'AdapterMixin':
        """Fold the adapters in for inference, in place; returns the backbone.
        Each scale & shift goes into its layer's weights (a plain ``nn.Linear`` /
        ``nn.Conv2d`` then), each unit's filter and field become constants; the
        Swin's conv adapters stay. One-way: its checkpoints are whole, recorded as
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
        """The base class's, the model's hooks and the waiting first-step check."""
        held = self.held_by
        lines = [super().extra_repr()] + [f'{name}=({value})' for name, value in (
            ('model_hooks', held and f'{held.model}.{held.name}: loss_route into the loss '
             'dict; adapter-only save, record and digest; the load check'),
            ('first_step_check', training_checks.waiting_check(self))) if value]
        return '\n'.join(line for line in lines if line)


_MODELS_HOOK: List[RemovableHandle] = []


def _hook_models_once() -> None:
    """Register :func:`_hook_the_model` with torch when the first backbone is
    built: global, as the assignment of a child is the one moment a module
    meets the model that holds it (docs/design.md, process-wide effects)."""
    if not _MODELS_HOOK:
        _MODELS_HOOK.append(register_module_module_registration_hook(_hook_the_model))


def _hook_the_model(model: nn.Module, name: str, child: Optional[nn.Module]) -> None:
    """torch's module-registration hook (every ``model.<name> = child``): a MoPPA
    backbone hooks the model; another module in its place unhooks it."""
    replaced = model._modules.get(name)  # as torch reads it: a getattr could run a property
    if isinstance(child, AdapterMixin) or isinstance(replaced, AdapterMixin):
        model_hooks.attach(model, name, child if isinstance(child, AdapterMixin) else None,
                           replaced if isinstance(replaced, AdapterMixin) else None)


def _moppa_backbones(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, AdapterMixin):
            yield (f'{name}.' if name else ''), module


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold the adapters of every MoPPA backbone of ``model`` into its weights
    (:meth:`AdapterMixin.merge_adapters`), in place; ``model`` in eval mode::

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
    (:func:`~.adapter_params.frozen_base_keys`), whatever their config:
    the adapters, the model's heads and neck, the records."""
    state = model.state_dict()
    for inside, backbone in _moppa_backbones(model):
        for key in frozen_base_keys(state, inside, backbone.params_not_in_base):
            del state[key]
        redigest(state, inside)
    return state
