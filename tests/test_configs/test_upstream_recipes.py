"""Upstream recipes that do not fit a frozen base, each with the README's two
lines (``custom_imports`` and the backbone's type) on the **packaged** config,
made tiny by a child config, and run by mmengine's ``Runner``:

* mmpretrain's Swin-T and DeiT configs train from scratch (no ``Pretrained``
  ``init_cfg``): the first training step stops, naming ``init_cfg`` and the
  ways out, instead of freezing a random backbone;
* MAE's fine-tuning config (``out_type='avg_featmap'``, ``final_norm=False``)
  starts from an MAE pre-training checkpoint, which has no ``ln2``: the base
  loads, ``ln2`` trains with the adapters, the table and the record say so;
* DINO's and Mask2Former's ``custom_keys={'backbone': dict(lr_mult=0.1)}``
  covers only the adapters: the run stops before its first step (mmengine's
  default constructor) or when the optimizer is built (ours), in one line
  with the line to add, which trains the adapters at the optimizer's lr
  while the frozen base stays out of the optimizer; mmengine's warning per
  frozen parameter is one line.
"""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, load_checkpoint

from demo.coco_shapes import prepare_demo
from demo.vtab_task import make_vtab_task
from moppa_mm.models import read_adapter_record
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.training_checks import (AdapterLrError, NoPretrainedBaseError,
                                                       waiting_check)
from tests.conftest import logged_messages

USER_LINES = """_base_ = {base!r}
custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)
model = dict(backbone=dict(type={backbone!r}))
"""

# iteration-based, no validation, a checkpoint at the end
SHORT_RUN = """
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2)
val_cfg = None
val_dataloader = None
val_evaluator = None
test_cfg = None
test_dataloader = None
test_evaluator = None
param_scheduler = []
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=2))
log_processor = dict(by_epoch=False, window_size=1)
randomness = dict(seed=0)
"""

CLASSIFIER = """_base_ = './user.py'
model = dict(
    backbone=dict(arch=dict(_delete_=True, {arch}), img_size={size}, {backbone}
                  drop_path_rate=0.0),
    head=dict(num_classes=10, in_channels={channels}),
    train_cfg=None)  # no Mixup / CutMix
data_preprocessor = dict(num_classes=10, mean=[127.5] * 3, std=[127.5] * 3)
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(_delete_=True, type='VTAB1k', data_root={root!r}, task='eurosat',
                 split='train800val200',
                 pipeline=[dict(type='LoadImageFromFile'),
                           dict(type='Resize', scale=({size}, {size})),
                           dict(type='PackInputs')]))
""" + SHORT_RUN

SWIN_T = ('mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py', 'MoPPASwinTransformer',
          dict(arch="embed_dims=16, depths=[2, 2], num_heads=[2, 4]", size=56,
               backbone='window_size=7, out_indices=(1, ),', channels=32))
DEIT = ('mmpretrain::deit/deit-tiny_4xb256_in1k.py', 'MoPPAVisionTransformer',
        dict(arch="embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64",
             size=32, backbone='patch_size=8,', channels=32))
MAE_FINETUNE = 'mmpretrain::mae/benchmarks/vit-base-p16_8xb128-coslr-100e_in1k.py'
MAE_PRETRAIN = 'mmpretrain::mae/mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py'
TINY_VIT_ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)

DINO = """_base_ = './user.py'
model = dict(
    num_queries=20,
    backbone=dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                  window_size=7, pretrain_img_size=224, drop_path_rate=0.0,
                  with_cp=False, init_cfg=dict(checkpoint={pretrained!r})),
    neck=dict(in_channels=[32, 64, 128, 256]),
    encoder=dict(num_layers=1, layer_cfg=dict(ffn_cfg=dict(feedforward_channels=64))),
    decoder=dict(num_layers=1, layer_cfg=dict(ffn_cfg=dict(feedforward_channels=64))),
    bbox_head=dict(num_classes=3),
    dn_cfg=dict(group_cfg=dict(num_dn_queries=10)))
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(data_root={root!r}, ann_file='annotations/train.json',
                 data_prefix=dict(img='train/'),
                 metainfo=dict(classes=('square', 'circle', 'triangle')),
                 pipeline=[dict(type='LoadImageFromFile'),
                           dict(type='LoadAnnotations', with_bbox=True),
                           dict(type='Resize', scale=(96, 96), keep_ratio=True),
                           dict(type='PackDetInputs')]))
""" + SHORT_RUN.replace('max_iters=2', 'max_iters=1').replace('interval=2', 'interval=1')
DINO_BASE = 'mmdet::dino/dino-5scale_swin-l_8xb2-12e_coco.py'


