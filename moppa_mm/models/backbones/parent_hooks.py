"""What a MoPPA backbone needs of the model that holds it, set up when it is
assigned (``detector.backbone = ...``), so that no runner hook is needed.

A module-registration hook (torch's ``register_module_module_registration_hook``)
sees every ``parent.<name> = module`` and, only for a MoPPA backbone, gives the
parent three hooks, each a bound method of the backbone (``copy.deepcopy`` of
the parent, e.g. for EMA, rebinds them to the copied backbone):

* a forward hook that adds ``loss_route`` to its loss dict
  (:meth:`.route_loss.RouteLossMixin._add_route_loss`);
* a state-dict hook that adds the shapes of the parent's other tensors (the
  heads) to the adapter record (:meth:`.adapter_state.AdapterStateMixin._record_heads`);
* a load pre-hook that stops an adapter checkpoint whose heads have other
  shapes than the model's (:meth:`.adapter_state.AdapterStateMixin._check_heads`).
"""
import functools

import torch.nn as nn
from torch.nn.modules.module import register_module_module_registration_hook

from .adapter_state import AdapterStateMixin
from .route_loss import RouteLossMixin


def _attach(parent: nn.Module, name: str, child) -> None:
    if not isinstance(child, (RouteLossMixin, AdapterStateMixin)):
        return None
    attached = parent.__dict__.setdefault('_moppa_backbones', {})
    if attached.get(name) is child:  # re-registered (e.g. revert_sync_batchnorm)
        return None
    attached[name] = child
    if isinstance(child, RouteLossMixin):
        parent.register_forward_hook(functools.partial(child._add_route_loss, name),
                                     with_kwargs=True)
    if isinstance(child, AdapterStateMixin):
        parent._register_state_dict_hook(functools.partial(child._record_heads, name))
        parent._register_load_state_dict_pre_hook(
            functools.partial(child._check_heads, name), with_module=True)
    return None


register_module_module_registration_hook(_attach)
