"""``init_mode`` and ``heat_param`` of :class:`MoPPAUnit`."""
import math

import numpy as np
import pytest
import scipy.fft
import torch
import torch.nn.functional as F

from moppa_mm.operators import MoPPAUnit
from tests.test_operators.reference import expert_terms, parameter_counts


def cosine_mode(h, w, n, m, channels):
    """A single orthonormal DCT-II mode (n, m) on every channel, (1, H, W, C)."""
    spectrum = np.zeros((1, h, w, channels))
    spectrum[0, n, m, :] = 1.0
    return scipy.fft.idctn(spectrum, type=2, axes=(1, 2), norm='ortho')


def randomised(unit, low=-0.5, high=0.9):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in unit.parameters():
            p.uniform_(low, high)
    return unit


@pytest.mark.parametrize('experts', [('heat', 'wave', 'poisson'), ('heat', ),
                                     ('wave', 'poisson'), ('poisson', )])
@pytest.mark.parametrize('heat_param', ['raw', 'softplus'])
def test_identity_init_returns_input(experts, heat_param):
    torch.manual_seed(0)
    unit = MoPPAUnit(64, 4, (7, 7), experts=experts, init_mode='identity',
                     heat_param=heat_param)
    x = torch.randn(2, 7, 7, 64)
    torch.testing.assert_close(unit(x), x, rtol=0, atol=1e-5)
    with torch.no_grad():  # the cached eval path too
        torch.testing.assert_close(unit.eval()(x), x, rtol=0, atol=1e-5)


def test_paper_init_scales_input_by_router():
    """The behaviour 'identity' fixes: about 2/3 X at init."""
    torch.manual_seed(0)
    unit = MoPPAUnit(64, 4, (7, 7), init_mode='paper')
    x = torch.randn(2, 7, 7, 64)
    assert (unit(x) - x).norm() / x.norm() > 0.25
    assert not hasattr(unit, 'gate')


@pytest.mark.parametrize('heat_param', ['raw', 'softplus'])
def test_identity_init_every_parameter_moves_under_adamw(heat_param):
    torch.manual_seed(0)
    unit = MoPPAUnit(16, 2, (5, 6), init_mode='identity', heat_param=heat_param)
    before = {n: p.detach().clone() for n, p in unit.named_parameters()}
    optimizer = torch.optim.AdamW(unit.parameters(), lr=1e-2, weight_decay=0)
    x = torch.randn(4, 5, 6, 16)
    target = torch.randn(4, 5, 6, 16)
    for _ in range(3):
        optimizer.zero_grad()
        F.mse_loss(unit(x), target).backward()
        optimizer.step()
    for name, param in unit.named_parameters():
        moved = (param.detach() - before[name]).abs() > 0
        if name == 'frequency_maps':  # (E, H, W, N)
            # k and c multiply w = 0 at the DC term, in any init_mode
            rows = [unit.experts.index(e) for e in ('heat', 'wave') if e in unit.experts]
            assert not moved[rows, 0, 0].any()
            moved[rows, 0, 0] = True
        assert moved.all(), f'{name}: {int((~moved).sum())} entries unmoved'


def test_gate_one_is_the_paper_unit():
    """``X + g (Y_Eq11 - X)`` at g = 1 is Eq. 11 exactly."""
    paper = randomised(MoPPAUnit(6, 3, (5, 7), init_mode='paper').double())
    identity = MoPPAUnit(6, 3, (5, 7), init_mode='identity').double()
    state = dict(paper.state_dict(), gate=torch.ones(2, dtype=torch.float64))
    identity.load_state_dict(state)
    x = torch.randn(2, 5, 7, 6, dtype=torch.float64)
    torch.testing.assert_close(identity(x), paper(x))
    # and halfway it is the average of X and Eq. 11
    with torch.no_grad():
        identity.gate.fill_(0.5)
    torch.testing.assert_close(identity(x), (x + paper(x)) / 2)


@pytest.mark.parametrize('n,m', [(0, 0), (1, 3), (4, 6)])
def test_softplus_heat_decays_single_mode_exactly(n, m):
    """Closed form: a cosine mode decays by exp(-softplus(k) w^2 softplus(t)),
    never grows, even where the raw parameters are negative."""
    h, w = 5, 7
    unit = randomised(MoPPAUnit(6, 3, (h, w), experts=('heat', ),
                                heat_param='softplus').double(), -3.0, 1.0)
    x = torch.from_numpy(cosine_mode(h, w, n, m, 6))
    y = unit(x).detach().numpy()
    omega_sq = (math.pi * n / h)**2 + (math.pi * m / w)**2
    k, t = (np.log1p(np.exp(p.detach().numpy())) for p in unit.expert_maps('heat'))
    k = k[n, m, :]  # (N,); t: (C/N,)
    decay = np.exp(-k[:, None] * omega_sq * t[None, :]).reshape(-1)  # (C,)
    np.testing.assert_allclose(y, x.numpy() * decay, atol=1e-12)
    assert (decay <= 1).all()


def test_raw_heat_amplifies_when_kt_negative_softplus_does_not():
    h, w = 6, 6
    for heat_param, grows in (('raw', True), ('softplus', False)):
        unit = MoPPAUnit(4, 2, (h, w), experts=('heat', ), heat_param=heat_param)
        with torch.no_grad():  # k t = -4, as fine-tuning at lr 0.1 reached
            k, t = unit.expert_maps('heat')
            k.fill_(-4.0)
            t.fill_(1.0)
        heat = expert_terms(unit)['heat']
        assert bool((heat > 1).any()) == grows, heat_param
        assert (heat <= 1).all() or grows


def test_softplus_starts_at_the_raw_init():
    """Same seed, same k and t: the parameterisation alone differs."""
    torch.manual_seed(0)
    raw = MoPPAUnit(8, 2, (4, 5))
    torch.manual_seed(0)
    soft = MoPPAUnit(8, 2, (4, 5), heat_param='softplus')
    (soft_k, soft_t), (raw_k, raw_t) = soft.expert_maps('heat'), raw.expert_maps('heat')
    torch.testing.assert_close(F.softplus(soft_k), raw_k, rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(F.softplus(soft_t), raw_t)
    x = torch.randn(2, 4, 5, 8)
    torch.testing.assert_close(soft(x), raw(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('share_time', [False, True])
def test_gradcheck_identity_softplus(share_time):
    unit = randomised(MoPPAUnit(4, 2, (3, 4), init_mode='identity',
                                heat_param='softplus', share_time=share_time).double())
    names, params = zip(*unit.named_parameters())
    assert 'gate' in names
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    grid_x = torch.randn(1, 5, 6, 4, dtype=torch.float64)  # through resizing

    def run(inp, *ps):
        return torch.func.functional_call(unit, dict(zip(names, ps)), (inp, ))

    assert torch.autograd.gradcheck(run, (x, *params))
    assert torch.autograd.gradcheck(lambda *ps: run(grid_x, *ps), params)


def test_gate_parameter_count():
    paper = MoPPAUnit(768, 12, (14, 14))
    identity = MoPPAUnit(768, 12, (14, 14), init_mode='identity')
    assert parameter_counts(identity)['gate'] == 768 // 12
    assert parameter_counts(paper)['gate'] == 0
    assert (sum(p.numel() for p in identity.parameters()) -
            sum(p.numel() for p in paper.parameters())) == 64


def test_bad_options():
    with pytest.raises(ValueError, match='init_mode'):
        MoPPAUnit(4, 2, 4, init_mode='zero')
    with pytest.raises(ValueError, match='heat_param'):
        MoPPAUnit(4, 2, 4, heat_param='exp')
