"""Checkpoints that load with ``torch.load(weights_only=True)``, and whose
runner state a resume checks before it restores it."""
from typing import Dict, Iterator, Tuple

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import find_latest_checkpoint

from moppa_mm.utils.checkpoints import CheckpointLoadError
from moppa_mm.utils.runner_state import (RUNNER_STATE_DIGEST, from_plain, runner_state_digest,
                                         to_plain)

from .atomic_checkpoint_hook import resume_settings

# where the names of the functions left out of the schedulers' states go
SCHEDULER_FUNCTIONS = 'scheduler_functions'


def _function_name(function) -> str:
    return (f'{getattr(function, "__module__", "?")}.'
            f'{getattr(function, "__qualname__", type(function).__qualname__)}')


def _scheduler_states(schedulers, where: str = 'param_schedulers') -> Iterator[Tuple[str, object]]:
    """``(where, item)`` for each scheduler of a Runner's ``param_schedulers``
    or of a checkpoint's: a list, or a dict of lists (one per optimizer)."""
    if isinstance(schedulers, dict):
        for name, group in schedulers.items():
            yield from _scheduler_states(group, f'{where}[{name!r}]')
    elif isinstance(schedulers, (list, tuple)):
        for i, item in enumerate(schedulers):
            yield f'{where}[{i}]', item


@HOOKS.register_module()
class WeightsOnlyCheckpointHook(Hook):
    """Writes every checkpoint as tensors and plain containers only, and reads
    such checkpoints back, so that no loader needs ``weights_only=False``.

    The Runner puts mmengine ``HistoryBuffer`` objects (message hub) and numpy
    arrays and scalars (random states, logged values) into its checkpoints.
    ``before_save_checkpoint`` turns everything besides ``state_dict`` into
    tagged plain containers (:func:`~moppa_mm.utils.runner_state.to_plain`);
    ``after_load_checkpoint`` decodes them before the Runner reads
    ``message_hub`` and ``meta``. The priority is the lowest, so the hook saves
    after every other hook has added its state and loads after them: hooks
    that run before it on load see the encoded form, and a reference they keep
    to a dict or list of the checkpoint sees it decoded in place
    (:func:`~moppa_mm.utils.runner_state.from_plain` is also safe to call on
    already decoded values).

    A parameter scheduler's state holds every attribute of the scheduler;
    some are functions (``OneCycleParamScheduler.anneal_func``), which no
    ``weights_only`` loader reads. They are left out of the state, their names
    kept in ``meta['scheduler_functions']``: on resume the Runner loads the
    state into the schedulers it built from the config, which keep their own
    functions, so the schedule continues exactly; the hook warns if such a
    function's name differs from the checkpoint's (the config changed it).
    Anything else that cannot be stored is left out too (a dict drops the
    entry, a list holds ``None``), with one warning naming each place: the
    checkpoint is written whatever it holds.

    The plain form is digested (:func:`~moppa_mm.utils.runner_state.runner_state_digest`,
    ``checkpoint['runner_state_digest']``): a checkpoint whose optimizer or
    scheduler state, message hub or ``meta`` changed since the save (a disk or
    copy error: finite, wrong values) is refused when loaded, before the
    Runner restores any of it, naming the file.
    """

    priority = 'LOWEST'

    def __init__(self) -> None:
        self._warned = set()  # what was left out, already named in a warning

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        functions = self._take_scheduler_functions(checkpoint)
        if functions:
            checkpoint.setdefault('meta', {})[SCHEDULER_FUNCTIONS] = functions
        left_out = []
        rest = {key: checkpoint.pop(key) for key in list(checkpoint) if key != 'state_dict'}
        checkpoint.update(to_plain(rest, 'checkpoint', left_out))
        checkpoint[RUNNER_STATE_DIGEST] = runner_state_digest(checkpoint)
        new = [item for item in left_out if item not in self._warned]
        if new:
            self._warned.update(new)
            runner.logger.warning(
                'WeightsOnlyCheckpointHook: left out of the checkpoint, as no '
                'weights_only loader can read them: ' + '; '.join(
                    f'{where} (a {kind})' for where, kind in new))

    @staticmethod
    def _take_scheduler_functions(checkpoint: dict) -> Dict[str, str]:
        """Remove the functions from the schedulers' states (fresh dicts of
        ``Runner.save_checkpoint``); returns their names by place."""
        functions = {}
        for where, state in _scheduler_states(checkpoint.get('param_schedulers')):
            if not isinstance(state, dict):
                continue
            for attr in [a for a, value in state.items() if callable(value)]:
                functions[f'{where}.{attr}'] = _function_name(state.pop(attr))
        return functions

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        stored = checkpoint.get(RUNNER_STATE_DIGEST)
        if stored is not None and stored != runner_state_digest(checkpoint):
            source = (resume_settings(runner)[1] or find_latest_checkpoint(runner.work_dir)
                      or 'the checkpoint loaded')
            raise CheckpointLoadError(
                f'checkpoint {source!r}: its optimizer or scheduler state, message hub '
                'or meta changed since it was saved (they do not match its '
                f'{RUNNER_STATE_DIGEST}): the file is damaged. Take another copy of it, '
                'or an earlier checkpoint.')
        for key in list(checkpoint):
            if key != 'state_dict':
                checkpoint[key] = from_plain(checkpoint[key])
        saved = checkpoint.get('meta', {}).get(SCHEDULER_FUNCTIONS) or {}
        if not saved or not resume_settings(runner)[0]:
            return
        live = {f'{where}.{attr}': _function_name(value)
                for where, scheduler in _scheduler_states(runner.param_schedulers)
                for attr, value in getattr(scheduler, '__dict__', {}).items()
                if callable(value)}
        changed = [f'{where}: checkpoint {name}, this run {live.get(where, "none")}'
                   for where, name in saved.items() if live.get(where) != name]
        if changed:
            runner.logger.warning(
                'WeightsOnlyCheckpointHook: the resumed schedulers keep the functions '
                'built from this run\'s config, which differ from the '
                'checkpoint\'s: ' + '; '.join(changed))
