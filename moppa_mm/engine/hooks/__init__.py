from .adapter_checkpoint_hook import AdapterCheckpointHook
from .peft_freeze_hook import PEFTFreezeHook
from .plain_checkpoint_hook import PlainCheckpointHook
from .rng_state_hook import RNGStateHook
from .route_regularization_hook import RouteRegularizationHook

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'PlainCheckpointHook',
           'RNGStateHook', 'RouteRegularizationHook']
