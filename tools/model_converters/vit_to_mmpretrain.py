"""Convert a pre-trained ViT or Swin checkpoint into mmpretrain's keys for MoPPA configs.

    python tools/model_converters/vit_to_mmpretrain.py SOURCE SRC DST

    SOURCE  SRC (local file)                        DST (e.g.)
    jax     ViT-B_16-augreg.npz (or ViT-L_16.npz)   vit-b16_in21k-augreg.pth
    mae     mae_pretrain_vit_base.pth               vit-b16_mae.pth
    mocov3  vit-b-300ep.pth.tar                     vit-b16_mocov3.pth
    swin    swin_base_patch4_window7_224_22k.pth    swin-b-p4-w7_in21k.pth

The output loads with ``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``.
Sources: the JAX/timm ImageNet-21K ``.npz`` (AugReg or the original), MAE
(``{'model': ...}``, timm names), MoCo v3 (``module.base_encoder.``) and the
official Swin release (``{'model': {'layers.*'...}}``). From Python (``tools/``
on the path): ``from model_converters.vit_to_mmpretrain import convert, save_backbone``.
"""
import argparse
import os.path as osp
import re
import zipfile
from collections import OrderedDict
from typing import Dict, Mapping

import numpy as np
import torch

from moppa_mm.utils.atomic import atomic_torch_save
from moppa_mm.utils.checkpoints import (CheckpointLoadError, check_finite, is_npz,
                                        load_checkpoint_file)
from moppa_mm.utils.release_formats import (LOOKS_LIKE, SourceFormatError, convert_command,
                                            identify)

# timm block names -> mmpretrain layer names
TIMM_TO_MMPRETRAIN = OrderedDict([
    (r'^cls_token$', 'cls_token'),
    (r'^pos_embed$', 'pos_embed'),
    (r'^patch_embed\.proj\.(weight|bias)$', r'patch_embed.projection.\1'),
    (r'^blocks\.(\d+)\.norm1\.(weight|bias)$', r'layers.\1.ln1.\2'),
    (r'^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$', r'layers.\1.attn.qkv.\2'),
    (r'^blocks\.(\d+)\.attn\.proj\.(weight|bias)$', r'layers.\1.attn.proj.\2'),
    (r'^blocks\.(\d+)\.norm2\.(weight|bias)$', r'layers.\1.ln2.\2'),
    (r'^blocks\.(\d+)\.mlp\.fc1\.(weight|bias)$', r'layers.\1.ffn.layers.0.0.\2'),
    (r'^blocks\.(\d+)\.mlp\.fc2\.(weight|bias)$', r'layers.\1.ffn.layers.1.\2'),
    (r'^norm\.(weight|bias)$', r'ln1.\1'),
])
# keys of the sources that are not part of the backbone
TIMM_IGNORED = (r'^head\.', r'^fc_norm\.', r'^decoder', r'^mask_token$',
                r'^pre_logits')


def timm_vit_to_mmpretrain(state: Mapping[str, torch.Tensor]
                           ) -> 'OrderedDict[str, torch.Tensor]':
    """timm ViT names (MAE, MoCo v3 after its prefix) -> mmpretrain names."""
    converted = OrderedDict()
    for key, value in state.items():
        for pattern, target in TIMM_TO_MMPRETRAIN.items():
            if re.match(pattern, key):
                converted[re.sub(pattern, target, key)] = value
                break
        else:
            if not any(re.match(p, key) for p in TIMM_IGNORED):
                raise KeyError(f'unexpected key {key!r} in a timm ViT checkpoint')
    return converted


def mae_to_mmpretrain(checkpoint: Mapping) -> 'OrderedDict[str, torch.Tensor]':
    """MAE pre-train checkpoint ``{'model': {timm keys, decoder_*}}``."""
    state = checkpoint.get('model', checkpoint)
    return timm_vit_to_mmpretrain(state)


def mocov3_to_mmpretrain(checkpoint: Mapping) -> 'OrderedDict[str, torch.Tensor]':
    """MoCo v3 ``{'state_dict': {'module.base_encoder.<timm key>': ...}}``;
    the momentum encoder and the predictor are dropped."""
    state = checkpoint.get('state_dict', checkpoint)
    prefix = 'module.base_encoder.'
    encoder = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not encoder:
        raise KeyError(f'no {prefix!r} keys: not a MoCo v3 checkpoint')
    return timm_vit_to_mmpretrain(encoder)


