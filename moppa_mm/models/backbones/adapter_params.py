"""Which parameters of a MoPPA backbone are adapters (:data:`ADAPTER_GROUPS`),
which its frozen base (:func:`frozen_base_keys`); the table every build logs."""
from typing import Dict, List, Sequence, Tuple

import torch.nn as nn

from moppa_mm.utils.params import matches, parameter_table

RECORD_KEY = '_extra_state'  # torch's key for a module's extra state: the adapter record

# The adapters' parameter names by kind, the one place they are spelled (all else
# is the frozen base): (kind, fnmatch patterns, label of the parameter tables)
ADAPTER_GROUPS = (
    ('moppa', ('*moppa*', ), 'moppa units'),
    ('conv_adapter', ('*conv_adapter*', ), 'conv adapters'),
    ('scale_shift', ('*ssf_*', ), 'scale & shift'),
)
ADAPTER_PATTERNS = tuple(p for _, patterns, _ in ADAPTER_GROUPS for p in patterns)


def is_adapter_key(name: str) -> bool:
    """Whether a backbone parameter / state-dict key belongs to an adapter."""
    return matches(name, ADAPTER_PATTERNS)


def adapter_components(prefix: str = '') -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """``(name, patterns)`` per adapter kind under ``prefix``, for
    :func:`~moppa_mm.utils.params.parameter_table`."""
    return tuple((prefix + kind, tuple(prefix + p for p in patterns))
                 for kind, patterns, _ in ADAPTER_GROUPS)


def frozen_base_keys(keys: Sequence[str], inside: str,
                     not_in_base: Sequence[str] = ()) -> List[str]:
    """The keys of the frozen base of the backbone under ``inside`` (``not_in_base``:
    patterns of its parameters no base has): what an adapter-only checkpoint leaves out."""
    not_in_base = tuple(not_in_base)
    return [k for k in keys if k.startswith(inside) and k != inside + RECORD_KEY
            and not is_adapter_key(k[len(inside):])
            and not matches(k[len(inside):], not_in_base)]


def _groups(backbone: nn.Module) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
    """``(kind, patterns, label)``: adapters, parameters no base has, the base."""
    not_in_base = ((('not_in_base', tuple(backbone.params_not_in_base),
                     'new, no base has them'), ) if backbone.params_not_in_base else ())
    base = backbone.PRETRAINED_LABEL
    if backbone.pretrained_base is None:
        base = base.replace('pre-trained ', '') + ', random' + (
            ' (on purpose)' if backbone.random_base else ' (no base loaded)')
    return ADAPTER_GROUPS + not_in_base + (('pretrained', ('*', ), base), )


def parameter_breakdown(backbone: nn.Module) -> Dict[str, Dict[str, int]]:
    """``{kind: {'total': n, 'trainable': n}}``, kinds as in :data:`ADAPTER_GROUPS`."""
    _, counts = parameter_table(backbone, [(k, p) for k, p, _ in _groups(backbone)])
    return counts


def parameter_report(backbone: nn.Module) -> str:
    """The table of total and trainable parameters per kind."""
    table, _ = parameter_table(backbone, [(label, p) for _, p, label in _groups(backbone)],
                               title=type(backbone).__name__)
    return table
