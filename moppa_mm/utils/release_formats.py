"""What a pre-trained release looks like (:func:`identify`), and the check
that a config's ``init_cfg`` checkpoint was converted to mmpretrain's keys
(:func:`check_converted`), naming the converter command where it was not."""
import re
from typing import Any, Optional

from .errors import MoPPAInputError

CONVERTER_TOOL = 'tools/model_converters/vit_to_mmpretrain.py'
# what a file looks like, by the format :func:`identify` finds
LOOKS_LIKE = {
    'jax': 'a JAX/Flax ViT release (cls, embedding/kernel, Transformer/encoderblock_*)',
    'mae': 'a timm / MAE ViT checkpoint (blocks.*, patch_embed.proj.*)',
    'mocov3': 'a MoCo v3 ViT checkpoint (module.base_encoder.*)',
    'swin': 'an official Swin release (layers.*.blocks.*, patch_embed.proj.*)',
    'converted': "already converted to mmpretrain's keys (backbone.*)",
}


class SourceFormatError(MoPPAInputError, ValueError):
    """A checkpoint is not in the format it is used as (an unconverted release
    given to a config, a converted file or another release given to a
    converter)."""


def _tensors_of(checkpoint: Any) -> dict:
    """The state dict a checkpoint wraps (``model``, ``state_dict`` or itself)."""
    if not isinstance(checkpoint, dict):
        return {}
    for key in ('model', 'state_dict'):
        if isinstance(checkpoint.get(key), dict):
            return checkpoint[key]
    return checkpoint


def identify(checkpoint: Any) -> Optional[str]:
    """The format a loaded checkpoint (or ``.npz`` arrays) looks like: a key
    of :data:`LOOKS_LIKE` or None."""
    keys = [k for k in _tensors_of(checkpoint) if isinstance(k, str)]

    def has(pattern):
        return any(re.match(pattern, k) for k in keys)

    if has(r'backbone\.'):
        return 'converted'
    if has(r'module\.base_encoder\.'):
        return 'mocov3'
    if has(r'layers\.\d+\.blocks\.\d+\.'):
        return 'swin'
    if has(r'blocks\.\d+\.') and has(r'patch_embed\.proj\.'):
        return 'mae'
    return 'jax' if 'cls' in keys and 'embedding/kernel' in keys else None


def convert_command(source: str, path: str) -> str:
    """The command that converts ``path`` from ``source`` (output beside it)."""
    stem = re.sub(r'(\.pth)?(\.tar)?$|\.npz$', '', path)
    return f'python {CONVERTER_TOOL} {source} {path} {stem}_mmpretrain.pth'


def check_converted(path: str, checkpoint: Any, prefix: str,
                    key: str = 'model.backbone.init_cfg.checkpoint',
                    backbone: Optional[str] = None) -> None:
    """Raise :class:`SourceFormatError` if ``checkpoint`` (loaded from
    ``path``, given as the config's ``key``) holds no key under ``prefix``,
    which mmengine's ``Pretrained`` init with that prefix requires (its own
    error names neither file nor format): say what the file looks like and
    the converter command, or, where the config's ``backbone`` type is of the
    other family (a Swin release for a ViT), that it is no base for it."""
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else {}
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    if any(isinstance(k, str) and k.startswith(prefix) for k in state):
        return
    found = identify(checkpoint)
    example = sorted(map(str, _tensors_of(checkpoint)))[:3]
    head = f'pre-trained checkpoint {key} = {path!r} has no {prefix!r} keys (e.g. {example})'
    release = 'Swin' if found == 'swin' else 'ViT'
    if found not in (None, 'converted') and any(word in (backbone or '') for word in (
            'Swin', 'VisionTransformer')) and ('Swin' in backbone) != (release == 'Swin'):
        raise SourceFormatError(
            f'{head}: it is {LOOKS_LIKE[found]}, a {release} release, and this config '
            f'builds a {backbone}: give it a pre-trained '
            f'{"ViT" if release == "Swin" else "Swin"} (README, "Pre-trained checkpoints").')
    if found not in (None, 'converted'):
        raise SourceFormatError(
            f'{head}: it is {LOOKS_LIKE[found]}, not converted to mmpretrain\'s keys. '
            f'Convert it once with\n    {convert_command(found, path)}\n'
            f'and set {key} to the output.')
    raise SourceFormatError(
        f'{head}: not a converted pre-trained checkpoint of this backbone. The ViT '
        f'and Swin releases convert with {CONVERTER_TOOL} (README, "Pre-trained '
        'checkpoints").')
