"""Detector interface: what a verifier at a stage boundary can compute from what it sees.

A detector receives only what a trusted relay would receive: the decoded Message (payload,
step, microbatch, boundary, role, sender and receiver ids, public codec metadata) and its own state.
It never sees ground truth. Time is the step index, never the wall clock. In `open_loop` mode the
verdict is recorded but never acted on, so one run yields a whole ROC curve.
"""

from __future__ import annotations

import dataclasses

from sentinel.transport.message import Message


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    scores: dict[str, float]
    flagged: bool


class Detector:
    """Base class: subclasses define a frozen `Config` and `observe`."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None, *, seed: int = 0):
        self.config = config if config is not None else self.Config()
        self.seed = seed

    def observe(self, msg: Message) -> Verdict:
        raise NotImplementedError

    def public_state(self) -> dict:
        """Read-only view a white-box adversary may inspect (thresholds, baselines)."""
        return {}
