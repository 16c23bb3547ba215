"""The adapters' learning rate, checked at the first optimizer step.

A config written for a backbone that trains whole often scales the backbone's
lr down (``paramwise_cfg.custom_keys={'backbone': dict(lr_mult=0.1)}``); with
the base frozen such a key covers only the adapters, silently. The optimizer
is built where the model cannot see the config, so a backbone with a frozen
base registers a one-shot global step pre-hook (torch's
``register_optimizer_step_pre_hook``; plain PyTorch loops too): at the first
``step()`` of an optimizer holding its adapters it compares their lr
(``initial_lr``) and weight decay with the optimizer's ``defaults``, warns
once, and goes. It holds the backbone weakly; ``repr`` names it while it waits.
:class:`~moppa_mm.engine.optimizers.TrainableParamsOptimWrapperConstructor`
knows the ``paramwise_cfg``: it warns naming the key, and the check is done.
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
_checks: List['_FirstStepCheck'] = []  # every check still among torch's hooks


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
            return
        held = adapter_groups(backbone, optimizer)
        if not held:
            self.passed.add(optimizer)
            return
        self.done = True
        # torch is going through its global pre-hooks: the finished ones go after
        # the step (a post-hook of this optimizer; inert once they are gone)
        optimizer.register_step_post_hook(_remove_finished)
        message = adapter_lr_warning(backbone, optimizer, held)
        if message:
            print_log(message, logger='current', level=logging.WARNING)


def _remove_finished(*step) -> None:
    """Remove the checks that ran or whose backbone is gone from torch's
    global hooks (never while torch goes through them; ``step``: the
    optimizer, args and kwargs of a post-hook call)."""
    for check in [c for c in _checks if c.done or c.backbone() is None]:
        check.handle.remove()
        _checks.remove(check)


def watch_first_step(backbone: nn.Module) -> None:
    """Register the backbone's one-shot check (when it is built)."""
    _remove_finished()
    _checks.append(_FirstStepCheck(backbone))


def _check_of(backbone: nn.Module) -> Optional[_FirstStepCheck]:
    return next((c for c in _checks if c.backbone() is backbone and not c.done), None)


def waiting_check(backbone: nn.Module) -> Optional[str]:
    """What the backbone's check waits for, None once it has run (``repr``)."""
    return WAITING if _check_of(backbone) else None


def check_done(backbone: nn.Module) -> None:
    """The backbone's adapters were checked (by a constructor that knows the
    config): its step check goes."""
    check = _check_of(backbone)
    if check is not None:
        check.done = True
        _remove_finished()


def adapter_groups(backbone: nn.Module, optimizer: Optimizer) -> List[Tuple[str, Dict]]:
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
    """The warning where the adapters in ``held`` (:func:`adapter_groups`)
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
                     f"{_values(off_lr)}{ratio}, the optimizer's is {base_lr:g}")
    if off_wd:
        found.append(f'{"all of them" if off_lr else f"all {len(held)} of its adapter tensors"}'
                     f" train at weight decay {_values(wds)}, the optimizer's is {base_wd:g}")
    layer_wise = any('lr_scale' in group for _, group in held)
    where = backbone.__dict__.get('_held_as', (None, 'backbone'))[1]
    cause = cause or (
        "mmpretrain's layer-wise lr decay (paramwise_cfg.layer_decay_rate), meant for "
        'pre-trained layers, scales them' if layer_wise else
        "the config's paramwise_cfg sets it, e.g. custom_keys={'backbone': dict(lr_mult="
        '0.1)}, written for a backbone that trains whole: with the base frozen (and left '
        'out of the optimizer) the key covers only the adapters')
    fix = fix or (
        'paramwise_cfg.layer_decay_rate=1.0 trains every layer at the lr' if layer_wise else
        "to train them at the optimizer's lr, add a longer key (mmengine's constructor "
        'applies the longest key that matches): paramwise_cfg=dict(custom_keys='
        f"{{'{where}.': dict(lr_mult=1.0, decay_mult=1.0)}}); optim_wrapper.constructor="
        "'TrainableParamsOptimWrapperConstructor' names the key")
    return f'{type(backbone).__name__}: ' + '; '.join(found) + f'. Why: {cause}. Fix: {fix}.'
