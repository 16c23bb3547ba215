"""A non-finite loss stops training at once, naming the iteration and the loss
terms (and, under float16 autocast with MoPPA units, the likely cause), and no
checkpoint with NaN weights is written."""
import glob
import os.path as osp
import re

import pytest
import torch
from mmengine.config import ConfigDict
from mmengine.runner import Runner
from mmpretrain.models.backbones import VisionTransformer

from demo.vtab_task import make_vtab_task
from model_converters.vit_to_mmpretrain import save_backbone
from tests.test_tools.test_vtab_pipeline import ARCH, tiny_vtab_cfg


@pytest.fixture(scope='module')
def kitti(tmp_path_factory):
    root = tmp_path_factory.mktemp('vtab-1k')
    make_vtab_task(str(root), 'kitti', dict(train800val200=16, test=4))
    torch.manual_seed(0)
    vit = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    vit.init_weights()
    return str(root), save_backbone(vit.state_dict(), str(root / 'vit.pth'), 'test')


def kitti_cfg(kitti, work_dir):
    """The real VTAB-1K config (with its custom hooks) on 16 images: two
    iterations of 8, a checkpoint after every iteration."""
    cfg = tiny_vtab_cfg(*kitti, 'kitti', str(work_dir))
    cfg.train_cfg = ConfigDict(by_epoch=True, max_epochs=1, val_interval=1)
    cfg.default_hooks.checkpoint = ConfigDict(type='CheckpointHook', by_epoch=False,
                                              interval=1)
    return cfg


def test_zero_std_stops_at_iteration_1_and_saves_nothing(kitti, tmp_path):
    cfg = kitti_cfg(kitti, tmp_path)
    cfg.data_preprocessor.std = [0, 0, 0]  # inputs / 0: inf, then NaN losses
    runner = Runner.from_cfg(cfg)
    with pytest.raises(FloatingPointError,
                       match=r'non-finite loss at iteration 1 \(epoch 1, lr [\d.e+-]+\): '
                             r'loss=nan; finite terms: loss_route=-?[\d.]+\. '
                             r'Training stopped.*Check the learning rate') as error:
        runner.train()
    assert 'float16' not in str(error.value)  # float32 training: no autocast to blame
    assert glob.glob(osp.join(str(tmp_path), '**', '*.pth'), recursive=True) == []


def test_finite_losses_train_and_checkpoint(kitti, tmp_path):
    runner = Runner.from_cfg(kitti_cfg(kitti, tmp_path))
    runner.train()
    assert runner.iter == 2
    assert osp.isfile(osp.join(str(tmp_path), 'iter_2.pth'))


@pytest.mark.parametrize('dtype,use_moppa,named', [
    ('float16', True, True), (None, True, True),  # None: autocast's default, float16 on CUDA
    ('bfloat16', True, False), ('float16', False, False)])
def test_float16_autocast_with_moppa_units_is_named_as_the_likely_cause(
        kitti, tmp_path, monkeypatch, dtype, use_moppa, named):
    """The Runner's own ``AmpOptimWrapper`` (what ``--amp`` selects; it refuses
    to be built without a GPU, so the check is lifted) and the hook called as
    the Runner calls it after a step whose loss overflowed."""
    from mmengine.optim.optimizer import amp_optimizer_wrapper

    from moppa_mm.engine.hooks import NonFiniteLossHook
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    cfg = kitti_cfg(kitti, tmp_path)
    cfg.optim_wrapper.update(type='AmpOptimWrapper', dtype=dtype)
    cfg.model.backbone.use_moppa = use_moppa
    runner = Runner.from_cfg(cfg)
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)  # as train() does
    overflow = {'loss': torch.tensor(float('inf'))}
    with pytest.raises(FloatingPointError, match=r'non-finite loss at iteration 1') as error:
        NonFiniteLossHook().after_train_iter(runner, 0, outputs=overflow)
    cause = (r"Likely cause: float16 autocast \(AmpOptimWrapper\) with MoPPA units, whose "
             r"Poisson term a3 H1 / \(w\^2 \+ eta\) grows as 1 / eta at the DC frequency.*"
             r"Use bfloat16 \(--amp with optim_wrapper.dtype='bfloat16'\) or float32, or a "
             r"larger eta \(model.backbone.moppa_cfg.eta\). Check the learning rate")
    assert bool(re.search(cause, str(error.value))) == named


def _check_on_rank(rank, init_file, results):
    import torch.distributed as dist

    from moppa_mm.engine.hooks import NonFiniteLossHook

    class IterationOnly:  # the fields the hook reads from the Runner
        iter, epoch, optim_wrapper = 4, 0, None

    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=2)
    loss = float('nan') if rank == 0 else 0.5
    try:
        NonFiniteLossHook().after_train_iter(
            IterationOnly(), 0, outputs={'loss': torch.tensor(loss)})
        results[rank] = 'trained on'
    except FloatingPointError as error:
        results[rank] = str(error)
    dist.destroy_process_group()


def test_every_rank_stops_when_one_rank_sees_a_nan(tmp_path):
    """Otherwise the other ranks would wait forever in their next all-reduce."""
    import torch.multiprocessing as mp
    results = mp.Manager().dict()
    mp.start_processes(_check_on_rank, args=(str(tmp_path / 'init'), results),
                       nprocs=2, start_method='fork')  # no re-import: seconds
    assert results[0].startswith('non-finite loss at iteration 5 (epoch 1): loss=nan')
    assert results[1].startswith('non-finite loss on another rank at iteration 5')
