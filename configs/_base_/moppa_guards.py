# The previous name of safe_training.py (removed in the next release).
_base_ = ['./safe_training.py']
_deprecation_ = dict(expected='configs/_base_/safe_training.py')
