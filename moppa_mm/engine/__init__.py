from .hooks import (AdapterCheckpointHook, PEFTFreezeHook, RNGStateHook,
                    RouteRegularizationHook)

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'RNGStateHook',
           'RouteRegularizationHook']
