"""What ``tools/train.py`` and ``tools/test.py`` share (a module of the tools, not
of the package): the config read, the checks that fail in seconds with the
culprit named (:func:`check_config`), the Runner built after them."""
import argparse
import difflib
import json
import mmap
import os
import os.path as osp
import re
import warnings
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

# setuptools 80.9 warns (a UserWarning, so it shows) each time mmengine and
# mmcv import its pkg_resources, which they still use: two lines before every
# run, about code that is not ours
warnings.filterwarnings('ignore', message='pkg_resources is deprecated', category=UserWarning)

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.logging import print_log  # noqa: E402
from mmengine.runner import find_latest_checkpoint  # noqa: E402

from moppa_mm.utils.config_files import read_config  # noqa: E402
from moppa_mm.utils.params import few  # noqa: E402
from moppa_mm.utils.errors import (InputNotFoundError, InputValueError,  # noqa: E402
                                   MoPPAInputError, show_traceback, stop)

SPLITS = {
    'train': ('train_dataloader', 'val_dataloader'),
    'test': ('test_dataloader', ),
}


def _dicts(node, where: str) -> Iterator[Tuple[str, dict]]:
    """``(config key, dict)`` of ``node`` and of every dict nested in it."""
    if isinstance(node, dict):
        yield where, node
        children = [(f'{where}.{key}' if where else key, value) for key, value in node.items()]
    elif isinstance(node, (list, tuple)):
        children = [(f'{where}[{i}]', value) for i, value in enumerate(node)]
    else:
        return
    for key, value in children:
        yield from _dicts(value, key)


def _dataset_method(type_name, name: str):
    """The static method ``name`` of a registered dataset class, if it has one
    (datasets that know their own inputs: ``preflight(cfg)`` checks task names
    and split files, ``num_classes(cfg)`` tells the class count)."""
    from mmdet.registry import DATASETS as MMDET_DATASETS
    from mmpretrain.registry import DATASETS as MMPRETRAIN_DATASETS
    return getattr(_registered((MMPRETRAIN_DATASETS, MMDET_DATASETS), type_name), name, None)


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
        raise InputValueError(
            f'model.head.num_classes = {head_classes}, but {where} has {classes} '
            'classes: set model.head.num_classes to the number of classes')


# the heads whose num_classes mmdet and mmseg need equal to the data set's class
# count: a smaller head fails in training (the losses index it with the label:
# a bare IndexError), a larger one in evaluation (CocoMetric maps each predicted
# label to a category) or not at all (mmseg counts the extra class as wrong)
CLASS_HEAD_KEYS = ('bbox_head', 'mask_head', 'decode_head', 'auxiliary_head')


def _class_heads(model) -> Iterator[Tuple[str, int]]:
    """``(config key, num_classes)`` of every class-specific bbox, mask, decode
    and auxiliary head (every stage of a cascade's lists)."""
    for where, node in _dicts(model, 'model'):
        for key, value in node.items():
            if key not in CLASS_HEAD_KEYS:
                continue
            listed = isinstance(value, (list, tuple))
            for i, head in enumerate(value if listed else [value]):
                if isinstance(head, dict) and isinstance(head.get('num_classes'), int) \
                        and not head.get('class_agnostic', False):
                    yield f'{where}.{key}' + (f'[{i}]' if listed else ''), head['num_classes']


def _detection_or_seg_dataset_class(type_name) -> Optional[type]:
    """The mmdet or mmseg data set class a dataset config builds, if it is one."""
    from mmdet.datasets import BaseDetDataset
    from mmdet.registry import DATASETS as MMDET_DATASETS
    registries, bases = [MMDET_DATASETS], [BaseDetDataset]
    try:
        from mmseg.datasets import BaseSegDataset
        from mmseg.registry import DATASETS as MMSEG_DATASETS
        registries.append(MMSEG_DATASETS)
        bases.append(BaseSegDataset)
    except ImportError:  # the seg extra is not installed
        pass
    cls = _registered(registries, type_name)
    return cls if isinstance(cls, type) and issubclass(cls, tuple(bases)) else None


