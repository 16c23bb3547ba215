"""Each converter: a small checkpoint in the source format (same key scheme,
tiny dims), converted and loaded into the MoPPA ViT with nothing unexpected and
nothing missing but adapters; real key names checked against a listed mapping.
A plain ViT state dict loads into mmpretrain's LoRAModel through
``plain_to_lora_keys``."""
import numpy as np
import pytest
import torch
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.peft import LoRAModel

from model_converters.vit_to_mmpretrain import (convert, jax_vit_to_mmpretrain,
                                                mae_to_mmpretrain, mocov3_to_mmpretrain,
                                                plain_to_lora_keys, save_backbone)
from moppa_mm.models import MoPPAVisionTransformer, full_state_dict
from moppa_mm.utils.checkpoints import CheckpointLoadError
from moppa_mm.utils.release_formats import SourceFormatError

ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
TINY = dict(arch=ARCH, img_size=32, patch_size=8)

# real key names of the sources -> mmpretrain names (checked one by one)
LISTED_TIMM = {
    'cls_token': 'cls_token',
    'pos_embed': 'pos_embed',
    'patch_embed.proj.weight': 'patch_embed.projection.weight',
    'blocks.0.norm1.weight': 'layers.0.ln1.weight',
    'blocks.0.attn.qkv.weight': 'layers.0.attn.qkv.weight',
    'blocks.0.attn.proj.bias': 'layers.0.attn.proj.bias',
    'blocks.1.norm2.bias': 'layers.1.ln2.bias',
    'blocks.1.mlp.fc1.weight': 'layers.1.ffn.layers.0.0.weight',
    'blocks.1.mlp.fc2.bias': 'layers.1.ffn.layers.1.bias',
    'norm.weight': 'ln1.weight',
}


def reference_vit(**tiny):
    torch.manual_seed(0)
    vit = VisionTransformer(**(tiny or TINY))
    with torch.no_grad():
        for p in vit.parameters():
            p.normal_()
    return vit.state_dict()


def to_timm(state):
    """mmpretrain -> timm names, written independently of the converter."""
    inverse = {}
    for key, value in state.items():
        name = key.replace('patch_embed.projection', 'patch_embed.proj')
        name = name.replace('layers.', 'blocks.', 1) if name.startswith('layers.') else name
        name = name.replace('.ln1.', '.norm1.').replace('.ln2.', '.norm2.')
        name = name.replace('.ffn.layers.0.0.', '.mlp.fc1.').replace('.ffn.layers.1.', '.mlp.fc2.')
        if name.startswith('ln1.'):
            name = 'norm.' + name[4:]
        inverse[name] = value
    return inverse


def to_jax(state, heads=4, num_layers=ARCH['num_layers']):
    """mmpretrain -> Flax AugReg names and layouts, written independently."""
    dims = ARCH['embed_dims']
    head_dims = dims // heads
    npz = {
        'cls': state['cls_token'].numpy(),
        'Transformer/posembed_input/pos_embedding': state['pos_embed'].numpy(),
        'embedding/kernel': state['patch_embed.projection.weight'].permute(2, 3, 1, 0).numpy(),
        'embedding/bias': state['patch_embed.projection.bias'].numpy(),
        'Transformer/encoder_norm/scale': state['ln1.weight'].numpy(),
        'Transformer/encoder_norm/bias': state['ln1.bias'].numpy(),
        'head/kernel': np.zeros((dims, 10)), 'head/bias': np.zeros(10),
    }
    for i in range(num_layers):
        b, to = f'Transformer/encoderblock_{i}/', f'layers.{i}.'
        npz[b + 'LayerNorm_0/scale'] = state[to + 'ln1.weight'].numpy()
        npz[b + 'LayerNorm_0/bias'] = state[to + 'ln1.bias'].numpy()
        npz[b + 'LayerNorm_2/scale'] = state[to + 'ln2.weight'].numpy()
        npz[b + 'LayerNorm_2/bias'] = state[to + 'ln2.bias'].numpy()
        q, k, v = state[to + 'attn.qkv.weight'].chunk(3, 0)
        qb, kb, vb = state[to + 'attn.qkv.bias'].chunk(3, 0)
        for name, w, bias in (('query', q, qb), ('key', k, kb), ('value', v, vb)):
            a = b + f'MultiHeadDotProductAttention_1/{name}/'
            npz[a + 'kernel'] = w.t().reshape(dims, heads, head_dims).numpy()
            npz[a + 'bias'] = bias.reshape(heads, head_dims).numpy()
        a = b + 'MultiHeadDotProductAttention_1/out/'
        proj = state[to + 'attn.proj.weight']  # (C_out, C_in)
        npz[a + 'kernel'] = proj.t().reshape(heads, head_dims, dims).numpy()
        npz[a + 'bias'] = state[to + 'attn.proj.bias'].numpy()
        for j, name in ((0, 'ffn.layers.0.0'), (1, 'ffn.layers.1')):
            npz[b + f'MlpBlock_3/Dense_{j}/kernel'] = state[f'{to}{name}.weight'].t().numpy()
            npz[b + f'MlpBlock_3/Dense_{j}/bias'] = state[f'{to}{name}.bias'].numpy()
    return npz


