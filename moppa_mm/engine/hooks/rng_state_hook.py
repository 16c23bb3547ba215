"""Makes an interrupted run continue exactly where it stopped."""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _capture() -> dict:
    state = dict(python=random.getstate(), numpy=np.random.get_state(),
                 torch=torch.get_rng_state())
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def _restore(state: dict) -> None:
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


class _RestoreAfterSkip:
    """Wraps an iteration loop's data iterator: lets the ``skip`` batches that
    resuming replays go by, then restores the states before the next fetch."""

    def __init__(self, iterator, skip: int, state: dict, logger) -> None:
        self._iterator = iterator
        self._skip = skip
        self._state = state
        self._logger = logger

    def __iter__(self):
        return self

    def __next__(self):
        if self._state is not None:
            if self._skip > 0:
                self._skip -= 1
            else:
                _restore(self._state)
                self._state = None
                self._logger.info('RNGStateHook: random states restored from '
                                  'the checkpoint')
        return next(self._iterator)

    def __getattr__(self, name):
        return getattr(self._iterator, name)


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Saves the random number generators' states in checkpoints, restores
    them when training resumes, and keeps validation off training's stream.

    mmengine's ``resume`` only re-seeds. Two things make a killed and resumed
    run differ from the uninterrupted one, and this hook removes both:

    * Validation draws random numbers (a new DataLoader iterator draws its base
      seed from the global torch generator; a random test-time transform would
      draw more), and it runs after the checkpoint is written
      (``CheckpointHook`` saves in ``after_train_iter``/``after_train_epoch``,
      the loop validates afterwards). The hook captures the states in
      ``before_val`` and puts them back in ``after_val``, so validation never
      moves training's random stream: the state saved with a checkpoint is the
      state the next training iteration starts from, whether or not a
      validation runs in between (a resumed run skips the one it was killed
      in). A checkpoint written during validation (``save_best``) stores the
      training state captured in ``before_val``.
    * Between writing a checkpoint and the next iteration, the uninterrupted run
      then draws random numbers only when it fetches the next batch. The
      resumed run is put back in the same state at the same point: for
      iteration loops, right after the batches that resuming replays and
      before the next fetch; for epoch loops, at the start of the epoch.

    The resumed run then reproduces the uninterrupted one (with data loaded in
    the main process or by workers seeded from the seed, as mmengine seeds
    them). The saved state, ``checkpoint['meta']['rng_state']``, is a plain
    dict: ``python`` (``random.getstate()``), ``numpy``
    (``np.random.get_state()``), ``torch`` (a uint8 tensor) and, where CUDA is
    available, ``cuda`` (a list of uint8 tensors, one per device).
    """

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._pending: Optional[dict] = None  # loaded, to restore at resume
        self._training_state: Optional[dict] = None  # set while validating

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = self._training_state or _capture()
        checkpoint.setdefault('meta', {})['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if getattr(runner, '_resume', False):
            self._pending = checkpoint.get('meta', {}).get('rng_state')

    def before_val(self, runner) -> None:
        self._training_state = _capture()

    def after_val(self, runner) -> None:
        if self._training_state is not None:
            _restore(self._training_state)
            self._training_state = None

    def before_train_epoch(self, runner) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator'):  # IterBasedTrainLoop
            loop.dataloader_iterator = _RestoreAfterSkip(
                loop.dataloader_iterator, loop.iter, state, runner.logger)
        else:
            _restore(state)
            runner.logger.info('RNGStateHook: random states restored from the '
                               'checkpoint')
