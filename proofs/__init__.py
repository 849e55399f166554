"""Theoretical results behind the testbed, each with an executable numerical check.

Every result lives in `proofs/<name>.md` (statement, assumptions, proof, references) and `proofs/<name>.py`
(the public functions plus `check(seed) -> Result`). `python -m proofs [--seed N] [--only NAME]` runs the
checks in the order below and exits 0 iff all pass.
"""

from __future__ import annotations

from collections.abc import Callable

from proofs import convergence, detection_power, ema_drift, fence_fpr, honest_majority
from proofs.result import Result

# Numbered as in the issue: 1 honest majority, 2 fence FPR, 3 EMA drift, 4 convergence, 5 detection power.
CHECKS: dict[str, Callable[[int], Result]] = {
    module.NAME: module.check for module in (honest_majority, fence_fpr, ema_drift, convergence, detection_power)
}


def run_all(seed: int = 0, only: list[str] | None = None) -> list[Result]:
    """Runs the registered checks (all, or those named in `only`) with one seed each.

    Raises:
        ValueError: If a name in `only` is not registered.
    """
    unknown = sorted(set(only or []) - set(CHECKS))
    if unknown:
        raise ValueError(f"Unknown check(s) {unknown}; registered: {list(CHECKS)}.")
    return [check(seed) for name, check in CHECKS.items() if not only or name in only]


__all__ = ["CHECKS", "Result", "run_all"]
