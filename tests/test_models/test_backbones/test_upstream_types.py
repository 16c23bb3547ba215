"""What the MoPPA classes stand in for: a packaged upstream config whose type
alone is changed to a MoPPA class it does not fit stops with one line naming
the upstream type to keep (before any weight is built where the arguments tell),
or the base it loads does; a misspelt argument names the closest one; the
upstream options the classes cover behave as upstream's (``frozen_stages``)."""
import contextlib

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import save_checkpoint
from mmpretrain.models.backbones import DeiT3, DistilledVisionTransformer
from torch.nn.modules.module import register_module_parameter_registration_hook

from moppa_mm.models import (MoPPASwinTransformer, MoPPASwinTransformerCls,
                             MoPPAVisionTransformer)
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.utils.errors import InputValueError

VIT = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
SWIN = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4))


@contextlib.contextmanager
def parameters_built():
    """The list of parameters registered on any module within the block."""
    built = []
    handle = register_module_parameter_registration_hook(
        lambda module, name, param: built.append(name))
    try:
        yield built
    finally:
        handle.remove()


def build_packaged(tmp_path, config, package='mmpretrain', **backbone):
    """The user's two lines over ``config`` (a packaged one: the type changed
    as the README says), with ``backbone`` merged in, built through the real
    registry; returns the upstream type and the build."""
    registry = __import__(f'{package}.registry', fromlist=['MODELS']).MODELS
    (tmp_path / 'packaged.py').write_text(f"_base_ = '{package}::{config}'\n")
    upstream = Config.fromfile(str(tmp_path / 'packaged.py')).model.backbone.type
    moppa = 'MoPPASwinTransformer' if 'Swin' in upstream else 'MoPPAVisionTransformer'
    (tmp_path / 'user.py').write_text(
        "_base_ = './packaged.py'\n"
        "custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)\n"
        f"model = dict(backbone=dict(type='{moppa}'))\n")
    cfg = Config.fromfile(str(tmp_path / 'user.py'))
    for key, value in backbone.items():
        cfg.model.backbone[key] = value
    cfg.model._scope_ = package  # whatever default scope an earlier test left current
    return upstream, lambda: registry.build(cfg.model)


@pytest.mark.parametrize('config, message', [
    ('deit3/deit3-small-p16_64xb64_in1k.py',  # would be VisionTransformer's 768-d 's'
     "MoPPAVisionTransformer: model.backbone.arch = 's' is a DeiT3 / ViTEVA02 arch (a 384-d "
     "or 512-d ViT), which MoPPA does not stand in for: keep type='DeiT3' (or 'ViTEVA02')"),
    ('deit3/deit3-medium-p16_64xb64_in1k.py', "arch = 'm' is a DeiT3 / ViTEVA02 arch"),
    ('beit/benchmarks/beit-base-p16_8xb128-coslr-100e_in1k.py',
     "model.backbone.use_abs_pos_emb is not an argument of MoPPAVisionTransformer (nor of "
     "mmpretrain's VisionTransformer): it is one of mmpretrain's BEiTPretrainViT / BEiTViT"),
    ('eva02/eva02-base-p14_in1k.py', "it is one of mmpretrain's ViTEVA02, which "
     'MoPPAVisionTransformer does not stand in for: keep that type'),
    ('dinov2/vit-giant-p14_dinov2-pre_headless.py',  # (giant: 1.1B parameters)
     "model.backbone.layer_cfgs = {'ffn_type': 'swiglu_fused'}: MoPPA's scale & shift"),
    ('swin_transformer_v2/swinv2-tiny-w16_16xb64_in1k-256px.py',
     "window_size = [16, 16, 16, 8]: a window per stage is mmpretrain's SwinTransformerV2's"),
])
def test_a_packaged_config_of_a_type_not_covered_stops_before_any_weight(config, message,
                                                                         tmp_path):
    upstream, build = build_packaged(tmp_path, config)
    with parameters_built() as built, pytest.raises(InputValueError) as info:
        build()
    assert message in str(info.value)
    assert upstream in str(info.value) or upstream == 'DeiT3'  # DeiT3: its arch named
    assert built == []


