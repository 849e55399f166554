"""Detector interface: what a verifier at a stage boundary can compute from what it sees.

A detector receives only what a trusted relay would receive: the decoded Message (payload,
step, microbatch, boundary, role, sender and receiver ids, public codec metadata) and its own state.
It never sees ground truth. Time is the step index, never the wall clock. In `open_loop` mode the
verdict is recorded but never acted on, so one run yields a whole ROC curve.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping

import torch

from sentinel.transport.message import Message


class Marker(str, enum.Enum):
    """What a verdict says beyond its statistics (typed; logged as `score_<marker> = 1` columns).

    Certain evidence (a payload no honest worker sends) is INTEGRITY, REPLAY, WIRE_REJECT and CERTAIN.
    """

    PAUSED = "paused"  # not judged: downstream of a flag in its microbatch this step
    INTEGRITY = "integrity"  # NaN / Inf, a non-float dtype or the wrong shape
    REPLAY = "replay"  # a tensor the verifier has already relayed
    WIRE_REJECT = "wire_reject"  # a frame the receiver could not consume (distributed backend)
    CERTAIN = "certain"  # a proof other than the above (e.g. a mismatch with a trusted recomputation)
    OUTLIER = "outlier"  # accepted, but beyond the inner fence: soft evidence, not learned
    SHIFT = "shift"  # beyond the fence but accepted as an honest-majority drift of the whole stage


CERTAIN_MARKERS = frozenset({Marker.INTEGRITY, Marker.REPLAY, Marker.WIRE_REJECT, Marker.CERTAIN})


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's decision on one message.

    Attributes:
        scores: the detector's continuous statistics (larger = more anomalous); markers are not scores.
        flagged: whether the message is judged malicious.
        markers: typed facts about the verdict (`Marker`).
        pvalue: the message's tail probability under the stream's honest traffic (all statistics combined),
            the per-message evidence sequential tests accumulate; None where the detector gives none.
        relation_pvalue: the part of that evidence which only the sender's own computation explains (how its
            output relates to the input it received): unlike pooled statistics, upstream corruption does not
            move it. None where there is none.
    """

    scores: Mapping[str, float]
    flagged: bool
    markers: frozenset[Marker] = frozenset()
    pvalue: float | None = None
    relation_pvalue: float | None = None

    @property
    def certain(self) -> bool:
        """Flagged on certain evidence (no honest worker sends such a payload)."""
        return self.flagged and not CERTAIN_MARKERS.isdisjoint(self.markers)

    @property
    def judged(self) -> bool:
        """False for a message whose checks were paused (downstream of a flag in its microbatch)."""
        return Marker.PAUSED not in self.markers


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectorEnv:
    """Public facts and trusted hooks a detector may use (never ground truth).

    Attributes:
        num_stages: pipeline depth S.
        payload_shape: the shape every honest boundary tensor has, (B, T, C), when known.
        recompute: trusted recomputation hook `recompute(msg, worker=None) -> Tensor | None`: what the
            sender of `msg` (or another replica `worker` of its stage) computes from the very input the
            sender received (see `SimEngine.recompute`). None where the backend offers none.
        live_replicas: `live_replicas(stage_idx) -> list[str]`, the live worker ids of a stage.
        substitutes: whether the response policy may ask `substitute` for a stand-in (closed loop with
            `on_flag: substitute`); when it may not, a detector need not keep one.
        sender_inputs: trusted hook `sender_inputs(msg) -> (x_in, grad_in) | None`: what the sender of `msg`
            received for that microbatch, as the verifiers relayed it -- its input activation (token ids on
            the first stage) and, for a backward message, the gradient it received (None on the last stage).
            None (the hook, or its answer) where the backend offers none.
    """

    num_stages: int = 1
    payload_shape: tuple[int, ...] | None = None
    recompute: Callable[..., torch.Tensor | None] | None = None
    live_replicas: Callable[[int], list[str]] | None = None
    substitutes: bool = True
    sender_inputs: Callable[[Message], tuple[torch.Tensor | None, torch.Tensor | None] | None] | None = None


class Detector:
    """Base class: subclasses define a frozen `Config` and `observe`."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        pass

    def __init__(self, config: Config | None = None, *, seed: int = 0, env: DetectorEnv | None = None):
        self.config = config if config is not None else self.Config()
        self.seed = seed
        self.env = env if env is not None else DetectorEnv()

    def observe(self, msg: Message) -> Verdict:
        raise NotImplementedError

    @classmethod
    def threshold_rule(cls, config) -> dict | None:
        """How the verdict depends on one threshold, for ROC curves from an open-loop run (scoring/roc.py).

        None, or {"key": config field, "statistic": logged score, "value": its configured value,
        "warmup_steps": steps that are never judged, "exact_from": the lowest threshold at which the
        detector's state no longer depends on the threshold (None: exact at the configured value only)}:
        a judged message is flagged <=> score[statistic] > config[key].
        """
        return None

    def scores(self, boundary: int, role, payload: torch.Tensor) -> dict[str, float]:
        """The statistics `observe` would compute for this payload now, without updating any state."""
        return {}

    def substitute(self, msg: Message) -> torch.Tensor | None:
        """A stand-in for a flagged message (the baseline), or None when the detector has none."""
        return None

    def public_state(self) -> dict:
        """Read-only view a white-box adversary may inspect (thresholds, baselines)."""
        return {}