def assert_loads_exactly(converted, reference, **tiny):
    model = MoPPAVisionTransformer(**(tiny or TINY))
    missing, unexpected = model.load_state_dict(converted, strict=False)
    assert unexpected == []
    assert missing == [], missing  # a base: the adapters keep their values
    for key, value in reference.items():
        torch.testing.assert_close(model.state_dict()[key], value, msg=key)


def test_listed_timm_names_map_as_documented():
    state = {k: torch.zeros(1) for k in LISTED_TIMM}
    converted = mae_to_mmpretrain({'model': state})
    assert dict(zip(state, converted)) == LISTED_TIMM


def test_jax_listed_names():
    reference = reference_vit()
    npz = to_jax(reference)
    converted = jax_vit_to_mmpretrain(npz)
    q = npz['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel']
    torch.testing.assert_close(converted['layers.0.attn.qkv.weight'][:32],
                               torch.from_numpy(q.reshape(32, 32).T.copy()))


def test_jax_augreg_npz(tmp_path):
    reference = reference_vit()
    path = tmp_path / 'ViT-B_16-augreg.npz'
    np.savez(path, **to_jax(reference))
    assert_loads_exactly(convert(str(path), 'jax'), reference)


def test_jax_vit_l_release_layout(tmp_path):
    """The original ImageNet-21K ViT-L/16 file (``ViT-L_16.npz``): the same
    names as ViT-B, 24 blocks (two-digit block indices), a ``pre_logits``
    representation layer and a 21K head, which the backbone does not use.
    Tested at the tests' tiny width with 12 blocks."""
    tiny = dict(TINY, arch=dict(ARCH, num_layers=12))
    reference = reference_vit(**tiny)
    npz = to_jax(reference, num_layers=12)
    dims = ARCH['embed_dims']
    npz.update({'pre_logits/kernel': np.zeros((dims, dims)),
                'pre_logits/bias': np.zeros(dims),
                'head/kernel': np.zeros((dims, 21843)), 'head/bias': np.zeros(21843)})
    path = tmp_path / 'ViT-L_16.npz'
    np.savez(path, **npz)
    converted = convert(str(path), 'jax')
    assert 'layers.11.attn.qkv.weight' in converted and 'layers.12.ln1.weight' not in converted
    assert_loads_exactly(converted, reference, **tiny)


def test_mae_pretrain_checkpoint(tmp_path):
    reference = reference_vit()
    state = to_timm(reference)
    state.update({'mask_token': torch.zeros(1, 1, 32),
                  'decoder_embed.weight': torch.zeros(16, 32),
                  'decoder_blocks.0.norm1.weight': torch.zeros(16)})
    path = tmp_path / 'mae_pretrain_vit_base.pth'
    torch.save({'model': state}, path)
    assert_loads_exactly(convert(str(path), 'mae'), reference)


