"""Whether a forward is being captured into a graph rather than run.

Under ``torch.compile`` (dynamo), ``torch.export`` (which torch's default ONNX
exporter uses), the TorchScript tracer (the older ONNX exporter) and
``torch.jit.trace``, the operators take their plain paths: no custom autograd
functions, no eval cache keyed on parameter versions, no values read back
from the device. The graph compilers fuse the plain operations themselves; a
trace of an eager-only path could record a constant it does not understand.
"""
import torch


def is_capturing() -> bool:
    """True while dynamo, ``torch.export``, the TorchScript tracer or the ONNX
    exporter records the forward."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True  # dynamo, torch.compile and torch.export (the default ONNX exporter)
    return bool(torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


__all__ = ['is_capturing']
