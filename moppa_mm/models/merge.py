"""Merging a fine-tuned model's adapters into its weights, for inference."""
import torch.nn as nn

from .backbones.adapter_mixin import AdapterMixin


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold the adapters of every MoPPA backbone in ``model`` into its weights
    (:meth:`AdapterMixin.merge_adapters`), in place, and put ``model`` in eval
    mode; returns ``model``.

    The scale & shift layers vanish into the frozen linear and patch-embedding
    weights (eval then costs what the plain backbone costs, plus the units'
    DCTs and, for Swin, the 3x3 conv adapters, which have nothing to fold
    into); each MoPPA unit's filter and field become constants. Outputs are
    the unmerged model's up to float rounding. One-way: a merged model is for
    inference (it cannot train, and loads only merged checkpoints)::

        model = init_model(config, adapter_checkpoint)  # any loader
        merge_adapters(model)
        torch.save({'state_dict': model.state_dict()}, 'merged.pth')  # whole
    """
    backbones = [m for m in model.modules() if isinstance(m, AdapterMixin)]
    if not backbones:
        raise ValueError(f'{type(model).__name__} holds no MoPPA backbone: nothing to merge')
    for backbone in backbones:
        backbone.merge_adapters()
    return model.eval()


__all__ = ['merge_adapters']
