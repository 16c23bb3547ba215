"""merge_adapters: the scale & shift folded into the frozen weights and the
units' filters made constants give the unmerged model's outputs; a merged
state dict is the whole model, recorded as merged, and loads into a model
built from the same config; what a merged model cannot do is refused."""
import copy

import pytest
import torch
from mmengine.registry import MODELS, init_default_scope
from mmpretrain.structures import DataSample

from moppa_mm import merge_adapters
from moppa_mm.models import read_adapter_record
from moppa_mm.models.backbones.load_check import PretrainedMismatchError
from moppa_mm.operators import MoPPAUnit
from tests.test_models.test_adapter_record import classifier_cfg

SWIN = dict(type='MoPPASwinTransformer', embed_dims=32, depths=(2, 2), num_heads=(2, 4),
            window_size=4, pretrain_img_size=32, out_indices=(0, 1))


def build(cfg, scope):
    init_default_scope(scope)
    return MODELS.build(copy.deepcopy(cfg))


def trained(model, seed=0):
    """``model`` with its trainable parameters moved off their init (a
    fine-tuned model: every adapter and the head matter)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


@pytest.fixture(scope='module')
def classifier():
    return trained(build(classifier_cfg(), 'mmpretrain'))


@pytest.fixture(scope='module')
def swin():
    return trained(build(SWIN, 'mmdet'))


def test_merged_classifier_gives_the_unmerged_outputs(classifier):
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = classifier(images, mode='tensor')
        classifier.backbone.adapters_enabled = False  # the adapters change the output
        plain = classifier(images, mode='tensor')
        classifier.backbone.adapters_enabled = True
    assert (expected - plain).abs().max() > 1e-2
    merged = merge_adapters(copy.deepcopy(classifier))
    assert merged.backbone.merged and not merged.training
    with torch.no_grad():
        torch.testing.assert_close(merged(images, mode='tensor'), expected, atol=1e-5, rtol=0)
    names = [name for name, _ in merged.backbone.named_modules()]
    assert not any('ssf_' in name for name in names)
    assert type(merged.backbone.layers[0].attn.qkv) is torch.nn.Linear
    assert type(merged.backbone.patch_embed.projection) is torch.nn.Conv2d
    assert not any(p.requires_grad for p in merged.backbone.parameters())


def test_merged_swin_gives_the_unmerged_outputs(swin):
    images = torch.randn(2, 3, 40, 56)  # padded to windows; not the pre-training size
    with torch.no_grad():
        expected = swin(images)
        outputs = merge_adapters(copy.deepcopy(swin))(images)
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_merged_state_dict_loads_into_a_model_from_the_config(classifier):
    merged = merge_adapters(copy.deepcopy(classifier))
    state = merged.state_dict()
    record = read_adapter_record(state)
    assert record['merged'] is True
    assert not any('ssf_' in key or 'route_logits' in key for key in state)
    assert 'backbone.layers.0.moppa.merged_filter' in state
    assert 'backbone.cls_token' in state  # the whole model: folded weights changed
    unmerged = build(classifier_cfg(), 'mmpretrain')
    with pytest.raises(PretrainedMismatchError, match=r'(?s)is merged .*this model is not.*'
                       r'model.backbone.merged=True.*merge_adapters\(model\) before the load'):
        unmerged.load_state_dict(state)  # the load does not merge the model
    assert not unmerged.backbone.merged
    assert any('ssf_' in name for name, _ in unmerged.backbone.named_modules())
    cfg = classifier_cfg()
    cfg['backbone']['merged'] = True  # explicit: the model is built merged
    fresh = build(cfg, 'mmpretrain')
    assert fresh.backbone.merged
    fresh.load_state_dict(state)  # strict
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(images, mode='tensor'),
                                   merged(images, mode='tensor'), atol=0, rtol=0)
    unmerged.load_state_dict(classifier.state_dict())
    merge_adapters(unmerged).load_state_dict(state)  # or merged before the load


def test_a_merged_model_refuses_what_it_cannot_do(classifier):
    merged = merge_adapters(copy.deepcopy(classifier))
    with pytest.raises(PretrainedMismatchError, match='the checkpoint is not merged, and '
                       'MoPPAVisionTransformer is merged for inference'):
        merged.load_state_dict(classifier.state_dict())
    with pytest.raises(RuntimeError, match='merged for inference.*cannot train'):
        merged.train()(torch.randn(1, 3, 32, 32), [DataSample().set_gt_label(1)],
                       mode='loss')
    with pytest.raises(RuntimeError, match='cannot switch its adapters off'):
        merged.backbone.adapters_enabled = False
    with pytest.raises(ValueError, match=r'merged for its reference grid \(4, 4\), got an '
                       r'input on the grid \(5, 5\)'):
        merged.backbone.layers[0].moppa(torch.randn(1, 5, 5, 32))
    merge_adapters(merged)  # merging twice is a no-op


def test_a_global_scope_swin_cannot_merge():
    swin = build(dict(SWIN, moppa_scope='global'), 'mmdet')
    with pytest.raises(ValueError, match="moppa_scope='global'.*cannot become constants"):
        merge_adapters(swin)
    with pytest.raises(ValueError, match='holds no MoPPA backbone'):
        merge_adapters(torch.nn.Linear(2, 2))


def test_the_eval_cache_follows_every_change_of_the_parameters():
    """The eval-mode filter and field are reused until a parameter changes: in
    place, through a load, a move to another dtype, or (after ``.data`` is
    assigned) ``clear_cache``; no data pointers involved."""
    torch.manual_seed(0)
    unit = trained(MoPPAUnit(8, 2, (4, 4), init_mode='identity', heat_param='softplus'))
    x = torch.randn(2, 4, 4, 8)

    def fresh_output(module, inputs):  # what the unit computes without a cache
        module.clear_cache()
        with torch.no_grad():
            return module(inputs)

    with torch.no_grad():
        unit(x)
        with torch.no_grad():
            unit.gate.add_(0.5)  # in place: the version changes
        torch.testing.assert_close(unit(x), fresh_output(unit, x), atol=0, rtol=0)
        other = trained(copy.deepcopy(unit), seed=1)
        unit.load_state_dict(other.state_dict())
        torch.testing.assert_close(unit(x), other(x), atol=0, rtol=0)
        double = unit.double()
        assert double(x.double()).dtype == torch.float64
        unit.float()
        unit.gate.data = torch.zeros_like(unit.gate)  # identity again, version unchanged
        unit.clear_cache()
        torch.testing.assert_close(unit(x), x, atol=1e-6, rtol=0)
