"""The backbone's one-shot first-step check, in plain PyTorch and under
mmengine's own optimizer constructor: adapters at another lr than the
optimizer's stop the first step of an optimizer that holds them, before any
parameter moves, with the line to add; optimizers without them pass; the
check goes with the backbone; mmengine's line per frozen parameter becomes
one. (The packaged DINO and Mask2Former configs: tests/test_configs/
test_upstream_recipes.py.)"""
import gc
import re

import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmpretrain.models import ImageClassifier
from torch.optim.optimizer import _global_optimizer_pre_hooks

from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.training_checks import AdapterLrError, waiting_check
from tests.conftest import logged_messages
from .test_explicit_modules import vit

FIX = "optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'backbone.': dict(lr_mult=1.0, "


def groups(model, adapter_lr=None, adapter_wd=None):
    adapters = [p for n, p in model.named_parameters() if is_adapter_key(n)]
    group = dict(params=adapters)
    if adapter_lr is not None:
        group['lr'] = adapter_lr
    if adapter_wd is not None:
        group['weight_decay'] = adapter_wd
    return [group]


def with_gradients(model):
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.ones_like(param)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_tenth_of_the_lr_stops_the_first_step_before_anything_moves():
    model = vit(random_base=True)
    assert 'first_step_check=(first step' in repr(model)
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    other.step()  # an optimizer without its adapters
    assert waiting_check(model) is not None
    optimizer = torch.optim.AdamW(groups(model, adapter_lr=1e-4), lr=1e-3)
    before = with_gradients(model)
    with pytest.raises(AdapterLrError) as error:
        optimizer.step()
    message = str(error.value)
    assert '\n' not in message
    assert "would train at lr 0.0001 (0.1 x), the optimizer's is 0.001" in message
    assert 'Stopped before the first step' in message and FIX in message
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name  # no step was taken
    assert waiting_check(model) is None and 'first_step_check' not in repr(model)
    optimizer.step()  # one-shot: a caller that goes on anyway is not stopped twice


def test_the_optimizers_lr_passes_and_weight_decay_counts_when_all_differ():
    model = vit(random_base=True)
    torch.optim.AdamW(groups(model), lr=1e-3).step()
    assert waiting_check(model) is None  # checked, and gone
    model = vit(random_base=True)
    optimizer = torch.optim.AdamW(groups(model, adapter_wd=0.0), lr=1e-3,
                                  weight_decay=0.05)
    with pytest.raises(AdapterLrError, match="at weight decay 0, the optimizer's is 0.05"):
        optimizer.step()


def test_a_schedule_does_not_count_and_the_hook_goes_after_its_step():
    gc.collect()  # the backbones of earlier tests go; their hooks at the next build
    model = vit(random_base=True)
    optimizer = torch.optim.AdamW(groups(model), lr=1e-3)
    torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01)  # warm-up: lr 1e-5
    hooks = len(_global_optimizer_pre_hooks)
    optimizer.step()  # initial_lr is the optimizer's
    assert len(_global_optimizer_pre_hooks) == hooks - 1  # removed after that step
    del model, optimizer
    vit(random_base=True)  # (removed when the next backbone is built)
    ours = [h for h in _global_optimizer_pre_hooks.values()
            if type(h).__name__ == 'FirstStepCheck']
    assert len(ours) == 1  # the new backbone's
    assert waiting_check(vit(freeze_pretrained=False)) is None  # nothing frozen: no check


def classifier():
    init_default_scope('mmpretrain')
    return ImageClassifier(
        backbone=dict(type='MoPPAVisionTransformer', random_base=True,
                      arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                                feedforward_channels=64), img_size=32, patch_size=8),
        head=dict(type='LinearClsHead', num_classes=3, in_channels=32))


def test_mmengines_constructor_gets_one_line_for_the_frozen_base_then_the_stop():
    """mmengine's DefaultOptimWrapperConstructor under a paramwise_cfg (DINO's
    and Mask2Former's ``'backbone'`` key): one line instead of one warning
    per frozen parameter, and the first step stops with the key to add."""
    model = classifier()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    cfg = dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
               paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}))
    with logged_messages() as messages:
        optim_wrapper = build_optim_wrapper(model, cfg)
    assert len(frozen) > 20
    assert not [m for m in messages if 'is skipped since its requires_grad=False' in m]
    said = [m for m in messages if 'frozen parameter tensors' in m]
    assert said == [f'MoPPAVisionTransformer: {len(frozen)} frozen parameter tensors '
                    '(model.backbone.*: the pre-trained base, and adapters of frozen '
                    "stages) are left out of the optimizer; mmengine's warning for each "
                    'is not shown']
    with_gradients(model)
    with pytest.raises(AdapterLrError, match=r'train at lr 0.0001 \(0.1 x\).*' + re.escape(FIX)):
        optim_wrapper.step()
    # the line it names: the adapters at the optimizer's lr, the base still out
    model = classifier()
    cfg['paramwise_cfg']['custom_keys']['backbone.'] = dict(lr_mult=1.0, decay_mult=1.0)
    optimizer = build_optim_wrapper(model, cfg).optimizer
    with_gradients(model)
    optimizer.step()
    adapters = {id(p) for n, p in model.backbone.named_parameters() if is_adapter_key(n)}
    assert {g['lr'] for g in optimizer.param_groups
            if any(id(p) in adapters for p in g['params'])} == {1e-3}
