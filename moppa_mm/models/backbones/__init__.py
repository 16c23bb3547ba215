import importlib.util
import warnings

from .moppa_swin import MoPPASwinTransformer, SwinConvAdapter, SwinMoPPAUnit
from .moppa_swin_cls import MoPPASwinTransformerCls
from .moppa_vit import MoPPAVisionTransformer, ViTMoPPAUnit

__all__ = [
    'MoPPASwinTransformer', 'SwinMoPPAUnit', 'SwinConvAdapter',
    'MoPPASwinTransformerCls', 'MoPPAVisionTransformer', 'ViTMoPPAUnit'
]


def _register_mmseg_backbones() -> None:
    """MMSegmentation's MoPPA backbones, registered where mmsegmentation is
    installed (the ``seg`` extra); without it, nothing. An mmseg that is
    installed but does not import (mmseg.utils needs ftfy, regex and
    prettytable, which it does not declare) gets a warning with the fix."""
    if importlib.util.find_spec('mmseg') is None:
        return
    try:
        from .moppa_swin_seg import MoPPASwinTransformerSeg
        from .moppa_vit_seg import MoPPAVisionTransformerSeg
    except ImportError as error:
        warnings.warn(f'moppa_mm: mmsegmentation is installed but does not import '
                      f'({error}); its MoPPA backbones are not registered. Install '
                      "moppa_mm's seg extra: pip install -e '.[seg]' (mmsegmentation "
                      'with ftfy, regex and prettytable)')
        return
    globals().update(MoPPASwinTransformerSeg=MoPPASwinTransformerSeg,
                     MoPPAVisionTransformerSeg=MoPPAVisionTransformerSeg)
    __all__.extend(['MoPPASwinTransformerSeg', 'MoPPAVisionTransformerSeg'])


_register_mmseg_backbones()
