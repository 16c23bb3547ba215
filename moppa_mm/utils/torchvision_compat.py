"""Make ``import torchvision`` work where its compiled ops cannot load.

torchvision 0.28.0 is published only as a CUDA build. On a CPU-only torch its
``_C`` library fails to load, yet ``torchvision/_meta_registrations.py``
registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms``
unconditionally, so the import dies with "operator torchvision::nms does not
exist" (and with it mmpretrain, and mmdet's ``register_all_modules``).

:func:`ensure_torchvision_importable` runs before torchvision is imported: it
loads torchvision's ``_C`` the way torchvision does, and only if that fails does
it define the two operator schemas (no kernels; detection uses ``mmcv.ops.nms``).
Where ``_C`` loads (any matching CUDA or CPU build) nothing is defined.

:func:`install_import_hook` runs the same check the first time any code imports
torchvision, so tools we do not own (mmpretrain's and mmdet's ``tools/test.py``)
work too; ``tools/install.sh`` activates it at interpreter start-up with a
``.pth`` file (see :mod:`moppa_mm.utils.startup`).
"""
import importlib.abc
import importlib.util
import os.path as osp
import sys

_SCHEMAS = {
    'nms': 'nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor',
    'qnms': 'qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor',
}
_STATE = {'checked': False, 'defined': (), 'library': None}


def _torchvision_ops_library():
    spec = importlib.util.find_spec('torchvision')
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = osp.join(folder, '_C' + suffix)
            if osp.exists(path):
                return path
    return None


def ensure_torchvision_importable() -> tuple:
    """Define the missing torchvision op schemas if its ops cannot load.

    Returns the names of the schemas it defined (empty where none was needed).
    Idempotent; a no-op once torchvision is imported or where its ops load.
    """
    if _STATE['checked']:
        return _STATE['defined']
    _STATE['checked'] = True
    if 'torchvision' in sys.modules:
        return ()
    import torch
    library_path = _torchvision_ops_library()
    if library_path is None:  # torchvision is not installed
        return ()
    try:
        torch.ops.load_library(library_path)
    except (OSError, RuntimeError):
        pass
    missing = [name for name in _SCHEMAS
               if not hasattr(torch.ops.torchvision, name)]
    if missing:
        library = torch.library.Library('torchvision', 'FRAGMENT')
        for name in missing:
            library.define(_SCHEMAS[name])
        # the definitions live as long as this object: keep the module imported
        _STATE['library'] = library
    _STATE['defined'] = tuple(missing)
    return _STATE['defined']


class _TorchvisionImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`ensure_torchvision_importable` just before torchvision loads."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == 'torchvision':
            sys.meta_path.remove(self)
            ensure_torchvision_importable()
        return None  # let the normal finders import it


def install_import_hook() -> None:
    """Arm the check for the first import of torchvision (cheap: imports nothing)."""
    if 'torchvision' in sys.modules or any(
            type(f).__name__ == _TorchvisionImportHook.__name__
            for f in sys.meta_path):  # one hook, whichever copy of this module
        return
    sys.meta_path.insert(0, _TorchvisionImportHook())