# a COCO file's category list: its key (not inside a string, where a quote is
# escaped), then the list, parsed by ``json``
_CATEGORIES_KEY = b'"categories"'
_THEN_A_LIST = re.compile(rb'\s*:\s*(?=\[)')


def _is_category_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict) and 'id' in c and isinstance(c.get('name'), str)
        for c in value)


def _json_value_at(data: mmap.mmap, start: int):
    """The JSON value that starts at byte ``start`` of ``data``, parsed from a
    window that grows until the value fits (None if it never does)."""
    decoder = json.JSONDecoder()
    window = 1 << 16
    while True:
        text = data[start:start + window].decode('utf-8', errors='replace')
        try:
            return decoder.raw_decode(text)[0]
        except json.JSONDecodeError:
            if start + window >= len(data):
                return None
            window *= 8


def read_coco_categories(ann_file: str) -> Optional[List[dict]]:
    """The ``categories`` of a COCO annotation file, without parsing the rest
    (COCO's train2017 file is 450 MB; the data set parses it once, when built):
    the mapped file is searched from its end (where COCO files keep the list)
    for the key, the list parsed by ``json`` alone. None where no such list of
    ``{"id", "name", ...}`` parses: the data set's own loader names the fault."""
    with open(ann_file, 'rb') as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = len(data)
            while True:  # the last key that holds such a list, as json.load keeps
                key = data.rfind(_CATEGORIES_KEY, 0, end)
                if key < 0:
                    return None
                end = key
                then = _THEN_A_LIST.match(data, key + len(_CATEGORIES_KEY))
                if then is None or (key > 0 and data[key - 1:key] == b'\\'):
                    continue
                value = _json_value_at(data, then.end())
                if _is_category_list(value):
                    return value


def _check_coco_categories(where: str, classes: Sequence[str], source: str,
                           ann_file: str) -> None:
    """mmdet keeps the annotations of the file's categories whose names are in
    ``classes`` and numbers them in the file's order (its documented way to
    train on a subset). A name the file lacks, or another order, is no subset:
    the names and labels no longer match (and evaluation maps a label to a
    category that is not there)."""
    categories = read_coco_categories(ann_file)
    if categories is None:
        return  # the data set's loader names what is wrong with the file
    names = [c['name'] for c in categories]
    numbered = [name for name in names if name in classes]  # mmdet's labels, in order
    if numbered == list(classes):
        left_out = [name for name in names if name not in classes]
        if left_out:
            print_log(f'{where}: the classes are {len(classes)} of the '
                      f'{len(names)} categories of {ann_file}; mmdet leaves out '
                      f'the annotations of the others: {", ".join(left_out)}',
                      logger='current')
        return
    lacking = [c for c in classes if c not in names]
    listed_twice = sorted({c for c in classes if list(classes).count(c) > 1})
    twice = sorted({n for n in numbered if numbered.count(n) > 1})
    if lacking:
        problem = (f'name {few(map(repr, lacking), 5)}, which the file does not '
                   'define: mmdet would find no annotation of it, and evaluation '
                   'would fail on its label')
    elif listed_twice:
        problem = f'name {few(map(repr, listed_twice), 5)} twice'
    elif twice:
        problem = (f'name {few(map(repr, twice), 5)}, which the file defines '
                   'more than once: mmdet would give each of those categories a '
                   'label of its own')
    else:
        problem = ('are in another order than the file\'s: mmdet numbers the '
                   "labels in the file's order, so names and labels would not match; "
                   'list them in the file\'s order')
    raise InputValueError(f'{where}: the classes ({few(map(repr, classes), 10)}) ({source}) '
                          f'{problem}. {ann_file} defines the categories '
                          f'{few(map(repr, names), 10)}.')


def _local_coco_file(cls: type, ds) -> Optional[str]:
    """The local annotation file of a COCO-format data set config, if any."""
    from mmdet.datasets import CocoDataset
    root = ds.get('data_root', '') or ''
    ann_file = ds.get('ann_file')
    if not issubclass(cls, CocoDataset) or not ann_file or _is_remote(root) \
            or _is_remote(ann_file):
        return None
    path = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
    return path if osp.isfile(path) else None


