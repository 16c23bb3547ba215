from .moppa_swin import MoPPASwinTransformer, SwinConvAdapter, SwinMoPPAUnit

__all__ = ["MoPPASwinTransformer", "SwinMoPPAUnit", "SwinConvAdapter"]
