"""Export a MoPPA model to ONNX (MMPretrain 0.x's ``tools/deployment`` convention):
an MMPretrain classifier's logits, or an MMDetection model's MoPPA Swin
backbone features, with the adapters merged (``--no-merge``: as they are) and
the batch as a dynamic axis. ``--verify`` compares onnxruntime with PyTorch.
The graph is written as the checkpoints are (a temporary file, renamed once
every check passed); docs/deploy.md says what is exported and what is refused.

    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT --output-file F.onnx --verify
        [--shape H W] [--opset 18] [--exporter {dynamo,torchscript}] [--no-merge]

Needs the ``deploy`` extra (onnx, onnxscript, onnxruntime): ``pip install -e .[deploy]``.
"""
import argparse
import copy
import importlib.util
import os.path as osp
import sys
from typing import List, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import DictAction
from torch.onnx import _constants as torch_onnx_limits

import moppa_mm  # registries
from moppa_mm.utils.atomic import atomic_path
from moppa_mm.utils.checkpoints import load_checkpoint_file
from moppa_mm.utils.errors import MoPPAInputError

# tools/, appended: tools/test.py must not shadow the standard `test`
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
from preflight import _check_adapter_checkpoint_fits, load_config  # noqa: E402

EXPORTERS = ('dynamo', 'torchscript')
DEFAULT_OPSET = 18  # the dynamo exporter's own; the TorchScript one supports it too
TOLERANCE = 1e-4  # max absolute difference between onnxruntime and PyTorch
EXPORT_BATCH = 2  # torch.export specialises a dimension of size 1
VERIFY_BATCHES = (1, 3)
DETECTOR_SHAPE = (800, 1333)  # mmdet's test scale, (H, W)
CLASSIFIER_SHAPE = (224, 224)  # when the backbone names no img_size


class ExportError(RuntimeError):
    """An export the tool refuses or a graph that does not match PyTorch."""


def lowest_opset(exporter: str, backbone_type: str) -> int:
    """The lowest opset ``exporter`` writes for the backbone (docs/deploy.md:
    the dynamo exporter's version conversion, the ViT's attention, the Swin's
    window padding)."""
    if exporter == 'dynamo':
        return 18
    return 11 if 'Swin' in backbone_type else 14


def check_arguments(args, cfg) -> None:
    """Refuse a bad ``--shape``, ``--atol`` or ``--opset`` before the model is built."""
    if args.shape is not None and min(args.shape) < 1:
        raise ExportError(f'--shape {args.shape[0]} {args.shape[1]}: the height and width '
                          'must be positive')
    backbone = str(cfg.model.get('backbone', {}).get('type', ''))
    if not args.atol >= 0:  # NaN too
        raise ExportError(f'--atol {args.atol:g}: the tolerance must be zero or positive')
    lowest = lowest_opset(args.exporter, backbone)  # the installed torch's highest:
    highest = torch_onnx_limits.ONNX_MAX_OPSET if args.exporter == 'dynamo' else \
        torch_onnx_limits.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    if not lowest <= args.opset <= highest:
        raise ExportError(f'--opset {args.opset}: the {args.exporter} exporter writes opsets '
                          f'{lowest} to {highest} for a {backbone} (torch {torch.__version__})')


def check_shape(module: nn.Module, shape: Sequence[int]) -> None:
    """Run ``module`` once on a (1, 3, H, W) batch: what the model refuses (a merged
    unit on another grid) is named here rather than inside an exporter."""
    try:
        with torch.no_grad():
            module(torch.zeros(1, 3, *shape))
    except (RuntimeError, ValueError, AssertionError) as error:
        raise ExportError(f'--shape {shape[0]} {shape[1]}: the model refuses a (batch, 3, '
                          f'{shape[0]}, {shape[1]}) input: {first_line(error)}') from None


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f'{type(error).__name__}: {lines[0] if lines else ""}'


def written_opset(output_file: str) -> int:
    """The default-domain opset of the ONNX file (its ``opset_import``)."""
    import onnx
    model = onnx.load(output_file, load_external_data=False)
    return next(entry.version for entry in model.opset_import
                if entry.domain in ('', 'ai.onnx'))


def check_installed(exporter: str, verify: bool) -> None:
    """Name the missing packages of the ``deploy`` extra before any work."""
    needed = ['onnx'] + (['onnxscript'] if exporter == 'dynamo' else []) + \
        (['onnxruntime'] if verify else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f'{", ".join(missing)} not installed (needed by the {exporter} '
                          f'exporter{" and --verify" if verify else ""}): '
                          'pip install -e .[deploy]')


