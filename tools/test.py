"""Evaluate a checkpoint (full or adapter-only): runs MMDetection's or
MMPretrain's own tools/test.py (by the config's default_scope), so it takes all
of their arguments, e.g. for a detector

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl]
        [--show-dir DIR] [--tta] [--cfg-options k=v ...] [--launcher pytorch]

Before the Runner is built it checks data and checkpoint paths and, without
CUDA, sets up gloo for distributed runs (tools/launch.py).
"""
from launch import main  # tools/launch.py

import moppa_mm  # noqa: F401  registries

if __name__ == '__main__':
    main('test')
