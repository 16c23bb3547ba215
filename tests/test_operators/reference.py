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
    terms = {}
    if 'heat' in unit.experts:
        k, time = (physical(p) for p in unit.expert_maps('heat'))
        terms['heat'] = torch.exp(-k[..., None] * omega_sq * time)  # (H, W, N, C/N)
    if 'wave' in unit.experts:
        c, time = unit.expert_maps('wave')
        if unit.share_time and 'heat' in unit.experts:  # heat's t, softplus'd with it
            time = physical(time)
        terms['wave'] = torch.cos(c[..., None] * omega_sq.sqrt() * time)
    if 'poisson' in unit.experts:
        source_freq, source_channel = unit.expert_maps('poisson')
        source = source_freq[..., None] * source_channel  # (H, W, N, C/N)
        terms['poisson'] = source / (omega_sq + unit.eta)
    return {name: term.reshape(h, w, unit.embed_dims) for name, term in terms.items()}


def parameter_counts(unit: MoPPAUnit) -> Dict[str, int]:
    """How many parameters each expert (a row of ``frequency_maps``, and of
    ``channel_maps`` unless it shares heat's), the router and the gate hold."""
    frequency_row, channel_row = unit.frequency_maps[0].numel(), unit.channel_maps.shape[-1]
    counts = {expert: frequency_row + channel_row * (unit.channel_rows.index(row) == index)
              for index, (expert, row) in enumerate(zip(unit.experts, unit.channel_rows))}
    counts['router'] = unit.route_logits.numel()
    counts['gate'] = unit.gate.numel() if hasattr(unit, 'gate') else 0
    return counts
