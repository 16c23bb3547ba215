"""The MoPPA operator: pure PyTorch, independent of any registry."""
from .dct import dct2d, dct_basis, dct_frequencies, idct2d
from .moppa_unit import (EXPERTS, HEAT_PARAMS, INIT_MODES, MoPPAUnit, moppa_units,
                         resize_frequency_map, route_loss_weight, route_regularization,
                         shared_unit_terms, sharing_unit_terms, unit_terms)

__all__ = [
    'dct2d', 'idct2d', 'dct_basis', 'dct_frequencies', 'MoPPAUnit', 'EXPERTS',
    'INIT_MODES', 'HEAT_PARAMS',
    'resize_frequency_map', 'route_loss_weight', 'route_regularization',
    'moppa_units', 'unit_terms', 'sharing_unit_terms', 'shared_unit_terms'
]
