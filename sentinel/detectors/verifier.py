"""The trusted relay's judge: one Verifier per stage boundary asks its detector for a verdict.

Placement: one Verifier (with its own detector) stands at each stage boundary, as the routers relaying
inter-stage traffic would -- in `sim` all of them in one process, on the distributed backend in one
verifier process per boundary (or per group of boundaries): the same objects with the same state either
way. The Verifier adds what does not depend on the detector:

- integrity: a payload with NaN / Inf, a non-float dtype or the wrong shape is flagged at once and
  never reaches the detector (so never its baseline); its verdict carries `score_integrity = 1`;
- replay: the relay remembers a fingerprint of every tensor it relayed recently (replay.py); a
  tensor it has already relayed is flagged at once (`score_replay = 1`). Under a codec whose kept
  positions are random per message (`Codec.random_positions`: random masking re-masks a replayed tensor,
  so it never repeats) sparse payloads are checked on the positions two masks share: an earlier
  message's exact values there are a replay (`SparseReplayMemory`; the same verdict);
- cascade suppression (the relay's `PAUSED`): once a microbatch is flagged, every later message
  of that microbatch in the same step is causally downstream of the flagged tensor (forward activations
  after it, and every gradient, all computed from it), so its checks are paused: the detector neither
  judges nor learns from it, and honest downstream workers are not blamed. The relay knows it from the
  verifiers upstream of the message (`sentinel.transport.relay.Relay.carry(paused=...)`); its verdict is
  unflagged with `Marker.PAUSED` (the scorer reports these as contaminated-downstream traffic);
- the read-only views a white-box adversary may use: `public_state()` and a pure `scores()`;
- `view: wire` (scenario `detector.view`): the detector reads the codec's compressed representation
  (`msg.meta["wire_view"]`, see `Codec.wire_view`) instead of the decoded tensor. Integrity (shape,
  finiteness) is still checked on the decoded tensor. A view that is a flat vector (top-k values, kept
  mask entries: their positions change from message to message) is read as a bag of values, one
  feature each, so only distributional statistics compare across messages.

A detector that makes a full pass over the payload anyway may declare `checks_payload = True` and do
the finiteness and replay checks itself (SENTINEL does: finiteness from its signature's pass, replays with the
same `Fingerprint`), with the same verdicts; the Verifier then only checks dtype and shape. It reads nothing but the Message: never
the EventLog's ground truth.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import torch

from sentinel.detectors.base import Detector, DetectorEnv, Marker, Verdict
from sentinel.detectors.replay import Fingerprint, ReplayMemory, SparseReplayMemory
from sentinel.engine.step import payload_shape
from sentinel.engine.workers import MeshControl
from sentinel.registry import DETECTORS
from sentinel.response import Responder
from sentinel.state import capture, restore
from sentinel.transport.codecs import build_codecs
from sentinel.transport.message import Message

CORRUPT = Verdict({}, True, frozenset({Marker.INTEGRITY}))
REPLAYED = Verdict({}, True, frozenset({Marker.REPLAY}))


class Verifier:
    """Integrity and replay checks around one boundary's detector."""

    def __init__(
        self,
        detector: Detector,
        *,
        mode: str = "closed_loop",
        payload_shape: tuple[int, ...] | None = None,
        seed: int = 0,
        view: str = "decoded",
        masked_roles: frozenset = frozenset(),
    ):
        self.detector, self.mode, self.payload_shape, self.view = detector, mode, payload_shape, view
        self.replays = ReplayMemory()
        self.sparse_replays = SparseReplayMemory(seed)
        self.masked_roles = masked_roles  # roles whose codec keeps random positions (`Codec.random_positions`)
        self._fingerprint = Fingerprint(seed)
        self._own_checks = detector.checks_payload  # the detector checks NaN / replays itself

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
        if self.view == "wire" and msg.wire_view is not None:
            if not self.integrity_ok(msg.payload):  # the decoded tensor: shape and finiteness
                return CORRUPT
            if self._sparse_replay(msg):
                return REPLAYED
            return self._judge(wire_message(msg))
        if not self.integrity_ok(msg.payload, shape_only=self._own_checks):
            return CORRUPT
        if self._sparse_replay(msg):
            return REPLAYED
        return self._judge(msg)

    def _sparse_replay(self, msg: Message) -> bool:
        """A sparse (masked) payload that carries an earlier one's exact values where their masks overlap."""
        if msg.role not in self.masked_roles:
            return False
        return self.sparse_replays.seen_before((msg.boundary, int(msg.role)), msg.payload)

    def _judge(self, msg: Message) -> Verdict:
        if not self._own_checks and self.replays.seen_before(self._fingerprint(msg.payload), msg.step):
            return REPLAYED
        return self.detector.observe(msg)

    def substitute(self, msg: Message) -> torch.Tensor | None:
        return self.detector.substitute(msg)


