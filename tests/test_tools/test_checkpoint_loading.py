"""Loading checkpoints through every public path: the Runner (resume,
tools/test.py), the publish tools, mmdet's inference APIs; wrong or unsafe
files stop with the file named."""
import copy
import os.path as osp
import pickle
import re
import subprocess

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner, load_checkpoint
from preflight import check_config  # tools/

from moppa_mm.models import read_adapter_record
from moppa_mm.models.backbones.load_check import PretrainedMismatchError
from moppa_mm.utils.checkpoints import CheckpointLoadError
from tests.conftest import PYTHON, REPO, child_env, dump_cfg, tiny_detection_cfg
from tests.test_tools.test_checkpoint_faults import load_tool
from tests.test_utils.test_checkpoints import assert_refused, crafted_checkpoint

MMDET_TOOLS = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim/tools')
MMDET_PUBLISH = osp.join(MMDET_TOOLS, 'model_converters/publish_model.py')


def run(args, timeout=600):
    return subprocess.run(args, cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope='module')
def trained(shapes_data, tmp_path_factory):
    """A 2-iteration real training run; adapter-only checkpoint at iter 2."""
    work = tmp_path_factory.mktemp('train')
    cfg = tiny_detection_cfg(shapes_data, work, max_iters=2)
    Runner.from_cfg(cfg).train()
    config = dump_cfg(cfg, work / 'tiny.py')
    return dict(cfg=cfg, config=config, work=str(work),
                ckpt=str(work / 'iter_2.pth'), data=shapes_data)


def build_detector(cfg):
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    return MODELS.build(cfg.model)


def test_training_checkpoint_is_plain_and_resumes(trained, tmp_path):
    ckpt = torch.load(trained['ckpt'], weights_only=True)  # nothing but plain data
    assert 'rng_state' in ckpt['meta']
    assert read_adapter_record(ckpt)['base']['fingerprint']  # the record
    assert {'message_hub', 'optimizer', 'param_schedulers'} <= set(ckpt)

    cfg = tiny_detection_cfg(trained['data'], tmp_path, max_iters=3)
    cfg.load_from, cfg.resume = trained['ckpt'], True
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 3
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 3  # the two logged before the checkpoint came back


def test_mmdet_publish_tool_reads_our_checkpoint(trained, tmp_path):
    result = run([PYTHON, MMDET_PUBLISH, trained['ckpt'], str(tmp_path / 'pub.pth')])
    assert result.returncode == 0, result.stderr[-3000:]


def test_published_checkpoint_gives_the_same_metrics(trained, tmp_path):
    result = run([PYTHON, 'tools/model_converters/publish_model.py', trained['ckpt'],
                  str(tmp_path / 'tiny.pth')])
    assert result.returncode == 0, result.stderr[-3000:]
    published = result.stdout.splitlines()[-1].split()[0]
    assert osp.basename(published).startswith('tiny-') and published.endswith('.pth')
    ckpt = torch.load(published, weights_only=True)
    assert set(ckpt) == {'meta', 'state_dict'} and 'rng_state' not in ckpt['meta']
    assert osp.getsize(published) < osp.getsize(trained['ckpt']) / 2

    metrics = []
    for i, checkpoint in enumerate((trained['ckpt'], published)):
        work = tmp_path / f'test{i}'
        result = run([PYTHON, 'tools/test.py', trained['config'], checkpoint,
                      '--work-dir', str(work)])
        assert result.returncode == 0, result.stderr[-3000:]
        metrics.append(result.stdout.split('coco/bbox_mAP:')[-1].split()[0])
    assert metrics[0] == metrics[1]


def test_test_tool_refuses_crafted_and_truncated_checkpoints(trained, tmp_path):
    marker = str(tmp_path / 'ran')
    evil = crafted_checkpoint(tmp_path / 'evil.pth', marker)
    result = run([PYTHON, 'tools/test.py', trained['config'], evil,
                  '--work-dir', str(tmp_path)])
    assert result.returncode != 0
    assert_refused(result.stderr, evil, marker)
    assert 'Runner' not in result.stdout  # stopped before the Runner was built

    truncated = str(tmp_path / 'truncated.pth')
    with open(trained['ckpt'], 'rb') as src, open(truncated, 'wb') as dst:
        dst.write(src.read()[:4096])
    cfg = copy.deepcopy(trained['cfg'])
    cfg.load_from = truncated
    with pytest.raises(CheckpointLoadError, match='truncated.pth'):
        check_config(cfg, mode='test')


