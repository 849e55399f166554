"""The transport, in its two halves: the sender's (adversary, codec) and the verifier's relay.

    Sender.encode   msg -> [adversary.pre_codec] -> codec.encode -> [adversary.post_codec] -> (msg, wire)
    Relay.carry     wire -> checks -> codec.decode -> EventLog -> verifier.observe -> response.deliver -> Delivery

In `sim` both halves run in one process, one after the other (`sentinel/engine/sim.py: LocalChannel`). On the
distributed backend the sender half runs in the sender's process and the relay half in the verifier process
of the message's boundary, with the wire in between (`sentinel/distributed/`): the same code either way.

The adversary only ever sees messages whose sender it controls (it decides that itself from the worker id)
and records ground truth in its EventLog. The relay's verifier sees the decoded message, public metadata and
what the sender received for that microbatch (`InFlight`; the relay passed it on itself); the response
policy turns a verdict into what the receiver gets.

Before a wire reaches the codec and the verifier, the relay checks what the receiver could not consume: a
wire the codec cannot decode, or a decoded payload whose shape or dtype is not the honest boundary tensor's.
Such a message is logged, flagged (`Marker.INTEGRITY`, `Marker.WIRE_REJECT`), counted against its sender and
dropped. Values (NaN, Inf, outliers) are the verifier's business.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from sentinel.eventlog import EventLog
from sentinel.transport.codecs import Codec, CodecContext
from sentinel.transport.message import Message, Role, Wire, canonical_key
from sentinel.transport.verdict import PAUSED, WIRE_REJECT, Verdict


class Interceptor(Protocol):
    """The adversary layer's view of the transport (see attacks/)."""

    def pre_codec(self, msg: Message) -> Message: ...

    def post_codec(self, msg: Message, wire: Wire, ctx: CodecContext) -> Wire: ...

    def dp_contribution(self, step: int, stage_idx: int, worker: str, vec: torch.Tensor) -> torch.Tensor: ...


class Verifier(Protocol):
    """A trusted relay's judge (see sentinel/detectors/verifier.py)."""

    def observe(self, msg: Message): ...

    def substitute(self, msg: Message) -> torch.Tensor | None: ...


class Responder(Protocol):
    """Turns a verdict into the tensor the receiver gets (None = dropped); weighs a step's verdicts."""

    verdict_free: bool  # whether `deliver` decides without reading the verdict (then it may be given None)

    def deliver(self, msg: Message, verdict, substitute) -> torch.Tensor | None: ...

    def end_step(self, step: int, records: list) -> None: ...


