from .hooks import AdapterCheckpointHook, PEFTFreezeHook, RouteRegularizationHook

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'RouteRegularizationHook']
