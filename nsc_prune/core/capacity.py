"""Spectral capacity of weight matrices (paper section 3.1-3.2).

``psi_mp(m, n, s) = N * I(gamma, M s^2)`` is the Marchenko-Pastur spectral capacity of an
``m x n`` matrix with i.i.d. entries of standard deviation ``s`` (paper Eq. 5), with
``M = max(m, n)``, ``N = min(m, n)``, ``gamma = N / M`` and ``I`` the Shannon transform of the
Marchenko-Pastur law (Tulino & Verdu 2004, Eq. 2.121), evaluated in closed form.
``psi_weights(W) = sum_i ln(1 + sigma_i^2)`` is the same quantity from a real matrix's singular
values (paper Definition 1; the psi_W back-end of appendix G.2).

Pure numpy/scipy: this module must never import torch.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, overload

import numpy as np

from nsc_prune._validation import is_number
from nsc_prune.errors import InvalidInputError

ArrayLike = Any
INIT_SCHEMES = ("xavier", "kaiming")
# Below this std, std^2 leaves float64's normal range and psi_MP ~ m n std^2 underflows toward 0: every plan
# would score alike and the front would collapse to the narrowest one.
MIN_INIT_STD = 1e-150
# Above snr = e^230 (~1e100) ``I`` equals its asymptote ``ln snr + E[ln X]`` to far below float64
# resolution; the asymptote is evaluated from ``ln snr``, so no std overflows.
LOG_SNR_ASYMPTOTIC = 230.0


def _check_positive(name: str, value: np.ndarray, integer: bool = False) -> None:
    if not np.all(np.isfinite(value)):
        raise InvalidInputError(f"{name} must be finite; got {value[~np.isfinite(value)].ravel()[:3].tolist()}")
    if np.any(value <= 0):
        raise InvalidInputError(f"{name} must be > 0; got {value[value <= 0].ravel()[:3].tolist()}")
    if integer and np.any(value != np.round(value)):
        raise InvalidInputError(
            f"{name} must be whole numbers; got {value[value != np.round(value)].ravel()[:3].tolist()}"
        )


def _as_float_array(name: str, value: ArrayLike) -> np.ndarray:
    """``value`` as float64; refuses bools, strings and anything else that numpy would read as a number."""

    def not_a_number() -> InvalidInputError:  # built on refusal only: a large array's repr costs more than psi_mp
        return InvalidInputError(f"{name} must be a number or an array of numbers; got {value!r}")

    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise not_a_number() from err
    if raw.dtype.kind == "O" and all(is_number(v) for v in raw.ravel()):  # Python ints beyond int64
        try:
            return raw.astype(np.float64)
        except OverflowError as err:
            raise InvalidInputError(f"{name} is too large for a float; got {value!r}") from err
    if raw.dtype.kind not in "iuf":
        raise not_a_number()
    return raw.astype(np.float64)


def shannon_transform_mp(gamma: ArrayLike, snr: ArrayLike) -> np.ndarray:
    """Closed-form ``I(gamma, snr) = E[ln(1 + snr * X)]``, X ~ Marchenko-Pastur(gamma), 0 < gamma <= 1.

    Tulino-Verdu's form ``ln(1 + snr - F/4) + ln(1 + snr*gamma - F/4)/gamma - F/(4 gamma snr)``
    with ``F = (sqrt(snr(1+sqrt g)^2 + 1) - sqrt(snr(1-sqrt g)^2 + 1))^2`` loses every digit to
    cancellation when gamma or snr is small or large. With ``a, b`` the two square roots and
    ``D = a + b``, ``q = F / (4 gamma snr) = 4 snr / D^2`` and
    ``I = ln(1 + snr (1 - q gamma)) + ln(1 + snr gamma (1 - q)) / gamma - q``, where ``1 - q`` and
    ``1 - q gamma`` are rewritten as sums of positive terms (using
    ``ab - snr(1 - gamma) = (2 snr (1 + gamma) + 1) / (ab + snr (1 - gamma))``) so no subtraction
    of nearly equal numbers is left.
    """
    gamma = np.asarray(gamma, dtype=np.float64)
    snr = np.asarray(snr, dtype=np.float64)
    root = np.sqrt(gamma)
    a = np.sqrt(snr * (1.0 + root) ** 2 + 1.0)
    b = np.sqrt(snr * (1.0 - root) ** 2 + 1.0)
    d2 = (a + b) ** 2
    rest = snr * (1.0 - gamma)
    one_minus_q = 2.0 * (1.0 + (2.0 * snr * (1.0 + gamma) + 1.0) / (a * b + rest)) / d2
    one_minus_qg = 2.0 * (rest + 1.0 + a * b) / d2
    q = 4.0 * snr / d2
    return np.log1p(snr * one_minus_qg) + np.log1p(snr * gamma * one_minus_q) / gamma - q


@overload
def psi_mp(m: float, n: float, std: float) -> float: ...
@overload
def psi_mp(m: np.ndarray, n: ArrayLike, std: ArrayLike) -> np.ndarray: ...
@overload
def psi_mp(m: ArrayLike, n: ArrayLike, std: ArrayLike) -> np.ndarray | float: ...
def psi_mp(m: ArrayLike, n: ArrayLike, std: ArrayLike) -> np.ndarray | float:
    """Marchenko-Pastur spectral capacity ``N * I(N/M, M std^2)`` of an ``m x n`` matrix (Eq. 5).

    Broadcasts over numpy arrays; symmetric in ``(m, n)``. Sizes must be positive whole numbers
    (1 x k included) and ``std`` positive and finite. Returns a float for scalar input.
    """
    if _is_plain_scalar(m, n, std):
        return _psi_mp_scalar(m, n, std)
    m_arr, n_arr, s_arr = (_as_float_array(k, v) for k, v in (("m", m), ("n", n), ("std", std)))
    try:
        np.broadcast_shapes(m_arr.shape, n_arr.shape, s_arr.shape)
    except ValueError as err:
        raise InvalidInputError(
            f"m, n and std must broadcast together; got shapes {m_arr.shape}, {n_arr.shape} and {s_arr.shape}"
        ) from err
    _check_positive("m", m_arr, integer=True)
    _check_positive("n", n_arr, integer=True)
    _check_positive("std", s_arr)
    big, small = np.maximum(m_arr, n_arr), np.minimum(m_arr, n_arr)
    gamma = small / big
    log_snr = np.log(big) + 2.0 * np.log(s_arr)  # snr = M s^2 itself overflows for s > ~1e150
    huge = log_snr > LOG_SNR_ASYMPTOTIC
    snr = np.exp(np.where(huge, 0.0, log_snr))
    transform = np.where(huge, log_snr + _mean_log_mp(gamma), shannon_transform_mp(gamma, snr))
    out = small * transform
    return float(out) if out.ndim == 0 else out


_MAX_EXACT_INT = 2**53  # larger ints fall back to the checked array path, which converts them the same way


def _is_plain_scalar(m: Any, n: Any, std: Any) -> bool:
    """True when ``psi_mp``'s checks pass for plain Python scalars (int sizes, float/int std), so the
    ``math`` fast path may skip them; anything else (bad values included) goes through the array path
    and its errors."""
    return (
        type(m) is int
        and type(n) is int
        and type(std) in (float, int)
        and 0 < m <= _MAX_EXACT_INT
        and 0 < n <= _MAX_EXACT_INT
        and 0.0 < std < math.inf
    )


def _psi_mp_scalar(m: int, n: int, std: float) -> float:
    """``psi_mp`` for valid Python scalars with ``math``: the array path's operations in the same order
    (about 50x faster per call; equal to it within 4e-15 relative: numpy 1.x's SIMD log can differ from math.log
    in the last bits)."""
    big, small = float(max(m, n)), float(min(m, n))
    gamma = small / big
    log_snr = math.log(big) + 2.0 * math.log(std)
    if log_snr > LOG_SNR_ASYMPTOTIC:
        tail = (1.0 - gamma) * math.log1p(-gamma) / gamma if gamma < 1.0 else 0.0
        return small * (log_snr + (-1.0 - tail))
    snr = math.exp(log_snr)
    root = math.sqrt(gamma)
    a = math.sqrt(snr * (1.0 + root) ** 2 + 1.0)
    b = math.sqrt(snr * (1.0 - root) ** 2 + 1.0)
    d2 = (a + b) ** 2
    rest = snr * (1.0 - gamma)
    one_minus_q = 2.0 * (1.0 + (2.0 * snr * (1.0 + gamma) + 1.0) / (a * b + rest)) / d2
    one_minus_qg = 2.0 * (rest + 1.0 + a * b) / d2
    q = 4.0 * snr / d2
    return small * (math.log1p(snr * one_minus_qg) + math.log1p(snr * gamma * one_minus_q) / gamma - q)


def _mean_log_mp(gamma: np.ndarray) -> np.ndarray:
    """``E[ln X]`` for X ~ Marchenko-Pastur(gamma): ``-1 - (1 - gamma) ln(1 - gamma) / gamma``
    (``-1`` at gamma = 1), so that ``I(gamma, snr) = ln snr + E[ln X] + O(snr^-1/2)``."""
    with np.errstate(divide="ignore", invalid="ignore"):  # gamma = 1 takes the exact branch
        tail = (1.0 - gamma) * np.log1p(-gamma) / gamma
    return -1.0 - np.where(gamma < 1.0, tail, 0.0)


def mp_density(lam: ArrayLike, gamma: float) -> np.ndarray:
    """Marchenko-Pastur density ``f(lambda; gamma)`` on ``[(1-sqrt g)^2, (1+sqrt g)^2]``, 0 < gamma <= 1."""
    lam = np.asarray(lam, dtype=np.float64)
    lo, hi = (1.0 - math.sqrt(gamma)) ** 2, (1.0 + math.sqrt(gamma)) ** 2
    inside = np.clip((hi - lam) * (lam - lo), 0.0, None)
    return np.sqrt(inside) / (2.0 * math.pi * gamma * lam)


def psi_mp_quad(m: int, n: int, std: float, epsrel: float = 1e-13) -> float:
    """Reference ``psi_mp`` by adaptive quadrature of the MP integral (scipy ``quad``, Eq. 4).

    Slow; kept as the independent check of the closed form (tests, ``scripts/bench_core.py``).
    """
    from scipy import integrate

    big, small = max(m, n), min(m, n)
    gamma, snr = small / big, big * std**2
    lo, hi = (1.0 - math.sqrt(gamma)) ** 2, (1.0 + math.sqrt(gamma)) ** 2
    value, _ = integrate.quad(
        lambda lam: math.log1p(snr * lam) * float(mp_density(lam, gamma)), lo, hi, epsabs=0.0, epsrel=epsrel, limit=200
    )
    return small * value


@overload
def init_std(rows: float, cols: float, init: str | float) -> float: ...
@overload
def init_std(rows: ArrayLike, cols: ArrayLike, init: str | float) -> np.ndarray | float: ...
def init_std(rows: ArrayLike, cols: ArrayLike, init: str | float) -> np.ndarray | float:
    """Init std of a ``rows x cols`` (out x in) matrix: ``"xavier"`` sqrt(2/(m+n)),
    ``"kaiming"`` fan-in sqrt(2/n), or a number for ``normal(std)`` (e.g. 0.02)."""
    rows_arr, cols_arr = _as_float_array("rows", rows), _as_float_array("cols", cols)
    _check_positive("rows", rows_arr, integer=True)
    _check_positive("cols", cols_arr, integer=True)
    if isinstance(init, str):
        if init == "xavier":
            out = np.sqrt(2.0 / (rows_arr + cols_arr))
        elif init == "kaiming":
            out = np.sqrt(2.0 / cols_arr)
        else:
            raise InvalidInputError(f"init must be one of {INIT_SCHEMES} or a positive number; got {init!r}")
        return float(out) if out.ndim == 0 else out
    if not is_number(init):
        raise InvalidInputError(f"init must be one of {INIT_SCHEMES} or a positive number; got {init!r}")
    try:
        std = float(init)
    except OverflowError:  # 10**400, a huge Fraction: past float's range
        std = math.inf
    if not (math.isfinite(std) and std > 0):
        raise InvalidInputError(f"init std must be a positive finite number; got {init!r}")
    _check_not_underflowing(std)
    return std


def parse_init(text: str) -> str | float:
    """Read an init convention as typed on a command line (``--init``): ``"xavier"``,
    ``"kaiming"`` or a positive std such as ``"0.02"``; anything else raises InvalidInputError."""
    if text in INIT_SCHEMES:
        return text
    try:
        std = float(text)
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"init must be xavier, kaiming or a positive std such as 0.02; got {text!r}") from err
    if not (math.isfinite(std) and std > 0):
        raise InvalidInputError(f"init std must be a positive finite number such as 0.02; got {text!r}")
    _check_not_underflowing(std)
    return std


def _check_not_underflowing(std: float) -> None:
    if std < MIN_INIT_STD:
        raise InvalidInputError(
            f"init std {std!r} is below {MIN_INIT_STD:g}: psi_MP ~ m n std^2 underflows in float64 and every "
            "plan would score alike; pass a std such as 0.02, or xavier"
        )


def psi_weights(weight: Any) -> float:
    """``sum_i ln(1 + sigma_i^2)`` over the singular values of a real 2-D matrix (Definition 1).

    Accepts a numpy array or, when torch is installed, a torch tensor (SVD runs in torch,
    on the tensor's device, in float64 on CPU / float32 on GPU).
    """
    if type(weight).__module__.startswith("torch"):
        torch = sys.modules["torch"]  # a torch tensor was passed, so torch is loaded; the core never imports it

        if weight.ndim != 2:
            raise InvalidInputError(f"psi_weights needs a 2-D matrix; got shape {tuple(weight.shape)}")
        if weight.is_complex():
            raise InvalidInputError(f"psi_weights needs a real matrix; got dtype {weight.dtype}")
        if weight.dtype == torch.bool:  # as the numpy path refuses a bool array
            raise InvalidInputError(f"psi_weights needs a matrix of numbers; got dtype {weight.dtype}")
        if not bool(torch.isfinite(weight).all()):
            raise InvalidInputError("psi_weights got a matrix with NaN or infinite entries")
        dtype = torch.float64 if weight.device.type == "cpu" else torch.float32
        sigma = torch.linalg.svdvals(weight.detach().to(dtype))
        return _log1p_squares(sigma.double().cpu().numpy())
    complex_input = False
    with contextlib.suppress(ValueError):  # a ragged list: named by _as_float_array, not numpy's own ValueError
        complex_input = np.iscomplexobj(weight)
    if complex_input:
        raise InvalidInputError(f"psi_weights needs a real matrix; got dtype {np.asarray(weight).dtype}")
    matrix = _as_float_array("weight", weight)
    if matrix.ndim != 2:
        raise InvalidInputError(f"psi_weights needs a 2-D matrix; got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise InvalidInputError("psi_weights got a matrix with NaN or infinite entries")
    return _log1p_squares(np.linalg.svd(matrix, compute_uv=False))


def _log1p_squares(sigma: np.ndarray) -> float:
    """``sum ln(1 + sigma^2)`` as ``logaddexp(0, 2 ln sigma)``: sigma^2 overflows above about 1.3e154."""
    with np.errstate(divide="ignore"):  # ln 0 = -inf, and logaddexp(0, -inf) = 0
        return float(np.logaddexp(0.0, 2.0 * np.log(sigma)).sum())
