"""moppa_mm: MoPPA (Mixture of Physical Priors Adapter) for OpenMMLab.

Importing the package registers its backbones, data sets and hooks in mmdet's,
mmpretrain's and mmengine's registries; configs do it with
``custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)``.
Beyond the registries it changes three things of the process, each needed by a
load or a config that moppa_mm does not run itself: the ``moppa_mm::`` config
scope, and mmengine's checkpoint types with torch's ``weights_only`` loader
(safe globals, a copyreg entry). What a built backbone adds (hooks on the model
that holds it, a first-step check) and why: docs/design.md, "Process-wide
effects".
"""


# torch.compiler.is_exporting (every forward), torch.serialization.add_safe_globals,
# and torch.load's weights_only=True default, on which mmengine's loader relies
MIN_TORCH = (2, 6)


def _check_torch_version() -> None:
    """Stop at import, in one line, on a torch older than :data:`MIN_TORCH`
    (it would fail later, deep in a checkpoint load)."""
    import torch
    found = tuple(int(part) for part in torch.__version__.split('+')[0].split('.')[:2])
    if found < MIN_TORCH:
        raise ImportError(f'moppa_mm needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found '
                          f'{torch.__version__}: install a newer torch (README, "Install")')


_check_torch_version()


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
    """Let configs inherit ``moppa_mm::folder/file.py``: mmengine finds a
    scope's ``.mim/configs`` beside the module the scope names. A
    distribution's install location is site-packages even for an editable
    install, so the scope names a module, ``moppa_mm.version``, whose folder
    is the imported package's in every install mode."""
    from mmengine.config.utils import MODULE2PACKAGE
    MODULE2PACKAGE.setdefault('moppa_mm', 'moppa_mm.version')


_register_config_scope()


def _allow_runner_checkpoints() -> None:
    """Checkpoints that any mmengine Runner writes load with torch's default
    ``weights_only=True`` (a registration with torch, nothing patched)."""
    from .utils.safe_globals import allow_runner_checkpoints
    allow_runner_checkpoints()


_allow_runner_checkpoints()

from .apis import AdapterBank  # noqa: E402,F401
from .version import __version__  # noqa: E402,F401
from .models import merge_adapters  # noqa: E402,F401
