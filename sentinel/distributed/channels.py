"""The distributed backend's channel: `torch.distributed` point-to-point through verifier processes.

The step program (sentinel/engine/step.py) runs unchanged in every process; what differs is this channel:

- on a **worker** rank (`WorkerChannel`), `send` runs the sender's half of the transport (adversary, codec) and
  ships the wire to the verifier process of the message's boundary; `skip` tells it a slot's message will not
  come; `take` waits for the verifier's delivery (a tensor, or "dropped");
- on a **verifier** rank (`VerifierChannel`), `begin_step` relays the whole step for the boundaries it serves:
  each boundary's activations in microbatch order (as stage b sends them), its gradients in microbatch order
  (as stage b+1 sends them), each through the relay's half of the transport (checks, decode, EventLog,
  verifier, response) -- the same `Relay` as in sim -- then the delivery to the receiver's rank. A message
  downstream of a flag in its microbatch is paused: the verifier learns it from the neighbouring verifier
  (a STATUS frame per delivered message: activations from boundary b-1, gradients from boundary b+1), which
  also carries the delivered tensor when the detector wants to see what a sender received.

At the end of every step (`end_step`, every rank): the verifiers send their verdicts to the coordinator
(rank 0), whose response policy weighs them in canonical order and decides bans and replacements; the
coordinator broadcasts them (so every rank routes the next step identically, before DP sync), and the
training losses of the last stage are summed on the coordinator.
"""

from __future__ import annotations

import collections
import json
import time

import torch
import torch.distributed as dist

from sentinel.detectors.verifier import PublishedState
from sentinel.distributed import wire as W
from sentinel.distributed.comm import Comm, Frames, PeerFault
from sentinel.distributed.faults import FaultInjector
from sentinel.distributed.mapping import COORDINATOR, RankMap
from sentinel.engine.step import DROPPED, Provenance, StepProgram, StepState
from sentinel.engine.workers import MeshEvent
from sentinel.transport.message import Message, Role, message_id
from sentinel.transport.relay import Relay, Sender, SenderInputs, WireError, route_origin
from sentinel.transport.verdict import Marker, Verdict


# -- step end: verdicts to the coordinator, mesh events to everyone, losses summed ------------------------
class StepEnd:
    """The step-end exchange every rank takes part in (see the module docstring)."""

    def __init__(self, comm: Comm, rank_map: RankMap, group):
        self.comm, self.rank_map, self.group = comm, rank_map, group

    def run(self, st: StepState, records: list | None, responder=None, mesh=None) -> list[MeshEvent]:
        rank = self.comm.rank
        if self.rank_map.is_verifier(rank) and rank != COORDINATOR:
            self._send_json(COORDINATOR, [_record_to_json(m, v) for m, v in records or []])
        events: list[MeshEvent] = []
        if rank == COORDINATOR:
            every = list(records or [])
            for v in range(1, self.rank_map.num_verifiers):
                every += [_record_from_json(r) for r in self._recv_json(v, f"the verdicts of step {st.step}")]
            if responder is not None:
                responder.end_step(st.step, sorted(every, key=lambda r: _key(r[0])))
            events = mesh.drain() if mesh is not None else []
        suspects = sorted(getattr(responder, "suspects", ())) if rank == COORDINATOR else []
        got = self._broadcast({"events": [dataclass_dict(e) for e in events], "suspects": suspects})
        events = got["events"]
        if responder is not None and rank != COORDINATOR:  # `on_flag: drop_suspect` reads them at every verifier
            responder.suspects = frozenset(got["suspects"])
        losses = torch.tensor([sum(st.losses), len(st.losses)], dtype=torch.float64)
        dist.all_reduce(losses, group=self.group)  # (sum, count) of the last stage's losses, on every rank
        st.reported_loss = float(losses[0] / losses[1]) if losses[1] else float("nan")
        return [MeshEvent(**e) for e in events]

    def _send_json(self, dst: int, data) -> None:
        raw = json.dumps(data).encode("utf-8")
        self.comm.send(torch.tensor([len(raw)], dtype=torch.int64), dst)
        if raw:
            self.comm.send(torch.frombuffer(bytearray(raw), dtype=torch.uint8), dst)

    def _recv_json(self, src: int, what: str):
        n = int(self.comm.recv((1,), torch.int64, src, what))
        return json.loads(self.comm.recv((n,), torch.uint8, src, what).numpy().tobytes().decode("utf-8"))

    def _broadcast(self, data: dict) -> dict:
        raw = json.dumps(data).encode("utf-8") if self.comm.rank == COORDINATOR else b""
        n = torch.tensor([len(raw)], dtype=torch.int64)
        dist.broadcast(n, COORDINATOR, group=self.group)
        buf = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(int(n), dtype=torch.uint8)
        dist.broadcast(buf, COORDINATOR, group=self.group)
        return json.loads(buf.numpy().tobytes().decode("utf-8"))


