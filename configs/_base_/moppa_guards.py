# The previous name of safe_training.py (removed in the next release). Reading it
# issues a FutureWarning, which Python shows by default (mmengine's _deprecation_
# key issues a DeprecationWarning, which Python hides). No import statement: in a
# virtual environment mmengine takes any import for a lazy-import config.
_base_ = ['./safe_training.py']
__import__('warnings').warn(
    'configs/_base_/moppa_guards.py is renamed configs/_base_/safe_training.py; the '
    'old name will be removed in the next release', FutureWarning)
