"""The MoPPA Swin in mmpretrain's registry: in an ImageClassifier, official
release checkpoints through the ``swin`` converter, the switches, the budget."""
import inspect

import pytest
import torch
from mmengine.runner import load_checkpoint, save_checkpoint
from mmdet.registry import MODELS as DET_MODELS
from mmpretrain.models.backbones import SwinTransformer
from mmpretrain.registry import MODELS

from moppa_mm.datasets import VTAB_TASKS
from demo.coco_shapes import mmdet_swin_to_official
from moppa_mm.models import MoPPASwinTransformer, MoPPASwinTransformerCls
from moppa_mm.models.backbones.adapter_params import is_adapter_key, parameter_breakdown
from moppa_mm.models.backbones.adapter_params import parameter_report
from moppa_mm.models.backbones.load_check import PretrainedMismatchError
from moppa_mm.models.backbones.swin_adapters import SwinAdapterMixin
from model_converters.vit_to_mmpretrain import convert, save_backbone, swin_to_mmpretrain
from moppa_mm.models import full_state_dict

ARCH = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4))
TINY = dict(arch=ARCH, img_size=56, window_size=7, out_indices=(1, ))


def plain_swin():
    torch.manual_seed(0)
    plain = SwinTransformer(**TINY)
    with torch.no_grad():
        for param in plain.parameters():
            param.normal_(std=0.1)
    plain.eval()  # mmpretrain's Swin.train() returns None
    return plain


def official_release(plain):
    """An official Swin release file's content: ``norm`` (not ``norm1``),
    ``layers.*`` with the release's patch-merging order, a 21K head and the
    ``attn_mask`` buffers of shifted blocks."""
    state = {('norm.' + k[len('norm1.'):] if k.startswith('norm1.') else k): v
             for k, v in plain.state_dict().items()}
    official = mmdet_swin_to_official(state)
    official['head.weight'] = torch.zeros(21841, 32)
    official['head.bias'] = torch.zeros(21841)
    official['layers.0.blocks.1.attn_mask'] = torch.zeros(4, 49, 49)
    return {'model': official}


def test_registered_in_mmpretrain_under_the_detection_name():
    assert MODELS.get('MoPPASwinTransformer') is MoPPASwinTransformerCls
    assert DET_MODELS.get('MoPPASwinTransformer') is MoPPASwinTransformer


@pytest.mark.parametrize('cls, conv_adapter, scale_shift', [
    (MoPPASwinTransformerCls, False, True), (MoPPASwinTransformer, True, False)])
def test_each_registration_passes_its_defaults(cls, conv_adapter, scale_shift):
    """One implementation (the mixin: the detector's defaults); the
    classifier's class statement has its own defaults in its signature
    (``help()``), and a model built without the switches has them."""
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    assert (defaults['use_conv_adapter'], defaults['use_scale_shift']) == (
        conv_adapter, scale_shift)
    shared = {k: p.default for k, p in inspect.signature(SwinAdapterMixin).parameters.items()}
    assert shared['moppa_scope'] == 'window' and shared['random_base'] is False
    kwargs = TINY if cls is MoPPASwinTransformerCls else dict(**ARCH, out_indices=(0, 1))
    model = cls(**kwargs)
    assert (model.use_conv_adapter, model.use_scale_shift) == (conv_adapter, scale_shift)
    assert any('conv_adapter' in n for n, _ in model.named_parameters()) == conv_adapter