class DetectorView:
    """Read-only window on the verifiers' detectors: current thresholds, pure scores, public state; never a verdict.

    `thresholds(b, role)` maps each statistic to the value it must not exceed: for SENTINEL each statistic's
    value at its Bonferroni share of the flag level and `evidence: level` (with the fence rules: the Tukey
    fence of every distance and `exceedance: k`). Empty while the stream is still learning.
    """

    def __init__(self, detectors: Mapping[int, Detector]):
        self._detectors = detectors

    def thresholds(self, boundary: int, role) -> dict[str, float]:
        det = self._detectors.get(int(boundary))
        return det.thresholds(boundary, role) if det is not None else {}

    def scores(self, boundary: int, role, payload: torch.Tensor, sender: str | None = None) -> dict[str, float]:
        det = self._detectors.get(int(boundary))
        return det.scores(boundary, role, payload, sender) if det is not None else {}

    def public_state(self) -> dict:
        return {f"boundary/{b}": det.public_state() for b, det in sorted(self._detectors.items())}


class PublishedState:
    """What white-box attackers see: the verifiers' detectors as they were at the start of the current step.

    Every verifier publishes its detectors' state at the start of each step (`publish`); the attackers' copies
    (`load`) answer the `DetectorView`. In sim the copies are refreshed in the same process; on the distributed
    backend each verifier process sends its part to the worker processes. So a white-box attack reads the same
    state on both backends: the detector as it was when the step began, never its verdict on the message at hand.
    """

    def __init__(self, scenario):
        self.detectors = {b: v.detector for b, v in build_verifiers(scenario, None).items()}

    @staticmethod
    def publish(detectors: Mapping[int, Detector]) -> bytes:
        """The state of `detectors` (boundary -> detector), as bytes (`torch.load(weights_only=True)` reads them)."""
        state = capture({str(b): {k: v for k, v in vars(d).items() if k != "env"} for b, d in detectors.items()})
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def load(self, data: bytes) -> None:
        state = torch.load(io.BytesIO(data), weights_only=True)
        parts = {b: {k: getattr(self.detectors[int(b)], k, None) for k in sub} for b, sub in state.items()}
        for b, attrs in restore(parts, state).items():
            for k, v in attrs.items():
                setattr(self.detectors[int(b)], k, v)

    def view(self) -> DetectorView:
        return DetectorView(self.detectors)


def wire_message(msg: Message) -> Message:
    """The message as `view: wire` shows it: the payload replaced by the codec's wire view (a flat vector
    becomes a column, values as tokens of one feature)."""
    view = msg.wire_view.float()
    if view.dim() == 1:
        view = view.unsqueeze(-1)
    return msg.replace(payload=view)


def make_env(scenario, mesh: MeshControl | None = None, recompute=None, inputs=None) -> DetectorEnv:
    """The detector's view: public facts of the scenario, who is live (from `mesh`), the trusted recomputation,
    and what the sender of the message being judged received (`inputs`, an `InFlight`)."""
    substitutes = scenario.detector.mode == "closed_loop" and scenario.response.on_flag == "substitute"
    codecs = build_codecs(scenario.transport)
    return DetectorEnv(
        num_stages=scenario.pipeline.stages,
        payload_shape=payload_shape(scenario),
        recompute=recompute,
        live_replicas=mesh.live_in_stage if mesh is not None else None,
        substitutes=substitutes,
        sender_inputs=inputs,
        zeroed_roles=frozenset(role for role, codec in codecs.items() if codec.zeroes_tokens),
        projected_roles=frozenset(role for role, codec in codecs.items() if codec.projects_tokens(role)),
        cohort=mesh.cohort if mesh is not None else None,
    )


def build_verifiers(
    scenario, mesh: MeshControl | None, recompute=None, inputs=None, boundaries=None
) -> dict[int, Verifier]:
    """One Verifier (with its own detector instance) per boundary: all of them, or those in `boundaries`."""
    spec = scenario.detector
    cls = DETECTORS.get(spec.name)
    masked = frozenset(role for role, codec in build_codecs(scenario.transport).items() if codec.random_positions)
    out = {}
    for b in range(scenario.pipeline.stages - 1) if boundaries is None else boundaries:
        detector = cls(spec.config, seed=scenario.seed, env=make_env(scenario, mesh, recompute, inputs))
        out[b] = Verifier(
            detector,
            mode=spec.mode,
            payload_shape=payload_shape(scenario),
            seed=scenario.seed,
            view=spec.view,
            masked_roles=masked,
        )
    return out


def build_defence(
    scenario, mesh: MeshControl | None, recompute=None, inputs=None
) -> tuple[dict[int, Verifier], Responder | None]:
    """(verifier per boundary, Responder) for the scenario's `detector` and `response` sections; ({}, None) when the
    detector is `none`. `mesh` is the response policy's MeshControl; `recompute` the backend's trusted
    recomputation, if any; `inputs` what the sender of the message being judged received (an `InFlight`)."""
    if scenario.detector.name == "none":
        return {}, None
    return build_verifiers(scenario, mesh, recompute, inputs), Responder(
        scenario.response, mesh, mode=scenario.detector.mode
    )


def detector_view(verifiers: Mapping[int, Verifier]) -> DetectorView:
    """A read-only view on the live detectors (tests; a run hands white-box attacks `PublishedState.view()`)."""
    return DetectorView({b: v.detector for b, v in verifiers.items()})
