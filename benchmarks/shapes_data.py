"""Generated scenes with real spatial structure, for the transfer benchmark.

Each image holds one object whose silhouette is the class, drawn at a random
scale (0.5-0.9 of the half-width), position and rotation, filled with a random
texture (solid half the time, else stripes or checks of random frequency and
orientation, or dots), among clutter (small distractor blobs and strokes), and
30% of the time partly hidden by an occluder; pixel noise on top. Pure torch,
deterministic given a seed.

Two disjoint groups of silhouettes: ``SOURCE_CLASSES`` for pre-training and
``TRANSFER_CLASSES`` for transfer. The two *domains* differ too
(``domain='source'`` or ``'target'``): the source has smooth colour
backgrounds and saturated colours; the target has textured backgrounds
(gratings and plaids), a desaturated palette, the object filled with other
textures (rings, grain), more clutter and more noise. Transfer is
therefore to new classes in a changed domain.
"""
import math
from typing import Callable, Dict, Sequence, Tuple

import torch

Mask = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
DOMAINS = ('source', 'target')


def _box(u, v, half_u, half_v):
    return (u.abs() < half_u) & (v.abs() < half_v)


def _angle(u, v):
    return torch.atan2(v, u)


# Each mask takes the shape's own coordinates u, v (rotated and scaled so the
# shape fills about the unit disk) and r = sqrt(u^2 + v^2); (B, S, S) each.
SHAPES: Dict[str, Mask] = {
    # source classes (pre-training)
    'disk': lambda u, v, r: r < 0.9,
    'square': lambda u, v, r: _box(u, v, 0.75, 0.75),
    'ring': lambda u, v, r: (r > 0.5) & (r < 0.95),
    'plus': lambda u, v, r: _box(u, v, 0.25, 0.9) | _box(u, v, 0.9, 0.25),
    'triangle': lambda u, v, r: (v > -0.6) & (u.abs() < (0.9 - v) * 0.55),
    # no class is another rotated by less than 90 degrees (a square turned 45
    # degrees would be a diamond, a plus an x): rotations of up to 34 degrees
    # would make such pairs ambiguous
    'rhombus': lambda u, v, r: u.abs() / 0.95 + v.abs() / 0.5 < 1,
    'bar': lambda u, v, r: _box(u, v, 0.95, 0.28),
    'hollow_square': lambda u, v, r: _box(u, v, 0.85, 0.85) & ~_box(u, v, 0.45, 0.45),
    'chevron': lambda u, v, r: ((v + 0.35 - 0.9 * u.abs()).abs() < 0.28) & (u.abs() < 0.9),
    'half_disk': lambda u, v, r: (r < 0.95) & (v > 0),
    'two_dots': lambda u, v, r: ((u - 0.5)**2 + v**2 < 0.16) | ((u + 0.5)**2 + v**2 < 0.16),
    'star': lambda u, v, r: r < 0.5 + 0.42 * torch.cos(5 * _angle(u, v)),
    'ell': lambda u, v, r: _box(u + 0.6, v, 0.25, 0.9) | _box(u, v - 0.65, 0.85, 0.25),
    'hourglass': lambda u, v, r: _box(u, v, 0.9, 0.9) & (u.abs() < v.abs() * 0.9 + 0.1),
    'spokes': lambda u, v, r: (r < 0.95) & (torch.sin(4 * _angle(u, v)) > 0.2),
    'bullseye': lambda u, v, r: (r < 0.3) | ((r > 0.6) & (r < 0.95)),
    # transfer classes (never seen in pre-training)
    'tee': lambda u, v, r: _box(u, v - 0.65, 0.9, 0.25) | _box(u, v + 0.1, 0.25, 0.75),
    'crescent': lambda u, v, r: (r < 0.9) & ((u - 0.35)**2 + v**2 > 0.45),
    'three_bars': lambda u, v, r: _box(u, v, 0.9, 0.85) & (torch.cos(3 * math.pi * u / 1.8) > 0.3),
    'frame_dot': lambda u, v, r: (_box(u, v, 0.9, 0.9) & ~_box(u, v, 0.62, 0.62)) | (r < 0.3),
    'ellipse_pair': lambda u, v, r: (u**2 / 0.8 + (v - 0.45)**2 / 0.07 < 1) | (
        u**2 / 0.8 + (v + 0.45)**2 / 0.07 < 1),
    'arrow': lambda u, v, r: _box(u + 0.3, v, 0.55, 0.2) | (
        (u > 0.1) & (u < 0.9) & (v.abs() < (0.9 - u) * 0.9)),
    'u_shape': lambda u, v, r: _box(u, v, 0.85, 0.85) & ~_box(u, v - 0.3, 0.45, 0.75),
    'dotted_ring': lambda u, v, r: (r > 0.5) & (r < 0.95) & (torch.sin(6 * _angle(u, v)) > 0),
    'heart': lambda u, v, r: ((u - 0.35)**2 + (v - 0.3)**2 < 0.2) | (
        (u + 0.35)**2 + (v - 0.3)**2 < 0.2) | ((v < 0.35) & (v > -0.9)
                                               & (u.abs() < (v + 0.9) * 0.62)),
    'zigzag': lambda u, v, r: _box(u, v, 0.9, 0.9) & ((v - 0.5 * torch.sin(
        2.5 * math.pi * u / 1.8) * 0.9).abs() < 0.25),
}
SOURCE_CLASSES: Tuple[str, ...] = tuple(list(SHAPES)[:16])
TRANSFER_CLASSES: Tuple[str, ...] = tuple(list(SHAPES)[16:])


