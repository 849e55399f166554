"""Result 5: the dominating-fence CDF, bound <= exact, exact vs simulation, the geometric form's limits, the sliding
bound, and SENTINEL's own Fences and detector."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proofs.detection_power import (
    detection_prob,
    detection_prob_lower_bound,
    dominating_fence_cdf,
    dominating_indices,
    fences_detection,
    sentinel_detection,
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


# -- the sliding bound and the testbed's own fence and detector ------------------------------------------------


def test_dominating_indices_widen_by_one_rank_per_replacement() -> None:
    assert dominating_indices(41) == (11, 31)  # (w - 1) % 4 == 0: Q1 = X_(11), Q3 = X_(31) exactly
    assert dominating_indices(41, 3) == (8, 34)
    assert dominating_indices(41, 10) == (1, 41)
    with pytest.raises(ValueError, match="replaced"):
        dominating_indices(41, 11)


@pytest.mark.parametrize("replaced", [1, 4])
def test_real_fence_after_replacements_stays_below_the_widened_dominating_fence(replaced: int) -> None:
    """The lemma behind the sliding bound, pointwise, on SENTINEL's Fences with adversarial replacements."""
    from sentinel.detectors.baseline import Fences

    k, window = 1.5, 30
    rng = np.random.default_rng(replaced)
    a, b = dominating_indices(window, replaced)
    for trial in range(200):
        honest = rng.normal(size=window)
        fences = Fences(("x",), window, k)
        for v in honest:
            fences.push(v[None])
        order = np.sort(honest)
        widened = (1 + k) * order[b - 1] - k * order[a - 1]
        inserted = {0: 1e6, 1: -1e6}.get(trial % 3, None)  # push the fence up, pull Q1 down, or random
        for _ in range(replaced):
            fences.push(np.array([rng.normal(scale=10.0) if inserted is None else inserted]))
        assert fences.thresholds()["x"] <= widened + 1e-9


def test_sliding_bound_is_below_the_frozen_one_and_equal_for_one_step() -> None:
    for delta in (1.0, 3.0):
        assert (
            detection_prob_lower_bound(delta, 1.0, 1.5, 40, 6, sliding=True)
            <= detection_prob_lower_bound(delta, 1.0, 1.5, 40, 6) + 1e-12
        )
    assert detection_prob_lower_bound(2.0, 1.0, 1.5, 40, 1, sliding=True) == pytest.approx(
        detection_prob_lower_bound(2.0, 1.0, 1.5, 40, 1)
    )
    assert detection_prob_lower_bound(4.0, 1.0, 1.5, 40, 6, sliding=True) > detection_prob_lower_bound(
        2.0, 1.0, 1.5, 40, 6, sliding=True
    )
    with pytest.raises(ValueError, match="replaced"):
        detection_prob_lower_bound(2.0, 1.0, 1.5, 20, 10, sliding=True)  # 9 replacements > floor(19 / 4)
    with pytest.raises(ValueError, match="exclusive"):
        detection_prob_lower_bound(2.0, 1.0, 1.5, 40, 5, sliding=True, refresh=True)


def test_real_fences_frozen_match_the_exact_value() -> None:
    trials = 20_000
    exact = detection_prob(2.5, 1.0, 2.0, 40, 6)
    rate = fences_detection(2.5, 1.0, 2.0, 40, 6, trials, np.random.default_rng(11))
    assert rate == pytest.approx(exact, abs=4.5 * math.sqrt(exact * (1 - exact) / trials))


@pytest.mark.parametrize("mode", ["sentinel", "admit"])
def test_real_fences_sliding_stay_above_the_sliding_bound(mode: str) -> None:
    trials = 800
    lower = detection_prob_lower_bound(2.5, 1.0, 2.0, 40, 6, sliding=True)
    rate = fences_detection(2.5, 1.0, 2.0, 40, 6, trials, np.random.default_rng(12), mode, k_learn=1.25)
    assert rate >= lower - 4.5 * math.sqrt(lower * (1 - lower) / trials)


def test_the_comparison_fails_for_a_fence_wider_than_the_bound_assumes() -> None:
    """A detector whose fence is k = 4 when the bound assumes k = 1.5 falls far below the bound: caught."""
    trials = 20_000
    lower = detection_prob_lower_bound(2.0, 1.0, 1.5, 50, 5)
    rate = fences_detection(2.0, 1.0, 4.0, 50, 5, trials, np.random.default_rng(13))
    assert rate < lower - 4.5 * math.sqrt(lower * (1 - lower) / trials)


def test_fences_detection_rejects_bad_modes() -> None:
    with pytest.raises(ValueError, match="Unknown mode"):
        fences_detection(1.0, 1.0, 1.5, 20, 3, 10, np.random.default_rng(0), "refreshed")
    with pytest.raises(ValueError, match="k_learn"):
        fences_detection(1.0, 1.0, 1.5, 20, 3, 10, np.random.default_rng(0), "sentinel", k_learn=2.0)


def test_sentinel_shift_moves_the_detectors_statistic_by_exactly_delta() -> None:
    """The harness's white-box attack realises the shifted-statistic model on the real detector."""
    from proofs import testbed
    from proofs.detection_power import torch_tensor
    from sentinel.transport.message import Role

    det = testbed.sentinel(distances=("l1",), window=16, warmup_steps=0)
    stream = testbed.HonestStream((1, 8, 64), 1.0, 3)
    for step in range(40):
        det.observe(testbed.message(step, stream()))
    baseline, _ = testbed.stream_state(det)
    for delta in (0.01, 0.2):
        x = stream()
        shifted = x + torch_tensor(delta * np.sign(stream.pooled(x) - baseline.view().pooled))
        d0 = det.scores(testbed.BOUNDARY, Role.ACTIVATION, x)["l1"]
        d1 = det.scores(testbed.BOUNDARY, Role.ACTIVATION, shifted)["l1"]
        assert d1 - d0 == pytest.approx(delta, abs=1e-6)


def test_sentinel_detection_flags_large_shifts_and_not_honest_traffic() -> None:
    big = sentinel_detection(20.0, 3, 10, seed=1)
    none = sentinel_detection(0.0, 3, 10, seed=1)
    assert big.detected == 1.0 and none.detected <= 0.2 and big.honest_flags == 0
    assert none.delta == 0.0 and 15.0 < big.delta / big.spread < 27.0  # delta = 20 pilot spreads
