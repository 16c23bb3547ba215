"""Mixed precision: every MoPPA backbone (MMDetection's, MMPretrain's and
MMSegmentation's Swin, window and global scope, and ViT) trains a step
(forward, backward, an optimizer step; float16 with a GradScaler) and
evaluates, merged or not, under autocast in bfloat16 and float16, without a
call CUDA's kernels would refuse for its dtypes (tests/dtype_check.py).

CPU kernels accept mixes of dtypes that CUDA's refuse: the conv adapter's
backward recomputed its LayerNorm from a bfloat16 input with float32 weights,
which crashed every MoPPA Swin at its first step on a GPU while every CPU test
passed. The checker itself is tested first: it catches that pattern and lets a
plain Swin through."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS, init_default_scope

from moppa_mm import merge_adapters
from moppa_mm.models.layers import conv_adapter
from tests.dtype_check import MixedDtypeError, cuda_dtype_rules

SWIN_DET = dict(type='MoPPASwinTransformer', embed_dims=16, depths=(2, 2), num_heads=(2, 4),
                window_size=4, pretrain_img_size=32, out_indices=(0, 1))
SWIN_CLS = dict(type='MoPPASwinTransformer', arch=dict(embed_dims=16, depths=(2, 2),
                num_heads=(2, 4)), img_size=32, window_size=4, out_indices=(0, 1),
                use_conv_adapter=True)  # all three adapters: unit, conv, scale & shift
SWIN_SEG = dict(type='MoPPASwinTransformer', embed_dims=16, depths=(2, 2), num_heads=(1, 2),
                window_size=4, pretrain_img_size=32, out_indices=(0, 1))
VIT_CLS = dict(type='MoPPAVisionTransformer', img_size=32, patch_size=8,
               arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64))
VIT_SEG = dict(type='MoPPAVisionTransformer', img_size=32, patch_size=8, embed_dims=16,
               num_layers=2, num_heads=2, out_indices=(0, 1))
# name: (registry scope, config); the Swins once per unit scope
BACKBONES = {
    'mmdet-swin-window': ('mmdet', dict(SWIN_DET, moppa_scope='window')),
    'mmdet-swin-global': ('mmdet', dict(SWIN_DET, moppa_scope='global')),
    'mmpretrain-swin-window': ('mmpretrain', dict(SWIN_CLS, moppa_scope='window')),
    'mmpretrain-swin-global': ('mmpretrain', dict(SWIN_CLS, moppa_scope='global')),
    'mmpretrain-vit': ('mmpretrain', VIT_CLS),
    'mmseg-swin-window': ('mmseg', dict(SWIN_SEG, moppa_scope='window')),
    'mmseg-swin-global': ('mmseg', dict(SWIN_SEG, moppa_scope='global')),
    'mmseg-vit': ('mmseg', VIT_SEG),
}
DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def build(name):
    scope, cfg = BACKBONES[name]
    if scope == 'mmseg':
        pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
    init_default_scope(scope)
    torch.manual_seed(0)
    backbone = MODELS.build(dict(cfg, random_base=True))
    with torch.no_grad():  # a fine-tuned model: every adapter matters
        for param in backbone.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    return backbone


def outputs_loss(outputs) -> torch.Tensor:
    """A loss that reaches every output (a tuple of feature maps or tokens)."""
    return sum(out.float().square().mean() for out in outputs)


def train_step(backbone, images, dtype):
    """One step as mmengine's ``AmpOptimWrapper`` runs it: the forward under
    autocast, the backward outside it, float16 through a GradScaler. Returns
    the loss, the checker and the parameters before the step."""
    backbone.train()
    params = [p for p in backbone.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    scaler = torch.amp.GradScaler('cpu', enabled=dtype == torch.float16)
    with cuda_dtype_rules() as rules:
        with torch.autocast('cpu', dtype=dtype):
            loss = outputs_loss(backbone(images))
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss, rules, params, before


# ---------------------------------------------------------------- the checker
class _RecomputesTheNorm(torch.autograd.Function):
    """The pattern that crashed on CUDA: a backward (autocast off) that runs a
    LayerNorm on the forward's low-precision input with float32 weights."""

    @staticmethod
    def forward(ctx, x, norm):
        ctx.norm = norm
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        norm = ctx.norm
        with torch.no_grad():
            normed = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias)
        return grad * 2 + 0 * normed, None


def test_the_check_catches_a_norm_recomputed_in_backward():
    norm = nn.LayerNorm(8)
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(MixedDtypeError, match=r'native_layer_norm.*bfloat16.*float32.*'
                                              r'test_mixed_precision.py.*autocast is off'):
        with cuda_dtype_rules():
            with torch.autocast('cpu', dtype=torch.bfloat16):
                out = _RecomputesTheNorm.apply(x.to(torch.bfloat16), norm)
            out.float().sum().backward()