def test_crafted_pretrained_checkpoint_is_refused(trained, tmp_path):
    marker = str(tmp_path / 'ran')
    evil = crafted_checkpoint(tmp_path / 'evil_swin.pth', marker)
    cfg = copy.deepcopy(trained['cfg'])
    cfg.model.backbone.init_cfg.checkpoint = evil
    with pytest.raises(CheckpointLoadError) as info:  # under every tool: the backbone's build
        build_detector(cfg).init_weights()
    assert_refused(str(info.value), evil, marker)
    assert 'init_cfg.checkpoint' in str(info.value)


@pytest.mark.parametrize('damage', ['empty', 'truncated'])
def test_broken_pretrained_checkpoint_is_named(trained, tmp_path, damage):
    broken = str(tmp_path / 'broken_swin.pth')
    with open(trained['data']['pretrained'], 'rb') as src, open(broken, 'wb') as dst:
        dst.write(b'' if damage == 'empty' else src.read()[:4096])
    cfg = copy.deepcopy(trained['cfg'])
    cfg.model.backbone.init_cfg.checkpoint = broken
    with pytest.raises(CheckpointLoadError, match=f'broken_swin.pth.*{damage}'):
        build_detector(cfg).init_weights()


def test_vit_checkpoint_as_swin_pretrained_stops(trained, tmp_path):
    from mmpretrain.models.backbones import VisionTransformer

    from model_converters.vit_to_mmpretrain import save_backbone
    vit = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                                      feedforward_channels=64), img_size=32,
                            patch_size=8)
    path = save_backbone(vit.state_dict(), str(tmp_path / 'vit.pth'))
    cfg = copy.deepcopy(trained['cfg'])
    cfg.model.backbone.init_cfg.checkpoint = path
    with pytest.raises(PretrainedMismatchError,
                       match=r'vit\.pth.* restores 0 of the \d+ frozen base'):
        build_detector(cfg).init_weights()


def test_adapter_only_checkpoint_takes_the_base_built_from_the_config(trained):
    """The base comes when the model is built (init_cfg); built without it (as
    init_detector builds it), the load stops with the fix and names the base
    the record names, which it does not open."""
    model = build_detector(copy.deepcopy(trained['cfg']))  # no init_weights
    load_checkpoint(model, trained['ckpt'])
    reference = build_detector(copy.deepcopy(trained['cfg']))
    reference.init_weights()
    restored, expected = model.backbone.state_dict(), reference.backbone.state_dict()
    for key in ('patch_embed.projection.weight', 'stages.1.blocks.0.attn.w_msa.qkv.weight'):
        torch.testing.assert_close(restored[key], expected[key])
    cfg = copy.deepcopy(trained['cfg'])
    cfg.model.backbone.init_cfg = None
    recorded = read_adapter_record(torch.load(trained['ckpt'], weights_only=True))
    with pytest.raises(PretrainedMismatchError,
                       match=r"(?s)adapter-only.*no pre-trained base.*init_detector drops it.*"
                       rf"trained on '{recorded['base']['checkpoint']}'.*does not open it.*"
                       r'cfg_options=\{\}.*--merge-base'):
        load_checkpoint(build_detector(cfg), trained['ckpt'])


def test_global_scope_checkpoint_in_window_scope_model_stops(trained, tmp_path):
    cfg = copy.deepcopy(trained['cfg'])
    cfg.model.backbone.moppa_scope = 'global'
    global_model = build_detector(cfg)
    path = str(tmp_path / 'global.pth')
    torch.save({'state_dict': global_model.state_dict()}, path)
    with pytest.raises(PretrainedMismatchError,
                       match="adapters.moppa_scope: 'global' in the checkpoint"):
        load_checkpoint(build_detector(copy.deepcopy(trained['cfg'])), path)