def test_mocov3_checkpoint(tmp_path):
    reference = reference_vit()
    state = {'module.base_encoder.' + k: v for k, v in to_timm(reference).items()}
    state.update({'module.base_encoder.head.0.weight': torch.zeros(8, 32),
                  'module.momentum_encoder.blocks.0.norm1.weight': torch.zeros(32),
                  'module.predictor.0.weight': torch.zeros(8, 8)})
    path = tmp_path / 'vit-b-300ep.pth.tar'
    torch.save({'state_dict': state, 'epoch': 300}, path)
    converted = convert(str(path), 'mocov3')
    assert_loads_exactly(converted, reference)
    # the saved file loads through the config path (init_cfg Pretrained, prefix)
    out = save_backbone(converted, str(tmp_path / 'converted.pth'), 'mocov3')
    model = MoPPAVisionTransformer(**TINY, init_cfg=dict(
        type='Pretrained', checkpoint=out, prefix='backbone.'))
    model.init_weights()
    state = full_state_dict(model)
    for key, value in reference.items():
        torch.testing.assert_close(state[key], value, msg=key)


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match='nowhere.npz'):
        convert(str(tmp_path / 'nowhere.npz'), 'jax')
    with pytest.raises(ValueError, match="unknown source format 'tf'"):
        convert('x', 'tf')
    with pytest.raises(KeyError, match='not a MoCo v3 checkpoint'):
        mocov3_to_mmpretrain({'state_dict': {'blocks.0.norm1.weight': torch.zeros(1)}})
    with pytest.raises(KeyError, match="unexpected key 'blocks.0.attn.qkv_lora'"):
        mae_to_mmpretrain({'model': {'blocks.0.attn.qkv_lora': torch.zeros(1)}})


def mae_file(tmp_path):
    path = tmp_path / 'mae_pretrain_vit_base.pth'
    torch.save({'model': to_timm(reference_vit())}, path)
    return str(path)


def test_jax_converter_given_a_pth_says_what_it_is(tmp_path):
    with pytest.raises(SourceFormatError) as error:
        convert(mae_file(tmp_path), 'jax')
    text = str(error.value)
    assert 'is a PyTorch checkpoint, not a JAX .npz' in text, text
    assert 'timm / MAE ViT' in text and 'vit_to_mmpretrain.py mae ' in text, text


def test_converting_a_converted_file_says_it_needs_none(tmp_path):
    converted = save_backbone(convert(mae_file(tmp_path), 'mae'), str(tmp_path / 'vit.pth'))
    for source in ('mae', 'mocov3', 'swin', 'jax'):
        with pytest.raises(SourceFormatError, match=r"already converted .*needs no conversion"):
            convert(converted, source)


def test_converter_of_another_release_names_the_right_one(tmp_path):
    with pytest.raises(SourceFormatError,
                       match=r"timm / MAE ViT checkpoint .*, not a mocov3 checkpoint\. "
                             r"Convert it with `python tools/model_converters/"
                             r"vit_to_mmpretrain.py mae .*mae_pretrain_vit_base.pth "
                             r".*mae_pretrain_vit_base_mmpretrain.pth`"):
        convert(mae_file(tmp_path), 'mocov3')


def test_non_finite_source_is_refused(tmp_path):
    npz = to_jax(reference_vit())
    npz['embedding/bias'][1] = np.nan
    np.savez(tmp_path / 'ViT.npz', **npz)
    with pytest.raises(CheckpointLoadError, match=r"ViT\.npz' .*embedding/bias \(1 of 32\)"):
        convert(str(tmp_path / 'ViT.npz'), 'jax')


def test_plain_vit_state_loads_into_lora_model():
    torch.manual_seed(0)
    plain = VisionTransformer(**TINY)
    plain.init_weights()
    lora = LoRAModel(module=dict(type='mmpretrain.VisionTransformer', **TINY),
                     alpha=2, rank=2, targets=[dict(type='qkv'), dict(type='proj')])
    plain.eval()  # (mmpretrain's ViT.train returns None: no chaining)
    lora.eval()
    state = plain_to_lora_keys(plain.state_dict(), lora.module)
    assert 'layers.0.attn.qkv.original_layer.weight' in state
    assert 'layers.0.attn.qkv.weight' not in state
    missing, unexpected = lora.module.load_state_dict(state, strict=False)
    assert not unexpected
    assert missing and all('lora_' in key for key in missing)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # LoRA starts at zero: the plain ViT's function
        torch.testing.assert_close(lora(x)[-1], plain(x)[-1])
