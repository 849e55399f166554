"""Streaming change detectors on one scalar feature of each message (baselines for SENTINEL).

The feature (`rms`, `mean`, `std` or `max_abs` of the payload) is standardised per stream
(boundary, role) by an EWMA of its mean and variance over accepted messages:
z = (f - mu) / sigma. What they assume about honest traffic: z is roughly stationary and unimodal.

    norm_zscore    flag |z| > k                                          (EWMA control chart)
    cusum          S+ = max(0, S+ + z - drift), S- = max(0, S- - z - drift); flag max(S+, S-) > h
    page_hinkley   m_t = sum_{i<=t} (z_i - zbar_t - drift), M = min m; flag m - M > h (and the mirror
                   for decreases), zbar_t the running mean of the sender's own z: a change against
                   its own history rather than against a reference level

CUSUM and Page-Hinkley accumulate evidence per (stream, sender), so an alarm is attributed to the
worker whose messages built it, not to whoever happens to send when it fires; an alarm resets them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch

from sentinel.config import spec
from sentinel.detectors.base import Detector, Verdict
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message

Feature = Literal["rms", "mean", "std", "max_abs"]


def scalar_feature(x: torch.Tensor, feature: str) -> float:
    x = x.float()
    if feature == "rms":
        return float(x.square().mean().sqrt())
    if feature == "mean":
        return float(x.mean())
    if feature == "std":
        return float(x.std())
    return float(x.abs().max())


class _Ewma:
    """Bias-corrected EWMA mean and variance of a scalar (updated only on accepted values)."""

    def __init__(self, beta: float):
        self.beta, self.n, self.m, self.v = beta, 0, 0.0, 0.0

    def z(self, f: float) -> float:
        c = 1.0 - self.beta**self.n
        mu, var = self.m / c, self.v / c
        return (f - mu) / math.sqrt(max(var, 1e-12 * mu * mu, 1e-300))

    def update(self, f: float) -> None:
        if self.n:
            mu = self.m / (1.0 - self.beta**self.n)
            self.v = self.beta * self.v + (1 - self.beta) * (f - mu) ** 2
        self.m = self.beta * self.m + (1 - self.beta) * f
        self.n += 1


class _ScalarDetector(Detector):
    """Shared loop: feature -> z -> statistic; warm-up learns only; a flag updates nothing."""

    ACC = 2  # per-(stream, sender) accumulator slots

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        feature: Feature = spec("rms", help="scalar feature of the payload")
        beta: float = spec(0.95, ge=0, lt=1, help="EWMA decay of the feature's mean and variance")
        threshold: float = spec(4.0, gt=0, help="alarm threshold (k for norm_zscore, h for cusum / page_hinkley)")
        drift: float = spec(0.5, ge=0, help="allowance per message in z units (cusum, page_hinkley)")
        warmup_steps: int = spec(20, ge=0, help="steps during which the detector only learns")
        min_history: int = spec(16, ge=2, help="accepted messages a stream needs before it flags")

    def __init__(self, config=None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        self._ewma: dict[tuple[int, int], _Ewma] = {}
        self._acc: dict[tuple[int, int, str], list[float]] = {}

    @classmethod
    def threshold_rule(cls, config) -> dict:
        """Flag <=> statistic > threshold. A flag teaches nothing and restarts the accumulation, so the
        state depends on the threshold: an open-loop curve is exact at the configured value only."""
        return {
            "key": "threshold",
            "statistic": "statistic",
            "value": config.threshold,
            "warmup_steps": config.warmup_steps,
            "exact_from": None,
        }

    def statistic(self, z: float, acc: list[float]) -> float:
        raise NotImplementedError

    def _judge(self, msg: Message, commit: bool) -> tuple[dict[str, float], bool, _Ewma, float]:
        key = (int(msg.boundary), int(msg.role))
        ew = self._ewma.setdefault(key, _Ewma(self.config.beta))
        f = scalar_feature(msg.payload, self.config.feature)
        if ew.n < 2:
            return {}, False, ew, f
        z = ew.z(f)
        fresh = [0.0] * self.ACC
        acc = (
            self._acc.setdefault((*key, msg.sender), fresh)
            if commit
            else list(self._acc.get((*key, msg.sender), fresh))
        )
        stat = self.statistic(z, acc)
        judging = msg.step >= self.config.warmup_steps and ew.n >= self.config.min_history
        flagged = judging and not stat <= self.config.threshold  # NaN counts as an alarm
        if flagged or not judging:
            acc[:] = [0.0] * self.ACC  # an alarm (or warm-up) restarts the accumulation
        return {"z": z, "statistic": stat}, flagged, ew, f

    def observe(self, msg: Message) -> Verdict:
        scores, flagged, ew, f = self._judge(msg, commit=True)
        if not flagged and math.isfinite(f):
            ew.update(f)
        return Verdict(scores, flagged)

    def scores(self, boundary: int, role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        probe = Message(0, 0, boundary, role, sender or "", "", payload)
        return self._judge(probe, commit=False)[0]

    def public_state(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "streams": {f"{r}/{b}": {"updates": e.n} for (b, r), e in sorted(self._ewma.items())},
        }


@DETECTORS.register("norm_zscore")
class NormZScore(_ScalarDetector):
    """EWMA control chart on a scalar feature (default: RMS norm): flag |z| > threshold."""

    def statistic(self, z: float, acc: list[float]) -> float:
        return abs(z)


@DETECTORS.register("cusum")
class Cusum(_ScalarDetector):
    """Two-sided CUSUM of the standardised feature, per sender: flag max(S+, S-) > threshold."""

    def statistic(self, z: float, acc: list[float]) -> float:
        acc[0] = max(0.0, acc[0] + z - self.config.drift)
        acc[1] = max(0.0, acc[1] - z - self.config.drift)
        return max(acc[0], acc[1]) if math.isfinite(z) else math.inf


@DETECTORS.register("page_hinkley")
class PageHinkley(_ScalarDetector):
    """Page-Hinkley test of the standardised feature, per sender (both directions): flag PH > threshold."""

    ACC = 6  # n, running mean, m_up, M_up, m_down, M_down

    def statistic(self, z: float, acc: list[float]) -> float:
        if not math.isfinite(z):
            return math.inf
        acc[0] += 1
        acc[1] += (z - acc[1]) / acc[0]
        acc[2] += z - acc[1] - self.config.drift
        acc[3] = min(acc[3], acc[2])
        acc[4] += acc[1] - z - self.config.drift
        acc[5] = min(acc[5], acc[4])
        return max(acc[2] - acc[3], acc[4] - acc[5])
