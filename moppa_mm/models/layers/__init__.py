from .conv_adapter import ConvAdapter
from .scale_shift import ScaleShift

__all__ = ['ConvAdapter', 'ScaleShift']
