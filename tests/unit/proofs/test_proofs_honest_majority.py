"""Result 1: exact probability against brute force, bounds, protected ends, validation, speed."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs.honest_majority import chernoff_bound, monte_carlo, prob_stage_compromised, union_bound


def brute_force(num_stages: int, num_replicas: int, num_malicious: int, protect_ends: bool = False) -> float:
    """Enumerates every malicious slot set."""
    first = num_replicas if protect_ends else 0
    last = num_stages * num_replicas - (num_replicas if protect_ends else 0)
    bad = total = 0
    for chosen in itertools.combinations(range(first, last), num_malicious):
        counts = np.bincount(np.array(chosen, dtype=int) // num_replicas, minlength=num_stages)
        bad += bool(np.any(2 * counts >= num_replicas))
        total += 1
    return bad / total


@pytest.mark.parametrize(
    "config", [(3, 3, 3, False), (2, 4, 3, False), (4, 2, 2, True), (3, 5, 4, False), (4, 3, 3, True), (2, 1, 1, False)]
)
def test_exact_matches_brute_force(config: tuple[int, int, int, bool]) -> None:
    num_stages, num_replicas, num_malicious, protect = config
    exact = prob_stage_compromised(num_stages, num_replicas, num_malicious, protect_ends=protect)
    assert exact == pytest.approx(brute_force(*config), abs=1e-12)


def test_ties_count_as_compromised_and_zero_malicious_is_safe() -> None:
    assert prob_stage_compromised(2, 2, 1) == 1.0  # 1 of 2 malicious: no strict honest majority
    assert prob_stage_compromised(16, 8, 0) == 0.0


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 12), st.integers(1, 12), st.floats(0.0, 0.6))
def test_bound_chain(num_stages: int, num_replicas: int, fraction: float) -> None:
    num_malicious = int(fraction * num_stages * num_replicas)
    exact = prob_stage_compromised(num_stages, num_replicas, num_malicious)
    union = prob_stage_compromised(num_stages, num_replicas, num_malicious, exact=False)
    assert union == union_bound(num_stages, num_replicas, num_malicious)
    chernoff = chernoff_bound(num_stages, num_replicas, num_malicious)
    hoeffding = chernoff_bound(num_stages, num_replicas, num_malicious, pinsker=True)
    chain = [0.0, exact, union, chernoff, hoeffding, 1.0]
    assert all(lo <= hi + 1e-12 for lo, hi in zip(chain, chain[1:])), chain


def test_protected_ends_matches_monte_carlo_over_middle_stages() -> None:
    exact = prob_stage_compromised(10, 8, 16, protect_ends=True)
    mc = monte_carlo(8, 8, 16, 20_000, np.random.default_rng(0))
    assert abs(mc - exact) <= 4.5 * math.sqrt(exact * (1 - exact) / 20_000)


def test_largest_documented_mesh_is_fast_and_tiny_probabilities_keep_precision() -> None:
    start = time.perf_counter()
    p = prob_stage_compromised(64, 32, 256)  # 12.5% malicious: about 1.4e-5
    assert time.perf_counter() - start < 5.0
    assert 0 < p <= union_bound(64, 32, 256)
    assert p == pytest.approx(union_bound(64, 32, 256), rel=1e-3)  # rare events: union bound is tight


@pytest.mark.parametrize("args", [(0, 4, 1), (4, 0, 1), (4, 4, 17), (2, 4, 1, True), (4, 4, -1)])
def test_rejects_impossible_sizes(args: tuple) -> None:
    num_stages, num_replicas, num_malicious, *protect = args
    with pytest.raises(ValueError):
        prob_stage_compromised(num_stages, num_replicas, num_malicious, protect_ends=bool(protect))
