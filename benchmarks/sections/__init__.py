"""The benchmark's sections, in the order they run. Each module has ``NAME`` and
``run(device, quick) -> SectionResult``."""
from benchmarks.sections import dct, profiles, swin, swin_block, unit, vit

SECTIONS = {module.NAME: module for module in (dct, unit, vit, swin, swin_block, profiles)}
