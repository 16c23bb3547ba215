from .backbones import *  # noqa: F401,F403
from .backbones.adapter_mixin import (AdapterMixin, adapter_state_dict,  # noqa: F401
                                      full_state_dict, merge_adapters)
from .backbones.adapter_record import read_adapter_record  # noqa: F401
from .layers import ConvAdapter, ScaleShift  # noqa: F401
from .moppa_config import MoPPAConfig  # noqa: F401


def compile_blocks(model, **options):
    """Compile each block (ViT layer, Swin block) of the MoPPA backbones in
    ``model`` in place, ``torch.compile(**options)`` by region: inductor fuses
    the adapters' small operations, the rest runs eager (docs/performance.md)."""
    for backbone in [m for m in model.modules() if isinstance(m, AdapterMixin)]:
        stages = getattr(backbone, 'stages', None)
        for block in [b for s in stages for b in s.blocks] if stages else backbone.layers:
            block.compile(**options)
    return model
