"""psi_mp closed form against quadrature, SVD sampling (appendix G.1) and the paper's numbers."""

import math

import numpy as np
import pytest
from scipy import integrate

from nsc_prune.core.capacity import LOG_SNR_ASYMPTOTIC, init_std, psi_mp, psi_mp_quad, psi_weights, shannon_transform_mp
from nsc_prune.errors import InvalidInputError

SIZES = [1, 2, 7, 64, 513, 4096, 11008, 100_000]
STDS = [1e-3, 0.02, 0.3, 1.0, 10.0]


def psi_reference(m: int, n: int, std: float) -> float:
    """Independent quadrature: substitute lambda = (1+g) + 2 sqrt(g) cos(t) so the MP density's
    square-root edges become a smooth integrand on [0, pi]."""
    big, small = max(m, n), min(m, n)
    g, snr = small / big, big * std**2
    c, r = 1.0 + g, 2.0 * math.sqrt(g)

    def integrand(t: float) -> float:
        lam = c + r * math.cos(t)
        return math.log1p(snr * lam) * (r * math.sin(t)) ** 2 / (2.0 * math.pi * g * lam)

    value, _ = integrate.quad(integrand, 0.0, math.pi, epsabs=0.0, epsrel=2e-14, limit=200)
    return small * value


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("n", SIZES)
def test_closed_form_equals_quadrature(m, n):
    stds = STDS + [init_std(m, n, "xavier"), init_std(m, n, "kaiming")]
    closed = psi_mp(np.full(len(stds), m), np.full(len(stds), n), np.array(stds))
    for value, std in zip(closed, stds):
        assert value == pytest.approx(psi_reference(m, n, std), rel=1e-10, abs=0)
        assert value == pytest.approx(psi_mp_quad(m, n, std), rel=1e-10, abs=0)


def test_paper_appendix_b_numbers():
    # Appendix B(b): 2000x2000 Xavier ~ 1,161 and 4000x1000 Xavier ~ 909 (Jensen bounds 1386 and 956).
    square = psi_mp(2000, 2000, init_std(2000, 2000, "xavier"))
    tall = psi_mp(4000, 1000, init_std(4000, 1000, "xavier"))
    assert round(square) == 1161 and round(tall) == 909
    assert square < 2000 * math.log(2) and tall < 1000 * math.log(2.6)


def test_symmetric_and_replica_homogeneous():
    rng = np.random.default_rng(0)
    m, n = rng.integers(1, 5000, 200), rng.integers(1, 5000, 200)
    s = rng.uniform(0.001, 2.0, 200)
    assert np.array_equal(psi_mp(m, n, s), psi_mp(n, m, s))
    # psi_mp(k m, k n, s / sqrt k) = k psi_mp(m, n, s): it depends only on (N, gamma, M s^2).
    for k in (2, 3, 10):
        np.testing.assert_allclose(psi_mp(k * m, k * n, s / np.sqrt(k)), k * psi_mp(m, n, s), rtol=1e-12)


def test_single_row_is_exact():
    # N = 1, M -> inf: the one squared singular value concentrates at M s^2, psi = ln(1 + M s^2).
    for k, s in [(10**4, 0.5), (10**5, 0.02), (10**7, 0.01)]:
        assert psi_mp(1, k, s) == pytest.approx(math.log1p(k * s * s), rel=1e-3)
    assert shannon_transform_mp(1e-15, 3.0) == pytest.approx(math.log1p(3.0), rel=1e-12)


def test_strictly_concave_in_each_dimension():
    # Appendix E, Proposition: n -> psi_mp(n, m, s) is strictly concave for fixed m and s.
    n = np.arange(1, 8193, 7)
    for m in (1, 64, 512, 4096):
        for s in (0.02, 0.1, 1.0):
            second = np.diff(psi_mp(n, m, s), 2)
            assert np.all(second < 0), (m, s)
            second_m = np.diff(psi_mp(m, n, s), 2)
            assert np.all(second_m < 0)


def test_marginal_gain_table_appendix_e():
    # Table: d psi / d d_ff at d_ff = 512 (forward difference, step 128), s = 0.02.
    expected_at_512 = {128: 0.041, 256: 0.081, 384: 0.120, 512: 0.158, 640: 0.195, 768: 0.231, 1024: 0.300}
    grid = np.arange(512, 4097, 128)  # 29 points: 27 second differences per curve, 189 in all
    for d_model, gain in expected_at_512.items():
        assert (psi_mp(640, d_model, 0.02) - psi_mp(512, d_model, 0.02)) / 128 == pytest.approx(gain, abs=5e-4)
        assert np.all(np.diff(psi_mp(grid, d_model, 0.02), 2) < 0)


EXPECTED_REL_ERR = {32: 4.2e-3, 64: 1.9e-3, 128: 1.3e-3, 256: 5.1e-4}  # appendix G.1 table, "overall"