def _check_class_heads(cfg, where: str, ds) -> None:
    """Every bbox, mask, decode and auxiliary head has as many classes as the
    data set, whose classes come from its ``metainfo``, else the data set
    class's ``METAINFO``, else (COCO format) the file's categories; for COCO
    files, the classes must be categories of the file, in its order."""
    cls = _detection_or_seg_dataset_class(ds.get('type'))
    if cls is None:
        return
    coco_file = _local_coco_file(cls, ds)
    classes = (ds.get('metainfo') or {}).get('classes')
    source = f'{where}.metainfo.classes'
    if classes is None and cls.METAINFO.get('classes') is not None:
        classes = cls.METAINFO['classes']
        source = f'{cls.__name__}.METAINFO, as {where} sets no metainfo'
    if classes is None and coco_file is not None:
        classes = [c['name'] for c in read_coco_categories(coco_file) or []] or None
        source = f'the categories of {coco_file}'
    if classes is None:
        return
    classes = tuple(classes)
    wrong = [(key, n) for key, n in _class_heads(cfg.get('model') or {})
             if n != len(classes)]
    if wrong:
        heads = ', '.join(f'{key}.num_classes = {n}' for key, n in wrong)
        raise InputValueError(
            f'{heads}, but {where} has {len(classes)} classes '
            f'({few(map(repr, classes), 10)}; {source}): each of those heads must predict exactly '
            'the data set\'s classes (a label beyond a head fails in training, a '
            'predicted label beyond the data set in evaluation). Set those '
            f'num_classes to {len(classes)}, or the data set\'s '
            'metainfo=dict(classes=...) to the classes the heads predict.')
    if coco_file is not None:
        _check_coco_categories(where, classes, source, coco_file)


def _registered(registries, type_name) -> Optional[type]:
    """The class ``type_name`` names in the first of ``registries`` that has it
    (mmdet's and mmpretrain's MoPPA Swin share a name and their switches)."""
    if not isinstance(type_name, str):
        return type_name if isinstance(type_name, type) else None
    for registry in registries:
        cls = registry.get(type_name)
        if cls is not None:
            return cls
    return None


def _is_moppa(node) -> bool:
    """Whether a config dict builds a MoPPA backbone (in any package's registry)."""
    from mmengine.registry import MODELS

    from moppa_mm.models.backbones.adapter_mixin import AdapterMixin
    cls = _registered([MODELS, *MODELS.children.values()], node.get('type'))
    return isinstance(cls, type) and issubclass(cls, AdapterMixin)


def _check_adapter_checkpoint_fits(cfg, where: str, path: str, checkpoint) -> None:
    """A MoPPA adapter checkpoint (it holds an adapter record) given to a model
    without a MoPPA backbone would leave that backbone random: the adapter-only
    file lacks it, and a plain backbone does not know where to take it from."""
    from moppa_mm.models.backbones.adapter_params import RECORD_KEY
    from moppa_mm.models.backbones.adapter_record import decode_record
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    records = [key for key, value in state.items()
               if key.endswith(RECORD_KEY) and decode_record(value) is not None]
    if records and not any(_is_moppa(node) for _, node in _dicts(cfg.get('model') or {}, '')):
        backbone = decode_record(state[records[0]]).get('backbone')
        raise InputValueError(
            f'the checkpoint {where} = {path!r} is a MoPPA adapter checkpoint (of a '
            f'{backbone}, {records[0]!r}), but the config\'s model has no MoPPA '
            'backbone: its backbone would run on random weights. Use the config it '
            f'was trained with, or set model.backbone.type={backbone!r}.')


