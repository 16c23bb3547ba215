import math
import types

import numpy as np
import pytest
import scipy.fft
import torch

from moppa_mm.operators import (MoPPAUnit, dct2d, idct2d, resize_frequency_map, route_loss_weight,
                                route_regularization)
from tests.test_operators.reference import expert_terms, parameter_counts


def make_unit(h=5, w=7, dims=6, heads=3, **kwargs):
    torch.manual_seed(0)
    unit = MoPPAUnit(dims, heads, (h, w), **kwargs).double()
    with torch.no_grad():  # move away from the near-identity init
        for p in unit.parameters():
            p.uniform_(-0.5, 0.9)
    return unit


def cosine_mode(h, w, n, m, channels):
    """A single orthonormal DCT-II mode (n, m) on every channel, (1, H, W, C)."""
    spectrum = np.zeros((1, h, w, channels))
    spectrum[0, n, m, :] = 1.0
    return scipy.fft.idctn(spectrum, type=2, axes=(1, 2), norm='ortho')


@pytest.mark.parametrize('n,m', [(0, 0), (1, 3), (4, 6), (2, 0)])
def test_heat_decays_single_mode_exactly(n, m):
    h, w = 5, 7
    unit = make_unit(h, w, experts=('heat', ))
    x = torch.from_numpy(cosine_mode(h, w, n, m, 6))
    y = unit(x).detach().numpy()
    omega_sq = (math.pi * n / h)**2 + (math.pi * m / w)**2
    k, t = (p.detach().numpy() for p in unit.expert_maps('heat'))  # (H, W, N), (C/N,)
    k = k[n, m, :]  # (N,)
    decay = np.exp(-k[:, None] * omega_sq * t[None, :]).reshape(-1)  # (C,)
    # a single expert: the router weight is 1
    np.testing.assert_allclose(y, x.numpy() * decay, atol=1e-12)


@pytest.mark.parametrize('n,m', [(0, 2), (3, 3), (4, 1)])
def test_wave_oscillates_single_mode_exactly(n, m):
    h, w = 5, 7
    unit = make_unit(h, w, experts=('wave', ))
    x = torch.from_numpy(cosine_mode(h, w, n, m, 6))
    y = unit(x).detach().numpy()
    omega = math.sqrt((math.pi * n / h)**2 + (math.pi * m / w)**2)
    c, t = (p.detach().numpy() for p in unit.expert_maps('wave'))
    c = c[n, m, :]
    factor = np.cos(c[:, None] * omega * t[None, :]).reshape(-1)
    np.testing.assert_allclose(y, x.numpy() * factor, atol=1e-12)


def test_poisson_field_matches_independent_computation():
    h, w, dims, heads = 6, 4, 8, 2
    unit = make_unit(h, w, dims, heads, experts=('poisson', ))
    x = torch.randn(2, h, w, dims, dtype=torch.float64)
    y = unit(x).detach().numpy()
    h1, h2 = (p.detach().numpy() for p in unit.expert_maps('poisson'))  # (H, W, N), (C/N,)
    source = np.einsum('hwn,d->hwnd', h1, h2).reshape(h, w, dims)
    wy, wx = np.meshgrid(np.pi * np.arange(h) / h, np.pi * np.arange(w) / w,
                         indexing='ij')
    field = source / ((wy**2 + wx**2)[..., None] + 1e-3)
    expected = scipy.fft.idctn(field, type=2, axes=(0, 1), norm='ortho')
    # Poisson alone ignores X (Eq. 9): the output is the potential field.
    np.testing.assert_allclose(y, np.broadcast_to(expected, y.shape), atol=1e-10)


def test_fused_unit_equals_sum_of_experts():
    """Eq. 11 (one filter, one field) equals Eq. 10 (three round trips)."""
    unit = make_unit(5, 7, 6, 3)
    x = torch.randn(3, 5, 7, 6, dtype=torch.float64)
    terms = expert_terms(unit)
    a = unit.route_weights()
    heat = idct2d(dct2d(x) * terms['heat'])
    wave = idct2d(dct2d(x) * terms['wave'])
    poisson = idct2d(terms['poisson'].expand_as(x))
    expected = a[0] * heat + a[1] * wave + a[2] * poisson
    torch.testing.assert_close(unit(x), expected, atol=1e-12, rtol=0)


