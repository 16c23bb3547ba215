"""tools/deployment/pytorch2onnx.py: the MoPPA ViT classifier's logits and the
MoPPA Swin backbone's features through both of torch's ONNX exporters (the
default, through torch.export, and the older TorchScript tracer), merged and
unmerged, give PyTorch's outputs in onnxruntime at batch sizes other than the
export's; the tool refuses what it cannot export and a graph that does not
match."""
import copy
import importlib.util
import os.path as osp
import subprocess

import pytest
import torch
from mmengine.config import Config

from moppa_mm.models import full_state_dict
from moppa_mm.operators import dct
from tests.conftest import DEMO_CONFIG, PYTHON, REPO, child_env
from tests.test_deploy.test_merge import SWIN, build, trained
from tests.test_models.test_adapter_record import classifier_cfg

onnx = pytest.importorskip('onnx', reason='the deploy extra: pip install -e .[deploy]')
onnxruntime = pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

TOOL = osp.join(REPO, 'tools', 'deployment', 'pytorch2onnx.py')
_spec = importlib.util.spec_from_file_location('pytorch2onnx', TOOL)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

TOLERANCE = 1e-4
VIT_SHAPE = (32, 32)
SWIN_SHAPE = (40, 56)  # padded to the 4x4 windows


@pytest.fixture(scope='module')
def vit():
    """A 'fine-tuned' MoPPA ViT classifier's logits (unmerged)."""
    return tool.ClassifierLogits(trained(build(classifier_cfg(), 'mmpretrain'))).eval()


@pytest.fixture(scope='module')
def swin():
    """A 'fine-tuned' mmdet MoPPA Swin backbone's features (unmerged)."""
    return tool.BackboneFeatures(trained(build(SWIN, 'mmdet'))).eval()


def cold_dct_caches():
    """Empty the DCT helpers' caches: the exporter builds the bases itself
    (torch.export once left its fake tensors there, and read them back)."""
    for cache in (dct._BASES, dct._KRON, dct._FREQS):
        cache.clear()


def cached_tensor_types():
    return {type(value).__name__ for cache in (dct._BASES, dct._KRON)
            for value in cache.values()}


@pytest.mark.parametrize('merged', [False, True], ids=['unmerged', 'merged'])
@pytest.mark.parametrize('exporter', tool.EXPORTERS)
@pytest.mark.parametrize('family', ['vit', 'swin'])
def test_both_exporters_give_the_pytorch_outputs(family, exporter, merged, request,
                                                 tmp_path):
    reference = request.getfixturevalue(family)
    if family == 'vit':
        shape, names = VIT_SHAPE, ['logits']
    else:
        shape, names = SWIN_SHAPE, ['feat0', 'feat1']
    module = tool.merge(copy.deepcopy(reference)) if merged else reference
    path = str(tmp_path / f'{family}.onnx')
    cold_dct_caches()
    tool.export_onnx(module, path, shape, names, exporter)
    assert cached_tensor_types() <= {'Tensor'}  # nothing of the capture kept
    graph = onnx.load(path).graph
    assert [i.name for i in graph.input] == ['input']
    assert [o.name for o in graph.output] == names
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a named batch axis
    # batches 1 and 3 (the export's is 2), against the unmerged PyTorch model
    difference = tool.verify_onnx(path, reference, shape)
    print(f'{family} {exporter} {"merged" if merged else "unmerged"}: '
          f'max |onnxruntime - PyTorch| = {difference:.2e}')
    assert difference < TOLERANCE


