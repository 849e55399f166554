"""Detectors by recomputation: a trusted party (or another replica) recomputes the sender's stage.

They rely on the engine's trusted recomputation hook (`DetectorEnv.recompute`, `SimEngine.recompute`):
the sender's stage applied to the very input the sender received (and, for a gradient, to the
gradient it received). What they assume about honest traffic: honest computation is deterministic up
to float rounding, so an honest message equals its recomputation within `tol` (relative L2 error).
A lossy codec adds its own error: raise `tol` to the codec's error bound.

    duplication    recompute every message (Lu et al. 2023): catches any tampering, costs one extra
                   stage forward per activation and forward + backward per gradient
    spot_check     the same on a random fraction p of messages (seeded): cost x p, recall per message p
    cross_replica  on a random fraction p, another live replica of the sender's stage recomputes the
                   microbatch and the two outputs are compared. The checking replica computes honestly
                   here (weights are honest in this testbed); a colluding checker that lies is not
                   modelled. With no second live replica the message goes unchecked.

The trusted recomputation is also an exact stand-in: `substitute` returns it (for both roles). A
mismatch is a proof, not a statistical alarm: its verdict carries `certain = 1`, which the response
policy weighs as such (sentinel/response.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from sentinel.config import spec
from sentinel.detectors.base import Detector, Marker, Verdict
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message

UNCHECKED = Verdict({}, False)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| (inf for a shape mismatch or a non-finite x)."""
    if x.shape != ref.shape:
        return float("inf")
    num = float((x.float() - ref.float()).norm())
    return num / max(float(ref.float().norm()), 1e-30)


@DETECTORS.register("duplication")
class Duplication(Detector):
    """Trusted recomputation of every message: exact, costs one extra stage computation per message."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tol: float = spec(1e-4, gt=0, help="relative L2 error tolerated between a message and its recomputation")

    wants_inputs = True  # the distributed backend forwards what the sender received (the recomputation's input)

    def __init__(self, config=None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        self._last: tuple[int, torch.Tensor] | None = None  # (msg_id, recomputation) for `substitute`
        self.checked = 0

    def _checker(self, msg: Message) -> str | None | bool:
        """Which replica recomputes: None = the sender's module (trusted party); False = skip."""
        return None

    def _rng(self, msg: Message) -> np.random.Generator:
        """This message's own draws (seeded by its identity): a boundary's two streams never share a sequence."""
        return np.random.default_rng([self.seed, 0xD0B, msg.step, msg.mb_idx, msg.boundary, int(msg.role)])

    def observe(self, msg: Message) -> Verdict:
        worker = self._checker(msg)
        if worker is False or self.env.recompute is None:
            return UNCHECKED
        ref = self.env.recompute(msg, worker)
        if ref is None:
            return UNCHECKED
        self.checked += 1
        self._last = (msg.msg_id, ref.detach())
        err = relative_error(msg.payload, ref)
        if err <= self.config.tol:
            return Verdict({"recompute_error": err}, False)
        return Verdict({"recompute_error": err}, True, frozenset({Marker.CERTAIN}))  # a proof, not a statistical alarm

    @classmethod
    def threshold_rule(cls, config) -> dict:
        """Flag <=> recompute_error > tol; the checker keeps no state, so every threshold is exact."""
        return {"key": "tol", "statistic": "recompute_error", "value": config.tol, "warmup_steps": 0, "exact_from": 0.0}

    def substitute(self, msg: Message) -> torch.Tensor | None:
        if self._last is None or self._last[0] != msg.msg_id:
            return None
        return self._last[1].to(msg.payload.dtype)

    def public_state(self) -> dict:
        return {"config": dataclasses.asdict(self.config), "checked": self.checked}


@DETECTORS.register("spot_check")
class SpotCheck(Duplication):
    """Trusted recomputation of a random fraction p of messages (seeded)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tol: float = spec(1e-4, gt=0, help="relative L2 error tolerated")
        p: float = spec(0.1, gt=0, le=1, help="fraction of messages recomputed")

    def _checker(self, msg: Message) -> str | None | bool:
        return None if self._rng(msg).random() < self.config.p else False


@DETECTORS.register("cross_replica")
class CrossReplica(Duplication):
    """On a random fraction p of messages, another replica of the sender's stage recomputes and compares."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        tol: float = spec(1e-4, gt=0, help="relative L2 error tolerated")
        p: float = spec(0.1, gt=0, le=1, help="fraction of messages duplicated on a second replica")

    def _checker(self, msg: Message) -> str | None | bool:
        rng = self._rng(msg)
        if rng.random() >= self.config.p or self.env.live_replicas is None:
            return False
        stage = msg.boundary if msg.role == 0 else msg.boundary + 1  # activations go b -> b+1
        others = [w for w in self.env.live_replicas(stage) if w != msg.sender]
        if not others:
            return False
        return others[int(rng.integers(len(others)))]
