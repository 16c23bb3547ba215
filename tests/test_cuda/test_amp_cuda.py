"""On a GPU (marked ``cuda``, skipped without one): mixed precision as users
run it, with mmengine's ``AmpOptimWrapper`` (what ``--amp`` selects) in
bfloat16 and float16: every MoPPA backbone trains a step (mmdet's and
mmseg's at the backbone: a detector's RoIAlign needs mmcv's compiled ops),
MMPretrain classifiers train through their own ``train_step``, a training
step's forward and backward and an eval forward make no host-device sync, and
a float16 overflow stops a Runner naming its likely cause.

The CPU twin, tests/test_models/test_mixed_precision.py, checks the dtypes
CUDA's kernels accept; these run the kernels."""
import pytest
import torch
from mmengine.optim import AmpOptimWrapper
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

from tests.test_engine.test_non_finite_loss_hook import kitti, kitti_cfg  # noqa: F401
from tests.test_models.test_mixed_precision import BACKBONES, build, outputs_loss

pytestmark = pytest.mark.cuda
DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16'}
ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
CLASSIFIERS = {
    'vit': dict(type='MoPPAVisionTransformer', arch=ARCH, img_size=32, patch_size=8,
                random_base=True),
    'swin': dict(type='MoPPASwinTransformer', arch=dict(embed_dims=16, depths=(2, 2),
                 num_heads=(2, 4)), img_size=56, window_size=7, out_indices=(1, ),
                 use_conv_adapter=True, random_base=True),
}


def amp_optim_wrapper(model, dtype):
    params = [p for p in model.parameters() if p.requires_grad]
    return AmpOptimWrapper(dtype=dtype, optimizer=torch.optim.AdamW(params, lr=1e-3))


@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize('name', BACKBONES)
def test_backbone_trains_with_amp_optim_wrapper(name, dtype):
    backbone = build(name).cuda().train()
    optim_wrapper = amp_optim_wrapper(backbone, dtype)
    params = [p for p in backbone.parameters() if p.requires_grad]
    images = torch.randn(2, 3, 32, 32, device='cuda')
    for _ in range(2):  # float16's scaler may skip a first step that overflows
        before = [p.detach().clone() for p in params]
        with optim_wrapper.optim_context(backbone):
            assert torch.get_autocast_dtype('cuda') == getattr(torch, dtype)
            loss = outputs_loss(backbone(images))
        optim_wrapper.update_params(loss)
    assert torch.isfinite(loss)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in params)
    assert any(not torch.equal(p, old) for p, old in zip(params, before))


@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize('backbone', CLASSIFIERS, ids=CLASSIFIERS.keys())
def test_classifier_train_step_with_amp_optim_wrapper(backbone, dtype):
    from mmpretrain.structures import DataSample
    init_default_scope('mmpretrain')
    size = CLASSIFIERS[backbone].get('img_size')
    classifier = MODELS.build(dict(
        type='ImageClassifier', backbone=CLASSIFIERS[backbone],
        neck=dict(type='GlobalAveragePooling') if backbone == 'swin' else None,
        head=dict(type='LinearClsHead', num_classes=5,
                  in_channels=32 if backbone == 'swin' else ARCH['embed_dims'],
                  loss=dict(type='CrossEntropyLoss')),
        data_preprocessor=dict(type='ClsDataPreprocessor', num_classes=5))).cuda()
    optim_wrapper = amp_optim_wrapper(classifier, dtype)
    data = dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[DataSample().set_gt_label(i) for i in (1, 3)])
    for _ in range(2):
        log_vars = classifier.train_step(data, optim_wrapper)
    assert torch.isfinite(log_vars['loss']) and 'loss_route' in log_vars


@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize('name', ['mmdet-swin-window', 'mmdet-swin-global',
                                  'mmpretrain-swin-window', 'mmpretrain-vit'])
def test_no_host_sync_in_a_training_step_or_an_eval_forward(name, dtype):
    """A sync stalls the GPU's queue (``bool(tensor)``, ``.item()``,
    ``.tolist()``, a copy to the host). Checked after a first step has built
    what is cached (DCT bases) and updated the parameters, over the model's
    forward and backward; the optimizer step and GradScaler (which reads its
    overflow flag) stay out."""
    backbone = build(name).cuda().train()
    optimizer = torch.optim.AdamW([p for p in backbone.parameters() if p.requires_grad])
    images = torch.randn(2, 3, 32, 32, device='cuda')
    dtype = getattr(torch, dtype)

    def step():
        with torch.autocast('cuda', dtype=dtype):
            loss = outputs_loss(backbone(images))
        loss.backward()

    step()
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        step()
        backbone.eval()
        with torch.no_grad(), torch.autocast('cuda', dtype=dtype):
            backbone(images)
            backbone(images)  # the second eval forward uses the units' cached filters
    finally:
        torch.cuda.set_sync_debug_mode('default')


def test_float16_overflow_stops_the_runner_naming_the_cause(kitti, tmp_path):  # noqa: F811
    """The real VTAB-1K config with ``--amp``'s wrapper in float16 and an eta
    small enough for the Poisson field (~ H1 H2 / 3 eta at the DC frequency)
    to exceed float16's range: the first iteration stops, naming the cause."""
    cfg = kitti_cfg(kitti, tmp_path)
    cfg.optim_wrapper.update(type='AmpOptimWrapper', dtype='float16')
    cfg.model.backbone.moppa_cfg = dict(eta=1e-12)
    runner = Runner.from_cfg(cfg)
    with pytest.raises(FloatingPointError, match=r"float16.*bfloat16.*or a larger eta"):
        runner.train()
