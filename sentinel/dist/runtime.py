"""Process-level set-up shared by every rank: options, the process group, devices, jobs, the mesh.

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

from sentinel.data import Dataset
from sentinel.detectors.verifier import payload_shape
from sentinel.model import dims
from sentinel.dist.comm import Comm
from sentinel.dist.mapping import RankMap
from sentinel.engine.schedule import make_schedule
from sentinel.engine.workers import Router, WorkerTable
from sentinel.errors import ConfigError
from sentinel.registry import AGGREGATORS
from sentinel.scenario import Scenario

JOB_TIMEOUT = datetime.timedelta(hours=24)  # rank 0 may spend long between jobs (twins, plots, reports)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """Settings of a dist run that are not part of the scenario (they do not change its numbers).

    Attributes:
        timeout_s: longest wait of the relay for one message before its sender counts as stalled (workers
            wait 2x, collectives 3x, so the relay, which knows whom it waits for, reports first).
        checkpoint_every: save a checkpoint every n steps (0: never) under OUT/checkpoints/.
        resume: a checkpoint folder (OUT/checkpoints or one step-NNNNNN folder in it) to resume from.
        faults: fault-injection specs (sentinel/dist/faults.py), for tests and chaos runs.
        device: "cpu", "cuda" or "auto" (cuda when available).
        backend: "gloo", "nccl" or "auto" (nccl when every local rank has its own GPU, else gloo).
    """

    timeout_s: float = 60.0
    checkpoint_every: int = 0
    resume: str | None = None
    faults: tuple[str, ...] = ()
    device: str = "cpu"
    backend: str = "auto"


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
    if options.backend != "auto":
        return options.backend
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device.type == "cuda" and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"  # CPU, or several ranks sharing a GPU (NCCL refuses that): tensors are staged through host memory


class Runtime:
    """This process: rank, world, devices, the p2p endpoint and the job channel."""

    def __init__(self, options: Options):
        self.options = options
        self.device = pick_device(options)
        self.backend = pick_backend(options, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.collective_timeout = datetime.timedelta(seconds=3 * options.timeout_s)  # after any p2p wait
        dist.init_process_group(self.backend, timeout=self.collective_timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.comm_device = self.device if self.backend == "nccl" else torch.device("cpu")
        self.jobs = dist.new_group(backend="gloo", timeout=JOB_TIMEOUT)
        # The relay diagnoses stalls: workers (who wait on the relay) give it twice as long to notice first.
        wait_s = options.timeout_s if self.rank == 0 else 2 * options.timeout_s
        self.comm = Comm(self.rank, wait_s, lambda r: f"rank {r}", self.device, self.comm_device)
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
    """ConfigError for scenario features the dist backend does not run (yet), with the alternative."""
    problems = []
    t, dp = sc.transport, sc.dp
    if getattr(getattr(t, "async_", None), "max_staleness", 0):
        problems.append("transport.async.max_staleness: asynchronous pipelines run on --backend sim only; set it to 0")
    if dp.sync not in ("allreduce", "none"):
        problems.append(f"dp.sync: {dp.sync!r} runs on --backend sim only; use allreduce or none")
    if getattr(getattr(dp, "compression", None), "method", "none") != "none":
        problems.append("dp.compression.method: compressed DP sync runs on --backend sim only; set it to none")
    from sentinel.engine.hooks import StepHook

    for role, codec in make_codecs(sc).items():
        if isinstance(codec, StepHook):
            problems.append(f"transport codec for {role.label}s ({type(codec).__name__}) needs engine step hooks, "
                            "which --backend dist does not run; pick another codec")
    try:
        from sentinel.detectors.recompute import Duplication
        from sentinel.registry import DETECTORS

        if issubclass(DETECTORS.get(sc.detector.name), Duplication):
            problems.append(f"detector.name: {sc.detector.name!r} needs the sim engine's trusted recomputation "
                            "hook, which --backend dist does not offer; use a statistical detector")
    except ImportError:
        pass
    if sc.pipeline.stages > 1 and dims(sc).tied:
        problems.append("model: a tied embedding split over stages (GPT-2) needs its two gradients summed between "
                        "the first and the last stage after DP sync (sentinel/model/tied.py), which --backend dist "
                        "does not run yet; set model.hf.config.tie_word_embeddings: false or use --backend sim")
    if problems:
        raise ConfigError(sorted(set(problems)))


def make_codecs(sc: Scenario) -> dict:
    """One codec per role, exactly as the sim engine builds them."""
    from sentinel.transport import codecs

    return codecs.build_codecs(sc.transport)


class Mesh:
    """What every rank knows about one training job, identically: workers, routing, schedule, codecs."""

    def __init__(self, sc: Scenario, rt: Runtime, workers: WorkerTable | None = None):
        p = sc.pipeline
        self.sc, self.rt = sc, rt
        self.num_stages, self.num_microbatches = p.stages, p.microbatches
        self.workers = workers if workers is not None else WorkerTable(p.stages, p.replicas)
        self.rank_map = RankMap(p.stages, p.replicas, rt.world)
        rt.comm.describe, rt.comm.wait_s = self.rank_map.describe, 0.0
        self.router = Router(p.routing, sc.seed, self.workers)
        self.schedule = make_schedule(p.schedule, p.stages, p.microbatches)
        self.codecs = make_codecs(sc)
        self.data = Dataset(sc)
        self.vocab = dims(sc).vocab
        self.payload_shape = payload_shape(sc)
        agg = sc.dp.aggregator
        self.aggregator = AGGREGATORS.get(agg.name)(agg.config)
        self.groups = [dist.new_group(ranks, timeout=rt.collective_timeout)  # every rank, same order
                       for ranks in self.rank_map.stage_ranks]
        self.step = 0

    def eval_due(self, step: int) -> bool:
        """Sim's rule: evaluate after step n when n % eval_every == 0 or n == steps (and at 0, before training)."""
        t = self.sc.training
        return step == 0 or step % t.eval_every == 0 or step == t.steps

    def reference(self, stage_idx: int) -> int:
        """Worker-table index of the replica whose weights stand for the stage (first live one)."""
        return self.workers.live_in_stage(stage_idx)[0]