@pytest.mark.parametrize("small", sorted(EXPECTED_REL_ERR))
def test_matches_svd_of_gaussian_matrices(small):
    # Protocol of appendix G.1: K = 20 samples, gamma in {1, .5, .25}, three init conventions.
    rng = np.random.default_rng(small)
    errors = []
    for gamma in (1.0, 0.5, 0.25):
        big = int(small / gamma)
        for init in ("xavier", "kaiming", 0.02):
            s = init_std(big, small, init)
            sampled = np.mean([psi_weights(rng.normal(0.0, s, (big, small))) for _ in range(20)])
            errors.append(abs(psi_mp(big, small, s) - sampled) / sampled)
    assert max(errors) < 2e-2
    assert np.mean(errors) < 2 * EXPECTED_REL_ERR[small]


def test_psi_weights_known_spectrum():
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(50, 30)))
    assert psi_weights(3.0 * q) == pytest.approx(30 * math.log(10.0), rel=1e-12)
    assert psi_weights(np.zeros((4, 9))) == 0.0


def test_psi_weights_torch_equals_numpy():
    torch = pytest.importorskip("torch")
    w = np.random.default_rng(2).normal(0, 0.1, (40, 70))
    assert psi_weights(torch.tensor(w, dtype=torch.float32)) == pytest.approx(psi_weights(w), rel=1e-5)
    with pytest.raises(InvalidInputError, match="needs a matrix of numbers; got dtype torch.bool"):  # was 2.3026
        psi_weights(torch.ones(3, 3, dtype=torch.bool))