def test_backward_under_autocast_matches_float32():
    """Mixed precision: the spectral filter's own backward copes with a
    low-precision spectrum and a float32 filter (CPU autocast, bfloat16)."""
    torch.manual_seed(0)
    unit = MoPPAUnit(16, 2, (7, 7))
    x = torch.randn(3, 7, 7, 16)
    grads = []
    for autocast in (True, False):
        unit.zero_grad()
        inp = x.clone().requires_grad_(True)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            out = unit(inp)
        out.float().square().sum().backward()
        grads.append([inp.grad] + [p.grad for p in unit.parameters()])
    for low, full in zip(*grads):
        assert low.dtype == torch.float32
        torch.testing.assert_close(low, full, rtol=5e-2, atol=5e-2)


def test_gradcheck_every_parameter():
    unit = make_unit(3, 4, 4, 2)
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    names, params = zip(*unit.named_parameters())
    assert names == ('frequency_maps', 'channel_maps', 'route_logits')

    def run(inp, *ps):
        state = dict(zip(names, ps))
        return torch.func.functional_call(unit, state, (inp, ))

    assert torch.autograd.gradcheck(run, (x, *params))


def test_gradcheck_through_resizing():
    unit = make_unit(3, 4, 4, 2)
    x = torch.randn(1, 5, 6, 4, dtype=torch.float64)
    names, params = zip(*unit.named_parameters())

    def run(*ps):
        return torch.func.functional_call(unit, dict(zip(names, ps)), (x, ))

    assert torch.autograd.gradcheck(run, params)


