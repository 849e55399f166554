"""Result 1 (SENTINEL Lemma 1): probability that random assignment breaks honest majority in some stage.

`num_malicious` workers are placed uniformly at random among the `num_stages * num_replicas` slots (or
among the slots of the middle stages when the first and last stages are protected). A stage is
*compromised* when its malicious count m satisfies 2*m >= num_replicas, i.e. it has no strict honest
majority. See honest_majority.md for statement and proof.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from proofs.result import Result

NAME = "honest_majority"
STATEMENT = "P(some stage has 2m>=R) = exact DP <= S*hypergeom tail <= S*exp(-R*KL) <= S*exp(-2R(a-p)^2)"


def _validate(num_stages: int, num_replicas: int, num_malicious: int, protect_ends: bool) -> int:
    """Checks the arguments and returns the number of stages that can receive malicious workers."""
    if num_stages < 1 or num_replicas < 1:
        raise ValueError(f"num_stages ({num_stages}) and num_replicas ({num_replicas}) must be >= 1.")
    open_stages = num_stages - 2 if protect_ends else num_stages
    if protect_ends and open_stages < 1:
        raise ValueError(f"protect_ends needs num_stages >= 3 (got {num_stages}): no middle stage is left.")
    if not 0 <= num_malicious <= open_stages * num_replicas:
        raise ValueError(
            f"num_malicious ({num_malicious}) must lie in [0, {open_stages * num_replicas}], the number of "
            f"slots open to malicious workers ({open_stages} stages x {num_replicas} replicas)."
        )
    return open_stages


def count_safe_assignments(num_stages: int, num_replicas: int, num_malicious: int) -> int:
    """Number of malicious slot sets that leave every stage with a strict honest majority.

    Dynamic programming over stages on the generating polynomial prod_s sum_{m<=t} C(R, m) x^m with
    t = (R - 1) // 2; the coefficient of x^f is the count. Exact integer arithmetic.

    Args:
        num_stages: Stages S that receive malicious workers.
        num_replicas: Replicas R per stage.
        num_malicious: Malicious workers f.

    Returns:
        The exact count, to be divided by C(S*R, f).
    """
    max_safe = (num_replicas - 1) // 2  # largest m with 2m < R
    per_stage = [math.comb(num_replicas, m) for m in range(min(max_safe, num_malicious) + 1)]
    poly = [1]  # poly[j]: ways to place j malicious workers in the stages seen so far, all safe
    for _ in range(num_stages):
        new = [0] * min(len(poly) + len(per_stage) - 1, num_malicious + 1)
        for j, ways in enumerate(poly):
            for m, c in enumerate(per_stage[: len(new) - j]):
                new[j + m] += ways * c
        poly = new
    return poly[num_malicious] if num_malicious < len(poly) else 0


def prob_stage_compromised(
    num_stages: int, num_replicas: int, num_malicious: int, exact: bool = True, protect_ends: bool = False
) -> float:
    """Probability that at least one stage has no strict honest majority (2*m_s >= R).

    Args:
        num_stages: Pipeline stages S.
        num_replicas: Data-parallel replicas R per stage.
        num_malicious: Malicious workers f, assigned uniformly at random.
        exact: True: exact multivariate-hypergeometric value. False: the union bound
            S * P(Hypergeom(N, f, R) >= ceil(R/2)), an upper bound that is O(1) to compute.
        protect_ends: First and last stages are honest; the f malicious workers are spread over the
            (S - 2) * R middle slots.

    Returns:
        The probability (exact) or its union upper bound (capped at 1).

    Raises:
        ValueError: On impossible sizes.
    """
    open_stages = _validate(num_stages, num_replicas, num_malicious, protect_ends)
    if not exact:
        return union_bound(open_stages, num_replicas, num_malicious)
    total = math.comb(open_stages * num_replicas, num_malicious)
    safe = count_safe_assignments(open_stages, num_replicas, num_malicious)
    return (total - safe) / total  # int / int is correctly rounded, even for huge ints


def union_bound(num_stages: int, num_replicas: int, num_malicious: int) -> float:
    """S * P(one stage has >= ceil(R/2) malicious), the stage count being Hypergeom(S*R, f, R)."""
    tail = stats.hypergeom.sf((num_replicas + 1) // 2 - 1, num_stages * num_replicas, num_malicious, num_replicas)
    return min(1.0, num_stages * float(tail))


def chernoff_bound(num_stages: int, num_replicas: int, num_malicious: int, pinsker: bool = False) -> float:
    """S * exp(-R * KL(a || p)) with a = ceil(R/2)/R, p = f/N (Hoeffding 1963, valid without replacement).

    With `pinsker`, the weaker S * exp(-2 R (a - p)^2). Returns 1 when a <= p (no concentration to use).
    """
    a = ((num_replicas + 1) // 2) / num_replicas
    p = num_malicious / (num_stages * num_replicas)
    if a <= p:
        return 1.0
    if pinsker:
        exponent = 2 * (a - p) ** 2
    else:
        kl_hi = a * math.log(a / p) if p > 0 else math.inf
        kl_lo = (1 - a) * math.log((1 - a) / (1 - p)) if a < 1 else 0.0
        exponent = kl_hi + kl_lo
    return min(1.0, num_stages * math.exp(-num_replicas * exponent))


def monte_carlo(num_stages: int, num_replicas: int, num_malicious: int, trials: int, rng: np.random.Generator) -> float:
    """Fraction of uniformly random worker permutations that leave some stage compromised."""
    num_workers = num_stages * num_replicas
    malicious = np.argsort(rng.random((trials, num_workers)), axis=1) < num_malicious  # random permutation
    counts = malicious.reshape(trials, num_stages, num_replicas).sum(axis=2)  # (trials, S)
    return float(np.mean((2 * counts >= num_replicas).any(axis=1)))


# (S, R, f, protect_ends): small to SENTINEL-sized meshes (16 PP x 8 DP at 25% malicious is the second),
# probabilities from ~0.02 to ~0.9; the last one is where the Chernoff bounds become non-trivial.
_CONFIGS = [(8, 6, 12, False), (16, 8, 32, False), (16, 8, 28, True), (12, 16, 40, True), (16, 32, 128, False)]
_HEADLINE = (16, 32, 128)


def check(seed: int = 0, cells: int = 5_000_000) -> Result:
    """Exact value vs Monte Carlo (4.5-sigma CI) and the bound chain, over `_CONFIGS`.

    Args:
        seed: Seed of the Monte Carlo permutations.
        cells: Budget of random numbers per configuration (trials = min(20000, cells // N)).

    Returns:
        Headline on `_HEADLINE`: bound = Chernoff union bound S*exp(-R*KL) (Lemma 1's form), measured = Monte
        Carlo estimate. The hypergeometric union bound is nearly tight there, so it is compared with the exact
        value, not with the noisy estimate.
    """
    rng = np.random.default_rng(seed)
    ok, notes, headline = True, [], None
    for num_stages, num_replicas, num_malicious, protect in _CONFIGS:
        open_stages = num_stages - 2 if protect else num_stages
        exact = prob_stage_compromised(num_stages, num_replicas, num_malicious, protect_ends=protect)
        trials = min(20_000, cells // (open_stages * num_replicas))
        mc = monte_carlo(open_stages, num_replicas, num_malicious, trials, rng)
        chain = [
            exact,
            union_bound(open_stages, num_replicas, num_malicious),
            chernoff_bound(open_stages, num_replicas, num_malicious),
            chernoff_bound(open_stages, num_replicas, num_malicious, pinsker=True),
        ]
        half_width = 4.5 * math.sqrt(max(exact * (1 - exact), 1 / trials) / trials)
        ok &= abs(mc - exact) <= half_width and all(lo <= hi * (1 + 1e-12) for lo, hi in zip(chain, chain[1:]))
        tag = f"S{num_stages}R{num_replicas}f{num_malicious}{'p' if protect else ''}"
        notes.append(f"{tag}: exact={exact:.3g} mc={mc:.3g} union={chain[1]:.3g} kl={chain[2]:.3g}")
        if (num_stages, num_replicas, num_malicious) == _HEADLINE:
            headline = (chain[2], mc)
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