def test_the_check_catches_mixed_matmuls_and_norms_where_autocast_is_off():
    weight = torch.randn(8, 8)
    low = torch.randn(2, 8, dtype=torch.bfloat16)
    with pytest.raises(MixedDtypeError, match='addmm|mm.*CUDA refuses mixed dtypes'):
        with cuda_dtype_rules():
            torch.addmm(torch.zeros(8), low.float(), weight.to(torch.bfloat16))
    with pytest.raises(MixedDtypeError, match='autocast is off'):
        with cuda_dtype_rules():
            with torch.autocast('cpu', dtype=torch.bfloat16):
                with torch.autocast('cpu', enabled=False):
                    nn.LayerNorm(8)(low)
    with cuda_dtype_rules() as rules:  # the same norm under autocast: CUDA casts it
        with torch.autocast('cpu', dtype=torch.bfloat16):
            nn.LayerNorm(8)(low)
    assert rules.seen['mixed norms under autocast'] == 1


def test_the_check_catches_a_batch_norm_backward_cuda_refuses():
    """Batch norm's backward reduction (the scale & shift gradients): a
    bfloat16 gradient and input with float32 statistics is CUDA's AMP batch
    norm and passes; bfloat16 statistics, or a gradient of another dtype, do
    not (CPU's kernel runs both)."""
    low = torch.randn(4, 8, dtype=torch.bfloat16)
    stats = torch.rand(8) + 0.5

    def reduction(grad, mean):
        return torch.ops.aten.native_batch_norm_backward(
            grad, low, stats, None, None, mean, stats, True, 0.0, [False, True, True])

    with cuda_dtype_rules():
        reduction(low, stats)
    with pytest.raises(MixedDtypeError, match='save_mean is torch.bfloat16'):
        with cuda_dtype_rules():
            reduction(low, stats.to(torch.bfloat16))
    with pytest.raises(MixedDtypeError, match='the gradient is torch.float32'):
        with cuda_dtype_rules():
            reduction(low.float(), stats)


def test_the_check_catches_the_conv_adapters_former_recompute(monkeypatch):
    """The conv adapter's backward as it was before the fix: the MoPPA Swin's
    first training step fails the check, naming the recomputation."""

    def former(norm, norm_input):
        return F.layer_norm(norm_input, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    monkeypatch.setattr(conv_adapter, 'recompute_norm', former)
    backbone = build('mmdet-swin-window')
    with pytest.raises(MixedDtypeError, match=r'native_layer_norm.*conv_adapter.py.*'
                                              r'autocast is off'):
        train_step(backbone, torch.randn(2, 3, 32, 32), torch.bfloat16)


@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
def test_a_plain_swin_passes_the_check(dtype):
    """mmdet's own Swin under CPU autocast: its forward norms get mixed dtypes
    (CUDA autocast would cast them), which is no fault."""
    from mmdet.models.backbones import SwinTransformer
    swin = SwinTransformer(**{k: v for k, v in SWIN_DET.items() if k != 'type'})
    images = torch.randn(2, 3, 32, 32, requires_grad=True)
    with cuda_dtype_rules() as rules:
        with torch.autocast('cpu', dtype=dtype):
            loss = outputs_loss(swin(images))
        loss.backward()
    assert rules.seen['mixed norms under autocast'] > 0
    assert rules.seen['low precision matmuls'] > 0
    assert torch.isfinite(images.grad).all()


# -------------------------------------------------------------- the backbones
@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize('name', BACKBONES)
def test_trains_a_step_under_autocast(name, dtype):
    backbone = build(name)
    loss, rules, params, before = train_step(backbone, torch.randn(2, 3, 32, 32), dtype)
    assert torch.isfinite(loss)
    assert rules.seen['low precision matmuls'] > 0  # autocast ran the model
    assert params and all(p.dtype == torch.float32 for p in params)
    for param, old in zip(params, before):
        assert param.grad is not None and torch.isfinite(param.grad).all()
        assert not torch.equal(param.detach(), old)  # the step was taken (no skip)


@pytest.mark.parametrize('dtype', DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize('name', BACKBONES)
def test_evaluates_under_autocast_merged_or_not(name, dtype):
    """Eval under autocast gives float32's outputs up to the low precision's
    rounding, unmerged and (the window and ViT units) merged."""
    backbone = build(name).eval()
    images = torch.randn(2, 3, 32, 32)
    models = [backbone]
    if 'global' not in name:  # global-scope units cannot merge (their grid varies)
        models.append(merge_adapters(copy.deepcopy(backbone)))
    for model in models:
        with torch.no_grad():
            expected = model(images)
            with cuda_dtype_rules() as rules:
                with torch.autocast('cpu', dtype=dtype):
                    outputs = model(images)
        assert rules.seen['low precision matmuls'] > 0
        for out, ref in zip(outputs, expected):
            error = (out.float() - ref).abs().mean() / ref.abs().mean()
            assert error < 2e-2, f'{name}: relative error {error:.3g} in {dtype}'
