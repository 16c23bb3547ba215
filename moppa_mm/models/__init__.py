from .backbones import *  # noqa: F401,F403
from .backbones.adapter_mixin import full_state, read_adapter_record  # noqa: F401
from .layers import ConvAdapter, ScaleShift  # noqa: F401
from .moppa_config import MoPPAConfig  # noqa: F401
from .merge import merge_adapters  # noqa: F401
