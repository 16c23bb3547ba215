"""The baseline configs (linear probe, full fine-tuning, scale & shift, LoRA):
each builds with the expected trainable count, every generated file resolves to
its method's model and hooks, and plain ViT checkpoints load into LoRAModel."""
import functools
import glob
import importlib.util
import json
import os.path as osp
import subprocess

import pytest
import torch
from mmengine.config import Config
from mmengine.fileio import load
from mmengine.registry import init_default_scope
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.registry import MODELS

from moppa_mm.datasets import FGVC_DATASETS, VTAB_TASKS
from model_converters.vit_to_mmpretrain import plain_to_lora_keys, save_backbone
from tests.conftest import REPO

METHODS = ('linear', 'full', 'ssf', 'lora')
VTAB_BASE = 'configs/vtab1k/_base_/{}_vit-b-p16_in21k-augreg-pre_vtab1k.py'
FGVC_BASE = 'configs/fgvc/_base_/{}_vit-b-p16_in21k-pre_fgvc.py'
LAYERS, DIMS, FFN = 12, 768, 3072  # ViT-B/16
# trainable backbone parameters per method, from the architecture
EXPECTED_BACKBONE = {
    'linear': 0,
    'full': 85_798_656,  # all of mmpretrain's ViT-B/16 at 224 px
    # 2 x (qkv's v + proj + fc2) of DIMS, 2 x fc1 of FFN per layer; patch embedding
    'ssf': LAYERS * (3 * 2 * DIMS + 2 * FFN) + 2 * DIMS,
    'lora': LAYERS * 8 * (DIMS + 3 * DIMS),  # rank 8: down (768 -> 8), up (8 -> 2304)
}
# what may train besides the head
TRAINABLE_IN_BACKBONE = {'linear': None, 'full': '', 'ssf': 'ssf_', 'lora': '.lora_'}


def baseline_configs():
    return sorted(path for method in METHODS for family in ('vtab1k', 'fgvc')
                  for path in glob.glob(osp.join(REPO, 'configs', family,
                                                 f'{method}_*.py')))


