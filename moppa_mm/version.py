"""moppa_mm's version (read by setup.py).

Also the module the ``moppa_mm::`` config scope is resolved through: see
``moppa_mm._register_config_scope``.
"""
__version__ = '0.1.0'
