"""Print total / trainable parameters per component for any config.

    python tools/analysis/param_breakdown.py configs/cascade_moppa_swin_b_coco.py
    python tools/analysis/param_breakdown.py configs/vtab1k/moppa_vit-b-p16_mae-pre_vtab1k-dtd.py
    python tools/analysis/param_breakdown.py configs/fgvc/lora_vit-b-p16_in21k-pre_fgvc-cub.py

The model is built as training builds it (the MoPPA backbones freeze themselves),
without loading any checkpoint.
"""
import argparse
import os.path as osp
import sys

from mmengine.config import DictAction
from mmengine.registry import init_default_scope

import moppa_mm  # noqa: F401  registries
from moppa_mm.engine.hooks.peft_freeze_hook import DEFAULT_COMPONENTS
from moppa_mm.utils.params import parameter_table

# tools/, appended: tools/test.py must not shadow the standard `test`
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
from preflight import load_config, run_main  # noqa: E402


def build_model(cfg):
    """The config's model as training builds it, loading no checkpoint."""
    scope = cfg.get('default_scope', 'mmdet')
    init_default_scope(scope)
    if scope == 'mmpretrain':
        from mmpretrain.registry import MODELS
    else:
        from mmdet.registry import MODELS
    backbone = cfg.model.backbone
    if backbone.type == 'LoRAModel':  # the LoRA baseline loads through its ViT
        backbone = backbone.module
    backbone.init_cfg = None  # count, do not load
    return MODELS.build(cfg.model)


# the hook's groups, and the LoRA baseline's factors before the pre-trained rest
COMPONENTS = []
for name, patterns in DEFAULT_COMPONENTS:
    if name == 'backbone (pre-trained)':
        COMPONENTS.append(('backbone.lora', ('backbone.*lora_*', )))
    COMPONENTS.append((name, patterns))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args()
    model = build_model(load_config(args.config, cfg_options=args.cfg_options))
    table, counts = parameter_table(model, COMPONENTS, title=args.config)
    print(table)
    backbone = sum(counts[k]['trainable'] for k in counts if k.startswith('backbone'))
    print(f'trainable backbone parameters: {backbone:,} ({backbone / 1e6:.3f}M); '
          f'trainable in all: {counts["total"]["trainable"]:,} '
          f'({counts["total"]["trainable"] / 1e6:.3f}M)')


if __name__ == '__main__':
    run_main(main, 'param_breakdown.py')
