from .backbones import *  # noqa: F401,F403
from .backbones.adapter_mixin import adapter_state_dict, full_state_dict, merge_adapters  # noqa
from .backbones.adapter_record import read_adapter_record  # noqa: F401
from .layers import ConvAdapter, ScaleShift  # noqa: F401
from .moppa_config import MoPPAConfig  # noqa: F401
