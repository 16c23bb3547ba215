"""torch.compile: the MoPPA backbones' eval and training forwards, merged or
not, are one dynamo graph (no break anywhere, mmcv's drop path included); a
compiled training step (AOT autograd) gives eager's loss and gradients; and
the unit compiles with ``fullgraph=True``, forward and backward, to the eager
result. Inductor itself (C++ kernels on CPU take minutes to build), freezing
included, is tested on a GPU: tests/test_cuda/test_compile_cuda.py."""
import collections
import contextlib
import copy

import pytest
import torch

from moppa_mm import merge_adapters
from moppa_mm.operators import MoPPAUnit
from tests.test_deploy.test_merge import SWIN, build, trained

VIT = dict(type='MoPPAVisionTransformer', img_size=32, patch_size=8, drop_path_rate=0.1,
           arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64))


def graph_breaks(model, images, grad):
    torch._dynamo.reset()
    with contextlib.nullcontext() if grad else torch.no_grad():
        explained = torch._dynamo.explain(model)(images)
    return explained.graph_count, [str(b.reason)[:300] for b in explained.break_reasons]


@pytest.mark.parametrize('cfg,scope', [(VIT, 'mmpretrain'), (SWIN, 'mmdet')],
                         ids=['vit', 'swin'])
def test_backbone_forwards_are_one_graph(cfg, scope):
    backbone = trained(build(cfg, scope))
    images = torch.randn(2, 3, 32, 32)
    assert graph_breaks(backbone.train(), images, grad=True) == (1, [])
    assert graph_breaks(backbone.eval(), images, grad=False) == (1, [])
    assert graph_breaks(merge_adapters(backbone), images, grad=False) == (1, [])


def test_the_unit_compiles_with_fullgraph():
    torch.manual_seed(0)
    unit = trained(MoPPAUnit(16, 2, (4, 4), init_mode='identity', heat_param='softplus'))
    unit.train()
    eager = copy.deepcopy(unit)
    torch._dynamo.reset()
    compiled = torch.compile(unit, fullgraph=True, backend='aot_eager')
    x = torch.randn(2, 4, 4, 16, requires_grad=True)
    out = compiled(x)
    expected = eager(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    grads = [p.grad for p in unit.parameters()]
    expected.square().sum().backward()
    for grad, ref in zip(grads, [p.grad for p in eager.parameters()]):
        torch.testing.assert_close(grad, ref)
    compiled.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager.eval()(x))


def loss_and_grads(model, images, directions):
    """A loss along fixed random ``directions`` (one per output: the outputs
    are normed, so their squares would sum to a constant) and the gradients
    of the trainable parameters."""
    model.zero_grad()
    loss = sum((out * direction).sum() for out, direction in zip(model(images), directions))
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.requires_grad]


@pytest.mark.slow
@pytest.mark.parametrize('cfg,scope', [(VIT, 'mmpretrain'), (SWIN, 'mmdet')],
                         ids=['vit', 'swin'])
def test_compiled_training_step_gives_eager_gradients(cfg, scope):
    """Forward and backward through AOT autograd (the graph inductor compiles
    in training, where the custom autograd functions take their plain path)."""
    backbone = trained(build(dict(cfg, random_base=True, drop_path_rate=0.), scope)).train()
    eager = copy.deepcopy(backbone)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        directions = [torch.randn_like(out) for out in eager(images)]
    torch._dynamo.reset()
    compiled = torch.compile(backbone, backend='aot_eager', fullgraph=True)
    loss, grads = loss_and_grads(compiled, images, directions)
    expected_loss, expected_grads = loss_and_grads(eager, images, directions)
    torch.testing.assert_close(loss, expected_loss)
    assert grads and len(grads) == len(expected_grads)
    for grad, ref in zip(grads, expected_grads):  # relative to each gradient's size
        assert ref.norm() > 0 and (grad - ref).norm() <= 1e-4 * ref.norm()


SWIN_SSF = dict(SWIN, use_scale_shift=True)


@pytest.mark.parametrize('cfg,scope', [(VIT, 'mmpretrain'), (SWIN_SSF, 'mmdet')],
                         ids=['vit', 'swin'])
def test_compile_blocks_compiles_each_block_to_eager_results(cfg, scope):
    """``compile_blocks`` (regional compilation): every ViT layer or Swin block
    is compiled in place, and a training step gives eager's loss and the same
    gradients, the scale & shift's through its own backward (a compiler traces
    the function rather than differentiate the folded weights)."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    from moppa_mm.models import compile_blocks
    backbone = trained(build(dict(cfg, random_base=True, drop_path_rate=0.), scope)).train()
    eager = copy.deepcopy(backbone)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        directions = [torch.randn_like(out) for out in eager(images)]
    graphs = collections.Counter()  # op names in the compiled graphs

    def record(graph_module, example_inputs):
        graphs.update(str(node.target) for node in graph_module.graph.nodes)
        return make_boxed_func(graph_module.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    assert compile_blocks(backbone, backend=backend) is backbone
    blocks = list(backbone.layers) if hasattr(backbone, 'layers') else \
        [block for stage in backbone.stages for block in stage.blocks]
    assert all(block._compiled_call_impl is not None for block in blocks)
    loss, grads = loss_and_grads(backbone, images, directions)
    expected_loss, expected_grads = loss_and_grads(eager, images, directions)
    torch.testing.assert_close(loss, expected_loss)
    assert grads and len(grads) == len(expected_grads)
    for grad, ref in zip(grads, expected_grads):
        assert ref.norm() > 0 and (grad - ref).norm() <= 1e-4 * ref.norm()
    assert graphs['aten.native_batch_norm_backward.default'] > 0  # the fused backward
