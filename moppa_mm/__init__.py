"""moppa_mm: MoPPA (Mixture of Physical Priors Adapter) for OpenMMLab.

Importing the package registers its backbones in mmdet's (and mmpretrain's)
MODELS and its hooks in mmengine's HOOKS; configs do it with
``custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)``.
"""
from .utils.torchvision_compat import ensure_torchvision_importable

ensure_torchvision_importable()  # before anything imports torchvision

from . import datasets, engine, evaluation, models  # noqa: E402,F401
from .utils import distributed  # noqa: E402,F401


def _register_config_scope() -> None:
    """Let configs inherit ``moppa_mm::folder/file.py`` (mmengine only knows
    the OpenMMLab packages it lists)."""
    from mmengine.config.utils import MODULE2PACKAGE
    MODULE2PACKAGE.setdefault('moppa_mm', 'moppa_mm')


_register_config_scope()

__version__ = '0.1.0'