def _check_amp_device(cfg) -> None:
    """mmengine's ``AmpOptimWrapper`` (``--amp`` sets it) asserts a GPU (or an
    NPU, MLU or MUSA device) when the Runner builds it, after the model and
    the data: without one, a traceback ending in an ``AssertionError``."""
    from mmengine.device import (is_cuda_available, is_mlu_available, is_musa_available,
                                 is_npu_available)
    from mmengine.optim import AmpOptimWrapper
    from mmengine.registry import OPTIM_WRAPPERS
    wrapper = cfg.get('optim_wrapper') or {}
    type_name = wrapper.get('type') if hasattr(wrapper, 'get') else None
    cls = OPTIM_WRAPPERS.get(type_name) if isinstance(type_name, str) else type_name
    if not (isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)) or any(
            available() for available in (is_cuda_available, is_npu_available,
                                          is_mlu_available, is_musa_available)):
        return
    raise InputValueError(
        f'optim_wrapper.type = {type_name!r} (--amp, --cfg-options or the config): '
        "mmengine's AmpOptimWrapper trains only on a GPU (or an NPU, MLU or MUSA "
        'device), and this machine has none. On CPU train in float32 without it: drop '
        '--amp and the --cfg-options optim_wrapper.type / dtype / loss_scale; for mixed '
        "precision on CPU, use torch.autocast('cpu', dtype=torch.bfloat16) in a plain "
        'PyTorch training loop.')


def _is_remote(path: str) -> bool:
    return '://' in str(path)


def _check_work_dir(work_dir: str) -> None:
    """A work dir (or a folder above it) that is a file: mmengine's
    ``os.makedirs`` fails with a traceback."""
    path = osp.abspath(work_dir)
    while not osp.exists(path):
        path = osp.dirname(path)
    if not osp.isdir(path):
        raise InputValueError(f'work_dir = {work_dir!r} (--work-dir): {path!r} is a file, '
                              'not a folder; pass a folder for the logs and checkpoints')


def _pretrained_checkpoints(model) -> Iterator[Tuple[str, str, Optional[str], Optional[str]]]:
    """``(config key, path, prefix, type)`` of every ``Pretrained`` init_cfg but a
    MoPPA backbone's, which it reads and checks when built (the file read once):
    of that one, only a missing file stops here (the backbone would warn)."""
    for where, node in _dicts(model, 'model'):
        init_cfg = node.get('init_cfg')
        read_when_built = isinstance(init_cfg, dict) and _is_moppa(node)
        for item in init_cfg if isinstance(init_cfg, list) else [init_cfg]:
            if isinstance(item, dict) and item.get('type') == 'Pretrained' \
                    and item.get('checkpoint'):
                key, path = f'{where}.init_cfg.checkpoint', item['checkpoint']
                if not read_when_built:
                    yield key, path, item.get('prefix'), node.get('type')
                elif not _is_remote(path) and not osp.isfile(osp.expanduser(path)):
                    raise InputNotFoundError(f'checkpoint {key} = {path!r} not found')


def _datasets(cfg, mode: str) -> Iterator[Tuple[str, dict]]:
    """``(config key, dataset config)`` of every data set ``mode`` reads."""
    for loader_key in SPLITS[mode]:
        loader = cfg.get(loader_key)
        if loader and (loader_key != 'val_dataloader' or cfg.get('val_cfg') is not None):
            # (val_cfg=None: no validation; dict() is mmengine's default ValLoop)
            yield from _unwrapped(loader.get('dataset', {}), loader_key + '.dataset')


def _unwrapped(ds, where: str) -> Iterator[Tuple[str, dict]]:
    """The data sets inside wrappers (RepeatDataset, ConcatDataset), which hold
    dataset configs; a plain data set may have a ``dataset`` argument of its
    own (FGVC's ``dataset='cub'``)."""
    inner, inners = ds.get('dataset'), ds.get('datasets')
    if isinstance(inner, dict):
        yield from _unwrapped(inner, where + '.dataset')
    for i, each in enumerate(inners if isinstance(inners, (list, tuple)) else []):
        yield from _unwrapped(each, f'{where}.datasets[{i}]')
    if not isinstance(inner, dict) and not isinstance(inners, (list, tuple)):
        yield where, ds


