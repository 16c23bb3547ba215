"""Swapping an upstream module for a subclass that keeps its submodules."""
from typing import Dict, Type

import torch.nn as nn


def swap_class(module: nn.Module, subclasses: Dict[type, Type[nn.Module]]) -> nn.Module:
    """Make ``module`` an instance of the subclass of its class that
    ``subclasses`` names: the same object, submodules, parameters (names and
    all) and buffers; only the methods the subclass overrides change (as
    ``torch.nn.utils.parametrize`` does for a parametrized module). The
    subclass must add no state of its own in ``__init__``, which does not run.

    Args:
        module (nn.Module): An upstream module (a Swin block, a ViT layer...).
        subclasses (dict): ``{upstream class: subclass}``; ``module``'s exact
            class must be a key.

    Returns:
        nn.Module: ``module`` itself.
    """
    subclass = subclasses.get(type(module))
    if subclass is None:
        known = ', '.join(f'{c.__module__}.{c.__name__}' for c in subclasses)
        raise TypeError(f'{type(module).__module__}.{type(module).__name__} has no MoPPA '
                        f'subclass (known: {known})')
    assert issubclass(subclass, type(module)), (subclass, type(module))
    module.__class__ = subclass
    return module