def test_a_wrong_graph_is_refused(vit, tmp_path, monkeypatch):
    """A forward whose Python control flow reads the batch size (as scale &
    shift's no-grad fold-or-scale choice once did) is traced by the
    TorchScript exporter into a graph that runs and is wrong at other batch
    sizes. ``--verify`` catches it, says so, and deletes the file."""
    from moppa_mm.operators import MoPPAUnit
    forward = MoPPAUnit.forward

    def reads_the_batch(self, tokens, *args):  # the tracer keeps the branch it took
        out = forward(self, tokens, *args)
        return out if int(tokens.shape[0]) == tool.EXPORT_BATCH else 2 * out

    monkeypatch.setattr(MoPPAUnit, 'forward', reads_the_batch)
    config, checkpoint = classifier_files(vit, tmp_path)
    output = str(tmp_path / 'wrong.onnx')
    with pytest.raises(SystemExit, match=r'onnxruntime and PyTorch differ by up to '
                       r'[0-9.e+-]+ .*above the tolerance 0.0001: the torchscript exporter '
                       r'gave a wrong graph \(try --exporter dynamo\); .*wrong.onnx deleted$'):
        tool.main([config, checkpoint, '--output-file', output, '--exporter',
                   'torchscript', '--no-merge', '--verify'])
    assert not osp.exists(output)


def classifier_files(vit, tmp_path):
    """A config file of ``vit``'s classifier and its whole checkpoint."""
    config = str(tmp_path / 'vit.py')
    Config(dict(default_scope='mmpretrain', model=classifier_cfg())).dump(config)
    checkpoint = str(tmp_path / 'vit.pth')
    torch.save({'state_dict': full_state_dict(vit.classifier)}, checkpoint)
    return config, checkpoint


def test_what_the_tool_refuses(vit, tmp_path, monkeypatch):
    config, checkpoint = classifier_files(vit, tmp_path)
    output = ['--output-file', str(tmp_path / 'x.onnx')]
    with pytest.raises(SystemExit, match="config file not found: 'nowhere.py'"):
        tool.main(['nowhere.py', checkpoint, *output])
    with pytest.raises(SystemExit, match="checkpoint 'nowhere.pth' not found"):
        tool.main([config, 'nowhere.pth', *output])
    unsafe = str(tmp_path / 'unsafe.pth')
    torch.save({'state_dict': {}, 'args': tmp_path}, unsafe)  # a pickled Python object
    with pytest.raises(SystemExit, match='loading it could run code'):
        tool.main([config, unsafe, *output])
    with pytest.raises(tool.ExportError, match=r"moppa_scope='global'.*export the "
                       'adapters unmerged with --no-merge'):
        tool.merge(build(dict(SWIN, moppa_scope='global'), 'mmdet'))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(tool.importlib.util, 'find_spec',
                        lambda name: None if name == 'onnxruntime' else real_find_spec(name))
    with pytest.raises(tool.ExportError, match=r'onnxruntime not installed \(needed by the '
                       r'dynamo exporter and --verify\): pip install -e .\[deploy\]'):
        tool.check_installed('dynamo', verify=True)
    tool.check_installed('torchscript', verify=False)


def run_tool(*args, returncode=0):
    result = subprocess.run([PYTHON, TOOL, *args], capture_output=True, text=True,
                            cwd=REPO, env=child_env(), timeout=600)
    assert result.returncode == returncode, result.stderr[-3000:]
    return result.stdout if returncode == 0 else result.stderr


def test_the_cli_exports_a_classifier_from_an_adapter_only_checkpoint(tmp_path):
    """The adapter-only checkpoint loads into the model built from the config,
    whose init_cfg names the base; default exporter, merged."""
    torch.manual_seed(0)
    base = build(classifier_cfg(), 'mmpretrain')
    pretrained = str(tmp_path / 'vit_base.pth')
    torch.save({'state_dict': {k: v for k, v in full_state_dict(base).items()
                               if k.startswith('backbone.') and '.moppa.' not in k
                               and 'ssf_' not in k and 'extra_state' not in k}}, pretrained)
    model = trained(build(classifier_cfg(pretrained), 'mmpretrain'))
    model.init_weights()
    checkpoint = str(tmp_path / 'adapter.pth')
    torch.save({'state_dict': model.state_dict()}, checkpoint)  # adapters and head
    assert not any(k.endswith('qkv.weight') for k in torch.load(checkpoint)['state_dict'])
    config = str(tmp_path / 'vit.py')
    Config(dict(default_scope='mmpretrain', model=classifier_cfg(pretrained))).dump(config)
    output = str(tmp_path / 'out' / 'vit.onnx')
    stdout = run_tool(config, checkpoint, '--output-file', output, '--verify')
    assert 'logits (logits) of (batch, 3, 32, 32) images, merged adapters, dynamo ' \
        'exporter, opset 18 (read from the file)' in stdout
    assert file_opset(output) == [18]
    assert 'verified: onnxruntime (CPU) matches PyTorch at batch sizes (1, 3)' in stdout
    session = onnxruntime.InferenceSession(output, providers=['CPUExecutionProvider'])
    images = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        expected = model.eval()(images, mode='tensor')
    got = torch.from_numpy(session.run(None, {'input': images.numpy()})[0])
    assert (got - expected).abs().max() < TOLERANCE


