"""Bounded checks of a config file before mmengine parses it.

A YAML config small on disk can be huge once its aliases expand (nine lines
of ten aliases make a billion nodes), and mmengine's ``Config.fromfile`` copies
the tree node by node, for hours, with no output; a file nested thousands of
levels deep, or ``_base_`` files that name each other, end in a bare
``RecursionError``. :func:`check_config_file` walks a YAML file's events and
counts a JSON file's brackets (linear, no recursion, nothing built), then the
``_base_`` files it names, whatever their format (a Python config's
``_base_ = ...`` line is read with ``ast``, nothing of it runs).
"""
import ast
import json
import os.path as osp
import re
from typing import Any, List, Optional, Set, Tuple

import yaml

from .errors import InputValueError

MAX_YAML_NODES = 1_000_000
MAX_YAML_DEPTH = 500
YAML_SUFFIXES = ('.yml', '.yaml')
CONFIG_SUFFIXES = ('.py', '.json') + YAML_SUFFIXES
# a JSON string (skipped whole) or one bracket
_JSON_TOKENS = re.compile(rb'"(?:[^"\\\n]|\\.)*"|[\[\]{}]')

_SafeLoader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)


def _scan_yaml(path: str, max_nodes: int, max_depth: int) -> None:
    sizes = {}  # anchor -> expanded node count
    stack = []  # [anchor, expanded node count so far] per open collection
    total = 0

    def add(size: int) -> None:
        nonlocal total
        if stack:
            stack[-1][1] += size
            count = stack[-1][1]
        else:
            total += size
            count = total
        if count > max_nodes:
            raise InputValueError(
                f'{path}: refused: its YAML aliases expand to more than {max_nodes:,} '
                f'nodes (line {event.start_mark.line + 1}); a config this large is '
                'not a config (an alias bomb?)')

    with open(path, 'rb') as f:
        try:
            for event in yaml.parse(f, Loader=_SafeLoader):
                if isinstance(event, yaml.CollectionStartEvent):
                    stack.append([event.anchor, 1])
                    if len(stack) > max_depth:
                        raise InputValueError(
                            f'{path}: refused: nested more than {max_depth} levels '
                            f'deep (line {event.start_mark.line + 1})')
                elif isinstance(event, yaml.CollectionEndEvent):
                    anchor, size = stack.pop()
                    if anchor is not None:
                        sizes[anchor] = size
                    add(size)
                elif isinstance(event, yaml.ScalarEvent):
                    if event.anchor is not None:
                        sizes[event.anchor] = 1
                    add(1)
                elif isinstance(event, yaml.AliasEvent):
                    add(sizes.get(event.anchor, 1))
        except yaml.YAMLError as error:
            mark = getattr(error, 'problem_mark', None)
            if 'maximum nesting depth' in str(error) and mark is not None:
                # PyYAML >= 6.0.4 has a depth limit of its own (1000), which
                # its scanner can reach before the parser's events reach ours
                raise InputValueError(
                    f'{path}: refused: nested more than {max_depth} levels deep '
                    f'(line {mark.line + 1})') from None
            raise InputValueError(f'{path}: not valid YAML: {error}') from None
        except UnicodeDecodeError as error:
            raise InputValueError(f'{path}: not a text file ({error.reason} at byte offset '
                                  f'{error.start})') from None


def _scan_json(path: str, max_depth: int) -> None:
    """Refuse a JSON file nested more than ``max_depth`` levels (linear, no
    recursion: Python's parser recurses once per level)."""
    with open(path, 'rb') as f:
        data = f.read()
    depth = 0
    for token in _JSON_TOKENS.finditer(data):
        bracket = token.group()
        if bracket in (b'[', b'{'):
            depth += 1
            if depth > max_depth:
                line = data.count(b'\n', 0, token.start()) + 1
                raise InputValueError(f'{path}: refused: nested more than {max_depth} '
                                      f'levels deep (line {line})')
        elif bracket in (b']', b'}'):
            depth -= 1


def _python_bases(path: str) -> Any:
    """The literal value of a Python config's first ``_base_ = ...`` line (the
    one mmengine reads); None when there is none or it is not a literal."""
    try:
        with open(path, 'rb') as f:
            tree = ast.parse(f.read())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # mmengine names the file when it parses it
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == '_base_'):
            try:
                return ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
    return None


def _data_bases(path: str, suffix: str) -> Any:
    """The ``_base_`` of a YAML or JSON config, once it is within bounds."""
    with open(path, 'rb') as f:
        try:
            content = json.load(f) if suffix == '.json' else yaml.load(f, Loader=_SafeLoader)
        except (ValueError, yaml.YAMLError, RecursionError):
            return None  # invalid, or a tag of mmengine's full loader: mmengine reads it
    return content.get('_base_') if isinstance(content, dict) else None


def _local_files(bases: Any) -> List[str]:
    """The ``_base_`` entries that name files (``'pkg::path'`` names an
    installed package's config)."""
    bases = [bases] if isinstance(bases, str) else bases
    return [base for base in bases if isinstance(base, str) and '::' not in base] \
        if isinstance(bases, list) else []


def check_config_file(path: str, max_nodes: int = MAX_YAML_NODES,
                      max_depth: int = MAX_YAML_DEPTH, _chain: Tuple[str, ...] = (),
                      _checked: Optional[Set[str]] = None) -> None:
    """Refuse, naming the file, a config whose YAML alias expansion or whose
    nesting (YAML, JSON) is out of bounds, one with a ``_base_`` file
    (relative to it, of any format, at any level) that is, and ``_base_``
    files that name each other in a cycle (mmengine recurses until Python's
    recursion limit). A Python config is code, run as such by mmengine: only
    its ``_base_`` line is read."""
    suffix = osp.splitext(path)[1].lower()
    if suffix not in CONFIG_SUFFIXES or not osp.isfile(path):
        return
    checked = set() if _checked is None else _checked
    real = osp.realpath(path)
    if real in _chain:
        cycle = ' -> '.join(_chain[_chain.index(real):] + (real, ))
        raise InputValueError(f'{_chain[0]}: its _base_ files name each other in a cycle '
                              f'(mmengine would recurse until it fails): {cycle}')
    if real in checked:
        return
    if suffix in YAML_SUFFIXES:
        _scan_yaml(path, max_nodes, max_depth)
    elif suffix == '.json':
        _scan_json(path, max_depth)
    # within bounds now: cheap to build
    bases = _python_bases(path) if suffix == '.py' else _data_bases(path, suffix)
    for base in _local_files(bases):
        check_config_file(osp.join(osp.dirname(path), base), max_nodes, max_depth,
                          _chain + (real, ), checked)
    checked.add(real)


def read_config(path: str):
    """``mmengine.config.Config.fromfile`` after :func:`check_config_file`; a
    file nested too deeply for mmengine's parsers is named instead of a bare
    ``RecursionError``. Every tool of ours reads a user's config file with it."""
    from mmengine.config import Config
    check_config_file(path)
    try:
        return Config.fromfile(path)
    except RecursionError:
        raise InputValueError(f'{path}: nested too deeply to parse; not a config '
                              'file') from None
