"""An optimizer over the parameters that train, built without a log line per
frozen parameter."""
import logging

import torch.nn as nn
from mmengine.logging import MMLogger, print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

# what mmengine's DefaultOptimWrapperConstructor.add_params logs per frozen one
FROZEN_MESSAGE = 'is skipped since its requires_grad=False'


class _DropFrozenMessages(logging.Filter):

    def filter(self, record: logging.LogRecord) -> bool:
        return FROZEN_MESSAGE not in record.getMessage()


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class TrainableParamsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, over ``requires_grad`` parameters only.

    With a ``paramwise_cfg`` mmengine leaves frozen parameters out but logs a
    warning for each (hundreds for a frozen Swin-B); without one it hands every
    parameter, frozen ones included, to the optimizer. This constructor builds
    the same groups (same lr / weight decay rules), drops the frozen parameters
    from them, and logs one summary line instead. Set it in a config with
    ``optim_wrapper = dict(constructor='TrainableParamsOptimWrapperConstructor')``.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
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
        module = model.module if hasattr(model, 'module') else model
        trainable = sum(len(g['params']) for g in optimizer.param_groups)
        frozen = sum(1 for p in module.parameters() if not p.requires_grad)
        print_log(f'optimizer {type(optimizer).__name__}: {trainable} trainable '
                  f'parameter tensors in {len(optimizer.param_groups)} groups; '
                  f'{frozen} frozen ones left out', logger='current')
        return optim_wrapper
