"""How the benchmarks measure: alternating-round timing, per-round ratios, the
memory of a step, per-operator times and profiles. Device-agnostic: on CUDA
every timed region is synchronised and memory comes from the allocator too."""
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn as nn


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def interleaved(steps: Dict[str, Callable], device: torch.device, warmup: int,
                rounds: int) -> Dict[str, List[float]]:
    """Time several variants in alternating rounds.

    One call of each variant per round, the order reversed every other round,
    so that the drifts of a noisy machine hit all variants alike; ratios are
    then taken round by round (:func:`ratio`).

    Returns:
        Variant name -> seconds of each round.
    """
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in steps}
    for round_idx in range(rounds):
        names = list(steps) if round_idx % 2 == 0 else list(reversed(steps))
        for name in names:
            sync(device)
            start = time.perf_counter()
            steps[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def median_ms(times: Dict[str, List[float]], name: str) -> float:
    """Median over rounds of ``name``'s time, in milliseconds."""
    return statistics.median(times[name]) * 1e3


def ratio(times: Dict[str, List[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s time over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(times[name], times[base]))


def saved_activation_bytes(fn: Callable, model: nn.Module) -> int:
    """Bytes of the tensors autograd saves for backward during ``fn()``.

    The part of a step's memory that adapters change, on any device.
    Parameters, which the backward also saves, are not counted; each storage
    is counted once.
    """
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def peak_allocated_bytes(fn: Callable, device: torch.device) -> int:
    """CUDA only: the caching allocator's peak during ``fn()``, above what was
    allocated before it (parameters, optimizer state, inputs)."""
    if device.type != 'cuda':
        raise ValueError(f'peak allocated memory needs a CUDA device, got {device}')
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def step_memory_mb(fn: Callable, device: torch.device, model: nn.Module) -> Dict[str, float]:
    """The memory of one more call of ``fn`` (a training step), in MB (2**20).

    Returns:
        ``saved_mb``: activations saved for backward (every device);
        ``peak_alloc_mb``: the allocator's peak over the step, CUDA only.
    """
    memory = dict(saved_mb=saved_activation_bytes(fn, model) / 2**20)
    if device.type == 'cuda':
        memory['peak_alloc_mb'] = peak_allocated_bytes(fn, device) / 2**20
    return memory


def block_step(block: nn.Module, x: torch.Tensor, train: bool) -> Callable:
    """A call of ``block`` on ``x``: forward + backward of a fixed upstream
    gradient (``train``), or a forward without autograd."""
    if train:
        x = x.detach().requires_grad_(True)
        with torch.no_grad():
            out = block(x)
        grad = torch.randn_like(out[0] if isinstance(out, tuple) else out)

        def step():
            out = block(x)
            (out[0] if isinstance(out, tuple) else out).backward(grad)
    else:

        def step():
            with torch.no_grad():
                block(x)

    return step


def launches_per_call(fn: Callable, device: torch.device) -> int:
    """What one call of ``fn`` launches, after a warm-up call: on CUDA the
    device-side events torch.profiler records (kernels, memcpy, memset), which
    a launch-bound step pays for one by one; on CPU, where nothing is
    launched, the aten calls dispatched, the proxy."""
    fn()  # warm
    if device.type == 'cuda':
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync(device)
        return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)
    from torch.utils._python_dispatch import TorchDispatchMode

    class CallCounter(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    with CallCounter() as counter:
        fn()
    return counter.calls


def top_ops(fn: Callable, device: torch.device, rows: int = 8) -> List[Dict]:
    """The operators of one call of ``fn`` with the most self time (CPU time;
    on CUDA, device time), after one warm-up call."""
    from torch.profiler import ProfilerActivity, profile
    fn()  # warm
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)

    def self_us(event):
        if device.type != 'cuda':
            return event.self_cpu_time_total
        if hasattr(event, 'self_device_time_total'):
            return event.self_device_time_total
        return event.self_cuda_time_total  # its name before torch 2.4

    events = sorted(prof.key_averages(), key=self_us, reverse=True)
    total = sum(self_us(e) for e in events) or 1
    return [dict(op=e.key, calls=e.count, self_ms=self_us(e) / 1e3, share=self_us(e) / total)
            for e in events[:rows]]


def op_times(fn: Callable, device: torch.device, repeats: int = 3) -> Dict[tuple, float]:
    """Seconds spent in each aten op, summed over one call of ``fn``.

    Ops are keyed by name and input shapes; each value is the minimum over
    ``repeats`` calls, after one warm-up call. Each op is timed where it is
    dispatched (synchronised on CUDA), so no profiler overhead lands on one op
    and not another.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpTimer(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.times = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            sync(device)
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            key = (str(func.overloadpacket.__name__), shapes)
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start
            return out

    fn()  # warm
    best = {}
    for _ in range(repeats):
        with OpTimer() as timer:
            fn()
        for key, value in timer.times.items():
            best[key] = min(best.get(key, float('inf')), value)
    return best
