"""Interpreter start-up hook for environments where torchvision's ops cannot load.

``python moppa_mm/utils/startup.py`` (run by path: it needs nothing from the
package) writes ``moppa_mm_startup.pth`` into the running interpreter's
site-packages (``tools/install.sh`` does this). The line
loads ``torchvision_compat.py`` by its path, without importing the moppa_mm
package (and so without mmdet), and only arms
:func:`~moppa_mm.utils.torchvision_compat.install_import_hook`: nothing is
imported until some code imports torchvision, and where torchvision's ops load
(CUDA machines) nothing is defined.
"""
import os.path as osp
import sysconfig

PTH_NAME = 'moppa_mm_startup.pth'


def startup_line(compat_path: str) -> str:
    """One ``.pth`` line (site executes lines that start with ``import``)."""
    # site may process the same site-packages twice (a venv's lib64 -> lib link):
    # only the first copy of the module may arm the hook and own the schemas.
    code = '\n'.join([
        'import importlib.util as u',
        'try:',
        '    if "_moppa_mm_torchvision_compat" in sys.modules:',
        '        raise ImportError',
        f'    s = u.spec_from_file_location("_moppa_mm_torchvision_compat", {compat_path!r})',
        '    m = sys.modules[s.name] = u.module_from_spec(s)',  # keeps it alive
        '    s.loader.exec_module(m)',
        '    m.install_import_hook()',
        'except Exception:',
        '    pass',
    ])
    return f'import sys; exec({code!r})\n'


def write_startup_pth() -> str:
    compat_path = osp.join(osp.dirname(osp.abspath(__file__)),
                           'torchvision_compat.py')
    path = osp.join(sysconfig.get_paths()['purelib'], PTH_NAME)
    with open(path, 'w') as f:
        f.write(startup_line(compat_path))
    return path


if __name__ == '__main__':
    print(f'wrote {write_startup_pth()}')
