"""Parameter bookkeeping: trainable patterns, the state's tensors, the
breakdown table, and the short lists of names that messages show."""
import fnmatch
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

NORM_TYPES = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d,
              nn.InstanceNorm2d)


def few(items: Iterable, shown: int = 5, sep: str = ', ') -> str:
    """The first ``shown`` items, and how many there are in all: ``a, b, ...
    (70 in all)``. Messages list names with it."""
    items = [str(item) for item in items]
    more = f'{sep}... ({len(items)} in all)' if len(items) > shown else ''
    return sep.join(items[:shown]) + more


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message quotes a value
    read from a user's file, never all of it."""
    text = repr(value[:2 * limit] if isinstance(value, str) else value)
    return text if len(text) <= limit else f'{text[:limit]}...'


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` matches any shell-style pattern (``fnmatch``)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def parameter_table(model: nn.Module,
                    groups: Sequence[Tuple[str, Sequence[str]]],
                    title: str = 'Parameters') -> Tuple[str, Dict[str, Dict[str, int]]]:
    """Count total / trainable parameters per component.

    Args:
        model: the model to count.
        groups: ``(component name, name patterns)`` in order; a parameter goes to
            the first group it matches, else to ``'other'``.
        title: the table's title line.

    Returns:
        The table as text, and ``{component: {'total': n, 'trainable': n}}``
        (with a ``'total'`` row).
    """
    counts: Dict[str, Dict[str, int]] = OrderedDict(
        (name, {'total': 0, 'trainable': 0}) for name, _ in groups)
    counts['other'] = {'total': 0, 'trainable': 0}
    for pname, param in model.named_parameters():
        group = next((g for g, pats in groups if matches(pname, pats)), 'other')
        counts[group]['total'] += param.numel()
        if param.requires_grad:
            counts[group]['trainable'] += param.numel()
    if not counts['other']['total']:
        del counts['other']
    total = sum(c['total'] for c in counts.values())
    trainable = sum(c['trainable'] for c in counts.values())
    counts['total'] = {'total': total, 'trainable': trainable}
    lines = [title,
             f'{"component":<28}{"total":>14}{"trainable":>14}{"% of trainable":>16}']
    for name, c in counts.items():
        share = 100.0 * c['trainable'] / trainable if trainable else 0.0
        lines.append(f'{name:<28}{c["total"]:>14,}{c["trainable"]:>14,}{share:>15.2f}%')
    return '\n'.join(lines), counts


def set_trainable(model: nn.Module, trainable: Sequence[str],
                  frozen: Sequence[str] = ('*', )) -> List[str]:
    """Freeze parameters matching ``frozen`` unless they match ``trainable``.

    Returns the names whose ``requires_grad`` changed.
    """
    changed = []
    for name, param in model.named_parameters():
        if matches(name, frozen):
            want = matches(name, trainable)
            if param.requires_grad != want:
                param.requires_grad_(want)
                changed.append(name)
    return changed


def state_tensors(module: nn.Module) -> Dict[str, torch.Tensor]:
    """The tensors of ``module``'s state dict (parameters and persistent
    buffers) by key, read without calling ``state_dict()``: no state-dict
    hook runs (a load pre-hook compares them with what comes in)."""
    tensors = {}
    for name, child in module.named_modules():
        prefix = f'{name}.' if name else ''
        tensors.update((prefix + k, v) for k, v in child._parameters.items() if v is not None)
        tensors.update((prefix + k, v) for k, v in child._buffers.items()
                       if v is not None and k not in child._non_persistent_buffers_set)
    return tensors


def frozen_norms(model: nn.Module) -> List[nn.Module]:
    """The normalisation layers whose parameters are all frozen: they stay in
    eval mode while the model trains (a batch norm's statistics are part of
    the frozen base)."""
    norms = []
    for module in model.modules():
        params = list(module.parameters())
        if isinstance(module, NORM_TYPES) and params and \
                not any(p.requires_grad for p in params):
            norms.append(module)
    return norms
