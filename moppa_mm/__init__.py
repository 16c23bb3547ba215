"""moppa_mm: MoPPA (Mixture of Physical Priors Adapter) for OpenMMLab.

Importing the package registers its backbones, data sets and hooks in
mmdet's, mmpretrain's and mmengine's registries, the ``moppa_mm::`` config
scope, and mmengine's checkpoint types with torch's ``weights_only`` loader;
configs do it with
``custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)``.

It also registers one torch module-registration hook
(:mod:`moppa_mm.models.backbones.model_hooks`), so that a config changes only
the backbone: a model that is assigned a MoPPA backbone (``detector.backbone =
...``) gets a forward hook that adds ``loss_route`` to its loss dict, a
state-dict hook that saves the backbone adapter-only where its config names
the base (with the record's digest) and a load pre-hook that checks every
checkpoint loaded into it. ``print(model)`` shows them on the backbone
(``model_hooks=...``); assigning another module in the backbone's place
removes them. Other modules are left as they are.

A MoPPA backbone with a frozen base also registers, when it is built, a one-shot
global optimizer step pre-hook (torch's ``register_optimizer_step_pre_hook``;
:mod:`moppa_mm.models.backbones.optimizer_check`): at the first step of an
optimizer that holds its adapters it warns if they train at another learning
rate than the optimizer's (a ``paramwise_cfg`` key such as ``'backbone'`` with
``lr_mult=0.1``), then removes itself. ``print(model)`` shows it on the
backbone while it waits (``optimizer_check=...``).
"""


def _torchvision_ops_missing(error: BaseException) -> ImportError:
    """The error for a torchvision whose compiled ops do not load (its CUDA-only
    0.28.0 build on a CPU torch): mmdet's and mmpretrain's imports die in
    torchvision with "operator torchvision::nms does not exist"."""
    return ImportError(
        f'moppa_mm needs mmdet and mmpretrain, which import torchvision, and '
        f'torchvision fails to import here ({error}): its compiled ops do not load '
        'with this torch (torchvision 0.28.0 is published only as a CUDA build). '
        'Fix the environment once: `python tools/torchvision_ops_fix.py` from the '
        'moppa_mm checkout, with this interpreter (tools/install.sh does it), or '
        'install a torchvision build that matches your torch.')


try:
    from . import datasets, engine, models  # noqa: F401  (registers them)
except RuntimeError as error:
    if 'torchvision::' not in str(error):
        raise
    raise _torchvision_ops_missing(error) from error


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


def _allow_runner_checkpoints() -> None:
    """Checkpoints that any mmengine Runner writes load with torch's default
    ``weights_only=True`` (a registration with torch, nothing patched)."""
    from .utils.checkpoints import allow_runner_checkpoints
    allow_runner_checkpoints()


_allow_runner_checkpoints()

from .apis import AdapterBank  # noqa: E402,F401
from .version import __version__  # noqa: E402,F401
from .models import merge_adapters  # noqa: E402,F401
