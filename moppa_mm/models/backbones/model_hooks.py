"""The hooks a MoPPA backbone puts on the model that holds it (``model.<name>
= backbone``: a detector, classifier, segmentor), so that a config changes
only the backbone and no runner hook is needed: :func:`add_route_loss`
(forward), :func:`save_adapter_state` (state dict) and :func:`check_load`
(load pre-hook). Each is ``functools.partial(hook, backbone, name)``, so a
``copy.deepcopy`` of the model (EMA) hooks the copied backbone. :func:`attach`
runs on every assignment (torch's module-registration hook, registered by
:mod:`.adapter_mixin`); another module in the backbone's place unhooks it.
``repr`` of the backbone names them (``model_hooks=...``).
"""
import functools
from typing import Optional

import torch
import torch.nn as nn
from mmengine.logging import MessageHub

from moppa_mm.utils.params import state_tensors
from .adapter_state import RECORD_KEY, decode_record, encode_record, frozen_base_keys, \
    trained_digest

_HOOK_DICTS = ('_forward_hooks', '_state_dict_hooks', '_load_state_dict_pre_hooks')


def add_route_loss(backbone, name: str, model: nn.Module, args, kwargs, output):
    """Forward hook: ``loss_route`` (the backbone's
    :meth:`~.route_loss.RouteLossMixin.route_loss`) into the loss dict of a
    training forward (``mode='loss'``)."""
    mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
    if mode != 'loss' or not model.training or not isinstance(output, dict):
        return output
    loss = backbone.route_loss()
    if loss is None:
        return output
    output['loss_route'] = loss
    if MessageHub._instance_dict:
        MessageHub.get_current_instance().update_scalar('train/route_weight',
                                                        backbone.current_route_weight())
    return output


def save_adapter_state(backbone, name: str, model: nn.Module, state_dict, prefix: str,
                       local_metadata) -> None:
    """State-dict hook, run once all the model's tensors are in: the frozen
    base leaves where the backbone saves adapter-only
    (:attr:`~.adapter_mixin.AdapterMixin.saves_adapters_only`), and the record
    gets the model's class, its other tensors' shapes (``heads``) and the
    digest of all that is saved."""
    inside = f'{name}.'
    state = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    record = decode_record(state.get(inside + RECORD_KEY))
    if record is None:
        return
    if backbone.saves_adapters_only:
        for key in frozen_base_keys(state, inside, backbone.params_not_in_base):
            del state_dict[prefix + key], state[key]
    record.update(model=type(model).__name__,
                  heads={k: list(v.shape) for k, v in state.items()
                         if not k.startswith(inside) and isinstance(v, torch.Tensor)},
                  digest=trained_digest(state, inside))
    state_dict[prefix + inside + RECORD_KEY] = encode_record(record)


def check_load(backbone, name: str, model: nn.Module, state_dict, prefix: str,
               *args) -> None:
    """Load pre-hook, before any tensor is copied: the load's one check, with
    the model's other tensors (:meth:`~.adapter_mixin.AdapterMixin.load_checked`;
    the backbone's own pre-hook then leaves the load alone)."""
    around = {k: v for k, v in state_tensors(model).items() if not k.startswith(f'{name}.')}
    backbone.load_checked(state_dict, prefix, f'{name}.', around)


HOOKS = (add_route_loss, save_adapter_state, check_load)


def _held(model: nn.Module, name: str):
    """The hooks of the backbone at ``model.<name>`` (handle id, partial)."""
    for attr in _HOOK_DICTS:
        for key, hook in model.__dict__.get(attr, {}).items():
            hook = getattr(hook, 'hook', hook)  # a load pre-hook is wrapped (_WrappedHook)
            if isinstance(hook, functools.partial) and hook.func in HOOKS \
                    and hook.args[1] == name:
                yield attr, key, hook


def attach(model: nn.Module, name: str, backbone: Optional[nn.Module]) -> None:
    """``model.<name>`` is now ``backbone`` (None: a module that is no MoPPA
    backbone): hook the model for it, once, and unhook a backbone it replaced."""
    held = list(_held(model, name))
    if held and held[0][2].args[0] is backbone:  # registered again, e.g. a sync-BN swap
        return
    for attr, key, hook in held:
        del model.__dict__[attr][key]
        model._forward_hooks_with_kwargs.pop(key, None)
        hook.args[0].__dict__.pop('_held_as', None)
    if backbone is None:
        return
    model.register_forward_hook(functools.partial(add_route_loss, backbone, name),
                                with_kwargs=True)
    model._register_state_dict_hook(functools.partial(save_adapter_state, backbone, name))
    model._register_load_state_dict_pre_hook(functools.partial(check_load, backbone, name),
                                             with_module=True)
    # what the backbone's repr and messages name (its key in the model)
    backbone.__dict__['_held_as'] = (type(model).__name__, name)
