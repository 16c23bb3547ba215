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
    """Let configs inherit ``moppa_mm::folder/file.py``.

    mmengine maps a scope to a package name (it only lists the OpenMMLab
    packages) and looks for ``<package dir>/.mim/configs``. For a distribution
    it takes the directory from the distribution's install location, which is
    site-packages even for an editable install (PEP 660), whose code stays in
    the checkout: the lookup then fails. For a name that is no distribution,
    mmengine falls back to ``importlib.util.find_spec(name).origin``. So the
    scope names ``moppa_mm.version``: its directory is the imported package's
    directory, whatever the install mode (editable, wheel, or PYTHONPATH).
    """
    from mmengine.config.utils import MODULE2PACKAGE
    MODULE2PACKAGE.setdefault('moppa_mm', 'moppa_mm.version')


_register_config_scope()

from .version import __version__  # noqa: E402,F401
