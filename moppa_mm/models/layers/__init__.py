from .conv_adapter import ConvAdapter

__all__ = ['ConvAdapter']
