"""Bounded checks of a config file before mmengine parses it.

A YAML config can be small on disk and huge once its aliases are expanded
(``a: &a [x, x, ...]``, ``b: &b [*a, *a, ...]``, ...: nine lines of ten
aliases make a billion nodes). PyYAML shares the aliased objects, but
mmengine's ``Config.fromfile`` then copies the tree node by node (``ConfigDict``,
``_base_`` merging, the text dump), and hangs with no output. A file nested
thousands of levels deep ends in a bare ``RecursionError``. The check below
walks the file's YAML events (linear in the file, no recursion, nothing
built) and refuses, naming the file, a document whose expansion exceeds
``MAX_YAML_NODES`` nodes or ``MAX_YAML_DEPTH`` levels; the YAML ``_base_``
files it names are checked the same way.
"""
import os.path as osp
from typing import Optional, Set

import yaml

MAX_YAML_NODES = 1_000_000
MAX_YAML_DEPTH = 500
YAML_SUFFIXES = ('.yml', '.yaml')

_SafeLoader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)


class ConfigFileError(ValueError):
    pass


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
            raise ConfigFileError(
                f'{path}: refused: its YAML aliases expand to more than {max_nodes:,} '
                f'nodes (line {event.start_mark.line + 1}); a config this large is '
                'not a config (an alias bomb?)')

    with open(path, 'rb') as f:
        try:
            for event in yaml.parse(f, Loader=_SafeLoader):
                if isinstance(event, yaml.CollectionStartEvent):
                    stack.append([event.anchor, 1])
                    if len(stack) > max_depth:
                        raise ConfigFileError(
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
                raise ConfigFileError(
                    f'{path}: refused: nested more than {max_depth} levels deep '
                    f'(line {mark.line + 1})') from None
            raise ConfigFileError(f'{path}: not valid YAML: {error}') from None
        except UnicodeDecodeError as error:
            raise ConfigFileError(f'{path}: not a text file ({error.reason} at byte offset '
                                  f'{error.start})') from None


def check_config_file(path: str, max_nodes: int = MAX_YAML_NODES,
                      max_depth: int = MAX_YAML_DEPTH,
                      _seen: Optional[Set[str]] = None) -> None:
    """Refuse, naming the file, a YAML config (or a YAML ``_base_`` it names,
    relative to it) whose alias expansion or nesting is out of bounds. Other
    files pass (Python configs are code, run as such by mmengine)."""
    if not path.lower().endswith(YAML_SUFFIXES) or not osp.isfile(path):
        return
    seen = set() if _seen is None else _seen
    real = osp.realpath(path)
    if real in seen:
        return
    seen.add(real)
    _scan_yaml(path, max_nodes, max_depth)
    with open(path, 'rb') as f:  # within bounds now: cheap to build
        try:
            content = yaml.load(f, Loader=_SafeLoader)
        except yaml.YAMLError:
            return  # a tag of mmengine's full loader: mmengine reads it
    bases = content.get('_base_') if isinstance(content, dict) else None
    if isinstance(bases, str):
        bases = [bases]
    for base in bases if isinstance(bases, list) else []:
        if isinstance(base, str) and '::' not in base:
            check_config_file(osp.join(osp.dirname(path), base), max_nodes, max_depth,
                              seen)
