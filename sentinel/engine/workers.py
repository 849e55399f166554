"""Who is who: worker ids `s{stage}r{replica}`, which are live, and how microbatches are routed."""

from __future__ import annotations

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
