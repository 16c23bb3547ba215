"""epoch_seeded_worker_init in mmengine-built data loaders with real worker
processes: new random draws every epoch, per rank, and the same draws from the
same main-process generator state (what an exact resume needs)."""
import random

import numpy as np
import pytest
import torch
from mmengine.registry import FUNCTIONS, DefaultScope
from mmengine.runner import Runner
from torch.utils.data import Dataset


class RandomDraws(Dataset):
    """What a random transform would draw for each sample, from each of the
    three generators pipelines use."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([random.random(), np.random.rand(),
                             torch.rand(()).item()], dtype=torch.float64)


def build_loader(**options):
    loader = dict(dataset=RandomDraws(), batch_size=2, num_workers=2,
                  persistent_workers=False,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'), **options)
    return Runner.build_dataloader(loader, seed=0)  # as a Runner with randomness.seed=0


def epoch_draws(loader) -> torch.Tensor:
    return torch.cat(list(loader))  # (8, 3): samples x generators


SEEDED = dict(worker_init_fn=dict(type='epoch_seeded_worker_init'))


def test_every_epoch_draws_new_augmentations():
    torch.manual_seed(0)
    loader = build_loader(**SEEDED)
    first, second = epoch_draws(loader), epoch_draws(loader)
    same = (first == second).any(dim=0)
    assert not same.any(), f'generators (random, numpy, torch) repeat: {same}'
    assert len(set(first[:, 1].tolist())) == 8  # both workers draw differently


def test_the_same_main_generator_state_gives_the_same_draws():
    """A resumed run restores the main process's generator (RNGStateHook),
    and its workers draw what the uninterrupted run's drew."""
    loader = build_loader(**SEEDED)
    torch.manual_seed(0)
    epoch_draws(loader)
    state = torch.get_rng_state()
    want = epoch_draws(loader)
    torch.set_rng_state(state)
    assert torch.equal(epoch_draws(loader), want)


def test_ranks_with_the_same_seed_draw_differently(monkeypatch):
    draws = []
    for rank in ('0', '1'):
        monkeypatch.setenv('RANK', rank)  # as launchers set it; workers inherit it
        torch.manual_seed(0)  # mmengine seeds every rank alike by default
        draws.append(epoch_draws(build_loader(**SEEDED)))
    assert not (draws[0] == draws[1]).any()


@pytest.mark.parametrize('scope', ['mmdet', 'mmpretrain'])
def test_configs_of_either_scope_find_it(scope):
    with DefaultScope.overwrite_default_scope(scope):
        assert FUNCTIONS.get('epoch_seeded_worker_init') is not None