def _evaluator_ann_files(cfg, mode: str) -> Iterator[Tuple[str, str]]:
    """The ``ann_file`` of each evaluator (CocoMetric reads its own copy)."""
    if mode == 'train' and (not cfg.get('val_dataloader') or cfg.get('val_cfg') is None):
        return
    key = 'val_evaluator' if mode == 'train' else 'test_evaluator'
    for where, evaluator in _dicts(cfg.get(key), key):
        if evaluator.get('ann_file'):
            yield f'{where}.ann_file', evaluator['ann_file']


def _load_from_name(cfg, mode: str) -> str:
    """How the user gave ``load_from``: the tools set it from their arguments
    (``--resume CKPT``: ``resume=True`` and ``load_from``; test.py's CHECKPOINT)."""
    if mode == 'test':
        return 'to test (CHECKPOINT argument, load_from)'
    if cfg.get('resume'):
        return 'to resume from (--resume, load_from)'
    return 'load_from'


def check_config(cfg, mode: str = 'train') -> None:
    """Raise one of our errors (:class:`MoPPAInputError`) naming the first bad
    local input of ``mode`` ('train' or 'test'), the list in docs/checks.md
    (remote paths, URLs, are left to the loaders)."""
    if mode not in SPLITS:
        raise InputValueError(f'mode must be one of {tuple(SPLITS)}, got {mode!r}')
    _check_our_type_names(cfg)
    model = cfg.get('model') or {}
    if (model.get('head') or {}).get('type') == 'DeiTClsHead' and \
            _is_moppa(model.get('backbone') or {}):  # else: a raw unpacking error at step 1
        raise InputValueError(
            "model.head.type = 'DeiTClsHead' reads the distillation token of mmpretrain's "
            'DistilledVisionTransformer, which MoPPA does not stand in for: keep '
            "model.backbone.type='DistilledVisionTransformer', or give the MoPPA backbone a "
            "head of one token (type='VisionTransformerClsHead')")
    if mode == 'train':
        _check_amp_device(cfg)
    if cfg.get('work_dir') and not _is_remote(cfg.work_dir):
        _check_work_dir(cfg.work_dir)
    from moppa_mm.utils.checkpoints import load_checkpoint_file
    from moppa_mm.utils.release_formats import check_converted
    checkpoints = list(_pretrained_checkpoints(cfg.get('model', {})))
    if cfg.get('load_from'):
        checkpoints.append((_load_from_name(cfg, mode), cfg.load_from, None, None))
    elif mode == 'train' and cfg.get('resume') and cfg.get('work_dir') \
            and not _is_remote(cfg.work_dir):
        # what last_checkpoint names (where it names nothing whole,
        # AtomicCheckpointHook chooses when the run starts)
        latest = find_latest_checkpoint(cfg.work_dir)
        if latest and osp.isfile(latest):
            checkpoints.append(('to resume from (--resume: the latest in work_dir)',
                                latest, None, None))
    for where, path, prefix, type_name in checkpoints:
        if _is_remote(path):
            continue
        # missing, empty, truncated, unsafe, or NaN / infinite values
        checkpoint = load_checkpoint_file(path, what=f'checkpoint {where} =', mmap=True)
        if prefix:  # a release not converted to the prefixed keys
            check_converted(path, checkpoint, prefix, where, backbone=type_name)
        else:
            _check_adapter_checkpoint_fits(cfg, where, path, checkpoint)
    for where, ds in _datasets(cfg, mode):
        preflight = _dataset_method(ds.get('type'), 'preflight')
        if preflight is not None:
            preflight(ds)
            _check_head_classes(cfg, where, ds)
            continue
        root = ds.get('data_root', '') or ''
        if root and not _is_remote(root) and not osp.isdir(root):
            raise InputNotFoundError(
                f'data root not found: {where}.data_root = {root!r}')
        ann_file = ds.get('ann_file')
        if ann_file and not _is_remote(root):
            path = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
            if not osp.isfile(path):
                raise InputNotFoundError(
                    f'annotation file not found: {where}.ann_file = {path!r}')
        _check_class_heads(cfg, where, ds)
    for where, path in _evaluator_ann_files(cfg, mode):
        if not _is_remote(path) and not osp.isfile(path):
            raise InputNotFoundError(f'annotation file not found: {where} = {path!r}')


