from .adapter_checkpoint_hook import AdapterCheckpointHook
from .atomic_checkpoint_hook import AtomicCheckpointHook
from .non_finite_loss_hook import NonFiniteLossHook
from .peft_freeze_hook import PEFTFreezeHook
from .plain_checkpoint_hook import PlainCheckpointHook
from .resume_config_hook import ResumeConfigCheckHook
from .rng_state_hook import RNGStateHook
from .route_regularization_hook import RouteRegularizationHook
from .work_dir_lock_hook import WorkDirLockHook

__all__ = ['AdapterCheckpointHook', 'AtomicCheckpointHook', 'NonFiniteLossHook',
           'PEFTFreezeHook', 'PlainCheckpointHook', 'ResumeConfigCheckHook',
           'RNGStateHook', 'RouteRegularizationHook', 'WorkDirLockHook']
