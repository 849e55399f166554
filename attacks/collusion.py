"""Collusion: several malicious workers coordinate through a shared seed and shared state.

All colluders of one attack spec are run by the same attack instance, which is how they share state
(a real coalition would share a seed and a side channel). Two patterns:

- `same_direction`: every colluder adds the same seeded direction, so perturbations sent by different
  replicas, microbatches and (on the DP axis) contributions add up instead of averaging out.
- `undo_pair`: adjacent malicious stages s and s+1. The upstream sender (s forward, s+1 backward)
  adds delta on the link between them; the colluder that receives it subtracts delta from what it
  sends on, before the next boundary's verifier sees it. Through the residual stream
  f(h + delta) - delta = h + F(h + delta), so downstream traffic looks nearly honest while the pair's
  own link carries the perturbation. Threat model: the injector only injects when the message's
  receiver is a colluder (it knows whom it sends to), so the undo always happens; a verifier on the
  pair's link still sees the tampered message. It probes attribution (who gets blamed, whether
  downstream honest workers are falsely flagged), which the paper reports collusion makes harder.
  The pair shares delta through the attack instance, i.e. in one process: under the `dist` backend
  (one process per stage) the undo half never learns delta, so use it with `sim`.
"""

from __future__ import annotations

import dataclasses

import torch

from attacks.assignment import parse_worker
from attacks.base import Attack, AttackContext
from attacks.directions import Directions
from sentinel.config import spec
from sentinel.registry import ATTACKS
from sentinel.transport.message import Role


@ATTACKS.register("same_direction")
class SameDirection(Attack):
    """Collusion: every colluder adds the same seeded direction, scaled to its message's norm.

    Formula: x' = x + strength * ||x|| * u, u a unit Gaussian direction seeded by (scenario seed,
    boundary, role, refresh epoch) only -- identical for every colluder on that boundary and direction.
    """

    NOOP = {"strength": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        strength: float = spec(0.5, ge=0, help="relative perturbation norm ||x' - x|| / ||x||")
        refresh: int = spec(0, ge=0, help="steps between new shared directions (0 = fixed for the run)")

    def __init__(self, config=None):
        super().__init__(config)
        self._dirs = Directions("shared", self.config.refresh)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return x + self.config.strength * self._dirs(x, ctx)


@ATTACKS.register("undo_pair")
class UndoPair(Attack):
    """Collusion of adjacent stages: s adds delta on its link, s+1 removes it before the next verifier.

    Formula: injector (its receiver is a colluder): x' = x + delta, delta = magnitude * ||x|| * u with
    u a unit direction seeded by the message identity (shared by the pair); undoer (it received that
    microbatch's injected message): x' = x - undo * delta. The undo acts whatever the `prob` draw.
    Roles: activation (s injects, s+1 undoes) and gradient (s+1 injects, s undoes).
    """

    ROLES = frozenset({"activation", "gradient"})
    NOOP = {"magnitude": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        magnitude: float = spec(1.0, ge=0, help="relative norm of delta on the pair's link")
        undo: float = spec(1.0, ge=0, le=1, help="share of delta the downstream colluder removes")

    def __init__(self, config=None):
        super().__init__(config)
        self._pending: dict[tuple[int, int, int], tuple[int, torch.Tensor]] = {}

    @staticmethod
    def _upstream(ctx: AttackContext) -> int:
        return ctx.boundary - 1 if ctx.role == Role.ACTIVATION else ctx.boundary + 1

    def _injected(self, ctx: AttackContext) -> torch.Tensor | None:
        hit = self._pending.get((ctx.step, ctx.mb_idx, int(ctx.role)))
        return hit[1] if hit is not None and hit[0] == self._upstream(ctx) else None

    def forced(self, ctx: AttackContext) -> bool:
        return self._injected(ctx) is not None

    @staticmethod
    def _can_inject(ctx: AttackContext) -> bool:
        """The receiver is a colluder that will send this microbatch on over another boundary."""
        forwards = ctx.boundary + 1 < ctx.num_stages - 1 if ctx.role == Role.ACTIVATION else ctx.boundary > 0
        return forwards and ctx.receiver in ctx.colluders

    def wants(self, ctx: AttackContext) -> bool:
        return self.forced(ctx) or self._can_inject(ctx)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        key = (ctx.step, ctx.mb_idx, int(ctx.role))
        delta = self._injected(ctx)
        if delta is not None:
            del self._pending[key]
            return x - self.config.undo * delta.to(x.dtype)
        if not self._can_inject(ctx):
            return x
        u = torch.randn(x.shape, generator=ctx.shared_generator(salt=0x0D0), dtype=torch.float64)
        delta = (self.config.magnitude * x.detach().double().norm() / u.norm() * u).to(x.dtype)
        self._pending = {k: v for k, v in self._pending.items() if k[0] >= ctx.step}  # bounded: this step only
        self._pending[key] = (ctx.boundary, delta)
        return x + delta

    @classmethod
    def check(cls, index, spec, scenario, malicious):
        stages = {(parse_worker(w) or (-9, 0))[0] for w in (spec.workers or malicious)}
        if not any(s + 1 in stages for s in stages):
            return [
                (
                    f"adversary.attacks[{index}].workers",
                    "undo_pair needs colluders in two adjacent stages "
                    f"(its workers are in stages {sorted(stages)}); list workers of stages s and s+1",
                )
            ]
        return []
