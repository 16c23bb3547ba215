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
