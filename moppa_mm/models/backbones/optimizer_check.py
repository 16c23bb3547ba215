"""The adapters' learning rate, checked at the first optimizer step.

A config written for a backbone that trains whole often scales the backbone's
learning rate down (DINO and Mask2Former: ``paramwise_cfg.custom_keys=
{'backbone': dict(lr_mult=0.1)}``). With the base frozen, such a key covers
only the adapters, which then train at a tenth of the learning rate, silently.
mmengine's default optimizer constructor builds the optimizer where the model
cannot see the config, so a MoPPA backbone with a frozen base checks what it
can see: when it is built, it registers a one-shot *global* optimizer step
pre-hook (torch's ``torch.optim.optimizer.register_optimizer_step_pre_hook``).
Before the first ``step()`` of an optimizer that holds its adapters, the hook
compares their groups' learning rate (``initial_lr``, the one before any
schedule, else ``lr``) and weight decay with the optimizer's ``defaults``,
logs one warning where the learning rate differs (or where every adapter's
weight decay does), and is removed after that step (torch goes through its
global hooks during the step: a post-hook of that optimizer removes it).
Optimizers without the adapters are passed by. The backbone's ``repr`` names
the check while it waits (``optimizer_check=...``); the hook holds the backbone
weakly, and the hook of a backbone that is gone is removed when the next
backbone is built. Being torch's, it works in a plain PyTorch loop too.

:class:`~moppa_mm.engine.optimizers.TrainableParamsOptimWrapperConstructor`
knows the ``paramwise_cfg``: it warns when it builds the optimizer, naming the
key and a line that restores the learning rate, and the backbone's check is
then done.
"""
import logging
import math
import weakref
from typing import Dict, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .adapter_state import is_adapter_key

WAITING = ("first step of an optimizer that holds the adapters: their lr and weight "
           "decay against the optimizer's")

# backbone -> its check, while it waits; every check still among torch's hooks
_waiting: 'weakref.WeakKeyDictionary[nn.Module, _FirstStepCheck]' = \
    weakref.WeakKeyDictionary()
_registered: List['_FirstStepCheck'] = []


class _FirstStepCheck:
    """The global step pre-hook of one backbone (held weakly)."""

    def __init__(self, backbone: nn.Module) -> None:
        self.backbone = weakref.ref(backbone)
        self.passed = weakref.WeakSet()  # optimizers without its adapters
        self.done = False
        self.handle = register_optimizer_step_pre_hook(self)

    def __call__(self, optimizer: Optimizer, args, kwargs) -> None:
        backbone = self.backbone()
        if self.done or backbone is None or optimizer in self.passed:
            return None
        held = adapter_groups(backbone, optimizer)
        if not held:
            self.passed.add(optimizer)
            return None
        self.done = True
        _waiting.pop(backbone, None)
        # torch is going through its global pre-hooks: this one goes after the step
        optimizer.register_step_post_hook(_AfterStep())
        message = adapter_lr_warning(backbone, optimizer, held)
        if message:
            print_log(message, logger='current', level=logging.WARNING)
        return None


class _AfterStep:
    """A post-hook of the optimizer whose first step ran a check: removes the
    finished checks from torch's global pre-hooks (once; inert afterwards)."""

    ran = False

    def __call__(self, optimizer: Optimizer, args, kwargs) -> None:
        if not self.ran:
            self.ran = True
            _remove_finished()


def _remove_finished() -> None:
    """Remove the checks that ran or whose backbone is gone from torch's
    global hooks: never while torch goes through them (after a step, when a
    backbone is built, by a constructor)."""
    for check in [c for c in _registered if c.done or c.backbone() is None]:
        check.handle.remove()
        _registered.remove(check)


def watch_first_step(backbone: nn.Module) -> None:
    """Register the backbone's one-shot check (when it is built)."""
    _remove_finished()
    check = _FirstStepCheck(backbone)
    _registered.append(check)
    _waiting[backbone] = check


def waiting_check(backbone: nn.Module) -> Optional[str]:
    """What the backbone's check waits for, None once it has run (``repr``)."""
    return WAITING if backbone in _waiting else None


def check_done(backbone: nn.Module) -> None:
    """The backbone's adapters were checked (by a constructor that knows the
    config): its step check goes."""
    check = _waiting.pop(backbone, None)
    if check is not None:
        check.done = True
        _remove_finished()


def adapter_groups(backbone: nn.Module,
                   optimizer: Optimizer) -> List[Tuple[str, Dict]]:
    """``(adapter parameter name, its group)`` for the backbone's trainable
    adapters that ``optimizer`` holds."""
    names = {id(p): n for n, p in backbone.named_parameters()
             if p.requires_grad and is_adapter_key(n)}
    return [(names[id(p)], group) for group in optimizer.param_groups
            for p in group['params'] if id(p) in names]


def _values(values: List[float]) -> str:
    low, high = min(values), max(values)
    return f'{low:g}' if math.isclose(low, high) else f'{low:g} to {high:g}'


def adapter_lr_warning(backbone: nn.Module, optimizer: Optimizer,
                       held: List[Tuple[str, Dict]], cause: Optional[str] = None,
                       fix: Optional[str] = None) -> Optional[str]:
    """The warning when the adapters in ``held`` (:func:`adapter_groups`)
    train at another lr than the optimizer's (or all at another weight
    decay); None otherwise. ``cause`` and ``fix`` replace the general ones
    (a constructor that knows the ``paramwise_cfg`` names the key)."""
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
        found.append(f'{len(off_lr)} of its {len(held)} adapter tensors train at lr '
                     f'{_values(off_lr)}{ratio}, the optimizer\'s is {base_lr:g}')
    if off_wd:
        found.append(f'{"all of them" if off_lr else f"all {len(held)} of its adapter tensors"}'
                     f' train at weight decay {_values(wds)}, the optimizer\'s is {base_wd:g}')
    layer_wise = any('lr_scale' in group for _, group in held)
    if cause is None:
        cause = ("mmpretrain's layer-wise lr decay (paramwise_cfg.layer_decay_rate), "
                 'meant for pre-trained layers, scales them' if layer_wise else
                 "the config's paramwise_cfg sets it, e.g. custom_keys={'backbone': "
                 "dict(lr_mult=0.1)}, written for a backbone that trains whole: with "
                 'the base frozen (and left out of the optimizer) the key covers '
                 'only the adapters')
    if fix is None:
        where = backbone.__dict__.get('_attached_name', 'backbone')
        fix = ('paramwise_cfg.layer_decay_rate=1.0 trains every layer at the lr'
               if layer_wise else
               'to train them at the optimizer\'s lr, add a longer key (mmengine\'s '
               'constructor applies the longest key that matches): paramwise_cfg='
               f"dict(custom_keys={{'{where}.': dict(lr_mult=1.0, decay_mult=1.0)}}); "
               "optim_wrapper.constructor='TrainableParamsOptimWrapperConstructor' "
               'names the key')
    return f'{type(backbone).__name__}: ' + '; '.join(found) + f'. Why: {cause}. Fix: {fix}.'
