"""Adaptive / evasive attacks: the reviewers' main question about SENTINEL (an EMA baseline plus Tukey
fences on distances). All perturb along a harmful direction, x' = x + a * D(x) with ||D(x)|| = ||x||
(attacks/directions.py), and differ in how they choose the strength a.
"""

from __future__ import annotations

import dataclasses

import torch

from attacks.base import Attack, AttackContext
from attacks.detector_view import under_fence
from attacks.directions import DirectionKind, Directions
from sentinel.config import spec
from sentinel.registry import ATTACKS


@ATTACKS.register("fence_evasion")
class FenceEvasion(Attack):
    """White-box: bisect the largest perturbation whose detector scores stay under the current fence.

    Formula (min-max / min-sum adapted to PP, PAPERS.md section 6): x' = x + a* D(x) with
    a* = max {a in [0, max_strength] : score_k(x + a D(x)) <= margin * threshold_k for every k},
    found by `iters` bisection steps, where score and threshold come from the detector's read-only
    view (attacks/detector_view.py): its public thresholds now and the distances it would compute,
    never its verdict. Declines when even a tiny step leaves the fence.
    Without a view (no detector, or a detector that publishes none) or before the detector has a
    fence (empty thresholds) it falls back to the bounded strength a = min(fallback_strength, max_strength).
    """

    NOOP = {"max_strength": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        direction: DirectionKind = spec("negate", help="harmful direction: negate, random, or shared (colluders)")
        max_strength: float = spec(2.0, ge=0, help="largest relative perturbation ||x' - x|| / ||x|| tried")
        fallback_strength: float = spec(0.1, ge=0, help="relative perturbation used without a detector view")
        margin: float = spec(0.95, gt=0, le=1, help="stay under margin * threshold (a safety gap)")
        iters: int = spec(12, ge=1, le=60, help="bisection steps")
        refresh: int = spec(0, ge=0, help="random/shared: steps between new directions (0 = fixed)")

    def __init__(self, config=None):
        super().__init__(config)
        self._dirs = Directions(self.config.direction, self.config.refresh)
        self.view = None

    def attach_view(self, view) -> None:
        self.view = view

    def strength(self, x: torch.Tensor, d: torch.Tensor, ctx: AttackContext) -> float:
        """The relative strength a* (see the class docstring)."""
        c = self.config
        thr = self.view.thresholds(ctx.boundary, ctx.role) if self.view is not None else {}
        if not thr:
            return min(c.fallback_strength, c.max_strength)

        def ok(a: float) -> bool:
            return under_fence(self.view.scores(ctx.boundary, ctx.role, x + a * d, ctx.worker), thr, c.margin)

        if ok(c.max_strength):
            return c.max_strength
        lo, hi = 0.0, c.max_strength
        for _ in range(c.iters):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        d = self._dirs(x, ctx)
        a = self.strength(x, d, ctx)
        return x + a * d if a > 0 else x


@ATTACKS.register("slow_drift")
class SlowDrift(Attack):
    """A perturbation that grows a little every step, so an EMA baseline follows it.

    Formula: x' = x + a_t D(x), a_t = min(max_strength, rate * (t - start + 1)). With a fixed random
    direction the shift is consistent from step to step; each step's change (rate) is meant to stay
    below what the fence tolerates while the total grows to max_strength.
    """

    NOOP = {"rate": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        rate: float = spec(0.01, ge=0, help="growth of the relative perturbation per step")
        max_strength: float = spec(1.0, ge=0, help="cap on the relative perturbation")
        direction: DirectionKind = spec("random", help="negate, random, or shared (colluders)")
        refresh: int = spec(0, ge=0, help="random/shared: steps between new directions (0 = fixed)")

    def __init__(self, config=None):
        super().__init__(config)
        self._dirs = Directions(self.config.direction, self.config.refresh)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        a = min(self.config.max_strength, self.config.rate * (ctx.since + 1))
        return x + a * self._dirs(x, ctx)


@ATTACKS.register("warmup_poisoning")
class WarmupPoisoning(Attack):
    """Attack from step 0 so the detector's baseline and fences learn the attack as normal traffic.

    Formula: x' = x + a D(x) with a ~ U(0, strength) (seeded per message) while t - start < switch --
    widening the spread of the distances the fence is fitted on -- then a = strength afterwards: a
    persistent perturbation at the top of the spread the detector learned. Must start at step 0.
    """

    NOOP = {"strength": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        strength: float = spec(0.5, ge=0, help="relative perturbation (upper end during warm-up)")
        switch: int = spec(50, ge=0, help="steps of random-strength poisoning before the full attack")
        direction: DirectionKind = spec("random", help="negate, random, or shared (colluders)")
        refresh: int = spec(0, ge=0, help="random/shared: steps between new directions (0 = fixed)")

    def __init__(self, config=None):
        super().__init__(config)
        self._dirs = Directions(self.config.direction, self.config.refresh)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        a = self.config.strength
        if ctx.since < self.config.switch:
            a *= float(torch.rand((), generator=ctx.generator(salt=0x3A)))
        return x + a * self._dirs(x, ctx)

    @classmethod
    def check(cls, index, spec, scenario, malicious):
        if spec.start != 0:
            return [
                (
                    f"adversary.attacks[{index}].start",
                    f"warmup_poisoning acts from step 0 (that is the attack: "
                    f"the baseline learns it), got start {spec.start}; use slow_drift or another attack instead",
                )
            ]
        return []
