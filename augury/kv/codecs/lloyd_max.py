"""Lloyd-Max scalar quantizers of a unit normal: the procedure and its checked-in tables.

The tables in `_tables.py` were produced by `lloyd_max_normal(bits)` below
(float64, quantile start, run to a fixed point) and are what the codecs use,
so encodings are identical on every machine and across SSD restore.
"""

from __future__ import annotations

import math

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _pdf(x: float) -> float:
    return 0.0 if math.isinf(x) else _INV_SQRT_2PI * math.exp(-0.5 * x * x)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / _SQRT2))


def _inv_cdf(p: float) -> float:
    # bisection is plenty for a start point
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def lloyd_max_normal(bits: int, iters: int = 100_000, tol: float = 1e-13) -> list[float]:
    """Centroids (ascending, symmetric) of the MSE-optimal 2**bits-level quantizer of N(0, 1)."""
    n = 1 << bits
    c = [_inv_cdf((i + 0.5) / n) for i in range(n)]
    for _ in range(iters):
        b = [-math.inf] + [0.5 * (c[i] + c[i + 1]) for i in range(n - 1)] + [math.inf]
        new = []
        for i in range(n):
            mass = _cdf(b[i + 1]) - _cdf(b[i])
            new.append((_pdf(b[i]) - _pdf(b[i + 1])) / mass)  # E[X | b_i < X < b_{i+1}]
        # enforce exact symmetry so the table is sign-symmetric to the last bit
        new = [0.5 * (new[i] - new[n - 1 - i]) for i in range(n)]
        delta = max(abs(x - y) for x, y in zip(new, c))
        c = new
        if delta < tol:
            break
    return c


def theoretical_mse(centroids: list[float]) -> float:
    """E[(X - Q(X))^2] for X ~ N(0,1): with conditional-mean centroids it is 1 - E[Q^2]."""
    n = len(centroids)
    b = [-math.inf] + [0.5 * (centroids[i] + centroids[i + 1]) for i in range(n - 1)] + [math.inf]
    # exact for any centroids: sum over cells of E[(X - c)^2; cell]
    total = 0.0
    for i, c in enumerate(centroids):
        lo, hi = b[i], b[i + 1]
        mass = _cdf(hi) - _cdf(lo)
        m1 = _pdf(lo) - _pdf(hi)  # E[X; cell]
        # E[X^2; cell] = mass + lo*pdf(lo) - hi*pdf(hi)
        m2 = mass + (0.0 if math.isinf(lo) else lo * _pdf(lo)) - (0.0 if math.isinf(hi) else hi * _pdf(hi))
        total += m2 - 2 * c * m1 + c * c * mass
    return total
