"""A plain ViT state dict loads into mmpretrain's LoRAModel through
``plain_to_lora_keys``, and the wrapped model then computes the plain ViT."""
import torch
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.peft import LoRAModel

from moppa_mm.models.converters import plain_to_lora_keys

TINY = dict(arch=dict(embed_dims=16, num_layers=2, num_heads=2, feedforward_channels=32),
            img_size=16, patch_size=4)


def test_plain_vit_state_loads_into_lora_model():
    torch.manual_seed(0)
    plain = VisionTransformer(**TINY)
    plain.init_weights()
    lora = LoRAModel(module=dict(type='mmpretrain.VisionTransformer', **TINY),
                     alpha=2, rank=2, targets=[dict(type='qkv'), dict(type='proj')])
    plain.eval()  # (mmpretrain's ViT.train returns None: no chaining)
    lora.eval()
    state = plain_to_lora_keys(plain.state_dict(), lora.module)
    assert 'layers.0.attn.qkv.original_layer.weight' in state
    assert 'layers.0.attn.qkv.weight' not in state
    missing, unexpected = lora.module.load_state_dict(state, strict=False)
    assert not unexpected
    assert missing and all('lora_' in key for key in missing)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # LoRA starts at zero: the plain ViT's function
        torch.testing.assert_close(lora(x)[-1], plain(x)[-1])
