"""Swin checkpoints in the official release format (the inverse of mmdet's
``swin_converter``), for demos and tests that must exercise the real loading
path without downloading the official weights."""
from collections import OrderedDict
from typing import Dict

import torch


def _unfold_reduction_to_official(x: torch.Tensor) -> torch.Tensor:
    out_channels, in_channels = x.shape  # inverse of correct_unfold_reduction_order
    x = x.reshape(out_channels, in_channels // 4, 4).transpose(1, 2)
    return x[:, [0, 2, 1, 3], :].reshape(out_channels, in_channels)


def _unfold_norm_to_official(x: torch.Tensor) -> torch.Tensor:
    in_channels = x.shape[0]  # inverse of correct_unfold_norm_order
    x = x.reshape(in_channels // 4, 4).transpose(0, 1)
    return x[[0, 2, 1, 3], :].reshape(in_channels)


def mmdet_swin_to_official(state_dict: Dict[str, torch.Tensor]
                           ) -> 'OrderedDict[str, torch.Tensor]':
    """Keys (and unfold orders) of an mmdet ``SwinTransformer`` state dict, as
    the official Swin release names them (``layers.*``, ``attn.*``, ``mlp.*``,
    ``patch_embed.proj``). mmdet's ``swin_converter`` maps them back exactly."""
    official = OrderedDict()
    for key, value in state_dict.items():
        if key.startswith('stages'):
            new_key = key.replace('stages', 'layers', 1)
            if 'attn.w_msa.' in new_key:
                new_key = new_key.replace('attn.w_msa.', 'attn.')
            elif 'ffn.layers.0.0.' in new_key:
                new_key = new_key.replace('ffn.layers.0.0.', 'mlp.fc1.')
            elif 'ffn.layers.1.' in new_key:
                new_key = new_key.replace('ffn.layers.1.', 'mlp.fc2.')
            elif 'downsample.reduction.' in new_key:
                value = _unfold_reduction_to_official(value)
            elif 'downsample.norm.' in new_key:
                value = _unfold_norm_to_official(value)
        elif key.startswith('patch_embed.projection'):
            new_key = key.replace('projection', 'proj')
        else:
            new_key = key
        official[new_key] = value
    return official
