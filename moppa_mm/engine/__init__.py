from .hooks import AdapterCheckpointHook, PEFTFreezeHook, RNGStateHook, RouteRegularizationHook
from .optimizers import TrainableParamsOptimWrapperConstructor

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'RNGStateHook',
           'RouteRegularizationHook', 'TrainableParamsOptimWrapperConstructor']
