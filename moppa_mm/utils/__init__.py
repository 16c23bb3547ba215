"""What the package's models, hooks and converters share, public for scripts
of your own:

- :mod:`~moppa_mm.utils.checkpoints`: loading checkpoints with
  ``weights_only=True`` (errors that name the file; NaN / infinite values
  refused) and writing ones that load so;
- :mod:`~moppa_mm.utils.errors`: :class:`MoPPAInputError`, the marker of our
  verdicts on a user's input (the tools print them as one line);
- :mod:`~moppa_mm.utils.params`: parameter name patterns, freezing, and the
  total / trainable table per component;
- :mod:`~moppa_mm.utils.malloc`: :func:`keep_freed_memory`, glibc settings that
  spare CPU training steps from faulting their freed memory back in
  (``tools/train.py`` applies it on CPU).

Importing this package imports nothing heavier than torch and numpy.
"""
from .checkpoints import CheckpointLoadError, load_checkpoint_file
from .errors import MoPPAInputError
from .malloc import keep_freed_memory
from .params import matches, parameter_table, set_trainable

__all__ = [
    'CheckpointLoadError', 'load_checkpoint_file',
    'MoPPAInputError', 'keep_freed_memory', 'matches', 'parameter_table', 'set_trainable'
]
