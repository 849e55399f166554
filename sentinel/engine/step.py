"""The training step, written once. A backend supplies a channel and a placement.

One step, in named phases (every process of a run executes the same program on the workers it hosts):

    route      each microbatch picks one live replica per stage            (Router: the same plan everywhere)
    pipeline   forward / backward actions of the schedule on the hosted replicas; every boundary tensor
               leaves through `channel.send` and arrives through `channel.take`  (schedule.execute)
    respond    the step's verdicts are weighed; bans and replacements are agreed before DP sync
    dp_sync    each stage aggregates its replicas' local mean gradients    (Aggregator, over `collective`)
    update     every live hosted replica steps its own optimizer
    hooks      before_pipeline / before_update / after_update (asynchrony, sparse averaging, codecs, clock)

What differs between backends is only:

- the `Channel`: in `sim` an in-process one that runs the sender's and the verifier's halves of the transport
  back to back (`sim.LocalChannel`); on the distributed backend a `torch.distributed` one whose relay half
  runs in the verifier process of each boundary (`sentinel/distributed/`);
- the `Placement`: which workers this process hosts (sim: all of them);
- the `Collective` of the DP sync: in `sim` every replica's row is already here; on the distributed backend
  the rows of a stage are all-gathered within the stage's process group.

A microbatch whose activation or gradient is dropped by the response policy is dropped from the step:
stages that already ran its forward skip its backward, the stages after it are told it will not come
(`channel.skip`), and gradient means are taken over the microbatches that did reach each stage.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
import torch

from sentinel.data import Dataset
from sentinel.engine.aggregators import Aggregator
from sentinel.engine.asynchrony import Asynchrony, lagging
from sentinel.engine.clock import NetworkClock
from sentinel.engine.dp_compress import build_dp_compressor
from sentinel.engine.hooks import StepHook
from sentinel.engine.optim import lr_at, make_optimizer
from sentinel.engine.schedule import Action, execute, make_schedule
from sentinel.engine.sparse_avg import SparseAveraging
from sentinel.engine.workers import MeshControl, MeshEvent, Router, WorkerTable
from sentinel.eventlog import EventLog
from sentinel.model import Stage, build_stages, dims, loss_fn, model_hooks
from sentinel.registry import AGGREGATORS
from sentinel.scenario import Scenario
from sentinel.transport.codecs import build_codecs
from sentinel.transport.message import Message, Role, message_id

DROPPED = object()  # what `Channel.take` returns for a slot whose message was dropped (or never sent)


class Replica:
    """One worker: a copy of its stage's parameters, its own optimizer, and per-step scratch."""

    def __init__(self, wid: str, stage_idx: int, module: Stage, scenario: Scenario):
        self.wid, self.stage_idx, self.module = wid, stage_idx, module
        self.params = [p for p in module.parameters()]
        self.optimizer = make_optimizer(self.params, scenario.training)
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # mb -> (input, output or loss)
        self.n_backward = 0

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])

    def set_flat_grad(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n


@dataclasses.dataclass(frozen=True, slots=True)
class Provenance:
    """What the sender of a message computed it from (the trusted recomputation and `SenderInputs` read it)."""

    rep: Replica
    x: torch.Tensor  # the input the sender received (token ids on stage 0), detached
    grad_in: torch.Tensor | None  # backward: the gradient the sender received (None on the last stage)
    targets: torch.Tensor | None  # backward on the last stage: the true next-token targets


class StepState:
    """One step: its batch, its routing plan (M, S) worker indices, what was skipped, losses, action times."""

    def __init__(self, step: int, batch: torch.Tensor | Callable[[], torch.Tensor] | None, plan: np.ndarray):
        self.step, self.plan = step, plan
        self._batch = batch  # or how to make it: a process that never reads the batch never samples it
        self.skipped: set[tuple[int, int]] = set()  # (stage, mb) whose forward had no input
        self.losses: list[float] = []
        self.reported_loss: float | None = None  # the step's mean loss when another process computed it
        self.action_s: dict[Action, float] = {}  # measured wall seconds per action (network clock)

    @property
    def batch(self) -> torch.Tensor | None:
        if callable(self._batch):
            self._batch = self._batch()
        return self._batch


class Channel(Protocol):
    """How boundary tensors travel between the processes of a backend (see the module docstring)."""

    def begin_step(self, program: StepProgram, st: StepState) -> None: ...

    def send(self, msg: Message, prov: Provenance) -> None: ...

    def skip(self, role: Role, boundary: int, mb: int, step: int) -> None: ...

    def ready(self, role: Role, stage: int, mb: int) -> bool: ...

    def take(self, role: Role, stage: int, mb: int) -> object: ...

    def end_step(self, st: StepState) -> list[MeshEvent]: ...


class Placement(Protocol):
    """Which workers this process hosts, and where a worker added later lives."""

    def hosts(self, wid: str) -> bool: ...

    def stages(self) -> Iterable[int]: ...

    def place(self, wid: str, stage_idx: int, workers: WorkerTable) -> None: ...


class Collective(Protocol):
    """The DP sync's communication: every contributing replica's row of one stage, in worker-table order."""

    def gather(
        self, stage_idx: int, rows: list[tuple[int, int, torch.Tensor]], numel: int
    ) -> list[tuple[int, int, torch.Tensor]]: ...

    def copy_replica(self, src: int, dst: int, stage_idx: int) -> dict | None: ...

    def share(self, key: str, mine: dict) -> dict: ...


class StepProgram:
    """The training loop of one process: the step (see module docstring), evaluation, checkpoints."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        log: EventLog,
        placement: Placement,
        channel: Channel,
        collective: Collective,
        workers: WorkerTable | None = None,
        adversary=None,
    ):
        p = scenario.pipeline
        self.sc, self.log, self.placement, self.channel, self.collective = scenario, log, placement, channel, collective
        self.data = Dataset(scenario)
        self.vocab = dims(scenario).vocab
        self.num_stages, self.num_microbatches = p.stages, p.microbatches
        self.workers = workers if workers is not None else WorkerTable(p.stages, p.replicas)
        for wid in self.workers.ids:
            self.log.worker_index(wid)  # stable integer ids: workers first, in mesh order
        self.router = Router(p.routing, scenario.seed, self.workers)
        self.schedule = make_schedule(p.schedule, p.stages, p.microbatches)
        self.local_schedule = [acts if s in set(placement.stages()) else [] for s, acts in enumerate(self.schedule)]
        agg = scenario.dp.aggregator
        self.aggregator: Aggregator = AGGREGATORS.get(agg.name)(agg.config)
        self.codecs = build_codecs(scenario.transport)  # one instance per role, shared by both transport halves
        self.adversary = adversary
        self.payload_shape = payload_shape(scenario)
        self.device = torch.device("cpu")  # where replicas compute (the distributed backend may use a GPU)
        self.templates = build_stages(scenario.model, self.vocab, p.stages, scenario.seed)
        self.replicas: dict[int, Replica] = {
            i: Replica(wid, s, copy.deepcopy(self.templates[s]), scenario)
            for i, (wid, s) in enumerate(zip(self.workers.ids, self.workers.stage))
            if placement.hosts(wid)
        }
        self.dp_compressor = build_dp_compressor(scenario)  # None unless dp.compression is set
        self.relay = None  # the verifier half of the transport, on a process that hosts verifiers
        self.rank_map = None  # where workers live, on the distributed backend
        self.world = 1  # processes in the run
        self.step = 0
        self.hooks: list[StepHook] = []

    def install_hooks(self, clock: bool = True) -> None:
        """The hooks this scenario needs, attached, in the order their `after_update` must run: the model's (tied
        embeddings), codecs, sparse averaging, asynchrony, the network clock (`clock=False`: a backend that measures real time instead)."""
        sc, hooks = self.sc, model_hooks(self.sc)  # tied embeddings: gradients summed right after DP sync
        for codec in {id(c): c for c in self.codecs.values()}.values():
            if isinstance(codec, StepHook):
                hooks.append(codec)
        if sc.dp.sync == "sparse_avg":
            hooks.append(SparseAveraging(sc.dp.sparse_avg))
        if sc.transport.async_.max_staleness > 0:
            hooks.append(Asynchrony(sc.transport.async_, sc))
        if sc.transport.network.enabled and clock:
            hooks.append(NetworkClock(sc))
        self.hooks = hooks
        for h in hooks:
            h.attach(self)

    # -- one step --------------------------------------------------------------------------------
    def train_step(self) -> float:
        """Run one optimizer step; returns the mean training loss over this process's completed microbatches."""
        step = self.step
        st = StepState(step, lambda: self.data.train_batch(step), self.router.route(step, self.num_microbatches))
        for h in self.hooks:
            h.before_pipeline(self, st)
        self.channel.begin_step(self, st)  # a verifier process relays the whole step here
        mine = [[a for a in acts if int(st.plan[a.mb, a.stage]) in self.replicas] for acts in self.local_schedule]
        execute(mine, lambda a: self._ready(st, a), lambda a: self._run(st, a))
        added = self.apply_events(self.channel.end_step(st))  # bans and additions, agreed before DP sync
        stepped = self._dp_sync(step)
        for h in self.hooks:
            h.before_update(self, st)
        self._update(step, stepped)
        for h in self.hooks:
            h.after_update(self, st)
        for ev in added:  # an added worker joins with its stage's state after this step's update
            self._add_replica(ev.worker, ev.stage, ev.rejoin_of)
        self.step += 1
        if st.reported_loss is not None:
            return st.reported_loss
        return float(np.mean(st.losses)) if st.losses else float("nan")

    def _ready(self, st: StepState, a: Action) -> bool:
        if a.kind == "F":
            return a.stage == 0 or self.channel.ready(Role.ACTIVATION, a.stage, a.mb)
        last = a.stage == self.num_stages - 1
        return last or (a.stage, a.mb) in st.skipped or self.channel.ready(Role.GRADIENT, a.stage, a.mb)

    def _run(self, st: StepState, a: Action) -> None:
        t0 = time.perf_counter()
        (self._forward if a.kind == "F" else self._backward)(st, a.stage, a.mb)
        st.action_s[a] = time.perf_counter() - t0

    def message(
        self, st: StepState, mb: int, boundary: int, role: Role, sender: str, receiver: str, payload: torch.Tensor
    ) -> Message:
        mid = message_id(st.step, mb, boundary, role, self.num_microbatches, self.num_stages)
        return Message(st.step, mb, boundary, role, sender, receiver, payload, msg_id=mid)

    def _forward(self, st: StepState, s: int, mb: int) -> None:
        last = s == self.num_stages - 1
        got = self.channel.take(Role.ACTIVATION, s, mb) if s > 0 else None
        if got is DROPPED:  # its input was dropped upstream: nothing to compute, the next stage is told
            st.skipped.add((s, mb))
            if not last:
                self.channel.skip(Role.ACTIVATION, s, mb, st.step)
            return
        rep = self.replicas[int(st.plan[mb, s])]
        x = st.batch[mb, :, :-1] if s == 0 else got.detach().requires_grad_()  # B, T(, C)
        out = rep.module(x)
        if last:
            targets = st.batch[mb, :, 1:]
            corrupt = getattr(self.adversary, "corrupt_targets", None)  # target_corruption (attacks/)
            if corrupt is not None:
                targets = corrupt(st.step, mb, rep.wid, targets)
            loss = loss_fn(out, targets)
            rep.saved[mb] = (x, loss)
            st.losses.append(loss.item())
            self.log.log_loss(st.step, mb, st.losses[-1])
            return
        rep.saved[mb] = (x, out)
        receiver = self.workers.ids[int(st.plan[mb, s + 1])]
        msg = self.message(st, mb, s, Role.ACTIVATION, rep.wid, receiver, out)
        self.channel.send(msg, Provenance(rep, x.detach(), None, None))

    def _backward(self, st: StepState, s: int, mb: int) -> None:
        if (s, mb) in st.skipped:
            return
        rep = self.replicas[int(st.plan[mb, s])]
        x, out = rep.saved.pop(mb)
        g = None
        if s == self.num_stages - 1:
            out.backward()
        else:
            g = self.channel.take(Role.GRADIENT, s, mb)
            if g is DROPPED:  # no gradient comes for this microbatch: the previous stage is told
                if s > 0:
                    self.channel.skip(Role.GRADIENT, s - 1, mb, st.step)
                return
            out.backward(g)
        rep.n_backward += 1
        if s == 0:
            return
        receiver = self.workers.ids[int(st.plan[mb, s - 1])]
        msg = self.message(st, mb, s - 1, Role.GRADIENT, rep.wid, receiver, x.grad)
        targets = st.batch[mb, :, 1:] if g is None else None
        self.channel.send(msg, Provenance(rep, x.detach(), g, targets))

    # -- the defence's decisions: bans and additions (agreed on by every process) ---------------------
    def apply_events(self, events: list[MeshEvent]) -> list[MeshEvent]:
        """Bans and additions in the worker table and the EventLog; returns the additions, whose replicas are built
        after the step's update (`_add_replica`). Every process applies the same events in the same order."""
        added = []
        for ev in events:
            if ev.kind == "ban":
                if self.workers.live[self.workers.index(ev.worker)]:
                    self.workers.ban(ev.worker)
                self.log.log_ban(ev.step, ev.worker, ev.replaced_by, ev.by)
                continue
            if ev.worker not in self.workers.ids:  # the process that decided it has it in its table already
                self.workers.add_replacement(ev.stage)
            assert ev.worker in self.workers.ids, f"mesh event {ev} out of order"
            self.log.worker_index(ev.worker)
            self.placement.place(ev.worker, ev.stage, self.workers)
            added.append(ev)
        return added

    def _add_replica(self, wid: str, stage_idx: int, rejoin_of: str | None) -> None:
        """The added worker starts from the weights and optimizer state of its stage's first live replica, after the
        step's update (so it is in sync with its stage); it is routed from the next step on. With `rejoin_of`,
        the adversary layer (if it has `rejoin(old, new)`) decides whether it controls the newcomer (Sybil)."""
        rejoin = getattr(self.adversary, "rejoin", None)
        if rejoin_of is not None and rejoin is not None:
            rejoin(rejoin_of, wid)
        live = [i for i in self.workers.live_in_stage(stage_idx) if self.workers.ids[i] != wid]
        src = live[0] if live else self.workers.stage.index(stage_idx)
        dst = self.workers.index(wid)
        state = self.collective.copy_replica(src, dst, stage_idx)  # None: this process hosts neither
        if state is None:
            return
        rep = Replica(wid, stage_idx, copy.deepcopy(self.templates[stage_idx]), self.sc)
        rep.module.load_state_dict(state["module"])
        rep.optimizer.load_state_dict(state["optimizer"])
        self.replicas[dst] = rep

    # -- DP sync and update ----------------------------------------------------------------------
    def _dp_sync(self, step: int) -> dict[int, bool]:
        """Aggregate each hosted stage's replica gradients; returns, per hosted stage, whether it has a gradient."""
        stepped = {}
        sync = self.sc.dp.sync
        for s in self.placement.stages():
            live = [i for i in self.workers.live_in_stage(s)]
            mine = [i for i in live if i in self.replicas and self.replicas[i].n_backward > 0]
            if sync in ("none", "sparse_avg"):  # local steps (sparse_avg averages weights later)
                for i in mine:
                    r = self.replicas[i]
                    for p in r.params:
                        if p.grad is not None:
                            p.grad.div_(r.n_backward)
                stepped[s] = bool(mine)
                continue
            rows = self._rows(step, s, mine, len(live))
            rows = self.collective.gather(s, rows, sum(p.numel() for p in self.templates[s].parameters()))
            stepped[s] = bool(rows)
            if not rows:
                continue
            vecs = torch.stack([v for _, _, v in rows])
            weights = torch.tensor([n for _, n, _ in rows], dtype=torch.float64)
            agg = self.aggregator(vecs, weights)
            for i in live:
                if i in self.replicas:
                    self.replicas[i].set_flat_grad(agg)
        return stepped

    def _rows(self, step: int, s: int, mine: list[int], num_live: int) -> list[tuple[int, int, torch.Tensor]]:
        """(table index, microbatches, contribution) of this process's contributing replicas of stage s."""
        rows = []
        if self.dp_compressor is not None and num_live < 2:
            self.dp_compressor.step_bytes[s] = 0  # a stage of one replica: nothing travels
        for i in mine:
            r = self.replicas[i]
            vec = r.flat_grad() / r.n_backward
            if self.adversary is not None:
                vec = self.adversary.dp_contribution(step, s, r.wid, vec.cpu()).to(vec.device)
            if self.dp_compressor is not None and num_live > 1:  # compressed all-reduce, per-replica error feedback
                vec = self.dp_compressor.compress(step, s, r.wid, vec, [p.shape for p in r.params])
            rows.append((i, r.n_backward, vec))
        return rows

    def _update(self, step: int, stepped: dict[int, bool]) -> None:
        lr = lr_at(step, self.sc.training)
        for i, r in self.replicas.items():
            if self.workers.live[i] and stepped.get(r.stage_idx) and (self.sc.dp.sync == "allreduce" or r.n_backward):
                for g in r.optimizer.param_groups:
                    g["lr"] = lr
                r.optimizer.step()
            r.optimizer.zero_grad(set_to_none=True)
            r.n_backward = 0
            r.saved.clear()

    # -- the loop ---------------------------------------------------------------------------------
    def evaluate(self) -> float | None:
        """Mean validation loss (the backend decides who computes it; None on processes that do not)."""
        raise NotImplementedError

    def eval_due(self, step: int) -> bool:
        t = self.sc.training
        return step % t.eval_every == 0 or step == t.steps

    def run(
        self,
        on_step: Callable[[int, float, float | None], None] | None = None,
        on_checkpoint: Callable[[StepProgram], None] | None = None,
    ) -> dict[str, float]:
        """Train until `training.steps` with periodic evaluation; returns headline numbers.

        A resumed program (its `step` > 0) continues where its checkpoint left off."""
        t = self.sc.training
        if self.step == 0:
            initial = self.evaluate()
            if initial is not None:
                self.log.log_eval(0, initial)
        else:  # resumed: the evaluation at step 0 is in the restored log (on the process that evaluates)
            evals = self.log.evals
            initial = float(evals["val_loss"][0]) if len(evals) else None
        t0 = time.perf_counter()
        val = None
        while self.step < t.steps:
            loss = self.train_step()
            val = None
            if self.eval_due(self.step):
                val = self.evaluate()
                if val is not None:
                    self.log.log_eval(self.step, val)
            if on_step is not None:
                on_step(self.step, loss, val)
            if on_checkpoint is not None:
                on_checkpoint(self)
        if val is None and len(self.log.evals):
            val = float(self.log.evals["val_loss"][-1])
        return {"initial_val_loss": initial, "final_val_loss": val, "train_wall_s": time.perf_counter() - t0}


def payload_shape(scenario: Scenario) -> tuple[int, int, int]:
    """The shape of every honest boundary tensor: (batch_size, seq_len, hidden)."""
    return (scenario.data.batch_size, scenario.model.seq_len, dims(scenario).hidden)


def mesh_control(scenario: Scenario, workers: WorkerTable) -> MeshControl:
    """The response policy's view of `workers`, with the cohorts its peer comparisons keep to (`MeshControl.cohort`):
    public facts of the scenario (its DP sync, its async stragglers), the same on every backend."""
    return MeshControl(workers, lagging(scenario, workers), exchangeable=scenario.dp.sync == "allreduce")
