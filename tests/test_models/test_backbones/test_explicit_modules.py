"""The adapters run from modules whose forward is written out: no hooks, no
replaced ``forward``, ``print(model)`` shows what runs."""
import copy
import pickle

import pytest
import torch
import torch.nn as nn
from torch.nn.modules import module as torch_module

from moppa_mm.models import (MoPPASwinTransformer, MoPPASwinTransformerCls,
                             MoPPAVisionTransformer)

SWIN_ARCH = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4))


def swin_det(**kwargs):  # every adapter: unit, conv adapter, scale & shift
    return MoPPASwinTransformer(**SWIN_ARCH, window_size=7, out_indices=(0, 1),
                                use_scale_shift=True, **kwargs)


def swin_cls(**kwargs):
    return MoPPASwinTransformerCls(arch=SWIN_ARCH, img_size=56, window_size=7,
                                   out_indices=(1, ), use_conv_adapter=True, **kwargs)


def vit(**kwargs):
    return MoPPAVisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                                            feedforward_channels=64),
                                  img_size=32, patch_size=8, **kwargs)


MODELS = {  # name: (build, input size)
    'swin_det_window': (swin_det, 64),
    'swin_det_global': (lambda **kw: swin_det(moppa_scope='global', **kw), 64),
    'swin_cls': (swin_cls, 64),
    'vit': (vit, 32),
}


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
    build, size = MODELS[name]
    model = build(random_base=True)  # trains on its random base
    expected = {'': ['_check_before_training']}
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
    """EMA's deepcopy, and a pickle round trip (the classes made per package,
    the Swins and their layer classes, are found where they are bound), give
    the same modules and outputs."""
    with torch.no_grad():
        expected = model.eval()(x)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert [type(m) for m in other.modules()] == [type(m) for m in model.modules()]
        with torch.no_grad():
            for out, want in zip(other(x), expected):
                torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize('name', list(MODELS))
def test_deepcopy_and_pickle_give_the_same_model(name):
    build, size = MODELS[name]
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
    build, size = MODELS[name]
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
