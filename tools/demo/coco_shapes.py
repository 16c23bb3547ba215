"""The quick-start's data: a small instance-segmentation set in COCO format
(coloured squares, circles and triangles) and a small Swin "pre-trained"
checkpoint in the official release format. Nothing is downloaded::

    python tools/demo/coco_shapes.py --root data/shapes_demo
"""
import json
import logging
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, Optional

import cv2
import numpy as np
import torch

CLASSES = ('square', 'circle', 'triangle')


def _shape_polygon(kind: str, cx: float, cy: float, r: float,
                   rng: np.random.Generator) -> np.ndarray:
    if kind == 'square':
        angle = rng.uniform(0, np.pi / 2)
        t = angle + np.arange(4) * np.pi / 2 + np.pi / 4
    elif kind == 'circle':
        t = np.linspace(0, 2 * np.pi, 24, endpoint=False)
    else:
        t = rng.uniform(0, 2 * np.pi) + np.arange(3) * 2 * np.pi / 3
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)  # (P, 2)


def _make_split(root: str, split: str, num_images: int, size: int,
                rng: np.random.Generator, start_id: int) -> dict:
    os.makedirs(osp.join(root, split), exist_ok=True)
    images, annotations = [], []
    ann_id = start_id
    for index in range(num_images):
        image_id = start_id + index
        background = rng.integers(0, 90, size=3)
        img = np.clip(background + rng.normal(0, 12, (size, size, 3)), 0,
                      255).astype(np.uint8)
        for _ in range(rng.integers(1, 4)):
            label = int(rng.integers(len(CLASSES)))
            r = rng.uniform(size * 0.1, size * 0.22)
            cx, cy = rng.uniform(r, size - r, size=2)
            poly = _shape_polygon(CLASSES[label], cx, cy, r, rng)
            color = [int(c) for c in rng.integers(120, 256, size=3)]
            mask = np.zeros((size, size), np.uint8)
            cv2.fillPoly(mask, [poly.round().astype(np.int32)], 1)
            img[mask.astype(bool)] = color
            ys, xs = np.nonzero(mask)
            if len(xs) == 0:
                continue
            x0, y0 = float(xs.min()), float(ys.min())
            annotations.append(dict(
                id=ann_id, image_id=image_id, category_id=label + 1,
                bbox=[x0, y0, float(xs.max()) + 1 - x0, float(ys.max()) + 1 - y0],
                area=float(mask.sum()), iscrowd=0,
                segmentation=[poly.reshape(-1).round(2).tolist()]))
            ann_id += 1
        file_name = f'{image_id:06d}.jpg'
        cv2.imwrite(osp.join(root, split, file_name), img)
        images.append(dict(id=image_id, file_name=file_name, height=size, width=size))
    return dict(images=images, annotations=annotations,
                categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])


def make_shapes_coco(root: str, num_train: int = 24, num_val: int = 8,
                     size: int = 128, seed: int = 0) -> Dict[str, str]:
    """Write ``{train,val}/*.jpg`` and ``annotations/{train,val}.json`` under
    ``root``; returns the annotation paths. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    paths = {}
    for split, count, start in (('train', num_train, 1), ('val', num_val, 100000)):
        coco = _make_split(root, split, count, size, rng, start)
        paths[split] = osp.join(root, 'annotations', f'{split}.json')
        with open(paths[split], 'w') as f:
            json.dump(coco, f)
    return paths


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


def make_swin_checkpoint(path: str, seed: int = 0, **swin_kwargs) -> str:
    """Save a randomly initialised mmdet ``SwinTransformer`` as an official-format
    checkpoint (``{'model': {layers.*: ...}}``), for ``convert_weights=True``."""
    from mmdet.models.backbones import SwinTransformer
    from mmengine.logging import MMLogger
    torch.manual_seed(seed)
    swin = SwinTransformer(**swin_kwargs)
    # random on purpose: without a checkpoint init_weights warns "No pre-trained weights";
    # MMLogger.setLevel clears every MMLogger's level cache (logging.disable does not)
    logger = MMLogger.get_current_instance()
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        swin.init_weights()
    finally:
        logger.setLevel(previous)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    torch.save({'model': mmdet_swin_to_official(swin.state_dict())}, path)
    return path


DEMO_SWIN = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                 window_size=7)


def prepare_demo(root: str = 'data/shapes_demo', num_train: int = 24,
                 num_val: int = 8, size: int = 128,
                 swin_kwargs: Optional[dict] = None) -> Dict[str, str]:
    """Everything the demo config reads: the data set and the backbone."""
    paths = make_shapes_coco(root, num_train, num_val, size)
    paths['pretrained'] = make_swin_checkpoint(
        osp.join(root, 'swin_demo_pretrained.pth'), **(swin_kwargs or DEMO_SWIN))
    return paths


if __name__ == '__main__':
    import argparse
    parser = argparse.ArgumentParser(description=prepare_demo.__doc__)
    parser.add_argument('--root', default='data/shapes_demo')
    parser.add_argument('--num-train', type=int, default=24)
    parser.add_argument('--num-val', type=int, default=8)
    parser.add_argument('--size', type=int, default=128)
    args = parser.parse_args()
    print(prepare_demo(args.root, args.num_train, args.num_val, args.size))
