"""AtomicCheckpointHook with a real mmengine Runner: a new best checkpoint
whose write fails half-way leaves the previous best in place (mmengine's
CheckpointHook deletes it first). Kills while writing interval checkpoints and
last_checkpoint, through the tools: tests/test_tools/test_durability.py."""
import os

import pytest
import torch
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.hooks import Hook
from mmengine.runner import Runner

from tests.test_engine.test_rng_state_hook import RandomlyAugmented, RandomlyWeightedRegression


class ValidationCount(BaseMetric):
    """A score that improves at every validation."""
    default_prefix = 'toy'
    calls = 0

    def process(self, data_batch, data_samples) -> None:
        self.results.append(0)

    def compute_metrics(self, results) -> dict:
        ValidationCount.calls += 1
        return dict(count=ValidationCount.calls)


class FailTheSecondBest(Hook):
    """Puts what torch cannot pickle into the checkpoint saved after the second
    validation (the new best): its write fails half-way, as a full disk would."""

    def __init__(self) -> None:
        self.validations = 0

    def before_val_epoch(self, runner) -> None:
        self.validations += 1

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.validations == 2:
            checkpoint['meta']['unpicklable'] = lambda: None


def test_a_failed_best_save_keeps_the_previous_best(tmp_path):
    ValidationCount.calls = 0
    loader = dict(dataset=RandomlyAugmented(4), batch_size=2,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'))
    runner = Runner(
        model=RandomlyWeightedRegression(), work_dir=str(tmp_path),
        experiment_name=f'best_{tmp_path.name}', train_dataloader=loader,
        val_dataloader=loader, val_cfg=dict(), val_evaluator=Evaluator(ValidationCount()),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        default_hooks=dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1,
                                           save_best='toy/count', rule='greater')),
        custom_hooks=[FailTheSecondBest()])
    with pytest.raises(Exception, match='pickle'):
        runner.train()
    best = tmp_path / 'best_toy_count_epoch_1.pth'
    assert torch.load(best, weights_only=False)['meta']['epoch'] == 1
    names = sorted(os.listdir(tmp_path))
    assert not [n for n in names if 'epoch_2' in n and n.startswith('best')], names
    assert not [n for n in names if n.endswith('.partial')], names


class SeeTheOldCheckpoint(Hook):
    """Records, while each checkpoint is saved, which checkpoints are on disk."""

    def __init__(self) -> None:
        self.seen = []

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self.seen.append(sorted(n for n in os.listdir(runner.work_dir) if n.endswith('.pth')))


def toy_runner(work_dir, name, resume, custom_hooks=()):
    loader = dict(dataset=RandomlyAugmented(4), batch_size=2,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'))
    train = dict(model=RandomlyWeightedRegression(), work_dir=str(work_dir),
                 experiment_name=f'{name}_{work_dir.name}', train_dataloader=loader,
                 optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
                 train_cfg=dict(by_epoch=True, max_epochs=2), resume=resume,
                 default_hooks=dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1,
                                                    max_keep_ckpts=1)),
                 custom_hooks=list(custom_hooks))
    return Runner(**train)


def test_resume_with_nothing_to_resume_says_so(tmp_path, capsys):
    """An auto-resume script's first run: it trains from the beginning (as
    mmengine does), and the log says why instead of a bare 'None'."""
    toy_runner(tmp_path, 'nothing', resume=True).train()
    out = capsys.readouterr()
    assert f'--resume: nothing to resume in {tmp_path} (no checkpoint): training starts ' \
           'from the beginning' in out.out + out.err
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['epoch_2.pth']


def test_an_old_checkpoint_goes_once_its_successor_is_whole(tmp_path):
    """max_keep_ckpts=1: mmengine asks to remove epoch 1 before it writes
    epoch 2; the removal waits until epoch 2 is complete, and a resume whose
    last_checkpoint names a file that is gone points it at the newest whole one."""
    seen = SeeTheOldCheckpoint()
    toy_runner(tmp_path, 'keep', resume=False, custom_hooks=[seen]).train()
    assert seen.seen == [[], ['epoch_1.pth']]  # asked to go, epoch 1 waits for epoch 2
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['epoch_2.pth']
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_9.pth'))
    runner = toy_runner(tmp_path, 'resumed', resume=True)
    runner.train()  # max_epochs=2: resumed at the end, nothing left to train
    assert runner.epoch == 2
    assert (tmp_path / 'last_checkpoint').read_text() == str(tmp_path / 'epoch_2.pth')
