"""Let openmim find an editable install: ``<site-packages>/moppa_mm`` as a
symlink to the checkout's package.

``mim search/train/test moppa_mm`` (openmim 0.3.9) look for
``<distribution location>/moppa_mm/.mim``. An editable install (PEP 660, what
``pip install -e .`` does with setuptools >= 64) puts only its metadata and an
import finder in site-packages, which is the distribution's location, and the
package stays in the checkout: mim finds nothing. With the link, mim reaches the
checkout's ``moppa_mm/.mim`` (configs, tools, model-index.yml).

Python's path finder then imports moppa_mm through the link, before the
editable finder (setuptools appends that one to ``sys.meta_path``): the same
files under one module name, so one copy of every module, and edits in the
checkout take effect at once. The link is added to the distribution's RECORD,
so ``pip uninstall moppa_mm`` (and the uninstall a reinstall does first)
removes it, the link only: pip does not follow it. A moved checkout leaves the
link dangling (imports then fail, as they would without it, and pip skips it on
uninstall, as a path that does not exist): running this file again replaces it.

``tools/install.sh`` runs this file by path (it imports nothing from the
package) after ``pip install -e .``::

    python tools/site_link.py          # link (idempotent)
    python tools/site_link.py --check  # 0: linked or a normal install
"""
import argparse
import csv
import json
import os
import os.path as osp
import sys
from importlib import metadata
from typing import List, Optional
from urllib.parse import unquote, urlsplit

PACKAGE = 'moppa_mm'
RECORD_ENTRY = [PACKAGE, '', '']  # path relative to site-packages, no hash, no size


def editable_checkout(dist: metadata.Distribution) -> Optional[str]:
    """The checkout an editable install points at (its ``direct_url.json``,
    PEP 610), or None for a normal install."""
    text = dist.read_text('direct_url.json')
    info = json.loads(text) if text else {}
    if not info.get('dir_info', {}).get('editable'):
        return None
    url = urlsplit(info['url'])  # file:///path/to/checkout
    return unquote(url.path) if url.scheme == 'file' else None


def record_path(dist: metadata.Distribution) -> str:
    """The distribution's RECORD file (pip removes what it lists on uninstall)."""
    for path in dist.files or ():
        if path.name == 'RECORD' and path.parent.name.endswith('.dist-info'):
            return str(path.locate())
    raise SystemExit(f'{PACKAGE} {dist.version} has no RECORD file: reinstall it')


def is_recorded(record: str) -> bool:
    with open(record, newline='') as f:
        return any(row[:1] == [PACKAGE] for row in csv.reader(f))


def link_site_package(dist: metadata.Distribution, checkout: str) -> str:
    """Make ``<site-packages>/moppa_mm`` a link to ``<checkout>/moppa_mm``
    and list it in RECORD. Replaces a link left by an earlier install (live
    or dangling); refuses to touch a real directory."""
    link = str(dist.locate_file(PACKAGE))
    target = osp.join(checkout, PACKAGE)
    if not osp.isfile(osp.join(target, '__init__.py')):
        raise SystemExit(f'{PACKAGE} is installed editable from {checkout}, '
                         f'which has no {PACKAGE}/__init__.py: reinstall it')
    if osp.islink(link):
        os.remove(link)
    elif osp.exists(link):
        raise SystemExit(f'{link} exists and is no link (left by another install?): '
                         f'remove it, then run `pip install -e {checkout}` again')
    os.symlink(target, link)
    record = record_path(dist)
    if not is_recorded(record):
        with open(record, 'a', newline='') as f:
            csv.writer(f).writerow(RECORD_ENTRY)
    return link


def is_linked(dist: metadata.Distribution, checkout: str) -> bool:
    link = str(dist.locate_file(PACKAGE))
    return (osp.islink(link) and osp.isfile(osp.join(link, '__init__.py'))
            and osp.realpath(link) == osp.realpath(osp.join(checkout, PACKAGE))
            and is_recorded(record_path(dist)))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true',
                        help='change nothing; exit 1 unless the install is an editable '
                        'one of THIS checkout with its link in place (or a normal install)')
    args = parser.parse_args(argv)
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        print(f'{PACKAGE} is not installed in {sys.prefix}', file=sys.stderr)
        return 1
    checkout = editable_checkout(dist)
    if checkout is None:  # a normal install: site-packages/moppa_mm is the package
        print(f'{PACKAGE} is a normal install: mim finds it as it is')
        return 0
    if args.check:  # a copied checkout with its venv still points at the original
        this_checkout = osp.dirname(osp.dirname(osp.abspath(__file__)))
        if osp.realpath(checkout) != osp.realpath(this_checkout):
            print(f'{PACKAGE} in {sys.prefix} is an editable install of {checkout}, not of '
                  f'{this_checkout}', file=sys.stderr)
            return 1
        if not is_linked(dist, checkout):
            print(f'{PACKAGE} in {sys.prefix} lacks its site link', file=sys.stderr)
            return 1
        return 0
    print(f'linked {link_site_package(dist, checkout)} -> {checkout}/{PACKAGE}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
