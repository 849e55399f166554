"""Intervals over seeds: the mean of a metric and its 95% Student-t confidence interval.

A figure from one seed is one draw: the data order, the initialisation, the routing, the malicious
placement and the attack's own randomness all come from the scenario seed. Running the same scenario
for n seeds gives n independent draws of every metric, and the interval says how far the mean of those
draws can be trusted. The method is the textbook one for a small number of draws whose spread is not
known in advance:

    mean +- t_{0.975, n-1} * s / sqrt(n)      (s: the sample standard deviation, n - 1 degrees of freedom)

(`scipy.stats.t.interval`). It assumes roughly normal per-seed values; for bounded rates near 0 or 1
the interval may cross the bound, and it is clipped to the metric's range where one is given. With one
seed (n = 1) the interval is undefined and is reported as null, never as a zero-width interval.

Differences are paired by seed: the defended and the clean twin of seed s share data order and
initialisation, so `defended_s - clean_s` removes what the two have in common and its interval is far
narrower than the difference of two independent intervals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
METHOD = "mean and 95% Student-t interval over seeds (scipy.stats.t; null with one seed)"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Mean of the defined per-seed values and its interval (None where undefined)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int  # seeds with a defined value
    missing: int = 0  # seeds where the metric was undefined (e.g. precision with nothing flagged)

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def excludes_zero(self) -> bool:
        """The interval lies strictly on one side of 0 (False when it is undefined)."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def _defined(values: Sequence[float | None]) -> tuple[np.ndarray, int]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return np.asarray(vals, dtype=float), len(values) - len(vals)


def mean_ci(values: Sequence[float | None], bounds: tuple[float, float] | None = None) -> Estimate:
    """Mean and 95% t interval of per-seed values; None entries (undefined metrics) are left out and counted.

    Args:
        values: one value per seed (None where the metric is undefined for that seed).
        bounds: the metric's range (e.g. (0, 1) for a rate): the interval is clipped to it.
    """
    vals, missing = _defined(values)
    n = len(vals)
    if n == 0:
        return Estimate(None, None, None, 0, missing)
    mean = float(vals.mean())
    if n == 1:
        return Estimate(mean, None, None, 1, missing)
    sd = float(vals.std(ddof=1))
    if vals.min() == vals.max():  # every seed gave the same value: the t interval collapses to it
        mean = low = high = float(vals[0])
    else:
        low, high = (float(x) for x in sps.t.interval(LEVEL, n - 1, loc=mean, scale=sd / math.sqrt(n)))
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Estimate(mean, low, high, n, missing)


def paired_ci(a: Sequence[float | None], b: Sequence[float | None]) -> Estimate:
    """Mean and interval of the per-seed differences a_s - b_s (seeds where either is undefined are left out)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds: {len(a)} vs {len(b)}")
    diffs = [None if x is None or y is None else float(x) - float(y) for x, y in zip(a, b)]
    return mean_ci(diffs)
