"""Transport: the single choke point every boundary tensor passes through.

    sender -> [adversary.pre_codec] -> codec.encode -> [adversary.post_codec] -> channel
           -> codec.decode -> EventLog -> verifier.observe -> response.deliver -> receiver

The adversary hook only ever sees messages whose sender it controls (it decides that itself from
the worker id) and records ground truth in the EventLog. The verifier sees the decoded message and
public metadata only. The response policy turns a verdict into accept / drop / substitute.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from sentinel.eventlog import EventLog
from sentinel.transport.codecs import Codec, CodecContext
from sentinel.transport.message import Message, Role, Wire, canonical_key

__all__ = ["Message", "Role", "Wire", "Transport", "Interceptor", "Verifier", "Responder"]


class Interceptor(Protocol):
    """The adversary layer's view of the transport (see attacks/)."""

    def pre_codec(self, msg: Message) -> Message: ...

    def post_codec(self, msg: Message, wire: Wire, ctx: CodecContext) -> Wire: ...

    def dp_contribution(self, step: int, stage_idx: int, worker: str, vec: torch.Tensor) -> torch.Tensor: ...


class Verifier(Protocol):
    """A trusted relay at the boundaries: returns a verdict per message (see sentinel/detectors)."""

    def observe(self, msg: Message): ...


class Responder(Protocol):
    """Turns a verdict into the tensor the receiver gets (None = microbatch dropped); weighs a step's verdicts."""

    def deliver(self, msg: Message, verdict, substitute) -> torch.Tensor | None: ...

    def end_step(self, step: int, records: list) -> None: ...


class Transport:
    """Moves Messages between workers and records them.

    Args:
        log: the run's EventLog.
        codecs: codec per role (ACTIVATION, GRADIENT).
        seed: scenario seed (codecs derive shared randomness from it).
        adversary, verifier, responder: optional plug-ins; absent means honest, unchecked, accepted.
    """

    def __init__(
        self,
        log: EventLog,
        codecs: dict[Role, Codec],
        seed: int,
        adversary: Interceptor | None = None,
        verifier: Verifier | None = None,
        responder: Responder | None = None,
    ):
        self.log, self.codecs, self.seed = log, codecs, seed
        self.adversary, self.verifier, self.responder = adversary, verifier, responder
        self.bytes_sent = 0
        self.verifier_s = 0.0  # wall time spent in verifier.observe (cost accounting only)
        self.records: list = []  # (message, verdict) of the current step, for the response policy's end_step

    def send(self, msg: Message) -> torch.Tensor | None:
        """Carry `msg` to its receiver; returns the tensor delivered, or None if dropped."""
        msg.msg_id = self.log.next_message_id()
        payload = msg.payload.detach()
        msg.payload = payload
        ctx = CodecContext(msg.step, msg.mb_idx, msg.boundary, msg.role, self.seed, tuple(payload.shape), payload.dtype)
        if self.adversary is not None:
            msg = self.adversary.pre_codec(msg)
        codec = self.codecs[msg.role]
        wire = codec.encode(msg.payload, ctx)
        if self.adversary is not None:
            wire = self.adversary.post_codec(msg, wire, ctx)
        msg.wire_bytes = wire.nbytes()
        msg.payload = codec.decode(wire, ctx)
        msg.meta["wire"] = wire  # the compressed representation, for `detector.view: wire`
        msg.meta["wire_view"] = codec.wire_view(wire, ctx)
        self.bytes_sent += msg.wire_bytes
        self.log.log_message(msg)
        if self.verifier is None:
            return msg.payload
        t0 = time.perf_counter()
        verdict = self.verifier.observe(msg)
        self.verifier_s += time.perf_counter() - t0
        self.log.log_verdict(msg.msg_id, verdict)
        if self.responder is None:
            return msg.payload
        self.records.append((msg, verdict))
        return self.responder.deliver(msg, verdict, self.verifier.substitute)

    def end_step(self, step: int) -> None:
        """The response policy weighs the step's verdicts (canonical order) and decides bans."""
        records, self.records = sorted(self.records, key=lambda r: canonical_key(r[0])), []
        if self.responder is not None:
            self.responder.end_step(step, records)

    def dp_contribution(self, step: int, stage_idx: int, worker: str, vec: torch.Tensor) -> torch.Tensor:
        """A replica's DP-sync contribution (the adversary may tamper with its own)."""
        if self.adversary is None:
            return vec
        return self.adversary.dp_contribution(step, stage_idx, worker, vec)
