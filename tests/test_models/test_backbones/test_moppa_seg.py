"""MMSegmentation's MoPPA Swin and ViT: built on mmseg's own classes, they
load mmseg-format bases through mmseg's ``init_weights`` when built (with or without the
``backbone.`` prefix), freeze them, equal the plain backbone with their
adapters off, and are registered in mmseg's MODELS only when mmseg imports."""
import os.path as osp
import subprocess
import sys

import pytest
import torch

pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
from mmseg.models.backbones import SwinTransformer, VisionTransformer  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402

import moppa_mm  # noqa: E402,F401
from moppa_mm.models import (MoPPASwinTransformerSeg,  # noqa: E402
                             MoPPAVisionTransformerSeg)
from tests.conftest import REPO, child_env  # noqa: E402
from .test_explicit_modules import assert_copies_equal  # noqa: E402

TINY_SWIN = dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2), strides=(4, 2),
                 out_indices=(0, 1), window_size=4, drop_path_rate=0.)
TINY_VIT = dict(img_size=(32, 48), patch_size=8, embed_dims=16, num_layers=3,
                num_heads=2, out_indices=(0, 2), final_norm=True)


@pytest.fixture(autouse=True)
def mmseg_scope():
    """Builds resolve type names in mmseg's registry whatever scope an earlier
    test left as the default (mmengine's registries follow the default scope)."""
    from mmengine.registry import init_default_scope
    init_default_scope('mmseg')


def base_file(tmp_path, cls, kwargs, wrap):
    torch.manual_seed(0)
    base = cls(**kwargs)
    base.init_weights()
    state = base.state_dict()
    path = str(tmp_path / 'base.pth')
    torch.save(wrap(state), path)
    base.eval()  # mmseg's train() returns None
    return base, path


@pytest.mark.parametrize('wrap', [
    lambda s: s,  # mmseg's released Swin bases: a plain state dict
    lambda s: {'state_dict': {'backbone.' + k: v for k, v in s.items()}},
], ids=['plain', 'backbone-prefixed'])
def test_swin_loads_mmseg_bases_and_equals_plain_swin_with_adapters_off(tmp_path, wrap):
    base, path = base_file(tmp_path, SwinTransformer, TINY_SWIN, wrap)
    model = MODELS.build(dict(type='MoPPASwinTransformer', **TINY_SWIN,
                              init_cfg=dict(type='Pretrained', checkpoint=path)))
    assert type(model) is MoPPASwinTransformerSeg
    model.eval()  # the base was loaded when built
    assert model._base['checkpoint'] == path
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all('moppa' in n or 'conv_adapter' in n for n in trainable)
    x = torch.randn(2, 3, 36, 52)  # odd sizes: padded windows
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(2, 16, 9, 13), (2, 32, 5, 7)]
    model.adapters_enabled = False
    for ours, plain in zip(model(x), base(x)):
        torch.testing.assert_close(ours, plain)


def test_vit_out_indices_grid_and_merge(tmp_path):
    base, path = base_file(tmp_path, VisionTransformer, TINY_VIT,
                           lambda s: {'state_dict': s})
    model = MODELS.build(dict(type='MoPPAVisionTransformer', **TINY_VIT,
                              init_cfg=dict(type='Pretrained', checkpoint=path)))
    assert type(model) is MoPPAVisionTransformerSeg
    model.eval()  # the base was loaded when built
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all('moppa' in n or 'ssf_' in n for n in trainable)
    x = torch.randn(2, 3, 32, 48)  # a 4 x 6 patch grid, not square
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(2, 16, 4, 6)] * 2
    model.adapters_enabled = False
    for ours, plain in zip(model(x), base(x)):
        torch.testing.assert_close(ours, plain)
    model.adapters_enabled = True
    assert model(torch.randn(1, 3, 40, 40))[0].shape == (1, 16, 5, 5)  # another grid
    model.merge_adapters()
    for merged, unmerged in zip(model(x), outs):
        torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=1e-4)


def test_vit_without_cls_token():
    model = MoPPAVisionTransformerSeg(**TINY_VIT, with_cls_token=False, random_base=True)
    assert model.layers[0].moppa.num_extra_tokens == 0
    assert model(torch.randn(1, 3, 32, 48))[1].shape == (1, 16, 4, 6)


@pytest.mark.parametrize('cls, kwargs', [(MoPPASwinTransformerSeg, TINY_SWIN),
                                         (MoPPAVisionTransformerSeg, TINY_VIT)])
def test_deepcopy_and_pickle_give_the_same_model(cls, kwargs):
    assert_copies_equal(cls(**kwargs, random_base=True), torch.randn(1, 3, 32, 48))


def test_swin_refuses_a_base_of_another_backbone(tmp_path):
    _, path = base_file(tmp_path, VisionTransformer, TINY_VIT, lambda s: s)
    with pytest.raises(RuntimeError, match='do not fit the model'):
        MoPPASwinTransformerSeg(**TINY_SWIN, init_cfg=dict(type='Pretrained', checkpoint=path))


@pytest.mark.parametrize('blocked, warned', [('mmseg', False), ('ftfy', True)])
def test_import_without_a_working_mmseg(blocked, warned):
    """Without mmseg, moppa_mm imports and registers the rest; an mmseg that
    does not import (ftfy missing) gets a warning naming the seg extra."""
    code = (f'import sys, warnings; sys.modules[{blocked!r}] = None\n'
            'with warnings.catch_warnings(record=True) as caught:\n'
            '    warnings.simplefilter("always")\n'
            '    import moppa_mm\n'
            'from mmdet.registry import MODELS\n'
            'assert MODELS.get("MoPPASwinTransformer") is not None\n'
            'print([str(w.message) for w in caught if "seg extra" in str(w.message)])\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ('mmsegmentation is installed but does not import' in result.stdout) == warned
    assert osp.isdir(REPO)
