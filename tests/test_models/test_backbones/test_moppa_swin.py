import copy

import pytest
import torch
from mmdet.models.backbones import SwinTransformer
from mmdet.models.backbones.swin import swin_converter

from demo.coco_shapes import mmdet_swin_to_official
from moppa_mm.models import MoPPASwinTransformer
from moppa_mm.models import full_state_dict
from moppa_mm.models.backbones.adapter_params import is_adapter_key, parameter_breakdown
from moppa_mm.models.backbones.adapter_params import parameter_report
from moppa_mm.models.backbones.moppa_swin import SwinConvAdapter, SwinMoPPAUnit

TINY = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4), window_size=7,
            out_indices=(0, 1))


def adapter_key(key):
    return is_adapter_key(key)  # the package's one predicate


def plain_and_moppa(**kwargs):
    torch.manual_seed(0)
    plain = SwinTransformer(**TINY)
    plain.init_weights()
    moppa = MoPPASwinTransformer(**TINY, **kwargs)
    missing, unexpected = moppa.load_state_dict(plain.state_dict(), strict=False)
    # a pre-trained base: the adapters keep their values (no missing-key noise)
    assert unexpected == [] and missing == []
    plain.eval()
    moppa.eval()
    return plain, moppa


@pytest.mark.parametrize('scope', ['window', 'global'])
def test_shapes_match_plain_swin_at_odd_sizes(scope):
    plain, moppa = plain_and_moppa(moppa_scope=scope)
    x = torch.randn(1, 3, 225, 319)
    with torch.no_grad():
        expected, outs = plain(x), moppa(x)
    assert [o.shape for o in outs] == [o.shape for o in expected]
    assert outs[0].shape == (1, 16, 57, 80)  # stride 4, padded like plain Swin
    # the adapters do something (MoPPA starts near, not at, the identity)
    assert not torch.allclose(outs[1], expected[1])


@pytest.mark.parametrize('scope', ['window', 'global'])
def test_bypassed_adapters_give_plain_swin_exactly(scope):
    plain, moppa = plain_and_moppa(moppa_scope=scope)
    moppa.adapters_enabled = False
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        for got, want in zip(moppa(x), plain(x)):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    moppa.adapters_enabled = True
    assert moppa.adapters_enabled


def test_window_unit_sees_the_attention_windows():
    _, moppa = plain_and_moppa()
    seen = []
    unit = moppa.stages[0].blocks[1].attn.w_msa.moppa  # a shifted block's
    unit.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    with torch.no_grad():
        moppa(torch.randn(1, 3, 60, 90))  # 15x23 tokens -> padded to 21x28
    assert seen == [torch.Size([3 * 4, 7 * 7, 16])]  # (B*nW, Wh*Ww, C), on the (7, 7) grid
    assert unit.grid_size == (7, 7)


def test_global_unit_resizes_to_the_feature_map():
    _, moppa = plain_and_moppa(moppa_scope='global')
    unit = moppa.stages[0].blocks[0].moppa
    assert unit.grid_size == (56, 56)  # pretrain_img_size 224 / patch 4
    seen = []
    unit.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    with torch.no_grad():
        moppa(torch.randn(1, 3, 60, 90))
    assert seen == [torch.Size([1, 15 * 23, 16])]  # (B, H*W, C)


def test_official_checkpoint_through_mmdet_converter_loads(tmp_path):
    torch.manual_seed(1)
    plain = SwinTransformer(**TINY)
    official = mmdet_swin_to_official(plain.state_dict())
    assert any(k.startswith('layers.0.blocks.0.attn.qkv') for k in official)
    assert any(k.startswith('layers.0.blocks.0.mlp.fc1') for k in official)
    converted = swin_converter(official)  # mmdet's own conversion
    restored = {k[len('backbone.'):]: v for k, v in converted.items()}
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(restored[key], value)  # exact inverse
    # and through the config path: init_cfg + convert_weights
    path = tmp_path / 'swin_official.pth'
    torch.save({'model': official}, path)
    moppa = MoPPASwinTransformer(
        **TINY, convert_weights=True,
        init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    moppa.init_weights()
    state = full_state_dict(moppa)
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[key], value)


