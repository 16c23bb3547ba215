"""The hooks a MoPPA backbone puts on the model that holds it (``model.<name>
= backbone``: a detector, classifier, segmentor), so that a config changes
only the backbone and no runner hook is needed: :func:`add_route_loss`
(forward), :func:`save_adapter_state` (state dict) and :func:`check_load`
(load pre-hook). Each is ``functools.partial(hook, backbone, name)``, so a
``copy.deepcopy`` of the model (EMA) hooks the copied backbone. :func:`attach`
runs when a module is assigned to a model (torch's module-registration hook,
registered by :mod:`.adapter_mixin` when the first backbone is built); the
backbone keeps the handles (:attr:`held_by`), and another module in its place
unhooks it. ``repr`` of the backbone names them (``model_hooks=...``).
"""
import functools
import inspect
from typing import List, NamedTuple, Optional

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from moppa_mm.utils.params import state_tensors
from .adapter_params import RECORD_KEY, frozen_base_keys
from .adapter_record import decode_record, encode_record, trained_digest
from .load_check import load_checked
from .route_loss import running_hub


class HeldBy(NamedTuple):
    """The model that holds a backbone (its class name), the backbone's name
    in it, and the handles of the hooks on it."""
    model: str
    name: str
    handles: List[RemovableHandle]


def _forward_mode(model: nn.Module, args, kwargs) -> Optional[str]:
    """The ``mode`` a forward was called with (mmengine's models: ``'loss'``,
    ``'predict'``, ``'tensor'``, by position or keyword), None without one."""
    try:
        call = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError:
        return None
    call.apply_defaults()
    return call.arguments.get('mode')


def add_route_loss(backbone, name: str, model: nn.Module, args, kwargs, output):
    """Forward hook: ``loss_route`` (the backbone's
    :meth:`~.route_loss.RouteLossMixin.route_loss`) into the loss dict of a
    training forward (``mode='loss'``)."""
    if not model.training or not isinstance(output, dict) or \
            _forward_mode(model, args, kwargs) != 'loss':
        return output
    loss = backbone.route_loss()
    if loss is None:
        return output
    output['loss_route'] = loss
    hub = running_hub()
    if hub is not None:
        hub.update_scalar('train/route_weight', backbone.current_route_weight())
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
    the model's other tensors (:func:`~.load_check.load_checked`; the
    backbone's own pre-hook then leaves the load alone)."""
    around = {k: v for k, v in state_tensors(model).items() if not k.startswith(f'{name}.')}
    load_checked(backbone, state_dict, prefix, f'{name}.', around)


def attach(model: nn.Module, name: str, backbone: Optional[nn.Module],
           replaced: Optional[nn.Module]) -> None:
    """``model.<name>`` becomes ``backbone`` (None: a module that is no MoPPA
    backbone) in place of ``replaced`` (None: no MoPPA backbone): unhook the
    model for the one replaced, hook it for the new one."""
    if backbone is replaced:  # assigned again, e.g. by a sync-BN conversion
        return
    if replaced is not None and replaced.__dict__.get('held_by'):
        for handle in replaced.held_by.handles:
            handle.remove()
        replaced.held_by = None
    if backbone is None:
        return
    backbone.held_by = HeldBy(type(model).__name__, name, [
        model.register_forward_hook(functools.partial(add_route_loss, backbone, name),
                                    with_kwargs=True),
        model.register_state_dict_post_hook(
            functools.partial(save_adapter_state, backbone, name)),
        model.register_load_state_dict_pre_hook(functools.partial(check_load, backbone, name))])
