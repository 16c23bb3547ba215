"""The benchmark's sections, in the order they run. Each module has ``NAME`` and
``run(device, quick) -> SectionResult``."""
# the MoPPA unit options of every shipped config (the operator's own defaults
# are the paper's): what users train is what is timed
SHIPPED_UNIT_OPTIONS = dict(init_mode='identity', heat_param='softplus')

from benchmarks.sections import (dct, inference, profiles, swin, swin_block,  # noqa: E402
                                 unit, vit)

SECTIONS = {module.NAME: module
            for module in (dct, unit, vit, swin, swin_block, inference, profiles)}
