"""Generated image classification with real spatial structure, for the
transfer benchmark: each class is a shape or a texture-in-a-shape, drawn at a
random position, size, rotation and colour on a smooth random background with
pixel noise. Pure torch, deterministic given a seed.

The classes fall in two disjoint groups: ``SOURCE_CLASSES`` for pre-training
and ``TRANSFER_CLASSES`` (unseen shapes built from the same vocabulary of
edges, corners, stripes and blobs) for few-shot transfer.
"""
import math
from typing import Callable, Dict, Sequence, Tuple

import torch

Mask = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _box(u, v, half_u, half_v):
    return (u.abs() < half_u) & (v.abs() < half_v)


# Each mask takes the shape's own coordinates u, v (rotated and scaled so the
# shape fills about the unit disk) and r = sqrt(u^2 + v^2); (B, S, S) each.
SHAPES: Dict[str, Mask] = {
    # source classes (pre-training)
    'disk': lambda u, v, r: r < 0.9,
    'square': lambda u, v, r: _box(u, v, 0.75, 0.75),
    'ring': lambda u, v, r: (r > 0.55) & (r < 0.95),
    'plus': lambda u, v, r: _box(u, v, 0.22, 0.9) | _box(u, v, 0.9, 0.22),
    'triangle': lambda u, v, r: (v > -0.6) & (u.abs() < (0.9 - v) * 0.55),
    'striped_disk': lambda u, v, r: (r < 0.95) & (torch.sin(7 * v) > 0),
    'checker_disk': lambda u, v, r: (r < 0.95) & (torch.sin(6 * u) * torch.sin(6 * v) > 0),
    'diamond': lambda u, v, r: u.abs() + v.abs() < 0.95,
    'bar': lambda u, v, r: _box(u, v, 0.95, 0.25),
    'hollow_square': lambda u, v, r: _box(u, v, 0.85, 0.85) & ~_box(u, v, 0.5, 0.5),
    'x_cross': lambda u, v, r: ((u.abs() - v.abs()).abs() < 0.25) & (r < 1.0),
    'half_disk': lambda u, v, r: (r < 0.95) & (v > 0),
    'two_dots': lambda u, v, r: ((u - 0.5)**2 + v**2 < 0.14) | ((u + 0.5)**2 + v**2 < 0.14),
    'target': lambda u, v, r: (r < 0.95) & (torch.sin(9 * r) > 0),
    'spokes': lambda u, v, r: (r < 0.95) & (torch.sin(5 * torch.atan2(v, u)) > 0),
    'ell': lambda u, v, r: _box(u + 0.6, v, 0.22, 0.9) | _box(u, v - 0.68, 0.8, 0.22),
    # transfer classes (never seen in pre-training)
    'tee': lambda u, v, r: _box(u, v - 0.65, 0.9, 0.22) | _box(u, v + 0.1, 0.22, 0.75),
    'crescent': lambda u, v, r: (r < 0.9) & ((u - 0.35)**2 + v**2 > 0.45),
    'three_bars': lambda u, v, r: _box(u, v, 0.9, 0.85) & (torch.cos(3 * math.pi * u / 1.8) > 0.3),
    'spiral': lambda u, v, r: (r < 0.95) & (torch.sin(4 * torch.atan2(v, u) + 9 * r) > 0),
    'frame_dot': lambda u, v, r: (_box(u, v, 0.9, 0.9) & ~_box(u, v, 0.65, 0.65)) | (r < 0.3),
    'hourglass': lambda u, v, r: _box(u, v, 0.9, 0.9) & (u.abs() < v.abs() * 0.9 + 0.08),
    'grid_square': lambda u, v, r: _box(u, v, 0.9, 0.9) & (
        (torch.sin(6 * u).abs() < 0.35) | (torch.sin(6 * v).abs() < 0.35)),
    'ellipse_pair': lambda u, v, r: (u**2 / 0.8 + (v - 0.45)**2 / 0.06 < 1) | (
        u**2 / 0.8 + (v + 0.45)**2 / 0.06 < 1),
    'star': lambda u, v, r: r < 0.55 + 0.35 * torch.cos(5 * torch.atan2(v, u)),
    'dotted_ring': lambda u, v, r: (r > 0.55) & (r < 0.95) & (torch.sin(8 * torch.atan2(v, u)) > 0),
}
SOURCE_CLASSES: Tuple[str, ...] = tuple(list(SHAPES)[:16])
TRANSFER_CLASSES: Tuple[str, ...] = tuple(list(SHAPES)[16:])


def _smooth_background(batch: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Low-frequency colour noise, (B, 3, S, S) in [0.3, 0.7]."""
    coarse = 0.3 + 0.4 * torch.rand(batch, 3, 3, 3, generator=generator)
    return torch.nn.functional.interpolate(
        coarse, size=(size, size), mode='bicubic', align_corners=False).clamp(0, 1)


def make_images(classes: Sequence[str], per_class: int, size: int = 32,
                seed: int = 0, noise: float = 0.05) -> Tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` images of each class in ``classes``.

    Returns:
        tuple: images (len(classes) * per_class, 3, size, size), roughly
        zero-mean, and labels (index into ``classes``), class-major order.
    """
    generator = torch.Generator().manual_seed(seed)
    images, labels = [], []
    axis = torch.linspace(-1, 1, size)
    yy, xx = torch.meshgrid(axis, axis, indexing='ij')  # (S, S)
    for label, name in enumerate(classes):
        n = per_class
        rand = lambda *shape: torch.rand(*shape, generator=generator)  # noqa: E731
        center = (rand(n, 2) - 0.5) * 0.5  # (n, 2) as (x, y)
        scale = 0.55 + 0.25 * rand(n)  # shape radius in image units
        angle = (rand(n) - 0.5) * 1.0  # +-29 degrees
        dx = (xx - center[:, 0, None, None]) / scale[:, None, None]  # (n, S, S)
        dy = (yy - center[:, 1, None, None]) / scale[:, None, None]
        cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
        u, v = cos * dx + sin * dy, -sin * dx + cos * dy
        mask = SHAPES[name](u, v, torch.sqrt(u**2 + v**2)).float()  # (n, S, S)
        background = _smooth_background(n, size, generator)  # (n, 3, S, S)
        colour = rand(n, 3, 1, 1)
        # keep the shape visible: push its colour away from the mean background
        colour = torch.where((colour - background.mean((2, 3), keepdim=True)).abs() < 0.35,
                             1 - colour, colour)
        image = background * (1 - mask[:, None]) + colour * mask[:, None]
        image = image + noise * torch.randn(image.shape, generator=generator)
        images.append((image - 0.5) / 0.25)
        labels.append(torch.full((n, ), label, dtype=torch.long))
    return torch.cat(images), torch.cat(labels)