def dataclass_dict(ev: MeshEvent) -> dict:
    return {
        "kind": ev.kind,
        "step": ev.step,
        "worker": ev.worker,
        "stage": ev.stage,
        "replaced_by": ev.replaced_by,
        "rejoin_of": ev.rejoin_of,
        "by": ev.by,
    }


def _key(msg: Message) -> tuple:
    return (
        msg.step,
        msg.mb_idx,
        0 if msg.role == Role.ACTIVATION else 1,
        msg.boundary if msg.role == Role.ACTIVATION else -msg.boundary,
    )


def _record_to_json(msg: Message, v: Verdict) -> list:
    return [
        msg.step,
        msg.mb_idx,
        msg.boundary,
        int(msg.role),
        msg.sender,
        msg.receiver,
        msg.msg_id,
        dict(v.scores),
        bool(v.flagged),
        sorted(m.value for m in v.markers),
        v.pvalue,
        v.relation_pvalue,
    ]


def _record_from_json(r: list) -> tuple[Message, Verdict]:
    step, mb, b, role, sender, receiver, mid, scores, flagged, markers, pvalue, relation_pvalue = r
    msg = Message(step, mb, b, Role(role), sender, receiver, torch.empty(0), msg_id=mid)
    return msg, Verdict(scores, flagged, frozenset(Marker(m) for m in markers), pvalue, relation_pvalue)