def _jax(params: Mapping[str, np.ndarray], key: str) -> torch.Tensor:
    if key not in params:
        raise KeyError(f'missing {key!r} in the JAX checkpoint')
    return torch.from_numpy(np.asarray(params[key]).copy())


def jax_vit_to_mmpretrain(params: Mapping[str, np.ndarray]
                          ) -> 'OrderedDict[str, torch.Tensor]':
    """JAX/Flax ViT (``np.load`` of the AugReg ``.npz``) -> mmpretrain names.

    Kernels are (in, out) in JAX and (out, in) in PyTorch; the patch embedding
    is HWIO; attention kernels are split per head and fused here into qkv.
    """
    out = OrderedDict()
    out['cls_token'] = _jax(params, 'cls')  # (1, 1, C)
    out['pos_embed'] = _jax(params, 'Transformer/posembed_input/pos_embedding')
    out['patch_embed.projection.weight'] = _jax(
        params, 'embedding/kernel').permute(3, 2, 0, 1)  # HWIO -> OIHW
    out['patch_embed.projection.bias'] = _jax(params, 'embedding/bias')
    num_layers = len({m.group(1) for k in params
                      for m in [re.match(r'Transformer/encoderblock_(\d+)/', k)] if m})
    for i in range(num_layers):
        block = f'Transformer/encoderblock_{i}/'
        attn = block + 'MultiHeadDotProductAttention_1/'
        to = f'layers.{i}.'
        out[to + 'ln1.weight'] = _jax(params, block + 'LayerNorm_0/scale')
        out[to + 'ln1.bias'] = _jax(params, block + 'LayerNorm_0/bias')
        qkv_w, qkv_b = [], []
        for name in ('query', 'key', 'value'):
            kernel = _jax(params, f'{attn}{name}/kernel')  # (C, heads, head_dims)
            qkv_w.append(kernel.flatten(1).t())  # (C_out, C_in)
            qkv_b.append(_jax(params, f'{attn}{name}/bias').flatten())
        out[to + 'attn.qkv.weight'] = torch.cat(qkv_w, 0)
        out[to + 'attn.qkv.bias'] = torch.cat(qkv_b, 0)
        out_kernel = _jax(params, attn + 'out/kernel')  # (heads, head_dims, C)
        out[to + 'attn.proj.weight'] = out_kernel.flatten(0, 1).t()
        out[to + 'attn.proj.bias'] = _jax(params, attn + 'out/bias')
        out[to + 'ln2.weight'] = _jax(params, block + 'LayerNorm_2/scale')
        out[to + 'ln2.bias'] = _jax(params, block + 'LayerNorm_2/bias')
        for j, target in ((0, 'ffn.layers.0.0'), (1, 'ffn.layers.1')):
            out[f'{to}{target}.weight'] = _jax(
                params, f'{block}MlpBlock_3/Dense_{j}/kernel').t()
            out[f'{to}{target}.bias'] = _jax(params, f'{block}MlpBlock_3/Dense_{j}/bias')
    out['ln1.weight'] = _jax(params, 'Transformer/encoder_norm/scale')
    out['ln1.bias'] = _jax(params, 'Transformer/encoder_norm/bias')
    return out


def swin_to_mmpretrain(checkpoint: Mapping) -> 'OrderedDict[str, torch.Tensor]':
    """Official Swin release (``{'model': {'layers.*', 'patch_embed.proj.*',
    'norm.*', 'head.*'}}``) -> mmpretrain ``SwinTransformer`` names: mmdet's
    ``swin_converter`` renames and reorders the patch merging into
    ``nn.Unfold``'s channel order (mmpretrain's too); the final ``norm``
    becomes ``norm<last stage>``; the head and the ``attn_mask`` buffers
    (recomputed by the model) are dropped."""
    from mmdet.models.backbones.swin import swin_converter
    state = checkpoint.get('model', checkpoint)
    stages = {m.group(1) for k in state for m in [re.match(r'layers\.(\d+)\.', k)] if m}
    if not stages or 'patch_embed.proj.weight' not in state:
        raise KeyError('not an official Swin release checkpoint: expected '
                       "'layers.<i>.*' and 'patch_embed.proj.weight' keys, got "
                       f'{sorted(state)[:5]}')
    last_norm = f'norm{max(int(i) for i in stages)}.'
    converted = OrderedDict()
    for key, value in swin_converter(state).items():  # 'backbone.' + key
        key = key[len('backbone.'):]
        if key.endswith('attn_mask'):
            continue
        converted[re.sub(r'^norm\.', last_norm, key)] = value
    return converted