class ClassifierLogits(nn.Module):
    """An mmpretrain classifier's logits for a batch of preprocessed images."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(images, mode='tensor')  # (B, 3, H, W) -> (B, classes)


class BackboneFeatures(nn.Module):
    """A detector's backbone: its multi-scale features as a tuple."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.backbone(images))  # (B, C_i, H / s_i, W / s_i) each


def build_model(cfg) -> nn.Module:
    """The config's model, built in its scope (MMPretrain or MMDetection)."""
    from mmengine.registry import MODELS, init_default_scope
    scope = cfg.get('default_scope')
    if scope not in ('mmpretrain', 'mmdet'):
        raise ExportError(f"default_scope={scope!r}: exports an mmpretrain classifier or an "
                          "mmdet detector's backbone")
    init_default_scope(scope)
    return MODELS.build(copy.deepcopy(cfg.model))


def load_model(cfg, checkpoint: str) -> nn.Module:
    """The config's model with the checkpoint loaded strictly, in eval mode."""
    from mmengine.runner.checkpoint import _load_checkpoint_to_model
    state = load_checkpoint_file(checkpoint, what='checkpoint', mmap=True)
    _check_adapter_checkpoint_fits(cfg, 'CHECKPOINT', checkpoint, state)
    model = build_model(cfg)
    _load_checkpoint_to_model(model, state, strict=True)
    return model.eval()


def export_module(model: nn.Module, cfg) -> Tuple[nn.Module, List[str]]:
    """What is exported of ``model`` and its output names."""
    if cfg.default_scope == 'mmpretrain':
        return ClassifierLogits(model).eval(), ['logits']
    features = BackboneFeatures(model.backbone).eval()
    return features, [f'feat{i}' for i in range(len(model.backbone.out_indices))]


def default_shape(cfg) -> Tuple[int, int]:
    """(H, W): a classifier's backbone ``img_size``, a detector's test scale."""
    if cfg.default_scope == 'mmdet':
        return DETECTOR_SHAPE
    size = cfg.model.get('backbone', {}).get('img_size')
    if size is None:
        return CLASSIFIER_SHAPE
    return (size, size) if isinstance(size, int) else tuple(size)


def merge(model: nn.Module) -> nn.Module:
    """:func:`moppa_mm.merge_adapters`, or why it cannot."""
    try:
        return moppa_mm.merge_adapters(model)
    except ValueError as error:
        raise ExportError(f'{error}; export the adapters unmerged with --no-merge') from None


def export_onnx(module: nn.Module, output_file: str, shape: Sequence[int],
                output_names: Sequence[str], exporter: str = 'dynamo',
                opset: int = DEFAULT_OPSET) -> None:
    """Export ``module`` (one image batch in, a tensor or tuple out) to
    ``output_file`` with the batch as a dynamic axis, under ``no_grad``."""
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}, expected one of {EXPORTERS}')
    module.eval()  # all of it: the TorchScript exporter restores the top module's mode
    images = torch.randn(EXPORT_BATCH, 3, *shape)
    names = dict(input_names=['input'], output_names=list(output_names),
                 opset_version=opset)
    with torch.no_grad():
        if exporter == 'dynamo':
            program = torch.onnx.export(
                module, (images, ), dynamo=True,
                dynamic_shapes=({0: torch.export.Dim('batch')}, ), **names)
            program.save(output_file)  # weights in a side file only past 2 GB
        else:
            axes = {name: {0: 'batch'} for name in ['input', *output_names]}
            torch.onnx.export(module, (images, ), output_file, dynamo=False,
                              dynamic_axes=axes, **names)
    import onnx
    onnx.checker.check_model(output_file)


def verify_onnx(output_file: str, reference: nn.Module, shape: Sequence[int],
                batches: Sequence[int] = VERIFY_BATCHES, seed: int = 0) -> float:
    """The max absolute difference between onnxruntime (CPU) running
    ``output_file`` and ``reference`` (in eval mode) on random images, over
    ``batches``."""
    import onnxruntime
    reference.eval()
    try:
        session = onnxruntime.InferenceSession(output_file,
                                               providers=['CPUExecutionProvider'])
    except Exception as error:  # onnxruntime's own exception types
        raise ExportError(f'onnxruntime cannot load the graph ({first_line(error)})') from None
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for batch in batches:
        images = torch.randn(batch, 3, *shape, generator=generator)
        try:
            outputs = session.run(None, {'input': images.numpy()})
        except Exception as error:
            raise ExportError(f'onnxruntime fails on a batch of {batch} '
                              f'({first_line(error)})') from None
        with torch.no_grad():
            expected = reference(images)
        expected = expected if isinstance(expected, (tuple, list)) else (expected, )
        if len(outputs) != len(expected):
            raise ExportError(f'the graph gives {len(outputs)} outputs, PyTorch '
                              f'{len(expected)}')
        for got, want in zip(outputs, expected):
            if tuple(got.shape) != tuple(want.shape):
                raise ExportError(f'the graph gives an output of shape {tuple(got.shape)} '
                                  f'at batch {batch}, PyTorch {tuple(want.shape)}')
            worst = max(worst, float((torch.from_numpy(got) - want).abs().max()))
    return worst


