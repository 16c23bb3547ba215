"""Eq. 10 term by term, written apart from the operator's fused filter, for
tests that check the fusion (Eq. 11) against it; the unit's parameters per
expert, for the tests of the parameter formulas."""
import math
from typing import Dict

import torch
import torch.nn.functional as F

from moppa_mm.operators import MoPPAUnit


def expert_terms(unit: MoPPAUnit) -> Dict[str, torch.Tensor]:
    """Each expert's own term on the unit's reference grid, unweighted, each
    (H, W, C), from its raw parameters: heat ``exp(-k w^2 t)``, wave
    ``cos(c |w| t)`` (multiplicative) and poisson ``H1 H2 / (w^2 + eta)``
    (additive); k and the heat's t through softplus with
    ``heat_param='softplus'``. No router, no identity gate."""
    h, w = unit.grid_size
    dtype = unit.route_logits.dtype
    omega_h = math.pi * torch.arange(h, dtype=dtype) / h  # (H,)
    omega_w = math.pi * torch.arange(w, dtype=dtype) / w  # (W,)
    omega_sq = (omega_h[:, None]**2 + omega_w[None, :]**2)[..., None, None]  # (H, W, 1, 1)
    physical = F.softplus if unit.heat_param == 'softplus' else (lambda raw: raw)
    heat_time = physical(unit.heat_time) if hasattr(unit, 'heat_time') else None
    terms = {}
    if 'heat' in unit.experts:
        k = physical(unit.heat_coef)[..., None]  # (H, W, N, 1)
        terms['heat'] = torch.exp(-k * omega_sq * heat_time)  # (H, W, N, C/N)
    if 'wave' in unit.experts:
        c = unit.wave_coef[..., None]  # (H, W, N, 1)
        time = unit.wave_time if hasattr(unit, 'wave_time') else heat_time
        terms['wave'] = torch.cos(c * omega_sq.sqrt() * time)
    if 'poisson' in unit.experts:
        source = unit.source_freq[..., None] * unit.source_channel  # (H, W, N, C/N)
        terms['poisson'] = source / (omega_sq + unit.eta)
    return {name: term.reshape(h, w, unit.embed_dims) for name, term in terms.items()}


# each expert's parameters (and the router's, the identity gate's) by name
EXPERT_PARAMETERS = {
    'heat': ('heat_coef', 'heat_time'),
    'wave': ('wave_coef', 'wave_time'),
    'poisson': ('source_freq', 'source_channel'),
    'router': ('route_logits', ),
    'gate': ('gate', ),
}


def parameter_counts(unit: MoPPAUnit) -> Dict[str, int]:
    """How many parameters each expert (and the router, the gate) holds."""
    sizes = {name: param.numel() for name, param in unit.named_parameters()}
    return {group: sum(sizes.get(name, 0) for name in names)
            for group, names in EXPERT_PARAMETERS.items()}