def test_trains_a_step_in_an_image_classifier():
    classifier = MODELS.build(dict(
        _scope_='mmpretrain',  # whatever default scope an earlier test left current
        type='ImageClassifier',
        backbone=dict(type='MoPPASwinTransformer', **TINY, random_base=True),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=5, in_channels=32,
                  loss=dict(type='CrossEntropyLoss')),
        data_preprocessor=dict(type='ClsDataPreprocessor', num_classes=5)))
    assert isinstance(classifier.backbone, MoPPASwinTransformerCls)
    classifier.init_weights()
    trainable = {n for n, p in classifier.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith('head.') or is_adapter_key(n[len('backbone.'):])
                             for n in trainable)
    assert any('.moppa.' in n for n in trainable) and any('ssf_' in n for n in trainable)
    from mmpretrain.structures import DataSample
    data = dict(inputs=[torch.randint(0, 255, (3, 56, 56), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[DataSample().set_gt_label(i) for i in (1, 3)])
    optimizer = torch.optim.SGD([p for p in classifier.parameters() if p.requires_grad],
                                lr=0.1)
    before = {n: p.detach().clone() for n, p in classifier.named_parameters()}
    losses = classifier(**classifier.data_preprocessor(data, True), mode='loss')
    losses['loss'].backward()
    optimizer.step()
    assert torch.isfinite(losses['loss'])
    changed = {n for n, p in classifier.named_parameters()
               if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert any('.ssf_' in n for n in changed) and 'head.fc.weight' in changed


def test_official_release_loads_through_the_swin_converter(tmp_path):
    plain = plain_swin()
    source = tmp_path / 'swin_base_patch4_window7_224_22k.pth'
    torch.save(official_release(plain), source)
    converted = convert(str(source), 'swin')
    assert 'norm1.weight' in converted and 'head.weight' not in converted
    assert not any(k.endswith('attn_mask') for k in converted)
    path = save_backbone(converted, str(tmp_path / 'swin_mmpretrain.pth'), 'swin')
    model = MoPPASwinTransformerCls(**TINY, init_cfg=dict(
        type='Pretrained', checkpoint=path, prefix='backbone.'))
    model.init_weights()  # the state-dict check: every base parameter restored
    own = full_state_dict(model)
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(own[key], value, msg=key)
    # the patch-merging order too: with the adapters off, the plain Swin's output
    model.eval()
    model.adapters_enabled = False
    image = torch.randn(1, 3, 56, 56)
    torch.testing.assert_close(model(image)[0], plain(image)[0])


def test_state_dict_check_names_a_release_without_its_final_norm(tmp_path):
    release = official_release(plain_swin())
    del release['model']['norm.weight']
    path = save_backbone(swin_to_mmpretrain(release), str(tmp_path / 'x.pth'))
    with pytest.raises(PretrainedMismatchError, match='missing: norm1.weight'):
        MoPPASwinTransformerCls(**TINY, init_cfg=dict(  # loads its base when built
            type='Pretrained', checkpoint=path, prefix='backbone.'))


def before_version_3(plain):
    """``plain``'s state as mmpretrain's Swin saved it before its version 3:
    the final norm as ``norm.``, an ``attn_mask`` buffer, metadata version 1."""
    state = plain.state_dict()
    for key in [k for k in state if k.startswith('norm1.')]:  # the last of 2 stages
        state['norm.' + key[len('norm1.'):]] = state.pop(key)
    state['stages.0.blocks.1.attn.attn_mask'] = torch.zeros(4, 49, 49)
    state._metadata['']['version'] = 1
    return state


def test_checkpoints_from_before_mmpretrain_swin_version_3_load(tmp_path):
    """They load into the subclass as into mmpretrain's own Swin (which
    converts them only for its own class): alone, strictly, and as the base
    of a config (a whole model's, under its ``backbone.`` prefix, without
    metadata: older still)."""
    plain = plain_swin()
    old = str(tmp_path / 'v1.pth')
    save_checkpoint(before_version_3(plain), old)
    whole = str(tmp_path / 'classifier.pth')
    torch.save({'state_dict': {'backbone.' + k: v
                               for k, v in before_version_3(plain).items()}}, whole)
    alone = MoPPASwinTransformerCls(**TINY, random_base=True)
    load_checkpoint(alone, old, strict=True)
    for model in (alone,
                  MoPPASwinTransformerCls(**TINY, init_cfg=dict(type='Pretrained',
                                                                checkpoint=old)),
                  MoPPASwinTransformerCls(**TINY, init_cfg=dict(
                      type='Pretrained', checkpoint=whole, prefix='backbone.'))):
        own = model.state_dict()
        for key, value in plain.state_dict().items():
            torch.testing.assert_close(own[key], value, atol=0, rtol=0, msg=key)


def test_swin_converter_rejects_other_files():
    with pytest.raises(KeyError, match='not an official Swin release'):
        swin_to_mmpretrain({'state_dict': {'backbone.stages.0.x': torch.zeros(1)}})


def test_without_moppa_keeps_the_other_adapters():
    model = MoPPASwinTransformerCls(**TINY, use_moppa=False, use_conv_adapter=True)
    names = [n for n, _ in model.named_parameters()]
    assert not any('moppa' in n for n in names)
    assert any('conv_adapter' in n for n in names) and any('ssf_' in n for n in names)
    plain = plain_swin()
    model.load_state_dict(plain.state_dict(), strict=False)
    model.eval()
    model.adapters_enabled = False
    image = torch.randn(1, 3, 56, 56)
    torch.testing.assert_close(model(image)[0], plain(image)[0])


def test_swin_b_vtab_budget():
    """Swin-B, window 7: MoPPA units + scale & shift, and the VTAB-1K head
    (mean over the 19 tasks) against the paper's 0.39M."""
    model = MoPPASwinTransformerCls(arch='b', img_size=224, window_size=7)
    counts = parameter_breakdown(model)
    print('\n' + parameter_report(model))
    depths, heads, dims = [2, 2, 18, 2], [4, 8, 16, 32], [128, 256, 512, 1024]
    assert counts['moppa']['trainable'] == sum(
        d * (3 * (49 * n + c // n) + 3)  # init_mode='paper': no gate
        for d, n, c in zip(depths, heads, dims))
    # value + output projection + fc1 (4C) + fc2, scale and shift; patch embedding
    assert counts['scale_shift']['trainable'] == 2 * (
        sum(d * 7 * c for d, c in zip(depths, dims)) + 128)
    assert counts['conv_adapter']['total'] == 0
    assert counts['pretrained']['trainable'] == 0
    head = 1025 * sum(VTAB_TASKS.values()) / len(VTAB_TASKS)
    with_head = counts['total']['trainable'] + head
    print(f'trainable with the VTAB head: {with_head / 1e6:.3f}M (paper 0.39M)')
    assert round(with_head / 1e6, 2) == 0.28
