"""The trusted relay: one Verifier sees every boundary message and asks the detector for a verdict.

Placement: a single Verifier object stands at every stage boundary (as the routers relaying
inter-stage traffic would); the detector keeps per-(boundary, role) state. The Verifier adds what does
not depend on the detector:

- integrity: a payload with NaN / Inf, a non-float dtype or the wrong shape is flagged at once and
  never reaches the detector (so never its baseline); its verdict carries `score_integrity = 1`;
- replay: the relay remembers a fingerprint of every tensor it relayed recently (replay.py); a
  tensor it has already relayed is flagged at once (`score_replay = 1`). Under a codec whose kept
  positions are random per message (`Codec.random_positions`: random masking re-masks a replayed tensor,
  so it never repeats) sparse payloads are checked on the positions two masks share: an earlier
  message's exact values there are a replay (`SparseReplayMemory`; the same verdict);
- cascade suppression: once a microbatch is flagged, every later message of that microbatch in the
  same step is causally downstream of the flagged tensor (forward activations after it, and every
  gradient, all computed from it), so its checks are paused: the detector neither judges nor learns
  from it, and honest downstream workers are not blamed. Its verdict is unflagged with
  `score_paused = 1` (the scorer can report these as contaminated-downstream traffic);
- the read-only views a white-box adversary may use: `public_state()` and a pure `scores()`;
- `view: wire` (scenario `detector.view`): the detector reads the codec's compressed representation
  (`msg.meta["wire_view"]`, see `Codec.wire_view`) instead of the decoded tensor. Integrity (shape,
  finiteness) is still checked on the decoded tensor. A view that is a flat vector (top-k values, kept
  mask entries: their positions change from message to message) is read as a bag of values, one
  feature each, so only distributional statistics compare across messages.

A detector that makes a full pass over the payload anyway may declare `checks_payload = True` and do
the finiteness and replay checks itself from that pass (SENTINEL does, from its signature), with the
same verdicts; the Verifier then only checks dtype and shape. It reads nothing but the Message: never
the EventLog's ground truth.
"""

from __future__ import annotations

import dataclasses

import torch

from sentinel.detectors.base import Detector, DetectorEnv, Marker, Verdict
from sentinel.detectors.replay import Fingerprint, ReplayMemory, SparseReplayMemory
from sentinel.engine.workers import MeshControl
from sentinel.registry import DETECTORS
from sentinel.response import Responder
from sentinel.transport.codecs import build_codecs
from sentinel.transport.message import Message

PAUSED = Verdict({}, False, frozenset({Marker.PAUSED}))
CORRUPT = Verdict({}, True, frozenset({Marker.INTEGRITY}))
REPLAYED = Verdict({}, True, frozenset({Marker.REPLAY}))


class Verifier:
    """Integrity checks and cascade suppression around one detector."""

    def __init__(self, detector: Detector, *, mode: str = "closed_loop", payload_shape: tuple[int, ...] | None = None,
                 seed: int = 0, view: str = "decoded", masked_roles: frozenset = frozenset()):
        self.detector, self.mode, self.payload_shape, self.view = detector, mode, payload_shape, view
        self.replays = ReplayMemory()
        self.sparse_replays = SparseReplayMemory(seed)
        self.masked_roles = masked_roles  # roles whose codec keeps random positions (`Codec.random_positions`)
        self._fingerprint = Fingerprint(seed)
        self._own_checks = getattr(detector, "checks_payload", False)  # the detector checks NaN / replays itself
        self._step = -1
        self._flagged_mbs: set[int] = set()
        self.flagged_mbs_total = 0

    def integrity_ok(self, payload: torch.Tensor, shape_only: bool = False) -> bool:
        """Floating point, the honest shape, every value finite (unless the detector checks that itself)."""
        if not torch.is_floating_point(payload):
            return False
        if self.payload_shape is not None and tuple(payload.shape) != tuple(self.payload_shape):
            return False
        if shape_only:
            return True
        # one reduction, no temporary: any NaN or +-Inf makes the sum non-finite (a float32 sum overflows only
        # for values no honest tensor has, which are worth flagging anyway)
        total = payload.sum() if payload.dtype == torch.float32 else payload.sum(dtype=torch.float32)
        return bool(torch.isfinite(total))

    def observe(self, msg: Message) -> Verdict:
        if msg.step != self._step:  # a new step: microbatch ids start afresh
            self._step, self._flagged_mbs = msg.step, set()
        if msg.mb_idx in self._flagged_mbs:
            return PAUSED
        if self.view == "wire" and msg.meta.get("wire_view") is not None:
            if not self.integrity_ok(msg.payload):  # the decoded tensor: shape and finiteness
                verdict = CORRUPT
            elif self._sparse_replay(msg):
                verdict = REPLAYED
            else:
                verdict = self._judge(wire_message(msg))
        elif not self.integrity_ok(msg.payload, shape_only=self._own_checks):
            verdict = CORRUPT
        elif self._sparse_replay(msg):
            verdict = REPLAYED
        else:
            verdict = self._judge(msg)
        if verdict.flagged:
            self._flagged_mbs.add(msg.mb_idx)
            self.flagged_mbs_total += 1
        return verdict

    def _sparse_replay(self, msg: Message) -> bool:
        """A sparse (masked) payload that carries an earlier one's exact values where their masks overlap."""
        if msg.role not in self.masked_roles:
            return False
        return self.sparse_replays.seen_before((msg.boundary, int(msg.role)), msg.payload)

    def _judge(self, msg: Message) -> Verdict:
        if not self._own_checks and self.replays.seen_before(self._fingerprint(msg.payload), msg.step):
            return REPLAYED
        return self.detector.observe(msg)

    # read-only views (a white-box adversary may use these; they never reveal a future verdict)
    def public_state(self) -> dict:
        return self.detector.public_state()

    def scores(self, boundary: int, role, payload: torch.Tensor) -> dict[str, float]:
        return self.detector.scores(boundary, role, payload)

    def substitute(self, msg: Message) -> torch.Tensor | None:
        return self.detector.substitute(msg)

    def detector_view(self) -> DetectorView:
        """The read-only view the runner hands to a white-box adversary (attacks/detector_view.py)."""
        return DetectorView(self.detector)


