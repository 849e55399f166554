"""Which rank hosts which worker: rank 0 is the relay, ranks 1..N-1 host contiguous groups of one stage.

With K = N - 1 worker ranks for S stages x R replicas (S <= K <= S * R):

    stage s gets k_s = K // S ranks, plus one for the first K % S stages     (so k_s <= R)
    replica r of stage s lives on rank  first_rank(s) + (r * k_s) // R        (contiguous groups)

K = S * R gives one worker per rank. Every rank hosts workers of a single stage: its messages then
leave in its stage's schedule order, which is the relay's canonical order restricted to that rank, so
point-to-point FIFO order is all the protocol needs (no tags, which NCCL would not honour anyway).
A replacement worker (a ban with `replace_banned`, or a rejoin) is hosted by the rank of its stage
that hosts the fewest live workers at that moment (ties: the lowest rank) -- every rank computes the
same answer from the same worker table.
"""

from __future__ import annotations

from sentinel.engine.workers import WorkerTable
from sentinel.errors import ConfigError

RELAY = 0


def check_world(num_stages: int, num_replicas: int, world_size: int) -> None:
    """ConfigError unless `world_size` processes can host the mesh (one relay + S..S*R worker ranks)."""
    lo, hi = num_stages + 1, num_stages * num_replicas + 1
    if not lo <= world_size <= hi:
        raise ConfigError(
            f"--nproc {world_size}: the dist backend needs one relay process plus between S = {num_stages} "
            f"and S x R = {num_stages * num_replicas} worker processes (each hosts workers of one stage); "
            f"use --nproc between {lo} and {hi}"
        )


class RankMap:
    """Worker id <-> rank, for the initial mesh and for replacements added later."""

    def __init__(self, num_stages: int, num_replicas: int, world_size: int):
        check_world(num_stages, num_replicas, world_size)
        self.num_stages, self.world_size = num_stages, world_size
        k = world_size - 1
        counts = [k // num_stages + (1 if s < k % num_stages else 0) for s in range(num_stages)]
        self.stage_ranks: list[list[int]] = []
        first = 1
        for c in counts:
            self.stage_ranks.append(list(range(first, first + c)))
            first += c
        self.host: dict[str, int] = {}
        for s in range(num_stages):
            for r in range(num_replicas):
                self.host[f"s{s}r{r}"] = self.stage_ranks[s][(r * counts[s]) // num_replicas]

    def stage_of_rank(self, rank: int) -> int:
        for s, ranks in enumerate(self.stage_ranks):
            if rank in ranks:
                return s
        raise ValueError(f"rank {rank} hosts no stage (the relay is rank {RELAY})")

    def hosted(self, rank: int, workers: WorkerTable) -> list[int]:
        """Worker-table indices hosted by `rank`, in table order."""
        return [i for i, wid in enumerate(workers.ids) if self.host.get(wid) == rank]

    def place(self, wid: str, stage_idx: int, workers: WorkerTable) -> int:
        """Host a new worker of `stage_idx` on the stage's rank with the fewest live workers."""
        def load(rank: int) -> int:
            return sum(1 for i in workers.live_in_stage(stage_idx) if self.host.get(workers.ids[i]) == rank)

        rank = min(self.stage_ranks[stage_idx], key=lambda r: (load(r), r))
        self.host[wid] = rank
        return rank

    def describe(self, rank: int) -> str:
        """'rank 2 (workers s1r0, s1r1)' -- for error messages."""
        if rank == RELAY:
            return f"rank {RELAY} (the relay)"
        wids = [w for w, r in self.host.items() if r == rank]
        return f"rank {rank} (worker{'s' if len(wids) != 1 else ''} {', '.join(wids) or 'none'})"

    def table(self) -> list[tuple[int, str]]:
        """(rank, hosted workers) for every rank: the mapping printed at start-up."""
        return [(RELAY, "relay (verifier, response, event log)")] + [
            (r, ", ".join(w for w, h in self.host.items() if h == r)) for r in range(1, self.world_size)
        ]
