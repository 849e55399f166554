"""Result 2: false-positive rate of the Tukey fence Q3 + k*IQR estimated from a window of honest values.

The fence uses numpy's default 'linear' quantile (virtual index h = (w - 1) * q, interpolating between
the order statistics at floor(h) and floor(h) + 1), so it is a fixed linear combination of at most four
order statistics of the window. Expectations over the fence are computed by Gauss-Jacobi quadrature over
the Markov chain of uniform order statistics (see fence_fpr.md); `detection_power` reuses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
from scipy import special, stats

from proofs.result import Result

NAME = "fence_fpr"
STATEMENT = "FPR(k,w) = E[1 - F(Q3 + k*IQR)] by quadrature over order statistics == simulation"

DISTS = {"normal": stats.norm(), "t3": stats.t(3), "lognormal": stats.lognorm(1.0)}
DEFAULT_NODES = 24


def _dist(dist: str):
    if dist not in DISTS:
        raise ValueError(f"Unknown dist {dist!r}; choose one of {sorted(DISTS)}.")
    return DISTS[dist]


def fence_coefficients(k: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Order statistics the fence depends on, and their weights.

    Args:
        k: Fence multiplier (> 0).
        window: Window size w (>= 4).

    Returns:
        (indices, weights): ascending 1-based order-statistic indices and weights with
        fence = sum_j weights[j] * X_(indices[j]).
    """
    if window < 4 or not k > 0:
        raise ValueError(f"Need window >= 4 and k > 0 for a fence Q3 + k*IQR (got window={window}, k={k}).")
    coef: dict[int, float] = {}
    for q, scale in ((0.25, -k), (0.75, 1.0 + k)):  # fence = (1 + k) * Q3 - k * Q1
        h = (window - 1) * q  # exact in binary for integer windows
        lo, g = math.floor(h), h - math.floor(h)
        coef[lo + 1] = coef.get(lo + 1, 0.0) + scale * (1 - g)
        if g > 0:
            coef[lo + 2] = coef.get(lo + 2, 0.0) + scale * g
    indices = np.array(sorted(coef))
    return indices, np.array([coef[i] for i in indices])


