"""VTAB-1K end to end on a tiny generated folder: train through the real
Runner with the hooks, then mmpretrain's own packaged tools/test.py on our
config and the adapter-only checkpoint, then the results table."""
import csv
import os
import os.path as osp
import subprocess

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.fileio import load
from mmengine.runner import Runner
from mmpretrain.models.backbones import VisionTransformer

from moppa_mm.datasets import VTAB_GROUPS, VTAB_TASKS
from demo.vtab_task import make_vtab_task
import vtab_table  # tools/
from model_converters.vit_to_mmpretrain import save_backbone
from moppa_mm.models import read_adapter_record
from tests.conftest import PYTHON, REPO, child_env, dump_cfg
from tests.test_tools.resume import assert_same_checkpoints, kill_then_resume, train

MMPRETRAIN_TEST = osp.join(osp.dirname(__import__('mmpretrain').__file__),
                           '.mim/tools/test.py')
TASKS = ('eurosat', 'kitti')
ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)


@pytest.fixture(scope='module')
def vtab_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('vtab-1k')
    for seed, task in enumerate(TASKS):
        make_vtab_task(str(root), task, dict(train800val200=24, test=12), seed=seed)
    torch.manual_seed(0)
    vit = VisionTransformer(arch=ARCH, img_size=32, patch_size=8)
    vit.init_weights()
    pretrained = save_backbone(vit.state_dict(), str(root / 'tiny_vit.pth'), 'test')
    return str(root), pretrained


def tiny_vtab_cfg(root, pretrained, task, work_dir):
    cfg = Config.fromfile(osp.join(
        REPO, f'configs/vtab1k/moppa_vit-b-p16_in21k-augreg-pre_vtab1k-{task}.py'))
    cfg.model.backbone.update(arch=ARCH, img_size=32, patch_size=8,
                              drop_path_rate=0.0)
    cfg.model.backbone.init_cfg.checkpoint = pretrained
    cfg.model.head.in_channels = 32
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg[key]
        loader.update(batch_size=8, num_workers=0, persistent_workers=False)
        loader.dataset.data_root = root
        for step in loader.dataset.pipeline:
            if step['type'] == 'Resize':
                step['scale'] = (32, 32)
    cfg.param_scheduler = [
        ConfigDict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
                   convert_to_iter_based=True),
        ConfigDict(type='CosineAnnealingLR', T_max=1, by_epoch=True, begin=1, end=2)]
    cfg.train_cfg = ConfigDict(by_epoch=True, max_epochs=2, val_interval=1)
    cfg.default_hooks.checkpoint = ConfigDict(type='CheckpointHook', interval=1)
    cfg.default_hooks.logger.interval = 1
    cfg.randomness = ConfigDict(seed=0)
    cfg.work_dir = work_dir
    return cfg


