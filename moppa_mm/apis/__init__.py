"""Working with trained MoPPA models: :class:`AdapterBank` (many tasks on one
frozen base)."""
from .adapter_bank import AdapterBank

__all__ = ['AdapterBank']
