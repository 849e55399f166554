"""Result 4 (Theorem 1): drawn problems, step sizes and adversaries never beat the bound; the tau^2 is tight."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs.convergence import ADVERSARIES, cosine, measure, quadratic, theorem_bound


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(
    problem_kind=st.sampled_from(["quadratic", "cosine"]),
    adversary=st.sampled_from(sorted(ADVERSARIES)),
    dim=st.integers(1, 20),
    smoothness=st.floats(0.5, 10.0),
    sigma=st.floats(0.0, 2.0),
    tau=st.floats(0.0, 1.0),
    eta_fraction=st.floats(0.05, 1.0),
    steps=st.integers(20, 400),
    seed=st.integers(0, 2**16),
)
def test_average_squared_gradient_stays_below_the_bound(
    problem_kind: str,
    adversary: str,
    dim: int,
    smoothness: float,
    sigma: float,
    tau: float,
    eta_fraction: float,
    steps: int,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    problem = quadratic(dim, smoothness, rng) if problem_kind == "quadratic" else cosine(dim, smoothness, 2.5)
    x0 = rng.normal(0.0, 2.0, size=dim)
    measured, bound = measure(problem, x0, eta_fraction / smoothness, sigma, tau, adversary, steps, 8, rng)
    assert measured <= bound, f"measured {measured:.4g} > bound {bound:.4g}"


def test_tau_squared_term_is_tight_against_a_cancelling_adversary() -> None:
    """With sigma = 0 and eta = 1/L on a quadratic, ||grad f|| decreases to tau and stalls: the average -> tau^2."""
    rng = np.random.default_rng(0)
    measured, bound = measure(quadratic(5, 1.0, rng), rng.normal(0, 2, 5), 1.0, 0.0, 0.5, "cancel", 4000, 1, rng)
    assert 0.99 * bound <= measured <= bound


def test_noise_aware_adversary_needs_the_cross_term() -> None:
    with_noise, without = (theorem_bound(1.0, 2.0, 0.5, 1.0, 0.3, 100, chi=chi) for chi in (True, False))
    assert with_noise - without == pytest.approx(2 * 2.0 * 0.5 * 1.0 * 0.3)


def test_rejects_step_sizes_beyond_one_over_l() -> None:
    with pytest.raises(ValueError, match="eta <= 1/L"):
        theorem_bound(1.0, 2.0, 0.6, 0.0, 0.0, 10, chi=False)


def test_cosine_lower_bound_is_the_infimum() -> None:
    problem = cosine(1, 3.0, 2.0)
    grid = np.linspace(-10, 10, 200_001)[:, None]
    assert problem.value(grid).min() == pytest.approx(problem.lower_bound, abs=1e-9)
    assert problem.value(grid).min() >= problem.lower_bound - 1e-12
