"""Library baselines: streaming drift detectors from `river` on SENTINEL's own statistics.

    river_adwin         ADWIN (Bifet and Gavalda 2007): adaptive windows, drift when two sub-windows' means differ
    river_page_hinkley  Page-Hinkley test (Page 1954): cumulative deviation from the running mean
    river_kswin         KSWIN (Raab et al. 2020): Kolmogorov-Smirnov test of a recent sample against the window

Each computes exactly the statistics SENTINEL computes for a message (an inner `sentinel` detector: same
signature, baselines and token-level statistics; it never flags) and feeds each statistic, on SENTINEL's
scale (log for the magnitudes), to one river detector per (stream, sender, statistic): a sender's own
sequence, so a drift is attributed to the worker whose messages made it. A message is flagged when one of its
statistics' detectors signals a drift on it (after the warm-up). What they assume about honest traffic: each
sender's statistics are stationary between changes. Drift detectors report *changes*: a persistent attack
is flagged when it starts (and when it changes), not on every message, so bans come from the response
policy's strike counting and score tests, not from a per-message evidence value (they give none).

`river` is an optional dependency (`pip install -e ".[river]"`); a scenario naming one of these detectors is
rejected at validation with that command when it is missing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sentinel.config import spec
from sentinel.detectors.base import Detector, Verdict
from sentinel.detectors.distances import MAGNITUDES
from sentinel.detectors.stagewise import DistanceName
from sentinel.registry import DETECTORS
from sentinel.transport.message import Message

INSTALL = 'pip install -e ".[river]"'
StatName = DistanceName  # the statistics SENTINEL computes, which these baselines watch


def river_missing() -> str | None:
    """None when `river` imports, else the message a user needs."""
    try:
        import river  # noqa: F401
    except ImportError:
        return f"needs the optional dependency river: {INSTALL}"
    return None


class _RiverDrift(Detector):
    """Shared loop: SENTINEL's statistics -> one river drift detector per (stream, sender, statistic)."""

    KIND = ""
    wants_inputs = True  # the inner SENTINEL's relation statistics read what each sender received

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        statistics: tuple[StatName, ...] = spec(
            ("l1", "sliced_wasserstein", "z_mean", "skewness", "align", "align_tail"),
            help="SENTINEL statistics fed to the drift detectors (align, align_tail: where the sender's input is known)",
        )
        warmup_steps: int = spec(10, ge=0, help="steps during which drifts are not flagged")
        min_history: int = spec(16, ge=4, help="accepted messages a stream needs before its statistics are computed")
        delta: float = spec(0.002, gt=0, lt=1, help="ADWIN: confidence; Page-Hinkley: magnitude tolerance")
        threshold: float = spec(50.0, gt=0, help="Page-Hinkley: alarm threshold")
        alpha: float = spec(0.005, gt=0, lt=1, help="KSWIN: significance of the Kolmogorov-Smirnov test")
        window_size: int = spec(40, ge=10, help="KSWIN: window size (a sender sends ~M/R messages per step)")
        grace: int = spec(
            10,
            ge=1,
            help="messages a sender's detector sees before it may signal (ADWIN grace period, "
            "Page-Hinkley min_instances; KSWIN tests once its window is full)",
        )

    @classmethod
    def check_config(cls, cfg) -> list[tuple[str, str]]:
        missing = river_missing()
        return [("name", missing)] if missing else []

    def __init__(self, config=None, *, seed: int = 0, env=None):
        super().__init__(config, seed=seed, env=env)
        missing = river_missing()
        if missing:
            from sentinel.errors import ConfigError

            raise ConfigError(f"detector.name: {self.KIND} {missing}")
        stats_cls = DETECTORS.get("sentinel")
        inner = stats_cls.Config(level=1e9, warmup_steps=self.config.warmup_steps, min_history=self.config.min_history)
        self.inner = stats_cls(inner, seed=seed, env=env)  # its statistics only: it never flags
        self._detectors: dict[tuple, object] = {}

    def _new(self):
        raise NotImplementedError

    def observe(self, msg: Message) -> Verdict:
        v = self.inner.observe(msg)
        if v.flagged or not v.scores:  # certain evidence (NaN, replay), or nothing to judge yet
            return Verdict(dict(v.scores), v.flagged, v.markers)
        drifts = 0
        for name in self.config.statistics:
            x = v.scores.get(name)
            if x is None or not np.isfinite(x):
                continue
            key = (msg.boundary, int(msg.role), msg.sender, name)
            det = self._detectors.get(key)
            if det is None:
                det = self._detectors[key] = self._new()
            det.update(float(np.log(max(x, 1e-30))) if name in MAGNITUDES else float(x))
            drifts += bool(det.drift_detected)
        scores = {**v.scores, "drifts": float(drifts)}
        return Verdict(scores, msg.step >= self.config.warmup_steps and drifts > 0)

    def scores(self, boundary: int, role, payload, sender: str | None = None):
        return self.inner.scores(boundary, role, payload, sender)

    def substitute(self, msg: Message):
        return self.inner.substitute(msg)

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        return {}  # a drift test has no per-message threshold a white-box sender could read

    def public_state(self) -> dict:
        return {"config": dataclasses.asdict(self.config), "detectors": len(self._detectors)}


@DETECTORS.register("river_adwin")
class RiverAdwin(_RiverDrift):
    """river's ADWIN drift detector on each of SENTINEL's statistics, per sender (a library baseline)."""

    KIND = "river_adwin"

    def _new(self):
        from river import drift

        return drift.ADWIN(delta=self.config.delta, clock=1, grace_period=self.config.grace)  # checked per message


@DETECTORS.register("river_page_hinkley")
class RiverPageHinkley(_RiverDrift):
    """river's Page-Hinkley test on each of SENTINEL's statistics, per sender (a library baseline)."""

    KIND = "river_page_hinkley"

    def _new(self):
        from river import drift

        return drift.PageHinkley(
            delta=self.config.delta, threshold=self.config.threshold, min_instances=self.config.grace
        )


@DETECTORS.register("river_kswin")
class RiverKswin(_RiverDrift):
    """river's KSWIN (windowed Kolmogorov-Smirnov) on each of SENTINEL's statistics, per sender (a library baseline)."""

    KIND = "river_kswin"

    def _new(self):
        from river import drift

        self._count = getattr(self, "_count", 0) + 1  # a distinct, seeded sampler per detector
        return drift.KSWIN(
            alpha=self.config.alpha,
            window_size=self.config.window_size,
            stat_size=self.config.window_size // 4,
            seed=self.seed * 7919 + self._count,
        )
