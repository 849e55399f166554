"""Evasive gating of any other attack: `intermittent` (on/off duty cycle) and `sparse` (a few messages).

Both wrap an inner attack given by name and parameters::

    - {name: intermittent, role: activation, attack: scaling, params: {alpha: -1}, on_steps: 5, off_steps: 15}

The inner parameters are validated against the inner attack's Config, with located errors
(`adversary.attacks[0].params.alpha: ...`). The generic schedule keys (`every`/`duty`, `prob`) gate
every attack the same way for the whole coalition; these wrappers exist so adaptive scenarios read
as what they study, and add per-worker phases (intermittent) and an independent draw (sparse).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from attacks.base import Attack, AttackContext, _crc, seeded_int
from sentinel.config import build, spec
from sentinel.errors import ConfigError
from sentinel.registry import ATTACKS

_NOT_WRAPPABLE = ("target_corruption",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WrapConfig:
    attack: str = spec("scaling", help="the inner attack (a registered attack name)")
    params: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"help": "the inner attack's parameters"})


class Wrapper(Attack):
    """An attack that decides *when* and delegates *what* to an inner attack."""

    def __init__(self, config=None):
        super().__init__(config)
        inner_cls = ATTACKS.get(self.config.attack)
        self.inner: Attack = inner_cls(build(inner_cls.Config, self.config.params))

    def gate(self, ctx: AttackContext) -> bool:
        raise NotImplementedError

    def wants(self, ctx: AttackContext) -> bool:
        return self.gate(ctx) and self.inner.wants(ctx)

    def apply(self, x: torch.Tensor, ctx: AttackContext) -> torch.Tensor:
        return self.inner.apply(x, ctx)

    def observe(self, x: torch.Tensor, ctx: AttackContext) -> None:
        self.inner.observe(x, ctx)

    def forced(self, ctx: AttackContext) -> bool:
        return self.inner.forced(ctx)

    def attach_view(self, view) -> None:
        self.inner.attach_view(view)

    @classmethod
    def check(cls, index, spec, scenario, malicious):
        path, cfg = f"adversary.attacks[{index}]", spec.config
        if cfg.attack in _NOT_WRAPPABLE:
            return [
                (
                    f"{path}.attack",
                    f"{cfg.attack!r} cannot be wrapped (it does not act on message tensors); "
                    "use its own start/stop/every/duty/prob keys",
                )
            ]
        try:
            inner_cls = ATTACKS.get(cfg.attack)
        except ConfigError as exc:
            return [(f"{path}.attack", str(exc))]
        try:
            build(inner_cls.Config, cfg.params, f"{path}.params")
        except ConfigError as exc:
            return [tuple(p.split(": ", 1)) if ": " in p else (f"{path}.params", p) for p in exc.problems]
        roles = {"both": {"activation", "gradient"}}.get(spec.role, {spec.role})
        if not roles <= inner_cls.ROLES:
            return [
                (
                    f"{path}.role",
                    f"inner attack {cfg.attack!r} supports role(s) "
                    f"{', '.join(sorted(inner_cls.ROLES))}, got {spec.role!r}",
                )
            ]
        return inner_cls.check(index, spec, scenario, malicious)


@ATTACKS.register("intermittent")
class Intermittent(Wrapper):
    """Run an inner attack on an on/off duty cycle, with a seeded phase per worker.

    Formula: acts at step t when (t - start + phase_w) mod (on_steps + off_steps) < on_steps, with
    phase_w a seeded offset per worker (0 when random_phase is false), so a detector's sliding window
    keeps seeing honest stretches and colluders are not all on at once.
    """

    NOOP = {"params": {"alpha": 1.0}}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(WrapConfig):
        on_steps: int = spec(5, ge=1, help="steps on (not `on`: YAML 1.1 reads it as a boolean)")
        off_steps: int = spec(5, ge=0, help="steps off")
        random_phase: bool = spec(True, help="a seeded phase per worker")

    def gate(self, ctx: AttackContext) -> bool:
        c = self.config
        period = c.on_steps + c.off_steps
        phase = seeded_int(ctx.seed, 0x1A7, _crc(ctx.worker)) % period if c.random_phase else 0
        return (ctx.since + phase) % period < c.on_steps


@ATTACKS.register("sparse")
class Sparse(Wrapper):
    """Run an inner attack on a small random share p of the messages only.

    Formula: acts on a message when u < p, u a uniform number seeded by the message identity
    (independent of the generic `prob` draw). Few tampered messages keep any windowed statistic close
    to honest while each tampered one is still harmful.
    """

    NOOP = {"p": 0.0}

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(WrapConfig):
        p: float = spec(0.1, ge=0, le=1, help="probability of acting on a message")

    def gate(self, ctx: AttackContext) -> bool:
        return seeded_int(*ctx.identity(), 0x5BA) / float(1 << 63) < self.config.p