@pytest.mark.parametrize('upstream, config, message', [
    (DeiT3, 'deit3/deit3-base-p16_64xb64_in1k.py',  # 'b' is VisionTransformer's too
     "the checkpoint holds a pos_embed of 16 patches without a class-token slot: the base "
     "of another ViT (mmpretrain's DeiT3 saves it so), which MoPPA does not stand in for: "
     "keep type='DeiT3'"),
    (DistilledVisionTransformer, 'deit/deit-tiny-distilled_4xb256_in1k.py',
     "the checkpoint holds a dist_token: the base of mmpretrain's DistilledVisionTransformer, "
     "which MoPPA does not stand in for: keep type='DistilledVisionTransformer'"),
])
def test_the_base_of_a_vit_not_covered_stops_naming_its_type(upstream, config, message,
                                                             tmp_path):
    """Where the arguments fit (the same arch names, sizes and options), the
    pre-trained base tells the type, before mmpretrain's pos_embed resize
    misreads it (DeiT-3) or the load drops what the class lacks (distilled)."""
    base = str(tmp_path / 'base.pth')
    save_checkpoint(upstream(arch=VIT, img_size=32, patch_size=8).state_dict(), base)
    _, build = build_packaged(tmp_path, config, arch=VIT, img_size=32, patch_size=8,
                              init_cfg=dict(type='Pretrained', checkpoint=base))
    with pytest.raises(InputValueError, match='MoPPAVisionTransformer: ') as info:
        build()
    assert message in str(info.value) and repr(base) in str(info.value)


@pytest.mark.parametrize('build, message', [
    (lambda: MoPPAVisionTransformer(arch=VIT, route_los_weight=0.5),
     "model.backbone.route_los_weight is not an argument of MoPPAVisionTransformer (nor of "
     "mmpretrain's VisionTransformer): did you mean route_loss_weight?"),
    (lambda: MoPPASwinTransformer(**SWIN, drop_path_rat=0.1),
     "model.backbone.drop_path_rat is not an argument of MoPPASwinTransformer (nor of "
     "mmdet's SwinTransformer): did you mean drop_path_rate?"),
    (lambda: MoPPASwinTransformerCls(arch=SWIN, use_moppa_units=False),
     'did you mean use_moppa?'),
    (lambda: MoPPAVisionTransformer(arch=VIT, use_layer_scale=True),
     "it is one of mmpretrain's DeiT3 / EfficientFormer / HorNet, which "
     'MoPPAVisionTransformer does not stand in for: keep that type'),
    (lambda: MoPPAVisionTransformer(arch=VIT, zzz=1), 'zzz is not an argument of '
     "MoPPAVisionTransformer (nor of mmpretrain's VisionTransformer): remove it"),
    (lambda: MoPPAVisionTransformer(arch=VIT, layer_cfgs=[{}, dict(num_fcs=3)]),
     "layer_cfgs = [{}, {'num_fcs': 3}]: MoPPA's scale & shift runs in the two-layer FFN"),
])
def test_an_argument_neither_class_takes_is_one_line_before_any_weight(build, message):
    with parameters_built() as built, pytest.raises(InputValueError) as info:
        build()
    assert str(info.value).endswith(message) or message in str(info.value)
    assert '\n' not in str(info.value) and built == []


def test_mmseg_vit_refuses_another_ffn():
    from moppa_mm.models.backbones.moppa_vit_seg import MoPPAVisionTransformerSeg
    with pytest.raises(InputValueError, match=r'model.backbone.num_fcs = 3: MoPPA.s scale '):
        MoPPAVisionTransformerSeg(img_size=32, patch_size=8, embed_dims=32, num_layers=2,
                                  num_heads=4, num_fcs=3)


@pytest.mark.parametrize('build, frozen', [
    (lambda: MoPPASwinTransformer(**SWIN, window_size=7, out_indices=(0, 1),
                                  frozen_stages=1, random_base=True),
     ('patch_embed.', 'stages.0.', 'norm0.')),
    (lambda: MoPPASwinTransformerCls(arch=SWIN, img_size=56, window_size=7, out_indices=(1, ),
                                     frozen_stages=0, random_base=True),
     ('patch_embed.', 'stages.0.')),
])
def test_frozen_stages_freeze_their_adapters_when_built(build, frozen):
    """The Swins freeze ``frozen_stages`` at every ``train()``; their adapters
    are frozen from the build on, so the trainable set DDP sees is final."""
    model = build()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter_key(n) and not n.startswith(frozen) for n in trainable)
    assert any(n.startswith('stages.1.') for n in trainable)
    model.train()
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    model(torch.randn(1, 3, 56, 56))
