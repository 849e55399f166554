"""Result 3: a linearly growing perturbation tracked by an EMA baseline stays at a constant distance.

Baseline b_t = beta * b_{t-1} + (1 - beta) * x_t, attacked stream x_t = h_t + t * delta * u (honest part h_t,
unit direction u). The verifier compares x_t with the baseline *before* folding x_t in (a flagged message
must not update it): d_t = ||x_t - b_{t-1}||. See ema_drift.md.

`simulate_drift` is a plain EMA simulation. It is the single seam to re-point at the testbed's own SENTINEL
detector and slow_drift attack once they exist; the check only consumes its `DriftTrace`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from proofs.result import Result

NAME = "ema_drift"
STATEMENT = "drift delta/step sits at delta/(1-beta) before the EMA update (delta*beta/(1-beta) after); evades tau"


@dataclass(frozen=True)
class DriftTrace:
    """What a verifier saw during one attacked run.

    Attributes:
        before: (steps,) distances ||x_t - b_{t-1}|| that a fence is applied to.
        after: (steps,) distances ||x_t - b_t|| once x_t is folded in.
        flags: (steps,) True where before > tau (flagged messages do not update the baseline).
        perturbation: (steps,) norm of the injected perturbation t * delta.
    """

    before: np.ndarray
    after: np.ndarray
    flags: np.ndarray
    perturbation: np.ndarray


def simulate_drift(
    beta: float,
    delta: float,
    steps: int,
    *,
    tau: float = math.inf,
    noise_std: float = 0.0,
    dim: int = 1,
    seed: int = 0,
    honest: np.ndarray | None = None,
) -> DriftTrace:
    """Runs an EMA baseline against a slow-drift attack.

    Args:
        beta: EMA decay in [0, 1).
        delta: Drift per step (norm of the per-step increment).
        steps: Attacked steps T; the baseline starts at the honest mean 0 (end of an honest warm-up).
        tau: Fixed fence on the pre-update distance; flagged messages leave the baseline unchanged.
        noise_std: Standard deviation of the i.i.d. Gaussian honest part h_t (per coordinate).
        dim: Dimension of the messages.
        seed: Seed of the honest noise.
        honest: Optional (steps, dim) honest part, overriding noise_std / seed (to replay the same noise).

    Returns:
        The distances, flags and perturbation sizes, step by step.
    """
    if not 0 <= beta < 1 or steps < 1:
        raise ValueError(f"Need 0 <= beta < 1 and steps >= 1 (got beta={beta}, steps={steps}).")
    if honest is None:
        honest = np.random.default_rng(seed).normal(0.0, noise_std, size=(steps, dim))
    direction = np.ones(dim) / math.sqrt(dim)
    baseline = np.zeros(dim)
    before, after, flags = np.empty(steps), np.empty(steps), np.zeros(steps, dtype=bool)
    for t in range(steps):
        x = honest[t] + (t + 1) * delta * direction
        before[t] = np.linalg.norm(x - baseline)
        flags[t] = before[t] > tau
        if not flags[t]:
            baseline = beta * baseline + (1 - beta) * x
        after[t] = np.linalg.norm(x - baseline)
    return DriftTrace(before, after, flags, delta * np.arange(1, steps + 1))


def max_evading_drift(tau: float, beta: float, compare: str = "before") -> float:
    """Largest delta never flagged by a fence tau: tau*(1-beta) before the update, tau*(1-beta)/beta after."""
    return tau * (1 - beta) if compare == "before" else tau * (1 - beta) / beta


def first_flag_step(tau: float, beta: float, delta: float) -> float:
    """Predicted first t (1-based) with delta*(1 - beta^t)/(1 - beta) > tau, or inf if never."""
    ratio = 1 - tau * (1 - beta) / delta
    if ratio <= 0:
        return math.inf
    return math.floor(math.log(ratio) / math.log(beta)) + 1 if beta > 0 else 1


_BETAS = [0.6, 0.8, 0.9, 0.99]


def check(seed: int = 0, steps: int = 2_000) -> Result:
    """Simulated EMA vs the closed forms, for several beta and random drift rates and fences.

    Sub-checks per beta: (i) d_t = delta(1-beta^t)/(1-beta) and post-update distance beta*d_t; (ii) at
    0.999*delta_max nothing is flagged in `steps` steps and T*delta_max perturbation accumulates; (iii) at
    1.05*delta_max the first flag comes at the predicted step; (iv) with honest noise in 8 dimensions, the
    distance moves by at most the drift's deterministic offset (triangle inequality, same noise replayed).
    Headline (beta = 0.9): bound = tau, measured = max pre-update distance at delta_max.
    """
    rng = np.random.default_rng(seed)
    ok, notes, headline = True, [], None
    for beta in _BETAS:
        delta, tau = rng.uniform(0.01, 1.0), rng.uniform(0.5, 5.0)
        t = np.arange(1, steps + 1)
        trace = simulate_drift(beta, delta, steps)
        closed = delta * (1 - beta**t) / (1 - beta)
        ok &= np.allclose(trace.before, closed, rtol=1e-9) and np.allclose(trace.after, beta * closed, rtol=1e-9)

        d_max = max_evading_drift(tau, beta)
        under = simulate_drift(beta, 0.999 * d_max, steps, tau=tau)
        ok &= not under.flags.any() and math.isclose(under.perturbation[-1], 0.999 * steps * d_max)
        over = simulate_drift(beta, 1.05 * d_max, steps, tau=tau)
        predicted = first_flag_step(tau, beta, 1.05 * d_max)
        flagged_at = int(np.argmax(over.flags)) + 1 if over.flags.any() else math.inf
        ok &= abs(flagged_at - predicted) <= 1  # +-1 for rounding at the crossing

        honest = rng.normal(0.0, 0.3, size=(steps, 8))
        clean = simulate_drift(beta, 0.0, steps, honest=honest, dim=8)
        drifted = simulate_drift(beta, delta, steps, honest=honest, dim=8)
        ok &= bool(np.all(np.abs(drifted.before - clean.before) <= closed + 1e-9))
        notes.append(
            f"beta={beta}: delta_max={d_max:.3g} (tau={tau:.3g}), max d={under.before.max():.4g}, "
            f"flag at t={flagged_at} (pred {predicted}), drift after T={steps}: {under.perturbation[-1]:.3g}"
        )
        if beta == 0.9:
            headline = (tau, float(under.before.max()))
    assert headline is not None
    bound, measured = headline
    return Result(
        name=NAME,
        statement=STATEMENT,
        bound=bound,
        measured=measured,
        margin=bound - measured,
        ok=ok and measured <= bound,
        detail="; ".join(notes),
    )
