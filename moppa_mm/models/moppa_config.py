"""The options of a MoPPA backbone's units: validated once, the shipped recipe
as defaults, recorded in every checkpoint (the adapter record)."""
import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from moppa_mm.operators.moppa_unit import EXPERTS, check_unit_options
from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import short_repr

# the backbone derives these from its own architecture
RESERVED = ('embed_dims', 'num_heads', 'grid_size')


@dataclasses.dataclass(frozen=True)
class MoPPAConfig:
    """The options of every :class:`~moppa_mm.operators.MoPPAUnit` of a backbone,
    each the unit's argument of the same name; the defaults are the shipped
    recipe, the paper's Eq. 11 and initialisation as written (docs/design.md)."""

    eta: float = 1e-3
    share_time: bool = False
    coef_init: float = 1e-2
    time_init: float = 1.0
    source_init_std: float = 1e-2
    resize_mode: str = 'bicubic'
    experts: Tuple[str, ...] = EXPERTS
    init_mode: str = 'paper'
    heat_param: str = 'raw'

    def __post_init__(self) -> None:
        if isinstance(self.experts, (list, tuple)):  # a string stays one, and is refused
            object.__setattr__(self, 'experts', tuple(self.experts))
        check_unit_options(eta=self.eta, resize_mode=self.resize_mode,
                           experts=self.experts, init_mode=self.init_mode,
                           heat_param=self.heat_param)
        for name in ('coef_init', 'time_init', 'source_init_std'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputValueError(f'model.backbone.moppa_cfg.{name} must be a number, '
                                      f'got {value!r}')
        if not isinstance(self.share_time, bool):
            raise InputValueError(f'model.backbone.moppa_cfg.share_time must be True or '
                                  f'False, got {self.share_time!r}')

    @classmethod
    def build(cls, options: Optional[Mapping[str, Any]] = None) -> 'MoPPAConfig':
        """From a config's ``moppa_cfg`` dict (or a ``MoPPAConfig``): unknown
        keys and keys the backbone derives are errors that name them."""
        if isinstance(options, cls):
            return options
        known = [field.name for field in dataclasses.fields(cls)]
        if not isinstance(options, (Mapping, type(None))):
            raise InputValueError(
                f'model.backbone.moppa_cfg = {short_repr(options)} is a '
                f'{type(options).__name__}: it must be a dict of the units\' options '
                f'(any of {known}), e.g. moppa_cfg=dict(heat_param=\'raw\')')
        options = dict(options or {})
        for reserved in RESERVED:
            if reserved in options:
                raise InputValueError(f'model.backbone.moppa_cfg must not set {reserved!r}: '
                                      'the backbone derives it')
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InputValueError(f'model.backbone.moppa_cfg has unknown option(s) '
                                  f'{unknown}; the options are {known}')
        return cls(**options)

    def to_dict(self) -> Dict[str, Any]:
        """Plain values (``experts`` as a list): what a checkpoint records."""
        options = dataclasses.asdict(self)
        options['experts'] = list(self.experts)
        return options

    def unit_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of ``MoPPAUnit`` besides dims, heads and grid."""
        return dataclasses.asdict(self)
