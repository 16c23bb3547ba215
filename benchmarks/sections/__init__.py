"""The benchmark's sections, in the order they run. Each module has ``NAME`` and
``run(device, quick) -> SectionResult``."""
from moppa_mm.models.moppa_config import MoPPAConfig

# the MoPPA unit options of every shipped config (the backbones' defaults; the
# operator's own are the paper's raw heat): what users train is what is timed
SHIPPED_UNIT_OPTIONS = dict(init_mode=MoPPAConfig.init_mode, heat_param=MoPPAConfig.heat_param)

from benchmarks.sections import (amp, dct, functions, inference, profiles,  # noqa: E402
                                 swin, swin_block, unit, vit)

SECTIONS = {module.NAME: module
            for module in (dct, unit, functions, vit, swin, swin_block, inference, profiles, amp)}