def test_another_models_checkpoint_stops_mmdets_own_test_tool(trained, tmp_path):
    """A Mask R-CNN's adapter checkpoint (same backbone and base) under mmdet's
    tools/test.py with the Cascade config: once exit 0 with AP 0.002 and only
    mmengine's missing / unexpected key notice; now it stops, naming both."""
    from tests.test_models.test_checkpoint_contents import mask_rcnn_cfg
    mask = build_detector(Config(dict(model=mask_rcnn_cfg(trained, tmp_path))))
    path = str(tmp_path / 'mask_rcnn.pth')
    torch.save({'state_dict': mask.state_dict(), 'meta': {}}, path)
    result = run([PYTHON, osp.join(MMDET_TOOLS, 'test.py'), trained['config'], path,
                  '--work-dir', str(tmp_path / 'work')])
    assert result.returncode != 0, result.stdout[-2000:]
    assert re.search(r'the checkpoint is of another model \(it was saved from a MaskRCNN\): '
                     r'it holds \d+ tensors around the backbone that this model does not have '
                     r'\(roi_head.bbox_head.fc_cls.*and lacks \d+ that it trains '
                     r'\(roi_head.bbox_head.0', result.stderr), result.stderr[-3000:]


def test_test_tool_takes_the_base_built_from_the_config(trained, tmp_path):
    """tools/test.py (runner.test skips init_weights) on an adapter-only file:
    the backbone loaded its base when the Runner built it."""
    result = run([PYTHON, 'tools/test.py', trained['config'], trained['ckpt'],
                  '--work-dir', str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'coco/bbox_mAP:' in result.stdout


def test_inference_apis_match_the_test_tool(trained, tmp_path):
    from mmdet.apis import DetInferencer, inference_detector, init_detector
    out = str(tmp_path / 'preds.pkl')
    result = run([PYTHON, 'tools/test.py', trained['config'], trained['ckpt'],
                  '--work-dir', str(tmp_path), '--out', out])
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, 'rb') as f:  # written by the test tool above
        reference = pickle.load(f)[0]
    image = reference['img_path']

    def assert_same(bboxes, scores):
        torch.testing.assert_close(torch.as_tensor(bboxes),
                                   reference['pred_instances']['bboxes'])
        torch.testing.assert_close(torch.as_tensor(scores),
                                   reference['pred_instances']['scores'])

    # init_detector clears the backbone's init_cfg unless cfg_options is given:
    # the model is then built without its base, and an adapter-only checkpoint
    # stops with the fix; with cfg_options the base comes from the config
    with pytest.raises(PretrainedMismatchError, match=r'cfg_options=\{\}'):
        init_detector(trained['config'], trained['ckpt'], device='cpu')
    model = init_detector(trained['config'], trained['ckpt'], device='cpu', cfg_options={})
    pred = inference_detector(model, image).pred_instances
    assert_same(pred.bboxes, pred.scores)
    result = run([PYTHON, 'tools/model_converters/publish_model.py', trained['ckpt'],
                  str(tmp_path / 'full.pth'), '--merge-base'])
    assert result.returncode == 0, result.stderr[-3000:]
    full = result.stdout.splitlines()[-1].split()[0]

    assert len(reference['pred_instances']['scores']) > 0
    model = init_detector(trained['config'], full, device='cpu')
    pred = inference_detector(model, image).pred_instances
    assert_same(pred.bboxes, pred.scores)
    inferencer = DetInferencer(model=trained['config'], weights=full, device='cpu',
                               show_progress=False)
    pred = inferencer(image, return_datasamples=True)['predictions'][0].pred_instances
    assert_same(pred.bboxes, pred.scores)

    inferencer = DetInferencer(model=trained['config'], weights=trained['ckpt'],
                               device='cpu', show_progress=False)  # adapter-only
    pred = inferencer(image, return_datasamples=True)['predictions'][0].pred_instances
    assert_same(pred.bboxes, pred.scores)

    # merged (adapters folded into the weights): a model built merged loads it
    # (model.backbone.merged=True); the predictions are the unmerged ones
    result = run([PYTHON, 'tools/model_converters/publish_model.py', trained['ckpt'],
                  str(tmp_path / 'merged.pth'), '--merge'])
    assert result.returncode == 0, result.stderr[-3000:]
    merged = result.stdout.splitlines()[-1].split()[0]
    state = torch.load(merged, weights_only=True)['state_dict']
    assert read_adapter_record(state)['merged'] is True
    assert not any('ssf_' in key or key.endswith('route_logits') for key in state)
    with pytest.raises(PretrainedMismatchError, match='model.backbone.merged=True'):
        init_detector(trained['config'], merged, device='cpu')
    model = init_detector(trained['config'], merged, device='cpu',
                          cfg_options={'model.backbone.merged': True})
    assert model.backbone.merged
    pred = inference_detector(model, image).pred_instances
    torch.testing.assert_close(torch.as_tensor(pred.bboxes),
                               reference['pred_instances']['bboxes'], atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(torch.as_tensor(pred.scores),
                               reference['pred_instances']['scores'], atol=1e-5, rtol=1e-5)
    result = run([PYTHON, 'tools/test.py', trained['config'], merged,
                  '--work-dir', str(tmp_path / 'merged_test')])
    assert result.returncode != 0
    assert '--cfg-options model.backbone.merged=True' in result.stderr
    result = run([PYTHON, 'tools/test.py', trained['config'], merged,
                  '--work-dir', str(tmp_path / 'merged_test'),
                  '--cfg-options', 'model.backbone.merged=True'])
    assert result.returncode == 0, result.stderr[-3000:]


def test_mmpretrain_apis_match_the_test_tool(tmp_path):
    """get_model / ImageClassificationInferencer on an adapter-only checkpoint:
    the pre-trained ViT comes from init_cfg when the model is built; same
    scores as tools/test.py."""
    from mmpretrain.apis import ImageClassificationInferencer, get_model
    from mmpretrain.models.backbones import VisionTransformer

    from demo.vtab_task import make_vtab_task
    from model_converters.vit_to_mmpretrain import save_backbone
    from tests.test_tools.test_vtab_pipeline import tiny_vtab_cfg
    root = str(tmp_path / 'vtab')
    make_vtab_task(root, 'eurosat', dict(train800val200=8, test=4))
    torch.manual_seed(0)
    vit = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                                      feedforward_channels=64), img_size=32,
                            patch_size=8)
    vit.init_weights()
    pretrained = save_backbone(vit.state_dict(), str(tmp_path / 'vit.pth'))
    cfg = tiny_vtab_cfg(root, pretrained, 'eurosat', str(tmp_path / 'work'))
    Runner.from_cfg(cfg).train()
    ckpt = str(tmp_path / 'work' / 'epoch_2.pth')
    config = dump_cfg(cfg, tmp_path / 'vit.py')
    out = str(tmp_path / 'preds.pkl')
    result = run([PYTHON, 'tools/test.py', config, ckpt, '--work-dir',
                  str(tmp_path / 'test'), '--out', out])
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, 'rb') as f:  # written by the test tool above
        reference = pickle.load(f)[0]
    image, expected = reference['img_path'], torch.as_tensor(reference['pred_score'])

    model = get_model(config, pretrained=ckpt, device='cpu')
    scores = ImageClassificationInferencer(model=model, pretrained=False)(
        image, return_datasamples=True)[0].pred_score
    torch.testing.assert_close(torch.as_tensor(scores), expected)
    inferencer = ImageClassificationInferencer(model=config, pretrained=ckpt,
                                               device='cpu')
    scores = inferencer(image, return_datasamples=True)[0].pred_score
    torch.testing.assert_close(torch.as_tensor(scores), expected)
    # the default output names the class from the checkpoint's dataset_meta,
    # which a plain checkpoint keeps as saved (tuples included)
    prediction = inferencer(image)[0]
    label = int(expected.argmax())
    assert prediction['pred_label'] == label
    classes = torch.load(ckpt, weights_only=True)['meta']['dataset_meta']['classes']
    assert isinstance(classes, tuple) and prediction['pred_class'] == classes[label]

    publish = load_tool('tools/model_converters/publish_model.py')
    merged = publish.publish(ckpt, str(tmp_path / 'merged.pth'), merge=True)
    model = get_model(config, pretrained=merged, device='cpu', backbone=dict(merged=True))
    assert model.backbone.merged
    scores = ImageClassificationInferencer(model=model, pretrained=False)(
        image, return_datasamples=True)[0].pred_score
    torch.testing.assert_close(torch.as_tensor(scores), expected, atol=1e-5, rtol=1e-5)
