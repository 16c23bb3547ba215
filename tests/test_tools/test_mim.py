"""openmim's own CLI (``mim search/train/test moppa_mm``) on the install the
tests run in: tools/install.sh installs moppa_mm editable and links
``<site-packages>/moppa_mm`` to the checkout, where mim looks for ``.mim``."""
import os
import os.path as osp
import re
import subprocess
import sys

from demo.coco_shapes import prepare_demo
from tests.test_tools.test_train_test_tools import logged_test_metrics, same_metrics, val_metrics

MIM = osp.join(osp.dirname(sys.executable), 'mim')  # the test venv's openmim
DEMO = 'cascade-mask-rcnn_moppa-swin-demo_fpn_shapes'  # reads data/shapes_demo/


def mim(*args, cwd):
    assert osp.isfile(MIM), (f'no {MIM}: openmim comes with the mim extra '
                             '(pip install -e ".[mim]", as tools/install.sh does)')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # the install's
    env.setdefault('OMP_NUM_THREADS', '1')
    result = subprocess.run([MIM, *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_mim_search_train_test(tmp_path):
    assert f'config id: {DEMO}\n' in mim('search', 'moppa_mm', cwd=tmp_path)

    prepare_demo(str(tmp_path / 'data' / 'shapes_demo'), num_train=2, num_val=1, size=64)
    out = mim('train', 'moppa_mm', f'{DEMO}.py', '--work-dir', 'train',
              '--cfg-options', 'train_cfg.max_epochs=1', cwd=tmp_path)
    found = re.search(r'will use (\S+) instead', out)  # mim found the config by name
    assert found and found.group(1).endswith(f'/configs/demo/{DEMO}.py'), out[-3000:]
    assert osp.isfile(tmp_path / 'train' / 'epoch_1.pth')

    mim('test', 'moppa_mm', f'{DEMO}.py', '--checkpoint', 'train/epoch_1.pth',
        '--work-dir', 'test', cwd=tmp_path)
    # the checkpoint's adapters loaded: the metrics of the validation after training
    assert same_metrics(val_metrics(str(tmp_path / 'train')),
                        logged_test_metrics(str(tmp_path / 'test')))