def load_generator():
    spec = importlib.util.spec_from_file_location(
        'generate_configs', osp.join(REPO, 'tools', 'misc', 'generate_configs.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def method_base(method: str, fgvc: bool) -> Config:
    """A method's base config (read once; not to be changed)."""
    return Config.fromfile(osp.join(REPO, (FGVC_BASE if fgvc else VTAB_BASE).format(method)))


def pretrained_vit(cfg):
    """The plain ViT dict of a baseline's backbone (LoRAModel wraps one)."""
    backbone = cfg.model.backbone
    return backbone.module if backbone.type == 'LoRAModel' else backbone


def test_there_is_one_config_per_method_and_task():
    names = [osp.basename(p) for p in baseline_configs()]
    assert len(names) == len(METHODS) * (len(VTAB_TASKS) + len(FGVC_DATASETS))
    for method in METHODS:
        for task in VTAB_TASKS:
            assert f'{method}_vit-b-p16_in21k-augreg-pre_vtab1k-{task}.py' in names
        for dataset in FGVC_DATASETS:
            assert f'{method}_vit-b-p16_in21k-pre_fgvc-{dataset}.py' in names


@pytest.mark.parametrize('method', METHODS)
def test_each_method_builds_with_the_expected_trainable_count(method):
    cfg = Config.fromfile(osp.join(REPO, VTAB_BASE.format(method)))
    pretrained_vit(cfg).init_cfg = None  # the architecture, no weights
    init_default_scope('mmpretrain')
    model = MODELS.build(cfg.model)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    in_backbone = {n: c for n, c in trainable.items() if n.startswith('backbone.')}
    assert sum(in_backbone.values()) == EXPECTED_BACKBONE[method]
    assert sum(c for n, c in trainable.items() if n.startswith('head.')) == 768 * 100 + 100
    assert set(trainable) - set(in_backbone) == {'head.layers.head.weight',
                                                 'head.layers.head.bias'}
    marker = TRAINABLE_IN_BACKBONE[method]
    assert all(marker is not None and marker in n for n in in_backbone)
    # the metafiles' counts are these
    assert load_generator().BASELINES[method][1] == EXPECTED_BACKBONE[method]


@pytest.mark.parametrize('path', baseline_configs(), ids=osp.basename)
def test_every_baseline_config_is_its_method_on_its_task(path):
    method, name = osp.basename(path).split('_', 1)
    fgvc = '_fgvc-' in name
    base = method_base(method, fgvc)
    cfg = Config.fromfile(path)
    task = osp.splitext(name)[0].rsplit('-', 1)[1]
    classes = FGVC_DATASETS[task][0] if fgvc else VTAB_TASKS[task]
    assert cfg.model.backbone == base.model.backbone
    assert cfg.model.head.num_classes == classes == cfg.data_preprocessor.num_classes
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = cfg[loader].dataset
        assert (dataset.dataset if fgvc else dataset.task) == task
    assert cfg.custom_hooks == base.custom_hooks
    # every method gets the opt-in guarantees and no hook of the method
    guards = Config.fromfile(osp.join(REPO, 'configs/_base_/safe_training.py'))
    assert cfg.custom_hooks == guards.custom_hooks
    assert pretrained_vit(cfg).init_cfg.checkpoint == (
        'data/pretrained/vit-b-p16_in21k.pth' if fgvc
        else 'data/pretrained/vit-b-p16_in21k-augreg.pth')


@pytest.mark.parametrize('method', METHODS)
def test_fgvc_baselines_are_the_vtab_ones_on_other_data(method):
    vtab = Config.fromfile(osp.join(REPO, VTAB_BASE.format(method)))
    fgvc = Config.fromfile(osp.join(REPO, FGVC_BASE.format(method)))
    pretrained_vit(vtab).init_cfg.checkpoint = pretrained_vit(fgvc).init_cfg.checkpoint
    assert vtab.model == fgvc.model
    assert vtab.custom_hooks == fgvc.custom_hooks
    assert vtab.optim_wrapper == fgvc.optim_wrapper
    assert vtab.train_dataloader.dataset.type == 'VTAB1k'
    assert fgvc.train_dataloader.dataset.type == 'FGVC'


def test_plain_vit_checkpoint_loads_into_the_lora_config(tmp_path):
    """The converters' ``{'state_dict': {'backbone.' + key}}`` file goes into
    the LoRA config's ``init_cfg`` as is: every pre-trained tensor arrives, also
    after the Runner's ``init_weights``, and a checkpoint of the model (LoRA
    factors and head only) restores the trained model in a fresh build."""
    arch = dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)
    torch.manual_seed(0)
    vit = VisionTransformer(arch=arch, img_size=32, patch_size=8)
    vit.init_weights()
    plain = vit.state_dict()
    checkpoint = save_backbone(plain, str(tmp_path / 'vit.pth'), 'test')

    cfg = Config.fromfile(osp.join(REPO, VTAB_BASE.format('lora')))
    pretrained_vit(cfg).update(arch=arch, img_size=32, patch_size=8)
    pretrained_vit(cfg).init_cfg.checkpoint = checkpoint
    cfg.model.head.in_channels = 32
    init_default_scope('mmpretrain')
    torch.manual_seed(1)  # other random weights than the checkpoint's
    model = MODELS.build(cfg.model)
    model.init_weights()  # as the Runner does before training

    lora_vit = model.backbone.module
    loaded = lora_vit.state_dict(keep_vars=False)
    expected = plain_to_lora_keys(plain, lora_vit)
    assert set(expected) <= set(loaded)
    assert [k for k in expected if not torch.equal(loaded[k], expected[k])] == []
    assert set(loaded) - set(expected) == {
        f'layers.{i}.attn.qkv.{f}.weight' for i in range(2)
        for f in ('lora_down', 'lora_up')}

    with torch.no_grad():  # "train" the factors and the head
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param))
    saved = model.state_dict()
    assert all('.lora_' in k for k in saved if k.startswith('backbone.'))
    assert any(k.startswith('head.') for k in saved)

    torch.manual_seed(2)
    fresh = MODELS.build(cfg.model)
    fresh.load_state_dict(saved, strict=False)
    images = torch.randn(2, 3, 32, 32)
    model.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(model(images, mode='tensor'), fresh(images, mode='tensor'))


