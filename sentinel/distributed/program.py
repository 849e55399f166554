"""One process of a distributed run: the step program with this rank's placement, channel and collective.

    verifier ranks (0..V-1)   no replicas; the channel relays the step for their boundaries (channels.py).
                              Rank 0 also coordinates: the response policy's step-end decisions, evaluation
                              (the reference replicas' weights are sent to it), the EventLog merge
    worker ranks (V..N-1)     the replicas of one stage; the adversary of a malicious worker lives here and
                              writes ground truth to this rank's part of the EventLog

Every rank derives the same routing, schedule, message ids and worker table from the scenario seed and the
step-end events, so a run reproduces the sim run of the same scenario.
"""

from __future__ import annotations

import copy
import io
import time

import numpy as np
import torch
import torch.distributed as dist

from attacks import build_adversary
from attacks.validation import white_box_attacks
from sentinel.detectors.recompute import Duplication
from sentinel.detectors.verifier import PublishedState, build_defence, build_verifiers
from sentinel.distributed.channels import StepEnd, VerifierChannel, WorkerChannel
from sentinel.distributed.faults import FaultInjector, parse_faults
from sentinel.distributed.mapping import COORDINATOR, RankMap
from sentinel.distributed.runtime import Runtime
from sentinel.engine.step import StepProgram, mesh_control
from sentinel.engine.workers import WorkerTable
from sentinel.eventlog import EventLog
from sentinel.model import dims, loss_fn
from sentinel.registry import DETECTORS
from sentinel.response import Responder
from sentinel.scenario import Scenario
from sentinel.transport.message import Role
from sentinel.transport.relay import Relay, Sender


class RankPlacement:
    """The workers a rank hosts (RankMap), and where workers added later go."""

    def __init__(self, rank_map: RankMap, rank: int):
        self.rank_map, self.rank = rank_map, rank

    def hosts(self, wid: str) -> bool:
        return self.rank_map.host.get(wid) == self.rank

    def stages(self) -> list[int]:
        return [] if self.rank_map.is_verifier(self.rank) else [self.rank_map.stage_of_rank(self.rank)]

    def place(self, wid: str, stage_idx: int, workers: WorkerTable) -> None:
        self.rank_map.place(wid, stage_idx, workers)


class TorchCollective:
    """The DP sync of a stage over its ranks' process group; a replica's state sent to the rank of a new one."""

    def __init__(self, program: DistProgram, groups: list):
        self.program, self.groups = program, groups

    def gather(self, stage_idx: int, rows: list, numel: int) -> list:
        """All-gather (table index, microbatches, contribution) of every contributing replica, in table order.

        `numel` is every contribution's length, given by the caller: a process with no contributing replica (its
        own banned, or none routed a microbatch) still takes part, and must pack rows of the same width as the
        others (sparse averaging sends a slice of the parameters, not all of them)."""
        p = self.program
        ranks = p.rank_map.stage_ranks[stage_idx]
        if len(ranks) == 1:
            return rows
        d = numel
        width = max(len(p.rank_map.hosted(r, p.workers)) for r in ranks)
        comm_device = p.rt.dp_device
        packed = torch.zeros(width, d + 2, device=comm_device)
        packed[:, 0] = -1
        for j, (i, n, vec) in enumerate(rows):
            packed[j, 0], packed[j, 1], packed[j, 2:] = i, n, vec.to(comm_device)
        out = [torch.empty_like(packed) for _ in ranks]
        dist.all_gather(out, packed, group=self.groups[stage_idx])
        every = torch.cat(out).to(p.device)
        return sorted(((int(row[0]), int(row[1]), row[2:]) for row in every if row[0] >= 0), key=lambda r: r[0])

    def share(self, key: str, mine: dict) -> dict:
        """Merge what every process of the tied group (the first and the last stage's ranks) contributes.

        Each process's dict travels as `torch.save` bytes (read back with `weights_only=True`); a key several
        processes give (replicas of one stage after their all-reduce) takes the first, in rank order."""
        group = self.program.tied_group
        buf = io.BytesIO()
        torch.save(mine, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
        dist.all_gather(sizes, size, group=group)
        width = int(max(s.item() for s in sizes))
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: data.numel()] = data
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        out: dict = {}
        for part, n in zip(parts, sizes):
            for k, v in torch.load(
                io.BytesIO(part[: int(n)].numpy().tobytes()), weights_only=True, map_location=self.program.device
            ).items():
                out.setdefault(k, v)
        return out

    def copy_replica(self, src: int, dst: int, stage_idx: int) -> dict | None:
        """The state of replica `src` for a new replica `dst` (sent when they live on different ranks)."""
        p = self.program
        ids, me = p.workers.ids, p.rt.rank
        src_host, dst_host = p.rank_map.host[ids[src]], p.rank_map.host[ids[dst]]
        if me not in (src_host, dst_host):
            return None
        if me == src_host:
            buf = io.BytesIO()
            rep = p.replicas[src]
            torch.save({"module": rep.module.state_dict(), "optimizer": rep.optimizer.state_dict()}, buf)
            if dst_host == me:
                buf.seek(0)
                return torch.load(buf, weights_only=True, map_location=p.device)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            p.comm.send(torch.tensor([data.numel()], dtype=torch.int64), dst_host)
            p.comm.send(data, dst_host)
            return None
        what = f"the state of {ids[src]} for its replacement {ids[dst]}"
        n = int(p.comm.recv((1,), torch.int64, src_host, what))
        data = p.comm.recv((n,), torch.uint8, src_host, what)
        return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True, map_location=p.device)


