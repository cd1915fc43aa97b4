"""Reproduce the marginal-gain table of appendix D.4 (paper Table "psi-marginal-gain",
the strict-concavity proposition): d psi_MP / d d_ff by forward differences on the d_ff grid 512..4096 (step 128)
for every d_model of the Transformer-XL space at s = 0.02, and the sign of all 7 x 27 = 189
second differences. Also prints the exact derivative ln(1 + s^2 m delta*) of the envelope identity.

    python scripts/reproduce_marginal_gain.py
"""

from __future__ import annotations

import argparse

import numpy as np

from nsc_prune.cli.parser import positive_number
from nsc_prune.cli.scripts import run_script
from nsc_prune.core.capacity import psi_mp

D_MODELS = (128, 256, 384, 512, 640, 768, 1024)
PAPER = {
    128: (0.041, 0.020),
    256: (0.081, 0.040),
    384: (0.120, 0.060),
    512: (0.158, 0.080),
    640: (0.195, 0.100),
    768: (0.231, 0.120),
    1024: (0.300, 0.161),
}


def envelope_derivative(n: np.ndarray, m: int, std: float) -> np.ndarray:
    """Exact d psi_MP(n, m, s) / dn = ln(1 + s^2 m delta*), delta* the positive root of the
    Marchenko-Pastur fixed point (paper Eq. "envelope"): s^2 m delta^2 + (1 + s^2 (n - m)) delta - 1 = 0."""
    beta = std * std
    a = 1.0 + beta * (np.asarray(n, dtype=np.float64) - m)
    delta = 2.0 / (a + np.sqrt(a * a + 4.0 * beta * m))  # the positive root, written without cancellation
    return np.log1p(beta * m * delta)


def marginal_gain_table(std: float = 0.02, lo: int = 512, hi: int = 4096, step: int = 128) -> list[dict]:
    """One row per d_model: forward differences at both ends, exact derivatives, concavity check."""
    grid = np.arange(lo, hi + 1, step)
    rows = []
    for d in D_MODELS:
        psi = psi_mp(grid, d, std)
        gain = np.diff(psi) / step
        second = np.diff(psi, 2)
        rows.append(
            {
                "d_model": d,
                "gain_lo": gain[0],
                "gain_hi": gain[-1],
                "exact_lo": float(envelope_derivative(lo, d, std)),
                "exact_hi": float(envelope_derivative(hi, d, std)),
                "negative": int(np.sum(second < 0)),
                "second_diffs": second.size,
                # a second difference within a few ulps of psi is float noise, not curvature
                "resolved": bool(np.all(np.abs(second) > 16 * np.finfo(np.float64).eps * psi[1:-1])),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--std", type=positive_number, default=0.02)
    args = parser.parse_args()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a std too large: refused below
        rows = marginal_gain_table(args.std)
    exact = [r[key] for r in rows for key in ("exact_lo", "exact_hi")]
    if not np.isfinite(exact).all():  # a huge s^2 overflows, or cancels in the fixed point's root
        parser.error(
            f"--std {args.std:g} is too large: the exact derivative is not finite in float64; pass a std such as 0.02"
        )
    if not all(r["resolved"] for r in rows):  # the verdict would count rounding noise (or zeros, below 1e-154)
        parser.error(
            f"--std {args.std:g} is too small: psi_MP's second differences are below float64's resolution; pass a "
            "std such as 0.02"
        )
    print(
        f"marginal gain d psi_MP / d d_ff at s = {args.std} (forward differences, step 128; paper columns beside ours, "
        "'-' where the paper has no value: it reports s = 0.02 only)"
    )
    print(
        f"{'d_model':>8} {'@512':>8} {'paper':>7} {'@4096':>8} {'paper':>7} "
        f"{'exact@512':>10} {'exact@4096':>11} {'2nd diff < 0':>13}"
    )
    total = negative = 0
    for r in rows:
        p_lo, p_hi = (
            (f"{v:.3f}" for v in PAPER[r["d_model"]]) if args.std == 0.02 and r["d_model"] in PAPER else ("-", "-")
        )
        print(
            f"{r['d_model']:>8} {r['gain_lo']:>8.3f} {p_lo:>7} {r['gain_hi']:>8.3f} {p_hi:>7} {r['exact_lo']:>10.4f} "
            f"{r['exact_hi']:>11.4f} {r['negative']:>6}/{r['second_diffs']}"
        )
        total += r["second_diffs"]
        negative += r["negative"]
    print(
        f"all second differences negative: {negative}/{total} {'yes' if negative == total else 'NO'}; "
        f"attenuation @512 / @4096: {min(r['gain_lo'] / r['gain_hi'] for r in rows):.2f}-"
        f"{max(r['gain_lo'] / r['gain_hi'] for r in rows):.2f}x"
    )


if __name__ == "__main__":
    raise SystemExit(run_script(main))
