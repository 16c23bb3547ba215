"""Make a checkpoint publishable (OpenMMLab's publish_model pattern).

    python tools/model_converters/publish_model.py work_dirs/x/epoch_36.pth moppa_coco.pth
    python tools/model_converters/publish_model.py IN.pth moppa_coco_full.pth --merge-base
    python tools/model_converters/publish_model.py IN.pth moppa_coco_merged.pth --merge

Keeps the weights and ``meta`` (without the random states), drops the optimizer
state, the message hub and the scheduler states, and writes
``<out>-<first 8 hex digits of the sha256>.pth`` (``torch.load(weights_only=True)``
reads it). A MoPPA checkpoint whose tensors no longer match its adapter record's
digest is refused (damaged). An adapter-only checkpoint stays adapter-only;
``--merge-base`` saves the whole model built from the config stored in the
checkpoint (or ``--config``), base included: a self-contained file. ``--merge``
also folds the adapters in (one-way; it loads into a model built with
``model.backbone.merged=True``: docs/deploy.md).
"""
import argparse
import hashlib
import io
import os.path as osp

import torch

import moppa_mm  # noqa: F401  registries
from moppa_mm.models import full_state_dict
from moppa_mm.models.backbones.adapter_params import RECORD_KEY
from moppa_mm.models.backbones.adapter_record import decode_record
from moppa_mm.models.backbones.load_check import stored_problems
from moppa_mm.utils.atomic import atomic_write
from moppa_mm.utils.checkpoints import load_checkpoint_file
from moppa_mm.utils.errors import MoPPAInputError, show_traceback, stop
from moppa_mm.utils.config_files import read_config
from moppa_mm.utils.runner_state import RUNNER_STATE_DIGEST

DROPPED = ('optimizer', 'message_hub', 'param_schedulers', RUNNER_STATE_DIGEST)


def merged_state_dict(checkpoint: dict, config: str = None,
                      merge_adapters: bool = False) -> dict:
    """The whole model's state dict (:func:`moppa_mm.models.full_state_dict`):
    the model built from the config (its backbone loads its base) with the
    checkpoint loaded and, with ``merge_adapters``, the adapters folded in."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner.checkpoint import _load_checkpoint_to_model
    if config is not None:
        cfg = read_config(config)
    elif 'cfg' in checkpoint.get('meta', {}):
        cfg = Config.fromstring(checkpoint['meta']['cfg'], file_format='.py')
    else:
        raise ValueError('the checkpoint stores no config: pass --config')
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    model = MODELS.build(cfg.model)
    _load_checkpoint_to_model(model, checkpoint, strict=True)
    if merge_adapters:
        moppa_mm.merge_adapters(model)
    return full_state_dict(model)


def publish(in_file: str, out_file: str, merge_base: bool = False,
            config: str = None, merge: bool = False) -> str:
    """Write the published checkpoint; returns its final path."""
    checkpoint = load_checkpoint_file(in_file, what='checkpoint to publish')
    if 'state_dict' not in checkpoint:
        raise KeyError(f'{in_file!r} has no state_dict: not an mmengine checkpoint')
    state = checkpoint['state_dict']
    for key in [k for k, v in state.items() if k.endswith(RECORD_KEY) and decode_record(v)]:
        problems = stored_problems(state, key[:-len(RECORD_KEY)],
                                   f'checkpoint to publish {in_file!r}')
        if problems:  # a MoPPA record whose digest the tensors no longer match
            raise problems[0]
    for key in DROPPED:
        checkpoint.pop(key, None)
    meta = checkpoint.setdefault('meta', {})
    meta.pop('rng_state', None)
    if merge_base or merge:
        checkpoint['state_dict'] = merged_state_dict(checkpoint, config, merge)
        meta.pop('adapter_only', None)
    stem = out_file[:-len('.pth')] if out_file.endswith('.pth') else out_file
    buffer = io.BytesIO()  # in memory first: the name needs the hash
    torch.save(checkpoint, buffer)
    data = buffer.getvalue()
    final_file = f'{stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth'
    atomic_write(final_file, data, what='published checkpoint')
    return final_file


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('in_file', help='checkpoint written by training')
    parser.add_argument('out_file', help='output name; the sha256 prefix is appended')
    parser.add_argument('--merge-base', action='store_true',
                        help='include the frozen pre-trained backbone weights')
    parser.add_argument('--merge', action='store_true',
                        help='--merge-base, and fold the adapters into the weights '
                        '(inference only, one-way)')
    parser.add_argument('--config', help='config to build the model with for '
                        '--merge-base / --merge (default: the one stored in the checkpoint)')
    args = parser.parse_args()
    try:
        final_file = publish(args.in_file, args.out_file, args.merge_base, args.config,
                             args.merge)
    except MoPPAInputError as error:  # our verdicts on the inputs
        if show_traceback():
            raise
        stop('publish_model.py', error)
    except (OSError, ValueError, KeyError) as error:  # bad inputs, named
        stop('publish_model.py', error)
    size = osp.getsize(final_file) / 2**20
    print(f'{final_file} ({size:.1f} MiB)')


if __name__ == '__main__':
    main()
