"""Checks that fail in seconds, with the culprit named, instead of hours in:
what ``tools/train.py`` and ``tools/test.py`` run on the final config before
the Runner is built (:func:`check_config`)."""
import os.path as osp
from typing import Iterator, Optional, Tuple

SPLITS = {
    'train': ('train_dataloader', 'val_dataloader'),
    'test': ('test_dataloader', ),
}


def _dataset_method(type_name, name: str):
    """The static method ``name`` of a registered dataset class, if it has one
    (datasets that know their own inputs: ``preflight(cfg)`` checks task names
    and split files, ``num_classes(cfg)`` tells the class count)."""
    if not isinstance(type_name, str):
        return getattr(type_name, name, None)
    from mmdet.registry import DATASETS as MMDET_DATASETS
    from mmpretrain.registry import DATASETS as MMPRETRAIN_DATASETS
    for registry in (MMPRETRAIN_DATASETS, MMDET_DATASETS):
        cls = registry.get(type_name)
        if cls is not None:
            return getattr(cls, name, None)
    return None


def _check_head_classes(cfg, where: str, ds) -> None:
    """A classification head with fewer outputs than the dataset has classes
    fails at the first batch holding a larger label (an IndexError that names
    no config key): stop here, naming both."""
    count = _dataset_method(ds.get('type'), 'num_classes')
    head = (cfg.get('model') or {}).get('head') or {}
    head_classes = head.get('num_classes') if hasattr(head, 'get') else None
    if count is None or not isinstance(head_classes, int):
        return
    classes = count(ds)
    if head_classes < classes:
        raise ValueError(
            f'model.head.num_classes = {head_classes}, but {where} has {classes} '
            'classes: set model.head.num_classes to the number of classes')


def _is_remote(path: str) -> bool:
    return '://' in str(path)


def _pretrained_checkpoints(node, where: str) -> Iterator[Tuple[str, str, Optional[str]]]:
    """``(config key, path, prefix)`` of every ``Pretrained`` init_cfg."""
    if isinstance(node, dict):
        init_cfg = node.get('init_cfg')
        init_cfgs = init_cfg if isinstance(init_cfg, list) else [init_cfg]
        for item in init_cfgs:
            if isinstance(item, dict) and item.get('type') == 'Pretrained' \
                    and item.get('checkpoint'):
                yield f'{where}.init_cfg.checkpoint', item['checkpoint'], item.get('prefix')
        for key, value in node.items():
            if key != 'init_cfg':
                yield from _pretrained_checkpoints(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _pretrained_checkpoints(value, f'{where}[{i}]')


def _datasets(cfg, mode: str):
    for loader_key in SPLITS[mode]:
        loader = cfg.get(loader_key)
        if not loader:
            continue
        if loader_key == 'val_dataloader' and cfg.get('val_cfg') is None:
            continue  # no validation; val_cfg=dict() is mmengine's default ValLoop
        dataset = loader.get('dataset', {})
        stack = [(loader_key + '.dataset', dataset)]
        while stack:  # wrappers (RepeatDataset, ConcatDataset) nest datasets
            where, ds = stack.pop()
            # a wrapper holds dataset configs; a plain dataset may have a
            # ``dataset`` argument of its own (FGVC's dataset='cub')
            inner = ds.get('dataset')
            inners = ds.get('datasets')
            if isinstance(inner, dict):
                stack.append((where + '.dataset', inner))
            if isinstance(inners, (list, tuple)):
                for i, each in enumerate(inners):
                    stack.append((f'{where}.datasets[{i}]', each))
            if not isinstance(inner, dict) and not isinstance(inners, (list, tuple)):
                yield where, ds


def _evaluator_ann_files(cfg, mode: str) -> Iterator[Tuple[str, str]]:
    """The ``ann_file`` of each evaluator (CocoMetric reads its own copy)."""
    key = 'val_evaluator' if mode == 'train' else 'test_evaluator'
    if mode == 'train' and (not cfg.get('val_dataloader')
                            or cfg.get('val_cfg') is None):
        return
    evaluators = cfg.get(key) or []
    for i, evaluator in enumerate(
            evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]):
        where = f'{key}[{i}]' if isinstance(evaluators, (list, tuple)) else key
        if isinstance(evaluator, dict) and evaluator.get('ann_file'):
            yield f'{where}.ann_file', evaluator['ann_file']


