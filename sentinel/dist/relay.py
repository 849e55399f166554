"""Rank 0, the relay: the trusted verifier every boundary message passes through, and the run's record.

Trust model (as in the SENTINEL paper): verifiers are trusted relays that see every message between
stages. Here one relay process does it for every boundary: a sender's message goes sender -> relay
(header, then the encoded wire) and the relay decodes it, assigns its id, logs it, asks the verifier
for a verdict and the response policy for a delivery, and forwards the delivered tensor -- or a
"dropped" notice -- to the receiver. The receiver never uses a payload the relay did not pass.

Parity with `sim`: the relay runs sim's control flow (sentinel/dist/flow.py) under the same
`schedule.execute`, so it takes messages in sim's global order: same message ids, same sequence of
`verifier.observe` calls (detectors are stateful), same strikes, bans and replacements. It broadcasts
the step's bans and replacements before the DP sync, so every rank routes the next step identically.

Before a wire reaches the codec and the verifier, the relay checks what the receiver could not
consume: a header that names another message, a body over the size limit (drained, never allocated),
an unreadable manifest, byte counts that do not add up, a wire the codec cannot decode, or a decoded
payload whose shape or dtype is not the honest boundary tensor's. Such a message is logged, flagged
(`score_integrity = score_wire_reject = 1`), attributed to the sender the schedule expects on that
link, counted as a strike by the response policy, and dropped. Values (NaN, Inf, outliers) are the
verifier's business, exactly as in sim.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from sentinel.detectors.base import Verdict
from sentinel.dist import wire as W
from sentinel.dist.flow import RelayFlow
from sentinel.dist.mapping import RELAY
from sentinel.dist.runtime import Mesh, Runtime
from sentinel.engine.schedule import execute
from sentinel.engine.workers import WorkerTable
from sentinel.eventlog import EventLog
from sentinel.model import build_stages, global_parameters, loss_fn
from sentinel.scenario import Scenario
from sentinel.transport.codecs import CodecContext
from sentinel.transport.message import Message, Role

WIRE_REJECT = Verdict({"integrity": 1.0, "wire_reject": 1.0}, True)
BAN, ADD = 1, 2


class _RecordingTable(WorkerTable):
    """The relay's worker table: every ban is also recorded as an event for the other ranks."""

    def __init__(self, num_stages: int, num_replicas: int):
        super().__init__(num_stages, num_replicas)
        self.events: list[tuple[int, int, int]] = []

    def ban(self, wid: str) -> None:
        super().ban(wid)
        self.events.append((BAN, self.index(wid), 0))


class _Transport:
    """What the runner and the scorer read from an engine's transport."""

    def __init__(self) -> None:
        self.bytes_sent, self.verifier_s = 0, 0.0
        self.sim_time_s = None  # no simulated network clock: a dist run measures real time
        self.adversary = self.verifier = self.responder = None