@pytest.mark.parametrize('task', TASKS)
def test_train_then_mmpretrain_test_tool_reproduces_accuracy(vtab_root, tmp_path, task):
    root, pretrained = vtab_root
    work_root = str(tmp_path / 'in21k-augreg')
    work_dir = osp.join(work_root, task)
    cfg = tiny_vtab_cfg(root, pretrained, task, work_dir)
    runner = Runner.from_cfg(cfg)
    runner.train()
    hub = runner.message_hub
    trained_top1 = hub.get_scalar('val/accuracy/top1').current()
    assert list(hub.get_scalar('train/route_weight').data[0])[0] == 1.0
    assert 'train/loss_route' in hub.log_scalars
    model = runner.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters()
                         if n.startswith('head.') or 'moppa' in n or 'ssf_' in n}

    ckpt_path = osp.join(work_dir, 'epoch_2.pth')
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert read_adapter_record(ckpt)['base']['fingerprint']  # the record
    assert not any(k.startswith('backbone.') and 'moppa' not in k and 'ssf_' not in k
                   and k != 'backbone._extra_state' for k in ckpt['state_dict'])
    config = osp.join(work_dir, 'config.py')
    cfg.dump(config)
    result = subprocess.run(
        [PYTHON, MMPRETRAIN_TEST, config, ckpt_path, '--work-dir',
         osp.join(work_dir, 'test')],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    collected = vtab_table.collect(work_root)
    assert collected == {task: pytest.approx(trained_top1)}
    if task == TASKS[-1]:  # our tools/test.py runs mmpretrain's: its flags work
        result = subprocess.run(
            [PYTHON, 'tools/test.py', config, ckpt_path, '--tta', '--out-item',
             'metrics', '--out', osp.join(work_dir, 'tta.pkl'), '--work-dir',
             osp.join(work_dir, 'tta')],
            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "type='mmpretrain.AverageClsScoreTTA'" in result.stdout + result.stderr
        assert 'accuracy/top1' in load(osp.join(work_dir, 'tta.pkl'))


def test_results_tool_reproduces_the_papers_means():
    for pretrain, summary in vtab_table.PAPER_SUMMARY.items():
        ours = vtab_table.summarize(vtab_table.paper_results(pretrain))
        for key in (*VTAB_GROUPS, 'Average'):
            assert abs(ours[key] - summary[key]) <= 0.1, (pretrain, key)


def test_results_table_and_files(tmp_path):
    ours = {t: 50.0 + i for i, t in enumerate(VTAB_TASKS)}
    rows = vtab_table.table('mae', {'moppa': ours}, {'moppa': 0.2556})
    assert rows[0][-5:] == ['Natural', 'Specialized', 'Structured', 'Average',
                            'params (M)']
    assert rows[1][-2] == f'{sum(ours.values()) / 19:.1f}'  # mean over 19 tasks
    assert rows[2][1] == '39.1' and rows[2][-2] == '69.4'
    md = vtab_table.to_markdown(rows)
    assert md.count('\n') == 4 and '| MoPPA (paper, mae) |' in md
    partial = vtab_table.table('mae', {'moppa': {'cifar': 12.5}})
    assert partial[1][1] == '12.5' and partial[1][2] == '-' and partial[1][-2] == '-'
    with pytest.raises(KeyError, match='missing tasks'):
        vtab_table.summarize({'cifar': 1.0})
    with pytest.raises(ValueError, match='unknown pre-training'):
        vtab_table.paper_results('clip')


def test_sweep_tool_collects_and_writes(tmp_path):
    out = tmp_path / 'table'
    result = subprocess.run(
        [PYTHON, 'tools/vtab_sweep.py', 'collect', '--pretrain', 'mocov3',
         '--work-root', str(tmp_path / 'none'), '--out', str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '0/19 tasks have results' in result.stdout
    assert out.with_suffix('.csv').read_text().splitlines()[2].startswith(
        '"MoPPA (paper, mocov3)",62.6')  # csv quotes the comma
    assert '| 0.256 |' in out.with_suffix('.md').read_text()  # our ViT-B budget
    bad = subprocess.run([PYTHON, 'tools/vtab_sweep.py', 'run', '--pretrain', 'mae',
                          '--tasks', 'cifar10'], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "unknown VTAB-1K task(s) ['cifar10']" in bad.stderr


def test_paper_baseline_rows_reproduce_the_papers_means():
    for method, summary in vtab_table.PAPER_BASELINE_SUMMARY['in21k-augreg'].items():
        ours = vtab_table.summarize(vtab_table.paper_method_results(method, 'in21k-augreg'))
        for key in (*VTAB_GROUPS, 'Average'):
            assert abs(ours[key] - summary[key]) <= 0.1, (method, key)
    assert vtab_table.paper_method_results('linear', 'in21k-augreg') is None
    assert vtab_table.paper_method_results('lora', 'mae') is None
    with pytest.raises(ValueError, match="unknown method 'vpt'"):
        vtab_table.paper_method_results('vpt', 'in21k-augreg')


def test_comparison_table_across_methods():
    lora = {t: 60.0 for t in VTAB_TASKS}
    rows = vtab_table.table(
        'in21k-augreg', {'linear': {'cifar': 40.0}, 'lora': lora, 'moppa': {}},
        {'lora': 0.333})
    names = [r[0] for r in rows[1:]]
    assert names == ['Linear probe (moppa_mm, in21k-augreg)',  # the paper has none
                     'LoRA (moppa_mm, in21k-augreg)', 'LoRA (paper, in21k-augreg)',
                     'MoPPA (moppa_mm, in21k-augreg)', 'MoPPA (paper, in21k-augreg)']
    assert rows[0] == vtab_table.HEADER
    assert rows[1][1:3] == ['40.0', '-']
    assert rows[2][-2:] == ['60.0', '0.333'] and rows[3][-2:] == ['72.3', '0.290']
    assert rows[4][1] == '-' and rows[5][-2] == '76.2'
    every = vtab_table.table('in21k-augreg', {})  # the paper's rows only
    assert [r[0].rsplit(' (', 1)[0] for r in every[1:]] == [
        'Full fine-tuning', 'Scale & shift (SSF)', 'LoRA', 'MoPPA']
    with pytest.raises(ValueError, match='unknown method'):
        vtab_table.table('in21k-augreg', {'adapter': {}})


def _fake_result(work_root, task, top1):
    """What ``tools/test.py --work-dir <work_root>/<task>/test`` writes."""
    folder = osp.join(work_root, task, 'test', '20260101_000000')
    os.makedirs(folder)
    with open(osp.join(folder, '20260101_000000.json'), 'w') as f:
        f.write(f'{{"accuracy/top1": {top1}}}')


def test_sweep_tool_compares_methods(tmp_path):
    work_root = tmp_path / 'work'
    _fake_result(str(work_root / 'lora' / 'in21k-augreg'), 'dtd', 65.5)
    _fake_result(str(work_root / 'in21k-augreg'), 'dtd', 77.25)  # MoPPA's work dirs
    out = tmp_path / 'compare'
    result = subprocess.run(
        [PYTHON, 'tools/vtab_sweep.py', 'compare', '--pretrain', 'in21k-augreg',
         '--methods', 'linear', 'lora', 'moppa', '--no-params',
         '--work-root', str(work_root), '--out', str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'tasks with results: linear 0/19, lora 1/19, moppa 1/19' in result.stdout
    rows = list(csv.reader(out.with_suffix('.csv').read_text().splitlines()))
    dtd = rows[0].index('dtd')
    assert [row[dtd] for row in rows[1:]] == [
        '-', '65.5', '69.4', '77.2', '78.3']  # ours / the paper's, per method
    one = subprocess.run(
        [PYTHON, 'tools/vtab_sweep.py', 'collect', '--method', 'lora', '--pretrain',
         'in21k-augreg', '--work-root', str(work_root), '--out', str(tmp_path / 'lora')],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    assert '1/19 tasks have results' in one.stdout
    assert '| 0.333 |' in (tmp_path / 'lora.md').read_text()  # rank 8 + mean head
    bad = subprocess.run([PYTHON, 'tools/vtab_sweep.py', 'run', '--method', 'lora',
                          '--pretrain', 'mae'], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and 'no lora configs for --pretrain mae' in bad.stderr


@pytest.mark.parametrize('processes', [1, 2])
def test_kill_and_resume_reproduces_the_uninterrupted_run(vtab_root, tmp_path,
                                                          processes):
    """A VTAB config with validation and a checkpoint after every epoch,
    random flips and drop path as shipped, killed in the middle of epoch 2:
    resuming from epoch 1 ends bit-identical to the uninterrupted run. With
    two processes seeded apart (``diff_rank_seed``: each rank flips and
    drops its own way), each must get its own random states back. The flips
    are drawn in data workers started every epoch, seeded as shipped
    (``epoch_seeded_worker_init``)."""
    root, pretrained = vtab_root
    cfg = tiny_vtab_cfg(root, pretrained, 'eurosat', str(tmp_path))
    cfg.model.backbone.drop_path_rate = 0.1  # training draws from torch's stream
    cfg.train_dataloader.num_workers = 2  # worker_init_fn as shipped
    assert cfg.train_dataloader.worker_init_fn.type == 'epoch_seeded_worker_init'
    cfg.randomness.diff_rank_seed = processes > 1
    config = dump_cfg(cfg, tmp_path / 'vtab.py')
    reference = tmp_path / 'uninterrupted'
    result = train(config, reference, processes=processes)
    assert result.returncode == 0, result.stderr[-3000:]
    log = kill_then_resume(config, tmp_path / 'killed', processes=processes,
                           before_iter=4 if processes == 1 else 3)  # 3 / 2 per epoch
    assert 'epoch_1.pth' in log and 'random states restored' in log
    assert_same_checkpoints(tmp_path / 'killed' / 'epoch_2.pth',
                            reference / 'epoch_2.pth')


def test_frozen_stages_keep_their_adapters_frozen_through_the_hooks(vtab_root, tmp_path):
    """``frozen_stages=1`` freezes layer 0's adapters and the patch embedding's
    scale & shift, and PEFTFreezeHook does not unfreeze them."""
    root, pretrained = vtab_root
    cfg = tiny_vtab_cfg(root, pretrained, 'eurosat', str(tmp_path))
    cfg.model.backbone.frozen_stages = 1
    cfg.train_cfg.max_epochs = 1
    runner = Runner.from_cfg(cfg)
    runner.train()
    names = [n for n, _ in runner.model.named_parameters()]
    trainable = {n for n, p in runner.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n in names if n.startswith('head.') or (
        n.startswith('backbone.layers.1.') and ('moppa' in n or 'ssf_' in n))}


def test_ema_hook_with_adapter_only_checkpoints(vtab_root, tmp_path):
    """mmpretrain's EMAHook added to a MoPPA config: the adapter-only checkpoint
    drops the frozen weights from the averaged copy too, so testing it (the
    hook swaps the averaged weights in) and resuming from it both work."""
    root, pretrained = vtab_root
    work_dir = str(tmp_path / 'ema')
    cfg = tiny_vtab_cfg(root, pretrained, 'eurosat', work_dir)
    cfg.custom_hooks.append(ConfigDict(type='EMAHook', momentum=0.1))
    Runner.from_cfg(cfg.copy()).train()
    ckpt = torch.load(osp.join(work_dir, 'epoch_2.pth'), weights_only=True)
    state, ema = ckpt['state_dict'], ckpt['ema_state_dict']
    assert not any(k.startswith('backbone.') and 'moppa' not in k and 'ssf_' not in k
                   and k != 'backbone._extra_state' for k in state)
    assert {k[len('module.'):] for k in ema if k.startswith('module.')} == set(state)
    test_cfg = cfg.copy()
    test_cfg.load_from = osp.join(work_dir, 'epoch_2.pth')
    test_cfg.work_dir = str(tmp_path / 'test')
    metrics = Runner.from_cfg(test_cfg).test()
    assert 'accuracy/top1' in metrics
    resume_cfg = cfg.copy()
    resume_cfg.resume, resume_cfg.load_from = True, osp.join(work_dir, 'epoch_1.pth')
    resume_cfg.work_dir = str(tmp_path / 'resumed')
    Runner.from_cfg(resume_cfg).train()
    assert osp.isfile(osp.join(resume_cfg.work_dir, 'epoch_2.pth'))