@pytest.mark.parametrize('share_time', [False, True])
def test_parameter_counts_follow_formulas(share_time):
    h, w, dims, heads = 14, 14, 768, 12
    unit = MoPPAUnit(dims, heads, (h, w), share_time=share_time)
    L, N, D = h * w, heads, dims
    counts = parameter_counts(unit)
    print('\nMoPPA unit 14x14x768, 12 heads:', counts, 'total', sum(counts.values()))
    assert counts['heat'] == L * N + D // N
    assert counts['wave'] == L * N + (0 if share_time else D // N)
    assert counts['poisson'] == L * N + D // N  # instead of L * D
    assert counts['router'] == 3
    assert sum(counts.values()) == sum(p.numel() for p in unit.parameters())


def test_initialisation_is_near_identity_scaled_by_router():
    """At init heat ~ wave ~ 1, the field ~ 0 and the router uniform: the unit
    returns about (a1 + a2) X = 2/3 X (documented; backbones report the drift)."""
    torch.manual_seed(0)
    unit = MoPPAUnit(64, 4, (7, 7))
    torch.testing.assert_close(unit.route_weights(), torch.full((3, ), 1 / 3))
    x = torch.randn(2, 7, 7, 64)
    rel = (unit(x) - 2 / 3 * x).norm() / (2 / 3 * x).norm()
    assert rel < 0.15, rel
    # the wave expert is not stuck at its stationary point c = 0
    unit(x).sum().backward()
    wave = unit.experts.index('wave')
    assert unit.frequency_maps.grad[wave].abs().sum() > 0
    assert unit.channel_maps.grad[wave].abs().sum() > 0


def count_filter_builds(unit):
    """Wrap the unit's ``filter_and_field``; returns a list that grows by one
    entry per build."""
    builds = []
    build = unit.filter_and_field

    def counted(*args, **kwargs):
        builds.append(args)
        return build(*args, **kwargs)

    unit.filter_and_field = counted  # an instance attribute: forward finds it first
    return builds


def test_eval_caches_filter_until_parameters_change():
    unit = make_unit(5, 7, 6, 3).eval()
    builds = count_filter_builds(unit)
    x = torch.randn(2, 5, 7, 6, dtype=torch.float64)
    with torch.no_grad():
        first = unit(x)
        assert len(builds) == 1
        second = unit(x)
        assert len(builds) == 1  # reused
        torch.testing.assert_close(first, second)
        unit.route_logits[0].add_(0.3)  # a parameter changes in place
        third = unit(x)
        assert len(builds) == 2
        assert not torch.allclose(first, third)
        unit(torch.randn(1, 4, 4, 6, dtype=torch.float64))  # another grid
        assert len(builds) == 3
        unit.load_state_dict({k: v + 1 for k, v in unit.state_dict().items()})
        unit(x)
        assert len(builds) == 4
    unit.train()
    unit(x)
    unit(x)
    assert len(builds) == 6  # training always rebuilds


def test_resize_is_frequency_exact():
    param = torch.randn(2, 4, 6, dtype=torch.float64)
    assert resize_frequency_map(param, (4, 6)) is param
    doubled = resize_frequency_map(param, (8, 12), mode='bicubic')
    # runtime frequency pi*2n/8 == reference frequency pi*n/4
    torch.testing.assert_close(doubled[:, ::2, ::2], param)
    assert resize_frequency_map(param, (3, 5)).shape == (2, 3, 5)
    constant = torch.full((1, 4, 4), 2.5)
    torch.testing.assert_close(resize_frequency_map(constant, (9, 2)),
                               torch.full((1, 9, 2), 2.5))


def test_route_regularization_and_schedule():
    unit = MoPPAUnit(4, 2, 3)
    # uniform router: sum a log a = log(1/3), the minimum
    assert math.isclose(route_regularization(unit).item(), math.log(1 / 3),
                        rel_tol=1e-6)
    with torch.no_grad():
        unit.route_logits.copy_(torch.tensor([5.0, 0.0, -1.0]))
    a = torch.tensor([5.0, 0.0, -1.0]).softmax(0)
    assert math.isclose(route_regularization(unit).item(),
                        (a * a.log()).sum().item(), rel_tol=1e-6)
    two = torch.nn.Sequential(unit, MoPPAUnit(4, 2, 3))
    expected = (route_regularization(unit) + math.log(1 / 3)) / 2
    torch.testing.assert_close(route_regularization(two), expected)
    assert route_loss_weight(0.5, 0, 10) == 0.5
    assert route_loss_weight(0.5, 2, 10) == pytest.approx(0.3)
    assert route_loss_weight(0.5, 5, 10) == 0
    assert route_loss_weight(0.5, 9, 10) == 0
    with pytest.raises(ValueError, match='total'):
        route_loss_weight(1, 0, 0)
    with pytest.raises(ValueError, match='holds no MoPPAUnit'):
        route_regularization(torch.nn.Linear(2, 2))


@pytest.mark.parametrize('autocast', [True, False])
def test_half_precision_builds_the_filter_in_float32(autocast):
    """With a small eta, ``a3 / (w^2 + eta)`` at the DC term (~3e5) is past
    float16's range: a float16 input, under autocast or not, must still give
    a finite output close to the float32 one, and finite gradients."""
    torch.manual_seed(0)
    unit = MoPPAUnit(8, 2, 4, eta=1e-6)
    x = torch.randn(2, 4, 4, 8)
    reference = unit(x)
    half = x.half().requires_grad_(True)
    with torch.autocast('cpu', dtype=torch.float16, enabled=autocast):
        out = unit(half)
    assert out.dtype == torch.float16 and out.isfinite().all()
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=1e-2)
    out.float().sum().backward()
    assert half.grad.isfinite().all()
    assert all(p.grad.isfinite().all() for p in unit.parameters())
    unit.eval()  # the eval cache is built in float32 too
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16, enabled=autocast):
        assert unit(half.detach()).isfinite().all()
    assert unit.filter_dtype(torch.float16) == torch.float32


