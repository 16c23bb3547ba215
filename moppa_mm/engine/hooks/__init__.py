from .atomic_checkpoint_hook import AtomicCheckpointHook
from .non_finite_loss_hook import NonFiniteLossHook
from .peft_freeze_hook import PEFTFreezeHook
from .resume_config_hook import ResumeConfigCheckHook
from .rng_state_hook import RNGStateHook
from .route_weight_logger_hook import RouteWeightLoggerHook
from .weights_only_checkpoint_hook import WeightsOnlyCheckpointHook

__all__ = ['AtomicCheckpointHook', 'NonFiniteLossHook',
           'PEFTFreezeHook', 'ResumeConfigCheckHook', 'RNGStateHook', 'RouteWeightLoggerHook',
           'WeightsOnlyCheckpointHook']