class WireError(ValueError):
    """A wire the relay refuses (the message is flagged and attributed to its sender)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SenderInputs:
    """What the sender of a message received for its microbatch, as the verifiers relayed it.

    x: token ids (B, T) on stage 0, else the activation delivered to the sender; grad: for a backward message,
    the gradient delivered to the sender (None on the last stage, whose gradient comes from its loss). origin: who
    sent x and who sent grad (`route_origin`: public routing facts; None where nobody did).
    """

    key: tuple[int, int, int, int]  # (step, mb, boundary, role) of the message these inputs belong to
    x: torch.Tensor | None
    grad: torch.Tensor | None = None
    origin: tuple[str | None, str | None] = (None, None)


def route_origin(plan, ids, mb: int, boundary: int, role: Role) -> tuple[str | None, str | None]:
    """(who sent the input x, who sent the gradient) that the sender of message (mb, boundary, role) received, from
    the step's routing plan (M, S) of worker indices into `ids`: for a forward message the previous stage's worker on
    the microbatch's route (None on stage 0: token ids); for a backward one the worker of stage `boundary` (its
    forward input) and of stage `boundary + 2` (its gradient; None on the last stage)."""
    S = plan.shape[1]
    if role == Role.ACTIVATION:
        return (ids[int(plan[mb, boundary - 1])] if boundary >= 1 else None), None
    return ids[int(plan[mb, boundary])], (ids[int(plan[mb, boundary + 2])] if boundary + 2 < S else None)


class InFlight:
    """The inputs of the message being judged (`DetectorEnv.sender_inputs`); holds nothing else."""

    def __init__(self) -> None:
        self.current: SenderInputs | None = None

    def __call__(self, msg: Message) -> SenderInputs | None:
        cur = self.current
        if cur is None or cur.key != (msg.step, msg.mb_idx, msg.boundary, int(msg.role)):
            return None
        return cur


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """What happened to one message at its verifier: the message as judged, the verdict, what the receiver got."""

    msg: Message
    verdict: Verdict | None
    payload: torch.Tensor | None  # None: dropped

    @property
    def flagged(self) -> bool:
        return self.verdict is not None and self.verdict.flagged


class Sender:
    """The sender's half: adversary (pre-codec), codec, adversary (post-codec). Runs in the sender's process."""

    def __init__(self, codecs: dict[Role, Codec], seed: int, adversary: Interceptor | None = None):
        self.codecs, self.seed, self.adversary = codecs, seed, adversary

    def context(self, msg: Message, shape: tuple[int, ...], dtype: torch.dtype) -> CodecContext:
        return CodecContext(msg.step, msg.mb_idx, msg.boundary, msg.role, self.seed, shape, dtype)

    def encode(self, msg: Message) -> tuple[Message, Wire]:
        """(the message as sent, its wire). Adversary and codec run on the CPU, as verifiers do."""
        payload = msg.payload.detach()
        if payload.device.type != "cpu":
            payload = payload.cpu()
        msg = msg.replace(payload=payload)
        ctx = self.context(msg, tuple(payload.shape), payload.dtype)
        if self.adversary is not None:
            msg = self.adversary.pre_codec(msg)
        wire = self.codecs[msg.role].encode(msg.payload, ctx)
        if self.adversary is not None:
            wire = self.adversary.post_codec(msg, wire, ctx)
        return msg, wire


class Relay:
    """The verifier's half for the boundaries it serves: decode, check, log, judge, deliver.

    Args:
        log: where messages and verdicts are recorded (this process's part of the EventLog).
        codecs: codec per role (decoding).
        seed: scenario seed (codecs derive shared randomness from it).
        payload_shape: the shape of every honest boundary tensor.
        verifiers: boundary -> its verifier (missing: unchecked).
        responder: the response policy (None: everything accepted).

    A refused wire is logged with `WIRE_REJECT` (flagged, certain evidence) whenever a defence is installed;
    a message downstream of a flag in its microbatch gets `PAUSED` without reaching its verifier.
    """

    def __init__(
        self,
        log: EventLog,
        codecs: dict[Role, Codec],
        seed: int,
        payload_shape: tuple[int, ...],
        verifiers: Mapping[int, Verifier] | None = None,
        responder: Responder | None = None,
    ):
        self.log, self.codecs, self.seed, self.payload_shape = log, codecs, seed, tuple(payload_shape)
        self.verifiers = dict(verifiers or {})
        self.responder = responder
        self.inflight = InFlight()
        self.bytes_sent = 0
        self.verifier_s = 0.0  # wall time spent judging (cost accounting only)
        self.records: list[tuple[Message, Verdict]] = []  # this step's verdicts, for the response policy

    def carry(
        self,
        msg: Message,
        wire: Wire,
        paused: bool = False,
        inputs: SenderInputs | None = None,
        declared_bytes: int | None = None,
        early: Callable[[torch.Tensor | None], None] | None = None,
    ) -> Delivery:
        """Relay one message: `paused` when a message upstream of it in its microbatch was flagged this step.

        `early`: called with what the receiver gets as soon as that is known, before the verifier judges the
        message, when the response policy delivers without reading the verdict (`Responder.verdict_free`:
        open loop, `on_flag: accept`); a verifier process then forwards it while it judges."""
        try:
            msg = self._decode(msg, wire)
        except WireError as exc:
            return self._refuse(msg, declared_bytes if declared_bytes is not None else wire.nbytes(), str(exc))
        self.bytes_sent += msg.wire_bytes
        self.log.log_message(msg)
        verifier = self.verifiers.get(msg.boundary)
        if early is not None and (verifier is None or self.responder is None or self.responder.verdict_free):
            early(msg.payload if self.responder is None else self.responder.deliver(msg, None))
        if verifier is None:
            return Delivery(msg, None, msg.payload)
        if paused:
            verdict = PAUSED  # downstream of a flag: neither judged nor learned from
        else:
            self.inflight.current = inputs
            t0 = time.perf_counter()
            verdict = verifier.observe(msg)
            self.verifier_s += time.perf_counter() - t0
            self.inflight.current = None
        self.log.log_verdict(msg.msg_id, verdict)
        if self.responder is None:
            return Delivery(msg, verdict, msg.payload)
        self.records.append((msg, verdict))
        return Delivery(msg, verdict, self.responder.deliver(msg, verdict, verifier.substitute))

    def refuse(self, msg: Message, declared_bytes: int, reason: str) -> Delivery:
        """A frame that never became a wire (the distributed backend's framing checks): flagged and dropped."""
        return self._refuse(msg, declared_bytes, reason)

    def _decode(self, msg: Message, wire: Wire) -> Message:
        ctx = CodecContext(msg.step, msg.mb_idx, msg.boundary, msg.role, self.seed, self.payload_shape, torch.float32)
        codec = self.codecs[msg.role]
        try:
            payload = codec.decode(wire, ctx)
            view = codec.wire_view(wire, ctx)
        except Exception as exc:  # any failure of a codec on adversarial bytes is the sender's fault
            raise WireError(f"the {msg.role.label} codec cannot decode it ({exc.__class__.__name__})") from None
        if not self.consumable(payload):
            got = f"{tuple(payload.shape)} {payload.dtype}" if isinstance(payload, torch.Tensor) else type(payload)
            raise WireError(f"decoded payload is {got}, expected {self.payload_shape} torch.float32")
        return msg.replace(payload=payload, wire_bytes=wire.nbytes(), wire_view=view)

    def consumable(self, t) -> bool:
        """A tensor the receiver can consume: the honest boundary shape, float32."""
        return isinstance(t, torch.Tensor) and tuple(t.shape) == self.payload_shape and t.dtype == torch.float32

    def _refuse(self, msg: Message, declared_bytes: int, reason: str) -> Delivery:
        msg = msg.replace(
            payload=torch.zeros(self.payload_shape),
            wire_bytes=max(0, int(declared_bytes)),
            meta={"wire_reject": reason},
        )
        self.bytes_sent += msg.wire_bytes
        self.log.log_message(msg)
        if not self.verifiers:
            return Delivery(msg, None, None)
        self.log.log_verdict(msg.msg_id, WIRE_REJECT)
        if self.responder is not None:
            self.records.append((msg, WIRE_REJECT))  # a strike for its sender; the payload is dropped
        return Delivery(msg, WIRE_REJECT, None)

    def end_step(self, step: int) -> None:
        """The response policy weighs the step's verdicts, in canonical order, and decides bans."""
        records, self.records = sorted(self.records, key=lambda r: canonical_key(r[0])), []
        if self.responder is not None:
            self.responder.end_step(step, records)
