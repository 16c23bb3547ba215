import copy

import pytest
import torch
import torch.nn as nn

from moppa_mm.models.layers import ConvAdapter
from tests.dtype_check import cuda_dtype_rules


def _adapter_and_norm(dtype=torch.float32, channels=6, hidden=3):
    torch.manual_seed(0)
    adapter = ConvAdapter(channels, hidden).to(dtype)
    with torch.no_grad():  # leave the identity init: every path must carry gradient
        for p in adapter.parameters():
            p.normal_(0, 0.5)
    norm = nn.LayerNorm(channels).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1, 0.3)
        norm.bias.normal_(0, 0.3)
    return adapter, norm


def test_identity_at_init():
    adapter = ConvAdapter(8, 2)
    x = torch.randn(2, 5, 4, 8)
    torch.testing.assert_close(adapter(x), x)


def test_bad_hidden_dims():
    with pytest.raises(ValueError, match='hidden_dims must be >= 1'):
        ConvAdapter(8, 0)


def test_forward_after_norm_gradcheck():
    """The hand-written backward against numerical differentiation, through
    the norm and into every adapter parameter."""
    adapter, norm = _adapter_and_norm(torch.float64)
    source = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    params = list(adapter.parameters())

    def fn(source, *params):
        return adapter.forward_after_norm(norm(source), source, norm)

    assert torch.autograd.gradcheck(fn, (source, *params))


def test_forward_after_norm_matches_autograd_at_an_odd_bottleneck():
    """Swin-B's stage-3 bottleneck is 71 wide (512 / 7.25): the lean path's
    output and gradients equal autograd's at an odd width, in float32."""
    adapter, norm = _adapter_and_norm(channels=16, hidden=39)
    source = torch.randn(2, 5, 6, 16)
    grad = torch.randn(2, 5, 6, 16)
    results = []
    for lean in (True, False):
        adapter.zero_grad()
        src = source.clone().requires_grad_(True)
        x = norm(src)
        out = adapter.forward_after_norm(x, src, norm) if lean else adapter(x)
        out.backward(grad)
        results.append([out, src.grad] + [p.grad for p in adapter.parameters()])
    for got, want in zip(*results):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_forward_after_norm_matches_autograd_and_saves_less():
    adapter, norm = _adapter_and_norm(channels=32, hidden=4)
    reference = copy.deepcopy(adapter)
    source = torch.randn(2, 9, 7, 32)
    grad = torch.randn(2, 9, 7, 32)

    def run(module, lean):
        src = source.clone().requires_grad_(True)
        saved = {}
        skip = {p.data_ptr() for p in [*module.parameters(), *norm.parameters()]}
        skip.add(src.untyped_storage().data_ptr())  # the norm keeps it anyway

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in skip:
                saved[storage.data_ptr()] = t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = norm(src)
            out = module.forward_after_norm(x, src, norm) if lean else module(x)
        out.backward(grad)
        return out, src.grad, [p.grad for p in module.parameters()], sum(saved.values())

    out, grad_src, grads, saved = run(adapter, lean=True)
    ref_out, ref_grad_src, ref_grads, ref_saved = run(reference, lean=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(grad_src, ref_grad_src)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref)
    tokens = 2 * 9 * 7
    # both: the norm's mean and rstd (1 + 1 per token). Autograd also keeps the
    # normed input (C) and three bottleneck tensors (3r); the lean path only
    # the convolution's input and output (2r)
    assert ref_saved == tokens * (2 + 32 + 3 * 4)
    assert saved == tokens * (2 + 2 * 4)


def test_forward_after_norm_falls_back_without_grad():
    adapter, norm = _adapter_and_norm()
    source = torch.randn(1, 3, 3, 6)
    with torch.no_grad():
        lean = adapter.forward_after_norm(norm(source), source, norm)
        torch.testing.assert_close(lean, adapter(norm(source)))


@pytest.mark.parametrize('source_dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_forward_after_norm_under_autocast(dtype, source_dtype):
    """Mixed precision (CPU autocast): the adapter computes in float32, its
    parameters' dtype, as autograd's plain forward does (no cast of a weight
    or of a float32 input), and the norm it recomputes with autocast off never
    mixes dtypes, which CUDA refuses (tests/dtype_check.py). A Swin's residual
    stream is float32 after a norm and low precision after a linear layer
    (PatchMerging): both reach it; the gradient returns in the input's dtype."""
    adapter, norm = _adapter_and_norm(channels=16, hidden=4)
    source = torch.randn(2, 5, 6, 16, dtype=source_dtype)
    results = []
    for lean in (True, False):
        src = source.clone().requires_grad_(True)
        adapter.zero_grad()
        with cuda_dtype_rules():
            with torch.autocast('cpu', dtype=dtype):
                x = norm(src)
                out = adapter.forward_after_norm(x, src, norm) if lean else adapter(x)
            out.float().square().sum().backward()
        results.append((out, src.grad, [p.grad.clone() for p in adapter.parameters()]))
    (out, grad_src, grads), (ref, ref_grad_src, ref_grads) = results
    assert '_ConvAdapterFunction' in out.grad_fn.name()
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref)

    def relative_error(got, want):  # over the tensor: low precision rounds elementwise
        return float((got.double() - want.double()).norm() / want.double().norm())

    assert grad_src.dtype == source_dtype
    assert relative_error(grad_src, ref_grad_src) < 1e-2
    for g, r in zip(grads, ref_grads):
        assert g.dtype == torch.float32
        assert relative_error(g, r) < 1e-2


def test_forward_after_norm_only_recomputes_a_plain_layer_norm():
    class ScaledNorm(nn.LayerNorm):  # a forward the recompute would not know
        def forward(self, x):
            return 2 * super().forward(x)

    adapter, _ = _adapter_and_norm()
    norm = ScaledNorm(6)
    src = torch.randn(1, 3, 3, 6, requires_grad=True)
    out = adapter.forward_after_norm(norm(src), src, norm)
    assert '_ConvAdapterFunction' not in out.grad_fn.name()
    torch.testing.assert_close(out, adapter(norm(src)))


def test_tokens_on_a_grid_are_the_map():
    """(B, H*W, C) tokens with their (H, W) grid give what the (B, H, W, C)
    map gives, lean and plain, values and every gradient."""
    adapter, norm = _adapter_and_norm(channels=8, hidden=3)
    source = torch.randn(2, 5, 6, 8)
    grad = torch.randn(2, 5, 6, 8)
    results = []
    for tokens in (False, True):
        for lean in (True, False):
            adapter.zero_grad()
            src = source.clone().requires_grad_(True)
            x = norm(src)
            args = (x.view(2, 30, 8), (5, 6)) if tokens else (x, None)
            out = adapter.forward_after_norm(args[0], src, norm, args[1]) if lean else \
                adapter(*args)
            assert out.shape == args[0].shape
            out.backward(grad.view(out.shape))
            results.append([out.reshape(2, 5, 6, 8), src.grad] +
                           [p.grad.clone() for p in adapter.parameters()])
    for result in results[1:]:
        for got, want in zip(result, results[0]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
