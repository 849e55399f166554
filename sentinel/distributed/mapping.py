"""Which process does what: verifier processes (one per group of stage boundaries) and worker processes.

With N processes for S stages x R replicas and V verifier processes:

    ranks 0 .. V-1       verifiers; the S - 1 boundaries are split into V contiguous groups (sizes differ by at
                         most one), group v served by rank v. Rank 0 also coordinates the run: evaluation, the
                         response policy's step-end decisions, the EventLog merge and the result folder.
    ranks V .. N-1       workers: K = N - V ranks, each hosting a contiguous group of replicas of ONE stage:
                         stage s gets k_s = K // S ranks, plus one for the first K % S stages (so k_s <= R);
                         replica r of stage s lives on rank first_rank(s) + (r * k_s) // R.

V defaults to one verifier per boundary (the paper's placement) when N allows it: V = max(1, min(S - 1, N - S)).
A rank hosting workers of a single stage sends its messages in its stage's schedule order, which is what lets
a verifier predict what comes from whom. A replacement worker (a ban with `replace_banned`, or a rejoin) is
hosted by the rank of its stage that hosts the fewest live workers at that moment (ties: the lowest rank) --
every rank computes the same answer from the same worker table.
"""

from __future__ import annotations

from sentinel.engine.workers import WorkerTable
from sentinel.errors import ConfigError
from sentinel.model import split_layers  # the same even, contiguous split as layers over stages

COORDINATOR = 0


def default_verifiers(num_stages: int, world_size: int) -> int:
    """One verifier per boundary when the processes allow it, else as many as leave one rank per stage."""
    return max(1, min(num_stages - 1, world_size - num_stages))


def default_nproc(sc, verifiers: int | None = None) -> int:
    """One process per worker plus one verifier per boundary (or `verifiers` of them)."""
    v = verifiers if verifiers is not None else max(1, sc.pipeline.stages - 1)
    return sc.num_workers + v


def check_world(num_stages: int, num_replicas: int, world_size: int, verifiers: int | None = None) -> int:
    """The number of verifier processes, or ConfigError unless `world_size` processes can host the mesh."""
    boundaries = max(1, num_stages - 1)
    v = default_verifiers(num_stages, world_size) if verifiers is None else verifiers
    lo, hi = 1 + num_stages, boundaries + num_stages * num_replicas
    if not 1 <= v <= boundaries:
        raise ConfigError(
            f"--verifiers {v}: between 1 and {boundaries} (one process per boundary at most: "
            f"{num_stages} stages have {num_stages - 1} boundaries)"
        )
    if not v + num_stages <= world_size <= v + num_stages * num_replicas:
        raise ConfigError(
            f"--nproc {world_size}: the distributed backend needs {v} verifier process{'es' if v > 1 else ''} plus "
            f"between S = {num_stages} and S x R = {num_stages * num_replicas} worker processes (each hosts workers "
            f"of one stage); use --nproc between {v + num_stages} and {v + num_stages * num_replicas}"
            + (
                f" (any --nproc between {lo} and {hi} works with --verifiers chosen for it)"
                if verifiers is not None
                else ""
            )
        )
    return v


class RankMap:
    """Roles of the ranks, boundary -> verifier rank, worker id <-> rank (also for workers added later)."""

    def __init__(self, num_stages: int, num_replicas: int, world_size: int, verifiers: int | None = None):
        self.num_verifiers = check_world(num_stages, num_replicas, world_size, verifiers)
        self.num_stages, self.world_size = num_stages, world_size
        v = self.num_verifiers
        self.boundary_groups = split_layers(num_stages - 1, v) if num_stages > 1 else [range(0)]
        self.verifier_of = {b: rank for rank, group in enumerate(self.boundary_groups) for b in group}
        counts = [len(r) for r in split_layers(world_size - v, num_stages)]
        self.stage_ranks: list[list[int]] = []
        first = v
        for c in counts:
            self.stage_ranks.append(list(range(first, first + c)))
            first += c
        self.host: dict[str, int] = {}
        for s in range(num_stages):
            for r in range(num_replicas):
                self.host[f"s{s}r{r}"] = self.stage_ranks[s][(r * counts[s]) // num_replicas]

    def is_verifier(self, rank: int) -> bool:
        return rank < self.num_verifiers

    def boundaries(self, rank: int) -> list[int]:
        """The boundaries a verifier rank serves (none for a worker rank)."""
        return list(self.boundary_groups[rank]) if self.is_verifier(rank) else []

    def stage_of_rank(self, rank: int) -> int:
        for s, ranks in enumerate(self.stage_ranks):
            if rank in ranks:
                return s
        raise ValueError(f"rank {rank} hosts no stage (ranks 0..{self.num_verifiers - 1} are verifiers)")

    def hosted(self, rank: int, workers: WorkerTable) -> list[int]:
        """Worker-table indices hosted by `rank`, in table order."""
        return [i for i, wid in enumerate(workers.ids) if self.host.get(wid) == rank]

    def place(self, wid: str, stage_idx: int, workers: WorkerTable) -> int:
        """Host a new worker of `stage_idx` on the stage's rank with the fewest live workers (idempotent)."""
        if wid in self.host:
            return self.host[wid]

        def load(rank: int) -> int:
            return sum(1 for i in workers.live_in_stage(stage_idx) if self.host.get(workers.ids[i]) == rank)

        rank = min(self.stage_ranks[stage_idx], key=lambda r: (load(r), r))
        self.host[wid] = rank
        return rank

    def describe(self, rank: int) -> str:
        """'rank 2 (workers s1r0, s1r1)', 'rank 0 (verifier of boundaries 0, 1)' -- for error messages."""
        if self.is_verifier(rank):
            bs = self.boundaries(rank)
            what = f"verifier of boundar{'ies' if len(bs) != 1 else 'y'} {', '.join(map(str, bs)) or 'none'}"
            return f"rank {rank} ({what}{', coordinator' if rank == COORDINATOR else ''})"
        wids = [w for w, r in self.host.items() if r == rank]
        return f"rank {rank} (worker{'s' if len(wids) != 1 else ''} {', '.join(wids) or 'none'})"

    def table(self) -> list[tuple[int, str]]:
        """(rank, role) for every rank: the mapping printed at start-up."""
        out = []
        for r in range(self.world_size):
            if self.is_verifier(r):
                bs = ", ".join(map(str, self.boundaries(r))) or "none"
                out.append((r, f"verifier of boundaries {bs}" + (" + coordinator" if r == COORDINATOR else "")))
            else:
                out.append((r, ", ".join(w for w, h in self.host.items() if h == r)))
        return out
