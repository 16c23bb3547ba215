"""MMSegmentation's own ``tools/train.py`` and ``tools/test.py`` on the
segmentation demo config (the MoPPA Swin UperNet config, itself MMSegmentation's
ADE20K config with the two lines, made tiny): mIoU reported, an adapter-only
checkpoint with its record, reloaded by ``init_model`` + ``inference_model``
(which clears the backbone's ``init_cfg``), predicting what ``test.py`` wrote,
and merged."""
import glob
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import REPO, child_env

mmseg = pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
MMSEG_TOOLS = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools')
DEMO = osp.join(REPO, 'configs/demo/moppa-swin-demo_upernet_scenes-ade20k-64x64.py')
TINY_RUN = ['train_cfg.max_iters=6', 'train_cfg.val_interval=6',
            'default_hooks.checkpoint.interval=6', 'train_dataloader.batch_size=2']


def run(args, cwd):
    result = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """The demo data (8 train / 2 val scenes) and a 6-iteration run of
    mmseg's tools/train.py, then its tools/test.py with --out."""
    from demo.ade_scenes import make_ade20k_scenes, make_mmseg_swin_checkpoint, DEMO_SWIN
    cwd = tmp_path_factory.mktemp('seg')
    root = str(cwd / 'data' / 'ade_demo')
    make_ade20k_scenes(root, num_train=8, num_val=2)
    make_mmseg_swin_checkpoint(osp.join(root, 'swin_demo_pretrained.pth'), **DEMO_SWIN)
    train_log = run([sys.executable, osp.join(MMSEG_TOOLS, 'train.py'), DEMO,
                     '--work-dir', 'work', '--cfg-options', *TINY_RUN], cwd)
    test_log = run([sys.executable, osp.join(MMSEG_TOOLS, 'test.py'), DEMO,
                    'work/iter_6.pth', '--work-dir', 'test', '--out', 'pred'], cwd)
    return dict(cwd=cwd, root=root, train_log=train_log, test_log=test_log)


def test_train_and_test_report_miou_and_train_with_loss_route(trained):
    assert 'loss_route' in trained['train_log']
    assert 'MoPPASwinTransformerSeg' in trained['train_log']  # the parameter table
    metrics = glob.glob(str(trained['cwd'] / 'test' / '*' / '*.json'))
    assert metrics, trained['test_log'][-2000:]
    with open(metrics[0]) as f:
        result = json.load(f)
    assert 0 <= result['mIoU'] <= 100 and 'aAcc' in result


def test_checkpoint_is_adapter_only_with_its_record(trained):
    from moppa_mm.models import read_adapter_record
    checkpoint = torch.load(trained['cwd'] / 'work' / 'iter_6.pth', weights_only=True)
    keys = [k for k in checkpoint['state_dict'] if k.startswith('backbone.')]
    assert keys and all(k == 'backbone._extra_state' or 'moppa' in k or 'conv_adapter' in k
                        for k in keys)
    record = read_adapter_record(checkpoint)
    assert record['backbone'] == 'MoPPASwinTransformerSeg'
    assert record['base']['checkpoint'].endswith('swin_demo_pretrained.pth')


def test_init_model_and_inference_model_predict_what_test_wrote(trained, monkeypatch):
    """mmseg's init_model clears the backbone's init_cfg, so the base is named
    by ``model.backbone.pretrained`` (which mmseg's Swin turns into its
    init_cfg); MMSegInferencer keeps init_cfg. Merged, the prediction stays."""
    from mmseg.apis import MMSegInferencer, inference_model, init_model

    from moppa_mm import merge_adapters
    monkeypatch.chdir(trained['cwd'])  # the config's data paths are relative
    base = 'data/ade_demo/swin_demo_pretrained.pth'
    model = init_model(DEMO, 'work/iter_6.pth', device='cpu',
                       cfg_options={'model.backbone.pretrained': base})
    inferencer = MMSegInferencer(model=DEMO, weights='work/iter_6.pth', device='cpu')
    for png in sorted(glob.glob('pred/*.png')):
        image = osp.join(trained['root'], 'images', 'validation',
                         osp.basename(png)[:-4] + '.jpg')
        predicted = inference_model(model, image).pred_sem_seg.data[0].numpy()
        written = np.asarray(Image.open(png))  # reduce_zero_label: pred + 1
        np.testing.assert_array_equal(predicted + 1, written)
        np.testing.assert_array_equal(inferencer(image)['predictions'] + 1, written)
    merge_adapters(model)
    merged = inference_model(model, image).pred_sem_seg.data[0].numpy()
    np.testing.assert_array_equal(merged + 1, written)


def test_our_test_tool_runs_the_config_and_reports_the_same_miou(trained):
    """tools/test.py of this repository runs MMSegmentation configs too (after
    its checks, MMSegmentation's own test.py): the same mIoU."""
    run([sys.executable, osp.join(REPO, 'tools', 'test.py'), DEMO, 'work/iter_6.pth',
         '--work-dir', 'ours'], trained['cwd'])
    results = []
    for folder in ('test', 'ours'):
        metrics = glob.glob(str(trained['cwd'] / folder / '*' / '*.json'))
        assert len(metrics) == 1, folder
        with open(metrics[0]) as f:
            results.append(json.load(f)['mIoU'])
    assert results[0] == results[1]
