"""The checks of a MoPPA backbone with a frozen base as training starts, under
any tool or plain PyTorch: a random base stops the first training forward
(:func:`check_base`); adapters at another lr than the optimizer's (built where
the backbone cannot see the config) stop the first step (:class:`FirstStepCheck`).
"""
import logging
import math
import weakref
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger, print_log
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook

from moppa_mm.operators.tracing import is_capturing
from moppa_mm.utils.errors import MoPPAInputError
from .adapter_params import is_adapter_key

# what mmengine's DefaultOptimWrapperConstructor.add_params logs per frozen one
FROZEN_MESSAGE = ' is skipped since its requires_grad=False'
WAITING = ("first step of an optimizer that holds the adapters: their lr and weight "
           "decay against the optimizer's")


class NoPretrainedBaseError(MoPPAInputError, RuntimeError):
    """A frozen base about to train while still random, as built."""


class AdapterLrError(MoPPAInputError, RuntimeError):
    """The adapters would train at another lr or weight decay than the optimizer's."""


def check_base(backbone: nn.Module, args) -> None:
    """Forward pre-hook: a training forward with gradients needs a frozen base
    that is pre-trained (unless ``random_base=True``)."""
    if not backbone.training or not torch.is_grad_enabled() or is_capturing() or \
            backbone.pretrained_base is not None or not backbone.freeze_pretrained or \
            backbone.random_base or backbone.merged:
        return
    configured, prefix = backbone.configured_base()
    why = (f'model.backbone.init_cfg names {configured!r}, which was not there when the model '
           'was built (nor was a checkpoint with the base loaded since)' if configured else
           f'model.backbone.init_cfg is {backbone.init_cfg!r}: no Pretrained checkpoint (a '
           'config that trains its backbone from scratch?)')
    prefix = f', prefix={prefix!r}' if prefix else ''
    raise NoPretrainedBaseError(
        f'{type(backbone).__name__}: training with freeze_pretrained=True, but the frozen base '
        f'is random: {why}. The adapters would train on a random backbone. Either give it a '
        "pre-trained base: model.backbone.init_cfg=dict(type='Pretrained', checkpoint="
        f"'/path/to/base.pth'{prefix}) (or load a checkpoint that holds the base before "
        'training: load_from, resume, load_state_dict), or train every parameter from '
        'scratch: model.backbone.freeze_pretrained=False. (A random frozen base on purpose, '
        'as in benchmarks: model.backbone.random_base=True.)')


_checks: List['FirstStepCheck'] = []  # every check still among torch's hooks


class FirstStepCheck:
    """The one-shot checks of one backbone (held weakly): the global step
    pre-hook and the filter of its frozen parameters' log lines."""

    def __init__(self, backbone: nn.Module) -> None:
        self.backbone = weakref.ref(backbone)
        self.passed = weakref.WeakSet()  # optimizers without its adapters
        self.done = False
        self.frozen: Optional[set] = None  # the names of the frozen parameters
        self.said = False  # the frozen parameters' line
        self.handle = register_optimizer_step_pre_hook(self)
        self.logger = MMLogger.get_current_instance()
        self.logger.addFilter(self.frozen_lines)

    def __call__(self, optimizer: Optimizer, args, kwargs) -> None:
        backbone = self.backbone()
        if self.done or backbone is None or optimizer in self.passed:
            return
        held = adapter_groups(backbone, optimizer)
        if not held:
            self.passed.add(optimizer)
            return
        self.done = True
        message = adapter_lr_message(backbone, optimizer, held)
        if message:
            self.remove()  # torch stops going through its hooks: the error follows
            raise AdapterLrError(message)
        # torch is going through its global pre-hooks: the finished ones go after
        # the step (a post-hook of this optimizer; inert once they are gone)
        optimizer.register_step_post_hook(_remove_finished)

    def frozen_lines(self, record: logging.LogRecord) -> bool:
        """Logger filter: mmengine's line per frozen parameter of the backbone
        is dropped; the first becomes one that says how many and why."""
        message, backbone = record.getMessage(), self.backbone()
        if backbone is None or not message.endswith(FROZEN_MESSAGE):
            return True
        inside = f'{backbone.held_by.name}.' if backbone.held_by else ''
        if self.frozen is None:
            self.frozen = {inside + n for n, p in backbone.named_parameters()
                           if not p.requires_grad}
        if message[:-len(FROZEN_MESSAGE)].lstrip('.') not in self.frozen:
            return True
        if not self.said:
            self.said = True
            print_log(f'{type(backbone).__name__}: {len(self.frozen)} frozen parameter '
                      f'tensors (model.{inside or "backbone."}*: the pre-trained base, and '
                      'adapters of frozen stages) are left out of the optimizer; '
                      "mmengine's warning for each is not shown", logger='current')
        return False

    def remove(self) -> None:
        self.handle.remove()
        self.logger.removeFilter(self.frozen_lines)
        _checks.remove(self)


