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
    """Saves the random number generators' states in checkpoints and restores
    them when training resumes.

    mmengine's ``resume`` only re-seeds. Between writing a checkpoint and the
    next iteration, the uninterrupted run draws random numbers only when it
    fetches the next batch (a new DataLoader iterator draws its base seed from
    the global torch generator). The resumed run must therefore be put back in
    the same state at the same point: for iteration loops, right after the
    batches that resuming replays and before the next fetch; for epoch loops, at
    the start of the epoch. The states (python, numpy, torch, and CUDA where
    present) are captured when the checkpoint is written, so the resumed run
    reproduces the uninterrupted one (with data loaded in the main process or
    by workers seeded from the seed, as mmengine seeds them).
    """

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['rng_state'] = _capture()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if getattr(runner, '_resume', False):
            self._pending = checkpoint.get('meta', {}).get('rng_state')

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
