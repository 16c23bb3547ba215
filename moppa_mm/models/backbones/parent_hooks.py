"""What a MoPPA backbone needs of the model that holds it, set up when it is
assigned (``detector.backbone = ...``), so that a config changes only the
backbone and no runner hook is needed.

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

The backbone's ``repr`` names them (``parent_hooks=...``). Assigning another
module in the backbone's place (``detector.backbone = other``) removes them.
"""
import functools

import torch.nn as nn
from torch.nn.modules.module import register_module_module_registration_hook

from .adapter_state import AdapterStateMixin
from .route_loss import RouteLossMixin

_HOOK_DICTS = ('_forward_hooks', '_state_dict_hooks', '_load_state_dict_pre_hooks')


def _owned_by(hook, name: str) -> bool:
    """Whether ``hook`` is one this module gave the parent for ``parent.<name>``."""
    hook = getattr(hook, 'hook', hook)  # a load pre-hook is wrapped (_WrappedHook)
    return isinstance(hook, functools.partial) and hook.args[:1] == (name, ) and \
        isinstance(getattr(hook.func, '__self__', None), (RouteLossMixin, AdapterStateMixin))


def _detach(parent: nn.Module, name: str) -> None:
    """Remove the hooks given to ``parent`` for the backbone at ``parent.<name>``."""
    for attr in _HOOK_DICTS:
        hooks = parent.__dict__.get(attr, {})
        for key in [k for k, hook in hooks.items() if _owned_by(hook, name)]:
            del hooks[key]
            parent._forward_hooks_with_kwargs.pop(key, None)
    attached = parent.__dict__.get('_moppa_backbones', {})
    backbone = attached.pop(name, None)
    if backbone is not None:
        backbone.__dict__.pop('_parent_hooks', None)
        backbone.__dict__.pop('_attached_name', None)


def _attach(parent: nn.Module, name: str, child) -> None:
    attached = parent.__dict__.get('_moppa_backbones', {})
    if attached.get(name) is child:  # re-registered (e.g. revert_sync_batchnorm)
        return None
    if name in attached:  # another module in the backbone's place
        _detach(parent, name)
    if not isinstance(child, (RouteLossMixin, AdapterStateMixin)):
        return None
    parent.__dict__.setdefault('_moppa_backbones', {})[name] = child
    given = []
    if isinstance(child, RouteLossMixin):
        parent.register_forward_hook(functools.partial(child._add_route_loss, name),
                                     with_kwargs=True)
        given.append('loss_route into the loss dict')
    if isinstance(child, AdapterStateMixin):
        parent._register_state_dict_hook(functools.partial(child._record_heads, name))
        parent._register_load_state_dict_pre_hook(
            functools.partial(child._check_heads, name), with_module=True)
        given.append('head shapes recorded and checked on load')
    child.__dict__['_parent_hooks'] = f'{type(parent).__name__}.{name}: ' + '; '.join(given)
    child.__dict__['_attached_name'] = name  # the key its messages name (optimizer_check)
    return None


register_module_module_registration_hook(_attach)
