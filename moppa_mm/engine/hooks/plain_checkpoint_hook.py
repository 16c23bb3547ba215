"""Checkpoints that load with ``torch.load(weights_only=True)``."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from moppa_mm.utils.checkpoints import from_plain, to_plain


@HOOKS.register_module()
class PlainCheckpointHook(Hook):
    """Writes every checkpoint as tensors and plain containers only, and reads
    such checkpoints back, so that no loader needs ``weights_only=False``.

    The Runner puts mmengine ``HistoryBuffer`` objects (message hub) and numpy
    arrays and scalars (random states, logged values) into its checkpoints.
    ``before_save_checkpoint`` turns everything besides ``state_dict`` into
    tagged plain containers (:func:`~moppa_mm.utils.checkpoints.to_plain`);
    ``after_load_checkpoint`` decodes them before the Runner reads
    ``message_hub`` and ``meta``. The priority is the lowest, so the hook saves
    after every other hook has added its state and loads after them: hooks
    that run before it on load see the encoded form, and a reference they keep
    to a dict or list of the checkpoint sees it decoded in place
    (:func:`~moppa_mm.utils.checkpoints.from_plain` is also safe to call on
    already decoded values).
    """

    priority = 'LOWEST'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key in list(checkpoint):
            if key != 'state_dict':
                checkpoint[key] = to_plain(checkpoint[key], f'checkpoint[{key!r}]')

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        for key in list(checkpoint):
            if key != 'state_dict':
                checkpoint[key] = from_plain(checkpoint[key])
