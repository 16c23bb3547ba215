from .moppa_swin import MoPPASwinTransformer, SwinConvAdapter, SwinMoPPAUnit
from .moppa_swin_cls import MoPPASwinTransformerCls
from .moppa_vit import MoPPAVisionTransformer, ViTMoPPAUnit

__all__ = [
    'MoPPASwinTransformer', 'SwinMoPPAUnit', 'SwinConvAdapter',
    'MoPPASwinTransformerCls', 'MoPPAVisionTransformer', 'ViTMoPPAUnit'
]
