"""The read-only window a white-box adversary has on the detector (ARCHITECTURE.md, "Adversary").

A detector (sentinel/detectors/) may publish a `DetectorView`; the runner hands it to the adversary
layer (`AdversaryLayer.attach_detector_view`). What it offers is the detector's *public* state --
the thresholds it currently applies and the distances it would compute -- never a verdict, and
`scores` must not update any state (no EMA step, no window push). An adaptive attack such as
`fence_evasion` uses it to search for the largest perturbation whose scores stay under the fence.

`ReferenceView` is a small self-contained implementation (EMA baseline per boundary and direction,
fixed thresholds on L1 / normalised L2 / sign-flip ratio), used by tests and as an example for
detector authors.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from sentinel.transport.message import Role


@runtime_checkable
class DetectorView(Protocol):
    """Read-only, side-effect-free view of a detector's public state."""

    def thresholds(self, boundary: int, role: Role) -> dict[str, float]:
        """Current flagging threshold per statistic at (boundary, role); a message is flagged when any
        statistic exceeds its threshold. Empty when the detector has no fence yet (warm-up)."""
        ...

    def scores(self, boundary: int, role: Role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        """The statistics the detector would compute for `payload` now, sent by `sender` (a detector may judge each
        sender against its own reference, e.g. SENTINEL's windows without the sender's own values; None: the
        stream's pooled reference). Pure: updates nothing."""
        ...

    def public_state(self) -> dict:
        """Everything else the detector publishes (baselines, window sizes ...), for logging."""
        ...


def under_fence(scores: dict[str, float], thresholds: dict[str, float], margin: float = 1.0) -> bool:
    """True when every statistic that has a threshold stays at or below margin * threshold."""
    return all(scores.get(k, 0.0) <= margin * t for k, t in thresholds.items())


class ReferenceView:
    """A minimal DetectorView: fixed thresholds on three distances to a per-(boundary, role) baseline.

    Distances, with b the baseline (mean over the batch dimensions of past messages) and p the
    payload pooled the same way: l1 = mean|p - b|, l2 = ||p - b|| / (||b|| + 1e-12), and
    sign = share of coordinates whose sign differs. `update` moves the EMA (beta) and is *not* part of
    the protocol: only the detector itself calls it.
    """

    def __init__(self, thresholds: dict[str, float], beta: float = 0.9):
        self._thr, self.beta = dict(thresholds), beta
        self._base: dict[tuple[int, int], torch.Tensor] = {}

    @staticmethod
    def _pool(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, x.shape[-1]).mean(0) if x.dim() >= 2 else x

    def update(self, boundary: int, role: Role, payload: torch.Tensor) -> None:
        key, p = (boundary, int(role)), self._pool(payload.detach().double())
        old = self._base.get(key)
        self._base[key] = p if old is None else self.beta * old + (1 - self.beta) * p

    def thresholds(self, boundary: int, role: Role) -> dict[str, float]:
        return dict(self._thr) if (boundary, int(role)) in self._base else {}

    def scores(self, boundary: int, role: Role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        base = self._base.get((boundary, int(role)))
        if base is None:
            return {}
        p = self._pool(payload.detach().double())
        diff = p - base
        return {
            "l1": float(diff.abs().mean()),
            "l2": float(diff.norm() / (base.norm() + 1e-12)),
            "sign": float((torch.sign(p) != torch.sign(base)).double().mean()),
        }

    def public_state(self) -> dict:
        return {"thresholds": dict(self._thr), "beta": self.beta, "baselines": len(self._base)}