def test_trainable_set_and_init_weights_keep_adapters_neutral():
    moppa = MoPPASwinTransformer(**TINY, random_base=True)
    with torch.no_grad():
        for p in moppa.parameters():
            p.add_(1.0)  # disturb everything
    moppa.init_weights()  # no checkpoint: mmdet re-initialises every Linear
    for name, param in moppa.named_parameters():
        assert param.requires_grad == adapter_key('.' + name), name
    for module in moppa.modules():
        if isinstance(module, SwinConvAdapter):
            assert torch.count_nonzero(module.up.weight) == 0  # identity at init
        if isinstance(module, SwinMoPPAUnit):
            assert torch.count_nonzero(module.route_logits) == 0
    moppa.train()
    outs = moppa(torch.randn(1, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    for name, param in moppa.named_parameters():
        assert (param.grad is not None) == param.requires_grad, name
    # the shipped units start as Eq. 11 (init_mode='paper'): no gate, and every
    # expert's parameters get a gradient at step 0
    unit = moppa.stages[0].blocks[0].attn.w_msa.moppa
    assert not hasattr(unit, 'gate')
    for name in ('frequency_maps', 'channel_maps'):
        for row, grad in enumerate(getattr(unit, name).grad):  # every expert's
            assert grad.abs().sum() > 0, (name, row)
    assert moppa.stages[0].blocks[0].conv_adapter.up.weight.grad.abs().sum() > 0


@pytest.mark.parametrize('with_cp', [False, True])
def test_lean_conv_adapter_matches_plain_autograd(with_cp):
    """In the backbone, the conv adapter's memory-lean backward (norm2's output
    recomputed) gives the gradients that plain autograd gives."""
    torch.manual_seed(0)  # no drop path: both runs must see the same network
    lean = MoPPASwinTransformer(**TINY, with_cp=with_cp, drop_path_rate=0.0, random_base=True)
    with torch.no_grad():
        for module in lean.modules():
            if isinstance(module, SwinConvAdapter):
                module.up.weight.normal_(0, 0.1)  # away from the zero init
    plain = copy.deepcopy(lean)
    for module in plain.modules():
        if isinstance(module, SwinConvAdapter):  # the reference: plain forward
            module.forward_after_norm = lambda x, src, norm, grid, m=module: m(x, grid)
    seen = []
    lean.stages[1].blocks[1].ffn.register_forward_pre_hook(  # the adapter's output
        lambda m, args: seen.append(args[0].grad_fn and args[0].grad_fn.name()))
    x = torch.randn(1, 3, 64, 64, requires_grad=with_cp)
    grads = []
    for model in (lean, plain):
        outs = model(x)
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum()
            for o in outs).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    # (a reentrant checkpoint runs forward without grad, then again in backward)
    assert '_ConvAdapterFunctionBackward' in seen
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_gradient_checkpointing():
    """with_cp=True gives every trainable parameter the gradient it gets
    without checkpointing (same weights, same input)."""
    torch.manual_seed(0)  # no drop path: both runs must see the same network
    plain_cp = MoPPASwinTransformer(**TINY, with_cp=False, drop_path_rate=0.0,
                                    random_base=True)
    with_cp = MoPPASwinTransformer(**TINY, with_cp=True, drop_path_rate=0.0,
                                   random_base=True)
    with_cp.load_state_dict(plain_cp.state_dict())
    x = torch.randn(1, 3, 64, 64, requires_grad=True)
    grads = []
    for model in (plain_cp, with_cp):
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum()
            for o in model(x)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()
                      if p.requires_grad})
    assert all(g is not None for g in grads[1].values())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