def _load_from_name(cfg, mode: str) -> str:
    """How the user gave ``load_from``: the tools set it from their arguments
    (``--resume CKPT``: ``resume=True`` and ``load_from``; test.py's CHECKPOINT)."""
    if mode == 'test':
        return 'to test (CHECKPOINT argument, load_from)'
    if cfg.get('resume'):
        return 'to resume from (--resume, load_from)'
    return 'load_from'


def _latest_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint the Runner auto-resumes from (mmengine's
    ``find_latest_checkpoint``: the path in ``<work_dir>/last_checkpoint``)."""
    from mmengine.runner.checkpoint import find_latest_checkpoint
    if _is_remote(work_dir) or not osp.isfile(osp.join(work_dir, 'last_checkpoint')):
        return None
    return find_latest_checkpoint(work_dir)


def check_config(cfg, mode: str = 'train') -> None:
    """Raise ``FileNotFoundError`` (or, for a checkpoint that cannot be loaded
    safely or holds NaN / infinite values, ``CheckpointLoadError``; for a
    release not converted to the ``init_cfg`` prefix, ``SourceFormatError``)
    naming the first bad local input.

    Loads local pre-trained checkpoints (``init_cfg`` of type Pretrained) and
    ``load_from`` (the checkpoint to test or resume from) as every loader will
    (``weights_only=True``, storage mapped), checks that every floating-point
    tensor is finite, and checks each dataset's ``data_root`` and ``ann_file`` (and the
    data-list file of mmpretrain datasets) and the evaluators' ``ann_file``, for
    ``mode`` 'train' or 'test'.
    Remote paths (URLs) are left to the loaders.
    """
    if mode not in SPLITS:
        raise ValueError(f'mode must be one of {tuple(SPLITS)}, got {mode!r}')
    from moppa_mm.models.converters import check_converted
    from moppa_mm.utils.checkpoints import load_checkpoint_file
    checkpoints = list(_pretrained_checkpoints(cfg.get('model', {}), 'model'))
    if cfg.get('load_from'):
        checkpoints.append((_load_from_name(cfg, mode), cfg.load_from, None))
    elif mode == 'train' and cfg.get('resume') and cfg.get('work_dir'):
        latest = _latest_checkpoint(cfg.work_dir)  # what --resume alone resumes
        if latest:
            checkpoints.append(('to resume from (--resume: the latest in work_dir)',
                                latest, None))
    for where, path, prefix in checkpoints:
        if _is_remote(path):
            continue
        # missing, empty, truncated, unsafe, or NaN / infinite values
        checkpoint = load_checkpoint_file(path, what=f'checkpoint {where} =', mmap=True)
        if prefix:  # a release not converted to the prefixed keys
            check_converted(path, checkpoint, prefix, where)
    for where, ds in _datasets(cfg, mode):
        preflight = _dataset_method(ds.get('type'), 'preflight')
        if preflight is not None:
            preflight(ds)
            _check_head_classes(cfg, where, ds)
            continue
        root = ds.get('data_root', '') or ''
        if root and not _is_remote(root) and not osp.isdir(root):
            raise FileNotFoundError(
                f'data root not found: {where}.data_root = {root!r}')
        ann_file = ds.get('ann_file')
        if ann_file and not _is_remote(root):
            path = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
            if not osp.isfile(path):
                raise FileNotFoundError(
                    f'annotation file not found: {where}.ann_file = {path!r}')
    for where, path in _evaluator_ann_files(cfg, mode):
        if not _is_remote(path) and not osp.isfile(path):
            raise FileNotFoundError(f'annotation file not found: {where} = {path!r}')
