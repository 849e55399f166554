"""Intervals over seeds: the Student-t interval by hand, undefined values left out and counted, pairing."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from sentinel.scoring.stats import mean_ci, paired_ci


def test_t_interval_matches_the_textbook_formula():
    vals = [0.90, 0.95, 0.85, 1.0, 0.92]
    e = mean_ci(vals)
    n, mean = len(vals), sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert e.mean == pytest.approx(mean) and e.n == 5 and e.missing == 0
    assert (e.low, e.high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert mean_ci([0.8, 1.0, 1.0], (0.0, 1.0)).high == 1.0  # clipped to a rate's range


def test_one_seed_has_no_interval_and_undefined_seeds_are_counted_not_averaged():
    one = mean_ci([0.5])
    assert one.mean == 0.5 and one.low is None and one.high is None and not one.excludes_zero()
    e = mean_ci([None, 0.2, 0.4, None])
    assert e.mean == pytest.approx(0.3) and e.n == 2 and e.missing == 2
    assert mean_ci([None, None]).mean is None
    same = mean_ci([0.1, 0.1, 0.1])
    assert same.mean == same.low == same.high == 0.1


def test_paired_differences_remove_what_the_seeds_share():
    clean = [3.00, 3.10, 2.90, 3.05]
    attacked = [c + d for c, d in zip(clean, (0.020, 0.022, 0.019, 0.021))]
    paired = paired_ci(attacked, clean)
    assert paired.mean == pytest.approx(0.0205) and paired.excludes_zero()
    unpaired_gap = mean_ci(attacked).mean - mean_ci(clean).mean
    assert unpaired_gap == pytest.approx(0.0205) and mean_ci(attacked).low < mean_ci(clean).high  # overlap
    assert paired_ci([1.0, None], [0.5, 0.2]).n == 1
