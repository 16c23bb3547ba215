"""The classification quick start (tools/quickstart.sh cls) step by step, as
separate processes in a fresh folder: generated task and MAE-format ViT, our
converter, tools/train.py, tools/test.py."""
import glob
import json
import os.path as osp
import subprocess

import torch

from demo.vtab_task import DEMO_TASK, make_mae_vit_checkpoint
from model_converters.vit_to_mmpretrain import convert
from tests.conftest import PYTHON, REPO, child_env

CONFIG = osp.join(REPO, 'configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py')


def run(args, cwd):
    result = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_mae_format_checkpoint_converts_to_the_vit_it_came_from(tmp_path):
    from mmpretrain.models.backbones import VisionTransformer

    from demo.vtab_task import DEMO_VIT
    path = make_mae_vit_checkpoint(str(tmp_path / 'mae.pth'), seed=3)
    raw = torch.load(path, weights_only=True)['model']
    assert 'blocks.1.mlp.fc2.bias' in raw and 'decoder_embed.weight' in raw
    vit = VisionTransformer(**DEMO_VIT)
    missing, unexpected = vit.load_state_dict(convert(path, 'mae'), strict=False)
    assert not missing and not unexpected
    torch.testing.assert_close(vit.layers[1].ffn.layers[1].bias,
                               raw['blocks.1.mlp.fc2.bias'])


def test_classification_quick_start(tmp_path):
    cwd = str(tmp_path)
    run([PYTHON, osp.join(REPO, 'tools/demo/vtab_task.py'), '--root', 'data/vtab_demo'], cwd)
    assert osp.isfile(tmp_path / 'data/vtab_demo' / DEMO_TASK / 'train800val200.txt')
    run([PYTHON, osp.join(REPO, 'tools/model_converters/vit_to_mmpretrain.py'), 'mae',
         'data/vtab_demo/mae_pretrain_vit_demo.pth',
         'data/vtab_demo/vit_demo_mmpretrain.pth'], cwd)
    run([PYTHON, osp.join(REPO, 'tools/train.py'), CONFIG, '--work-dir', 'work'], cwd)
    with open(glob.glob(str(tmp_path / 'work/*/vis_data/scalars.json'))[0]) as f:
        val = [r for r in map(json.loads, f) if 'accuracy/top1' in r][-1]
    assert val['accuracy/top1'] > 20.0  # 10 classes: chance is 10
    run([PYTHON, osp.join(REPO, 'tools/test.py'), CONFIG, 'work/epoch_4.pth',
         '--work-dir', 'work/test'], cwd)
    with open(glob.glob(str(tmp_path / 'work/test/*/*.json'))[0]) as f:
        assert json.load(f)['accuracy/top1'] == val['accuracy/top1']
