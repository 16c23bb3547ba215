"""What the MoPPA backbones share: switching adapters off, re-initialising them
after the base class's ``init_weights``, and the parameter breakdown."""
from typing import Dict, Optional, Sequence, Tuple

from mmengine.config import ConfigDict

from moppa_mm.utils.params import parameter_table


class AdapterMixin:
    """Mixed into a backbone subclass (before the base class).

    Subclasses set ``ADAPTER_TYPES`` (modules with ``enabled`` and
    ``reset_parameters``) and ``BREAKDOWN``: ``(key, patterns, label)`` groups,
    the last one catching the pre-trained rest.
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()
    BREAKDOWN: Sequence[Tuple[str, Tuple[str, ...], str]] = ()

    @staticmethod
    def _check_moppa_cfg(moppa_cfg: Optional[dict], kwargs: dict) -> dict:
        """Validate the unit's extra arguments (the backbone derives the dims,
        heads and grid) and give the base class an attribute-style
        ``init_cfg`` (mmdet's Swin reads ``init_cfg.checkpoint``)."""
        moppa_cfg = dict(moppa_cfg or {})
        for reserved in ('embed_dims', 'num_heads', 'grid_size'):
            if reserved in moppa_cfg:
                raise ValueError(f'moppa_cfg must not set {reserved!r}: the '
                                 'backbone derives it')
        if isinstance(kwargs.get('init_cfg'), dict):
            kwargs['init_cfg'] = ConfigDict(kwargs['init_cfg'])
        return moppa_cfg

    def _adapters(self):
        return [m for m in self.modules() if isinstance(m, self.ADAPTER_TYPES)]

    @property
    def adapters_enabled(self) -> bool:
        """Whether the adapters run (False: exactly the plain backbone)."""
        return all(m.enabled for m in self._adapters())

    @adapters_enabled.setter
    def adapters_enabled(self, enabled: bool) -> None:
        for module in self._adapters():
            module.enabled = enabled

    def init_weights(self) -> None:
        """The base classes re-initialise every Linear when no checkpoint is
        given: re-initialise the adapters after them."""
        super().init_weights()
        for module in self._adapters():
            module.reset_parameters()

    def parameter_breakdown(self) -> Dict[str, Dict[str, int]]:
        _, counts = parameter_table(self, [(k, p) for k, p, _ in self.BREAKDOWN])
        return counts

    def parameter_report(self) -> str:
        table, _ = parameter_table(self, [(label, p) for _, p, label in self.BREAKDOWN],
                                   title=type(self).__name__)
        return table