class RelayRank(Mesh):
    """Rank 0. Also the engine object `sentinel.runner` sees (log, data, transport, workers, step)."""

    def __init__(self, sc: Scenario, rt: Runtime, log: EventLog):
        super().__init__(sc, rt, _RecordingTable(sc.pipeline.stages, sc.pipeline.replicas))
        self.log = log
        for wid in self.workers.ids:
            self.log.worker_index(wid)  # stable integer ids: workers first, in mesh order (as sim)
        self.eval_stages = [m.to(rt.device) for m in build_stages(sc.model, self.vocab, self.num_stages, sc.seed)]
        self.transport = _Transport()
        from attacks import build_adversary
        from sentinel.detectors import build_defence

        # The malicious set, for scoring only: the attacks themselves run on the malicious workers' ranks.
        self.transport.adversary = build_adversary(sc, _Shadow(self.workers))
        self.transport.verifier, self.transport.responder = build_defence(sc, self)
        self.limit = W.body_limit(self.payload_shape)
        self.step_s: list[float] = []
        self.rejected = 0
        self.hooks: list = []  # engine step hooks do not run on dist (sentinel.dist.runtime.check_supported)

    # -- one step ------------------------------------------------------------------------------------
    def train_step(self) -> float:
        step, t0 = self.step, time.perf_counter()
        plan = self.router.route(step, self.num_microbatches)
        flow = RelayFlow(self.num_stages, plan, lambda *a: self._carry(step, *a), lambda *a: self._post(step, plan, *a))
        execute(self.schedule, flow.ready, flow.run)
        self._broadcast_events()
        losses = torch.zeros(2, dtype=torch.float64, device=self.rt.comm_device)
        dist.all_reduce(losses)  # (sum, count) of the last stage's losses
        self.step += 1
        self.step_s.append(time.perf_counter() - t0)
        return float(losses[0] / losses[1]) if losses[1] else float("nan")

    def _post(self, step: int, plan: np.ndarray, kind: int, stage: int, mb: int, tensor: torch.Tensor | None) -> None:
        """Fill the inbox slot (stage, mb) on the rank hosting its worker: the tensor, or 'dropped'."""
        dst = self.rank_map.host[self.workers.ids[int(plan[mb, stage])]]
        self.rt.comm.send(W.header(step, mb, stage, kind, 0, 0, 0, 0, int(tensor is None)), dst)
        if tensor is not None:
            self.rt.comm.send(tensor, dst)

    def _carry(self, step: int, mb: int, boundary: int, role: Role, sender: int, receiver: int) -> torch.Tensor | None:
        """Take one message from its sender's rank; returns what the receiver gets (None = dropped)."""
        ids = self.workers.ids
        src = self.rank_map.host[ids[sender]]
        what = f"the {role.label} of step {step} mb {mb} across boundary {boundary} from {ids[sender]}"
        h = self.rt.comm.recv((W.HEADER_LEN,), torch.int64, src, what, W.CPU).tolist()
        if h[0] != W.MAGIC or h[7] < 0 or h[8] < 0:
            from sentinel.dist.comm import PeerFault

            raise PeerFault(src, f"{self.rank_map.describe(src)} broke the wire framing while sending {what}: {h}")
        body = W.recv_body(self.rt.comm, src, h[7] + h[8], self.limit, what)
        msg = Message(step, mb, boundary, role, ids[sender], ids[receiver], torch.zeros(self.payload_shape))
        msg.msg_id = self.log.next_message_id()
        try:
            payload, nbytes = self._decode(msg, h, body)
        except W.WireError as exc:
            return self._reject(msg, h[8], str(exc))
        msg.payload, msg.wire_bytes = payload, nbytes
        return self._verify(msg)

    def _decode(self, msg: Message, h: list[int], body: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        expected = W.expected_fields(msg.step, msg.mb_idx, msg.boundary, msg.role, *map(self.workers.index,
                                                                                        (msg.sender, msg.receiver)))
        if body is None:
            raise W.WireError(f"body of {h[7] + h[8]} bytes exceeds the limit of {self.limit}")
        if h[:7] != expected:
            raise W.WireError(f"header {h[:7]} names another message than the expected {expected}")
        wire = W.parse_body(body, h[7])
        ctx = CodecContext(msg.step, msg.mb_idx, msg.boundary, msg.role, self.sc.seed, self.payload_shape,
                           torch.float32)
        codec = self.codecs[msg.role]
        try:
            payload = codec.decode(wire, ctx)
            view = codec.wire_view(wire, ctx)
        except Exception as exc:  # any failure of a codec on adversarial bytes is the sender's fault
            raise W.WireError(f"the {msg.role.label} codec cannot decode it ({exc.__class__.__name__})") from None
        if not self._consumable(payload):
            got = f"{tuple(payload.shape)} {payload.dtype}" if isinstance(payload, torch.Tensor) else type(payload)
            raise W.WireError(f"decoded payload is {got}, expected {self.payload_shape} torch.float32")
        msg.meta["wire"], msg.meta["wire_view"] = wire, view  # as Transport.send: for `detector.view: wire`
        return payload, wire.nbytes()

    def _consumable(self, t) -> bool:
        return isinstance(t, torch.Tensor) and tuple(t.shape) == self.payload_shape and t.dtype == torch.float32

    def _reject(self, msg: Message, declared_bytes: int, reason: str) -> None:
        """A frame the receiver could not consume: logged, flagged, a strike for its sender, dropped."""
        msg.wire_bytes = max(0, declared_bytes)
        msg.meta["wire_reject"] = reason
        self.transport.bytes_sent += msg.wire_bytes
        self.log.log_message(msg)
        self.log.log_verdict(msg.msg_id, WIRE_REJECT)
        self.rejected += 1
        print(f"[relay] rejected msg {msg.msg_id} from {msg.sender} (step {msg.step}): {reason}", flush=True)
        if self.transport.responder is not None:
            self.transport.responder.deliver(msg, WIRE_REJECT)  # strikes and bans; the payload is dropped
        return None

    def _verify(self, msg: Message) -> torch.Tensor | None:
        """The relay half of Transport.send (decode happened in `_decode`): log, verify, respond.

        Keep in step with `sentinel.transport.Transport.send`; the parity tests catch any drift.
        """
        t = self.transport
        t.bytes_sent += msg.wire_bytes
        self.log.log_message(msg)
        if t.verifier is None:
            return msg.payload
        t0 = time.perf_counter()
        verdict = t.verifier.observe(msg)
        t.verifier_s += time.perf_counter() - t0
        self.log.log_verdict(msg.msg_id, verdict)
        if t.responder is None:
            return msg.payload
        delivered = t.responder.deliver(msg, verdict)
        return delivered if delivered is None or self._consumable(delivered) else None

    def _broadcast_events(self) -> None:
        ev = self.workers.events
        n = torch.tensor([len(ev)], dtype=torch.int64, device=self.rt.comm_device)
        dist.broadcast(n, RELAY)
        if ev:
            dist.broadcast(torch.tensor(ev, dtype=torch.int64, device=self.rt.comm_device).reshape(-1), RELAY)
        ev.clear()

    # -- hooks for the defence (as SimEngine) ----------------------------------------------------------
    def add_replica(self, stage_idx: int, rejoin_of: str | None = None) -> str:
        """A replacement (or rejoining) worker: hosted by the least-loaded rank of its stage from the next step."""
        idx = self.workers.add_replacement(stage_idx)
        wid = self.workers.ids[idx]
        self.rank_map.place(wid, stage_idx, self.workers)
        self.log.worker_index(wid)
        self.workers.events.append((ADD, stage_idx, self.workers.index(rejoin_of) if rejoin_of else -1))
        rejoin = getattr(self.transport.adversary, "rejoin", None)
        if rejoin_of is not None and rejoin is not None:
            rejoin(rejoin_of, wid)
        return wid

    # -- evaluation --------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Sim's evaluation, on the reference replicas' weights (each sent by the rank that holds it)."""
        for s, module in enumerate(self.eval_stages):
            src = self.rank_map.host[self.workers.ids[self.reference(s)]]
            n = sum(p.numel() for p in module.parameters())
            flat = self.rt.comm.recv((n,), torch.float32, src, f"the stage {s} weights for evaluation")
            torch.nn.utils.vector_to_parameters(flat, module.parameters())
        losses = []
        for batch in self.data.val_batches():
            batch = batch.to(self.rt.device)
            x = batch[:, :-1]
            for m in self.eval_stages:
                x = m(x)
            losses.append(loss_fn(x, batch[:, 1:]).item())
        return float(np.mean(losses))

    def parameters(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor of the weights last evaluated (names as `SimEngine.parameters`)."""
        return global_parameters(self.eval_stages)


class _Shadow:
    """The engine view `attacks.build_adversary` needs, to learn the malicious set without running attacks."""

    def __init__(self, workers: WorkerTable):
        self.workers, self.log = workers, EventLog()
