"""The `sim` backend: S stages x R replicas in one process, deterministic.

One training step, in named phases:

    route      each microbatch picks one live replica per stage            (Router)
    pipeline   forward / backward actions of the schedule; every boundary
               tensor is a Message through the Transport                   (schedule.execute)
    dp_sync    each stage aggregates its replicas' local mean gradients    (Aggregator)
    update     every live replica steps its own optimizer

A microbatch whose activation or gradient is dropped by the response policy is dropped from the
step: stages that already ran its forward skip its backward, and gradient means are taken over the
microbatches that did reach each stage.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch

from sentinel.data import Dataset
from sentinel.engine.aggregators import Aggregator
from sentinel.engine.dp_compress import build_dp_compressor
from sentinel.engine.hooks import build_hooks
from sentinel.engine.optim import lr_at, make_optimizer
from sentinel.engine.schedule import Action, execute, make_schedule
from sentinel.engine.workers import Router, WorkerTable
from sentinel.eventlog import EventLog
from sentinel.model import Stage, build_stages, dims, global_parameters, loss_fn
from sentinel.registry import AGGREGATORS
from sentinel.scenario import Scenario
from sentinel.transport import Interceptor, Message, Responder, Role, Transport, Verifier
from sentinel.transport.codecs import build_codecs

DROPPED = object()  # marks an inbox slot whose message the response policy dropped


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


class _StepState:
    """Inboxes of one step: delivered activations / gradients keyed by (stage, mb)."""

    def __init__(self, step: int, batch: torch.Tensor, plan: np.ndarray):
        self.step, self.batch, self.plan = step, batch, plan
        self.act_in: dict[tuple[int, int], object] = {}
        self.grad_in: dict[tuple[int, int], object] = {}
        self.skipped: set[tuple[int, int]] = set()
        self.losses: list[float] = []
        self.action_s: dict[Action, float] = {}  # measured wall seconds per action (network clock)


@dataclasses.dataclass(frozen=True, slots=True)
class _Provenance:
    """What the sender of the message in flight computed it from (read by `SimEngine.recompute`)."""

    msg: Message
    rep: Replica
    x: torch.Tensor  # the input the sender received (token ids on stage 0)
    grad_in: torch.Tensor | None  # backward: the gradient the sender received (None on the last stage)
    targets: torch.Tensor | None  # backward on the last stage: the true next-token targets


class SimEngine:
    """Runs one scenario in one process. Plug-ins (adversary, verifier, responder) are optional."""

    def __init__(
        self,
        scenario: Scenario,
        log: EventLog | None = None,
        adversary: Interceptor | None = None,
        verifier: Verifier | None = None,
        responder: Responder | None = None,
    ):
        self.sc = scenario
        self.log = log if log is not None else EventLog()
        self.data = Dataset(scenario)
        self.vocab = dims(scenario).vocab
        p = scenario.pipeline
        self.num_stages, self.num_microbatches = p.stages, p.microbatches
        self.workers = WorkerTable(p.stages, p.replicas)
        for wid in self.workers.ids:
            self.log.worker_index(wid)  # stable integer ids: workers first, in mesh order
        stages = build_stages(scenario.model, self.vocab, p.stages, scenario.seed)
        self.replicas: list[Replica] = [
            Replica(wid, s, copy.deepcopy(stages[s]), scenario)
            for wid, s in zip(self.workers.ids, self.workers.stage)
        ]
        self.router = Router(p.routing, scenario.seed, self.workers)
        self.schedule = make_schedule(p.schedule, p.stages, p.microbatches)
        agg = scenario.dp.aggregator
        self.aggregator: Aggregator = AGGREGATORS.get(agg.name)(agg.config)
        self.transport = Transport(
            self.log, build_codecs(scenario.transport), scenario.seed,  # codec per role (transport.codec)
            adversary=adversary, verifier=verifier, responder=responder,
        )
        self.step = 0
        self._sending: _Provenance | None = None
        self.dp_compressor = build_dp_compressor(scenario)  # None unless dp.compression is set
        self.hooks = build_hooks(scenario, self)  # codecs, sparse averaging, asynchrony, network clock

    # -- one step --------------------------------------------------------------------------------
    def train_step(self) -> float:
        """Run one optimizer step; returns the mean training loss over completed microbatches."""
        step = self.step
        st = _StepState(step, self.data.train_batch(step), self.router.route(step, self.num_microbatches))
        for h in self.hooks:
            h.before_pipeline(self, st)
        execute(self.schedule, lambda a: self._ready(st, a), lambda a: self._run(st, a))
        stepped = self._dp_sync(step)
        for h in self.hooks:
            h.before_update(self, st)
        self._update(step, stepped)
        for h in self.hooks:
            h.after_update(self, st)
        self.step += 1
        return float(np.mean(st.losses)) if st.losses else float("nan")

    def _ready(self, st: _StepState, a: Action) -> bool:
        if a.kind == "F":
            return a.stage == 0 or (a.stage, a.mb) in st.act_in
        return a.stage == self.num_stages - 1 or (a.stage, a.mb) in st.grad_in or (a.stage, a.mb) in st.skipped

    def _run(self, st: _StepState, a: Action) -> None:
        t0 = time.perf_counter()
        (self._forward if a.kind == "F" else self._backward)(st, a.stage, a.mb)
        st.action_s[a] = time.perf_counter() - t0

    def _forward(self, st: _StepState, s: int, mb: int) -> None:
        last = s == self.num_stages - 1
        if s > 0 and st.act_in[(s, mb)] is DROPPED:
            st.skipped.add((s, mb))
            if not last:
                st.act_in[(s + 1, mb)] = DROPPED
            return
        rep = self.replicas[st.plan[mb, s]]
        x = st.batch[mb, :, :-1] if s == 0 else st.act_in.pop((s, mb)).detach().requires_grad_()  # B, T(, C)
        out = rep.module(x)
        if last:
            targets = st.batch[mb, :, 1:]
            corrupt = getattr(self.transport.adversary, "corrupt_targets", None)  # target_corruption (attacks/)
            if corrupt is not None:
                targets = corrupt(st.step, mb, rep.wid, targets)
            loss = loss_fn(out, targets)
            rep.saved[mb] = (x, loss)
            st.losses.append(loss.item())
            self.log.log_loss(st.step, mb, st.losses[-1])
            return
        rep.saved[mb] = (x, out)
        receiver = self.workers.ids[st.plan[mb, s + 1]]
        msg = Message(st.step, mb, s, Role.ACTIVATION, rep.wid, receiver, out)
        self._sending = _Provenance(msg, rep, x.detach(), None, None)  # for the trusted recompute hook
        delivered = self.transport.send(msg)
        if delivered is None:
            st.act_in[(s + 1, mb)] = DROPPED
            st.grad_in[(s, mb)] = DROPPED  # no backward will come for this microbatch
        else:
            st.act_in[(s + 1, mb)] = delivered

    def _backward(self, st: _StepState, s: int, mb: int) -> None:
        if (s, mb) in st.skipped:
            return
        rep = self.replicas[st.plan[mb, s]]
        x, out = rep.saved.pop(mb)
        g = None
        if s == self.num_stages - 1:
            out.backward()
        else:
            g = st.grad_in.pop((s, mb))
            if g is DROPPED:
                if s > 0:
                    st.grad_in[(s - 1, mb)] = DROPPED
                return
            out.backward(g)
        rep.n_backward += 1
        if s == 0:
            return
        sender_to = self.workers.ids[st.plan[mb, s - 1]]
        msg = Message(st.step, mb, s - 1, Role.GRADIENT, rep.wid, sender_to, x.grad)
        targets = st.batch[mb, :, 1:] if g is None else None
        self._sending = _Provenance(msg, rep, x.detach(), g, targets)  # for the trusted recompute hook
        delivered = self.transport.send(msg)
        st.grad_in[(s - 1, mb)] = DROPPED if delivered is None else delivered

    def _dp_sync(self, step: int) -> list[bool]:
        """Aggregate each stage's replica gradients; returns which stages have a gradient to apply."""
        stepped = []
        for s in range(self.num_stages):
            live = [self.replicas[i] for i in self.workers.live_in_stage(s)]
            contrib = [r for r in live if r.n_backward > 0]
            stepped.append(bool(contrib))
            if not contrib:
                continue
            if self.sc.dp.sync in ("none", "sparse_avg"):  # local steps (sparse_avg averages weights later)
                for r in contrib:
                    for p in r.params:
                        if p.grad is not None:
                            p.grad.div_(r.n_backward)
                continue
            vecs = torch.stack(
                [self.transport.dp_contribution(step, s, r.wid, r.flat_grad() / r.n_backward) for r in contrib]
            )
            if self.dp_compressor is not None:  # compressed all-reduce, with per-replica error feedback
                vecs = self.dp_compressor(step, s, [r.wid for r in contrib], vecs, [p.shape for p in contrib[0].params])
            weights = torch.tensor([r.n_backward for r in contrib], dtype=torch.float64)
            agg = self.aggregator(vecs, weights)
            for r in live:
                r.set_flat_grad(agg)
        return stepped

    def _update(self, step: int, stepped: list[bool]) -> None:
        lr = lr_at(step, self.sc.training)
        for i in range(len(self.replicas)):
            r = self.replicas[i]
            if self.workers.live[i] and stepped[r.stage_idx] and (self.sc.dp.sync == "allreduce" or r.n_backward):
                for g in r.optimizer.param_groups:
                    g["lr"] = lr
                r.optimizer.step()
            r.optimizer.zero_grad(set_to_none=True)
            r.n_backward = 0
            r.saved.clear()

    # -- hooks for the defence (sentinel/detectors, sentinel/response.py) ---------------------------
    def add_replica(self, stage_idx: int, rejoin_of: str | None = None) -> str:
        """Add a replica to a stage (a replacement, or a rejoining worker) and return its new id.

        It copies the weights and optimizer state of the stage's first live replica, so it is in sync
        under synchronous DP; it is routed from the next step on. With `rejoin_of`, the adversary layer
        (if it has a `rejoin(old, new)` method) decides whether it controls the newcomer (Sybil).
        """
        live = self.workers.live_in_stage(stage_idx)
        src = self.replicas[live[0]] if live else self.replicas[self.workers.stage.index(stage_idx)]
        idx = self.workers.add_replacement(stage_idx)
        wid = self.workers.ids[idx]
        rep = Replica(wid, stage_idx, copy.deepcopy(src.module), self.sc)
        rep.optimizer.load_state_dict(copy.deepcopy(src.optimizer.state_dict()))
        self.replicas.append(rep)
        assert len(self.replicas) == len(self.workers.ids)
        self.log.worker_index(wid)
        rejoin = getattr(self.transport.adversary, "rejoin", None)
        if rejoin_of is not None and rejoin is not None:
            rejoin(rejoin_of, wid)
        return wid

    def recompute(self, msg: Message, worker: str | None = None) -> torch.Tensor | None:
        """Trusted recomputation hook (duplication-style detectors): the honest value of `msg`.

        Recomputes the message in flight from the very input its sender received, with the sender's
        stage module (or with replica `worker` of the same stage: cross-replica checks). Forward: one
        stage forward. Backward: one stage forward + backward from the gradient the sender received
        (on the last stage, from the loss on the true targets). Weights are honest in this testbed
        (attacks corrupt messages, not parameters), so this is what a trusted party would compute.
        Returns None for any message other than the one in flight. Costs one extra stage computation.
        """
        prov = self._sending
        key = (msg.step, msg.mb_idx, msg.boundary, msg.role)
        if prov is None or (prov.msg.step, prov.msg.mb_idx, prov.msg.boundary, prov.msg.role) != key:
            return None
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

    # -- evaluation -------------------------------------------------------------------------------
    def reference_modules(self) -> list[Stage]:
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

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, on_step: Callable[[int, float, float | None], None] | None = None) -> dict[str, float]:
        """Train for `training.steps` steps with periodic evaluation; returns headline numbers."""
        t = self.sc.training
        initial = self.evaluate()
        self.log.log_eval(0, initial)
        t0 = time.perf_counter()
        val = None
        while self.step < t.steps:
            loss = self.train_step()
            val = None
            if self.step % t.eval_every == 0 or self.step == t.steps:
                val = self.evaluate()
                self.log.log_eval(self.step, val)
            if on_step is not None:
                on_step(self.step, loss, val)
        final = val if val is not None else self.evaluate()
        return {"initial_val_loss": initial, "final_val_loss": final, "train_wall_s": time.perf_counter() - t0}

    def parameters(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor of the reference replicas, with names independent of the stage split."""
        return global_parameters(self.reference_modules())
