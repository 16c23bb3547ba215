"""Adapter-only checkpoints: megabytes instead of the whole frozen backbone."""
from typing import Set

import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


def frozen_state_keys(model: nn.Module) -> Set[str]:
    """State-dict keys that a fine-tuning run does not change: frozen parameters
    and the buffers of modules whose parameters are all frozen (e.g. Swin's
    relative position index, rebuilt by the constructor)."""
    keys = {n for n, p in model.named_parameters() if not p.requires_grad}
    for module_name, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if params and not any(p.requires_grad for p in params):
            prefix = f'{module_name}.' if module_name else ''
            keys.update(prefix + b for b, _ in module.named_buffers(recurse=False))
    return keys


@HOOKS.register_module()
class AdapterCheckpointHook(Hook):
    """Saves only what training changes; rebuilds the rest from the pre-trained
    weights when such a checkpoint is loaded.

    ``before_save_checkpoint`` drops frozen parameters (and buffers of fully
    frozen modules) from ``checkpoint['state_dict']`` and marks the checkpoint
    ``meta['adapter_only'] = True``. ``after_load_checkpoint`` sees that mark and,
    if the model was never initialised (``runner.test()`` and ``runner.val()``
    skip ``init_weights``), runs ``model.init_weights()`` first, which loads the
    pre-trained backbone named by the config's ``init_cfg``. The adapter weights
    are then loaded over it (mmengine loads non-strictly: the frozen keys are
    reported as missing, as expected).

    Args:
        enabled (bool): Strip frozen weights when saving. Loading handles
            adapter-only checkpoints either way. Defaults to True.
    """

    priority = 'LOW'

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    @staticmethod
    def _unwrap(runner) -> nn.Module:
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if not self.enabled:
            return
        frozen = frozen_state_keys(self._unwrap(runner))
        state = checkpoint['state_dict']
        dropped = [k for k in state if k in frozen]
        for key in dropped:
            del state[key]
        assert state, 'AdapterCheckpointHook: nothing trainable left to save'
        checkpoint.setdefault('meta', {})['adapter_only'] = True
        runner.logger.info(f'AdapterCheckpointHook: saving {len(state)} tensors, '
                           f'{len(dropped)} frozen ones left out')

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not checkpoint.get('meta', {}).get('adapter_only', False):
            return
        model = self._unwrap(runner)
        if not getattr(model, '_is_init', False):
            runner.logger.info('AdapterCheckpointHook: adapter-only checkpoint; '
                               'loading the pre-trained weights first')
            model.init_weights()
