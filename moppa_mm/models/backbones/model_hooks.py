"""The hooks a MoPPA backbone puts on the model that holds it (:func:`attach`), so
that a config changes only the backbone; each ``partial(hook, backbone, name)``:
a ``deepcopy`` of the model hooks the copied backbone."""
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


class HeldBy(NamedTuple):  # the model that holds a backbone
    model: str
    name: str
    handles: List[RemovableHandle]


def _forward_mode(model: nn.Module, args, kwargs) -> Optional[str]:
    """The ``mode`` of a forward call (mmengine's models), None without one."""
    if 'mode' in kwargs:  # as mmengine's train_step passes it
        return kwargs['mode']
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
    """State-dict hook, once all the model's tensors are in: the frozen base
    leaves where the backbone ``saves_adapters_only``; the record gets the
    model's class, its other tensors' shapes and the digest of all saved."""
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
    """Load pre-hook, before any tensor is copied: the one check, with the
    model's other tensors (:func:`~.load_check.load_checked`)."""
    around = {k: v for k, v in state_tensors(model).items() if not k.startswith(f'{name}.')}
    load_checked(backbone, state_dict, prefix, f'{name}.', around)


def attach(model: nn.Module, name: str, backbone: Optional[nn.Module],
           replaced: Optional[nn.Module]) -> None:
    """``model.<name>`` becomes ``backbone`` in place of ``replaced`` (each None
    where it is no MoPPA backbone): unhook the one replaced, hook the new one."""
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