class VerifierRecompute:
    """The trusted recomputation on a verifier process (`DetectorEnv.recompute` of duplication-style detectors).

    The verifier holds a copy of the weights of every live replica of the stages on both sides of its boundaries,
    sent by the worker processes at the start of each step (after the step hooks swapped in the weights the step
    computes with: stale ones under asynchrony); the sender's input and, for a gradient, the gradient it received
    are what the verifiers relayed (`SenderInputs`), the last stage's targets come from the data. So it computes
    what `sentinel.engine.sim.TrustedRecompute` computes, at its real cost: the weights travel every step.
    """

    def __init__(self, program: DistProgram):
        self.program = program
        self.modules: dict[str, torch.nn.Module] = {}  # worker id -> its weights this step

    def stages(self) -> list[int]:
        mine = self.program.rank_map.boundaries(self.program.rt.rank)
        return sorted({s for b in mine for s in (b, b + 1)})

    def receive(self) -> None:
        """This step's weights of every live replica of my stages, from the ranks hosting them (table order)."""
        p = self.program
        for s in self.stages():
            for i in p.workers.live_in_stage(s):
                wid = p.workers.ids[i]
                module = self.modules.get(wid)
                if module is None:
                    module = self.modules[wid] = copy.deepcopy(p.templates[s])
                n = sum(t.numel() for t in module.parameters())
                flat = p.comm.recv((n,), torch.float32, p.rank_map.host[wid], f"the weights of {wid} (recomputation)")
                torch.nn.utils.vector_to_parameters(flat, module.parameters())

    def __call__(self, msg, worker: str | None = None) -> torch.Tensor | None:
        p = self.program
        inputs = p.relay.inflight(msg)
        module = self.modules.get(worker or msg.sender)
        if inputs is None or module is None or inputs.x is None:
            return None
        if msg.role == Role.ACTIVATION:
            with torch.no_grad():
                return module(inputs.x)
        with torch.enable_grad():
            x = inputs.x.detach().requires_grad_()
            out = module(x)
            if msg.boundary + 1 == p.num_stages - 1:  # the last stage: from the loss on the true targets
                out = loss_fn(out, p.channel.st.batch[msg.mb_idx, :, 1:])
            return torch.autograd.grad(out, x, grad_outputs=inputs.grad)[0]


