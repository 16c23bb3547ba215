"""Train a MoPPA model: runs MMDetection's or MMPretrain's own tools/train.py
(by the config's default_scope), so it takes all of their arguments, e.g.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--cfg-options k=v ...] [--launcher pytorch]

Before the Runner is built it checks data and checkpoint paths, finds what
--resume alone resumes from (the newest complete checkpoint where
last_checkpoint is missing or gone), takes the work dir's lock (a second run
there stops with one line) and, without CUDA, sets up gloo for distributed
runs (tools/launch.py).
"""
from launch import main  # tools/launch.py

import moppa_mm  # noqa: F401  registries

if __name__ == '__main__':
    main('train')