def describe_preprocessor(cfg) -> str:
    preprocessor = cfg.model.get('data_preprocessor') or cfg.get('data_preprocessor') or {}
    mean, std = preprocessor.get('mean'), preprocessor.get('std')
    rgb = preprocessor.get('to_rgb', preprocessor.get('bgr_to_rgb'))
    return f'mean={mean}, std={std}, to_rgb={rgb}'


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint', help='full, adapter-only or merged checkpoint')
    parser.add_argument('--output-file', default='tmp.onnx')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input height and width (default: the backbone\'s '
                        f'img_size for classifiers, {DETECTOR_SHAPE} for detectors)')
    parser.add_argument('--opset', type=int, default=DEFAULT_OPSET)
    parser.add_argument('--exporter', choices=EXPORTERS, default='dynamo',
                        help='torch.onnx.export(dynamo=True), the default, or the '
                        'older TorchScript tracer (dynamo=False)')
    parser.add_argument('--no-merge', action='store_true',
                        help='export the adapters unmerged (merge_adapters folds them '
                        'into the weights by default)')
    parser.add_argument('--verify', action='store_true',
                        help='compare onnxruntime with PyTorch at batch sizes '
                        f'{VERIFY_BATCHES} (the export runs at {EXPORT_BATCH})')
    parser.add_argument('--atol', type=float, default=TOLERANCE,
                        help='--verify\'s bound on the max absolute difference')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, as tools/train.py and test.py do '
                        '(e.g. model.backbone.init_cfg.checkpoint=BASE.pth)')
    args = parser.parse_args(argv)
    try:
        run(args)
    except (ExportError, MoPPAInputError, OSError, ValueError) as error:
        sys.exit(f'pytorch2onnx.py: {error}')


def run(args) -> None:
    """Export; read the opset back; with ``--verify``, compare with PyTorch. The
    graph is written as the checkpoints are: a killed or failed export, or a
    graph that fails a check, leaves no file."""
    cfg = load_config(args.config, cfg_options=args.cfg_options)
    check_arguments(args, cfg)
    check_installed(args.exporter, args.verify)
    model = load_model(cfg, args.checkpoint)
    reference = export_module(copy.deepcopy(model), cfg)[0] if args.verify else None
    if not args.no_merge:
        merge(model)
    module, output_names = export_module(model, cfg)
    shape = tuple(args.shape) if args.shape else default_shape(cfg)
    check_shape(module, shape)
    difference = None
    try:
        with atomic_path(args.output_file, what='ONNX graph') as partial:
            export_onnx(module, partial, shape, output_names, args.exporter, args.opset)
            opset = written_opset(partial)
            if opset != args.opset:
                raise ExportError(f'--opset {args.opset} asked, the {args.exporter} exporter '
                                  f'wrote opset {opset}')
            if reference is not None:
                difference = verify_onnx(partial, reference, shape)
            if difference is not None and not difference <= args.atol:  # NaN fails too
                other = [e for e in EXPORTERS if e != args.exporter][0]
                raise ExportError(
                    f'onnxruntime and PyTorch differ by up to {difference:.3g} (max absolute '
                    f'difference at batch sizes {VERIFY_BATCHES}), above the tolerance '
                    f'{args.atol:g}: the {args.exporter} exporter gave a wrong graph (try '
                    f'--exporter {other})')
    except Exception as error:
        reason = str(error) if isinstance(error, ExportError) else first_line(error)
        raise ExportError(f'{reason}; nothing written to {args.output_file}') from None
    what = 'logits' if cfg.default_scope == 'mmpretrain' else 'backbone features'
    print(f'{args.output_file}: {what} ({", ".join(output_names)}) of (batch, 3, '
          f'{shape[0]}, {shape[1]}) images, {"unmerged" if args.no_merge else "merged"} '
          f'adapters, {args.exporter} exporter, opset {opset} (read from the file); '
          f'inputs as the data preprocessor gives them ({describe_preprocessor(cfg)})')
    if difference is not None:
        print(f'verified: onnxruntime (CPU) matches PyTorch at batch sizes {VERIFY_BATCHES}, '
              f'max absolute difference {difference:.2e} (tolerance {args.atol:g})')


if __name__ == '__main__':
    main()