def test_the_cli_exports_a_detectors_swin_backbone(tmp_path):
    """The demo Cascade Mask R-CNN config with a two-stage Swin: its backbone's
    features, through the older exporter."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.model.backbone.update(depths=[2, 2], num_heads=[1, 2], out_indices=(0, 1),
                              init_cfg=None)
    cfg.model.neck.in_channels = [32, 64]
    config = str(tmp_path / 'detector.py')
    cfg.dump(config)
    detector = trained(build(cfg.model, 'mmdet'))
    checkpoint = str(tmp_path / 'detector.pth')
    torch.save({'state_dict': full_state_dict(detector)}, checkpoint)
    output = str(tmp_path / 'backbone.onnx')
    stdout = run_tool(config, checkpoint, '--output-file', output, '--shape', '64', '96',
                      '--exporter', 'torchscript', '--opset', '11', '--verify')
    assert 'backbone features (feat0, feat1) of (batch, 3, 64, 96) images, merged ' \
        'adapters, torchscript exporter, opset 11 (read from the file)' in stdout
    assert file_opset(output) == [11]  # the Swin's lowest (the ViT's is 14)
    assert 'verified' in stdout


def file_opset(path):
    """The default domain's opset, as onnx reads it from the file."""
    return [o.version for o in onnx.load(path).opset_import if o.domain in ('', 'ai.onnx')]


def test_bad_shapes_and_opsets_are_refused_before_export(vit, tmp_path, capsys):
    """One line each, and nothing written: a file already at the output path
    stays as it was."""
    config, checkpoint = classifier_files(vit, tmp_path)
    output = tmp_path / 'model.onnx'
    output.write_text('an earlier export')
    refused = {
        ('--shape', '0', '0'): r'--shape 0 0: the height and width must be positive$',
        ('--shape', '-32', '32'): r'--shape -32 32: the height and width must be positive$',
        ('--shape', '48', '48'): r'--shape 48 48: the model refuses a \(batch, 3, 48, 48\) '
                                 r'input: ValueError: .*merged for its reference grid '
                                 r'\(4, 4\), got an input on the grid \(6, 6\)',
        ('--opset', '7'): r'--opset 7: the dynamo exporter writes opsets 18 to 23 for a '
                          r'MoPPAVisionTransformer \(torch 2\.',
        ('--opset', '24'): r'--opset 24: the dynamo exporter writes opsets 18 to 23',
        ('--opset', '13', '--exporter', 'torchscript'):
            r'--opset 13: the torchscript exporter writes opsets 14 to 20 for a '
            'MoPPAVisionTransformer',
        ('--opset', '21', '--exporter', 'torchscript'):
            r'--opset 21: the torchscript exporter writes opsets 14 to 20',
        ('--atol', '-1'): r'--atol -1: the tolerance must be zero or positive$',
    }
    for args, message in refused.items():
        with pytest.raises(SystemExit, match=r'^pytorch2onnx.py: ' + message) as error:
            tool.main([config, checkpoint, '--output-file', str(output), *args])
        assert '\n' not in str(error.value.code), args
    # a wrong count of sizes: argparse's usage error
    for args, message in [(['--shape', '32'], 'argument --shape: expected 2 arguments'),
                          (['--shape', '32', '32', '32'], 'unrecognized arguments: 32')]:
        with pytest.raises(SystemExit) as error:
            tool.main([config, checkpoint, '--output-file', str(output), *args])
        assert error.value.code == 2 and message in capsys.readouterr().err
    # --cfg-options reaches the model (here the checkpoint's record disagrees)
    with pytest.raises(SystemExit, match=r"moppa_cfg.heat_param: 'raw' in the checkpoint, "
                                         r"'softplus' in the model"):
        tool.main([config, checkpoint, '--output-file', str(output), '--cfg-options',
                   'model.backbone.moppa_cfg.heat_param=softplus'])
    assert output.read_text() == 'an earlier export'
    # as a user runs it: one line on stderr, no traceback, exit status 1
    stderr = run_tool(config, checkpoint, '--output-file', str(output), '--shape', '0', '0',
                      returncode=1)
    assert stderr.splitlines()[-1] == 'pytorch2onnx.py: --shape 0 0: the height and ' \
        'width must be positive'
    assert 'Traceback' not in stderr


