"""Who is who: worker ids `s{stage}r{replica}`, which are live, and how microbatches are routed."""

from __future__ import annotations

import dataclasses

import numpy as np

from sentinel.errors import RunError


def worker_id(stage_idx: int, replica_idx: int) -> str:
    return f"s{stage_idx}r{replica_idx}"


class WorkerTable:
    """Every worker slot of the mesh. Banned workers stay in the table but are not live.

    A replacement (a fresh honest replica for a banned one) gets the next unused replica index of
    its stage, so ids are never reused.
    """

    def __init__(self, num_stages: int, num_replicas: int):
        self.num_stages = num_stages
        self.founders = num_replicas  # replicas each stage started with (replica indices below it)
        self.ids: list[str] = []
        self.stage: list[int] = []
        self.live: list[bool] = []
        self._next_replica = [num_replicas] * num_stages
        for s in range(num_stages):
            for r in range(num_replicas):
                self._add(s, r)

    def _add(self, stage_idx: int, replica_idx: int) -> int:
        self.ids.append(worker_id(stage_idx, replica_idx))
        self.stage.append(stage_idx)
        self.live.append(True)
        return len(self.ids) - 1

    def index(self, wid: str) -> int:
        return self.ids.index(wid)

    def live_in_stage(self, stage_idx: int) -> list[int]:
        return [i for i, (s, ok) in enumerate(zip(self.stage, self.live)) if s == stage_idx and ok]

    def ban(self, wid: str) -> None:
        self.live[self.index(wid)] = False

    def add_replacement(self, stage_idx: int) -> int:
        r = self._next_replica[stage_idx]
        self._next_replica[stage_idx] += 1
        return self._add(stage_idx, r)


class Router:
    """Chooses one live replica per (microbatch, stage) each step.

    `random`: SWARM-like, uniform over the live replicas, seeded by (seed, step).
    `fixed`: microbatch m goes to the (m mod live)-th live replica.
    """

    def __init__(self, mode: str, seed: int, workers: WorkerTable):
        self.mode, self.seed, self.workers = mode, seed, workers

    def route(self, step: int, num_microbatches: int) -> np.ndarray:
        """Array (M, S) of worker indices into the WorkerTable."""
        S = self.workers.num_stages
        plan = np.empty((num_microbatches, S), dtype=np.int64)
        rng = np.random.default_rng([self.seed, 0x2077, step])
        for s in range(S):
            live = self.workers.live_in_stage(s)
            if not live:
                raise RunError(f"stage {s} has no live replica left at step {step}: every replica was banned")
            if self.mode == "random":
                plan[:, s] = np.asarray(live)[rng.integers(0, len(live), size=num_microbatches)]
            else:
                plan[:, s] = np.asarray(live)[np.arange(num_microbatches) % len(live)]
        return plan


@dataclasses.dataclass(frozen=True, slots=True)
class MeshEvent:
    """A change of the mesh decided by the response policy: a ban, or a worker added to a stage.

    kind "ban": `worker` banned at `step`, `replaced_by` its replacement (or None), `by` the test that decided it
    (`eventlog.BAN_RULES`; None: a ban from outside the responder).
    kind "add": `worker` added to `stage` (a replacement, or with `rejoin_of` a banned worker's operator rejoining).
    """

    kind: str
    step: int
    worker: str
    stage: int
    replaced_by: str | None = None
    rejoin_of: str | None = None
    by: str | None = None


class MeshControl:
    """The response policy's view of the mesh: worker ids, stages, who is live; bans and additions.

    It changes the `WorkerTable` and records each change as a `MeshEvent` in `events`; the engine (or the
    distributed coordinator) carries them out afterwards -- builds the replicas of added workers, writes bans
    to the EventLog, tells other processes. It holds nothing else, so a response policy that only has this
    object cannot reach ground truth.
    """

    def __init__(self, workers: WorkerTable, lagging: frozenset[str] = frozenset(), exchangeable: bool = True):
        self._workers = workers
        self.lagging = lagging  # public: workers whose weights persistently lag their peers' (`asynchrony.lagging`)
        # False: a stage's replicas hold diverging weights (DP sync other than allreduce)
        self.exchangeable = exchangeable
        self.events: list[MeshEvent] = []

    def stage_of(self, worker: str) -> int:
        return self._workers.stage[self._workers.index(worker)]

    def live_in_stage(self, stage_idx: int) -> list[str]:
        return [self._workers.ids[i] for i in self._workers.live_in_stage(stage_idx)]

    def cohort(self, worker: str) -> bool | str:
        """The worker's cohort in its stage: the replicas it is exchangeable with (same weights, same staleness), whom
        peer comparisons may hold it to. With allreduce DP sync, the lagging workers (async stragglers) and the rest;
        with replicas whose weights diverge (`exchangeable` False), each worker alone."""
        return worker in self.lagging if self.exchangeable else worker

    def membership(self, stage_idx: int) -> tuple[int, int, int]:
        """(replicas the stage started with, workers added to it since: replacements and rejoins, workers of it that
        are banned now)."""
        w = self._workers
        members = [i for i, s in enumerate(w.stage) if s == stage_idx]
        return w.founders, len(members) - w.founders, sum(not w.live[i] for i in members)

    def is_live(self, worker: str) -> bool:
        return self._workers.live[self._workers.index(worker)]

    def ban(self, worker: str, step: int, replace: bool, by: str | None = None) -> bool:
        """Ban `worker`, adding a replacement when `replace`; False (nothing done) when it is not live, or is its
        stage's last live replica and would not be replaced (training could not continue)."""
        w = self._workers
        idx = w.index(worker)
        if not w.live[idx]:
            return False
        stage = w.stage[idx]
        if not replace and len(w.live_in_stage(stage)) <= 1:
            return False
        w.ban(worker)
        at = len(self.events)  # the ban comes first: a replacement copies a replica that is still live
        new = self._add(stage, step, None) if replace else None
        self.events.insert(at, MeshEvent("ban", step, worker, stage, replaced_by=new, by=by))
        return True

    def rejoin(self, stage_idx: int, old: str, step: int) -> str:
        """A banned worker's operator rejoins under a new id (Sybil); returns the id."""
        return self._add(stage_idx, step, old)

    def _add(self, stage_idx: int, step: int, rejoin_of: str | None) -> str:
        wid = self._workers.ids[self._workers.add_replacement(stage_idx)]
        self.events.append(MeshEvent("add", step, wid, stage_idx, rejoin_of=rejoin_of))
        return wid

    def drain(self) -> list[MeshEvent]:
        out, self.events = self.events, []
        return out
