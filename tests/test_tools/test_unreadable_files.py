"""Files that are no checkpoint are named with what they look like, through
``tools/train.py``; ``publish_model.py`` on a full disk says so and leaves no
partial file."""
import os
import resource
import subprocess

import torch

from tests.conftest import PYTHON, REPO, child_env, dump_cfg, tiny_detection_cfg


def bad_files(folder, pretrained):
    data = open(pretrained, 'rb').read()
    (folder / 'half.pth').write_bytes(data[:len(data) // 2])  # a killed save
    (folder / 'zeros.pth').write_bytes(b'\0' * 4096)
    (folder / 'notes.pth').write_text('epoch 3 looked good\n')
    (folder / 'notes.txt').write_text('not a checkpoint\n')
    (folder / 'link.pth').symlink_to(folder / 'notes.txt')
    return {
        'half.pth': "the start of a zip archive (PyTorch's format) without its end",
        'zeros.pth': 'zero bytes from the start',
        'notes.pth': "a text file, starting 'epoch 3 looked good'",
        'link.pth': "a link to '{folder}/notes.txt', 17 bytes, a text file",
    }


def test_unreadable_pretrained_files_are_named(shapes_data, tmp_path):
    expected = bad_files(tmp_path, shapes_data['pretrained'])
    for name, looks_like in expected.items():
        cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
        path = str(tmp_path / name)
        cfg.model.backbone.init_cfg.checkpoint = path
        run = subprocess.run(
            [PYTHON, 'tools/train.py', dump_cfg(cfg, tmp_path / 'tiny.py')], cwd=REPO,
            env=child_env(), capture_output=True, text=True, timeout=600)
        assert run.returncode != 0
        assert f'{path!r}' in run.stderr, (name, run.stderr[-2000:])
        assert looks_like.format(folder=tmp_path) in run.stderr, (name, run.stderr[-2000:])


def test_publish_model_on_a_full_disk_leaves_nothing(tmp_path):
    source = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': {'w': torch.randn(256, 256)}, 'meta': {}}, source)
    out = tmp_path / 'out'
    out.mkdir()
    limit = 64 * 1024  # the file system "fills up" after 64 KiB (ulimit -f)

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run(
        [PYTHON, 'tools/model_converters/publish_model.py', str(source),
         str(out / 'moppa.pth')], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300, preexec_fn=small_disk)
    assert run.returncode != 0
    assert 'cannot write the published checkpoint' in run.stderr, run.stderr[-2000:]
    assert str(out / 'moppa-') in run.stderr
    assert 'Traceback' not in run.stderr
    assert os.listdir(out) == []


def test_publish_model_where_the_folder_cannot_be_written(tmp_path):
    """A destination that cannot be written (its folder is a file: fails for
    root too, unlike a read-only folder): a one-line error, no partial file."""
    source = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}, 'meta': {}}, source)
    blocker = tmp_path / 'out'
    blocker.write_text('not a folder')
    run = subprocess.run(
        [PYTHON, 'tools/model_converters/publish_model.py', str(source),
         str(blocker / 'moppa.pth')], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300)
    assert run.returncode != 0
    assert 'Traceback' not in run.stderr, run.stderr[-2000:]
    assert 'out' in run.stderr and blocker.read_text() == 'not a folder'
    assert sorted(os.listdir(tmp_path)) == ['epoch_1.pth', 'out']