def test_the_opset_reported_is_the_files(vit, tmp_path, capsys, monkeypatch):
    config, checkpoint = classifier_files(vit, tmp_path)
    output = str(tmp_path / 'model.onnx')
    tool.main([config, checkpoint, '--output-file', output, '--exporter', 'torchscript',
               '--opset', '17'])
    assert 'torchscript exporter, opset 17 (read from the file)' in capsys.readouterr().out
    assert file_opset(output) == [17]
    # an exporter that writes another opset than the one asked for (the
    # dynamo exporter below 18: its version conversion gives up): refused
    monkeypatch.setattr(tool, 'lowest_opset', lambda exporter, backbone: 7)
    with pytest.raises(SystemExit, match=r'--opset 7 asked, the dynamo exporter wrote '
                       r'opset 18; .*model.onnx deleted$'):
        tool.main([config, checkpoint, '--output-file', output, '--opset', '7'])
    assert not osp.exists(output)


class TwoOutputs(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, images):
        logits = self.module(images)
        return logits, logits + 1


@pytest.mark.parametrize('fault', ['outputs', 'onnxruntime'])
def test_a_graph_that_fails_verify_is_deleted(vit, tmp_path, monkeypatch, fault):
    """A graph with another number of outputs than PyTorch's, and one that
    onnxruntime cannot load (an operator it does not know, written past
    onnx.checker): the reason, the file deleted, a non-zero exit."""
    config, checkpoint = classifier_files(vit, tmp_path)
    output = str(tmp_path / 'model.onnx')
    if fault == 'outputs':
        real_export_module, built = tool.export_module, []

        def two_outputs(model, cfg):  # the second call gives what is exported
            module, names = real_export_module(model, cfg)
            built.append(module)
            return (module, names) if len(built) == 1 else (TwoOutputs(module),
                                                            [*names, 'again'])

        monkeypatch.setattr(tool, 'export_module', two_outputs)
        message = r'the graph gives 2 outputs, PyTorch 1; .*model.onnx deleted$'
    else:
        real_export_onnx = tool.export_onnx

        def unknown_operator(module, path, *args):
            real_export_onnx(module, path, *args)
            model = onnx.load(path)
            model.graph.node[0].op_type = 'NoSuchOperator'
            onnx.save(model, path)

        monkeypatch.setattr(tool, 'export_onnx', unknown_operator)
        message = (r'onnxruntime cannot load the graph \(\w+: .*NoSuchOperator.*\); '
                   r'.*model.onnx deleted$')
    with pytest.raises(SystemExit, match=r'^pytorch2onnx.py: ' + message) as error:
        tool.main([config, checkpoint, '--output-file', output, '--verify'])
    assert '\n' not in str(error.value.code)
    assert not osp.exists(output)
