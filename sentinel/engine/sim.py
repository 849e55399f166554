"""The `sim` backend: the step program (step.py) with every worker and every verifier in one process.

`LocalChannel` runs both halves of the transport back to back: the sender's (adversary, codec) and the
relay of the message's boundary (decode, EventLog, verifier, response), then fills the receiver's inbox.
There is one verifier per boundary, exactly as on the distributed backend (one verifier process per
boundary), so both backends judge every message with the same state.

Cascade suppression (a message downstream of a flag in its microbatch is paused: neither judged nor learned
from, and its honest sender not blamed) is `taint` here; the distributed backend passes the same fact
between neighbouring verifier processes. Messages are handled in causal order within a microbatch, so the
two agree.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from sentinel.engine.step import DROPPED, Provenance, StepProgram, StepState, mesh_control, payload_shape
from sentinel.engine.workers import MeshControl, MeshEvent, WorkerTable
from sentinel.eventlog import EventLog
from sentinel.model import global_parameters, loss_fn
from sentinel.scenario import Scenario
from sentinel.transport.message import Message, Role
from sentinel.transport.relay import Relay, Sender, SenderInputs, route_origin


class AllLocal:
    """sim's placement: this process hosts every worker of every stage."""

    def __init__(self, num_stages: int):
        self.num_stages = num_stages

    def hosts(self, wid: str) -> bool:
        return True

    def stages(self) -> range:
        return range(self.num_stages)

    def place(self, wid: str, stage_idx: int, workers: WorkerTable) -> None:
        pass


class LocalCollective:
    """sim's DP sync: every row is already here; a new replica copies its source's state in memory."""

    def __init__(self) -> None:
        self.program: StepProgram | None = None

    def gather(self, stage_idx: int, rows: list, numel: int) -> list:
        return rows

    def share(self, key: str, mine: dict) -> dict:
        """What the processes of a step hook's exchange contribute, merged: here, this process's alone."""
        return mine

    def copy_replica(self, src: int, dst: int, stage_idx: int) -> dict:
        rep = self.program.replicas[src]
        return {
            "module": copy.deepcopy(rep.module.state_dict()),
            "optimizer": copy.deepcopy(rep.optimizer.state_dict()),
        }


class TrustedRecompute:
    """The trusted recomputation hook of duplication-style detectors (`DetectorEnv.recompute`).

    It holds the replicas (weights, no ground truth) and the provenance of the message in flight, which the
    channel sets before each message is judged; nothing else of the engine is reachable from it.
    """

    def __init__(self, replicas: dict, workers: WorkerTable):
        self.replicas, self.workers = replicas, workers
        self.current: tuple[tuple, Provenance] | None = None

    def __call__(self, msg: Message, worker: str | None = None) -> torch.Tensor | None:
        """The honest value of `msg`: recomputed from the very input its sender received.

        With the sender's stage module (or with replica `worker` of the same stage: cross-replica checks).
        Forward: one stage forward. Backward: one stage forward + backward from the gradient the sender
        received (on the last stage, from the loss on the true targets). Weights are honest in this testbed
        (attacks corrupt messages, not parameters), so this is what a trusted party would compute.
        Returns None for any message other than the one in flight. Costs one extra stage computation.
        """
        if self.current is None or self.current[0] != (msg.step, msg.mb_idx, msg.boundary, int(msg.role)):
            return None
        prov = self.current[1]
        rep = prov.rep if worker is None else self.replicas[self.workers.index(worker)]
        if msg.role == Role.ACTIVATION:
            with torch.no_grad():
                return rep.module(prov.x)
        with torch.enable_grad():
            x = prov.x.detach().requires_grad_()
            out = rep.module(x)
            if prov.targets is not None:
                out = loss_fn(out, prov.targets)
            return torch.autograd.grad(out, x, grad_outputs=prov.grad_in)[0]


