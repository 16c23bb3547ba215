import pytest
import torch
from mmpretrain.models.backbones import VisionTransformer

from moppa_mm.datasets import FGVC_DATASETS, VTAB_TASKS
from moppa_mm.models import MoPPAVisionTransformer
from moppa_mm.models.backbones.adapter_params import parameter_breakdown, parameter_report

TINY = dict(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                      feedforward_channels=64), img_size=32, patch_size=8)


def adapter_key(key):
    return 'moppa' in key or 'ssf_' in key


def plain_and_moppa(both=None, **kwargs):
    torch.manual_seed(0)
    plain = VisionTransformer(**TINY, **(both or {}))
    moppa = MoPPAVisionTransformer(**TINY, **(both or {}), **kwargs)
    missing, unexpected = moppa.load_state_dict(plain.state_dict(), strict=False)
    assert unexpected == [] and all(adapter_key(k) for k in missing)
    plain.eval()
    moppa.eval()
    return plain, moppa


def attention_inputs(layer):
    """Records the layer's ``ln1`` output and what its attention receives
    (the unit's output)."""
    seen = {}
    layer.ln1.register_forward_hook(lambda m, a, o: seen.__setitem__('ln1', o.clone()))
    layer.attn.register_forward_pre_hook(
        lambda m, a: seen.__setitem__('attn', a[0].clone()))
    return seen