class DistProgram(StepProgram):
    """The step program of one rank of a distributed run (see the module docstring)."""

    def __init__(self, scenario: Scenario, rt: Runtime, log: EventLog):
        p = scenario.pipeline
        self.rt = rt
        rank_map = RankMap(p.stages, p.replicas, rt.world, rt.options.verifiers)
        super().__init__(scenario, log=log, placement=RankPlacement(rank_map, rt.rank), channel=None, collective=None)
        self.rank_map = rank_map
        self.device = rt.device
        for rep in self.replicas.values():
            rep.module.to(self.device)
        self.comm = rt.comm
        self.world = rt.world
        self.published: PublishedState | None = None
        self.rank_stats: list[dict] = []  # the other ranks' figures, on the coordinator after the job
        self.comm.describe = self.rank_map.describe
        self.comm.wait_s = 0.0
        # every rank creates every stage group, in the same order (torch.distributed requires it)
        self.groups = [
            dist.new_group(ranks, timeout=rt.collective_timeout, backend=rt.dp_backend)
            for ranks in self.rank_map.stage_ranks
        ]
        # the first and the last stage's ranks exchange a tied embedding's gradient (sentinel/model/tied.py)
        tied = sorted(set(self.rank_map.stage_ranks[0] + self.rank_map.stage_ranks[-1]))
        self.tied_group = (
            dist.new_group(tied, timeout=rt.collective_timeout, backend="gloo")
            if scenario.pipeline.stages > 1 and dims(scenario).tied
            else None
        )
        self.collective = TorchCollective(self, self.groups)
        step_end = StepEnd(self.comm, self.rank_map, rt.collectives)
        self.is_verifier = self.rank_map.is_verifier(rt.rank)
        if self.is_verifier:
            self.channel = self._verifier_channel(step_end)
        else:
            self.adversary = build_adversary(scenario, self)
            if white_box_attacks(scenario) and scenario.detector.name != "none":  # verifiers publish every step
                self.published = PublishedState(scenario)
                self.adversary.attach_detector_view(self.published.view())
            faults = FaultInjector(parse_faults(rt.options.faults), [self.workers.ids[i] for i in self.replicas])
            self.channel = WorkerChannel(
                self,
                self.comm,
                self.rank_map,
                Sender(self.codecs, scenario.seed, self.adversary),
                faults,
                step_end,
                share_weights=recomputes(scenario),
            )
        self.install_hooks(clock=False)  # a distributed run measures real time instead of simulating it
        self.eval_stages = None
        self.step_s: list[float] = []  # wall seconds of each train_step (evaluation excluded)

    def train_step(self) -> float:
        t0 = time.perf_counter()
        loss = super().train_step()
        self.step_s.append(time.perf_counter() - t0)
        return loss

    def _verifier_channel(self, step_end: StepEnd) -> VerifierChannel:
        sc, rank = self.sc, self.rt.rank
        self.mesh = mesh_control(sc, self.workers)
        self.relay = Relay(self.log, self.codecs, sc.seed, self.payload_shape)
        mine = self.rank_map.boundaries(rank)
        responder = None
        self.recompute = VerifierRecompute(self) if recomputes(sc) else None
        if sc.detector.name != "none":
            self.relay.verifiers = build_verifiers(sc, self.mesh, self.recompute, self.relay.inflight, boundaries=mine)
            responder = Responder(sc.response, self.mesh, mode=sc.detector.mode)
            self.relay.responder = responder
        if rank == COORDINATOR:  # the malicious set, for scoring only: attacks run on the workers' ranks
            self.adversary = build_adversary(sc, _Shadow(self.workers))
        wants = DETECTORS.get(sc.detector.name).wants_inputs
        publish = white_box_attacks(sc) and sc.detector.name != "none"
        return VerifierChannel(
            self,
            self.comm,
            self.rank_map,
            self.relay,
            step_end,
            responder,
            self.mesh if rank == COORDINATOR else None,
            wants,
            self.recompute,
            publish,
            judged=sc.detector.name != "none",
        )

    @property
    def verifiers(self) -> dict:
        return self.relay.verifiers if self.is_verifier else {}

    def recomputed_messages(self) -> int:
        """Messages recomputed on this verifier rank (on the coordinator after the job: on every verifier rank)."""
        mine = sum(int(v.detector.checked) for v in self.verifiers.values())
        return mine + sum(int(r.get("recomputed", 0)) for r in self.rank_stats)

    # -- evaluation: the reference replicas' weights go to the coordinator ------------------------------------
    def reference(self, stage_idx: int) -> int:
        return self.workers.live_in_stage(stage_idx)[0]

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Sim's evaluation, on the coordinator, with the reference replicas' weights (each sent by its rank)."""
        rank = self.rt.rank
        if not self.is_verifier:
            ref = self.reference(self.rank_map.stage_of_rank(rank))
            if ref in self.replicas:
                flat = torch.nn.utils.parameters_to_vector(self.replicas[ref].module.parameters())
                self.comm.send(flat.detach().cpu(), COORDINATOR)
            return None
        if rank != COORDINATOR:
            return None
        if self.eval_stages is None:
            self.eval_stages = [copy.deepcopy(m).to(self.device) for m in self.templates]
        for s, module in enumerate(self.eval_stages):
            src = self.rank_map.host[self.workers.ids[self.reference(s)]]
            n = sum(p.numel() for p in module.parameters())
            flat = self.comm.recv((n,), torch.float32, src, f"the stage {s} weights for evaluation")
            torch.nn.utils.vector_to_parameters(flat.to(self.device), module.parameters())
        losses = []
        for batch in self.data.val_batches():
            batch = batch.to(self.device)
            x = batch[:, :-1]
            for m in self.eval_stages:
                x = m(x)
            losses.append(loss_fn(x, batch[:, 1:]).item())
        return float(np.mean(losses))

    def close(self) -> None:
        """End of the job: tell every peer no more frames come, and wait for this rank's sends to complete."""
        self.channel.close()
        self.comm.flush()


def recomputes(sc: Scenario) -> bool:
    """Does the scenario's detector recompute messages (and so need the senders' weights on its verifiers)?"""
    return issubclass(DETECTORS.get(sc.detector.name), Duplication)


class _Shadow:
    """The engine view `attacks.build_adversary` needs, to learn the malicious set without running attacks."""

    def __init__(self, workers: WorkerTable):
        self.workers, self.log = workers, EventLog()


__all__ = ["DistProgram", "build_defence"]