class LocalChannel:
    """Both halves of the transport in this process, and the receivers' inboxes (see module docstring)."""

    def __init__(self, sender: Sender, relay: Relay, recompute: TrustedRecompute, mesh: MeshControl):
        self.sender, self.relay, self.recompute, self.mesh = sender, relay, recompute, mesh
        self.inbox: dict[tuple[int, int, int], object] = {}  # (role, receiving stage, mb) -> tensor or DROPPED
        self.taint: set[int] = set()  # microbatches flagged this step
        self._step = -1

    def begin_step(self, program: StepProgram, st: StepState) -> None:
        self.inbox, self.taint, self._step = {}, set(), st.step
        self._plan, self._ids = st.plan, program.workers.ids

    def send(self, msg: Message, prov: Provenance) -> None:
        key = (msg.step, msg.mb_idx, msg.boundary, int(msg.role))
        self.recompute.current = (key, prov)  # for the trusted recompute hook
        sent, wire = self.sender.encode(msg)
        inputs = SenderInputs(key, prov.x, prov.grad_in, route_origin(self._plan, self._ids, *key[1:3], msg.role))
        got = self.relay.carry(sent, wire, paused=msg.mb_idx in self.taint, inputs=inputs)
        self.recompute.current = None
        if got.flagged:
            self.taint.add(msg.mb_idx)
        delivered = DROPPED if got.payload is None else got.payload
        if msg.role == Role.ACTIVATION:
            self.inbox[(Role.ACTIVATION, msg.boundary + 1, msg.mb_idx)] = delivered
            if got.payload is None:
                self.inbox[(Role.GRADIENT, msg.boundary, msg.mb_idx)] = DROPPED  # no backward will come
        else:
            self.inbox[(Role.GRADIENT, msg.boundary, msg.mb_idx)] = delivered

    def skip(self, role: Role, boundary: int, mb: int, step: int) -> None:
        stage = boundary + 1 if role == Role.ACTIVATION else boundary
        self.inbox[(role, stage, mb)] = DROPPED

    def ready(self, role: Role, stage: int, mb: int) -> bool:
        return (role, stage, mb) in self.inbox

    def take(self, role: Role, stage: int, mb: int) -> object:
        return self.inbox.pop((role, stage, mb))

    def end_step(self, st: StepState) -> list[MeshEvent]:
        self.relay.end_step(st.step)
        return self.mesh.drain()


class SimEngine(StepProgram):
    """Runs one scenario in one process. Plug-ins (adversary, verifiers, responder) are optional.

    `verifier` may be one object for every boundary, or a dict boundary -> verifier (what `build_defence`
    returns: one per boundary, as the distributed backend has one per verifier process).
    """

    def __init__(self, scenario: Scenario, log: EventLog | None = None, adversary=None, verifier=None, responder=None):
        log = log if log is not None else EventLog()
        collective = LocalCollective()
        super().__init__(
            scenario,
            log=log,
            placement=AllLocal(scenario.pipeline.stages),
            channel=None,
            collective=collective,
            adversary=adversary,
        )
        collective.program = self
        self.mesh = mesh_control(scenario, self.workers)  # the response policy's view: bans and additions become events
        self.recompute = TrustedRecompute(self.replicas, self.workers)
        self.relay = Relay(self.log, self.codecs, scenario.seed, payload_shape(scenario))
        self.channel = LocalChannel(
            Sender(self.codecs, scenario.seed, adversary), self.relay, self.recompute, self.mesh
        )
        self.install_defence(verifier, responder)
        self.install_hooks()

    def install_defence(self, verifier, responder) -> None:
        """Verifiers (one object for every boundary, or a dict boundary -> verifier) and the response policy."""
        if verifier is not None and not isinstance(verifier, dict):
            verifier = {b: verifier for b in range(self.num_stages - 1)}
        self.relay.verifiers = dict(verifier or {})
        self.relay.responder = responder

    def set_adversary(self, adversary) -> None:
        self.adversary = adversary
        self.channel.sender.adversary = adversary

    @property
    def verifiers(self) -> dict:
        return self.relay.verifiers

    @property
    def responder(self):
        return self.relay.responder

    def recomputed_messages(self) -> int:
        """Messages a duplication-style detector recomputed (its `checked` count), over every boundary."""
        return sum(int(v.detector.checked) for v in self.relay.verifiers.values())

    @property
    def bytes_sent(self) -> int:
        return self.relay.bytes_sent

    @property
    def verifier_s(self) -> float:
        return self.relay.verifier_s

    # -- evaluation -------------------------------------------------------------------------------
    def reference_modules(self) -> list:
        """First live replica of each stage (all replicas agree under synchronous DP)."""
        return [self.replicas[self.workers.live_in_stage(s)[0]].module for s in range(self.num_stages)]

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss through the reference replicas (a measurement: not boundary traffic)."""
        mods = self.reference_modules()
        losses = []
        for batch in self.data.val_batches():
            x = batch[:, :-1]
            for m in mods:
                x = m(x)
            losses.append(loss_fn(x, batch[:, 1:]).item())
        return float(np.mean(losses))

    def parameters(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor of the reference replicas, with names independent of the stage split."""
        return global_parameters(self.reference_modules())
