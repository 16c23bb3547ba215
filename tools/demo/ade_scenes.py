"""The segmentation demo's data: small generated street scenes in the ADE20K
layout (``images/{training,validation}/*.jpg`` and ``annotations/...*.png``,
label 0 = unlabelled, 1..5 = ADE20K's wall, building, sky, floor, tree) and a
small Swin "pre-trained" checkpoint in MMSegmentation's format. Nothing is
downloaded::

    python tools/demo/ade_scenes.py --root data/ade_demo
"""
import contextlib
import io
import os
import os.path as osp
from typing import Dict, Optional

import cv2
import numpy as np
import torch

# the first five ADE20K classes, with their ids in ADE20K's annotation files
# (0 is unlabelled; mmseg's reduce_zero_label maps 0 to 255 and k to k - 1)
CLASSES = ('wall', 'building', 'sky', 'floor', 'tree')
WALL, BUILDING, SKY, FLOOR, TREE = range(1, 6)
# the mean colour of each class in the images (BGR), drawn with noise
COLORS = {WALL: (150, 170, 190), BUILDING: (90, 90, 100), SKY: (230, 180, 120),
          FLOOR: (40, 70, 110), TREE: (40, 150, 50)}


def _scene(size: int, rng: np.random.Generator):
    """One (H, W, 3) uint8 image and its (H, W) uint8 ADE20K label map: sky
    over a wall with buildings, a floor band below, trees, and an unlabelled
    border strip."""
    label = np.full((size, size), WALL, np.uint8)
    horizon = int(rng.uniform(0.25, 0.45) * size)
    label[:horizon] = SKY
    for _ in range(rng.integers(1, 4)):  # buildings reaching into the sky
        x0 = int(rng.integers(0, size - size // 4))
        width, top = int(rng.integers(size // 8, size // 3)), int(rng.integers(2, horizon))
        label[top:int(0.75 * size), x0:x0 + width] = BUILDING
    label[int(rng.uniform(0.7, 0.85) * size):] = FLOOR
    for _ in range(rng.integers(0, 3)):
        center = tuple(int(c) for c in rng.integers(size // 8, size - size // 8, 2))
        cv2.circle(label, center, int(rng.integers(size // 12, size // 6)), TREE, -1)
    label[:, :max(size // 32, 1)] = 0  # unlabelled
    image = np.zeros((size, size, 3), np.float32)
    for cls, color in COLORS.items():
        image[label == cls] = color
    image += rng.normal(0, 18, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), label


def make_ade20k_scenes(root: str, num_train: int = 16, num_val: int = 4,
                       size: int = 64, seed: int = 0) -> Dict[str, str]:
    """Write the scenes under ``root`` in the ADE20K layout; returns the folders."""
    rng = np.random.default_rng(seed)
    for split, count in (('training', num_train), ('validation', num_val)):
        for folder in ('images', 'annotations'):
            os.makedirs(osp.join(root, folder, split), exist_ok=True)
        for index in range(count):
            image, label = _scene(size, rng)
            name = f'ADE_{"train" if split == "training" else "val"}_{index + 1:08d}'
            cv2.imwrite(osp.join(root, 'images', split, name + '.jpg'), image)
            cv2.imwrite(osp.join(root, 'annotations', split, name + '.png'), label)
    return dict(images=osp.join(root, 'images'), annotations=osp.join(root, 'annotations'))


DEMO_SWIN = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                 window_size=7)


def make_mmseg_swin_checkpoint(path: str, seed: int = 0, **swin_kwargs) -> str:
    """Save a randomly initialised mmseg ``SwinTransformer`` as MMSegmentation's
    released Swin bases are (a plain state dict, mmseg's key names)."""
    from mmseg.models.backbones import SwinTransformer
    torch.manual_seed(seed)
    swin = SwinTransformer(**swin_kwargs)
    # random on purpose: without a checkpoint init_weights prints "No pre-trained
    # weights for SwinTransformer, training start from scratch"
    with contextlib.redirect_stdout(io.StringIO()):
        swin.init_weights()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    torch.save(swin.state_dict(), path)
    return path


def prepare_seg_demo(root: str = 'data/ade_demo', size: int = 64,
                     swin_kwargs: Optional[dict] = None) -> Dict[str, str]:
    """Everything the segmentation demo config reads: the data set and the backbone."""
    paths = make_ade20k_scenes(root, size=size)
    paths['pretrained'] = make_mmseg_swin_checkpoint(
        osp.join(root, 'swin_demo_pretrained.pth'), **(swin_kwargs or DEMO_SWIN))
    return paths


if __name__ == '__main__':
    import argparse
    parser = argparse.ArgumentParser(description=prepare_seg_demo.__doc__)
    parser.add_argument('--root', default='data/ade_demo')
    parser.add_argument('--size', type=int, default=64)
    args = parser.parse_args()
    print(prepare_seg_demo(args.root, args.size))