def config(tmp_path, base, backbone, tiny, **options):
    (tmp_path / 'user.py').write_text(USER_LINES.format(base=base, backbone=backbone))
    (tmp_path / 'tiny.py').write_text(tiny)
    cfg = Config.fromfile(str(tmp_path / 'tiny.py'))
    cfg.merge_from_dict(options)
    cfg.work_dir = str(tmp_path / 'work')
    return cfg


def run_log(cfg) -> str:
    return open(glob.glob(osp.join(cfg.work_dir, '*', '*.log'))[0]).read()


@pytest.fixture(scope='module')
def vtab_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('vtab'))
    make_vtab_task(root, size=32)
    return root


@pytest.mark.parametrize('recipe', [SWIN_T, DEIT], ids=['swin-t', 'deit-tiny'])
def test_a_from_scratch_config_stops_instead_of_freezing_a_random_base(
        recipe, vtab_root, tmp_path):
    base, backbone, tiny = recipe
    cfg = config(tmp_path, base, backbone, CLASSIFIER.format(root=vtab_root, **tiny))
    assert 'init_cfg' not in cfg.model.backbone  # the packaged config trains it whole
    runner = Runner.from_cfg(cfg)
    with pytest.raises(NoPretrainedBaseError,
                       match=r"(?s)init_cfg is None.*type='Pretrained'.*"
                             'freeze_pretrained=False'):
        runner.train()
    assert 'random (no base loaded)' in run_log(cfg)  # the table: not "pre-trained"
    assert not glob.glob(osp.join(cfg.work_dir, '*.pth'))
    # the named way out: everything trains
    (tmp_path / 'whole').mkdir()
    cfg = config(tmp_path / 'whole', base, backbone, CLASSIFIER.format(root=vtab_root, **tiny),
                 **{'model.backbone.freeze_pretrained': False})
    Runner.from_cfg(cfg).train()
    assert osp.isfile(osp.join(cfg.work_dir, 'iter_2.pth'))


def mae_pretrained(folder) -> str:
    """A tiny MAE pre-training checkpoint, as mmpretrain's MAE writes it: the
    packaged pre-training config's model (``MAEViT``, decoder, head), made
    tiny, its ``state_dict`` under ``backbone.`` / ``neck.`` / ``head.``."""
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    (folder / 'mae_pretrain_cfg.py').write_text(f'_base_ = {MAE_PRETRAIN!r}\n')
    cfg = Config.fromfile(str(folder / 'mae_pretrain_cfg.py'))
    cfg.model.backbone.update(arch=TINY_VIT_ARCH, img_size=32, patch_size=8)
    cfg.model.neck.update(num_patches=16, patch_size=8, embed_dim=32,
                          decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4)
    cfg.model.head.update(patch_size=8)
    torch.manual_seed(0)
    mae = MODELS.build(cfg.model)
    mae.init_weights()
    path = str(folder / 'mae_pretrain.pth')
    torch.save({'state_dict': mae.state_dict(), 'meta': {}}, path)
    return path