CONVERTERS = {'jax': jax_vit_to_mmpretrain, 'mae': mae_to_mmpretrain,
              'mocov3': mocov3_to_mmpretrain, 'swin': swin_to_mmpretrain}


def _what_to_do(found: str, path: str) -> str:
    if found == 'converted':
        return 'It needs no conversion: use it as model.backbone.init_cfg.checkpoint.'
    return f'Convert it with `{convert_command(found, path)}`.'


def _load_npz(path: str) -> Dict[str, np.ndarray]:
    """Arrays of an ``.npz`` without unpickling anything; a PyTorch
    checkpoint given instead is named with what it looks like."""
    if osp.getsize(path) == 0:
        raise CheckpointLoadError(f'source checkpoint {path!r} is empty (0 bytes)')
    if not is_npz(path):
        try:
            found = identify(load_checkpoint_file(path, what='source checkpoint'))
        except RuntimeError:  # no PyTorch checkpoint either: the .npz reader says so
            pass
        else:
            looks = f'; it looks like {LOOKS_LIKE[found]}. {_what_to_do(found, path)}' \
                if found not in (None, 'jax') else '.'
            raise SourceFormatError(
                f'source checkpoint {path!r} is a PyTorch checkpoint, not a JAX .npz '
                f'(the jax converter reads the AugReg / ViT-L .npz releases){looks}')
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointLoadError(
            f'source checkpoint {path!r} is not a readable .npz of plain arrays '
            f'(pickled objects are refused; truncated?): {error}') from error
    check_finite(arrays, f'source checkpoint {path!r}')
    return arrays


def load_source(path: str, source: str):
    """Read a source checkpoint from a local path, never unpickling objects
    (``.pth`` with ``weights_only=True``, ``.npz`` with ``allow_pickle=False``)."""
    if source not in CONVERTERS:
        raise ValueError(f'unknown source format {source!r}, expected one of '
                         f'{tuple(CONVERTERS)}')
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}')
    if source == 'jax':
        return _load_npz(path)
    return load_checkpoint_file(path, what='source checkpoint')


def convert(path: str, source: str) -> 'OrderedDict[str, torch.Tensor]':
    """Read ``path`` (a ``source`` release) and convert it; a file that
    looks like another format (or is already converted) is refused with what
    it is and what to do."""
    params = load_source(path, source)  # validates the format and the path
    found = identify(params)
    if found not in (None, source):
        raise SourceFormatError(
            f'source checkpoint {path!r} is {LOOKS_LIKE[found]}, not a {source} '
            f'checkpoint. {_what_to_do(found, path)}')
    return CONVERTERS[source](params)


def save_backbone(state: Dict[str, torch.Tensor], path: str, source: str = '') -> str:
    atomic_torch_save(  # temporary file, fsync, rename: never a partial file
        {'state_dict': OrderedDict(('backbone.' + k, v) for k, v in state.items()),
         'meta': {'converted_from': source}}, path, what='converted checkpoint')
    return path


def plain_to_lora_keys(state: Mapping[str, torch.Tensor],
                       lora_module: torch.nn.Module) -> 'OrderedDict[str, torch.Tensor]':
    """A plain backbone state dict under the names of ``lora_module``
    (``LoRAModel.module``), whose wrapped Linears keep their weights under
    ``<name>.original_layer``; load it with ``strict=False`` (no LoRA factors).
    Configs need none of this: ``LoRAModel`` inits its module before wrapping."""
    wrapped = {name for name, m in lora_module.named_modules() if hasattr(m, 'original_layer')}
    renamed = OrderedDict()
    for key, value in state.items():
        owner, _, leaf = key.rpartition('.')
        renamed[f'{owner}.original_layer.{leaf}' if owner in wrapped else key] = value
    return renamed


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('source', choices=tuple(CONVERTERS), help='source format')
    parser.add_argument('src', help='local source checkpoint')
    parser.add_argument('dst', help='output .pth')
    args = parser.parse_args()
    state = convert(args.src, args.source)
    save_backbone(state, args.dst, source=f'{args.source}:{args.src}')
    print(f'{len(state)} tensors -> {args.dst}')


if __name__ == '__main__':
    main()
