"""Checkpoint files: refused unless safe, named when broken, written plain."""
import os
import os.path as osp
import random
import shlex
import subprocess

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer

from model_converters.vit_to_mmpretrain import convert
from moppa_mm.engine.hooks.atomic_checkpoint_hook import checkpoint_to_resume
from moppa_mm.utils.checkpoints import OPT_IN_ENV, CheckpointLoadError, load_checkpoint_file
from moppa_mm.utils.runner_state import from_plain, to_plain
from tests.conftest import PYTHON, REPO, child_env


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {shlex.quote(self.marker)}', ))


def crafted_checkpoint(path, marker, state_dict=None, key='state_dict'):
    torch.save({key: state_dict or {'x': torch.zeros(1)}, 'meta': Payload(marker)},
               path)
    return str(path)


def assert_refused(error_text, path, marker):
    assert not osp.exists(marker), 'the payload ran'
    assert str(path) in error_text and OPT_IN_ENV in error_text, error_text


def test_crafted_checkpoint_is_refused_and_opt_in_is_explicit(tmp_path):
    marker = str(tmp_path / 'ran')
    path = crafted_checkpoint(tmp_path / 'evil.pth', marker)
    with pytest.raises(CheckpointLoadError) as info:
        load_checkpoint_file(path)
    assert_refused(str(info.value), path, marker)
    os.environ[OPT_IN_ENV] = '1'
    try:
        load_checkpoint_file(path)
    finally:
        del os.environ[OPT_IN_ENV]
    assert osp.exists(marker)  # the documented opt-in really unpickles


@pytest.mark.parametrize('source', ['mae', 'mocov3'])
def test_converters_refuse_crafted_pth(tmp_path, source):
    marker = str(tmp_path / 'ran')
    key = 'model' if source == 'mae' else 'state_dict'
    path = crafted_checkpoint(tmp_path / 'evil.pth', marker, key=key)
    with pytest.raises(CheckpointLoadError) as info:
        convert(path, source)
    assert_refused(str(info.value), path, marker)


def test_converter_tool_refuses_crafted_pth(tmp_path):
    marker = str(tmp_path / 'ran')
    path = crafted_checkpoint(tmp_path / 'evil.pth', marker, key='model')
    result = subprocess.run(
        [PYTHON, 'tools/model_converters/vit_to_mmpretrain.py', 'mae', path,
         str(tmp_path / 'out.pth')], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300)
    assert result.returncode != 0
    assert_refused(result.stderr, path, marker)


def test_jax_converter_refuses_pickled_npz(tmp_path):
    marker = str(tmp_path / 'ran')
    path = str(tmp_path / 'evil.npz')
    np.savez(path, cls=np.array([Payload(marker)], dtype=object))
    with pytest.raises(CheckpointLoadError, match='evil.npz'):
        convert(path, 'jax')
    assert not osp.exists(marker)


