"""While a forward is captured into a graph the operators take their plain paths,
which compilers fuse themselves: no custom autograd function, no cache, no value
read back from the device."""
import torch


def is_capturing(compilers: bool = True) -> bool:
    """True while dynamo (``torch.compile``, unless ``compilers=False``: it
    traces custom autograd functions), ``torch.export``, the TorchScript
    tracer or the ONNX exporter records the forward."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True  # torch.export is the default ONNX exporter's
    return compilers and torch.compiler.is_compiling()
