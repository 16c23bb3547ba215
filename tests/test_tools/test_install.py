"""The ``moppa_mm::`` config scope from outside the checkout, for the two ways
users install: editable (what tools/install.sh does) and a normal wheel."""
import os
import os.path as osp
import subprocess
import sys
import sysconfig
import textwrap


from tests.conftest import REPO

HEADLINE = 'moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'
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
                 if line.startswith(('PACKAGE', 'BACKBONE')))
    assert lines['BACKBONE'] == 'MoPPASwinTransformer'
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


def test_scope_with_an_editable_install(tmp_path):
    """A throw-away venv that sees the test venv's packages, with moppa_mm
    installed editable (PEP 660, as pip does it with setuptools >= 64)."""
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
                   check=True)
    python = str(venv / 'bin' / 'python')
    site = subprocess.run([python, '-c', 'import sysconfig; '
                           'print(sysconfig.get_paths()["purelib"])'],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(osp.join(site, 'test_venv_packages.pth'), 'w') as f:
        f.write(SITE_PACKAGES + '\n')
    _pip(python, '-e', REPO)
    # the environment fix, as the ImportError of `import moppa_mm` asks for it
    # where torchvision's ops do not load (tools/install.sh runs the same)
    subprocess.run([python, osp.join(REPO, 'tools', 'torchvision_ops_fix.py')],
                   check=True, env=_clean_env(), capture_output=True)
    assert any(name.startswith('__editable__') for name in os.listdir(site))
    assert not osp.exists(osp.join(site, 'moppa_mm'))  # the code stays in the checkout
    assert _probe(python, tmp_path) == osp.join(REPO, 'moppa_mm')
