"""Detector interface: what a verifier at a stage boundary can compute from what it sees.

A detector receives only what a trusted relay would receive: the decoded Message (payload,
step, microbatch, boundary, role, sender and receiver ids, public codec metadata) and its own state.
It never sees ground truth. Time is the step index, never the wall clock. In `open_loop` mode the
verdict is recorded but never acted on, so one run yields a whole ROC curve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sentinel.transport.message import Message
from sentinel.transport.verdict import CERTAIN_MARKERS, Marker, Verdict

__all__ = ["CERTAIN_MARKERS", "Detector", "DetectorEnv", "Marker", "Verdict"]


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
        sender_inputs: `sender_inputs(msg) -> SenderInputs | None`: what the sender of the message being judged
            received for its microbatch (token ids or the activation delivered to it; for a backward message the
            gradient delivered to it), as the verifiers relayed it (so not ground truth). None where the backend
            offers none; the hook returns None for any message but the one being judged.
        zeroed_roles: the roles (`Role`) whose codec can deliver a token as exactly zero although its sender computed
            a non-zero one (`Codec.zeroes_tokens`: top-k, random masking): public, from the scenario's transport.
        projected_roles: the roles whose codec delivers each token as its projection onto a low-dimensional subspace
            (`Codec.projects_tokens`: subspace's gradients, and its activations without `project_weights`): public,
            from the scenario's transport.
        cohort: `cohort(worker) -> key`, the replicas of its stage a worker is exchangeable with (same key: same
            weights, same staleness; `MeshControl.cohort`), public from the scenario's network and DP settings. None:
            every replica of a stage is.
    """

    num_stages: int = 1
    payload_shape: tuple[int, ...] | None = None
    recompute: Callable[..., torch.Tensor | None] | None = None
    live_replicas: Callable[[int], list[str]] | None = None
    substitutes: bool = True
    sender_inputs: Callable | None = None
    zeroed_roles: frozenset = frozenset()
    projected_roles: frozenset = frozenset()
    cohort: Callable[[str], object] | None = None


class Detector:
    """Base class: subclasses define a frozen `Config` and `observe`.

    Class attributes a detector may set: `checks_payload` (it checks NaN / Inf and replays itself, from a full
    pass it makes anyway: the Verifier then checks only dtype and shape), `wants_inputs` (it reads
    `DetectorEnv.sender_inputs`: the distributed backend then forwards what senders received between
    verifiers). `checked` counts the messages it recomputed (duplication-style detectors).
    """

    checks_payload: bool = False
    wants_inputs: bool = False
    checked: int = 0

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
    def check_config(cls, config) -> list[tuple[str, str]]:
        """Cross-parameter rules of the detector's own config: [(key, message)] (run at scenario validation)."""
        return []

    @classmethod
    def threshold_rule(cls, config) -> dict | None:
        """How the verdict depends on one threshold, for ROC curves from an open-loop run (scoring/roc.py).

        None, or {"key": config field, "statistic": logged score, "value": its configured value,
        "warmup_steps": steps that are never judged, "exact_from": the lowest threshold at which the
        detector's state no longer depends on the threshold (None: exact at the configured value only)}:
        a judged message is flagged <=> score[statistic] > config[key].
        """
        return None

    def scores(self, boundary: int, role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        """The statistics `observe` would compute for this payload now (sent by `sender`, when the detector judges
        senders apart), without updating any state."""
        return {}

    def substitute(self, msg: Message) -> torch.Tensor | None:
        """A stand-in for a flagged message (the baseline), or None when the detector has none."""
        return None

    def public_state(self) -> dict:
        """Read-only view a white-box adversary may inspect (thresholds, baselines)."""
        return {}

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        """The values each statistic must not exceed now (public: a white-box adversary may read them)."""
        return {}
