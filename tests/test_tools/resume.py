"""Kill-and-resume for the tool tests: a training process SIGKILLs itself at an
exact iteration (no race against a watcher, however slow the machine), is
resumed with ``tools/train.py --resume``, and its final checkpoint is compared
tensor by tensor with an uninterrupted run's.

The training subprocess imports this module (``custom_imports``) to register
:class:`SIGKILLHook`.
"""
import os
import os.path as osp
import signal
import socket
import subprocess

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from tests.conftest import PYTHON, REPO, child_env, dump_cfg


@HOOKS.register_module()
class SIGKILLHook(Hook):
    """Kills its own process with SIGKILL before training iteration
    ``before_iter`` (0-based, counted over the whole run), or with
    ``in_validation`` in the middle of the validation that follows
    ``before_iter`` iterations: nothing after it runs, no checkpoint, no
    cleanup, exactly as a kill from outside."""

    def __init__(self, before_iter: int, in_validation: bool = False) -> None:
        self.before_iter = before_iter
        self.in_validation = in_validation

    def _kill(self, runner, in_validation: bool) -> None:
        if runner.iter == self.before_iter and in_validation == self.in_validation:
            os.kill(os.getpid(), signal.SIGKILL)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._kill(runner, in_validation=False)

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._kill(runner, in_validation=True)


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def train(config, work_dir, *extra, processes=1, timeout=600):
    """``tools/train.py``, or ``tools/dist_train.sh`` (torchrun, gloo on the
    CPU) with ``processes`` > 1."""
    env = child_env()
    if processes == 1:
        command = [PYTHON, 'tools/train.py', config]
    else:
        command = ['bash', 'tools/dist_train.sh', config, str(processes)]
        env.update(PYTHON=PYTHON, PORT=str(_free_port()))
    return subprocess.run(
        [*command, '--work-dir', str(work_dir), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def kill_then_resume(config, work_dir, before_iter, in_validation=False, processes=1):
    """Train ``config`` in ``work_dir``, SIGKILLed where :class:`SIGKILLHook`
    says (every process, at the same iteration), then resume it with the
    unchanged config; returns the resumed run's log."""
    os.makedirs(work_dir, exist_ok=True)
    cfg = Config.fromfile(config)
    imports = list(cfg.get('custom_imports', {}).get('imports', []))
    cfg.custom_imports = dict(imports=imports + [__name__], allow_failed_imports=False)
    cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
        dict(type='SIGKILLHook', before_iter=before_iter,
             in_validation=in_validation)]
    killed = train(dump_cfg(cfg, osp.join(work_dir, 'killed.py')), work_dir,
                   processes=processes)
    # torchrun exits with 1 when a process it started dies
    assert killed.returncode == (-signal.SIGKILL if processes == 1 else 1), \
        killed.stderr[-3000:]
    resumed = train(config, work_dir, '--resume', processes=processes)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed.stdout + resumed.stderr


def tensors(obj, path=''):
    """Every tensor inside nested dicts / lists, by path."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors(value, f'{path}/{key}')
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f'{path}/{i}')


def assert_same_checkpoints(path, reference_path):
    """Parameters, optimizer state and the saved random states: bit-identical."""
    got = torch.load(path, weights_only=False)
    want = torch.load(reference_path, weights_only=False)
    assert got['meta']['iter'] == want['meta']['iter']
    for part in ('state_dict', 'optimizer'):
        got_tensors, want_tensors = dict(tensors(got[part])), dict(tensors(want[part]))
        assert got_tensors.keys() == want_tensors.keys() and want_tensors, part
        differ = [key for key, value in want_tensors.items()
                  if not torch.equal(got_tensors[key], value)]
        assert not differ, f'{len(differ)} of {len(want_tensors)} {part} tensors ' \
                           f'differ, first: {differ[:5]}'
    got_states, want_states = got['meta']['rng_state'], want['meta']['rng_state']
    assert len(got_states) == len(want_states)  # one per training process
    for got_state, want_state in zip(got_states, want_states):
        assert torch.equal(got_state['torch'], want_state['torch'])
