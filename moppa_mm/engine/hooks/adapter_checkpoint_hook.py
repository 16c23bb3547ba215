"""Adapter-only checkpoints: megabytes instead of the whole frozen backbone."""
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from moppa_mm.utils.params import frozen_state_keys


@HOOKS.register_module()
class AdapterCheckpointHook(Hook):
    """Saves only what training changes.

    ``before_save_checkpoint`` drops frozen parameters (and buffers of fully
    frozen modules) from ``checkpoint['state_dict']`` (and from the averaged
    copy an ``EMAHook`` adds, ``ema_state_dict``, whose keys it swaps with
    ``state_dict``'s on load, so the two must hold the same keys) and marks the checkpoint
    ``meta['adapter_only'] = True``. Loading needs nothing from this hook: the
    MoPPA backbones load their pre-trained ``init_cfg`` checkpoint when they are
    built and check every state dict loaded into them (so ``runner.test()``,
    which skips ``init_weights``, and the inference APIs work too). A MoPPA
    backbone saves adapter-only by itself; this hook is for the frozen parts
    of other models.

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
        frozen = set(frozen_state_keys(self._unwrap(runner)))
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
