"""A worker rank: hosts the replicas of one stage, computes, and sends every boundary tensor to the relay.

Per step (the same phases as `SimEngine.train_step`):

    route      the same seeded plan as every other rank (Router)
    pipeline   this stage's schedule actions for the microbatches routed to its replicas, in schedule
               order; inputs come from the relay (a tensor, or "dropped"); outputs leave through the
               sender half of the transport: adversary.pre_codec -> codec.encode -> adversary.post_codec
    events     the relay's bans and replacements of the step (broadcast), applied to the worker table
    dp_sync    all_gather of the replicas' local mean gradients on the stage's process group, then the
               same aggregator on every rank (rows in worker-table order, as sim stacks them)
    update     every live hosted replica steps its own optimizer

The adversary (when the scenario has one) lives here, in the malicious worker's own process, and
writes ground truth to this rank's part of the EventLog (message ids are provisional; the relay's
ids replace them when rank 0 merges).
"""

from __future__ import annotations

import copy
import io
import time

import torch
import torch.distributed as dist

from sentinel.distributed import wire as W
from sentinel.distributed.faults import FaultInjector, parse_faults
from sentinel.distributed.mapping import RELAY
from sentinel.distributed.runtime import Mesh, Runtime
from sentinel.engine.optim import lr_at
from sentinel.engine.sim import Replica
from sentinel.eventlog import EventLog
from sentinel.model import build_stages, loss_fn
from sentinel.scenario import Scenario
from sentinel.transport.codecs import CodecContext
from sentinel.transport.message import Message, Role

PROVISIONAL_ID = 1 << 40  # sender-side message ids: unique per rank, replaced by the relay's when merging


class _Step:
    def __init__(self, step: int, batch: torch.Tensor, plan):
        self.step, self.batch, self.plan = step, batch, plan
        self.inbox: dict[tuple[int, int], torch.Tensor | None] = {}
        self.skipped: set[int] = set()
        self.losses: list[float] = []


