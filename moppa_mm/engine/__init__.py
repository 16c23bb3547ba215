from .hooks import AdapterCheckpointHook, PEFTFreezeHook, RNGStateHook, RouteRegularizationHook
from .optimizers import TrainableParamsOptimWrapperConstructor
from .work_dir_lock_runner import WorkDirLockRunner

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'RNGStateHook',
           'RouteRegularizationHook', 'TrainableParamsOptimWrapperConstructor',
           'WorkDirLockRunner']