def test_bad_arguments():
    with pytest.raises(ValueError, match='num_heads must be a positive int, got 0'):
        MoPPAUnit(8, 0, 4)
    with pytest.raises(ValueError, match='num_heads must be a positive int, got -2'):
        MoPPAUnit(8, -2, 4)
    with pytest.raises(ValueError, match='embed_dims must be a positive int, got 0'):
        MoPPAUnit(0, 2, 4)
    with pytest.raises(ValueError, match=r'grid_size must be positive \(H, W\), got \(0, 0\)'):
        MoPPAUnit(8, 2, 0)
    with pytest.raises(ValueError, match=r'grid_size must be positive .*\(4, -3\)'):
        MoPPAUnit(8, 2, (4, -3))
    with pytest.raises(ValueError, match=r'the input grid must be positive .*\(0, 4\)'):
        MoPPAUnit(8, 2, 4)(torch.randn(1, 0, 4, 8))
    with pytest.raises(ValueError, match='divisible by num_heads'):
        MoPPAUnit(10, 3, 4)
    with pytest.raises(ValueError, match='eta'):
        MoPPAUnit(4, 2, 4, eta=0)
    with pytest.raises(ValueError, match='resize_mode'):
        MoPPAUnit(4, 2, 4, resize_mode='area')
    with pytest.raises(ValueError, match='experts'):
        MoPPAUnit(4, 2, 4, experts=('heat', 'fire'))
    with pytest.raises(ValueError, match=r'\(\.\.\., H, W, 4\)'):
        MoPPAUnit(4, 2, 4)(torch.randn(1, 4, 4, 5))


def test_frequency_maps_saved_on_another_grid_are_resized_on_load():
    """A unit trained on a 4x4 reference grid loads into one on 6x5: k, c and
    H1 are resized exactly as :func:`resize_frequency_map` does."""
    torch.manual_seed(0)
    small = MoPPAUnit(8, 2, 4)
    big = MoPPAUnit(8, 2, (6, 5))
    saved = small.state_dict()
    big.load_state_dict(saved)  # strict
    for row, expert in enumerate(big.experts):  # k, c, H1
        expected = resize_frequency_map(saved['frequency_maps'][row].permute(2, 0, 1), (6, 5))
        torch.testing.assert_close(big.expert_maps(expert)[0], expected.permute(1, 2, 0),
                                   atol=0, rtol=0)
    for name in ('channel_maps', 'route_logits'):
        torch.testing.assert_close(getattr(big, name), saved[name], atol=0, rtol=0)
    with pytest.raises(RuntimeError, match='size mismatch for frequency_maps'):
        MoPPAUnit(8, 4, 4).load_state_dict(saved)  # other heads: not resizable