# -- worker ranks ----------------------------------------------------------------------------------------
class WorkerChannel:
    """A worker rank's end of the channel (see the module docstring)."""

    def __init__(
        self,
        program: StepProgram,
        comm: Comm,
        rank_map: RankMap,
        sender: Sender,
        faults: FaultInjector,
        step_end: StepEnd,
        share_weights: bool = False,
    ):
        self.program, self.comm, self.rank_map, self.sender = program, comm, rank_map, sender
        self.faults, self.step_end, self.share_weights = faults, step_end, share_weights
        self.stage = rank_map.stage_of_rank(comm.rank)
        peers = sorted({rank_map.verifier_of[b] for b in (self.stage - 1, self.stage) if b in rank_map.verifier_of})
        self.frames = Frames(
            comm, peers, program.payload_shape, 0, {v: W.deliver_slot(program.payload_shape) for v in peers}
        )
        self.slot = W.message_slot(program.payload_shape)  # every frame of this rank: a message slot
        self.inbox: dict[tuple[int, int, int], object] = {}
        self.st: StepState | None = None

    def begin_step(self, program: StepProgram, st: StepState) -> None:
        self.st = st
        self.faults.at_step(st.step)
        if self.program.published is not None:  # white-box attackers read the detectors as they begin this step
            for v in range(self.rank_map.num_verifiers):
                if self.rank_map.boundaries(v):
                    n = int(self.comm.recv((1,), torch.int64, v, "the verifiers' published state"))
                    data = self.comm.recv((n,), torch.uint8, v, "the verifiers' published state")
                    self.program.published.load(data.numpy().tobytes())
        if self.share_weights:  # a recomputing detector: the verifiers on both sides get this step's weights
            verifiers = sorted(
                {self.rank_map.verifier_of[b] for b in (self.stage - 1, self.stage) if b in self.rank_map.verifier_of}
            )
            for v in verifiers:
                for i, rep in sorted(program.replicas.items()):
                    if program.workers.live[i]:
                        self.comm.send(torch.nn.utils.parameters_to_vector(rep.module.parameters()).detach(), v)

    def send(self, msg: Message, prov: Provenance) -> None:
        sent, wire = self.sender.encode(msg)
        wire, extra, garble = self.faults.tamper(sent, wire, self.program.log)
        manifest_len, body = W.encode_body(wire)
        if garble:
            body = torch.cat([torch.full((manifest_len,), ord("#"), dtype=torch.uint8), body[manifest_len:]])
        if extra:
            body = torch.cat([body, torch.zeros(extra, dtype=torch.uint8)])
        ids = self.program.workers.ids
        inline = W.HEAD_BYTES + body.numel() <= self.slot
        head = W.message_header(
            sent, ids.index(sent.sender), ids.index(sent.receiver), manifest_len, body.numel() - manifest_len, inline
        )
        dst = self.rank_map.verifier_of[msg.boundary]
        self.comm.send_slot(dst, head, body if inline else None, self.slot)
        if not inline:
            for piece in W.split_body(body):
                self.comm.send(piece, dst, self.comm.frames_group)

    def skip(self, role: Role, boundary: int, mb: int, step: int) -> None:
        head = W.header(W.SKIP, step, mb, boundary, int(role))
        self.comm.send_slot(self.rank_map.verifier_of[boundary], head, None, self.slot)

    def ready(self, role: Role, stage: int, mb: int) -> bool:
        return True  # `take` waits

    def take(self, role: Role, stage: int, mb: int) -> object:
        key = (int(role), stage, mb)
        while key not in self.inbox:
            boundary = stage - 1 if role == Role.ACTIVATION else stage
            v = self.rank_map.verifier_of[boundary]
            src, h, body = self.frames.get(
                lambda v=v: (
                    f"the {role.label} input of step {self.st.step} mb {mb} "
                    f"(stage {stage}) from {self.rank_map.describe(v)}",
                    [v],
                )
            )
            if h[1] != W.DELIVER or h[2] != self.st.step:
                raise PeerFault(
                    src,
                    f"{self.rank_map.describe(src)} sent an unexpected frame {h[:8]} to rank "
                    f"{self.comm.rank} in step {self.st.step}",
                )
            self.inbox[(h[5], h[4], h[3])] = DROPPED if h[6] else body.to(self.program.device)
        return self.inbox.pop(key)

    def end_step(self, st: StepState) -> list[MeshEvent]:
        return self.step_end.run(st, None)

    def close(self) -> None:
        end_frames(self.comm, self.frames, {v: self.slot for v in self.frames.peers})


def end_frames(comm: Comm, frames: Frames, slots: dict[int, int]) -> None:
    """End of a job: an END frame to every peer, whether or not its own END has arrived (each peer's reader of
    this rank waits for it), then wait for this rank's readers, so no reader is left blocked in a receive when
    the next job starts or the process group is destroyed. `slots`: the peers that read slots, with the size."""
    for p in frames.peers:
        if p in slots:
            comm.send_slot(p, W.header(W.END), None, slots[p])
        else:
            comm.send_frame(p, W.header(W.END))
    comm.flush()
    frames.join(comm.timeout_s)


