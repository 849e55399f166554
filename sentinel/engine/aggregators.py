"""DP aggregators: how a stage combines its replicas' gradient contributions.

Interface: `agg(vectors, weights) -> vector`, with `vectors` (n, d) one row per contributing replica
(its local mean gradient) and `weights` (n,) the number of microbatches behind each row. `mean` uses
the weights, which makes it the exact all-reduce of the full-batch gradient; robust aggregators treat
rows as equals (each row is one replica's vote). `check_domain(config, n, f)` states the domain rule
(validated against the adversary's per-stage count in `sentinel.scenario`).

Threat model of the robust rules: up to `f` of the `n` rows are arbitrary (Byzantine); the others are
honest estimates of the same gradient. `f` in a Config is the number of faulty rows the rule is built to
tolerate; `None` means "the largest f the rule tolerates for the n rows it is given". At run time fewer
rows may arrive than planned (a replica without microbatches this step, a banned one): every rule then
degrades to the largest f it can tolerate for the rows present instead of failing.
"""

from __future__ import annotations

import dataclasses

import torch

from sentinel.config import spec
from sentinel.registry import AGGREGATORS


class Aggregator:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None):
        self.config = config if config is not None else self.Config()

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        """Return a message when `f` faulty rows out of `n` cannot be tolerated, else None."""
        return None


@AGGREGATORS.register("mean")
class Mean(Aggregator):
    """Weighted mean sum_i (w_i / W) x_i: the plain all-reduce; tolerates no faulty replica."""

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = weights.to(vectors.dtype) / weights.sum()
        if len(w) == 1:
            return vectors[0] * w[0]  # w[0] == 1 exactly: keeps R=1 bit-identical to no DP sync
        return (w[:, None] * vectors).sum(0)