@pytest.mark.parametrize('options', [
    dict(),
    dict(init_mode='identity', heat_param='softplus', share_time=True),
    dict(experts=('wave', 'poisson')),
])
@pytest.mark.parametrize('grid', [(4, 5), (6, 3)])  # the reference grid, a resized one
def test_units_built_together_equal_each_built_alone(options, grid):
    """``unit_terms`` builds the filters and fields of alike units in one go,
    their parameters stacked: each unit gets what its own build gives, values
    and gradients; a unit not alike, a None and a switched-off unit are
    served apart; the stacked build passes gradcheck (float64, on a grid
    that resizes the frequency maps)."""
    from moppa_mm.operators import unit_terms
    units = []
    for seed in range(3):
        torch.manual_seed(seed)
        units.append(MoPPAUnit(6, 3, (4, 5), **options).double())
        with torch.no_grad():
            for p in units[-1].parameters():
                p.uniform_(-0.5, 0.9)
    other, off = make_unit(4, 5, 6, 3, experts=('heat', )), make_unit(4, 5, 6, 3)
    off.enabled = False
    units += [other, None, off]
    tokens = torch.randn(2, 1 + grid[0] * grid[1], 6, dtype=torch.float64)
    terms = unit_terms(units, grid, 1, tokens)
    assert terms[4] is None and terms[5] is None
    weights = [torch.randn(2, 1 + grid[0] * grid[1], 6, dtype=torch.float64) for _ in range(2)]

    def weighted(pairs):  # a scalar of every filter and field
        return sum((term * weight).sum() for pair in pairs for term, weight in zip(pair, weights))

    together = weighted(terms[:4])
    params = [p for unit in units[:4] for p in unit.parameters()]
    grads_together = torch.autograd.grad(together, params)
    alone = [unit._spectral_terms(grid, 1, tokens.device, tokens.dtype)
             for unit in units[:4]]
    for pair, own in zip(terms, alone):
        assert pair[0].shape == (1, 1 + grid[0] * grid[1], 6)
        for got, want in zip(pair, own):
            torch.testing.assert_close(got, want, atol=1e-14, rtol=0)
    for got, want in zip(grads_together, torch.autograd.grad(weighted(alone), params)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    names = [name for name, _ in units[0].named_parameters()]

    def build(*flat):  # the stacked build, of the three units' parameters
        holders = [types.SimpleNamespace(**dict(zip(names, flat[i:i + len(names)])))
                   for i in range(0, len(flat), len(names))]
        params = {name: torch.stack([getattr(holder, name) for holder in holders])
                  for name in names}
        return units[0]._spectral_terms(grid, 1, tokens.device, tokens.dtype, params)

    if grid != units[0].grid_size:  # once per option set, through the resizing
        flat = [p.detach().clone().requires_grad_(True) for unit in units[:3]
                for p in unit.parameters()]
        assert torch.autograd.gradcheck(build, flat)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_spectrum_recomputed_from_the_norm_input_in_mixed_precision(dtype):
    """Under autocast, a unit on ``norm(norm_input)`` handed the norm keeps no
    spectrum for its backward (one activation less; the norm keeps its input
    anyway), recomputes it, and gives the same gradients as keeping it."""
    torch.manual_seed(0)
    unit, norm = make_unit(4, 4, 16, 2).float(), torch.nn.LayerNorm(16)
    source = torch.randn(3, 1 + 16, 16)
    grad = torch.randn(3, 1 + 16, 16)
    results = []
    for recompute in (True, False):
        unit.zero_grad()
        src = source.clone().requires_grad_(True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                      lambda t: t):
            with torch.autocast('cpu', dtype=dtype):
                x = norm(src)
                out = unit(x, (4, 4), 1, None, *((src, norm) if recompute else ()))
        out.backward(grad.to(out.dtype))
        spectra = [t for t in saved if t.shape == out.shape and t.dtype == dtype]
        assert len(spectra) == (0 if recompute else 1)
        results.append([src.grad] + [p.grad for p in unit.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize('experts', [
    ('heat', 'wave', 'poisson'), ('heat', ), ('wave', 'poisson'), ('poisson', )])
@pytest.mark.parametrize('lead', [(), (3, )])
def test_the_mix_of_experts_gradient_is_autograds(experts, lead):
    """The mix's own backward (it recomputes the products) against finite
    differences, and its values and gradients against the plain path that
    compilers and exporters trace."""
    from moppa_mm.operators.moppa_unit import _MixExperts, _mix_experts
    torch.manual_seed(0)
    inputs = (torch.randn(*lead, len(experts), 4, 5, 2, dtype=torch.float64),
              torch.randn(*lead, len(experts), 3, dtype=torch.float64),
              torch.randn(*lead, len(experts), dtype=torch.float64).softmax(-1))
    inputs = [tensor.requires_grad_() for tensor in inputs]
    assert torch.autograd.gradcheck(lambda *args: _MixExperts.apply(*args, experts), inputs)
    mixed, plain = _MixExperts.apply(*inputs, experts), _mix_experts(*inputs, experts)
    outputs = [index for index in range(2) if plain[index].requires_grad]
    weights = [torch.randn_like(mixed[index]) for index in outputs]
    ours = torch.autograd.grad([mixed[i] for i in outputs], inputs, weights)
    theirs = torch.autograd.grad([plain[i] for i in outputs], inputs, weights)
    for a, b in list(zip(mixed, plain)) + list(zip(ours, theirs)):
        torch.testing.assert_close(a, b)
