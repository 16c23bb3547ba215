"""The ``moppa_mm::`` config scope from outside the checkout, for the two ways
users install: editable (what tools/install.sh does) and a normal wheel; and
the link tools/install.sh adds to an editable install for openmim."""
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig
import textwrap

from tests.conftest import REPO

HEADLINE = 'moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'
SHARED_PIECES = ('models/moppa_vit-b-p16.py', 'datasets/vtab1k_bs64.py',
                 'schedules/bs64_adamw_110e.py', 'default_runtime.py')
SITE_PACKAGES = sysconfig.get_paths()['purelib']  # the venv running the tests

# Run from a folder outside the checkout: import moppa_mm, then parse a config
# that inherits through the scope and print where things came from.
PROBE = textwrap.dedent(f"""
    import os.path as osp
    import moppa_mm
    from mmengine.config import Config
    with open('user_config.py', 'w') as f:
        f.write("_base_ = 'moppa_mm::{HEADLINE}'\\n")
    cfg = Config.fromfile('user_config.py')
    alias = Config.fromfile(osp.join(osp.dirname(moppa_mm.__file__), '.mim',
                                     'configs', 'cascade_moppa_swin_b_coco.py'))
    assert cfg.model == alias.model, 'the headline alias differs from its target'
    print('PACKAGE', osp.dirname(moppa_mm.__file__))
    print('BACKBONE', cfg.model.backbone.type)
    # a new classification task composed from the shared pieces
    with open('user_cls_config.py', 'w') as f:
        f.write("_base_ = [" + ", ".join(
            repr("moppa_mm::_base_/" + piece) for piece in {SHARED_PIECES!r}) + "]\\n")
    cls = Config.fromfile('user_cls_config.py')
    assert cls.train_dataloader.dataset.type == 'VTAB1k', cls.train_dataloader
    print('CLS_BACKBONE', cls.model.backbone.type)
""")


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['OMP_NUM_THREADS'] = '1'
    return env


def _probe(python, tmp_path, extra_path=None):
    env = _clean_env()
    if extra_path:
        env['PYTHONPATH'] = extra_path
    workdir = tmp_path / 'elsewhere'
    workdir.mkdir()
    result = subprocess.run([python, '-c', PROBE], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(' ', 1) for line in result.stdout.splitlines()
                 if line.startswith(('PACKAGE', 'BACKBONE', 'CLS_BACKBONE')))
    assert lines['BACKBONE'] == 'MoPPASwinTransformer'
    assert lines['CLS_BACKBONE'] == 'MoPPAVisionTransformer'
    return lines['PACKAGE']


def _pip(python, *args, cwd=REPO):
    result = subprocess.run(
        [python, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation',
         '--disable-pip-version-check', *args], cwd=cwd, env=_clean_env(),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_scope_with_a_wheel_install(tmp_path):
    target = tmp_path / 'target'
    _pip(sys.executable, '--target', str(target), REPO)
    assert osp.isfile(target / 'moppa_mm/.mim/model-index.yml')
    assert not osp.islink(target / 'moppa_mm/.mim/configs')  # copied, not linked
    assert _probe(sys.executable, tmp_path, str(target)) == str(target / 'moppa_mm')


def _throwaway_venv(tmp_path):
    """A venv that sees the test venv's packages but not its moppa_mm (which
    tools/install.sh links into site-packages): a folder of links to every other
    entry of the test venv's site-packages, on the path through a ``.pth``.
    Returns its python and its site-packages."""
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
                   check=True)
    python = str(venv / 'bin' / 'python')
    site = subprocess.run([python, '-c', 'import sysconfig; '
                           'print(sysconfig.get_paths()["purelib"])'],
                          capture_output=True, text=True, check=True).stdout.strip()
    packages = tmp_path / 'test_venv_packages'
    packages.mkdir()
    for name in os.listdir(SITE_PACKAGES):
        if name != 'moppa_mm':
            os.symlink(osp.join(SITE_PACKAGES, name), packages / name)
    with open(osp.join(site, 'test_venv_packages.pth'), 'w') as f:
        f.write(f'{packages}\n')
    return python, site


def _torchvision_ops_fix(python):
    """The environment fix, as the ImportError of `import moppa_mm` asks for it
    where torchvision's ops do not load (tools/install.sh runs the same)."""
    subprocess.run([python, osp.join(REPO, 'tools', 'torchvision_ops_fix.py')],
                   check=True, env=_clean_env(), capture_output=True)


def test_scope_with_an_editable_install(tmp_path):
    """moppa_mm installed editable (PEP 660, as pip does it with setuptools
    >= 64), nothing else: the CUDA-machine install."""
    python, site = _throwaway_venv(tmp_path)
    _pip(python, '-e', REPO)
    _torchvision_ops_fix(python)
    assert any(name.startswith('__editable__') for name in os.listdir(site))
    assert not osp.exists(osp.join(site, 'moppa_mm'))  # the code stays in the checkout
    assert _probe(python, tmp_path) == osp.join(REPO, 'moppa_mm')


def test_mim_finds_an_editable_install_through_the_documented_link(tmp_path):
    """The set-up tools/install.sh runs (and docs/install.md shows) for openmim,
    on an editable install of a copy of the checkout: a link
    <site-packages>/moppa_mm -> the copy's package, nothing of pip's records
    touched. mim's own lookup then finds .mim, imports go through the link,
    and pip's uninstall leaves the link alone (the docs say to remove it)."""
    python, site = _throwaway_venv(tmp_path)
    checkout = tmp_path / 'checkout'
    shutil.copytree(osp.join(REPO, 'moppa_mm'), checkout / 'moppa_mm',
                    ignore=shutil.ignore_patterns('.mim', '__pycache__'))
    for name in ('configs', 'tools'):
        shutil.copytree(osp.join(REPO, name), checkout / name)
    for name in ('setup.py', 'README.md', 'model-index.yml'):
        shutil.copy(osp.join(REPO, name), checkout / name)
    _pip(python, '-e', str(checkout))
    _torchvision_ops_fix(python)
    find = [python, '-c', "from mim.utils import get_installed_path; "
            "print(get_installed_path('moppa_mm'))"]
    found = subprocess.run(find, cwd=tmp_path, env=_clean_env(), capture_output=True,
                           text=True, timeout=120)
    assert not osp.isdir(osp.join(found.stdout.strip(), '.mim'))  # pip's install alone
    link = osp.join(site, 'moppa_mm')
    os.symlink(checkout / 'moppa_mm', link)
    found = subprocess.run(find, cwd=tmp_path, env=_clean_env(), capture_output=True,
                           text=True, timeout=120)
    assert found.stdout.strip() == link, found.stderr[-2000:]
    assert osp.isfile(osp.join(link, '.mim', 'model-index.yml'))
    assert _probe(python, tmp_path) == link  # imported through the link
    # install.sh's up-to-date test, run from another checkout (copied with the
    # venv): the .pth was written from REPO
    ops_fix = [python, 'tools/torchvision_ops_fix.py', '--check']
    assert subprocess.run(ops_fix, cwd=REPO, env=_clean_env()).returncode == 0
    assert subprocess.run(ops_fix, cwd=checkout, env=_clean_env()).returncode == 1
    result = subprocess.run([python, '-m', 'pip', 'uninstall', '-y', 'moppa_mm'],
                            env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert osp.islink(link)
    assert osp.isfile(checkout / 'moppa_mm' / '__init__.py')
