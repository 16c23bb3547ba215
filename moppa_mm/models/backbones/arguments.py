"""The one check of a MoPPA backbone's arguments, before its base class's
``__init__``: MoPPA's own (type and range), then the others against the base
class's signature, naming ``model.backbone.<arg>`` and the way out."""
import difflib
import importlib
import inspect
import math
from typing import Any, Dict, List

from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import short_repr
from .route_loss import SCHEDULES

SCOPES = ('window', 'global')  # the Swin's unit scopes


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


# MoPPA's own arguments: name -> (what it must be, test)
BACKBONE_ARGS = {
    **{name: ('True or False', lambda v: isinstance(v, bool)) for name in (
        'use_moppa', 'use_scale_shift', 'use_conv_adapter', 'freeze_pretrained',
        'strict_adapter_record', 'merged', 'random_base')},
    'moppa_heads': ("a positive int, or None for the attention's heads", lambda v: v is None
                    or (isinstance(v, int) and not isinstance(v, bool) and v > 0)),
    'route_loss_weight': ('a number >= 0 (0: no route loss)', lambda v: _number(v) and v >= 0),
    'route_schedule': (f'one of {SCHEDULES}', lambda v: v in SCHEDULES),
    'moppa_scope': (f'one of {SCOPES}', lambda v: v in SCOPES),
    'adapter_ratio': ('a number > 0', lambda v: _number(v) and v > 0),
}


def _arguments(cls: type) -> List[str]:
    """The names ``cls(...)`` takes as keywords."""
    return [name for name, param in inspect.signature(cls.__init__).parameters.items()
            if name != 'self' and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)]


def _backbones_taking(arg: str, package: str) -> str:
    """The backbones in ``package``'s registry (its own) that take ``arg``."""
    registry = importlib.import_module(f'{package}.registry').MODELS
    names = sorted(name for name, cls in registry.module_dict.items() if isinstance(cls, type)
                   and cls.__module__.startswith(tuple(
                       f'{package}.models.{kind}' for kind in ('backbones', 'selfsup')))
                   and arg in _arguments(cls))
    return ' / '.join(names[:4] + ['...'] * (len(names) > 4))


def check_arguments(backbone: type, own: Dict[str, Any], kwargs: Dict[str, Any]) -> None:
    """Raise :class:`InputValueError` for a bad argument of ``backbone``: ``own``
    are MoPPA's (its ``__init__``'s ``locals()``), ``kwargs`` its base class's."""
    name = backbone.__name__
    for arg in sorted(BACKBONE_ARGS.keys() & kwargs.keys()):
        raise InputValueError(f'{name}: model.backbone.{arg} is an argument of another '
                              'MoPPA backbone, not of this one: remove it')
    for arg, value in own.items():
        if arg in BACKBONE_ARGS and not BACKBONE_ARGS[arg][1](value):
            raise InputValueError(f'{name}: model.backbone.{arg} = {short_repr(value)}: '
                                  f'it must be {BACKBONE_ARGS[arg][0]}')
    mro = backbone.__mro__  # the MoPPA classes, then the upstream one
    upstream = next(c for c in mro if '__init__' in vars(c) and not c.__module__.startswith(
        'moppa_mm.'))
    package = upstream.__module__.split('.')[0]
    valid = {arg for cls in mro[:mro.index(upstream) + 1] if '__init__' in vars(cls)
             for arg in _arguments(cls)}
    for arg in sorted(kwargs.keys() - valid):
        others = _backbones_taking(arg, package)
        close = difflib.get_close_matches(arg, sorted(valid), n=1)
        way_out = (f"it is one of {package}'s {others}, which {name} does not "
                   "stand in for: keep that type" if others else
                   f'did you mean {close[0]}?' if close else 'remove it')
        raise InputValueError(f'model.backbone.{arg} is not an argument of {name} (nor of '
                              f"{package}'s {upstream.__name__}): {way_out}")
