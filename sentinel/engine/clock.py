"""The simulated clock as an engine hook, and the same model for pipelines that were never trained.

`NetworkClock.after_update` turns what the engine did in a step (the schedule, the routing plan, the
EventLog's message rows with their exact wire bytes, the DP-sync bytes) into simulated seconds with
`network.simulate_step`; `network_report(engine)` gives the figures for summary.json.
`pipeline_throughput(...)` runs the identical event simulation for a pipeline described only by its
shape (stages, microbatches, message bytes, compute seconds) -- how the throughput of a paper-scale
model is explained without training it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sentinel.engine.asynchrony import Asynchrony
from sentinel.engine.hooks import StepHook, find_hook
from sentinel.engine.schedule import Action, make_schedule
from sentinel.engine.sparse_avg import SparseAveraging
from sentinel.transport.message import Role
from sentinel.transport.network import Network, _Links, simulate_step, stage_flops, stragglers

if TYPE_CHECKING:  # the step program calls these hooks; they do not import it at run time
    from sentinel.engine.step import StepProgram, StepState


class ClockState:
    """Worker, link and stage-weights state of the simulated clock, carried across steps."""

    def __init__(self, net: Network):
        self.net, self.links = net, _Links(net)
        self.worker_free: dict[str, float] = {}
        self.weights_ready: dict[tuple[int, int], float] = {}  # (stage, step) -> time its update is done
        self.sim_time_s = 0.0
        self.tokens = 0
        self.step_s: list[float] = []

    def advance(
        self,
        step: int,
        queues: dict[str, list[Action]],
        stage_of: dict[str, int],
        compute_s: Callable[[str, Action], float],
        messages: dict[tuple[str, int, int], tuple[str, str, int, int]],
        dp_s: Callable[[int, list[str]], float],
        staleness: Callable[[str, int], int],
        num_stages: int,
        tokens: int,
    ) -> float:
        """Simulate one step; returns the simulated time at which its last stage update is done."""
        before = self.sim_time_s
        gate = {}
        for w, s in stage_of.items():
            src = step - 1 - staleness(w, s)  # the update that produced the weights w computes with
            gate[w] = self.weights_ready.get((s, src), 0.0) if src >= 0 else 0.0
        finish = simulate_step(queues, gate, self.worker_free, compute_s, messages, self.links, num_stages)
        for s in range(num_stages):
            members = [w for w in queues if stage_of[w] == s and queues[w]]
            if not members:
                self.weights_ready[(s, step)] = self.weights_ready.get((s, step - 1), 0.0)
                continue
            done = max(max(finish[w], gate[w]) for w in members)
            self.weights_ready[(s, step)] = done + dp_s(s, members)
        self.weights_ready = {k: v for k, v in self.weights_ready.items() if k[1] >= step - 80}  # bounded
        self.sim_time_s = max(
            [self.sim_time_s, *finish.values(), *(self.weights_ready[(s, step)] for s in range(num_stages))]
        )
        self.tokens += tokens
        self.step_s.append(self.sim_time_s - before)
        return self.sim_time_s

    def report(self) -> dict:
        t = self.sim_time_s
        return {
            "sim_time_s": t,
            "sim_tokens": self.tokens,
            "sim_tokens_per_s": self.tokens / t if t > 0 else None,
            "sim_step_s_mean": t / len(self.step_s) if self.step_s else None,
        }


class NetworkClock(StepHook):
    """Advances the simulated clock after every optimizer step (reads the engine, changes nothing)."""

    def __init__(self, scenario):
        self.sc, self.cfg = scenario, scenario.transport.network
        self.net = Network(self.cfg, scenario.seed)
        self.state = ClockState(self.net)
        self._row = 0
        self.dp_bytes_sent = 0

    def attach(self, engine: StepProgram) -> None:
        self._row = len(engine.log.messages)
        m = self.sc.model
        self.stage_flops = [
            stage_flops(engine.replicas[engine.workers.live_in_stage(s)[0]].module, self.sc.data.batch_size, m.seq_len)
            for s in range(engine.num_stages)
        ]
        self.stage_params = [
            sum(p.numel() for p in engine.replicas[engine.workers.live_in_stage(s)[0]].params)
            for s in range(engine.num_stages)
        ]
        self.stragglers = stragglers(self.cfg, self.sc.seed, list(engine.workers.ids))
        for w in engine.workers.ids:
            self.net.node(w)

    # -- inputs of one step ------------------------------------------------------------------------
    def _messages(self, engine: StepProgram) -> dict[tuple[str, int, int], tuple[str, str, int, int]]:
        m, log = engine.log.messages, engine.log
        out = {}
        for j in range(self._row, len(m)):
            b, mb, role = int(m["boundary"][j]), int(m["mb"][j]), int(m["role"][j])
            if role == Role.ACTIVATION:
                key = ("F", b, mb)
            elif role == Role.GRADIENT:
                key = ("B", b + 1, mb)
            else:
                continue
            out[key] = (log.workers[m["sender"][j]], log.workers[m["receiver"][j]], int(m["bytes"][j]), int(m["id"][j]))
        self._row = len(m)
        return out

    def _compute(self, st, messages, last: int) -> Callable[[str, Action], float]:
        measured = self.cfg.compute == "measured"
        action_s, skipped = st.action_s, st.skipped

        def compute_s(w: str, a: Action) -> float:
            if (a.stage, a.mb) in skipped or (
                a.kind == "B" and a.stage < last and ("B", a.stage + 1, a.mb) not in messages
            ):
                return 0.0
            base = (
                action_s.get(a, 0.0)
                if measured
                else self.stage_flops[a.stage] * (2 if a.kind == "B" else 1) / (self.cfg.tflops * 1e12)
            )
            return base * (self.cfg.straggler_slowdown if w in self.stragglers else 1.0)

        return compute_s

    def _dp_bytes(self, engine: StepProgram, s: int) -> int:
        sync = self.sc.dp.sync
        if sync == "none":
            return 0
        if sync == "sparse_avg":
            hook = find_hook(engine, SparseAveraging)
            return hook.step_bytes.get(s, 0) if hook is not None else 0
        comp = engine.dp_compressor
        if comp is not None:
            return comp.step_bytes.get(s, 0)
        return 4 * self.stage_params[s]

    def after_update(self, engine: StepProgram, st: StepState) -> None:
        S, ids = engine.num_stages, engine.workers.ids
        queues: dict[str, list[Action]] = {}
        stage_of: dict[str, int] = {}
        for s, acts in enumerate(engine.schedule):
            for a in acts:
                w = ids[st.plan[a.mb, s]]
                queues.setdefault(w, []).append(a)
                stage_of[w] = s
        messages = self._messages(engine)
        asy = find_hook(engine, Asynchrony)

        def dp_s(s: int, members: list[str]) -> float:
            nbytes = self._dp_bytes(engine, s)
            self.dp_bytes_sent += nbytes * len(members) if len(members) > 1 else 0
            return self.net.ring_allreduce_s(members, nbytes)

        tokens = len(st.losses) * self.sc.data.batch_size * self.sc.model.seq_len
        self.state.advance(
            st.step,
            queues,
            stage_of,
            self._compute(st, messages, S - 1),
            messages,
            dp_s,
            (lambda w, s: asy.staleness(st.step, w, s)) if asy is not None else (lambda w, s: 0),
            S,
            tokens,
        )

    def report(self) -> dict:
        return {
            **self.state.report(),
            "dp_bytes_sent": int(self.dp_bytes_sent),
            "network_preset": self.cfg.preset,
            "links_used": self.net.graph.number_of_edges(),
        }


def network_report(engine: StepProgram) -> dict:
    """The clock's figures for summary.json `transport` ({} when the network model is disabled)."""
    clock = find_hook(engine, NetworkClock)
    return clock.report() if clock is not None else {}


