"""Bounded-staleness pipeline parallelism (`transport.async`), in the delayed-gradient model.

In an asynchronous pipeline a stage does not wait for the whole pipeline to drain: by the time the
gradient of a microbatch comes back, the stage has applied other updates. The testbed models this
with staleness tau (<= `max_staleness`): at step t, worker w runs its forwards *and* backwards with the
weights it had tau_w steps ago, and the resulting gradient is applied to its current weights:

    theta_{t+1} = theta_t - lr * g(theta_{t - tau})          (after DP sync, with the usual optimizer)

so every activation and gradient that crosses a boundary is computed with stale weights -- the
honest drift a detector must not mistake for an attack. tau per worker and step (`staleness`):
    per_stage   tau = min(max_staleness, S - 1 - s)   (stages far from the loss wait longest)
    fixed       tau = max_staleness
    random      tau ~ Uniform{0..max_staleness}, seeded by (seed, step, worker)
Honest stragglers (`transport.network.stragglers`) always run max_staleness behind.

**Look-ahead** (AsyncMesh's Nesterov-style correction; our reading, the exact rule is not public):
the stale weights are extrapolated to the present with an EMA of past updates,
u_t = beta u_{t-1} + (1 - beta)(theta_t - theta_{t-1}) (bias-corrected), and the stage computes at
theta_hat = theta_{t-tau} + tau * u_{t-tau}; beta runs linearly from `momentum_head` at stage 0 to
`momentum_tail` at the last stage. With max_staleness = 0 this hook is not installed at all.
"""

from __future__ import annotations

import collections
import zlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from sentinel.engine.hooks import StepHook
from sentinel.transport.network import stragglers

if TYPE_CHECKING:  # the step program calls these hooks; they do not import it at run time
    from sentinel.engine.step import StepProgram, StepState
    from sentinel.engine.workers import WorkerTable


def lagging(scenario, workers: WorkerTable) -> frozenset[str]:
    """The workers whose weights persistently lag their stage peers' (public: the network's stragglers, from the
    scenario and its seed): an honest straggler of an asynchronous pipeline always computes with weights
    `max_staleness` steps old, its peers with fresher ones, so its traffic differs from theirs by construction.
    Empty where every replica of a stage has the same staleness rule (synchronous, `fixed`, or a per-stage
    staleness that already reaches `max_staleness` in that stage)."""
    c, S = scenario.transport.async_, scenario.pipeline.stages
    if c.max_staleness <= 0 or c.staleness == "fixed":
        return frozenset()
    slow = stragglers(scenario.transport.network, scenario.seed, list(workers.ids))
    if c.staleness == "per_stage":  # the rest of stage s runs min(max_staleness, S - 1 - s) behind
        slow = {w for w in slow if S - 1 - workers.stage[workers.index(w)] < c.max_staleness}
    return frozenset(slow)


class _History:
    """A worker's recent weights (newest last) and the update EMA at each of them."""

    def __init__(self, params, maxlen: int):
        self.weights: collections.deque[list[torch.Tensor]] = collections.deque(maxlen=maxlen)
        self.ema: collections.deque[list[torch.Tensor] | None] = collections.deque(maxlen=maxlen)
        self.updates = 0
        self.push(params, None)

    def push(self, params, ema) -> None:
        self.weights.append([p.detach().clone() for p in params])
        self.ema.append(ema)


class Asynchrony(StepHook):
    """Swaps stale (or look-ahead) weights in for the pipeline phase and the current ones back for the update."""

    def __init__(self, cfg, scenario):
        self.cfg, self.seed, self.num_stages = cfg, scenario.seed, scenario.pipeline.stages
        self.net_cfg = scenario.transport.network
        self.history: dict[str, _History] = {}
        self._current: dict[int, list[torch.Tensor]] = {}  # replica index -> its current weights (pipeline phase)
        self.applied: dict[str, int] = {}  # worker -> staleness used in the latest step
        self.stragglers: frozenset[str] = frozenset()

    def attach(self, engine: StepProgram) -> None:
        self.stragglers = stragglers(self.net_cfg, self.seed, list(engine.workers.ids))
        for r in engine.replicas.values():
            self._hist(r)

    def _hist(self, rep) -> _History:
        if rep.wid not in self.history:
            self.history[rep.wid] = _History(rep.params, self.cfg.max_staleness + 1)
        return self.history[rep.wid]

    def momentum(self, stage_idx: int) -> float:
        c = self.cfg
        frac = stage_idx / (self.num_stages - 1) if self.num_stages > 1 else 1.0
        return c.momentum_head + (c.momentum_tail - c.momentum_head) * frac

    def staleness(self, step: int, wid: str, stage_idx: int) -> int:
        """tau for worker `wid` at `step` (before capping by the history available)."""
        c = self.cfg
        if wid in self.stragglers or c.staleness == "fixed":
            return c.max_staleness
        if c.staleness == "per_stage":
            return min(c.max_staleness, self.num_stages - 1 - stage_idx)
        rng = np.random.default_rng([self.seed, 0xA5C, step, zlib.crc32(wid.encode())])
        return int(rng.integers(0, c.max_staleness + 1))

    @torch.no_grad()
    def before_pipeline(self, engine: StepProgram, st: StepState) -> None:
        self._current = {}
        for i, rep in engine.replicas.items():
            if not engine.workers.live[i]:
                continue
            h = self._hist(rep)
            tau = min(self.staleness(st.step, rep.wid, rep.stage_idx), len(h.weights) - 1)
            self.applied[rep.wid] = tau
            if tau == 0:
                continue
            used = [w.clone() for w in h.weights[-1 - tau]]
            ema = h.ema[-1 - tau]
            if self.cfg.lookahead and ema is not None:
                for u, e in zip(used, ema):
                    u.add_(e, alpha=tau)
            self._current[i] = [p.detach().clone() for p in rep.params]
            for p, u in zip(rep.params, used):
                p.copy_(u)

    @torch.no_grad()
    def before_update(self, engine: StepProgram, st: StepState) -> None:
        for i, cur in self._current.items():
            for p, c in zip(engine.replicas[i].params, cur):
                p.copy_(c)
        self._current = {}

    @torch.no_grad()
    def after_update(self, engine: StepProgram, st: StepState) -> None:
        for i, rep in engine.replicas.items():
            if not engine.workers.live[i]:
                continue
            h = self._hist(rep)
            ema = None
            if self.cfg.lookahead:
                beta = self.momentum(rep.stage_idx)
                h.updates += 1
                prev_raw = h.ema[-1]  # stored bias-corrected: undo the correction to update the raw EMA
                corr_prev = 1 - beta ** (h.updates - 1)
                ema, corr = [], 1 - beta**h.updates
                for j, (p, old) in enumerate(zip(rep.params, h.weights[-1])):
                    raw = prev_raw[j] * corr_prev if prev_raw is not None else torch.zeros_like(p)
                    ema.append((beta * raw + (1 - beta) * (p.detach() - old)) / corr)
            h.push(rep.params, ema)
