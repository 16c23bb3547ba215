"""``AdapterCheckpointHook``: kept for one release, for configs that name it."""
import warnings

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class AdapterCheckpointHook(Hook):
    """Deprecated: does nothing, and goes in the next release. A model that
    holds a MoPPA backbone saves adapter-only by itself, under every tool,
    where the backbone's config names its pre-trained base
    (``moppa_mm.models.adapter_state_dict`` gives that state for any model):
    remove the hook from ``custom_hooks``.

    Args:
        enabled (bool): Ignored.
    """

    def __init__(self, enabled: bool = True) -> None:
        warnings.warn('AdapterCheckpointHook is deprecated and does nothing: a model with a '
                      'MoPPA backbone saves adapter-only by itself. Remove it from '
                      'custom_hooks; it goes in the next release.', FutureWarning)
