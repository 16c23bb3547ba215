"""An optimizer over the parameters that train, built without a log line per
frozen parameter, and a stop where a ``paramwise_cfg`` key changes the
adapters' learning rate."""
import logging
from typing import Dict, List, Optional

import torch.nn as nn
from mmengine.logging import MMLogger, print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch.optim import Optimizer

from moppa_mm.models.backbones.adapter_mixin import AdapterMixin
from moppa_mm.models.backbones.training_checks import (AdapterLrError, adapter_groups,
                                                       adapter_lr_message, check_done)

# what mmengine's DefaultOptimWrapperConstructor.add_params logs per frozen one
FROZEN_MESSAGE = 'is skipped since its requires_grad=False'


class _DropFrozenMessages(logging.Filter):

    def filter(self, record: logging.LogRecord) -> bool:
        return FROZEN_MESSAGE not in record.getMessage()


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class TrainableParamsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor (same groups, same lr / weight decay
    rules) over ``requires_grad`` parameters only, with one summary line
    instead of mmengine's warning per frozen parameter (hundreds for a frozen
    Swin-B). Where a ``custom_keys`` entry gives a MoPPA backbone's adapters
    another lr than the optimizer's (``'backbone': dict(lr_mult=0.1)``), it
    stops, naming the key and the longer key that restores the lr (in place
    of the backbone's own first-step check). Set it with
    ``optim_wrapper = dict(constructor='TrainableParamsOptimWrapperConstructor')``.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        module = model.module if hasattr(model, 'module') else model
        for backbone in module.modules():
            if isinstance(backbone, AdapterMixin):
                check_done(backbone)  # checked here, with the keys
        logger = MMLogger.get_current_instance()
        drop = _DropFrozenMessages()
        logger.addFilter(drop)
        try:
            optim_wrapper = super().__call__(model)
        finally:
            logger.removeFilter(drop)
        optimizer = optim_wrapper.optimizer
        for group in optimizer.param_groups:
            group['params'] = [p for p in group['params'] if p.requires_grad]
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g['params']]
        trainable = sum(len(g['params']) for g in optimizer.param_groups)
        frozen = sum(1 for p in module.parameters() if not p.requires_grad)
        print_log(f'optimizer {type(optimizer).__name__}: {trainable} trainable '
                  f'parameter tensors in {len(optimizer.param_groups)} groups; '
                  f'{frozen} frozen ones left out', logger='current')
        self._check_adapter_lrs(module, optimizer)
        return optim_wrapper

    def _key_of(self, name: str, extra: Optional[str] = None) -> Optional[str]:
        """The ``custom_keys`` entry mmengine applies to parameter ``name``
        (``add_params``: the longest key that is a substring, ties in
        alphabetical order), with ``extra`` added to the keys."""
        keys = list(self.paramwise_cfg.get('custom_keys', {})) + ([extra] if extra else [])
        return next((k for k in sorted(sorted(keys), key=len, reverse=True)
                     if k in name), None)

    def _check_adapter_lrs(self, model: nn.Module, optimizer: Optimizer) -> None:
        for prefix, backbone in model.named_modules():
            if not isinstance(backbone, AdapterMixin):
                continue
            held = adapter_groups(backbone, optimizer)
            if not held:
                continue
            names = [f'{prefix}.{name}' if prefix else name for name, _ in held]
            keys = sorted({self._key_of(n) for n in names} - {None})
            message = adapter_lr_message(backbone, optimizer, held,
                                         *self._cause_and_fix(prefix, names, keys))
            if message:
                raise AdapterLrError(message)

    def _cause_and_fix(self, prefix: str, names: List[str], keys: List[str]) -> tuple:
        """What sets the adapters' lr (the keys that cover them) and the config
        line that restores it, verified against mmengine's choice of key."""
        custom_keys: Dict[str, dict] = self.paramwise_cfg.get('custom_keys', {})
        if not keys:  # another rule (bias_lr_mult, ...): the general words
            return None, None
        cause = 'paramwise_cfg ' + ', '.join(
            f'custom_keys[{k!r}] = {dict(custom_keys[k])!r}' for k in keys
        ) + (' covers them (the frozen base is left out of the optimizer); a longer key '
             'restores their lr (mmengine applies the longest key that matches)')
        restore = f'{prefix}.' if prefix else None
        plain = ('lr_mult', 'decay_mult')
        if restore and restore not in custom_keys and all(
                self._key_of(n, restore) == restore or
                all(custom_keys[self._key_of(n, restore)].get(m, 1.0) == 1.0 for m in plain)
                for n in names):
            line = ('optim_wrapper = dict(paramwise_cfg=dict('
                    f"custom_keys={{{restore!r}: dict(lr_mult=1.0, decay_mult=1.0)}}))")
        else:
            line = (f'a key longer than {max(keys, key=len)!r} that covers the adapters, '
                    'with lr_mult=1.0, decay_mult=1.0 (or drop the key)')
        return cause, line
