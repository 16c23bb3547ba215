"""The adapters run from modules whose forward is written out: no hooks, no
replaced ``forward``, ``print(model)`` shows what runs, and the base keeps the
upstream backbone's state-dict keys and parameter order."""
import copy
import pickle

import pytest
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module

from mmdet.models.backbones import SwinTransformer as DetSwin
from mmpretrain.models.backbones import SwinTransformer as ClsSwin
from mmpretrain.models.backbones import VisionTransformer

from moppa_mm.models import (MoPPASwinTransformer, MoPPASwinTransformerCls,
                             MoPPAVisionTransformer)
from moppa_mm.models.backbones.adapter_params import is_adapter_key

SWIN_ARCH = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4))


def swin_det(**kwargs):  # every adapter: unit, conv adapter, scale & shift
    return MoPPASwinTransformer(**SWIN_ARCH, window_size=7, out_indices=(0, 1),
                                use_scale_shift=True, **kwargs)


def swin_cls(**kwargs):
    return MoPPASwinTransformerCls(arch=SWIN_ARCH, img_size=56, window_size=7,
                                   out_indices=(1, ), use_conv_adapter=True, **kwargs)


VIT_ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)


def vit(**kwargs):
    return MoPPAVisionTransformer(arch=VIT_ARCH, img_size=32, patch_size=8, **kwargs)


MODELS = {  # name: (build, input size, the upstream backbone it extends)
    'swin_det_window': (swin_det, 64, lambda: DetSwin(**SWIN_ARCH, window_size=7,
                                                      out_indices=(0, 1))),
    'swin_det_global': (lambda **kw: swin_det(moppa_scope='global', **kw), 64,
                        lambda: DetSwin(**SWIN_ARCH, window_size=7, out_indices=(0, 1))),
    'swin_cls': (swin_cls, 64, lambda: ClsSwin(arch=SWIN_ARCH, img_size=56, window_size=7,
                                               out_indices=(1, ))),
    'vit': (vit, 32, lambda: VisionTransformer(arch=VIT_ARCH, img_size=32, patch_size=8)),
}


@pytest.mark.parametrize('name', list(MODELS))
def test_the_base_keeps_the_upstream_keys_and_parameter_order(name):
    """Without the adapters and the record, the state dict is the upstream
    backbone's, key for key and in its order (its checkpoints load, an
    optimizer state resumes onto the same tensors); the whole state loads
    back strictly."""
    build, _, upstream = MODELS[name]
    torch.manual_seed(0)
    model = build()
    state = model.state_dict()
    assert [k for k in state if k != '_extra_state' and not is_adapter_key(k)] == \
        list(upstream().state_dict())
    assert [n for n, _ in model.named_parameters() if not is_adapter_key(n)] == \
        [n for n, _ in upstream().named_parameters()]
    torch.manual_seed(1)
    other = build()
    other.load_state_dict(state)  # strict
    for key, value in other.state_dict().items():
        if key != '_extra_state':  # the record: now names the loaded base
            torch.testing.assert_close(value, state[key], atol=0, rtol=0, msg=key)


def module_hooks(model: nn.Module) -> dict:
    """``{module name: [hook names]}`` of every module with a forward, forward
    pre- or backward hook, or an instance-level ``forward``."""
    found = {}
    for name, module in model.named_modules():
        hooks = [getattr(h, '__name__', repr(h)) for d in (
            module._forward_hooks, module._forward_pre_hooks, module._backward_hooks,
            module._backward_pre_hooks) for h in d.values()]
        if 'forward' in module.__dict__:
            hooks.append('instance forward')
        if hooks:
            found[name] = hooks
    return found


