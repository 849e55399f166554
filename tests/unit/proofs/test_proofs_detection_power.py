"""Result 5: the dominating-fence CDF, bound <= exact, exact vs simulation, and the geometric form's limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proofs.detection_power import (
    detection_prob,
    detection_prob_lower_bound,
    dominating_fence_cdf,
    simulate_detection,
)
from proofs.fence_fpr import simulate_fences


@pytest.mark.parametrize("window", [9, 20, 49])
def test_dominating_cdf_is_exact_or_below_the_empirical_cdf(window: int) -> None:
    fences = simulate_fences(1.5, window, "normal", 100_000, np.random.default_rng(window))
    for x in (2.0, 2.7, 3.5):
        empirical = float(np.mean(fences <= x))
        tol = 4.5 * math.sqrt(max(empirical * (1 - empirical), 1e-6) / fences.size)
        cdf = dominating_fence_cdf(x, 1.5, window)
        assert cdf <= empirical + tol
        if (window - 1) % 4 == 0:  # then c+ is the fence itself
            assert cdf == pytest.approx(empirical, abs=tol)


@pytest.mark.parametrize("refresh", [False, True])
def test_bound_below_exact_and_both_monotone(refresh: bool) -> None:
    previous_exact = -1.0
    for n in (1, 3, 10, 30):
        lower = detection_prob_lower_bound(1.0, 2.0, 1.5, 25, n, refresh=refresh)
        exact = detection_prob(1.0, 2.0, 1.5, 25, n, refresh=refresh)
        assert 0.0 <= lower <= exact <= 1.0
        assert exact > previous_exact
        previous_exact = exact
    assert detection_prob(3.0, 1.0, 1.5, 25, 5) > detection_prob(1.0, 1.0, 1.5, 25, 5)


def test_single_step_frozen_equals_refreshed() -> None:
    assert detection_prob(1.0, 1.0, 2.0, 30, 1) == pytest.approx(detection_prob(1.0, 1.0, 2.0, 30, 1, refresh=True))


def test_exact_matches_simulation_of_a_frozen_fence() -> None:
    exact = detection_prob(1.5, 1.0, 1.5, 30, 8)
    sim = simulate_detection(1.5, 1.0, 1.5, 30, 8, 40_000, np.random.default_rng(3), "frozen")
    assert sim == pytest.approx(exact, abs=4.5 * math.sqrt(exact * (1 - exact) / 40_000))


def test_geometric_form_overstates_a_frozen_fence_for_long_horizons() -> None:
    geometric = detection_prob_lower_bound(1.0, 1.0, 1.5, 49, 300, refresh=True)
    assert geometric > detection_prob(1.0, 1.0, 1.5, 49, 300)  # not a bound once the fence is frozen
    assert detection_prob_lower_bound(1.0, 1.0, 1.5, 49, 300) <= detection_prob(1.0, 1.0, 1.5, 49, 300)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="s > 0"):
        detection_prob_lower_bound(1.0, 0.0, 1.5, 20, 5)
    with pytest.raises(ValueError, match="Unknown mode"):
        simulate_detection(1.0, 1.0, 1.5, 20, 5, 10, np.random.default_rng(0), "sliding_window")
