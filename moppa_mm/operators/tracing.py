"""Whether a forward is being captured into a graph rather than run: then
(dynamo, ``torch.export``, the TorchScript tracer, the ONNX exporters) the
operators take their plain paths, which compilers fuse themselves; no custom
autograd function, no cache, no value read back from the device."""
import torch


def is_capturing() -> bool:
    """True while dynamo, ``torch.export``, the TorchScript tracer or the ONNX
    exporter records the forward."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True  # dynamo, torch.compile and torch.export (the default ONNX exporter)
    return bool(torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


__all__ = ['is_capturing']