@pytest.mark.parametrize('name', list(MODELS))
def test_forward_registers_no_hooks(name):
    """Built, and after an eval and a training forward and backward: the only
    module hook is the backbone's check before a forward with gradients (the
    base is a pre-trained one), and none is global."""
    build, size, _ = MODELS[name]
    model = build(random_base=True)  # trains on its random base
    expected = {'': ['check_base']}
    assert module_hooks(model) == expected
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        model.eval()(x)
    model.train()
    sum(out.sum() for out in model(x)).backward()
    assert module_hooks(model) == expected
    assert module_hooks(copy.deepcopy(model)) == expected
    assert not torch_module._global_forward_hooks
    assert not torch_module._global_forward_pre_hooks


def assert_copies_equal(model: nn.Module, x: torch.Tensor) -> None:
    """EMA's deepcopy, and a pickle round trip (every class, the layer classes
    too, is found by its module and name), give the same modules and outputs."""
    with torch.no_grad():
        expected = model.eval()(x)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert [type(m) for m in other.modules()] == [type(m) for m in model.modules()]
        with torch.no_grad():
            for out, want in zip(other(x), expected):
                torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize('name', list(MODELS))
def test_deepcopy_and_pickle_give_the_same_model(name):
    build, size, _ = MODELS[name]
    assert_copies_equal(build(random_base=True), torch.randn(1, 3, size, size))


def test_print_shows_what_runs_where():
    swin = repr(swin_det())
    assert ' x MoPPASwinBlock(' in swin  # (0-1): 2 x ...
    assert '(w_msa): MoPPAWindowMSA(' in swin and '(moppa): SwinMoPPAUnit(scope=window,' in swin
    assert '(conv_adapter): SwinConvAdapter(' in swin
    assert '(qkv): LinearScaleShift(' in swin and 'ScaleShift(dims=16, offset=32)' in swin
    assert '(projection): Conv2dScaleShift(' in swin and '3, 16, kernel_size=(4, 4)' in swin
    assert 'SwinMoPPAUnit(scope=global,' in repr(swin_det(moppa_scope='global'))
    assert ' x MoPPASwinBlockCls(' in repr(swin_cls())
    vit_repr = repr(vit())
    assert ' x MoPPAEncoderLayer(' in vit_repr and '(moppa): ViTMoPPAUnit(' in vit_repr
    assert '(0): LinearScaleShift(' in vit_repr and '(ssf_out): ScaleShift(dims=64, ' \
        'offset=0)' in vit_repr


def test_tracebacks_name_the_module_that_runs_the_adapter():
    """A unit that fails is reached through the block's and the window
    attention's own forwards."""
    model = swin_det().eval()
    unit = model.stages[0].blocks[0].attn.w_msa.moppa

    def fail(windows, grid, **kwargs):
        raise RuntimeError('unit failed')

    unit.forward = fail
    with pytest.raises(RuntimeError, match='unit failed') as info:
        with torch.no_grad():
            model(torch.randn(1, 3, 64, 64))
    frames = [entry.name for entry in info.traceback]
    assert frames.index('forward_inner') < frames.index('forward_tokens')


@pytest.mark.parametrize('name', ['swin_det_window', 'vit'])
def test_dynamo_sees_no_graph_break_of_ours(name):
    """``torch._dynamo.explain`` of the eval forward: the Swin is one graph;
    the ViT's breaks (mmcv's ``DropPath`` compares a NumPy drop rate) are none
    in this package's code and none from a hook."""
    build, size, _ = MODELS[name]
    model = build().eval()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(torch.randn(1, 3, size, size))
    finally:
        torch._dynamo.reset()
    print(f'\n{name}: {explained.graph_count} graphs, {explained.graph_break_count} breaks')
    for reason in explained.break_reasons:
        frames = [f'{f.filename}:{f.lineno} {f.name}' for f in reason.user_stack]
        print(' ', reason.reason.splitlines()[0], '|', frames[-1:])
        assert 'hook' not in reason.reason.lower()
        assert not any('moppa_mm' in frame for frame in frames[-1:]), frames
    if name.startswith('swin'):
        assert explained.graph_break_count == 0