# -- helpers -------------------------------------------------------------------------------------
def coordinate_median(vectors: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median; the mean of the two middle values when n is even."""
    n = vectors.shape[0]
    s = vectors.sort(0).values
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _majority_rule(name: str, n: int, f: int) -> str | None:
    if 2 * f >= n:
        return f"{name} cannot tolerate 2f >= n: got f={f} faulty of n={n} rows (needs n > 2f, i.e. n >= {2 * f + 1})"
    return None


def _tolerable(f: int | None, n: int, limit: int) -> int:
    """The f actually used for n rows: the configured one, capped at the rule's limit for n."""
    cap = max(0, limit)
    return cap if f is None else min(f, cap)


def pairwise_sq_dists(vectors: torch.Tensor) -> torch.Tensor:
    """(n, n) squared Euclidean distances, computed in float64 for stability."""
    v = vectors.to(torch.float64)
    return torch.cdist(v, v).pow(2)


def krum_scores(vectors: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of each row: sum of squared distances to its n - f - 2 nearest other rows."""
    n = vectors.shape[0]
    k = max(1, n - f - 2)
    d = pairwise_sq_dists(vectors)
    d.fill_diagonal_(float("inf"))
    return d.topk(min(k, n - 1), dim=1, largest=False).values.sum(1) if n > 1 else torch.zeros(1)


# -- robust rules --------------------------------------------------------------------------------
@AGGREGATORS.register("median")
class Median(Aggregator):
    """Coordinate-wise median: y_j = median_i x_ij. Tolerates f faulty rows when 2f < n.

    Yin et al. 2018. Each coordinate lies within the range of the honest rows' values while f < n/2.
    """

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        return _majority_rule("median", n, f)

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return coordinate_median(vectors)


@AGGREGATORS.register("trimmed_mean")
class TrimmedMean(Aggregator):
    """Coordinate-wise trimmed mean: drop the f largest and f smallest values of each coordinate, average the rest.

    y_j = 1/(n - 2f) * sum_{i=f+1}^{n-f} x_(i)j  (x_(i)j the i-th smallest value of coordinate j).
    Yin et al. 2018. Domain: 2f < n.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        f: int | None = spec(None, ge=0, help="values trimmed at each end; default: floor((n-1)/2)")

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        trim = config.f if config is not None and config.f is not None else f
        if trim < f:
            return f"trimmed_mean trims f={trim} values per side but the adversary holds {f} replicas of a stage"
        return _majority_rule("trimmed_mean", n, trim)

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n = vectors.shape[0]
        f = _tolerable(self.config.f, n, (n - 1) // 2)
        s = vectors.sort(0).values
        return s[f : n - f].mean(0)


@AGGREGATORS.register("krum")
class Krum(Aggregator):
    """Krum: the row with the smallest sum of squared distances to its n - f - 2 nearest neighbours.

    score(i) = sum_{j in N_i} ||x_i - x_j||^2, N_i the n - f - 2 rows closest to x_i; y = x_argmin.
    Blanchard et al. 2017. Domain: n > 2f + 2.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        f: int | None = spec(None, ge=0, help="faulty rows tolerated; default: the most n allows, floor((n-3)/2)")

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        f = max(f, config.f or 0) if config is not None else f
        if n <= 2 * f + 2:
            return f"krum cannot tolerate 2f + 2 >= n: got f={f}, n={n} (needs n >= {2 * f + 3})"
        return None

    def _f(self, n: int) -> int:
        return _tolerable(self.config.f, n, (n - 3) // 2)

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if vectors.shape[0] == 1:
            return vectors[0].clone()
        return vectors[int(krum_scores(vectors, self._f(vectors.shape[0])).argmin())].clone()


@AGGREGATORS.register("multi_krum")
class MultiKrum(Krum):
    """Multi-Krum: the mean of the m rows with the smallest Krum scores (m = n - f by default).

    y = 1/m * sum_{i in S} x_i, S the m rows of lowest score(i) (see krum). Domain: n > 2f + 2.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        f: int | None = spec(None, ge=0, help="faulty rows tolerated; default: floor((n-3)/2)")
        m: int | None = spec(None, ge=1, help="rows averaged; default n - f")

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n = vectors.shape[0]
        if n == 1:
            return vectors[0].clone()
        f = self._f(n)
        m = min(n, self.config.m if self.config.m is not None else n - f)
        keep = krum_scores(vectors, f).topk(m, largest=False).indices
        return vectors[keep].mean(0)


@AGGREGATORS.register("centered_clip")
class CenteredClip(Aggregator):
    """Centered clipping: v <- v + mean_i clip(x_i - v, tau), repeated, from the coordinate-wise median.

    clip(z, tau) = z * min(1, tau / ||z||). Karimireddy et al. 2021. `tau` is relative when
    `tau_relative` (default): tau = tau * median_i ||x_i - v_0||, which makes the rule scale-free.
    Domain: 2f < n.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tau: float = spec(1.0, gt=0, help="clipping radius (times the median distance when tau_relative)")
        tau_relative: bool = spec(True, help="tau is a multiple of the median distance to the start point")
        iterations: int = spec(3, ge=1, le=100)

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        return _majority_rule("centered_clip", n, f)

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        x = vectors.to(torch.float64)
        v = coordinate_median(x)
        tau = self.config.tau
        if self.config.tau_relative:
            tau = tau * float((x - v).norm(dim=1).median())
        for _ in range(self.config.iterations):
            z = x - v
            norms = z.norm(dim=1, keepdim=True)
            scale = torch.clamp(tau / norms.clamp_min(1e-300), max=1.0)
            v = v + (z * scale).mean(0)
        return v.to(vectors.dtype)


@AGGREGATORS.register("geometric_median")
class GeometricMedian(Aggregator):
    """Geometric median argmin_y sum_i ||x_i - y||, by smoothed Weiszfeld iterations.

    z <- sum_i a_i x_i / sum_i a_i with a_i = 1 / max(nu, ||x_i - z||), started at the mean.
    Pillutla et al. 2022 (RFA). Breakdown point 1/2. Domain: 2f < n.
    """

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        iterations: int = spec(50, ge=1, le=1000)
        nu: float = spec(1e-8, gt=0, help="smoothing: distances below nu count as nu")
        tol: float = spec(1e-7, gt=0, help="stop when the relative change of z falls below tol")

    @classmethod
    def check_domain(cls, config, n: int, f: int) -> str | None:
        return _majority_rule("geometric_median", n, f)

    def __call__(self, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        x = vectors.to(torch.float64)
        z = x.mean(0)
        for _ in range(self.config.iterations):
            a = 1.0 / (x - z).norm(dim=1).clamp_min(self.config.nu)
            new = (a[:, None] * x).sum(0) / a.sum()
            done = float((new - z).norm()) <= self.config.tol * max(float(z.norm()), 1e-30)
            z = new
            if done:
                break
        return z.to(vectors.dtype)
