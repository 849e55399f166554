"""Result 3: the EMA simulation against closed forms, for drawn beta, delta, fence; the real SENTINEL and slow_drift."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs.ema_drift import (
    SentinelDrift,
    bias_corrected_distances,
    first_flag_step,
    frozen_first_flag,
    max_evading_drift,
    simulate_drift,
)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(st.floats(0.0, 0.995), st.floats(1e-3, 10.0), st.integers(1, 6))
def test_distances_follow_the_closed_form(beta: float, delta: float, dim: int) -> None:
    steps = 500
    trace = simulate_drift(beta, delta, steps, dim=dim)
    t = np.arange(1, steps + 1)
    np.testing.assert_allclose(trace.before, delta * (1 - beta**t) / (1 - beta), rtol=1e-9)
    np.testing.assert_allclose(trace.after, beta * trace.before, rtol=1e-9, atol=1e-12)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(st.floats(0.5, 0.98), st.floats(0.1, 10.0))
def test_fence_is_evaded_exactly_up_to_delta_max(beta: float, tau: float) -> None:
    d_max = max_evading_drift(tau, beta)
    steps = 20 * int(1 / (1 - beta)) + 200
    assert not simulate_drift(beta, d_max * (1 - 1e-6), steps, tau=tau).flags.any()
    over = simulate_drift(beta, 1.1 * d_max, steps, tau=tau)
    assert abs(int(np.argmax(over.flags)) + 1 - first_flag_step(tau, beta, 1.1 * d_max)) <= 1


def test_post_update_convention_gives_the_beta_over_one_minus_beta_form() -> None:
    beta, tau = 0.9, 1.0
    d_max = max_evading_drift(tau, beta, compare="after")
    assert d_max == pytest.approx(tau * (1 - beta) / beta)
    trace = simulate_drift(beta, d_max, 3000)
    assert trace.after[-1] == pytest.approx(tau, rel=1e-9)
    assert trace.before[-1] == pytest.approx(tau / beta, rel=1e-9)  # what a pre-update check would see


def test_flagged_messages_freeze_the_baseline() -> None:
    trace = simulate_drift(0.8, 1.0, 50, tau=3.0)
    first = int(np.argmax(trace.flags))
    assert trace.flags[first:].all()  # once frozen, the gap only grows
    assert np.all(np.diff(trace.before[first:]) == pytest.approx(1.0))


def test_rejects_bad_decay() -> None:
    with pytest.raises(ValueError, match="beta"):
        simulate_drift(1.0, 0.1, 10)


# -- the testbed's own detector and attack -------------------------------------------------------------------


def test_bias_correction_only_lowers_the_distance_and_vanishes_with_a_long_warmup() -> None:
    beta, delta, steps = 0.9, 0.3, 200
    ideal = delta * (1 - beta ** np.arange(1, steps + 1)) / (1 - beta)
    before, after = bias_corrected_distances(beta, delta, steps, warmup=10**6)
    np.testing.assert_allclose(before, ideal, rtol=1e-9)
    np.testing.assert_allclose(after, beta * ideal, rtol=1e-9)
    short, _ = bias_corrected_distances(beta, delta, steps, warmup=5)
    assert np.all(short <= ideal + 1e-12) and (ideal - short).max() > 0.1 * delta


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.floats(0.5, 0.98), st.floats(0.1, 5.0), st.floats(1.0, 2.0), st.floats(0.2, 5.0))
def test_two_fences_flag_no_later_than_the_outer_one_alone(
    beta: float, s_learn: float, ratio: float, rate_factor: float
) -> None:
    s_flag = ratio * s_learn
    rate = rate_factor * s_learn * (1 - beta)
    two = frozen_first_flag(s_learn, s_flag, beta, rate)
    assert two <= first_flag_step(s_flag, beta, rate)
    assert math.isinf(two) == (rate <= s_learn * (1 - beta))  # the inner fence sets the evading rate
    assert frozen_first_flag(s_flag, s_flag, beta, rate) == first_flag_step(s_flag, beta, rate)


@pytest.mark.parametrize(("role", "beta"), [("activation", 0.9), ("gradient", 0.8)])
def test_sentinel_distances_follow_the_bias_corrected_closed_form(role: str, beta: float) -> None:
    rig = SentinelDrift(beta, noise=0.0, warmup=10, fences=False, role=role, seed=1)
    delta = 0.02 * rig.unit_l1()
    trace = rig.run(0.02, 40)
    before, after = bias_corrected_distances(beta, delta, 40, rig.baseline_updates)
    np.testing.assert_allclose(trace.before, before, atol=1e-3 * delta)
    np.testing.assert_allclose(trace.after, after, atol=1e-3 * delta)
    ideal = delta * (1 - beta ** np.arange(1, 41)) / (1 - beta)
    assert np.abs(trace.before - ideal).max() > 1e-2 * delta  # 10 warm-up updates: the correction shows
    wrong, _ = bias_corrected_distances(beta - 0.1, delta, 40, rig.baseline_updates)
    assert np.abs(trace.before - wrong).max() > 1.0 * delta  # the comparison sees a wrong decay


def test_sentinel_inner_fence_sits_below_the_outer_one() -> None:
    rig = SentinelDrift(0.9, seed=4)
    s_learn, s_flag, sd = rig.effective_fences(probes=16, iters=16)
    assert 0 < s_learn < s_flag and sd > 0
    slow = rig.run(0.5 * s_learn * 0.1, 100, post=False)
    fast = rig.run(2 * s_flag * 0.1, 100, post=False, stop_after=0)
    assert not slow.flags.any() and slow.perturbation[-1] == pytest.approx(100 * slow.perturbation[0], rel=1e-3)
    assert fast.flags[-1] and len(fast.flags) < 15
