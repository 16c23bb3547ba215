from .adapter_checkpoint_hook import AdapterCheckpointHook
from .peft_freeze_hook import PEFTFreezeHook
from .route_regularization_hook import RouteRegularizationHook

__all__ = ['AdapterCheckpointHook', 'PEFTFreezeHook', 'RouteRegularizationHook']
