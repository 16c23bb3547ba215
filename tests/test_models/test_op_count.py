"""How many operations a training step dispatches (forward + backward, bf16
autocast): the MoPPA ViT-B against LoRA at matched parameters, and each MoPPA
Swin block against the frozen Swin's with a backward through it. An eager GPU
step is host-bound, and each aten op (views included) costs host time: this
deterministic count is what an H100 step time follows (docs/benchmarks.md).
Counted on CPU with a ``TorchDispatchMode`` for the operations the GPU runs:
the DCT as on CUDA (Kronecker up to 14x14 grids).

The counts are affine in the depth (the units' filters are built for all
layers, or a stage's blocks, at once; then each layer or block adds the same
operations): ViT-B is counted at 3 and 4 layers and extrapolated to its 12,
the Swin's cost per block from two depths of its third stage."""
import collections

import pytest

import torch
import torch.nn as nn
from mmpretrain.models.peft import LoRAModel
from torch.utils._python_dispatch import TorchDispatchMode

from moppa_mm.models import MoPPAVisionTransformer
from moppa_mm.operators import dct

BATCH, TOKENS, DIMS = 2, 197, 768  # ViT-B/16 at 224 px: 1 + 14 x 14 tokens


def vit_b(depth: int) -> dict:
    return dict(arch=dict(embed_dims=DIMS, num_layers=depth, num_heads=12,
                          feedforward_channels=4 * DIMS), img_size=224, patch_size=16)


VARIANTS = {
    'lora': lambda depth: LoRAModel(module=dict(type='mmpretrain.VisionTransformer',
                                                **vit_b(depth)),
                                    alpha=6, rank=6, targets=[dict(type='qkv')]),
    'moppa': lambda depth: MoPPAVisionTransformer(**vit_b(depth), random_base=True),
}


class Ops(TorchDispatchMode):
    """Counts every dispatched op by name, and the casts of activations
    (``_to_copy`` / ``copy_`` of a tensor of the batch's tokens or more)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.activation_casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        source = args[-1] if name == 'copy_' else args[0]
        if name in ('_to_copy', 'copy_') and source.dim() >= 2 and \
                source.shape[0] == BATCH and source.numel() >= BATCH * (TOKENS - 1) * DIMS:
            self.activation_casts += 1
        return func(*args, **(kwargs or {}))


def step(variant: str, depth: int) -> Ops:
    """One training step's ops; an eval forward first fills the caches (the
    DCT bases) as the first step of a run does."""
    torch.manual_seed(0)
    model = VARIANTS[variant](depth).train()
    head = nn.Linear(DIMS, 10)
    x, labels = torch.randn(BATCH, 3, 224, 224), torch.tensor([1, 2])
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        model(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):  # its own: autocast caches casts
        with Ops() as ops:
            loss = nn.functional.cross_entropy(head(model(x)[-1]), labels)
            if variant == 'moppa':  # as mmengine adds it: loss_route is part of the step
                loss = loss + model.route_loss()
            loss.backward()
    return ops


def twelve_layers(variant: str):
    """(ops, activation casts) of a 12-layer step, from 3 and 4 layers."""
    three, four = step(variant, 3), step(variant, 4)
    ops = sum(three.ops.values()) + 9 * (sum(four.ops.values()) - sum(three.ops.values()))
    casts = three.activation_casts + 9 * (four.activation_casts - three.activation_casts)
    return ops, casts, three.ops


def test_moppa_step_dispatches_at_most_1_25x_loras_ops(monkeypatch):
    monkeypatch.setitem(dct.KRON_MAX_TOKENS, 'cpu', dct.KRON_MAX_TOKENS['cuda'])
    lora, lora_casts, _ = twelve_layers('lora')
    moppa, moppa_casts, kinds = twelve_layers('moppa')
    print(f'\nViT-B step, bf16 autocast, batch {BATCH}: MoPPA {moppa} ops, LoRA {lora} '
          f'({moppa / lora:.2f}x); activation casts {moppa_casts} vs {lora_casts}')
    print('  MoPPA (3 layers):', kinds.most_common(12))
    assert moppa <= 1.25 * lora
    assert moppa_casts <= lora_casts  # no dtype-cast copy of an activation beyond LoRA's
    assert kinds['_local_scalar_dense'] == 0


def swin_step_ops(depth: int, **moppa) -> int:
    """Every op of a bf16 training step of a Swin whose third stage has
    ``depth`` blocks: MoPPA's (``moppa``: its options) or the frozen plain
    Swin's, with a backward through it to the input (as a detector's)."""
    from mmdet.models.backbones import SwinTransformer

    from moppa_mm.models import MoPPASwinTransformer
    arch = dict(embed_dims=32, depths=(1, 1, depth, 1), num_heads=(1, 2, 4, 8),
                window_size=7, out_indices=(3, ))
    torch.manual_seed(0)
    if moppa:
        model = MoPPASwinTransformer(**arch, random_base=True, **moppa)
    else:
        model = SwinTransformer(**arch).requires_grad_(False)
    model.train()
    x = torch.randn(1, 3, 224, 224, requires_grad=not moppa)
    for counted in (False, True):  # the first step fills the caches (DCT bases)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            with Ops() as ops:
                model(x)[-1].float().square().mean().backward()
    return sum(ops.ops.values())


@pytest.mark.parametrize('scope', ['window', 'global'])
def test_each_moppa_swin_block_adds_at_most_44_ops(scope, monkeypatch):
    """A stage-3 block of the MoPPA Swin (unit and conv adapter) over the
    frozen block with a backward through it: its share of the stage's unit
    build, its unit and adapter, forward and backward, the trainable tensors'
    gradient accumulation included."""
    monkeypatch.setitem(dct.KRON_MAX_TOKENS, 'cpu', dct.KRON_MAX_TOKENS['cuda'])
    extra = {depth: swin_step_ops(depth, moppa_scope=scope) - swin_step_ops(depth)
             for depth in (2, 4)}
    per_block = (extra[4] - extra[2]) / 2
    print(f'\nMoPPA Swin ({scope}) block, bf16: {per_block:.0f} extra ops')
    assert per_block <= 44
