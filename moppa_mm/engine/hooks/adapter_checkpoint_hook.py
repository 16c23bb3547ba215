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
    """Saves only what training changes.

    ``before_save_checkpoint`` drops frozen parameters (and buffers of fully
    frozen modules) from ``checkpoint['state_dict']`` (and from the averaged
    copy an ``EMAHook`` adds, ``ema_state_dict``, whose keys it swaps with
    ``state_dict``'s on load, so the two must hold the same keys) and marks the checkpoint
    ``meta['adapter_only'] = True``. Loading needs nothing from this hook: the
    MoPPA backbones check every state dict loaded into them and take the frozen
    weights from their pre-trained ``init_cfg`` checkpoint when it lacks them
    (so ``runner.test()``, which skips ``init_weights``, and the inference APIs
    work too). ``after_load_checkpoint`` only tells the backbones which file is
    being loaded, for their error messages.

    Args:
        enabled (bool): Strip frozen weights when saving. Defaults to True.
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
        ema = checkpoint.get('ema_state_dict')  # mmengine's AveragedModel: 'module.<key>'
        if isinstance(ema, dict):
            for key in [k for k in ema if k.startswith('module.') and k[7:] in frozen]:
                del ema[key]
        checkpoint.setdefault('meta', {})['adapter_only'] = True
        runner.logger.info(f'AdapterCheckpointHook: saving {len(state)} tensors, '
                           f'{len(dropped)} frozen ones left out')

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        source = getattr(runner, '_load_from', None)
        for module in self._unwrap(runner).modules():
            if hasattr(module, '_checkpoint_source'):
                module._checkpoint_source = source