@pytest.mark.parametrize('method', ('linear', 'lora', 'ssf'))
def test_trained_baseline_tests_to_its_accuracy_from_its_checkpoint(tmp_path, method):
    """Train 2 epochs on a generated task, then ``tools/test.py`` from the
    saved checkpoint (LoRA's holds only the LoRA factors and the head, SSF's
    only the scale & shift and the head) gives the last validation's scores:
    nothing of the backbone is lost or random."""
    from mmengine.config import ConfigDict
    from mmengine.runner import Runner

    from demo.vtab_task import make_vtab_task
    from tests.conftest import PYTHON, child_env

    root = str(tmp_path / 'vtab-1k')
    make_vtab_task(root, 'eurosat', dict(train800val200=16, test=12), seed=0)
    arch = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
    torch.manual_seed(7)  # not the Runner's seed: other weights than a random init
    vit = VisionTransformer(arch=arch, img_size=32, patch_size=8)
    vit.init_weights()
    pretrained = save_backbone(vit.state_dict(), str(tmp_path / 'vit.pth'), 'test')

    cfg = Config.fromfile(osp.join(
        REPO, f'configs/vtab1k/{method}_vit-b-p16_in21k-augreg-pre_vtab1k-eurosat.py'))
    pretrained_vit(cfg).update(arch=arch, img_size=32, patch_size=8, drop_path_rate=0.0)
    if method == 'linear':
        pretrained_vit(cfg).frozen_stages = 2  # all layers of the tiny ViT
    pretrained_vit(cfg).init_cfg.checkpoint = pretrained
    cfg.model.head.in_channels = 32
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].update(batch_size=8, num_workers=0, persistent_workers=False)
        cfg[key].dataset.data_root = root
        for step in cfg[key].dataset.pipeline:
            if step['type'] == 'Resize':
                step['scale'] = (32, 32)
    cfg.optim_wrapper.optimizer.lr = 1e-2
    cfg.param_scheduler = []
    cfg.train_cfg = ConfigDict(by_epoch=True, max_epochs=2, val_interval=2)
    cfg.default_hooks.checkpoint = ConfigDict(type='CheckpointHook', interval=2)
    cfg.randomness = ConfigDict(seed=0)
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    runner.train()
    trained_top1 = runner.message_hub.get_scalar('val/accuracy/top1').current()
    trainable = {n for n, p in runner.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in runner.model.named_parameters()
                         if n.startswith('head.') or '.lora_' in n or 'ssf_' in n}

    checkpoint = osp.join(cfg.work_dir, 'epoch_2.pth')
    saved = torch.load(checkpoint, weights_only=True)['state_dict']
    backbone_keys = [k for k in saved if k.startswith('backbone.')]
    if method in ('lora', 'ssf'):
        marker = TRAINABLE_IN_BACKBONE[method]
        # the adapters (and, for the MoPPA backbone, its adapter record)
        adapters = [k for k in backbone_keys if k != 'backbone._extra_state']
        assert adapters and all(marker in k for k in adapters)
    else:
        assert len(backbone_keys) == len(vit.state_dict())
    config = osp.join(cfg.work_dir, 'config.py')
    cfg.dump(config)
    predictions = osp.join(cfg.work_dir, 'predictions.pkl')
    result = subprocess.run(
        [PYTHON, 'tools/test.py', config, checkpoint, '--work-dir',
         osp.join(cfg.work_dir, 'test'), '--out', predictions],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics, ) = glob.glob(osp.join(cfg.work_dir, 'test', '*', '*.json'))
    with open(metrics) as f:
        assert json.load(f)['accuracy/top1'] == pytest.approx(trained_top1)
    # the scores too, not only the top-1 of 12 images
    runner.model.eval()
    with torch.no_grad():
        ours = [sample.pred_score for batch in runner.test_dataloader
                for sample in runner.model.test_step(batch)]
    tested = [torch.as_tensor(p['pred_score']) for p in load(predictions)]
    assert len(tested) == len(ours) == 12
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, tested))
