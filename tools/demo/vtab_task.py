"""The classification quick-start's inputs: a small VTAB-1K-format task
(coloured noise images whose colour encodes the class, in the VPT/NOAH layout)
and a small ViT "pre-trained" checkpoint in the official MAE release format
(``{'model': {timm keys}}``), which ``tools/model_converters/vit_to_mmpretrain.py
mae`` converts like the real one. Nothing is downloaded.

    python tools/demo/vtab_task.py --root data/vtab_demo
"""
import os
import os.path as osp
from typing import Dict, Mapping

import cv2
import numpy as np
import torch

from moppa_mm.datasets.vtab import VTAB_TASKS

DEMO_TASK = 'eurosat'  # 10 classes
DEMO_VIT = dict(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                          feedforward_channels=64), img_size=32, patch_size=8)


def make_vtab_task(root: str, task: str = DEMO_TASK,
                   split_sizes: Mapping[str, int] = (('train800val200', 40),
                                                     ('test', 20)),
                   size: int = 32, seed: int = 0) -> str:
    """Write ``<root>/<task>/{split}.txt`` and ``images/<split>/*.jpg``; returns
    the task folder. Image ``i`` has label ``i % classes``; its colour channel
    ``label % 3`` is lifted by an amount that grows with the label (learnable)."""
    if task not in VTAB_TASKS:
        raise ValueError(f'unknown VTAB-1K task {task!r}')
    classes = VTAB_TASKS[task]
    rng = np.random.default_rng(seed)
    for split, count in dict(split_sizes).items():
        os.makedirs(osp.join(root, task, 'images', split), exist_ok=True)
        lines = []
        for index in range(count):
            label = index % classes
            img = rng.integers(0, 40, (size, size, 3)).astype(np.uint8)
            img[:, :, label % 3] += np.uint8(40 + 200 * label // classes)
            name = f'images/{split}/{index:06d}.jpg'
            cv2.imwrite(osp.join(root, task, name), img)
            lines.append(f'{name} {label}')
        with open(osp.join(root, task, f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
    return osp.join(root, task)


def mmpretrain_vit_to_timm(state: Mapping[str, torch.Tensor]
                           ) -> Dict[str, torch.Tensor]:
    """mmpretrain ``VisionTransformer`` keys -> the timm keys of the official
    MAE / MoCo v3 releases (the inverse of model_converters/vit_to_mmpretrain.py)."""
    renames = (('patch_embed.projection.', 'patch_embed.proj.'), ('.ln1.', '.norm1.'),
               ('.ln2.', '.norm2.'), ('.ffn.layers.0.0.', '.mlp.fc1.'),
               ('.ffn.layers.1.', '.mlp.fc2.'))
    timm = {}
    for key, value in state.items():
        name = key
        if name.startswith('layers.'):
            name = 'blocks.' + name[len('layers.'):]
        elif name.startswith('ln1.'):
            name = 'norm.' + name[len('ln1.'):]
        for old, new in renames:
            name = name.replace(old, new)
        timm[name] = value
    return timm


def make_mae_vit_checkpoint(path: str, seed: int = 0, **vit_kwargs) -> str:
    """Save a randomly initialised mmpretrain ``VisionTransformer`` (``DEMO_VIT``
    by default) as an official MAE pre-train checkpoint, decoder keys included."""
    from mmpretrain.models.backbones import VisionTransformer
    torch.manual_seed(seed)
    vit = VisionTransformer(**(vit_kwargs or DEMO_VIT))
    with torch.no_grad():  # what init_weights does to them, without its log
        vit.pos_embed.normal_(0, 0.02)
        vit.cls_token.normal_(0, 0.02)
    state = mmpretrain_vit_to_timm(vit.state_dict())
    dims = vit.embed_dims
    state.update(mask_token=torch.zeros(1, 1, dims),
                 **{'decoder_embed.weight': torch.zeros(dims // 2, dims)})
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    torch.save({'model': state}, path)
    return path


def prepare_cls_demo(root: str = 'data/vtab_demo', size: int = 32) -> Dict[str, str]:
    """The task folder and the MAE-format checkpoint the demo config reads
    (after conversion to ``<root>/vit_demo_mmpretrain.pth``)."""
    return dict(task=make_vtab_task(root, size=size),
                mae_checkpoint=make_mae_vit_checkpoint(
                    osp.join(root, 'mae_pretrain_vit_demo.pth')))


if __name__ == '__main__':
    import argparse
    parser = argparse.ArgumentParser(description=prepare_cls_demo.__doc__)
    parser.add_argument('--root', default='data/vtab_demo')
    args = parser.parse_args()
    print(prepare_cls_demo(args.root))