# -- verifier ranks ---------------------------------------------------------------------------------------
class VerifierChannel:
    """A verifier rank: relays every message of its boundaries, one step at a time (see the module docstring)."""

    def __init__(
        self,
        program: StepProgram,
        comm: Comm,
        rank_map: RankMap,
        relay: Relay,
        step_end: StepEnd,
        responder=None,
        mesh=None,
        wants_inputs: bool = False,
        recompute=None,
        publish: bool = False,
        judged: bool = True,
    ):
        self.program, self.comm, self.rank_map, self.relay = program, comm, rank_map, relay
        self.step_end, self.responder, self.mesh, self.wants_inputs = step_end, responder, mesh, wants_inputs
        self.recompute, self.publish = recompute, publish
        # a STATUS frame tells the next verifier whether a message is downstream of a flag (paused) and, for a
        # detector that reads the sender's inputs, what was delivered; with no detector neither is read
        # (the same on every verifier rank: it depends on the scenario only)
        self.statuses = judged or wants_inputs
        self.relay_s = 0.0  # wall seconds spent relaying steps (messages per second per verifier)
        self.S, self.M = program.num_stages, program.num_microbatches
        self.mine = rank_map.boundaries(comm.rank)
        peers = set()
        for b in self.mine:
            peers.update(rank_map.stage_ranks[b] + rank_map.stage_ranks[b + 1])
            for nb in (b - 1, b + 1):
                if nb in rank_map.verifier_of and rank_map.verifier_of[nb] != comm.rank:
                    peers.add(rank_map.verifier_of[nb])
        size = W.message_slot(program.payload_shape)
        self.frames = Frames(
            comm,
            sorted(peers),
            program.payload_shape,
            W.body_limit(program.payload_shape),
            {p: size for p in peers if not rank_map.is_verifier(p)},
        )
        self.stale: list = []  # frames of a later step that arrived early (none in a well-behaved run)

    # the program's own pipeline is empty on a verifier rank
    def send(self, msg, prov):
        raise AssertionError("a verifier rank hosts no worker")

    def skip(self, role, boundary, mb, step):
        raise AssertionError("a verifier rank hosts no worker")

    def ready(self, role, stage, mb):
        return True

    def take(self, role, stage, mb):
        raise AssertionError("a verifier rank hosts no worker")

    def end_step(self, st: StepState) -> list[MeshEvent]:
        records, self.relay.records = self.relay.records, []
        events = self.step_end.run(st, records, self.responder, self.mesh)
        if self.responder is not None and self.comm.rank != COORDINATOR:
            for ev in events:  # the delivery policy here drops banned senders' messages from the next step on
                if ev.kind == "ban":
                    self.responder.banned.setdefault(ev.worker, ev.step)
        return events

    def close(self) -> None:
        size = W.deliver_slot(self.program.payload_shape)
        end_frames(self.comm, self.frames, {p: size for p in self.frames.peers if not self.rank_map.is_verifier(p)})

    # -- one step -----------------------------------------------------------------------------------------
    def begin_step(self, program: StepProgram, st: StepState) -> None:
        """Relay every message of this rank's boundaries for this step."""
        if not self.mine:
            return
        t0 = time.perf_counter()
        try:
            self._relay_step(program, st)
        finally:
            self.relay_s += time.perf_counter() - t0

    def _relay_step(self, program: StepProgram, st: StepState) -> None:
        self.st, self.plan, self.ids = st, st.plan, program.workers.ids
        if self.publish:  # to every worker process: white-box attackers read the detectors as this step begins
            data = PublishedState.publish({b: v.detector for b, v in self.relay.verifiers.items()})
            blob = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            for rank in range(self.rank_map.num_verifiers, self.rank_map.world_size):
                self.comm.send(torch.tensor([blob.numel()], dtype=torch.int64), rank)
                self.comm.send(blob, rank)
        if self.recompute is not None:
            self.recompute.receive()
        self.inbox: dict[tuple[int, int, int], tuple] = {}  # (boundary, role, mb) -> (src, header, body)
        self.status: dict[tuple[int, int, int], tuple] = {}  # (boundary, role, mb) -> (tainted, payload)
        self.act_next = {b: 0 for b in self.mine}
        self.grads = {b: collections.deque() for b in self.mine}  # mbs whose gradient is due, in order
        self.delivered: dict[tuple[int, int, int], torch.Tensor] = {}  # for the inputs of later messages
        self.act_taint: dict[tuple[int, int], bool] = {}
        for frame in self.stale:
            self._file(*frame)
        self.stale = []
        while not self._done():
            if not self._advance():
                self._file(*self.frames.get(self._awaited))

    def _done(self) -> bool:
        return all(self.act_next[b] == self.M and not self.grads[b] for b in self.mine)

    def _advance(self) -> bool:
        """Handle every stream's next message while its frame (and its upstream status) is here."""
        progressed = False
        for b in self.mine:
            while self.act_next[b] < self.M and self._act(b, self.act_next[b]):
                self.act_next[b] += 1
                progressed = True
            while self.grads[b] and self._grad(b, self.grads[b][0]):
                self.grads[b].popleft()
                progressed = True
        return progressed

    def _file(self, src: int, h: list[int], body) -> None:
        """Sort one frame into the inbox (messages) or the status table (neighbouring verifiers)."""
        if h[2] != self.st.step:
            if h[2] > self.st.step:
                self.stale.append((src, h, body))
                return
            raise PeerFault(src, f"{self.rank_map.describe(src)} sent a frame of step {h[2]} in step {self.st.step}")
        if h[1] == W.STATUS:
            b, role, mb = h[4], h[5], h[3]
            target = b + 1 if role == Role.ACTIVATION else b - 1  # the boundary this status is for
            self.status[(target, role, mb)] = (bool(h[6]), body)
            return
        if h[1] not in (W.MSG, W.SKIP) or h[4] not in self.mine:
            raise PeerFault(
                src, f"{self.rank_map.describe(src)} sent frame {h[:8]} to {self.rank_map.describe(self.comm.rank)}"
            )
        b, role, mb = h[4], h[5], h[3]
        sender_stage = b if role == Role.ACTIVATION else b + 1
        if (
            not 0 <= mb < self.M
            or self.rank_map.host[self.ids[int(self.plan[mb, sender_stage])]] != src
            or (b, role, mb) in self.inbox
        ):
            raise PeerFault(src, f"{self.rank_map.describe(src)} sent a frame it does not own: {h[:8]}")
        self.inbox[(b, role, mb)] = (src, h, body)

    def _awaited(self) -> tuple[str, list[int]]:
        parts, ranks = [], []
        for b in self.mine:
            awaited = []
            if self.act_next[b] < self.M:
                awaited.append(("activation", self.act_next[b], b))
            if self.grads[b]:
                awaited.append(("gradient", self.grads[b][0], b + 1))
            for kind, mb, stage in awaited:
                rank = self.rank_map.host[self.ids[int(self.plan[mb, stage])]]
                ranks.append(rank)
                parts.append(f"the {kind} of mb {mb} across boundary {b} from {self.rank_map.describe(rank)}")
        return f"step {self.st.step}: " + "; ".join(parts), ranks

    # -- the two streams of a boundary ------------------------------------------------------------------
    def _act(self, b: int, mb: int) -> bool:
        frame = self.inbox.get((b, Role.ACTIVATION, mb))
        if frame is None:
            return False
        receiver = self.rank_map.host[self.ids[int(self.plan[mb, b + 1])]]
        if frame[1][1] == W.SKIP:  # dropped upstream: the next stage is told, nothing to judge
            self._deliver(receiver, mb, b + 1, Role.ACTIVATION, None)
            del self.inbox[(b, Role.ACTIVATION, mb)]
            return True
        upstream = self._upstream(b, Role.ACTIVATION, mb)
        if upstream is None:
            return False
        tainted, x_in = upstream
        if b == 0 and self.wants_inputs:
            x_in = self.st.batch[mb, :, :-1]
        got = self._relay(frame, b, Role.ACTIVATION, mb, tainted, x_in, None, receiver, b + 1)
        del self.inbox[(b, Role.ACTIVATION, mb)]
        sender = self.rank_map.host[self.ids[int(self.plan[mb, b])]]
        if got.payload is None:
            self._deliver(sender, mb, b, Role.GRADIENT, None)  # no backward will come for this microbatch
            return True
        self.grads[b].append(mb)
        taint = tainted or got.flagged
        self.act_taint[(b, mb)] = taint
        if self.wants_inputs:
            self.delivered[(b, Role.ACTIVATION, mb)] = got.payload
        if b + 1 < self.S - 1:
            self._status(b + 1, b, Role.ACTIVATION, mb, taint, got.payload)
        return True

    def _grad(self, b: int, mb: int) -> bool:
        frame = self.inbox.get((b, Role.GRADIENT, mb))
        if frame is None:
            return False
        receiver = self.rank_map.host[self.ids[int(self.plan[mb, b])]]
        if frame[1][1] == W.SKIP:
            self._deliver(receiver, mb, b, Role.GRADIENT, None)
            del self.inbox[(b, Role.GRADIENT, mb)]
            return True
        if b == self.S - 2:  # the last boundary: downstream of it is every activation of the microbatch
            tainted, g_in = self.act_taint[(b, mb)], None
        else:
            upstream = self._upstream(b, Role.GRADIENT, mb)
            if upstream is None:
                return False
            tainted, g_in = upstream
        x_in = self.delivered.get((b, Role.ACTIVATION, mb))
        got = self._relay(frame, b, Role.GRADIENT, mb, tainted, x_in, g_in, receiver, b)
        del self.inbox[(b, Role.GRADIENT, mb)]
        if got.payload is not None and b > 0:
            self._status(b - 1, b, Role.GRADIENT, mb, tainted or got.flagged, got.payload)
        return True

    def _upstream(self, b: int, role: Role, mb: int) -> tuple[bool, torch.Tensor | None] | None:
        """(tainted, the tensor delivered upstream) for the message (b, role, mb); None while not known yet."""
        if (role == Role.ACTIVATION and b == 0) or not self.statuses:
            return False, None
        got = self.status.pop((b, int(role), mb), None)
        if got is None:
            return None
        return got

    def _status(self, target: int, b: int, role: Role, mb: int, tainted: bool, payload: torch.Tensor) -> None:
        """Tell the verifier of boundary `target` about the message (b, role, mb) it is downstream of."""
        if not self.statuses:
            return
        dst = self.rank_map.verifier_of[target]
        sent = payload if self.wants_inputs else None
        if dst == self.comm.rank:
            self.status[(target, int(role), mb)] = (tainted, sent)
            return
        head = W.header(W.STATUS, self.st.step, mb, b, int(role), int(tainted), int(sent is not None))
        self.comm.send_frame(dst, head, sent.float() if sent is not None else None)

    def _deliver(self, dst: int, mb: int, stage: int, role: Role, payload: torch.Tensor | None) -> None:
        head = W.header(W.DELIVER, self.st.step, mb, stage, int(role), int(payload is None))
        body = payload.float() if payload is not None else None
        self.comm.send_slot(dst, head, body, W.deliver_slot(self.program.payload_shape))

    def _relay(self, frame: tuple, b: int, role: Role, mb: int, tainted: bool, x_in, g_in, receiver: int, stage: int):
        """Carry one message and deliver it to `receiver` (the input of `stage`): before the verifier judges it where
        the response policy delivers without reading the verdict (`Relay.carry`'s `early`), else after."""
        sent = []
        got = self._carry(
            frame, b, role, mb, tainted, x_in, g_in, lambda p: sent.append(self._deliver(receiver, mb, stage, role, p))
        )
        if not sent:
            self._deliver(receiver, mb, stage, role, got.payload)
        return got

    def _carry(self, frame: tuple, b: int, role: Role, mb: int, tainted: bool, x_in, g_in, early=None):
        """The relay's half of the transport on one framed message (`early`: see `Relay.carry`)."""
        src, h, body = frame
        sender_stage, receiver_stage = (b, b + 1) if role == Role.ACTIVATION else (b + 1, b)
        sender = self.ids[int(self.plan[mb, sender_stage])]
        receiver = self.ids[int(self.plan[mb, receiver_stage])]
        mid = message_id(self.st.step, mb, b, role, self.M, self.S)
        msg = Message(self.st.step, mb, b, role, sender, receiver, torch.empty(0), msg_id=mid)
        declared = max(0, h[9])
        try:
            if body is None:
                raise WireError(
                    f"body of {h[8] + h[9]} bytes exceeds the limit of {W.body_limit(self.program.payload_shape)}"
                )
            if h[6] != self.ids.index(sender) or h[7] != self.ids.index(receiver):
                raise WireError(f"header names sender {h[6]} / receiver {h[7]}, the schedule {sender} / {receiver}")
            wire = W.parse_body(body, h[8])
        except WireError as exc:
            print(
                f"[verifier {self.comm.rank}] refused msg {mid} from {sender} (step {self.st.step}): {exc}", flush=True
            )
            return self.relay.refuse(msg, declared, str(exc))
        key = (self.st.step, mb, b, int(role))
        inputs = (
            SenderInputs(key, x_in, g_in, route_origin(self.plan, self.ids, mb, b, role)) if self.wants_inputs else None
        )
        return self.relay.carry(msg, wire, paused=tainted, inputs=inputs, early=early)
