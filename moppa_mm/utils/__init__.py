"""Utilities. Importing this package stays light: torch only."""
from .torchvision_compat import ensure_torchvision_importable, install_import_hook

__all__ = ['ensure_torchvision_importable', 'install_import_hook']
