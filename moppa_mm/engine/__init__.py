from .hooks import (AtomicCheckpointHook, NonFiniteLossHook,
                    PEFTFreezeHook, ResumeConfigCheckHook, RNGStateHook, RouteWeightLoggerHook,
                    WeightsOnlyCheckpointHook)
from .optimizers import TrainableParamsOptimWrapperConstructor
from .work_dir_lock import WorkDirLockRunner

__all__ = ['AtomicCheckpointHook', 'NonFiniteLossHook',
           'PEFTFreezeHook', 'ResumeConfigCheckHook', 'RNGStateHook', 'RouteWeightLoggerHook',
           'WeightsOnlyCheckpointHook', 'TrainableParamsOptimWrapperConstructor',
           'WorkDirLockRunner']
