"""What the package's models, hooks and converters share, public for scripts
of your own: checkpoint loading with ``weights_only=True``
(:mod:`~moppa_mm.utils.checkpoints`), :class:`MoPPAInputError`, the marker of
our verdicts on a user's input (:mod:`~moppa_mm.utils.errors`), parameter
patterns and tables (:mod:`~moppa_mm.utils.params`), and
:func:`keep_freed_memory` for CPU runs (:mod:`~moppa_mm.utils.malloc`).
Importing it imports nothing heavier than torch and numpy."""
from .checkpoints import CheckpointLoadError, load_checkpoint_file
from .errors import MoPPAInputError
from .malloc import keep_freed_memory
from .params import matches, parameter_table, set_trainable

__all__ = [
    'CheckpointLoadError', 'load_checkpoint_file',
    'MoPPAInputError', 'keep_freed_memory', 'matches', 'parameter_table', 'set_trainable'
]