def test_a_numpy_std_is_read_without_a_warning():
    """np.float32(0.02) warned "overflow encountered in cast" (a float32 compared with float's largest): an error
    under -W error or pytest's filterwarnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert init_std(4, 4, np.float32(0.02)) == pytest.approx(0.02)
        assert init_std(4, 4, np.float16(0.02)) == pytest.approx(0.02, rel=1e-3)
    with pytest.raises(InvalidInputError, match="positive finite"):
        init_std(3, 3, 10**400)


def test_init_conventions():
    assert init_std(100, 300, "xavier") == pytest.approx(math.sqrt(2 / 400))
    assert init_std(100, 300, "kaiming") == pytest.approx(math.sqrt(2 / 300))
    assert init_std(100, 300, 0.02) == 0.02
    with pytest.raises(InvalidInputError, match="init must be one of"):
        init_std(3, 3, "orthogonal")
    with pytest.raises(InvalidInputError, match="positive finite"):
        init_std(3, 3, -1.0)
    for huge in (10**400, -(10**400)):  # an OverflowError from math.isfinite
        with pytest.raises(InvalidInputError, match="init std must be a positive finite number; got -?1000"):
            init_std(3, 3, huge)
    assert init_std(3, 3, 2) == 2.0 and isinstance(init_std(3, 3, 2), float)


@pytest.mark.parametrize(
    "m, n, s, match",
    [
        (0, 5, 0.1, "m must be > 0"),
        (-3, 5, 0.1, "m must be > 0"),
        (5, float("nan"), 0.1, "n must be finite"),
        (5, float("inf"), 0.1, "n must be finite"),
        (2.5, 5, 0.1, "m must be whole numbers"),
        (5, 5, 0.0, "std must be > 0"),
        (5, 5, float("nan"), "std must be finite"),
        (5, 5, "big", "std must be a number"),
    ],
)
def test_bad_input_raises(m, n, s, match):
    with pytest.raises(InvalidInputError, match=match):
        psi_mp(m, n, s)


def test_bad_weights_raise():
    with pytest.raises(InvalidInputError, match="2-D"):
        psi_weights(np.ones(3))
    with pytest.raises(InvalidInputError, match="NaN"):
        psi_weights(np.array([[1.0, np.nan]]))
    with pytest.raises(InvalidInputError, match="real matrix"):
        psi_weights(np.ones((2, 2), dtype=complex))
    with pytest.raises(
        InvalidInputError, match=r"weight must be a number or an array of numbers; got \[\[1, 2\], \[3\]\]"
    ):
        psi_weights([[1, 2], [3]])  # a ragged list: numpy's own ValueError about an inhomogeneous shape


def test_bad_torch_weights_raise():
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidInputError, match="NaN"):
        psi_weights(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(InvalidInputError, match="real matrix"):
        psi_weights(torch.ones((2, 2), dtype=torch.complex64))


@pytest.mark.parametrize("m, n", [(4096, 4096), (4096, 11008), (1, 5000), (300, 7)])
def test_huge_std_follows_the_asymptote_without_overflow(m, n):
    # Past snr ~ 1e100 psi_mp switches to N (ln snr + E[ln X]); both sides of the switch agree,
    # and std far beyond where snr = M s^2 overflows float64 stays finite and exact in ln(std).
    big, small = max(m, n), min(m, n)
    s_switch = math.exp((LOG_SNR_ASYMPTOTIC - math.log(big)) / 2)
    below, above = psi_mp(m, n, s_switch * (1 - 1e-9)), psi_mp(m, n, s_switch * (1 + 1e-9))
    assert above - below == pytest.approx(2 * small * (math.log1p(1e-9) - math.log1p(-1e-9)), abs=1e-12 * below)
    stds = np.array([1e100, 1e160, 1e300])
    values = psi_mp(m, n, stds)
    assert np.all(np.isfinite(values))
    assert np.diff(values) == pytest.approx(2 * small * np.diff(np.log(stds)), rel=1e-12)


def test_init_std_rejects_bad_sizes():
    for rows, cols, match in [
        (0, 0, "rows must be > 0"),
        (float("nan"), 5, "rows must be finite"),
        (3, -5, "cols must be > 0"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            init_std(rows, cols, "xavier")


SCALAR_GRID_STDS = [1e-300, 1e-12, 1e-4, 0.02, 0.5, 1.0, 3.0, 1e20, 1e100, 1e160, 1e300, 7]


@pytest.mark.parametrize(
    "m, n", [(1, 1), (1, 5000), (7, 1), (2, 3), (300, 7), (768, 3072), (4096, 4096), (4096, 11008)]
)
def test_scalar_fast_path_equals_vectorised_path(m, n, monkeypatch):
    # Python ints and floats take the math fast path (it must skip the array checks), and it agrees with
    # the vectorised path on a 1-element array across tiny, ordinary, switch-side and huge std (asymptote).
    big = max(m, n)
    s_switch = math.exp((LOG_SNR_ASYMPTOTIC - math.log(big)) / 2)
    stds = [*SCALAR_GRID_STDS, s_switch * (1 - 1e-12), s_switch * (1 + 1e-12), init_std(m, n, "xavier")]
    expected = [float(psi_mp(np.array([m]), np.array([n]), np.array([s]))[0]) for s in stds]

    def no_array_path(*args):
        raise AssertionError("scalar psi_mp went through the array path")

    monkeypatch.setattr("nsc_prune.core.capacity._as_float_array", no_array_path)
    for s, want in zip(stds, expected):
        got = psi_mp(m, n, s)
        assert type(got) is float
        assert got == pytest.approx(want, rel=4e-15, abs=0.0), (m, n, s)  # numpy 1.x's SIMD log: 2e-15 off


@pytest.mark.parametrize(
    "m, n, s",
    [
        (0, 5, 0.1),
        (-3, 5, 0.1),
        (5, -1, 0.1),
        (5, 5, 0.0),
        (5, 5, -0.1),
        (5, 5, float("nan")),
        (5, 5, float("inf")),
        (5, 5, "big"),
        (2.5, 5, 0.1),
        (5, float("nan"), 0.1),
        (5, 5, None),
    ],
)
def test_scalar_errors_are_the_array_path_errors(m, n, s, monkeypatch):
    # Bad scalars raise exactly the error (type and message) of the checked path without the fast path.
    with pytest.raises(InvalidInputError) as scalar_err:
        psi_mp(m, n, s)
    monkeypatch.setattr("nsc_prune.core.capacity._is_plain_scalar", lambda *args: False)
    with pytest.raises(InvalidInputError) as checked_err:
        psi_mp(m, n, s)
    assert str(scalar_err.value) == str(checked_err.value)
    assert "must be" in str(scalar_err.value)


@pytest.mark.parametrize(
    "args, message",
    [
        ((True, 4, 0.5), "m must be a number"),
        ((4, 4, True), "std must be a number"),
        (("10", 4, 0.5), "m must be a number"),
        ((np.array([True]), 4, 0.5), "m must be a number"),
        ((None, 4, 0.5), "m must be a number"),
        ((2**1100, 4, 0.5), "m is too large"),
        (([1, 2, 3], [1, 2], 0.5), "must broadcast together"),
    ],
)
def test_psi_mp_refuses_what_is_not_a_size_naming_the_argument(args, message):
    with pytest.raises(InvalidInputError, match=message):
        psi_mp(*args)


def test_init_std_refuses_a_bool_and_checks_the_shape_whatever_the_init():
    with pytest.raises(InvalidInputError, match="init must be one of"):
        init_std(10, 10, True)
    with pytest.raises(InvalidInputError, match="rows must be > 0"):
        init_std(-1, 4, 0.02)
    assert init_std(4, 8, 0.02) == 0.02


def test_huge_int_still_follows_the_array_path():
    assert psi_mp(2**60, 3, 1e-9) == pytest.approx(
        float(psi_mp(np.array([2.0**60]), np.array([3]), np.array([1e-9]))[0])
    )


def test_psi_weights_stays_finite_where_sigma_squared_overflows():
    expected = 2 * math.log(1e200) + math.log1p(1e-400) + math.log(2.0)  # ln(1 + 1e400) + ln(1 + 1)
    assert psi_weights(np.diag([1e200, 1.0, 0.0])) == pytest.approx(expected, rel=1e-15)
