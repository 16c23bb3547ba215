"""An interrupted run continues exactly where it stopped."""
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_dist_info
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS
from mmengine.runner import find_latest_checkpoint

from .atomic_checkpoint_hook import resume_settings


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
    """Saves every training process's random generator states in checkpoints
    and restores each process's own on resume, so that a killed and resumed
    run reproduces the uninterrupted one (docs/design.md, "Exact resume").

    mmengine's resume only re-seeds. The hook (1) gathers every rank's states
    (``all_gather_object``) where a ``CheckpointHook`` may save (after a
    training epoch, before validation, after an iteration at which a
    ``by_epoch=False`` hook saves; ``Runner.save_checkpoint`` runs on rank 0
    only), its priority ``LOW`` putting it before ``CheckpointHook``; (2)
    puts the states back after each validation, so validation never moves
    training's stream; (3) restores them where the uninterrupted run was: at
    the start of the epoch, or, for iteration loops, after the batches that
    resuming replays. ``checkpoint['meta']['rng_state']`` is one plain dict
    per rank (``python``, ``numpy``, ``torch``, ``cuda``). Workers that persist
    across epochs hold states no checkpoint has: an epoch loop resumed with
    them warns that it is not exact (the shipped configs restart them with
    ``epoch_seeded_worker_init``).

    Args:
        exact_resume (bool): Refuse a resume that cannot be exact (another
            number of processes than the checkpoint has states for, or a rank
            without its state); False: warn and resume from the generators as
            seeded. Defaults to True.
    """

    priority = 'LOW'

    def __init__(self, exact_resume: bool = True) -> None:
        self.exact_resume = exact_resume
        self._pending: Optional[dict] = None  # this rank's, loaded, to restore at resume
        self._training_states: Optional[List[dict]] = None  # set while validating
        # every rank's states and the (iter, epoch) at which they were gathered
        self._gathered: Optional[tuple] = None

    @staticmethod
    def _every_rank() -> List[dict]:
        return all_gather_object(_capture())  # [state of rank 0, rank 1, ...]

    def _gather_for_checkpoint(self, runner) -> None:
        if get_dist_info()[1] > 1:
            self._gathered = (runner.iter, runner.epoch), self._every_rank()

    def _saves_after_this_iter(self, runner) -> bool:
        """Whether a ``by_epoch=False`` ``CheckpointHook`` saves after the
        current training iteration (its own criterion)."""
        return any(
            isinstance(hook, CheckpointHook) and not hook.by_epoch and (
                hook.every_n_train_iters(runner, hook.interval, hook.save_begin)
                or (hook.save_last and hook.is_last_train_iter(runner)))
            for hook in runner.hooks)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self._saves_after_this_iter(runner):
            self._gather_for_checkpoint(runner)

    def after_train_epoch(self, runner) -> None:
        self._gather_for_checkpoint(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        world_size = get_dist_info()[1]
        if self._training_states is not None:
            states = self._training_states
        elif world_size == 1:
            states = [_capture()]
        elif self._gathered is not None and self._gathered[0] == (runner.iter,
                                                                  runner.epoch):
            states = self._gathered[1]
        else:
            runner.logger.warning(
                'RNGStateHook: a checkpoint is saved where the other ranks\' '
                'random states were not gathered (iteration '
                f'{runner.iter}); it holds rank 0\'s only and cannot be '
                'resumed exactly with several processes')
            states = [_capture()] + [None] * (world_size - 1)
        checkpoint.setdefault('meta', {})['rng_state'] = states

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        resume, load_from = resume_settings(runner)
        if not resume:
            return
        states = checkpoint.get('meta', {}).get('rng_state')
        if states is None:
            return
        if isinstance(states, dict):  # written by one process, before per-rank lists
            states = [states]
        rank, world_size = get_dist_info()
        source = (load_from
                  or find_latest_checkpoint(runner.work_dir) or 'the checkpoint')
        problem = remedy = None
        if len(states) != world_size:
            problem = (f'{source} holds the random states of {len(states)} training '
                       f'process(es), this run has {world_size}: an exact resume needs '
                       'the same number of processes.')
            remedy = f'Resume with {len(states)}, or set'
        elif states[rank] is None:
            problem = (f'{source} holds no random state for rank {rank} (saved where '
                       'the hook could not gather it; see the warning in that run\'s '
                       'log).')
            remedy = 'Set'
        if problem is None:
            self._pending = states[rank]
        elif self.exact_resume:
            raise RuntimeError(
                f"RNGStateHook: {problem} {remedy} dict(type='RNGStateHook', "
                'exact_resume=False) in custom_hooks to resume from the generators '
                'as seeded (not bit-identical)')
        else:
            runner.logger.warning(f'RNGStateHook: {problem} With exact_resume=False, '
                                  'it resumes from the generators as seeded: not '
                                  'bit-identical')

    def before_val(self, runner) -> None:
        self._training_states = self._every_rank()

    def after_val(self, runner) -> None:
        if self._training_states is not None:
            _restore(self._training_states[get_dist_info()[0]])
            self._training_states = None

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
            loader = loop.dataloader
            if runner.epoch > 0 and loader.num_workers > 0 and loader.persistent_workers:
                runner.logger.warning(
                    "RNGStateHook: the training data loader's workers are persistent: "
                    'their random states, which no checkpoint holds, restart from the '
                    f'seed at epoch {runner.epoch + 1}, so this resumed run is not '
                    'bit-identical to the uninterrupted one. For an exact resume, set '
                    'train_dataloader.persistent_workers=False and worker_init_fn='
                    "dict(type='epoch_seeded_worker_init'), as the shipped configs do")