def pipeline_throughput(
    net_cfg,
    *,
    num_stages: int,
    num_microbatches: int,
    act_bytes: int,
    grad_bytes: int,
    fwd_s: float,
    bwd_s: float,
    tokens_per_mb: int,
    schedule: str = "1f1b",
    dp_s: float = 0.0,
    steps: int = 4,
    seed: int = 0,
) -> dict:
    """Simulated throughput of a one-replica-per-stage pipeline from its shape alone (same event model)."""
    state = ClockState(Network(net_cfg, seed))
    per_stage = make_schedule(schedule, num_stages, num_microbatches)
    ids = [f"s{s}r0" for s in range(num_stages)]
    stage_of = {w: s for s, w in enumerate(ids)}
    msg_id = 0
    for step in range(steps):
        messages = {}
        for s in range(num_stages):
            for mb in range(num_microbatches):
                if s < num_stages - 1:
                    messages[("F", s, mb)] = (ids[s], ids[s + 1], act_bytes, msg_id)
                if s > 0:
                    messages[("B", s, mb)] = (ids[s], ids[s - 1], grad_bytes, msg_id + 1)
                msg_id += 2
        queues = {ids[s]: list(acts) for s, acts in enumerate(per_stage)}
        state.advance(
            step,
            queues,
            stage_of,
            lambda w, a: fwd_s if a.kind == "F" else bwd_s,
            messages,
            lambda s, members: dp_s,
            lambda w, s: 0,
            num_stages,
            tokens_per_mb * num_microbatches,
        )
    return state.report()
