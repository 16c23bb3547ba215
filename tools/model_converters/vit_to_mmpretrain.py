"""Convert a pre-trained ViT or Swin checkpoint into mmpretrain's keys for MoPPA configs.

    python tools/model_converters/vit_to_mmpretrain.py SOURCE SRC DST

    SOURCE  SRC (local file)                        DST (e.g.)
    jax     ViT-B_16-augreg.npz (or ViT-L_16.npz)   vit-b16_in21k-augreg.pth
    mae     mae_pretrain_vit_base.pth               vit-b16_mae.pth
    mocov3  vit-b-300ep.pth.tar                     vit-b16_mocov3.pth
    swin    swin_base_patch4_window7_224_22k.pth    swin-b-p4-w7_in21k.pth

The output loads with ``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``.
"""
import argparse

from moppa_mm.models.converters import CONVERTERS, convert, save_backbone


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('source', choices=tuple(CONVERTERS), help='source format')
    parser.add_argument('src', help='local source checkpoint')
    parser.add_argument('dst', help='output .pth')
    args = parser.parse_args()
    state = convert(args.src, args.source)
    save_backbone(state, args.dst, source=f'{args.source}:{args.src}')
    print(f'{len(state)} tensors -> {args.dst}')


if __name__ == '__main__':
    main()
