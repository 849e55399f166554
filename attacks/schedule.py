"""When an attack acts: `start`, `stop`, `every`/`duty` (step gating) and `prob` (per-message draw).

Every attack spec in a scenario carries these keys (sentinel/scenario.py `AttackSpec`):

    active(step)  = start <= step < stop  and  (step - start) % every < duty
    fires(ctx)    = u(ctx) < prob, with u a uniform number derived from (scenario seed, attack index,
                    step, mb, boundary, role, sender) -- so the same message gets the same draw in
                    every run, whatever else happened before it.
"""

from __future__ import annotations

import dataclasses

from attacks.base import AttackContext, seeded_int

_PROB_SALT = 0x9B0B


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    start: int = 0
    stop: int | None = None
    every: int = 1
    duty: int = 1
    prob: float = 1.0

    @classmethod
    def from_spec(cls, spec) -> Schedule:
        return cls(start=spec.start, stop=spec.stop, every=spec.every, duty=spec.duty, prob=spec.prob)

    def active(self, step: int) -> bool:
        """Whether the step-level schedule lets the attack act at `step`."""
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        return (step - self.start) % self.every < self.duty

    def fires(self, ctx: AttackContext) -> bool:
        """The seeded per-message Bernoulli(prob) draw."""
        if self.prob >= 1.0:
            return True
        if self.prob <= 0.0:
            return False
        u = seeded_int(*ctx.identity(), _PROB_SALT) / float(1 << 63)
        return u < self.prob


def schedule_problems(spec, steps: int) -> list[tuple[str, str]]:
    """Schedule keys that make an attack silently never (or always) act: [(key, message)]."""
    out = []
    if spec.stop is not None and spec.stop <= spec.start:
        out.append(("stop", f"stop ({spec.stop}) must be > start ({spec.start}), or the attack never acts"))
    if spec.duty > spec.every:
        out.append(
            (
                "duty",
                f"duty ({spec.duty}) must be <= every ({spec.every}): it is the number of active "
                "steps in each period of `every` steps",
            )
        )
    if spec.start >= steps:
        out.append(
            (
                "start",
                f"start ({spec.start}) >= training.steps ({steps}): the attack never acts; "
                "lower start or raise training.steps",
            )
        )
    return out
