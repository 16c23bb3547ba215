"""No host-device synchronisation in a training step or an eval forward of
any backbone: a ``bool(tensor)``, ``.item()`` or ``.tolist()`` in a step
stalls the whole device until it catches up (on CUDA, ``.item()`` and
``bool()`` dispatch ``aten::_local_scalar_dense``; ``.tolist()`` copies to
the host). Counted on CPU under bf16 and fp16 autocast, for every package's
MoPPA backbone, with every adapter it has."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moppa_mm.models import (MoPPASwinTransformer, MoPPASwinTransformerCls,
                             MoPPAVisionTransformer)

SWIN = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4), window_size=7, out_indices=(0, 1))
VIT = dict(patch_size=8, random_base=True)


def mmseg_models():
    pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
    from moppa_mm.models import MoPPASwinTransformerSeg, MoPPAVisionTransformerSeg
    return MoPPASwinTransformerSeg, MoPPAVisionTransformerSeg


BACKBONES = {  # name: (build, input size)
    'mmdet_swin_window': (lambda: MoPPASwinTransformer(
        **SWIN, use_scale_shift=True, random_base=True), 56),
    'mmdet_swin_global': (lambda: MoPPASwinTransformer(
        **SWIN, moppa_scope='global', use_scale_shift=True, random_base=True), 56),
    'mmpretrain_swin': (lambda: MoPPASwinTransformerCls(
        arch=dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4)), img_size=56,
        window_size=7, out_indices=(1, ), use_conv_adapter=True, random_base=True), 56),
    'mmpretrain_vit': (lambda: MoPPAVisionTransformer(
        arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64),
        img_size=32, **VIT), 32),
    'mmseg_swin': (lambda: mmseg_models()[0](
        **SWIN, use_scale_shift=True, random_base=True), 56),
    'mmseg_vit': (lambda: mmseg_models()[1](
        img_size=32, embed_dims=32, num_layers=2, num_heads=4, **VIT), 32),
}


class Syncs(TorchDispatchMode):
    """Counts the dispatched reads of a value back to the host."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ('_local_scalar_dense', 'is_nonzero', 'item'):
            self.count += 1
        return func(*args, **(kwargs or {}))


def outputs(out):
    """The backbone's output tensors, however nested."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in outputs(item)]


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('name', list(BACKBONES))
def test_training_step_and_eval_forward_read_nothing_back(name, dtype, monkeypatch):
    build, size = BACKBONES[name]
    torch.manual_seed(0)
    model = build()
    x = torch.randn(2, 3, size, size)
    listed = []  # .tolist() reads a CPU tensor without dispatching: watch the method
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, 'tolist',
                        lambda self: listed.append(self.shape) or tolist(self))
    for training in (True, False):
        model.train(training)
        for _ in range(2):  # the first step fills caches; the second is a step like any
            with Syncs() as syncs, torch.autocast('cpu', dtype=dtype), \
                    torch.set_grad_enabled(training):
                out = outputs(model(x))
                if training:
                    sum(o.float().mean() for o in out).backward()
            assert syncs.count == 0 and not listed, (training, syncs.count, listed)