def _check_our_type_names(cfg) -> None:
    """A type that no registry knows, within a typo of one of moppa_mm's
    (``MoPPASwinTransfomer``): mmengine would stop deep in the build with a
    ``KeyError`` naming neither the key nor the name meant."""
    from mmengine import registry as mmengine_registry
    roots = [value for value in vars(mmengine_registry).values()
             if isinstance(value, mmengine_registry.Registry)]
    registries = roots + [child for root in roots for child in root.children.values()]
    ours = sorted({name for registry in registries for name, cls in registry.module_dict.items()
                   if getattr(cls, '__module__', '').startswith('moppa_mm')})
    for where, node in _dicts(cfg.to_dict(), ''):
        name = node.get('type')
        if not isinstance(name, str) or name in ours or '.' in name:  # scope.Name: mmengine's
            continue
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.9)  # not upstream names
        if close and all(name not in registry.module_dict for registry in registries):
            raise InputValueError(f'{where}.type = {name!r} is not a registered type: did '
                                  f'you mean {close[0]!r}?')


def load_config(path: str, launcher: str = 'none', cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None, format_python_code: bool = True) -> Config:
    """The config at ``path`` with the command line's options, as mmdet's
    tools read it (``work_dir``: the argument, the config's, else
    ``work_dirs/<config name>``); ``format_python_code=False``: no yapf when
    the Runner logs and dumps it (seconds per dump of a detection config)."""
    if not osp.isfile(path):
        raise InputNotFoundError(f'config file not found: {path!r}')
    cfg = read_config(path)
    if not format_python_code:  # fromfile drops this argument (mmengine 0.10)
        cfg = Config(cfg.to_dict(), cfg_text=cfg.text, filename=cfg.filename,
                     format_python_code=False)
    cfg.launcher = launcher
    for key in cfg_options or {}:  # mmengine adds a misspelt key, and nothing reads it
        close = difflib.get_close_matches(key.split('.')[0], list(cfg), n=1, cutoff=0.9)
        if key.split('.')[0] not in cfg and close:
            raise InputValueError(f'--cfg-options {key}: the config has no key '
                                  f"{key.split('.')[0]!r}: did you mean {close[0]!r}?")
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def mmpretrain_loader_defaults(cfg, loaders: Sequence[str], defaults: dict,
                               overrides: dict) -> None:
    """What mmpretrain's own tools do to its configs' data loaders (which are
    written for them): ``defaults`` where the config sets none, then the
    command line's ``overrides``."""
    if cfg.get('default_scope') == 'mmpretrain':
        for name in loaders:
            if cfg.get(name) is not None:
                cfg[name] = {**defaults, **cfg[name], **overrides}


def parse_tool_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Add the options both tools share with mmdet's, parse ``argv``, set ``LOCAL_RANK``."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values: key=value ...')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_runner(cfg, mode: str):
    """Check the final config (:func:`check_config`), set up distributed runs
    without CUDA (``cpu_distributed``) and the allocator of CPU runs, then
    build the Runner as mmdet's tools do (``runner_type`` or ``Runner``)."""
    import torch
    from cpu_distributed import setup_distributed
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from moppa_mm.utils.malloc import keep_freed_memory
    check_config(cfg, mode=mode)
    setup_distributed(cfg, cfg.get('launcher', 'none'))
    if not torch.cuda.is_available():
        keep_freed_memory()
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)


def run_main(main: Callable[[], None], tool: str) -> None:
    """Run a tool's ``main``: one of our verdicts on the input
    (:class:`MoPPAInputError`) stops the process (each rank) with ``<tool>:
    <message>`` on stderr and exit status 1, without a traceback
    (``MOPPA_TRACEBACK=1`` shows it); the process group is closed at the end."""
    from cpu_distributed import shutdown_distributed
    try:
        main()
    except MoPPAInputError as error:
        if show_traceback():
            raise
        stop(tool, error)
    shutdown_distributed()
