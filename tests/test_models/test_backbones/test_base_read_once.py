"""The pre-trained base file is read once per Runner build (``runner.train()``'s
``init_weights()`` included), per run of our tools/train.py and test.py and per
inference-API call, and the model holds that base after the model around the
backbone has initialised it (an mmpretrain classifier's ``init_cfg`` writes
TruncNormal over every Linear)."""
import builtins
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from model_converters.vit_to_mmpretrain import convert, save_backbone
from demo.vtab_task import prepare_cls_demo
from moppa_mm.models import MoPPASwinTransformer
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from tests.conftest import VTAB_DEMO_DATA, tiny_detection_cfg
from tests.test_tools.test_checkpoint_faults import run_tool

pytestmark = pytest.mark.slow  # Runners train an epoch / an iteration

DEIT_TINY = """_base_ = 'mmpretrain::deit/deit-tiny_4xb256_in1k.py'
custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(type='MoPPAVisionTransformer',
                  arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=4,
                            feedforward_channels=64),
                  img_size=32, patch_size=8,
                  init_cfg=dict(type='Pretrained', checkpoint={pretrained!r},
                                prefix='backbone.')),
    head=dict(num_classes=10, in_channels=32), train_cfg=None)
""" + VTAB_DEMO_DATA + """
train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
param_scheduler = []
work_dir = {work_dir!r}
"""


@pytest.fixture
def reads_of(monkeypatch):
    """``reads_of(path)``: a list that grows by one each time ``path`` is
    opened (torch.load and mmengine's file backends open through ``open``)."""
    real_open, opened = builtins.open, {}

    def counting_open(file, *args, **kwargs):
        if isinstance(file, str) and osp.abspath(file) in opened:
            opened[osp.abspath(file)].append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, 'open', counting_open)
    return lambda path: opened.setdefault(osp.abspath(path), [])


def assert_holds_the_base_of(backbone, reference):
    """Every base tensor of ``backbone`` equals that of ``reference``, a
    backbone that loaded the same file by itself."""
    expected = dict(reference.state_dict())
    base = [(k, v) for k, v in backbone.state_dict().items()
            if not is_adapter_key(k) and k != '_extra_state']
    assert base
    for key, value in base:
        torch.testing.assert_close(value, expected[key], atol=0, rtol=0, msg=key)


@pytest.fixture
def deit(tmp_path):
    """The tiny DeiT config on the VTAB demo task and its converted base file."""
    data = prepare_cls_demo(str(tmp_path / 'vtab'))
    pretrained = save_backbone(convert(data['mae_checkpoint'], 'mae'),
                               str(tmp_path / 'vit_mmpretrain.pth'))
    config = tmp_path / 'deit.py'
    config.write_text(DEIT_TINY.format(pretrained=pretrained, root=str(tmp_path / 'vtab'),
                                       work_dir=str(tmp_path / 'work')))
    return str(config), pretrained


def test_a_classifier_reads_its_base_once_and_keeps_it_through_init(tmp_path, deit, reads_of):
    from mmpretrain.apis import get_model
    from mmpretrain.registry import MODELS
    config, pretrained = deit
    cfg = Config.fromfile(config)
    assert cfg.model.init_cfg[0]['type'] == 'TruncNormal'  # writes over the base
    reference = MODELS.build(dict(cfg.model.backbone, _scope_='mmpretrain'))
    reads = reads_of(pretrained)
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert len(reads) == 1
    assert_holds_the_base_of(runner.model.backbone, reference)
    reads.clear()
    model = get_model(cfg, pretrained=str(tmp_path / 'work' / 'epoch_1.pth'))
    assert len(reads) == 1
    assert_holds_the_base_of(model.backbone, reference)


def test_our_tools_read_the_base_once(tmp_path, deit, reads_of):
    """tools/train.py and tools/test.py check the config before the Runner is
    built, but leave the base to the backbone, which reads and checks it when
    built (a Swin-B base is ~350 MB)."""
    config, pretrained = deit
    reads = reads_of(pretrained)
    run_tool('train', [config])
    assert len(reads) == 1
    reads.clear()
    run_tool('test', [config, str(tmp_path / 'work' / 'epoch_1.pth')])
    assert len(reads) == 1


def test_a_detector_reads_its_base_once(shapes_data, tmp_path, reads_of):
    from mmdet.apis import init_detector
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    reference = MoPPASwinTransformer(**{k: v for k, v in cfg.model.backbone.items()
                                        if k != 'type'})
    reads = reads_of(shapes_data['pretrained'])
    Runner.from_cfg(cfg).train()
    assert len(reads) == 1
    reads.clear()
    model = init_detector(cfg, str(tmp_path / 'work' / 'iter_1.pth'), device='cpu',
                          cfg_options={})  # {}: mmdet keeps the backbone's init_cfg
    assert len(reads) == 1
    assert_holds_the_base_of(model.backbone, reference)
