"""WeightsOnlyCheckpointHook with real mmengine Runners: a scheduler that keeps a
function in its state (OneCycle) saves, loads with ``weights_only=True`` and
resumes its schedule exactly; whatever cannot be stored is left out with one
warning, and the save happens."""
import glob
import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from tests.test_engine.test_rng_state_hook import RandomlyAugmented, RandomlyWeightedRegression


class RecordLR(Hook):
    """The learning rate each training iteration ran with, by iteration."""

    def __init__(self) -> None:
        self.lrs = {}

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.lrs[runner.iter] = runner.optim_wrapper.get_lr()['lr'][0]


class AddToCheckpoint(Hook):
    """Puts what no weights_only loader reads into every checkpoint."""

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint['meta']['callback'] = lambda: None
        checkpoint['extra'] = [1, object()]


def build_runner(work_dir, name, anneal='cos', resume_from=None, extra_hooks=()):
    recorder = RecordLR()
    runner = Runner(
        model=RandomlyWeightedRegression(), work_dir=str(work_dir),
        experiment_name=name,  # unique: Runners in one process share loggers by name
        train_dataloader=dict(dataset=RandomlyAugmented(), batch_size=2,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(type='OneCycleLR', eta_max=0.1, total_steps=8,
                             anneal_strategy=anneal, by_epoch=False),
        train_cfg=dict(by_epoch=False, max_iters=8),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', by_epoch=False,
                                           interval=4)),
        custom_hooks=[dict(type='WeightsOnlyCheckpointHook'), recorder, *extra_hooks],
        randomness=dict(seed=0), load_from=resume_from, resume=resume_from is not None)
    return runner, recorder


def read_log(work_dir) -> str:
    return ''.join(open(path).read() for path in glob.glob(f'{work_dir}/*/*.log'))


def test_one_cycle_checkpoint_loads_safely_and_resumes_the_schedule_exactly(tmp_path):
    import moppa_mm  # noqa: F401  registers the hook
    runner, whole = build_runner(tmp_path / 'whole', 'one cycle whole')
    runner.train()  # saves iter_4.pth and iter_8.pth
    checkpoint_path = str(tmp_path / 'whole/iter_4.pth')
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    state = checkpoint['param_schedulers'][0]
    assert 'anneal_func' not in state and state['last_step'] == 4, sorted(state)
    assert checkpoint['meta']['scheduler_functions'] == {
        'param_schedulers[0].anneal_func':
            'mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler._annealing_cos'}
    assert len(set(whole.lrs.values())) == 8  # warms up, then anneals

    runner, resumed = build_runner(tmp_path / 'resumed', 'one cycle resumed',
                                   resume_from=checkpoint_path)
    runner.train()
    assert sorted(resumed.lrs) == [4, 5, 6, 7]
    assert [resumed.lrs[i] for i in range(4, 8)] == [whole.lrs[i] for i in range(4, 8)]
    assert 'WeightsOnlyCheckpointHook:' not in read_log(tmp_path / 'resumed')

    # the config changed the function: the run uses its own, and says so
    runner, changed = build_runner(tmp_path / 'changed', 'one cycle changed', anneal='linear',
                                   resume_from=checkpoint_path)
    runner.train()
    log = read_log(tmp_path / 'changed')
    assert ("param_schedulers[0].anneal_func: checkpoint mmengine.optim.scheduler."
            "param_scheduler.OneCycleParamScheduler._annealing_cos, this run mmengine."
            "optim.scheduler.param_scheduler.OneCycleParamScheduler._annealing_linear") in log
    assert changed.lrs[5] != whole.lrs[5]


def test_what_cannot_be_stored_is_left_out_with_one_warning(tmp_path):
    import moppa_mm  # noqa: F401  registers the hook
    runner, _ = build_runner(tmp_path, 'left out', extra_hooks=[AddToCheckpoint()])
    runner.train()  # two saves
    for name in ('iter_4.pth', 'iter_8.pth'):
        checkpoint = torch.load(osp.join(tmp_path, name), weights_only=True)
        assert 'callback' not in checkpoint['meta'] and checkpoint['extra'] == [1, None]
        assert checkpoint['meta']['iter'] == int(name[5:-4])
    log = read_log(tmp_path)
    warning = ("left out of the checkpoint, as no weights_only loader can read them: "
               "checkpoint['meta']['callback'] (a builtins.function); "
               "checkpoint['extra'][1] (a builtins.object)")
    assert log.count('left out of the checkpoint') == 1 and warning in log, log[-2000:]


def test_a_resume_from_changed_optimizer_state_is_refused_naming_the_file(tmp_path):
    """Finite, wrong bytes in what a resume restores (the optimizer's momentum
    here) stop the resume before anything is restored; the weights alone load."""
    import pytest

    from moppa_mm.utils.checkpoints import CheckpointLoadError
    runner, _ = build_runner(tmp_path / 'whole', 'digest whole')
    runner.train()
    path = str(tmp_path / 'whole/iter_4.pth')
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint['runner_state_digest']
    momentum = next(iter(checkpoint['optimizer']['state'].values()))['momentum_buffer']
    momentum.view(-1)[0] += 0.5  # a disk or copy error: finite, wrong
    torch.save(checkpoint, path)
    resumed, _ = build_runner(tmp_path / 'resumed', 'digest resumed', resume_from=path)
    with pytest.raises(CheckpointLoadError, match=rf"checkpoint '{path}': its optimizer or "
                       'scheduler state, message hub or meta changed since it was saved'):
        resumed.train()
    assert resumed.iter == 0  # nothing restored
