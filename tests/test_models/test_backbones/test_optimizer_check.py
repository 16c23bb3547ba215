"""The backbone's one-shot optimizer step check: adapters at another lr than
the optimizer's get one warning at the first step of an optimizer that holds
them, in plain PyTorch; optimizers without them pass; the check goes with the
backbone."""
import gc

import torch
from torch.optim.optimizer import _global_optimizer_pre_hooks

from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.training_checks import waiting_check
from tests.conftest import logged_messages
from .test_explicit_modules import vit

WARNED = 'adapter tensors train at lr'


def groups(model, adapter_lr=None, adapter_wd=None):
    adapters = [p for n, p in model.named_parameters() if is_adapter_key(n)]
    group = dict(params=adapters)
    if adapter_lr is not None:
        group['lr'] = adapter_lr
    if adapter_wd is not None:
        group['weight_decay'] = adapter_wd
    return [group]


def warnings_of_steps(optimizer, steps=2):
    with logged_messages() as messages:
        for _ in range(steps):
            optimizer.step()
    return [m for m in messages if WARNED in m or 'weight decay' in m]


def test_a_tenth_of_the_lr_warns_once_at_the_first_step():
    model = vit(random_base=True)
    assert 'optimizer_check=(first step' in repr(model)
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert warnings_of_steps(other) == []  # an optimizer without its adapters
    assert waiting_check(model) is not None
    optimizer = torch.optim.AdamW(groups(model, adapter_lr=1e-4), lr=1e-3)
    warned = warnings_of_steps(optimizer)
    assert len(warned) == 1
    assert 'train at lr 0.0001 (0.1 x), the optimizer\'s is 0.001' in warned[0]
    assert "'backbone.': dict(lr_mult=1.0, decay_mult=1.0)" in warned[0]
    assert waiting_check(model) is None and 'optimizer_check' not in repr(model)


def test_the_optimizers_lr_passes_quietly_and_weight_decay_counts_when_all_differ():
    model = vit(random_base=True)
    assert warnings_of_steps(torch.optim.AdamW(groups(model), lr=1e-3)) == []
    assert waiting_check(model) is None  # checked, and gone
    model = vit(random_base=True)
    optimizer = torch.optim.AdamW(groups(model, adapter_wd=0.0), lr=1e-3,
                                  weight_decay=0.05)
    warned = warnings_of_steps(optimizer)
    assert len(warned) == 1 and 'weight decay 0, the optimizer\'s is 0.05' in warned[0]


def test_a_schedule_does_not_count_and_the_hook_goes_after_its_step():
    gc.collect()  # the backbones of earlier tests go; their hooks at the next build
    model = vit(random_base=True)
    optimizer = torch.optim.AdamW(groups(model), lr=1e-3)
    torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01)  # warm-up: lr 1e-5
    hooks = len(_global_optimizer_pre_hooks)
    assert warnings_of_steps(optimizer, steps=1) == []  # initial_lr is the optimizer's
    assert len(_global_optimizer_pre_hooks) == hooks - 1  # removed after that step
    del model, optimizer
    vit(random_base=True)  # (removed when the next backbone is built)
    ours = [h for h in _global_optimizer_pre_hooks.values()
            if type(h).__name__ == '_FirstStepCheck']
    assert len(ours) == 1  # the new backbone's
    assert waiting_check(vit(freeze_pretrained=False)) is None  # nothing frozen: no check
