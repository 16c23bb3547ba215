import importlib.util
import warnings

from .moppa_swin import MoPPASwinTransformer, SwinConvAdapter, SwinMoPPAUnit
from .moppa_swin_cls import MoPPASwinTransformerCls
from .moppa_vit import MoPPAVisionTransformer, ViTMoPPAUnit

__all__ = [
    'MoPPASwinTransformer', 'SwinMoPPAUnit', 'SwinConvAdapter',
    'MoPPASwinTransformerCls', 'MoPPAVisionTransformer', 'ViTMoPPAUnit'
]

# MMSegmentation's MoPPA backbones, where it is installed; one that does not import
# (mmseg.utils needs ftfy, regex and prettytable, undeclared) gets the fix.
if importlib.util.find_spec('mmseg') is not None:
    try:
        from .moppa_swin_seg import MoPPASwinTransformerSeg  # noqa: F401
        from .moppa_vit_seg import MoPPAVisionTransformerSeg  # noqa: F401
        __all__ += ['MoPPASwinTransformerSeg', 'MoPPAVisionTransformerSeg']
    except ImportError as error:
        warnings.warn(f'moppa_mm: mmsegmentation is installed but does not import '
                      f'({error}); its MoPPA backbones are not registered. Install '
                      "moppa_mm's seg extra: pip install -e '.[seg]' (mmsegmentation "
                      'with ftfy, regex and prettytable)')
