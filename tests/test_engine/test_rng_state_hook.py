"""RNGStateHook with real torch.distributed (gloo, 2 processes) and mmengine
Runners: an interrupted and resumed run ends bit-identical to the
uninterrupted one only if every rank gets its own random states back."""
import os
import os.path as osp

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
from cpu_distributed import CPUDistributedDataParallel  # noqa: F401 (tools/; registers it)
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

from tests.test_tools.resume import tensors

WORLD_SIZE = 2


class RandomlyAugmented(Dataset):
    """Fixed samples through a random transform that draws a sample-dependent
    number of numbers (like a pipeline of random flips and crops): the ranks,
    which see different samples, leave their generators in different states."""

    def __init__(self, size: int = 16) -> None:
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(size, 4, generator=generator)  # (N, 4)
        self.targets = torch.randn(size, 1, generator=generator)  # (N, 1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> dict:
        inputs = self.inputs[index]
        if np.random.rand() < 0.5:  # random flip
            inputs = inputs.flip(0)
        jitter = np.random.randn(1 + index % 3).sum()  # sample-dependent draws
        return dict(inputs=inputs + 0.1 * float(jitter), targets=self.targets[index])


class RandomlyWeightedRegression(BaseModel):
    """A linear regression whose loss weighs the samples with random numbers
    drawn from the global torch generator, a data-dependent count of them (as
    mmdet's RandomSampler draws ``randperm`` over the proposals it got)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        with torch.no_grad():  # the same start in every run, whatever the global state
            generator = torch.Generator().manual_seed(1)
            self.linear.weight.copy_(torch.randn(1, 4, generator=generator))
            self.linear.bias.zero_()

    def forward(self, inputs, targets, mode='tensor'):
        predictions = self.linear(inputs)  # (B, 1)
        if mode == 'predict':
            return [dict(error=(predictions - targets).abs().mean())]
        draws = len(inputs) + int(targets.abs().sum() * 10) % 5
        weights = torch.rand(draws)[:len(inputs), None]  # (B, 1)
        return dict(loss=(weights * (predictions - targets) ** 2).mean())


class MeanError(BaseMetric):
    default_prefix = 'toy'

    def process(self, data_batch, data_samples) -> None:
        self.results += [float(sample['error']) for sample in data_samples]

    def compute_metrics(self, results) -> dict:
        return dict(error=sum(results) / len(results))


class Interrupt(Exception):
    pass


class InterruptHook(Hook):
    """Stops training before iteration ``before_iter`` (0-based, over the run)."""

    def __init__(self, before_iter: int) -> None:
        self.before_iter = before_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == self.before_iter:
            raise Interrupt


SCHEDULES = {
    # the shipped ones: checkpoint and validation after every epoch
    'epochs': dict(train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
                   checkpoint=dict(interval=1), interrupt_before=6,
                   last='epoch_3.pth'),
    'iterations': dict(train_cfg=dict(by_epoch=False, max_iters=12, val_interval=4),
                       checkpoint=dict(by_epoch=False, interval=4),
                       interrupt_before=6, last='iter_12.pth'),
}


def build_runner(work_dir, schedule, name, distributed=True, resume=False,
                 extra_hooks=(), num_workers=0, persistent_workers=False,
                 worker_init_fn=None, exact_resume=True):
    loader = dict(dataset=RandomlyAugmented(), batch_size=2,
                  num_workers=num_workers, persistent_workers=persistent_workers,
                  sampler=dict(type='DefaultSampler', shuffle=True),
                  collate_fn=dict(type='default_collate'))
    if worker_init_fn is not None:
        loader['worker_init_fn'] = dict(type=worker_init_fn)
    return Runner(
        model=RandomlyWeightedRegression(), work_dir=str(work_dir),
        experiment_name=name,  # unique: Runners in one process share loggers by name
        train_dataloader=loader, val_dataloader=loader,
        val_evaluator=Evaluator(MeanError()), val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        train_cfg=schedule['train_cfg'],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook',
                                           **schedule['checkpoint'])),
        custom_hooks=[dict(type='RNGStateHook', exact_resume=exact_resume),
                      dict(type='WeightsOnlyCheckpointHook'),
                      *extra_hooks],
        launcher='pytorch' if distributed else 'none',
        cfg=dict(model_wrapper_cfg=dict(type='CPUDistributedDataParallel')),
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
        randomness=dict(seed=0), resume=resume)


def _train_on_rank(rank, init_file, work_dir, schedule_name):
    """One rank: an uninterrupted run, an interrupted one, its resumption."""
    schedule = SCHEDULES[schedule_name]
    os.environ['LOCAL_RANK'] = str(rank)
    torch.set_num_threads(1)
    torch_dist.init_process_group('gloo', init_method=f'file://{init_file}',
                                  rank=rank, world_size=WORLD_SIZE)
    try:
        build_runner(osp.join(work_dir, 'uninterrupted'), schedule, 'whole').train()
        interrupted = build_runner(
            osp.join(work_dir, 'resumed'), schedule, 'interrupted',
            extra_hooks=[InterruptHook(schedule['interrupt_before'])])
        with pytest.raises(Interrupt):
            interrupted.train()
        build_runner(osp.join(work_dir, 'resumed'), schedule, 'resumed',
                     resume=True).train()
    finally:
        torch_dist.destroy_process_group()


@pytest.fixture(scope='module', params=sorted(SCHEDULES))
def two_process_runs(request, tmp_path_factory):
    import torch.multiprocessing as mp
    work_dir = tmp_path_factory.mktemp(request.param)
    mp.start_processes(_train_on_rank,
                       args=(str(work_dir / 'init'), str(work_dir), request.param),
                       nprocs=WORLD_SIZE, start_method='fork')  # no re-import
    return work_dir, SCHEDULES[request.param]


def test_interrupted_two_process_run_resumes_bit_identical(two_process_runs):
    """Interrupted in the middle of the second epoch / after the checkpoint
    at iteration 4, resumed: parameters, optimizer state and every rank's
    random states equal the uninterrupted run's, bit for bit."""
    work_dir, schedule = two_process_runs
    resumed = torch.load(work_dir / 'resumed' / schedule['last'], weights_only=True)
    whole = torch.load(work_dir / 'uninterrupted' / schedule['last'], weights_only=True)
    for part in ('state_dict', 'optimizer'):
        got, want = dict(tensors(resumed[part])), dict(tensors(whole[part]))
        assert got.keys() == want.keys() and want, part
        differ = [key for key in want if not torch.equal(got[key], want[key])]
        assert not differ, f'{part}: {differ} differ'
    assert len(whole['meta']['rng_state']) == WORLD_SIZE
    for got, want in zip(resumed['meta']['rng_state'], whole['meta']['rng_state']):
        assert torch.equal(got['torch'], want['torch'])
    rank_0, rank_1 = whole['meta']['rng_state']
    assert not torch.equal(rank_0['torch'], rank_1['torch'])  # what the test needs