def test_mae_fine_tuning_config_trains_its_new_norm_with_the_adapters(vtab_root, tmp_path):
    checkpoint = mae_pretrained(tmp_path)
    saved = torch.load(checkpoint, weights_only=True)['state_dict']
    assert 'backbone.ln1.weight' in saved and 'backbone.ln2.weight' not in saved
    tiny = CLASSIFIER.format(
        root=vtab_root, arch='embed_dims=32, num_layers=2, num_heads=4, '
        'feedforward_channels=64', size=32, channels=32,
        backbone=f'patch_size=8, init_cfg=dict(checkpoint={checkpoint!r}),')
    cfg = config(tmp_path, MAE_FINETUNE, 'MoPPAVisionTransformer', tiny)
    assert cfg.model.backbone.out_type == 'avg_featmap' and not cfg.model.backbone.final_norm
    assert cfg.optim_wrapper.constructor == 'LearningRateDecayOptimWrapperConstructor'
    # its layer-wise lr decay would scale the adapters: stopped, with the line
    with pytest.raises(AdapterLrError, match=r"layer-wise lr decay.*add to the config: "
                       r'optim_wrapper = dict\(paramwise_cfg=dict\(layer_decay_rate=1.0\)\)'):
        Runner.from_cfg(cfg).train()
    (tmp_path / 'fixed').mkdir()
    cfg = config(tmp_path / 'fixed', MAE_FINETUNE, 'MoPPAVisionTransformer', tiny,
                 **{'optim_wrapper.paramwise_cfg.layer_decay_rate': 1.0})
    runner = Runner.from_cfg(cfg)
    backbone = runner.model.backbone
    assert backbone.ln2.weight.requires_grad and backbone.ln2.bias.requires_grad
    assert backbone.pretrained_base['checkpoint'] == checkpoint
    start = {k: v.clone() for k, v in backbone.state_dict().items()
             if k.startswith('ln2.')}
    runner.train()
    log = run_log(cfg)
    assert 'new, no base has them' in log  # the table's row for ln2
    # the file's own final norm (ln1, not in this model) is no sign of a changed base
    assert 're-initialised after it was loaded' not in log
    assert not torch.equal(backbone.ln2.weight, start['ln2.weight'])  # it trained
    layer = backbone.layers[0].attn.qkv.weight
    torch.testing.assert_close(layer, saved['backbone.layers.0.attn.qkv.weight'],
                               rtol=0, atol=0)  # the base did not
    state = torch.load(osp.join(cfg.work_dir, 'iter_2.pth'), weights_only=True)['state_dict']
    record = read_adapter_record(state)
    assert record['adapters']['params_not_in_base'] == ['ln2.*']
    assert 'backbone.ln2.weight' in state and 'backbone.layers.0.attn.qkv.weight' not in state
    # the adapter checkpoint (ln2 included) loads onto the base built from init_cfg
    from mmpretrain.registry import MODELS
    model = MODELS.build(cfg.model)
    fingerprint = model.backbone.pretrained_base['fingerprint']
    load_checkpoint(model, osp.join(cfg.work_dir, 'iter_2.pth'), map_location='cpu')
    torch.testing.assert_close(model.backbone.ln2.weight, backbone.ln2.weight)
    assert model.backbone.pretrained_base['fingerprint'] == fingerprint


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('shapes'))
    paths = prepare_demo(root, num_train=4, num_val=2, size=96)
    return dict(root=root + '/', pretrained=paths['pretrained'])


def adapter_lrs(optimizer, backbone):
    adapters = {id(p) for n, p in backbone.named_parameters() if is_adapter_key(n)}
    return {group['lr'] for group in optimizer.param_groups
            for p in group['params'] if id(p) in adapters}


def added_line(error) -> str:
    """The config line an :class:`AdapterLrError` says to add."""
    return str(error.value).split('add to the config: ')[1].rstrip('.')


