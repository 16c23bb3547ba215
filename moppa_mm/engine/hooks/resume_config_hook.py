"""Say which values a resumed run takes from the checkpoint, not the config.

``--resume`` restores the optimizer's and the parameter schedulers' states
(``lr``, ``weight_decay``, ``T_max``, ``milestones``...) while the run's length
and the batch come from the config: a config changed before resuming trains
on with the old learning rate and schedule without a word. The stored config
(``meta['cfg']``) is read as data (``ast.literal_eval``), never run: a
checkpoint is a user file.
"""
import ast
from typing import Any, Dict, List, Optional, Tuple

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner.checkpoint import find_latest_checkpoint

from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import short_repr

from .atomic_checkpoint_hook import resume_settings

WORLD_SIZE_KEY = 'moppa_world_size'
# a dumped config is tens of kB; a stored text beyond this is not parsed
MAX_STORED_CONFIG_CHARS = 8_000_000
_UNKNOWN = object()


class _DictCallsAsLiterals(ast.NodeTransformer):
    """``dict(a=1)`` (as mmengine's ``Config.pretty_text`` writes a dict) as the
    literal ``{'a': 1}``, for ``ast.literal_eval``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == 'dict' and not node.args
                and all(keyword.arg is not None for keyword in node.keywords)):
            return ast.Dict([ast.Constant(k.arg) for k in node.keywords],
                            [k.value for k in node.keywords])
        return node


def config_values(text: str) -> Dict[str, Any]:
    """The top-level ``name = value`` assignments of a config text whose value
    is a literal (``dict(...)`` calls included); other assignments are left
    out. Nothing of the text runs (mmengine's ``Config.fromstring`` would).

    Raises:
        InputValueError: the text is not Python (the error and its line),
            nested too deeply to parse, or larger than a config
            (``MAX_STORED_CONFIG_CHARS``).
    """
    if len(text) > MAX_STORED_CONFIG_CHARS:
        raise InputValueError(f'it is {len(text):,} characters long, more than the '
                              f'{MAX_STORED_CONFIG_CHARS:,} a config takes')
    try:
        tree = _DictCallsAsLiterals().visit(ast.parse(text))
    except SyntaxError as error:
        raise InputValueError(f'it is not Python ({error.msg}, line {error.lineno})'
                              ) from None
    except (ValueError, RecursionError, MemoryError) as error:
        reason = str(error) if isinstance(error, ValueError) else 'nested too deeply to parse'
        raise InputValueError(f'it cannot be parsed: {reason}') from None
    values = {}
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            try:
                values[statement.targets[0].id] = ast.literal_eval(statement.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                pass  # a value we cannot read without running code
    return values


def _get(cfg: Any, path: str) -> Any:
    for key in path.split('.'):
        if not isinstance(cfg, dict) or key not in cfg:
            return _UNKNOWN
        cfg = cfg[key]
    return cfg


def _plain(value: Any) -> Any:
    """Config objects (ConfigDict, tuples read back as lists) as comparable data."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != '_delete_'}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _differences(key: str, before: Any, after: Any):
    """``(key, checkpoint value, config value)`` for each differing leaf; dicts
    and equally long lists of dicts are compared item by item."""
    if isinstance(before, dict) and isinstance(after, dict):
        for name in sorted(set(before) | set(after), key=str):
            yield from _differences(f'{key}.{name}', before.get(name, '<unset>'),
                                    after.get(name, '<unset>'))
    elif (isinstance(before, list) and isinstance(after, list)
          and len(before) == len(after) and before
          and all(isinstance(item, dict) for item in before + after)):
        for index, (old, new) in enumerate(zip(before, after)):
            yield from _differences(f'{key}[{index}]', old, new)
    elif before != after:
        yield key, before, after


def _scheduler_types(schedulers: Any) -> Optional[List[str]]:
    if schedulers is _UNKNOWN or schedulers is None:
        return None
    if isinstance(schedulers, dict) and 'type' in schedulers:
        schedulers = [schedulers]
    if isinstance(schedulers, dict):  # one list per optimizer
        return [f'{name}: {_scheduler_types(value)}'
                for name, value in sorted(schedulers.items())]
    return [str(s.get('type')) if isinstance(s, dict) else repr(s) for s in schedulers]


# (config key, which side the resumed run uses, why)
CHECKPOINT_WINS = 'the checkpoint\'s (restored with the optimizer state)'
COMPARED: Tuple[Tuple[str, str], ...] = (
    ('optim_wrapper.optimizer.lr', CHECKPOINT_WINS),
    ('optim_wrapper.optimizer.weight_decay', CHECKPOINT_WINS),
    ('optim_wrapper.optimizer.momentum', CHECKPOINT_WINS),
    ('optim_wrapper.optimizer.betas', CHECKPOINT_WINS),
    ('optim_wrapper.optimizer.eps', CHECKPOINT_WINS),
    ('optim_wrapper.paramwise_cfg', 'the checkpoint\'s (the parameter groups\' lr and '
     'weight decay are restored with the optimizer state)'),
    ('param_scheduler', 'the checkpoint\'s (the schedulers\' states are restored: '
     'begin, end, T_max, milestones, factors...)'),
    ('train_cfg.max_epochs', 'the config\'s for the run\'s length; the learning-rate '
     'schedule keeps the checkpoint\'s (its end and T_max)'),
    ('train_cfg.max_iters', 'the config\'s for the run\'s length; the learning-rate '
     'schedule keeps the checkpoint\'s (its end and T_max)'),
    ('train_dataloader.batch_size', 'the config\'s; the learning rate restored from '
     'the checkpoint was set for the old batch size'),
    ('optim_wrapper.accumulative_counts', 'the config\'s; the learning rate restored '
     'from the checkpoint was set for the old effective batch size'),
)


@HOOKS.register_module()
class ResumeConfigCheckHook(Hook):
    """On ``--resume``: warn once, listing each value of the schedule, optimizer,
    batch or process count (recorded in each checkpoint's ``meta``) that differs
    between the checkpoint's config and the running one, with both values and
    which one the run uses; refuse another optimizer type or another list of
    parameter schedulers (their states would load into the wrong objects). A
    stored config that cannot be read, or whose values are no literals, is
    named in a warning: those values are not compared."""

    priority = 'VERY_HIGH'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})[WORLD_SIZE_KEY] = runner.world_size

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        resume, load_from = resume_settings(runner)
        if not resume:
            return
        meta = checkpoint.get('meta') or {}
        text = meta.get('cfg')
        if not isinstance(text, str):
            runner.logger.warning(
                'ResumeConfigCheckHook: the checkpoint stores no config; the values '
                'it restores (optimizer and scheduler states) are not compared with '
                'the config')
            return
        source = (load_from
                  or find_latest_checkpoint(runner.work_dir) or 'the checkpoint')
        try:
            old = config_values(text)
        except InputValueError as error:
            runner.logger.warning(
                f'ResumeConfigCheckHook: --resume from {source}: the config stored in '
                f'the checkpoint (meta[\'cfg\']) cannot be read: {error}. The values it '
                'restores (optimizer and scheduler states: learning rate, schedule) '
                'are not compared with the config')
            return
        new = runner.cfg.to_dict()
        unread = sorted({key.split('.')[0] for key, _ in COMPARED
                         if key.split('.')[0] in new and key.split('.')[0] not in old})
        if unread:
            runner.logger.warning(
                f'ResumeConfigCheckHook: --resume from {source}: the config stored in '
                f'the checkpoint has no literal value of {", ".join(unread)} (an '
                'expression that needs code to evaluate, or no assignment): not compared')

        old_type = _get(old, 'optim_wrapper.optimizer.type')
        new_type = _get(new, 'optim_wrapper.optimizer.type')
        if _UNKNOWN not in (old_type, new_type) and old_type != new_type:
            raise InputValueError(
                f'--resume from {source}: the checkpoint was trained with the '
                f'{old_type} optimizer, the config has {new_type}; its optimizer '
                'state cannot be resumed by another optimizer. Go back to '
                f'optim_wrapper.optimizer.type={old_type!r}, or start from its weights '
                'with load_from (without --resume)')
        old_schedulers = _scheduler_types(_get(old, 'param_scheduler'))
        new_schedulers = _scheduler_types(_get(new, 'param_scheduler'))
        if (old_schedulers is not None and new_schedulers is not None
                and old_schedulers != new_schedulers):
            raise InputValueError(
                f'--resume from {source}: the checkpoint holds the states of the '
                f'parameter schedulers {old_schedulers}, the config has '
                f'{new_schedulers}; mmengine would load them pairwise into the wrong '
                'schedulers. Go back to the checkpoint\'s param_scheduler, or start from '
                'its weights with load_from (without --resume)')

        differences = []
        for key, winner in COMPARED:
            before, after = _get(old, key), _get(new, key)
            if _UNKNOWN in (before, after):
                continue
            for name, value, config_value in _differences(key, _plain(before),
                                                          _plain(after)):
                differences.append(f'  {name}: checkpoint {short_repr(value)}, config '
                                   f'{short_repr(config_value)} -> the run uses {winner}')
        old_world = meta.get(WORLD_SIZE_KEY)
        if old_world is not None and old_world != runner.world_size:
            differences.append(
                f'  world size (processes): checkpoint {old_world}, now '
                f'{runner.world_size} -> the run uses the current one (an effective '
                'batch of another size); the learning rate restored from the '
                'checkpoint was set for the old one')
        if differences:
            runner.logger.warning(
                f'--resume from {source}: the config differs from the one the '
                'checkpoint was trained with in ' + str(len(differences)) +
                ' value(s):\n' + '\n'.join(differences) + '\nTo train with the '
                "config's optimizer and schedule instead, start from the checkpoint's "
                'weights with load_from=<checkpoint> (without --resume).')