class DetectorView:
    """Read-only window on a detector: current thresholds, pure scores, public state; never a verdict.

    `thresholds(b, role)` maps each statistic to the value it must not exceed: for SENTINEL the Tukey
    fence of every distance and `exceedance: k` (the combined rule; with `combine: any` the per-distance
    fences say the same). Empty while the stream is still learning.
    """

    def __init__(self, detector: Detector):
        self._detector = detector

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        fn = getattr(self._detector, "thresholds", None)
        return fn(boundary, role) if fn is not None else {}

    def scores(self, boundary: int, role, payload: torch.Tensor) -> dict[str, float]:
        return self._detector.scores(boundary, role, payload)

    def public_state(self) -> dict:
        return self._detector.public_state()


def wire_message(msg: Message) -> Message:
    """The message as `view: wire` shows it: the payload replaced by the codec's wire view (a flat vector
    becomes a column, values as tokens of one feature)."""
    view = msg.meta["wire_view"].float()
    if view.dim() == 1:
        view = view.unsqueeze(-1)
    return dataclasses.replace(msg, payload=view)


def payload_shape(scenario) -> tuple[int, int, int]:
    """The shape of every honest boundary tensor: (batch_size, seq_len, dim)."""
    return (scenario.data.batch_size, scenario.model.seq_len, scenario.model.dim)


class SenderInputs:
    """`DetectorEnv.sender_inputs` from a backend's trusted recomputation hook (sim: `TrustedRecompute`).

    The hook holds the provenance of the message in flight (`current`: the input the sender received and,
    backward, the gradient it received); this answers for that message only, None for any other.
    """

    def __init__(self, recompute):
        self._recompute = recompute

    def __call__(self, msg: Message) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
        prov = getattr(self._recompute, "current", None)
        if prov is None or (prov.msg.step, prov.msg.mb_idx, prov.msg.boundary, prov.msg.role) != (
                msg.step, msg.mb_idx, msg.boundary, msg.role):
            return None
        return prov.x, prov.grad_in


def make_env(scenario, mesh: MeshControl | None = None, recompute=None) -> DetectorEnv:
    """The detector's view: public facts of the scenario, who is live (from `mesh`), the trusted recomputation
    and what each sender received (`sender_inputs`, from the recomputation hook's provenance)."""
    substitutes = scenario.detector.mode == "closed_loop" and scenario.response.on_flag == "substitute"
    inputs = SenderInputs(recompute) if hasattr(recompute, "current") else None
    return DetectorEnv(num_stages=scenario.pipeline.stages, payload_shape=payload_shape(scenario),
                       recompute=recompute, live_replicas=mesh.live_in_stage if mesh is not None else None,
                       substitutes=substitutes, sender_inputs=inputs)


def build(scenario, mesh: MeshControl, recompute=None) -> tuple[Verifier, Responder]:
    """(Verifier, Responder) for the scenario's `detector` and `response` sections."""
    spec = scenario.detector
    cls = DETECTORS.get(spec.name)
    detector = cls(spec.config, seed=scenario.seed, env=make_env(scenario, mesh, recompute))
    masked = frozenset(role for role, codec in build_codecs(scenario.transport).items() if codec.random_positions)
    verifier = Verifier(detector, mode=spec.mode, payload_shape=payload_shape(scenario), seed=scenario.seed,
                        view=spec.view, masked_roles=masked)
    return verifier, Responder(scenario.response, mesh, mode=spec.mode)
