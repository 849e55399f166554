"""Process-level set-up shared by every rank: options, the process groups, devices, jobs.

One torchrun launch runs one `sentinel run` (the scenario plus its twins). Rank 0 drives
`sentinel.runner.run` and announces each training job (scenario as plain data, result folder) on a
dedicated gloo group with a long timeout; the other ranks loop on those announcements, so they follow
whatever sequence of twins the runner decides without knowing it in advance.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os

import torch
import torch.distributed as dist

from sentinel.distributed.comm import Comm
from sentinel.errors import ConfigError
from sentinel.scenario import Scenario

JOB_TIMEOUT = datetime.timedelta(hours=24)  # rank 0 may spend long between jobs (twins, plots, reports)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """Settings of a distributed run that are not part of the scenario (they do not change its numbers).

    Attributes:
        timeout_s: longest wait of a verifier for one message before its sender counts as stalled (workers
            wait 2x, collectives 3x, so the verifier, which knows whom it waits for, reports first).
        checkpoint_every: save a checkpoint every n steps (0: never) under OUT/checkpoints/.
        resume: a checkpoint folder (OUT/checkpoints or one step-NNNNNN folder in it) to resume from.
        faults: fault-injection specs (sentinel/distributed/faults.py), for tests and chaos runs.
        device: "cpu", "cuda" or "auto" (cuda when available).
        backend: "gloo", "nccl" or "auto" for the DP sync (nccl when every local rank has its own GPU, else gloo);
            messages through the verifiers always travel over gloo (verifiers are CPU relays).
        verifiers: verifier processes (default: one per stage boundary when --nproc allows it).
    """

    timeout_s: float = 60.0
    checkpoint_every: int = 0
    resume: str | None = None
    faults: tuple[str, ...] = ()
    device: str = "cpu"
    backend: str = "auto"
    verifiers: int | None = None


def pick_device(options: Options) -> torch.device:
    want = options.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: CUDA is not available on this host; use --device cpu")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def pick_backend(options: Options, device: torch.device) -> str:
    """The DP sync's backend."""
    if options.backend != "auto":
        return options.backend
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device.type == "cuda" and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"  # CPU, or several ranks sharing a GPU (NCCL refuses that): tensors are staged through host memory


class Runtime:
    """This process: rank, world, devices, the point-to-point endpoint, the collective groups and the job channel."""

    def __init__(self, options: Options):
        self.options = options
        self.device = pick_device(options)
        self.dp_backend = pick_backend(options, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.dp_device = self.device if self.dp_backend == "nccl" else torch.device("cpu")
        self.collective_timeout = datetime.timedelta(seconds=3 * options.timeout_s)  # after any p2p wait
        backend = "cpu:gloo,cuda:nccl" if self.dp_backend == "nccl" else "gloo"
        dist.init_process_group(backend, timeout=self.collective_timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.jobs = dist.new_group(backend="gloo", timeout=JOB_TIMEOUT)
        self.frames = dist.new_group(backend="gloo", timeout=JOB_TIMEOUT)  # frames: reader threads wait on it
        self.p2p = dist.new_group(backend="gloo", timeout=self.collective_timeout)  # the main thread's messages
        self.collectives = dist.new_group(backend="gloo", timeout=self.collective_timeout)  # step ends
        # Verifiers diagnose stalls: workers (who wait on them) give them twice as long to notice first.
        wait_s = options.timeout_s if self.rank == 0 else 2 * options.timeout_s
        self.comm = Comm(self.rank, wait_s, lambda r: f"rank {r}", self.p2p, self.frames)
        self.in_job = False  # rank 0: a job was announced and has not finished

    def announce(self, job: dict | None) -> None:
        """Rank 0: broadcast the next job (None = no more jobs)."""
        self.in_job = job is not None
        data = json.dumps(job).encode("utf-8")
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0, group=self.jobs)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=self.jobs)

    def next_job(self) -> dict | None:
        n = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(n, 0, group=self.jobs)
        buf = torch.empty(int(n), dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self.jobs)
        return json.loads(buf.numpy().tobytes().decode("utf-8"))

    def ready(self) -> None:
        """Every rank has built its part of the job: message timeouts count from here, not from start-up."""
        dist.barrier(group=self.jobs)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_supported(sc: Scenario) -> None:
    """ConfigError for scenario features the distributed backend does not run, with the reason (none today: kept
    as the one place such a rule would go)."""
