"""Parameter bookkeeping: trainable patterns and the breakdown table."""
import fnmatch
from collections import OrderedDict
from typing import Dict, Iterable, List, Sequence, Tuple

import torch.nn as nn


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
