"""The demo data generators (tools/demo/) as the quick starts run them: the
random Swin each saves as its demo's "pre-trained" base is built without
mmdet's and mmseg's log that it has no pre-trained weights."""
import os.path as osp
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, child_env


@pytest.mark.parametrize('script, package, args', [
    ('coco_shapes.py', 'mmdet', ('--num-train', '1', '--num-val', '1', '--size', '32')),
    ('ade_scenes.py', 'mmseg', ('--size', '32'))])
def test_a_generator_says_nothing_of_its_random_base(tmp_path, script, package, args):
    pytest.importorskip(package, reason=f'{package} is not installed (the seg extra)')
    run = subprocess.run([PYTHON, osp.join(REPO, 'tools/demo', script), '--root', 'demo',
                          *args], cwd=tmp_path, env=child_env(), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert osp.isfile(tmp_path / 'demo' / 'swin_demo_pretrained.pth')
    assert 'pre-trained weights' not in run.stdout + run.stderr, run.stdout + run.stderr
