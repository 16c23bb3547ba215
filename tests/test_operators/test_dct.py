import numpy as np
import pytest
import scipy.fft
import torch

from moppa_mm.operators import dct2d, dct_basis, dct_frequencies, idct2d


@pytest.mark.parametrize('method', ['auto', 'kron', 'separable'])
@pytest.mark.parametrize('shape', [(2, 1, 9, 3), (1, 7, 7, 4), (3, 14, 14, 2),
                                   (1, 50, 68, 3), (2, 5, 1, 2), (2, 3, 7, 5, 2)])
def test_dct_matches_scipy(shape, method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    axes = (-3, -2)
    ours = dct2d(torch.from_numpy(x), method).numpy()
    ref = scipy.fft.dctn(x, type=2, axes=axes, norm='ortho')
    np.testing.assert_allclose(ours, ref, atol=1e-10, rtol=0)
    ours_inv = idct2d(torch.from_numpy(x), method).numpy()
    ref_inv = scipy.fft.idctn(x, type=2, axes=axes, norm='ortho')
    np.testing.assert_allclose(ours_inv, ref_inv, atol=1e-10, rtol=0)


def test_round_trip_is_identity_with_leading_dims():
    x = torch.randn(2, 3, 11, 6, 5, dtype=torch.float64)  # (B, nW, H, W, C)
    torch.testing.assert_close(idct2d(dct2d(x)), x, atol=1e-12, rtol=0)


def test_basis_is_cached_and_orthonormal():
    a = dct_basis(13, 'cpu', torch.float64)
    assert dct_basis(13, 'cpu', torch.float64) is a
    torch.testing.assert_close(a @ a.t(), torch.eye(13, dtype=torch.float64))
    assert dct_basis(13, 'cpu', torch.float32).dtype == torch.float32


def test_frequencies():
    omega_sq, omega_abs = dct_frequencies(4, 6, dtype=torch.float64)
    assert omega_sq.shape == (4, 6)
    assert omega_sq[0, 0] == 0
    assert torch.isclose(omega_sq[3, 5], torch.tensor((np.pi * 3 / 4)**2 +
                                                      (np.pi * 5 / 6)**2,
                                                      dtype=torch.float64))
    torch.testing.assert_close(omega_abs**2, omega_sq)


def test_autograd_through_dct():
    x = torch.randn(1, 3, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: idct2d(dct2d(t) * 2.0), (x, ))


def test_auto_method_is_chosen_per_device_type():
    """Kronecker up to 8x8 on CPU, up to 14x14 on CUDA (a device object is
    enough: no GPU is needed to resolve it); unmeasured types take CPU's."""
    from moppa_mm.operators.dct import KRON_MAX_TOKENS, dct_method
    assert KRON_MAX_TOKENS == {'cpu': 64, 'cuda': 196}
    for device in ('cpu', torch.device('cpu'), 'mps'):
        assert dct_method(8, 8, device) == 'kron'
        assert dct_method(9, 8, device) == 'separable'
    for device in ('cuda', torch.device('cuda', 1)):
        assert dct_method(14, 14, device) == 'kron'
        assert dct_method(15, 14, device) == 'separable'
    assert dct_method(50, 50, 'cuda', 'kron') == 'kron'
    assert dct_method(2, 2, 'cuda', 'separable') == 'separable'


def test_kron_basis_is_the_separable_transform_and_passes_extra_tokens():
    from moppa_mm.operators import dct as dct_module
    small = torch.randn(2, 7, 7, 3, dtype=torch.float64)
    basis = dct_module.kron_basis(7, 7, device='cpu', dtype=torch.float64)
    assert dct_module.kron_basis(7, 7, device='cpu', dtype=torch.float64) is basis
    expected = (basis @ small.reshape(2, 49, 3)).reshape(small.shape)
    torch.testing.assert_close(dct2d(small, 'separable'), expected)
    # one leading token (a class token) passes unchanged, the grid is transformed
    tokens = torch.randn(2, 1 + 49, 3, dtype=torch.float64)
    for inverse, transform in ((False, dct2d), (True, idct2d)):
        out = dct_module.dct_tokens(tokens, (7, 7), 'kron', inverse=inverse, extra=1)
        torch.testing.assert_close(out[:, :1], tokens[:, :1], atol=0, rtol=0)
        torch.testing.assert_close(out[:, 1:], transform(tokens[:, 1:].reshape(2, 7, 7, 3),
                                                         'separable').reshape(2, 49, 3))
    with pytest.raises(ValueError, match='separable DCT takes the grid tokens alone'):
        dct_module.dct_tokens(tokens, (7, 7), 'separable', extra=1)
    with pytest.raises(ValueError, match=r'expected \(B, 1 \+ 7\*6, C\) tokens'):
        dct_module.dct_tokens(tokens, (7, 6), extra=1)


def test_bases_take_autocasts_dtype():
    """Under autocast the bases come in autocast's dtype, so that the matmul
    casts the activations alone (no cast of the basis at every call)."""
    x = torch.randn(2, 7, 7, 4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = dct2d(x)
    assert out.dtype == torch.bfloat16
    from moppa_mm.operators.dct import kron_basis
    assert kron_basis(7, 7, device='cpu', dtype=torch.bfloat16).dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dct2d(x), atol=0.05, rtol=0.02)


def test_bad_input():
    with pytest.raises(ValueError, match='channel-last'):
        dct2d(torch.randn(4, 4))
    with pytest.raises(ValueError, match="unknown DCT method 'fft'"):
        dct2d(torch.randn(1, 4, 4, 2), 'fft')
    with pytest.raises(ValueError, match='>= 1'):
        dct_basis(0)
