"""What the MoPPA backbones share: switching adapters off, re-initialising them
after the base class's ``init_weights``, and the parameter breakdown."""
from typing import Dict, Sequence, Tuple

from moppa_mm.utils.params import parameter_table


class AdapterMixin:
    """Mixed into a backbone subclass (before the base class).

    Subclasses set ``ADAPTER_TYPES`` (modules with ``enabled`` and
    ``reset_parameters``) and ``BREAKDOWN``: ``(key, patterns, label)`` groups,
    the last one catching the pre-trained rest.
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()
    BREAKDOWN: Sequence[Tuple[str, Tuple[str, ...], str]] = ()

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
