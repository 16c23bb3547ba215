"""Runner checkpoints that load with torch's ``weights_only=True``: the types
mmengine's Runner puts in them, allow-listed with torch."""
import copyreg

import numpy as np
import torch


def _reduce_history_buffer(buffer) -> tuple:
    """``HistoryBuffer`` as its constructor call: its own ``__getstate__``
    adds the class's statistics functions, which pickle as ``getattr`` calls
    that no safe loader may allow; they are registered at import anyway."""
    return type(buffer), (buffer._log_history, buffer._count_history, buffer.max_length)


def allow_runner_checkpoints() -> None:
    """Checkpoints written by any mmengine Runner (with or without our hooks)
    load with ``torch.load(weights_only=True)``, as mmdet's and mmpretrain's own
    tools load them under torch >= 2.6: what they hold besides tensors and
    plain containers (the message hub's ``HistoryBuffer``, the numpy arrays,
    scalars and dtypes of logged values and random states) is allow-listed
    (torch's ``add_safe_globals``), and ``HistoryBuffer`` pickles as its
    constructor call (a ``copyreg`` registration, read by any loader)."""
    from mmengine.logging import HistoryBuffer
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals(
        [HistoryBuffer, multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype]
        + [getattr(np.dtypes, name) for name in dir(np.dtypes)
           if name.endswith('DType') and isinstance(getattr(np.dtypes, name), type)])
