"""Make ``import torchvision`` work where its compiled ops cannot load.

torchvision 0.28.0's CUDA-only wheel on a CPU-only torch dies with "operator
torchvision::nms does not exist" (docs/cpu_quirks.md); ``tools/install.sh``
runs this file once per environment.

    python tools/torchvision_ops_fix.py              # into this interpreter's site-packages
    python tools/torchvision_ops_fix.py --site-dir DIR

writes ``moppa_mm_startup.pth``, whose one line loads THIS file by its path and
arms :func:`install_import_hook`: the first import of torchvision, by any code,
first runs :func:`ensure_torchvision_importable`, which defines the two operator
schemas only where torchvision's ``_C`` fails to load. The package itself never
patches torch.
"""
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import os
import os.path as osp
import sys
import sysconfig

PTH_NAME = 'moppa_mm_startup.pth'
MODULE_NAME = '_moppa_mm_torchvision_ops_fix'  # the name the .pth loads it under
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
    """Arm the check for the first import of torchvision (cheap: imports
    nothing), and hide setuptools 80.9's warning on each import of its
    ``pkg_resources``, which mmengine and mmcv still use: two lines before
    every command of the environment, about code that is not ours."""
    import warnings
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                            category=UserWarning)
    if 'torchvision' in sys.modules or any(
            type(f).__name__ == _TorchvisionImportHook.__name__
            for f in sys.meta_path):  # one hook, whichever copy of this module
        return
    sys.meta_path.insert(0, _TorchvisionImportHook())


def startup_line(fix_path: str) -> str:
    """The ``.pth`` line (site executes lines that start with ``import``). A
    failure is reported on stderr, naming the ``.pth``, instead of surfacing
    later as torchvision's "operator torchvision::nms does not exist"."""
    # site may process the same site-packages twice (a venv's lib64 -> lib link):
    # only the first copy of the module may arm the hook and own the schemas.
    failed = f'{PTH_NAME}: cannot run {fix_path}: '
    advice = ('; run tools/torchvision_ops_fix.py of the moppa_mm checkout again '
              '(tools/install.sh does), or delete this file\n')
    code = '\n'.join([
        'import importlib.util as u',
        f'if {MODULE_NAME!r} not in sys.modules:',
        '    try:',
        f'        s = u.spec_from_file_location({MODULE_NAME!r}, {fix_path!r})',
        '        m = sys.modules[s.name] = u.module_from_spec(s)',  # keeps it alive
        '        s.loader.exec_module(m)',
        '        m.install_import_hook()',
        '    except Exception as e:',
        f'        sys.modules.pop({MODULE_NAME!r}, None)',
        f'        sys.stderr.write({failed!r} + repr(e) + {advice!r})',
    ])
    return f'import sys; exec({code!r})\n'


def write_startup_pth(site_dir: str = None) -> str:
    """Write :data:`PTH_NAME` into ``site_dir`` (default: this interpreter's
    site-packages), pointing at this file. Returns its path."""
    site_dir = site_dir or sysconfig.get_paths()['purelib']
    os.makedirs(site_dir, exist_ok=True)
    path = osp.join(site_dir, PTH_NAME)
    with open(path, 'w') as f:
        f.write(startup_line(osp.abspath(__file__)))
    return path


def pth_in_place(site_dir: str = None) -> bool:
    """Whether ``site_dir`` holds the ``.pth`` that :func:`write_startup_pth`
    writes from this file (a copied checkout's venv points at the original)."""
    site_dir = site_dir or sysconfig.get_paths()['purelib']
    try:
        with open(osp.join(site_dir, PTH_NAME)) as f:
            return f.read() == startup_line(osp.abspath(__file__))
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--site-dir', help='where the .pth goes (default: the '
                        "running interpreter's site-packages)")
    parser.add_argument('--check', action='store_true',
                        help='change nothing; exit 1 unless the .pth written from '
                        'this file is in place')
    args = parser.parse_args()
    if args.check:
        return 0 if pth_in_place(args.site_dir) else 1
    print(f'wrote {write_startup_pth(args.site_dir)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