@cache
def _beta_rule(a: int, b: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Jacobi nodes/weights integrating against the Beta(a, b) density on [0, 1]."""
    x, w = special.roots_jacobi(nodes, b - 1, a - 1)  # weight (1 - x)^(b-1) (1 + x)^(a-1) on [-1, 1]
    return (1 + x) / 2, w / w.sum()


def _order_stat_grid(
    window: int, indices: np.ndarray, nodes: int, ppf: Callable[[np.ndarray], np.ndarray]
) -> tuple[list[np.ndarray], np.ndarray]:
    """Quantiles X_(indices) = ppf(U_(indices)) on a tensor quadrature grid, with the grid's weights.

    Uses the Markov chain from the top: U_(b) ~ Beta(b, w - b + 1); given U_(b) = v, U_(a) = v * Beta(a, b - a).

    Returns:
        (values, weights): values[j] is X_(indices[j]) with shape (nodes,) * (m - j) + (1,) * j, which
        broadcasts to weights.shape = (nodes,) * m (the top index varies along the first axis).
    """
    m = len(indices)
    top = int(indices[-1])
    t, weight = _beta_rule(top, window - top + 1, nodes)
    levels = [t]
    for j in range(m - 2, -1, -1):  # condition each lower index on the one above it
        t, w = _beta_rule(int(indices[j]), int(indices[j + 1] - indices[j]), nodes)
        levels.append(levels[-1][..., None] * t)
        weight = weight[..., None] * w
    levels.reverse()  # levels[j] is U_(indices[j]) with shape (nodes,) * (m - j)
    values = [ppf(u).reshape(u.shape + (1,) * j) for j, u in enumerate(levels)]  # ppf before broadcasting
    return values, weight


def fence_expectation(
    func: Callable[[np.ndarray], np.ndarray], k: float, window: int, dist: str = "normal", nodes: int = DEFAULT_NODES
) -> float:
    """E[func(fence)] for the fence of `window` i.i.d. draws from `dist`, by tensor Gauss-Jacobi quadrature.

    Args:
        func: Vectorised function of fence values; should be smooth for the quadrature to converge fast.
        k: Fence multiplier (> 0).
        window: Window size w (>= 4).
        dist: A key of `DISTS`.
        nodes: Nodes per order statistic; the grid has nodes ** (number of order statistics, <= 4) points.

    Returns:
        The expectation.
    """
    indices, weights = fence_coefficients(k, window)
    values, quad_w = _order_stat_grid(window, indices, nodes, _dist(dist).ppf)
    fence = sum(c * x for c, x in zip(weights, values))
    return float(np.sum(quad_w * func(fence)))


def fence_fpr(k: float, window: int, dist: str = "normal", nodes: int = DEFAULT_NODES) -> float:
    """P(a fresh honest value exceeds Q3 + k*IQR of a window of `window` i.i.d. honest values).

    Args:
        k: Fence multiplier.
        window: Window size w (>= 4); quantiles by numpy's default 'linear' method.
        dist: "normal", "t3" (Student-t, 3 dof) or "lognormal" (sigma = 1); the FPR does not depend on
            location or scale.
        nodes: Quadrature nodes per order statistic (relative error about 1e-8 at the default for w >= 9;
            small windows converge more slowly, about 1e-4 at w = 4).

    Returns:
        The false-positive rate.
    """
    return fence_expectation(_dist(dist).sf, k, window, dist, nodes)


def simulate_fences(k: float, window: int, dist: str, trials: int, rng: np.random.Generator) -> np.ndarray:
    """`trials` fences, each from a fresh window, computed exactly as a detector would (np.quantile)."""
    sample = _dist(dist).rvs(size=(trials, window), random_state=rng)
    q1, q3 = np.quantile(sample, [0.25, 0.75], axis=1)  # numpy default method='linear'
    return q3 + k * (q3 - q1)


def fence_fpr_limit(k: float, dist: str = "normal") -> float:
    """FPR of the population fence (window -> infinity): 1 - F(F^-1(3/4) + k * IQR)."""
    law = _dist(dist)
    q1, q3 = law.ppf([0.25, 0.75])
    return float(law.sf(q3 + k * (q3 - q1)))


def fpr_table(ks: list[float], windows: list[int], dist: str = "normal") -> dict[tuple[float, float], float]:
    """FPR for every (k, window) pair plus the window = inf limit; `format_table` renders it."""
    table = {(k, w): fence_fpr(k, w, dist) for k in ks for w in windows}
    return table | {(k, math.inf): fence_fpr_limit(k, dist) for k in ks}


def format_table(table: dict[tuple[float, float], float], target: float = 0.01) -> str:
    """Markdown table, rows k, columns w, FPR in %, '*' where FPR <= target."""
    ks = sorted({k for k, _ in table})
    windows = sorted({w for _, w in table})
    rows = ["| k \\ w | " + " | ".join(str(w) for w in windows) + " |", "|---" * (len(windows) + 1) + "|"]
    for k in ks:
        cells = [f"{100 * table[k, w]:.3g}{'*' if table[k, w] <= target else ''}" for w in windows]
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


TABLE_KS = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
TABLE_WINDOWS = [10, 20, 50, 100, 200]


_CASES = [("normal", 1.5, 50), ("normal", 1.0, 9), ("t3", 1.5, 20), ("t3", 3.0, 100), ("lognormal", 1.5, 50)]


def check(seed: int = 0, trials: int = 60_000) -> Result:
    """Quadrature vs simulation on `_CASES`, plus a node-doubling convergence check.

    Two simulated estimators per case: the Rao-Blackwellised mean of 1 - F(fence) (tight CI) and the raw
    rate of fresh honest values above the fence (what a detector sees). Both must sit within 4.5 standard
    errors of the quadrature. Headline on the first case: bound = 4.5 SE, measured = |quad - RB estimate|.
    """
    rng = np.random.default_rng(seed)
    ok, notes, headline = True, [], None
    for dist, k, window in _CASES:
        law = _dist(dist)
        quad = fence_fpr(k, window, dist)
        converged = abs(quad - fence_fpr(k, window, dist, nodes=28)) <= 1e-6 + 1e-4 * quad
        fences = simulate_fences(k, window, dist, trials, rng)
        rb = law.sf(fences)
        fresh = law.rvs(size=trials, random_state=rng) > fences
        tol_rb = 4.5 * rb.std() / math.sqrt(trials)
        tol_raw = 4.5 * math.sqrt(quad * (1 - quad) / trials)
        ok &= converged and abs(quad - rb.mean()) <= tol_rb and abs(quad - fresh.mean()) <= tol_raw
        notes.append(f"{dist} k={k} w={window}: quad={quad:.5f} rb={rb.mean():.5f} raw={fresh.mean():.5f}")
        if headline is None:
            headline = (tol_rb, abs(quad - rb.mean()))
    assert headline is not None
    bound, measured = headline
    return Result(
        name=NAME,
        statement=STATEMENT,
        bound=bound,
        measured=measured,
        margin=bound - measured,
        ok=ok,
        detail="; ".join(notes),
    )
