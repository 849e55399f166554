"""Result 4 (SENTINEL Theorem 1): SGD with bounded undetected perturbations reaches a tau^2-neighbourhood.

For L-smooth f >= f*, x_{t+1} = x_t - eta (g_t + e_t), E[g_t | x_t] = grad f(x_t), E||g_t - grad f(x_t)||^2 <= sigma^2,
||e_t|| <= tau and eta <= 1/L:

    (1/T) sum_{t<T} E||grad f(x_t)||^2 <= 2 (f(x_0) - f*) / (eta T) + L eta sigma^2 + tau^2 + 2 chi L eta sigma tau,

with chi = 0 when e_t cannot see the gradient noise of step t, chi = 1 otherwise. Proof in convergence.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from proofs.result import Result

NAME = "convergence"
STATEMENT = "avg E||grad f||^2 <= 2(f0-f*)/(eta T) + L eta sigma^2 + tau^2 (+2 L eta sigma tau if e_t sees the noise)"


@dataclass(frozen=True)
class Problem:
    """An L-smooth objective with a known lower bound, evaluated on a batch of points (runs, dim)."""

    name: str
    smoothness: float
    lower_bound: float
    value: Callable[[np.ndarray], np.ndarray]
    grad: Callable[[np.ndarray], np.ndarray]


def quadratic(dim: int, smoothness: float, rng: np.random.Generator) -> Problem:
    """f(x) = (x - x*)^T A (x - x*) / 2, A = Q diag(lam) Q^T with spectrum in [0.05 L, L] and max exactly L; f* = 0."""
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    lam = rng.uniform(0.05, 1.0, size=dim) * smoothness
    lam[0] = smoothness
    a = (q * lam) @ q.T
    x_star = rng.normal(size=dim)
    return Problem(
        "quadratic",
        smoothness,
        0.0,
        value=lambda x: 0.5 * np.einsum("bi,ij,bj->b", x - x_star, a, x - x_star),
        grad=lambda x: (x - x_star) @ a,
    )


def cosine(dim: int, smoothness: float, wiggle: float) -> Problem:
    """f(x) = c * sum_i (x_i^2 / 2 + a cos x_i), c = L / (1 + a): non-convex for a > 1, |f''| <= c (1 + a) = L.

    Its infimum is c * dim * min_y (y^2/2 + a cos y), found by a grid search refined with Brent's method.
    """
    c = smoothness / (1 + wiggle)
    grid = np.linspace(-wiggle - 1, wiggle + 1, 4001)
    one_d = lambda y: 0.5 * y * y + wiggle * np.cos(y)  # noqa: E731
    start = grid[np.argmin(one_d(grid))]
    step = grid[1] - grid[0]
    best = optimize.minimize_scalar(one_d, bounds=(start - step, start + step), method="bounded").fun
    return Problem(
        "cosine",
        smoothness,
        c * dim * min(best, one_d(grid).min()),
        value=lambda x: c * np.sum(0.5 * x * x + wiggle * np.cos(x), axis=1),
        grad=lambda x: c * (x - wiggle * np.sin(x)),
    )


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


def _cancel(grad: np.ndarray, _noisy: np.ndarray, tau: float, _rng: np.random.Generator) -> np.ndarray:
    """-clip(grad, tau): cancels the gradient up to norm tau, stalling SGD wherever ||grad|| <= tau."""
    norm = np.linalg.norm(grad, axis=1, keepdims=True)
    return -grad * np.minimum(1.0, tau / np.maximum(norm, 1e-300))


# Each adversary maps (true gradient, stochastic gradient, tau, rng) to a perturbation of norm <= tau.
ADVERSARIES: dict[str, Callable[..., np.ndarray]] = {
    "oppose": lambda grad, _g, tau, _rng: -tau * _unit(grad),  # white box, pushes uphill at full budget
    "cancel": _cancel,
    "random": lambda grad, _g, tau, rng: tau * _unit(rng.normal(size=grad.shape)),
    "noise_aware": lambda _grad, g, tau, _rng: -tau * _unit(g),  # sees this step's noisy gradient: chi = 1
}
SEES_NOISE = {"noise_aware"}


def theorem_bound(gap: float, smoothness: float, eta: float, sigma: float, tau: float, steps: int, chi: bool) -> float:
    """Right-hand side of Theorem 1 (requires eta <= 1/L)."""
    if not 0 < eta <= 1 / smoothness * (1 + 1e-12):
        raise ValueError(f"Theorem 1 needs 0 < eta <= 1/L = {1 / smoothness:.4g} (got eta={eta:.4g}).")
    return 2 * gap / (eta * steps) + smoothness * eta * sigma**2 + tau**2 + 2 * chi * smoothness * eta * sigma * tau


def run_sgd(
    problem: Problem,
    x0: np.ndarray,
    eta: float,
    sigma: float,
    tau: float,
    adversary: str,
    steps: int,
    runs: int,
    rng: np.random.Generator,
) -> float:
    """Mean over `runs` independent runs of (1/T) sum_{t<T} ||grad f(x_t)||^2 (estimates the theorem's left side).

    The gradient noise is sigma * z / sqrt(dim), z ~ N(0, I), so E||noise||^2 = sigma^2 exactly.
    """
    x = np.repeat(x0[None, :], runs, axis=0)  # (runs, dim)
    attack = ADVERSARIES[adversary]
    total = np.zeros(runs)
    for _ in range(steps):
        grad = problem.grad(x)
        total += np.sum(grad * grad, axis=1)
        noisy = grad + sigma / math.sqrt(x.shape[1]) * rng.normal(size=x.shape)
        x = x - eta * (noisy + attack(grad, noisy, tau, rng))
    return float(np.mean(total) / steps)


def measure(
    problem: Problem,
    x0: np.ndarray,
    eta: float,
    sigma: float,
    tau: float,
    adversary: str,
    steps: int,
    runs: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """(measured, bound) for one configuration."""
    gap = float(problem.value(x0[None, :])[0]) - problem.lower_bound
    bound = theorem_bound(gap, problem.smoothness, eta, sigma, tau, steps, adversary in SEES_NOISE)
    return run_sgd(problem, x0, eta, sigma, tau, adversary, steps, runs, rng), bound


def check(seed: int = 0, steps: int = 1_000, runs: int = 16) -> Result:
    """Every adversary on a random quadratic and a non-convex cosine landscape, at two noise levels.

    Asserts measured <= bound everywhere and that the bound is not vacuous (max measured/bound > 1e-3).
    Headline: the configuration with the largest measured/bound ratio.
    """
    rng = np.random.default_rng(seed)
    dim, smoothness, tau = 10, 2.0, 0.3
    problems = [quadratic(dim, smoothness, rng), cosine(dim, smoothness, wiggle=2.0)]
    ratios = []
    for problem in problems:
        x0 = rng.normal(0.0, 2.0, size=dim)
        for sigma in (0.0, 1.0):
            for adversary in ADVERSARIES:
                measured, bound = measure(problem, x0, 1 / smoothness, sigma, tau, adversary, steps, runs, rng)
                ratios.append((measured / bound, measured, bound, f"{problem.name}/{adversary}/sigma={sigma}"))
    worst = max(ratios)
    detail = ", ".join(f"{tag}: {r:.3f}" for r, _, _, tag in sorted(ratios, reverse=True)[:4])
    ok = all(m <= b for _, m, b, _ in ratios) and worst[0] > 1e-3
    return Result(
        name=NAME,
        statement=STATEMENT,
        bound=worst[2],
        measured=worst[1],
        margin=worst[2] - worst[1],
        ok=ok,
        detail=f"{len(ratios)} runs x {runs} seeds, T={steps}, tau={tau}; top measured/bound: {detail}",
    )