class WorkerRank(Mesh):
    """Ranks 1..N-1."""

    def __init__(self, sc: Scenario, rt: Runtime):
        super().__init__(sc, rt)
        self.log = EventLog()
        for wid in self.workers.ids:
            self.log.worker_index(wid)
        self.stage = self.rank_map.stage_of_rank(rt.rank)
        self.template = build_stages(sc.model, self.vocab, self.num_stages, sc.seed)[self.stage].to(rt.device)
        self.replicas: dict[int, Replica] = {
            i: Replica(self.workers.ids[i], self.stage, copy.deepcopy(self.template), sc)
            for i in self.rank_map.hosted(rt.rank, self.workers)
        }
        from attacks import build_adversary

        self.adversary = build_adversary(sc, self)  # uses .workers and .log only
        hosted = [self.workers.ids[i] for i in self.replicas]
        self.faults = FaultInjector(parse_faults(rt.options.faults), hosted)
        self._next_id = PROVISIONAL_ID
        self.compute_s = 0.0

    # -- one step ------------------------------------------------------------------------------------
    def train_step(self) -> None:
        step = self.step
        self.faults.at_step(step)
        st = _Step(step, self.data.train_batch(step).to(self.rt.device), self.router.route(step, self.num_microbatches))
        for a in self.schedule[self.stage]:
            if int(st.plan[a.mb, self.stage]) in self.replicas:
                (self._forward if a.kind == "F" else self._backward)(st, a.mb)
        self.apply_events(self.recv_events())
        self._update(step, self._dp_sync(step))
        losses = torch.tensor([sum(st.losses), len(st.losses)], dtype=torch.float64, device=self.rt.comm_device)
        dist.all_reduce(losses)  # rank 0 reports the step's mean loss
        self.step += 1

    def _await(self, st: _Step, kind: int, mb: int) -> torch.Tensor | None:
        """The input of (kind, mb): receive from the relay, in its order, until it is there."""
        while (kind, mb) not in st.inbox:
            what = f"the relay's delivery for step {st.step} (waiting for mb {mb} {('activation', 'gradient')[kind]})"
            h = self.rt.comm.recv((W.HEADER_LEN,), torch.int64, RELAY, what, W.CPU).tolist()
            assert h[0] == W.MAGIC and h[1] == st.step and h[3] == self.stage, f"relay protocol: {h}"
            got = None if h[9] else self.rt.comm.recv(self.payload_shape, torch.float32, RELAY, what)
            st.inbox[(h[4], h[2])] = got
        return st.inbox.pop((kind, mb))

    def _forward(self, st: _Step, mb: int) -> None:  # mirrors SimEngine._forward
        s, last = self.stage, self.stage == self.num_stages - 1
        got = self._await(st, W.KIND_ACT, mb) if s > 0 else None
        if s > 0 and got is None:
            st.skipped.add(mb)
            return
        rep = self.replicas[int(st.plan[mb, s])]
        t0 = time.perf_counter()
        x = st.batch[mb, :, :-1] if s == 0 else got.detach().requires_grad_()  # B, T(, C)
        out = rep.module(x)
        if last:
            targets = st.batch[mb, :, 1:]
            corrupt = getattr(self.adversary, "corrupt_targets", None)  # target_corruption (attacks/)
            if corrupt is not None:
                targets = corrupt(st.step, mb, rep.wid, targets.cpu()).to(targets.device)
            loss = loss_fn(out, targets)
            rep.saved[mb] = (x, loss)
            st.losses.append(loss.item())
            self.log.log_loss(st.step, mb, st.losses[-1])
            self.compute_s += time.perf_counter() - t0
            return
        rep.saved[mb] = (x, out)
        self.compute_s += time.perf_counter() - t0
        receiver = self.workers.ids[int(st.plan[mb, s + 1])]
        self.send(Message(st.step, mb, s, Role.ACTIVATION, rep.wid, receiver, out))

    def _backward(self, st: _Step, mb: int) -> None:  # mirrors SimEngine._backward
        if mb in st.skipped:
            return
        s = self.stage
        rep = self.replicas[int(st.plan[mb, s])]
        x, out = rep.saved.pop(mb)
        if s == self.num_stages - 1:
            t0 = time.perf_counter()
            out.backward()
        else:
            g = self._await(st, W.KIND_GRAD, mb)
            if g is None:
                return
            t0 = time.perf_counter()
            out.backward(g)
        self.compute_s += time.perf_counter() - t0
        rep.n_backward += 1
        if s == 0:
            return
        sender_to = self.workers.ids[int(st.plan[mb, s - 1])]
        self.send(Message(st.step, mb, s - 1, Role.GRADIENT, rep.wid, sender_to, x.grad))

    # -- the sender half of Transport.send -----------------------------------------------------------
    def send(self, msg: Message) -> None:
        """Adversary and codec run here (the sender's process); the relay decodes, logs and verifies."""
        msg.msg_id, self._next_id = self._next_id, self._next_id + 1
        payload = msg.payload.detach().cpu()  # adversary and codec run on the CPU, as in sim (no-op on CPU)
        msg.payload = payload
        ctx = CodecContext(msg.step, msg.mb_idx, msg.boundary, msg.role, self.sc.seed, tuple(payload.shape),
                           payload.dtype)
        if self.adversary is not None:
            msg = self.adversary.pre_codec(msg)
        wire = self.codecs[msg.role].encode(msg.payload, ctx)
        if self.adversary is not None:
            wire = self.adversary.post_codec(msg, wire, ctx)
        wire, extra, garble = self.faults.tamper(msg, wire, self.log)
        manifest_len, body = W.encode_body(wire)
        if garble:
            body = torch.cat([torch.full((manifest_len,), ord("#"), dtype=torch.uint8), body[manifest_len:]])
        if extra:
            body = torch.cat([body, torch.zeros(extra, dtype=torch.uint8)])
        ids = self.workers.ids
        head = W.message_header(msg, ids.index(msg.sender), ids.index(msg.receiver), manifest_len,
                                body.numel() - manifest_len)
        self.rt.comm.send(head, RELAY)
        W.send_body(self.rt.comm, RELAY, body)

    # -- step end: events, DP sync, update -----------------------------------------------------------
    def recv_events(self) -> list[tuple[int, int, int]]:
        n = torch.zeros(1, dtype=torch.int64, device=self.rt.comm_device)
        dist.broadcast(n, RELAY)
        if not int(n):
            return []
        ev = torch.zeros(int(n) * 3, dtype=torch.int64, device=self.rt.comm_device)
        dist.broadcast(ev, RELAY)
        return [tuple(e) for e in ev.view(-1, 3).tolist()]

    def apply_events(self, events: list[tuple[int, int, int]]) -> None:
        """Replay the relay's bans (1, worker, -) and replacements (2, stage, rejoin_of or -1) in order."""
        for kind, a, b in events:
            if kind == 1:
                self.workers.ban(self.workers.ids[a])
                continue
            live = self.workers.live_in_stage(a)
            src = live[0] if live else self.workers.stage.index(a)  # as SimEngine.add_replica
            idx = self.workers.add_replacement(a)
            wid = self.workers.ids[idx]
            self.log.worker_index(wid)
            host = self.rank_map.place(wid, a, self.workers)
            self._copy_replica(src, idx, host)
            rejoin = getattr(self.adversary, "rejoin", None)
            if b >= 0 and rejoin is not None:
                rejoin(self.workers.ids[b], wid)

    def _copy_replica(self, src: int, dst: int, host: int) -> None:
        """The new replica starts from the weights and optimizer state of `src` (sent when on another rank)."""
        src_host, me = self.rank_map.host[self.workers.ids[src]], self.rt.rank
        if me not in (src_host, host):
            return
        if me == src_host:
            buf = io.BytesIO()
            rep = self.replicas[src]
            torch.save({"module": rep.module.state_dict(), "optimizer": rep.optimizer.state_dict()}, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            if host != me:
                self.rt.comm.send(torch.tensor([data.numel()], dtype=torch.int64), host)
                self.rt.comm.send(data, host)
                return
        else:
            what = f"the state of {self.workers.ids[src]} for its replacement {self.workers.ids[dst]}"
            n = int(self.rt.comm.recv((1,), torch.int64, src_host, what))
            data = self.rt.comm.recv((n,), torch.uint8, src_host, what).cpu()
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True, map_location=self.rt.device)
        rep = Replica(self.workers.ids[dst], self.stage, copy.deepcopy(self.template), self.sc)
        rep.module.load_state_dict(state["module"])
        rep.optimizer.load_state_dict(state["optimizer"])
        self.replicas[dst] = rep

    def _dp_sync(self, step: int) -> bool:
        """Mirrors SimEngine._dp_sync for this stage; returns whether the stage has a gradient to apply."""
        live = [i for i in self.workers.live_in_stage(self.stage)]
        mine = [i for i in live if i in self.replicas and self.replicas[i].n_backward > 0]
        if self.sc.dp.sync == "none":
            for i in mine:
                r = self.replicas[i]
                for p in r.params:
                    if p.grad is not None:
                        p.grad.div_(r.n_backward)
            return bool(mine)
        rows = self._gather_rows(step, mine)
        if not rows:
            return False
        vecs = torch.stack([v for _, _, v in rows])
        weights = torch.tensor([w for _, w, _ in rows], dtype=torch.float64)
        agg = self.aggregator(vecs, weights)
        for i in live:
            if i in self.replicas:
                self.replicas[i].set_flat_grad(agg)
        return True

    def _gather_rows(self, step: int, mine: list[int]) -> list[tuple[int, int, torch.Tensor]]:
        """(table index, n_backward, contribution) of every contributing replica of the stage, in table order."""
        rows = []
        for i in mine:
            r = self.replicas[i]
            vec = r.flat_grad() / r.n_backward
            if self.adversary is not None:
                vec = self.adversary.dp_contribution(step, self.stage, r.wid, vec.cpu()).to(vec.device)
            rows.append((i, r.n_backward, vec))
        ranks = self.rank_map.stage_ranks[self.stage]
        if len(ranks) == 1:
            return rows
        d = self.template_numel()
        width = max(len(self.rank_map.hosted(r, self.workers)) for r in ranks)
        packed = torch.zeros(width, d + 2, device=self.rt.comm_device)
        packed[:, 0] = -1
        for j, (i, n, vec) in enumerate(rows):
            packed[j, 0], packed[j, 1], packed[j, 2:] = i, n, vec.to(self.rt.comm_device)
        out = [torch.empty_like(packed) for _ in ranks]
        dist.all_gather(out, packed, group=self.groups[self.stage])
        every = torch.cat(out).to(self.rt.device)
        return sorted(((int(row[0]), int(row[1]), row[2:]) for row in every if row[0] >= 0), key=lambda r: r[0])

    def template_numel(self) -> int:
        return sum(p.numel() for p in self.template.parameters())

    def _update(self, step: int, stepped: bool) -> None:  # mirrors SimEngine._update for the hosted replicas
        lr = lr_at(step, self.sc.training)
        for i, r in self.replicas.items():
            if self.workers.live[i] and stepped and (self.sc.dp.sync == "allreduce" or r.n_backward):
                for g in r.optimizer.param_groups:
                    g["lr"] = lr
                r.optimizer.step()
            r.optimizer.zero_grad(set_to_none=True)
            r.n_backward = 0
            r.saved.clear()

    def restore(self, state: dict) -> None:
        """Rebuild the hosted replicas from a checkpoint (sentinel/distributed/checkpoint.py loaded the rest)."""
        self.replicas = {}
        for wid, rs in state["replicas"].items():
            rep = Replica(wid, self.stage, copy.deepcopy(self.template), self.sc)
            rep.module.load_state_dict(rs["module"])
            rep.optimizer.load_state_dict(rs["optimizer"])
            self.replicas[self.workers.index(wid)] = rep
        self._next_id = int(state["next_id"])

    # -- evaluation and results ------------------------------------------------------------------------
    def send_reference(self) -> None:
        """At an evaluation: the rank holding the stage's reference replica sends its weights to the relay."""
        ref = self.reference(self.stage)
        if ref in self.replicas:
            flat = torch.nn.utils.parameters_to_vector(self.replicas[ref].module.parameters())
            self.rt.comm.send(flat.detach(), RELAY)