def _remove_finished(*step) -> None:  # not while torch goes through its hooks
    for check in [c for c in _checks if c.done or c.backbone() is None]:
        check.remove()


def watch_first_step(backbone: nn.Module) -> None:
    _remove_finished()
    _checks.append(FirstStepCheck(backbone))


def waiting_check(backbone: nn.Module) -> Optional[str]:
    """What the backbone's check waits for, None once it has run (``repr``)."""
    return WAITING if any(c.backbone() is backbone and not c.done for c in _checks) else None


def check_done(backbone: nn.Module) -> None:
    """The adapters' lr is checked elsewhere (a constructor that knows the keys)."""
    for check in _checks:
        check.done = check.done or check.backbone() is backbone
    _remove_finished()


def adapter_groups(backbone: nn.Module, optimizer: Optimizer) -> List[Tuple[str, Dict]]:
    """``(name, group)`` of the backbone's trainable adapters in ``optimizer``."""
    names = {id(p): n for n, p in backbone.named_parameters()
             if p.requires_grad and is_adapter_key(n)}
    return [(names[id(p)], group) for group in optimizer.param_groups
            for p in group['params'] if id(p) in names]


def _values(values: List[float]) -> str:
    low, high = min(values), max(values)
    return f'{low:g}' if math.isclose(low, high) else f'{low:g} to {high:g}'


def adapter_lr_message(backbone: nn.Module, optimizer: Optimizer,
                       held: List[Tuple[str, Dict]], cause: Optional[str] = None,
                       line: Optional[str] = None) -> Optional[str]:
    """What stops a run whose adapters in ``held`` (:func:`adapter_groups`)
    train at another lr (or all at another weight decay) than the optimizer's,
    else None; a constructor that knows the key gives ``cause`` and ``line``."""
    base_lr = optimizer.defaults.get('lr')
    base_wd = optimizer.defaults.get('weight_decay', 0.0)
    if not isinstance(base_lr, (int, float)):
        return None
    lrs = [group.get('initial_lr', group['lr']) for _, group in held]
    wds = [group.get('weight_decay', base_wd) for _, group in held]
    off_lr = [lr for lr in lrs if not math.isclose(lr, base_lr, rel_tol=1e-6)]
    off_wd = all(not math.isclose(wd, base_wd, rel_tol=1e-6) for wd in wds)
    if not off_lr and not off_wd:
        return None
    found = []
    if off_lr:
        ratio = (f' ({off_lr[0] / base_lr:g} x)' if base_lr and
                 math.isclose(min(off_lr), max(off_lr)) else '')
        found.append(f'{len(off_lr)} of its {len(held)} adapter tensors would train at lr '
                     f"{_values(off_lr)}{ratio}, the optimizer's is {base_lr:g}")
    if off_wd:
        found.append(f'{"all of them" if off_lr else f"all {len(held)} of its adapter tensors"}'
                     f" at weight decay {_values(wds)}, the optimizer's is {base_wd:g}")
    layer_wise = any('lr_scale' in group for _, group in held)
    where = backbone.held_by.name if backbone.held_by else 'backbone'
    cause = cause or (
        "mmpretrain's layer-wise lr decay (paramwise_cfg.layer_decay_rate), meant for "
        'pre-trained layers, scales them' if layer_wise else
        "the config's paramwise_cfg sets it, e.g. custom_keys={'backbone': dict(lr_mult="
        '0.1)}, written for a backbone that trains whole: with the base frozen (and left '
        'out of the optimizer) the key covers only the adapters, and a longer key '
        'restores their lr (mmengine applies the longest key that matches)')
    line = line or (
        'optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=1.0))' if layer_wise else
        f"optim_wrapper = dict(paramwise_cfg=dict(custom_keys={{'{where}.': dict("
        'lr_mult=1.0, decay_mult=1.0)}))')
    return (f'{type(backbone).__name__}: ' + '; '.join(found) + f'. Why: {cause}. Stopped '
            "before the first step; to train them at the optimizer's lr, add to the "
            f'config: {line}.')
