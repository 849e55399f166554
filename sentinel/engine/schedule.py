"""Pipeline schedules as data: per-stage lists of actions, run by one dependency-driven executor.

An action is (stage, F|B, microbatch), printed like torch pipelining as "2F0" / "2B0".
Invariants (unit-tested, no processes needed): every (stage, mb) has exactly one F and one B, F
precedes B within a stage, backwards run in microbatch order (so gradient accumulation order and
hence the numbers do not depend on the schedule), and 1F1B keeps at most S - s microbatches in
flight on stage s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from sentinel.errors import ConfigError


class Action(NamedTuple):
    stage: int
    kind: str  # "F" or "B"
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


def gpipe(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """All forwards, then all backwards (in microbatch order)."""
    return [
        [Action(s, "F", m) for m in range(num_microbatches)] + [Action(s, "B", m) for m in range(num_microbatches)]
        for s in range(num_stages)
    ]


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """1F1B: S-s-1 warm-up forwards, then alternate one forward / one backward, then drain."""
    out = []
    for s in range(num_stages):
        warm = min(num_stages - s - 1, num_microbatches)
        acts = [Action(s, "F", m) for m in range(warm)]
        for i in range(num_microbatches - warm):
            acts += [Action(s, "F", warm + i), Action(s, "B", i)]
        acts += [Action(s, "B", m) for m in range(num_microbatches - warm, num_microbatches)]
        out.append(acts)
    return out


SCHEDULES: dict[str, Callable[[int, int], list[list[Action]]]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def make_schedule(name: str, num_stages: int, num_microbatches: int) -> list[list[Action]]:
    if name not in SCHEDULES:
        raise ConfigError(f"pipeline.schedule: unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    return SCHEDULES[name](num_stages, num_microbatches)


def execute(
    per_stage: list[list[Action]], ready: Callable[[Action], bool], run: Callable[[Action], None]
) -> list[Action]:
    """Run the actions in ticks: each tick, every stage runs its next action if `ready` says so.

    Returns the global order in which actions ran. Raises RuntimeError on a deadlock (a schedule
    bug, never user input).
    """
    pos = [0] * len(per_stage)
    remaining = sum(len(a) for a in per_stage)
    order: list[Action] = []
    while remaining:
        progressed = False
        for s, acts in enumerate(per_stage):
            if pos[s] < len(acts) and ready(acts[pos[s]]):
                run(acts[pos[s]])
                order.append(acts[pos[s]])
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(acts[pos[s]]) for s, acts in enumerate(per_stage) if pos[s] < len(acts)]
            raise RuntimeError(f"pipeline schedule deadlock; waiting actions: {stuck}")
    return order