@pytest.mark.parametrize('size', [(32, 32), (40, 24), (56, 72)])
def test_any_patch_grid(size):
    """At any image size each layer's unit runs on the patch grid of that
    size: the attention receives the unit's output on the (H, W) grid."""
    plain, moppa = plain_and_moppa()
    grid = (size[0] // 8, size[1] // 8)
    seen = [attention_inputs(layer) for layer in moppa.layers]
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        assert moppa(x)[0].shape == plain(x)[0].shape == (2, 32)
        for layer, inputs in zip(moppa.layers, seen):
            patches = inputs['ln1'][:, 1:].reshape(2, *grid, 32)
            expected = layer.moppa(patches).reshape(2, -1, 32)
            torch.testing.assert_close(inputs['attn'][:, 1:], expected)
            torch.testing.assert_close(inputs['attn'][:, 0], inputs['ln1'][:, 0])


def test_layer_called_on_its_own_infers_its_grid():
    """The backbone hands each layer its patch grid; a layer called without
    one takes it from its token count: the reference grid, else a square one,
    else a clear error."""
    _, moppa = plain_and_moppa()
    layer = moppa.layers[0]
    inputs = {}
    layer.register_forward_pre_hook(lambda m, a: inputs.__setitem__('args', a))
    layer.register_forward_hook(lambda m, a, o: inputs.__setitem__('out', o))
    with torch.no_grad():
        for size in ((32, 32), (48, 48)):  # reference 4x4, square 6x6
            moppa(torch.randn(1, 3, *size))
            x, grid = inputs['args'][:2]
            assert tuple(grid) == (size[0] // 8, size[1] // 8)
            torch.testing.assert_close(layer(x), inputs['out'], atol=0, rtol=0)
        with pytest.raises(ValueError, match='patch grid of 15 patch tokens'):
            layer(torch.randn(1, 16, 32))  # 5 x 3 patches: ambiguous alone
        layer(torch.randn(1, 16, 32), (5, 3))  # given the grid, it runs


def test_bypassed_adapters_give_plain_vit_exactly():
    plain, moppa = plain_and_moppa(both=dict(out_type='featmap'))
    moppa.adapters_enabled = False
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        torch.testing.assert_close(moppa(x)[0], plain(x)[0], atol=0, rtol=0)


def test_adapters_are_identity_at_init_but_for_moppa():
    """Scale & shift start as the identity: with MoPPA bypassed the output
    equals plain ViT's even with them enabled."""
    plain, moppa = plain_and_moppa()
    for layer in moppa.layers:
        layer.moppa.enabled = False
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(moppa(x)[0], plain(x)[0])


def test_class_token_passes_the_unit_unchanged():
    _, moppa = plain_and_moppa()
    seen = {}
    attn = moppa.layers[0].attn
    attn.register_forward_pre_hook(lambda m, a: seen.setdefault('in', a[0].clone()))
    ln1_out = {}
    moppa.layers[0].ln1.register_forward_hook(
        lambda m, a, o: ln1_out.setdefault('out', o.clone()))
    with torch.no_grad():
        moppa(torch.randn(1, 3, 40, 24))  # 5 x 3 patches
    # the attention receives the unit's output: the class token is untouched,
    # the patch tokens changed
    torch.testing.assert_close(seen['in'][:, 0], ln1_out['out'][:, 0])
    assert not torch.allclose(seen['in'][:, 1:], ln1_out['out'][:, 1:])


def test_trainable_set_and_gradients():
    moppa = MoPPAVisionTransformer(**TINY, random_base=True)
    moppa.init_weights()
    for name, p in moppa.named_parameters():
        assert p.requires_grad == adapter_key(name), name
    moppa.train()
    moppa(torch.randn(2, 3, 32, 32))[0].sum().backward()
    grads = {n for n, p in moppa.named_parameters() if p.grad is not None}
    assert grads == {n for n, p in moppa.named_parameters() if p.requires_grad}


def test_vit_b_budgets_match_the_paper():
    model = MoPPAVisionTransformer(arch='b', img_size=224, patch_size=16)
    print('\n' + parameter_report(model))
    adapters = parameter_breakdown(model)['total']['trainable']
    head = lambda classes: 768 * classes + classes  # noqa: E731
    vtab = adapters + sum(head(c) for c in VTAB_TASKS.values()) / len(VTAB_TASKS)
    fgvc = adapters + sum(head(c) for c, _ in FGVC_DATASETS.values()) / len(FGVC_DATASETS)
    in1k = adapters + head(1000)
    print(f'without head {adapters / 1e6:.4f}M, VTAB {vtab / 1e6:.4f}M, '
          f'FGVC {fgvc / 1e6:.4f}M, IN-1K {in1k / 1e6:.4f}M')
    assert abs(adapters / 0.225e6 - 1) < 0.10
    assert abs(vtab / 0.26e6 - 1) < 0.10
    assert abs(fgvc / 0.40e6 - 1) < 0.10
    assert abs(in1k / 0.99e6 - 1) < 0.10


def test_vit_l_builds():
    model = MoPPAVisionTransformer(arch='l', img_size=224, patch_size=16)
    counts = parameter_breakdown(model)
    # heat, wave, poisson L*N + C/N each, router 3 (init_mode='paper': no gate)
    assert counts['moppa']['trainable'] == 24 * (3 * (196 * 16 + 1024 // 16) + 3)
    assert counts['pretrained']['trainable'] == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="must not set 'grid_size'"):
        MoPPAVisionTransformer(**TINY, moppa_cfg=dict(grid_size=3))
    with pytest.raises(ValueError, match='divisible by num_heads'):
        MoPPAVisionTransformer(**TINY, moppa_heads=3)


def test_scale_shift_touches_only_its_slice():
    from moppa_mm.models.layers.scale_shift import Conv2dScaleShift, LinearScaleShift
    qkv, x = torch.nn.Linear(6, 12), torch.randn(2, 5, 6)
    plain = qkv(x)
    value = LinearScaleShift.convert(qkv, offset=8).ssf_out  # the v part of a qkv of 3 x 4
    with torch.no_grad():
        value.scale.copy_(torch.tensor([2.0, 3.0, 4.0, 5.0]))
        value.shift.fill_(1.0)
    y = qkv(x)
    torch.testing.assert_close(y[..., :8], plain[..., :8])
    torch.testing.assert_close(y[..., 8:], plain[..., 8:] * value.scale + 1.0)
    conv, z = torch.nn.Conv2d(2, 3, 1), torch.randn(2, 2, 4, 4)
    plain = conv(z)
    channels = Conv2dScaleShift.convert(conv).ssf_out  # (B, C, H, W): channel axis 1
    with torch.no_grad():
        channels.scale.copy_(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(conv(z), plain * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1))


def test_scale_shift_keeps_no_activation_of_its_own_where_the_next_op_keeps_one():
    """The scale & shift on the first MLP layer and on the attention's value
    keep the layer's (scaled) output, which GELU and the attention keep anyway:
    per layer, the MLP's hidden width is kept once, and the qkv width once.
    Autograd's ``x * scale + shift`` kept the raw output besides (one more of
    each)."""
    torch.manual_seed(0)
    dims, hidden, layers = 32, 64, 2
    model = MoPPAVisionTransformer(arch=dict(embed_dims=dims, num_layers=layers, num_heads=4,
                                             feedforward_channels=hidden),
                                   img_size=32, patch_size=8, random_base=True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    widths = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params and tensor.dim() >= 2:
            widths.setdefault(tensor.shape[-1], set()).add(storage.data_ptr())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(2, 3, 32, 32))[-1].sum().backward()
    assert len(widths[hidden]) == layers
    assert len(widths[3 * dims]) == layers
    assert all(p.grad is not None for n, p in model.named_parameters() if 'ssf_' in n)


def test_frozen_stages_freeze_their_adapters_too():
    """As in the MoPPA Swin: the adapters inside frozen layers and the patch
    embedding's scale & shift freeze with them; later layers keep theirs."""
    moppa = MoPPAVisionTransformer(**TINY, frozen_stages=1)
    trainable = {n for n, p in moppa.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in moppa.named_parameters()
                         if n.startswith('layers.1.') and adapter_key(n)}
    assert any('layers.1.moppa.' in n for n in trainable)


def test_checkpoint_at_224_loads_into_384():
    """Frequency maps k, c, H1 saved at 224 (14x14 patches) are resized to the
    24x24 grid of a 384 model on load, frequency-exactly."""
    from moppa_mm.operators import resize_frequency_map
    arch = dict(TINY['arch'], num_layers=1)
    torch.manual_seed(0)
    at_224 = MoPPAVisionTransformer(arch=arch, img_size=224, patch_size=16)
    at_384 = MoPPAVisionTransformer(arch=arch, img_size=384, patch_size=16)
    saved = at_224.state_dict()
    at_384.load_state_dict(saved)  # strict; pos_embed is resized by mmpretrain
    key = 'layers.0.moppa.frequency_maps'
    assert saved[key].shape == (3, 14, 14, 4)  # k, c, H1
    for row in range(3):
        expected = resize_frequency_map(saved[key][row].permute(2, 0, 1), (24, 24))
        torch.testing.assert_close(at_384.state_dict()[key][row], expected.permute(1, 2, 0),
                                   atol=0, rtol=0)


def test_without_moppa_only_scale_shift():
    """``use_moppa=False`` (the paper's "w/o MoPPA" ablation): no unit, the
    scale & shift stay; with them at identity it is the plain ViT."""
    plain, model = plain_and_moppa(use_moppa=False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all('ssf_' in n for n in names)
    assert not any('moppa' in n for n, _ in model.named_parameters())
    x = torch.randn(2, 3, 40, 24)  # any grid: no unit needs one
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], plain(x)[0])


@pytest.mark.parametrize('img_size', [32, 80])  # 4x4 patches: Kronecker DCT; 10x10: separable
@pytest.mark.parametrize('autocast', [False, True])
def test_unit_on_tokens_equals_split_unit_concatenation(img_size, autocast):
    """The unit on the token sequence (the class token through the identity
    block of the Kronecker basis, or split off and joined for the separable
    DCT) gives what splitting off the class token, calling the unit and
    concatenating gives: values and the gradients of the tokens and of every
    unit parameter. Under bf16 autocast the whole output is in bf16, the class
    token too (the attention's projection would cast it)."""
    torch.manual_seed(0)
    model = MoPPAVisionTransformer(arch=dict(embed_dims=32, num_layers=1, num_heads=4,
                                             feedforward_channels=64),
                                   img_size=img_size, patch_size=8,
                                   moppa_cfg=dict(init_mode='identity', heat_param='softplus'))
    unit = model.layers[0].moppa
    with torch.no_grad():
        unit.gate.uniform_(0.5, 1.5)  # 0 at init: the unit would be the identity
        unit.expert_maps('poisson')[1].normal_(0, 1)
    model.train()
    h, w = unit.grid_size
    x = torch.randn(2, 1 + h * w, 32, requires_grad=True)
    grad = torch.randn(2, 1 + h * w, 32)
    params = [x] + [p for p in unit.parameters()]

    def reference():
        patches = unit(x[:, 1:].reshape(2, h, w, 32)).reshape(2, -1, 32)
        return torch.cat([x[:, :1].to(patches.dtype), patches], dim=1)

    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        ours = unit.forward_tokens(x, (h, w))
        ref = reference()
    assert ours.dtype == ref.dtype == (torch.bfloat16 if autocast else torch.float32)
    tol = dict(atol=2e-2, rtol=2e-2) if autocast else {}
    torch.testing.assert_close(ours, ref, **tol)
    for got, want in zip(torch.autograd.grad(ours, params, grad),
                         torch.autograd.grad(ref, params, grad)):
        torch.testing.assert_close(got, want, **tol)
    with torch.no_grad():  # eval: the cached filter, no autograd
        model.eval()
        torch.testing.assert_close(unit.forward_tokens(x, (h, w)), reference())