def test_deepcopy_gives_the_copy_its_own_adapters():
    """EMA's deepcopy: the copy's blocks and window attention run the copy's
    units and scale & shift, not the original's."""
    _, moppa = plain_and_moppa(use_scale_shift=True)
    clone = copy.deepcopy(moppa)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = moppa(x)
        clone.stages[0].blocks[0].attn.w_msa.moppa.route_logits.copy_(
            torch.tensor([2.0, -1.0, 0.5]))
        after = moppa(x)
        changed = clone(x)
    torch.testing.assert_close(before[0], after[0])  # original untouched
    assert not torch.allclose(changed[0], before[0])  # the clone uses its unit
    originals = dict(moppa.named_modules())
    assert not any(module is originals[name] for name, module in clone.named_modules())


def test_swin_b_budget_matches_paper():
    model = MoPPASwinTransformer(embed_dims=128, depths=[2, 2, 18, 2],
                                 num_heads=[4, 8, 16, 32], window_size=7)
    counts = parameter_breakdown(model)
    print('\n' + parameter_report(model))
    trainable = counts['total']['trainable']
    assert abs(trainable / 3.18e6 - 1) < 0.05, trainable
    assert counts['pretrained']['trainable'] == 0
    # per block: heat, wave, poisson L*N + C/N each, router 3; L = 49 window
    # tokens (the shipped init_mode='paper' has no gate)
    expected_moppa = sum(d * (3 * (49 * n + c // n) + 3) for d, n, c in zip(
        [2, 2, 18, 2], [4, 8, 16, 32], [128, 256, 512, 1024]))
    assert counts['moppa']['total'] == expected_moppa


def test_bad_arguments():
    with pytest.raises(ValueError, match="model.backbone.moppa_scope = 'windows'"):
        MoPPASwinTransformer(**TINY, moppa_scope='windows')
    with pytest.raises(ValueError, match='model.backbone.adapter_ratio = 0'):
        MoPPASwinTransformer(**TINY, adapter_ratio=0)
    with pytest.raises(ValueError, match="unknown option.*'tau'"):
        MoPPASwinTransformer(**TINY, moppa_cfg=dict(tau=1.0))
    with pytest.raises(ValueError, match="must not set 'num_heads'"):
        MoPPASwinTransformer(**TINY, moppa_cfg=dict(num_heads=2))


def test_checkpointed_blocks_take_the_grid_of_the_forward_they_recompute():
    """with_cp: forward at 64x64, forward at 96x96, then backward of the first.
    The recompute of the first forward's blocks must use its 64x64 grids, and
    the gradients must equal those without checkpointing."""
    torch.manual_seed(0)
    checkpointed = MoPPASwinTransformer(**TINY, with_cp=True, random_base=True)
    with torch.no_grad():
        for module in checkpointed.modules():
            if isinstance(module, SwinConvAdapter):
                module.up.weight.normal_(0, 0.1)  # away from the zero init
    plain = copy.deepcopy(checkpointed)
    for module in plain.modules():
        if hasattr(module, 'with_cp'):
            module.with_cp = False
    grads = []
    for model in (checkpointed, plain):
        torch.manual_seed(1)  # the same input and drop-path draws for both
        first = model(torch.randn(1, 3, 64, 64, requires_grad=True))
        model(torch.randn(1, 3, 96, 96))
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum()
            for o in first).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert grads[0][name] is not None, name
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


