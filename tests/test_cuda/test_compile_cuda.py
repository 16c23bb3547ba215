"""On a GPU (marked ``cuda``, skipped without one): inductor compiles the
MoPPA backbones, merged or not, for eval with ``freezing`` (and
``shape_padding`` off, docs/deploy.md) and for training, to eager's results.
The CPU side (one dynamo graph, AOT autograd's gradients) is
tests/test_deploy/test_compile.py."""
import copy

import pytest
import torch

from moppa_mm import merge_adapters
from tests.test_deploy.test_compile import loss_and_grads
from tests.test_deploy.test_merge import build, trained

pytestmark = pytest.mark.cuda
# window 7 (49 tokens, which inductor pads on a GPU) and conv adapters, as Swin-B
SWIN = dict(type='MoPPASwinTransformer', embed_dims=32, depths=(2, 2), num_heads=(2, 4),
            window_size=7, pretrain_img_size=56, out_indices=(0, 1), drop_path_rate=0.)
VIT = dict(type='MoPPAVisionTransformer', img_size=56, patch_size=8, drop_path_rate=0.,
           arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64))
MODELS = {'swin': (SWIN, 'mmdet'), 'vit': (VIT, 'mmpretrain')}


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 matmuls and convolutions without TF32, so that compiled and
    eager agree to float32's rounding."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.reset()
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize('merged', [False, True], ids=['unmerged', 'merged'])
@pytest.mark.parametrize('name', MODELS)
def test_eval_compiles_with_freezing(name, merged):
    """As docs/deploy.md says: ``freezing`` with ``shape_padding`` off. Layout
    optimisation is forced on, as Swin-B's 24 conv adapters make inductor
    choose it (a tiny model's few narrow convolutions would not)."""
    import torch._inductor.config as inductor_config
    cfg, scope = MODELS[name]
    backbone = trained(build(cfg, scope)).cuda()
    if merged:
        merge_adapters(backbone)
    images = torch.randn(2, 3, 56, 56, device='cuda')
    with torch.no_grad(), inductor_config.patch(freezing=True, shape_padding=False,
                                                force_layout_optimization=True):
        expected = backbone(images)
        outputs = torch.compile(backbone)(images)
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('name', MODELS)
def test_training_step_compiles(name):
    cfg, scope = MODELS[name]
    backbone = trained(build(dict(cfg, random_base=True), scope)).cuda().train()
    eager = copy.deepcopy(backbone)
    images = torch.randn(2, 3, 56, 56, device='cuda')
    with torch.no_grad():
        directions = [torch.randn_like(out) for out in eager(images)]
    loss, grads = loss_and_grads(torch.compile(backbone), images, directions)
    expected_loss, expected_grads = loss_and_grads(eager, images, directions)
    torch.testing.assert_close(loss, expected_loss, atol=1e-4, rtol=1e-4)
    for grad, ref in zip(grads, expected_grads):
        assert ref.norm() > 0 and (grad - ref).norm() <= 1e-3 * ref.norm()


@pytest.mark.parametrize('name', MODELS)
def test_compile_blocks_trains_under_autocast(name):
    """Regional compilation (``compile_blocks``, inductor): a bfloat16 autocast
    training step gives eager's loss and gradients, up to bfloat16's rounding."""
    from moppa_mm.models import compile_blocks
    cfg, scope = MODELS[name]
    backbone = trained(build(dict(cfg, random_base=True), scope)).cuda().train()
    eager = copy.deepcopy(backbone)
    images = torch.randn(2, 3, 56, 56, device='cuda')
    with torch.no_grad():
        directions = [torch.randn_like(out) for out in eager(images)]
    compile_blocks(backbone)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        loss, grads = loss_and_grads(backbone, images, directions)
        expected_loss, expected_grads = loss_and_grads(eager, images, directions)
    torch.testing.assert_close(loss, expected_loss, atol=2e-2, rtol=2e-2)
    for grad, ref in zip(grads, expected_grads):
        assert ref.norm() > 0 and (grad - ref).norm() <= 5e-2 * ref.norm()