def test_dino_backbone_lr_mult_stops_and_the_line_it_names_trains_at_the_lr(
        shapes, tmp_path):
    dino = DINO.format(pretrained=shapes['pretrained'], root=shapes['root'])
    cfg = config(tmp_path, DINO_BASE, 'MoPPASwinTransformer', dino)
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys == {'backbone': dict(lr_mult=0.1)}
    assert 'constructor' not in cfg.optim_wrapper  # mmengine's default constructor
    runner = Runner.from_cfg(cfg)
    assert 'first_step_check=(first step' in repr(runner.model.backbone)
    with pytest.raises(AdapterLrError, match=r'train at lr 1e-05 \(0.1 x\)') as error:
        runner.train()
    assert '\n' not in str(error.value)
    suggested = ("optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'backbone.': "
                 "dict(lr_mult=1.0, decay_mult=1.0)}))")
    assert added_line(error) == suggested
    assert not glob.glob(osp.join(cfg.work_dir, '*.pth'))  # no step, no checkpoint
    log = run_log(cfg)
    assert 'is skipped since its requires_grad=False' not in log
    assert log.count('frozen parameter tensors (model.backbone.*') == 1
    assert 'first_step_check' not in repr(runner.model.backbone)

    # the line it names, added to the config: it trains, the base still out
    (tmp_path / 'fixed').mkdir()
    config(tmp_path / 'fixed', DINO_BASE, 'MoPPASwinTransformer', dino)
    (tmp_path / 'fixed' / 'added.py').write_text(f"_base_ = './tiny.py'\n{suggested}\n")
    fixed = Config.fromfile(str(tmp_path / 'fixed' / 'added.py'))
    fixed.work_dir = str(tmp_path / 'fixed' / 'work')
    runner = Runner.from_cfg(fixed)
    runner.train()
    optimizer, backbone = runner.optim_wrapper.optimizer, runner.model.backbone
    assert adapter_lrs(optimizer, backbone) == {1e-4}
    optimized = {id(p) for group in optimizer.param_groups for p in group['params']}
    assert not any(id(p) in optimized for p in backbone.parameters() if not p.requires_grad)

    # ours stops when it builds the optimizer, naming the key
    (tmp_path / 'ours').mkdir()
    ours = config(tmp_path / 'ours', DINO_BASE, 'MoPPASwinTransformer', dino,
                  **{'optim_wrapper.constructor': 'TrainableParamsOptimWrapperConstructor'})
    runner = Runner.from_cfg(ours)
    with pytest.raises(AdapterLrError) as error:
        runner.build_optim_wrapper(ours.optim_wrapper)
    assert "custom_keys['backbone'] = {'lr_mult': 0.1}" in str(error.value)
    assert added_line(error) == suggested
    assert waiting_check(runner.model.backbone) is None  # checked there, not at the step


MASK2FORMER_BASE = 'mmdet::mask2former/mask2former_swin-t-p4-w7-224_8xb2-lsj-50e_coco.py'
MASK2FORMER = """_base_ = './user.py'
model = dict(
    backbone=dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                  init_cfg=dict(checkpoint={pretrained!r})),
    panoptic_head=dict(in_channels=[32, 64, 128, 256], num_queries=10,
                       pixel_decoder=dict(encoder=dict(num_layers=1)),
                       transformer_decoder=dict(num_layers=1)))
"""


def test_mask2former_backbone_lr_mult_stops_before_the_first_step(shapes, tmp_path):
    """The packaged Mask2Former Swin config with the two lines, its optimizer
    built by mmengine's own constructor (``build_optim_wrapper``, as the
    Runner builds it): one line for the frozen base, a stop at the first step
    with the line to add; added, the adapters train at the optimizer's lr."""
    from mmdet.registry import MODELS
    from mmengine.optim import build_optim_wrapper
    tiny = MASK2FORMER.format(pretrained=shapes['pretrained'])
    cfg = config(tmp_path, MASK2FORMER_BASE, 'MoPPASwinTransformer', tiny)
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys['backbone'] == dict(
        lr_mult=0.1, decay_mult=1.0)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    with logged_messages() as messages:
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert not [m for m in messages if 'is skipped since its requires_grad=False' in m]
    assert len([m for m in messages if 'frozen parameter tensors' in m]) == 1
    with pytest.raises(AdapterLrError, match=r'train at lr 1e-05 \(0.1 x\)') as error:
        optim_wrapper.step()
    (tmp_path / 'added.py').write_text(f"_base_ = './tiny.py'\n{added_line(error)}\n")
    fixed = Config.fromfile(str(tmp_path / 'added.py'))
    model = MODELS.build(fixed.model)
    optimizer = build_optim_wrapper(model, fixed.optim_wrapper).optimizer
    assert adapter_lrs(optimizer, model.backbone) == {1e-4}
    optimizer.step()  # the check passes
    assert waiting_check(model.backbone) is None
