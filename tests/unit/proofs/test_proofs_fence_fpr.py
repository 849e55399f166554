"""Result 2: the fence as numpy computes it, the quadrature against independent integrals, the table."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, special

import proofs
from proofs.fence_fpr import (
    TABLE_KS,
    TABLE_WINDOWS,
    fence_coefficients,
    fence_fpr,
    fence_fpr_limit,
    fpr_table,
    simulate_fences,
)


@pytest.mark.parametrize("window", range(4, 40))
def test_coefficients_reproduce_numpy_linear_quantiles(window: int) -> None:
    k = 1.7
    sample = np.random.default_rng(window).normal(size=(50, window))
    indices, weights = fence_coefficients(k, window)
    by_order_stats = np.sort(sample, axis=1)[:, indices - 1] @ weights
    q1, q3 = np.quantile(sample, [0.25, 0.75], axis=1)
    np.testing.assert_allclose(by_order_stats, q3 + k * (q3 - q1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("k", "window"), [(1.5, 9), (1.0, 13), (2.0, 21)])
def test_quadrature_matches_an_independent_double_integral(k: float, window: int) -> None:
    """When (w - 1) % 4 == 0 the fence is (1+k) X_(j) - k X_(i): integrate the pair's joint density with dblquad."""
    i, j = (window - 1) // 4 + 1, 3 * (window - 1) // 4 + 1
    log_c = special.gammaln(window + 1) - special.gammaln(i) - special.gammaln(j - i) - special.gammaln(window - j + 1)

    def integrand(u: float, v: float) -> float:  # u = U_(i) < v = U_(j)
        log_density = log_c + (i - 1) * np.log(u) + (j - i - 1) * np.log(v - u) + (window - j) * np.log1p(-v)
        return np.exp(log_density) * special.ndtr(k * special.ndtri(u) - (1 + k) * special.ndtri(v))

    reference, _ = integrate.dblquad(integrand, 0, 1, 0, lambda v: v, epsabs=1e-10, epsrel=1e-8)
    assert fence_fpr(k, window) == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("dist", ["normal", "t3", "lognormal"])
def test_fpr_is_invariant_to_scale_and_tends_to_the_population_fence(dist: str) -> None:
    rng = np.random.default_rng(1)
    unit, scaled = simulate_fences(1.5, 20, dist, 1000, rng), None
    rng = np.random.default_rng(1)
    scaled = 7.0 * simulate_fences(1.5, 20, dist, 1000, rng)
    np.testing.assert_allclose(scaled, 7.0 * unit)
    fprs = [fence_fpr(1.5, w, dist) for w in (21, 101, 401)]
    limit = fence_fpr_limit(1.5, dist)
    assert fprs[0] > fprs[1] > fprs[2] > limit  # finite windows: noisier fence, more false positives
    assert fprs[2] - limit < 0.1 * (fprs[0] - limit)


def test_rejects_degenerate_fences() -> None:
    with pytest.raises(ValueError, match="window >= 4"):
        fence_fpr(1.5, 3)
    with pytest.raises(ValueError, match="Unknown dist"):
        fence_fpr(1.5, 10, "cauchy")


def test_markdown_table_for_normal_is_reproducible() -> None:
    text = (Path(proofs.__file__).parent / "fence_fpr.md").read_text()
    section = text[text.index("normal (FPR in %") :]
    table = fpr_table(TABLE_KS, TABLE_WINDOWS, "normal")
    for k in TABLE_KS:
        row = re.search(rf"^\| {k} \|(.*)\|$", section, re.MULTILINE)
        assert row is not None, f"row k={k} missing"
        printed = [float(cell.strip().rstrip("*")) for cell in row.group(1).split("|")]
        expected = [100 * table[k, w] for w in [*TABLE_WINDOWS, float("inf")]]
        np.testing.assert_allclose(printed, expected, rtol=5e-3, atol=1e-12)