@pytest.mark.parametrize('scope', ['window', 'global'])
def test_block_forward_is_written_out(scope):
    """A block is its submodules called in order: ``norm1``, the global
    unit, ``attn`` (the window unit inside, on the windows), the residual,
    ``norm2``, the conv adapter on the (H, W) grid, ``ffn``."""
    _, moppa = plain_and_moppa(moppa_scope=scope)
    block = moppa.stages[0].blocks[1]  # a shifted block
    with torch.no_grad():
        block.conv_adapter.up.weight.normal_(0, 0.1)  # away from the zero init
    x, hw_shape = torch.randn(2, 8 * 12, 16), (8, 12)
    with torch.no_grad():
        attn_input = block.norm1(x)
        if scope == 'global':
            attn_input = block.moppa(attn_input.view(2, 8, 12, 16)).view(2, -1, 16)
        attended = block.attn(attn_input, hw_shape) + x  # (window unit inside)
        tokens = block.conv_adapter(block.norm2(attended).view(2, 8, 12, 16))
        expected = block.ffn(tokens.view(2, -1, 16), identity=attended)
        torch.testing.assert_close(block(x, hw_shape), expected)
        if scope == 'window':  # the unit runs on the attention's windows
            seen = []
            block.attn.w_msa.moppa.register_forward_hook(
                lambda m, i, o: seen.append(i[0].shape))
            block(x, hw_shape)
            assert seen == [torch.Size([2 * 2 * 2, 7 * 7, 16])]  # (B*nW, Wh*Ww, C)


@pytest.mark.parametrize('scope', ['window', 'global'])
def test_without_moppa_keeps_the_conv_adapters(scope):
    """``use_moppa=False``: no unit, the conv adapters stay (zero-init ``up``:
    the plain Swin's output)."""
    plain, model = plain_and_moppa(moppa_scope=scope, use_moppa=False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all('.conv_adapter.' in n for n in names)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        for got, want in zip(model(x), plain(x)):
            torch.testing.assert_close(got, want)


def test_adapters_of_another_model_are_named_as_such():
    """A checkpoint whose adapters are all another model's (a ViT's given to
    the Swin) is called a checkpoint of another model, not a partial one."""
    from moppa_mm.models.backbones import MoPPAVisionTransformer
    from moppa_mm.models.backbones.load_check import PretrainedMismatchError
    vit = MoPPAVisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                           feedforward_channels=64),
                                 img_size=32, patch_size=8)
    vit_adapters = {k: v for k, v in vit.state_dict().items() if adapter_key(k)}
    _, moppa = plain_and_moppa()
    with pytest.raises(PretrainedMismatchError, match='none of this model.*another model'):
        moppa.load_state_dict(vit_adapters, strict=False)


@pytest.mark.parametrize('scope', ['window', 'global'])
@pytest.mark.parametrize('with_cp', [False, True])
def test_each_stage_builds_its_units_filters_once_per_forward(scope, with_cp, monkeypatch):
    """A training forward builds the filters and fields of a stage's units in
    one stacked set of operations (one build per stage), and gives the outputs
    and gradients that each unit building its own gives; checkpointed blocks
    too, whose recompute in backward builds each unit's own."""
    from moppa_mm.models.backbones import swin_adapters
    from moppa_mm.operators import MoPPAUnit
    torch.manual_seed(0)
    model = MoPPASwinTransformer(**TINY, moppa_scope=scope, with_cp=with_cp,
                                 drop_path_rate=0.0, random_base=True)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    builds = []
    build = MoPPAUnit.filter_and_field
    monkeypatch.setattr(MoPPAUnit, 'filter_and_field',
                        lambda unit, *a, **k: builds.append(unit) or build(unit, *a, **k))
    x = torch.randn(1, 3, 64, 96, requires_grad=True)
    results = []
    for shared in (True, False):
        if not shared:  # every unit its own filter and field
            monkeypatch.setattr(swin_adapters, 'shared_unit_terms', lambda *args: None)
        model.zero_grad()
        builds.clear()
        outs = model(x)
        if shared and not with_cp:
            assert len(builds) == len(model.stages)  # one stacked build per stage
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs).backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.requires_grad}))
    (outs, grads), (own_outs, own_grads) = results
    for out, own in zip(outs, own_outs):
        torch.testing.assert_close(out, own)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, own_grads[name], msg=name)