def test_resume_with_another_number_of_processes_is_refused(two_process_runs):
    work_dir, schedule = two_process_runs
    runner = build_runner(work_dir / 'resumed', schedule, 'one process',
                          distributed=False, resume=True)
    with pytest.raises(RuntimeError, match=rf'{schedule["last"]} holds the random '
                                           r'states of 2 training process.*'
                                           r'this run has 1.*'
                                           r"dict\(type='RNGStateHook', exact_resume=False\)"):
        runner.train()
    # what the error suggests: the resume goes on from the seeded generators, said
    runner = build_runner(work_dir / 'resumed', schedule, 'one process anyway',
                          distributed=False, resume=True, exact_resume=False)
    runner.load_or_resume()  # (train() would also run the remaining epochs)
    assert runner.iter > 0


def run_interrupted_in_epoch_2(work_dir, **options):
    """One process: an uninterrupted epoch run, one interrupted in its second
    epoch (8 iterations per epoch), its resumption. Returns the last
    checkpoints of the resumed and the uninterrupted run and the resumed run's
    log."""
    schedule = SCHEDULES['epochs']
    build_runner(work_dir / 'uninterrupted', schedule, 'whole', **options).train()
    with pytest.raises(Interrupt):
        build_runner(work_dir / 'resumed', schedule, 'interrupted', **options,
                     extra_hooks=[InterruptHook(before_iter=10)]).train()
    resumed = build_runner(work_dir / 'resumed', schedule, 'resumed', resume=True,
                           **options)
    resumed.train()
    with open(resumed.logger.log_file) as log_file:
        log = log_file.read()
    got, want = (torch.load(work_dir / run / schedule['last'], weights_only=True)
                 for run in ('resumed', 'uninterrupted'))
    return got, want, log


def test_epoch_resume_with_persistent_workers_warns_it_is_not_exact(tmp_path):
    """Persistent workers keep their random states across epochs in their own
    processes: a resumed epoch loop restarts them from the seed."""
    got, want, log = run_interrupted_in_epoch_2(
        tmp_path, distributed=False, num_workers=1, persistent_workers=True)
    assert 'workers are persistent' in log and 'not bit-identical' in log
    assert not torch.equal(got['state_dict']['linear.weight'],
                           want['state_dict']['linear.weight'])  # as warned


def test_epoch_resume_with_epoch_seeded_workers_is_exact(tmp_path):
    """The shipped configs' training loaders: workers restarted every epoch,
    seeded by ``epoch_seeded_worker_init`` from the main process's generator,
    which the checkpoint holds: the resumed run draws the uninterrupted
    run's augmentations and ends bit-identical, without a warning."""
    got, want, log = run_interrupted_in_epoch_2(
        tmp_path, distributed=False, num_workers=2, persistent_workers=False,
        worker_init_fn='epoch_seeded_worker_init')
    assert 'workers are persistent' not in log
    for part in ('state_dict', 'optimizer'):
        got_part, want_part = dict(tensors(got[part])), dict(tensors(want[part]))
        assert got_part.keys() == want_part.keys() and want_part, part
        differ = [key for key in want_part
                  if not torch.equal(got_part[key], want_part[key])]
        assert not differ, f'{part}: {differ} differ'