@pytest.mark.parametrize('source', ['jax', 'mae'])
@pytest.mark.parametrize('damage', ['empty', 'truncated'])
def test_broken_files_are_named(tmp_path, source, damage):
    path = str(tmp_path / ('src.npz' if source == 'jax' else 'src.pth'))
    if source == 'jax':
        np.savez(path, cls=np.zeros((1, 1, 8)))
    else:
        torch.save({'model': {'cls_token': torch.zeros(1, 1, 8)}}, path)
    size = osp.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(0 if damage == 'empty' else size // 2)
    with pytest.raises(CheckpointLoadError, match=r'src\.(npz|pth)'):
        convert(path, source)


def test_plain_containers_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(1)
    buffer = HistoryBuffer()
    for value in (1.5, 2.5, np.float64(3.0)):
        buffer.update(value)
    state = {
        'message_hub': {'log_scalars': {'train/loss': buffer},
                        'runtime_info': {'iter': 3, 'lr': np.float64(0.1)}},
        'rng': {'python': random.getstate(), 'numpy': np.random.get_state()},
        'meta': {'classes': ('a', 'b'), 'palette': [(1, 2, 3)],
                 'names': np.array(['x', 'yz'])},
    }
    path = str(tmp_path / 'plain.pth')
    plain = to_plain(state)
    # what needs no tag is saved as it is: loaders that never decode (the
    # inference APIs reading meta['dataset_meta']) see the same values
    assert plain['meta']['classes'] == ('a', 'b') and plain['meta']['palette'] == [(1, 2, 3)]
    torch.save(plain, path)
    loaded = from_plain(torch.load(path, weights_only=True))
    restored = loaded['message_hub']['log_scalars']['train/loss']
    np.testing.assert_array_equal(restored.data[0], buffer.data[0])
    np.testing.assert_array_equal(restored.data[1], buffer.data[1])
    lr = loaded['message_hub']['runtime_info']['lr']
    assert type(lr) is np.float64 and lr == 0.1
    assert loaded['rng']['python'] == state['rng']['python']
    np.random.set_state(loaded['rng']['numpy'])
    expected = np.random.RandomState()
    expected.set_state(state['rng']['numpy'])
    assert np.random.rand() == expected.rand()
    assert loaded['meta']['classes'] == ('a', 'b')
    assert loaded['meta']['names'].tolist() == ['x', 'yz']
    with pytest.raises(TypeError, match=r"checkpoint\['bad'\]"):
        to_plain({'bad': object()})


def test_to_plain_leaves_out_what_it_cannot_store_and_names_it(tmp_path):
    state = {'lr': 0.1, 'anneal': np.cos, 'hooks': [1, object(), (2, print)],
             ('group', 0): torch.ones(2), object: 'a class as a key',
             'stamps': np.array(['2026-01-01'], dtype='datetime64[D]')}
    with pytest.raises(TypeError, match=r"checkpoint\['anneal'\] holds a numpy.ufunc"):
        to_plain(state)
    left_out = []
    plain = to_plain(state, left_out=left_out)
    assert left_out == [("checkpoint['anneal']", 'numpy.ufunc'),
                        ("checkpoint['hooks'][1]", 'builtins.object'),
                        ("checkpoint['hooks'][2][1]", 'builtins.builtin_function_or_method'),
                        ("checkpoint: the key <class 'object'>", 'builtins.type'),
                        ("checkpoint['stamps']", 'numpy.ndarray')]
    torch.save(plain, tmp_path / 'plain.pth')
    loaded = torch.load(tmp_path / 'plain.pth', weights_only=True)
    assert set(loaded) == {'lr', 'hooks', ('group', 0)}
    assert loaded['hooks'] == [1, None, (2, None)]


def save_whole(path, epoch):
    torch.save({'meta': {'epoch': epoch}, 'state_dict': {'w': torch.ones(3)}}, path)


def test_resume_takes_the_newest_complete_checkpoint_where_last_checkpoint_fails(tmp_path):
    pointer = tmp_path / 'last_checkpoint'
    assert checkpoint_to_resume(str(tmp_path)) == (None, '')  # nothing: from scratch
    for epoch in (1, 2, 10):
        save_whole(tmp_path / f'epoch_{epoch}.pth', epoch)
    data = (tmp_path / 'epoch_10.pth').read_bytes()
    (tmp_path / 'epoch_11.pth').write_bytes(data[:len(data) // 2])  # cut short
    save_whole(tmp_path / 'best_acc_epoch_12.pth', 12)  # not an interval checkpoint
    newest = str(tmp_path / 'epoch_10.pth')  # by number, not by name

    assert checkpoint_to_resume(str(tmp_path)) == (
        newest, f'--resume: no {pointer}; resuming from the newest complete checkpoint '
                f'in the work dir, {newest}')
    pointer.write_text(str(tmp_path / 'epoch_12.pth'))  # gone
    assert checkpoint_to_resume(str(tmp_path)) == (
        newest, f"--resume: {pointer} names '{tmp_path}/epoch_12.pth', which is gone; "
                f'resuming from the newest complete checkpoint in the work dir, {newest}')
    pointer.write_text(str(tmp_path / 'epoch_2.pth'))  # there: followed
    assert checkpoint_to_resume(str(tmp_path)) == (str(tmp_path / 'epoch_2.pth'), '')
    for epoch in (1, 2, 10):  # gone, and nothing complete replaces it: the loader says so
        os.remove(tmp_path / f'epoch_{epoch}.pth')
    assert checkpoint_to_resume(str(tmp_path)) == (str(tmp_path / 'epoch_2.pth'), '')


@pytest.mark.parametrize('seed', range(4))
def test_random_bytes_are_called_corrupt_not_unsafe(tmp_path, seed):
    """A file of random bytes is not 'a checkpoint holding Python objects':
    the message says corrupt / not a checkpoint, and names the file."""
    path = tmp_path / 'random.pth'
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, np.uint8).tobytes())
    with pytest.raises(CheckpointLoadError, match='random.pth') as error:
        load_checkpoint_file(str(path))
    assert 'holds Python objects' not in str(error.value)
    assert 'not a PyTorch checkpoint' in str(error.value)


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_non_finite_weights_are_refused_naming_file_and_keys(tmp_path, bad):
    weights = {f'backbone.layers.{i}.weight': torch.ones(3, 4) for i in range(7)}
    weights['backbone.count'] = torch.arange(3)  # integers: always finite
    path = tmp_path / 'diverged.pth'
    # logged NaN losses are history, not state: they do not count
    log = to_plain({'train/loss': HistoryBuffer(np.array([float('nan')]), np.array([1]))})
    torch.save({'state_dict': weights, 'message_hub': log}, path)
    assert set(load_checkpoint_file(str(path))['state_dict']) == set(weights)

    for i in range(7):
        weights[f'backbone.layers.{i}.weight'][0, i % 4] = bad
    torch.save({'state_dict': weights, 'message_hub': log}, path)
    with pytest.raises(CheckpointLoadError) as error:
        load_checkpoint_file(str(path), what='pre-trained checkpoint', mmap=True)
    text = str(error.value)
    assert repr(str(path)) in text and 'in 7 tensors' in text, text
    assert 'state_dict.backbone.layers.0.weight (1 of 12)' in text, text
    assert 'layers.5.' not in text and '(7 tensors in all)' in text, text  # first five


def test_non_finite_optimizer_state_is_refused(tmp_path):
    state = {'state_dict': {'w': torch.ones(2)},
             'optimizer': {'state': {0: {'step': torch.tensor(3.0),
                                         'exp_avg': torch.tensor([0.0, float('inf')])}},
                           'param_groups': [{'lr': 0.1, 'params': [0]}]}}
    torch.save(state, tmp_path / 'resume.pth')
    with pytest.raises(CheckpointLoadError, match=r'optimizer\.state\.0\.exp_avg \(1 of 2\)'):
        load_checkpoint_file(str(tmp_path / 'resume.pth'))


def test_npz_given_as_pytorch_checkpoint_is_named(tmp_path):
    path = tmp_path / 'ViT-B_16.npz'
    np.savez(path, cls=np.zeros((1, 1, 4), np.float32))
    with pytest.raises(CheckpointLoadError,
                       match=r"NumPy \.npz archive.*vit_to_mmpretrain\.py jax .*ViT-B_16\.npz"):
        load_checkpoint_file(str(path))
