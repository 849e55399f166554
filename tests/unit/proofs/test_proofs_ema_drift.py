"""Result 3: the EMA simulation against closed forms, for drawn beta, delta, fence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs.ema_drift import first_flag_step, max_evading_drift, simulate_drift


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