def _rand(generator, *shape):
    return torch.rand(*shape, generator=generator)


def _smooth_background(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Low-frequency colour noise, (n, 3, S, S) in [0.25, 0.75]."""
    coarse = 0.25 + 0.5 * _rand(generator, n, 3, 3, 3)
    return torch.nn.functional.interpolate(
        coarse, size=(size, size), mode='bicubic', align_corners=False).clamp(0, 1)


def _grating(xx, yy, n, generator, freq=(1.5, 5.0)) -> torch.Tensor:
    """A sine grating of random frequency, orientation and phase, (n, S, S) in [-1, 1]."""
    f = freq[0] + (freq[1] - freq[0]) * _rand(generator, n)
    theta = math.pi * _rand(generator, n)
    phase = 2 * math.pi * _rand(generator, n)
    proj = xx * theta.cos()[:, None, None] + yy * theta.sin()[:, None, None]
    return torch.sin(f[:, None, None] * math.pi * proj + phase[:, None, None])


def _textured_background(xx, yy, n: int, size: int, generator) -> torch.Tensor:
    """Gratings and plaids of two colours (target domain), (n, 3, S, S)."""
    pattern = _grating(xx, yy, n, generator)
    plaid = _rand(generator, n) < 0.5
    pattern = torch.where(plaid[:, None, None],
                          0.5 * (pattern + _grating(xx, yy, n, generator)), pattern)
    a, b = 0.3 + 0.4 * _rand(generator, n, 3, 1, 1), 0.3 + 0.4 * _rand(generator, n, 3, 1, 1)
    weight = (0.5 + 0.3 * pattern)[:, None]  # (n, 1, S, S)
    return a * weight + b * (1 - weight)


def _fill(u, v, r, n, generator, domain: str) -> torch.Tensor:
    """A texture in the object's frame: (n, S, S) in [0, 1] (1: first colour).

    source: solid, stripes, checks or dots; target: concentric rings, grain,
    a radial gradient or solid."""
    kind = ((_rand(generator, n) * 6).long() - 2).clamp(min=0)[:, None, None]  # solid: 1/2
    f = 3 + 3 * _rand(generator, n)[:, None, None]
    theta = math.pi * _rand(generator, n)[:, None, None]
    along = u * theta.cos() + v * theta.sin()
    if domain == 'source':
        options = [torch.ones_like(u),
                   (torch.sin(f * along) > 0).float(),
                   ((torch.sin(f * u) * torch.sin(f * v)) > 0).float(),
                   ((torch.sin(f * u) * torch.sin(f * v)).abs() < 0.5).float()]
    else:
        grain = torch.rand(u.shape, generator=generator)
        options = [torch.ones_like(u),
                   (torch.sin(1.5 * f * r) > 0).float(),
                   (grain > 0.5).float(),
                   (1 - r).clamp(0, 1)]
    out = options[0]
    for index, option in enumerate(options[1:], 1):
        out = torch.where(kind == index, option, out)
    return out


def _clutter(xx, yy, n: int, count: int, generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """``count`` small blobs and strokes per image: their mask (n, S, S) and a
    colour per pixel (n, 3, S, S)."""
    mask = torch.zeros(n, *xx.shape)
    colour = torch.zeros(n, 3, *xx.shape)
    for _ in range(count):
        present = (_rand(generator, n) < 0.75)[:, None, None]
        cx, cy = (_rand(generator, 2, n) * 2 - 1)[:, :, None, None].unbind(0)
        radius = 0.06 + 0.1 * _rand(generator, n)[:, None, None]
        theta = math.pi * _rand(generator, n)[:, None, None]
        du, dv = xx - cx, yy - cy
        along = du * theta.cos() + dv * theta.sin()
        across = -du * theta.sin() + dv * theta.cos()
        stroke = _rand(generator, n)[:, None, None] < 0.5
        shape = torch.where(stroke, (along.abs() < 2.5 * radius) & (across.abs() < 0.035),
                            du**2 + dv**2 < radius**2) & present
        mask = torch.where(shape, torch.ones(()), mask)
        colour = torch.where(shape[:, None], _rand(generator, n, 3, 1, 1), colour)
    return mask, colour


def make_images(classes: Sequence[str], per_class: int, size: int = 32, seed: int = 0,
                domain: str = 'source') -> Tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` scenes of each class in ``classes``, in ``domain``.

    Returns:
        tuple: images (len(classes) * per_class, 3, size, size), roughly
        zero-mean, and labels (index into ``classes``), class-major order.
    """
    if domain not in DOMAINS:
        raise ValueError(f'domain must be one of {DOMAINS}, got {domain!r}')
    generator = torch.Generator().manual_seed(seed)
    target = domain == 'target'
    images, labels = [], []
    axis = torch.linspace(-1, 1, size)
    yy, xx = torch.meshgrid(axis, axis, indexing='ij')  # (S, S)
    for label, name in enumerate(classes):
        n = per_class
        scale = 0.5 + 0.4 * _rand(generator, n)  # object radius, image units
        center = (_rand(generator, n, 2) * 2 - 1) * (1 - scale[:, None]) * 0.9
        angle = (_rand(generator, n) - 0.5) * 1.2  # +-34 degrees
        dx = (xx - center[:, 0, None, None]) / scale[:, None, None]  # (n, S, S)
        dy = (yy - center[:, 1, None, None]) / scale[:, None, None]
        cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
        u, v = cos * dx + sin * dy, -sin * dx + cos * dy
        r = torch.sqrt(u**2 + v**2)
        mask = SHAPES[name](u, v, r).float()  # (n, S, S)
        if target:
            background = _textured_background(xx, yy, n, size, generator)
        else:
            background = _smooth_background(n, size, generator)
        clutter, clutter_colour = _clutter(xx, yy, n, 3 if target else 2, generator)
        background = torch.where(clutter[:, None] > 0, clutter_colour, background)
        # the object's two colours, kept away from the mean background
        mean_bg = background.mean((2, 3), keepdim=True)
        first = _rand(generator, n, 3, 1, 1)
        first = torch.where((first - mean_bg).abs() < 0.4, 1 - first, first)
        second = 0.65 * first + 0.35 * mean_bg + 0.2 * (_rand(generator, n, 3, 1, 1) - 0.5)
        fill = _fill(u, v, r, n, generator, domain)[:, None]
        colour = first * fill + second * (1 - fill)
        image = background * (1 - mask[:, None]) + colour * mask[:, None]
        if target:  # a desaturated palette
            image = 0.5 * image + 0.5 * image.mean(1, keepdim=True)
        # an occluder over part of the object, 30% of the time
        occluded = _rand(generator, n) < 0.3
        half = 0.1 + 0.12 * _rand(generator, n, 2)
        offset = center + (_rand(generator, n, 2) * 2 - 1) * scale[:, None] * 0.8
        box = ((xx - offset[:, 0, None, None]).abs() < half[:, 0, None, None]) & (
            (yy - offset[:, 1, None, None]).abs() < half[:, 1, None, None]) & \
            occluded[:, None, None]
        image = torch.where(box[:, None], _rand(generator, n, 3, 1, 1), image)
        noise = 0.08 if target else 0.05
        image = image + noise * torch.randn(image.shape, generator=generator)
        images.append((image - 0.5) / 0.25)
        labels.append(torch.full((n, ), label, dtype=torch.long))
    return torch.cat(images), torch.cat(labels)
