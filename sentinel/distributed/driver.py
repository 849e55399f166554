"""The jobs of a distributed run on every rank: the same `StepProgram.run` loop, the EventLog merge, failures.

Rank 0 runs `sentinel.runner.run` with `trainer(rt)` (same contract as `runner.train`: returns
(program, result, wall_s), saves the partial EventLog and `failure.txt` and raises RunError on failure);
it announces each training job (the run, its twins, the confirmation) to the other ranks, which run
`worker_loop(rt)`. Every rank then walks the same sequence:

    evaluate (step 0) -> [train_step -> evaluate when due -> checkpoint when due] x steps -> log part to rank 0
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from sentinel import strictjson
from sentinel.distributed.merge import log_from_bytes, log_to_bytes, merge
from sentinel.distributed.program import DistProgram
from sentinel.distributed.runtime import Runtime, check_supported
from sentinel.engine import checkpoint
from sentinel.errors import RunError
from sentinel.eventlog import EventLog
from sentinel.progress import training_progress
from sentinel.scenario import Scenario, validate


def _run_job(program: DistProgram, rt: Runtime, out_dir: Path | None, top: Path | None, on_step=None) -> dict:
    """The training loop (`StepProgram.run`) with this run's checkpoints: each rank saves its part, all meet at a
    barrier, rank 0 marks the checkpoint complete."""
    every = rt.options.checkpoint_every
    if every:
        checkpoint.check(program)
    ckpt = checkpoint.resume_point(rt.options.resume, out_dir, top)
    if ckpt is not None:
        checkpoint.load(program, ckpt, rt.rank)

    def save(p: DistProgram) -> None:
        if out_dir is not None and checkpoint.due(p.step, every, p.sc.training.steps):
            d = checkpoint.save(p, out_dir / "checkpoints", rt.rank)
            dist.barrier(group=rt.collectives)
            if rt.rank == 0:
                checkpoint.mark_complete(d, p.step)

    return program.run(on_step=on_step, on_checkpoint=save)


# -- rank 0 --------------------------------------------------------------------------------------------
def trainer(rt: Runtime, top: Path | None):
    """A `runner.train`-compatible function that runs each job on the whole process group."""

    def train(scenario: Scenario, out_dir: Path | None, progress: bool | None = None, label: str = "run"):
        check_supported(scenario)
        out_dir = Path(out_dir) if out_dir is not None else None
        rt.announce({"scenario": scenario.to_dict(), "out": str(out_dir) if out_dir else None, "label": label})
        log = EventLog()
        program, bar, t0 = None, training_progress(scenario.training.steps, label, progress), time.perf_counter()
        try:
            program = DistProgram(scenario, rt, log)
            rt.ready()
            result = _run_job(program, rt, out_dir, top, bar)
            program.close()
            parts = [
                (_kind(program, r), log_from_bytes(_recv_bytes(rt, r, "its EventLog part"))) for r in range(1, rt.world)
            ]
            merge(log, parts)
            program.rank_stats = [p.meta.get("dist", {}) for _, p in parts]
        except BaseException as exc:
            bar.close()
            _save_partial(log, out_dir, rt.rank, exc, program.step if program else 0)
            if not isinstance(exc, Exception):  # Ctrl-C, or SIGTERM from the launcher: not this run's fault
                raise
            raise RunError(
                f"run {scenario.name!r} failed at step {program.step if program else 0}: {exc}"
                + (f" (partial EventLog and traceback saved in {out_dir})" if out_dir else "")
            ) from exc
        bar.close()
        rt.in_job = False
        program.bytes_sent = int(log.messages["bytes"].sum())
        program.verifier_s = sum(p.get("verifier_s", 0.0) for p in program.rank_stats) + program.relay.verifier_s
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            log.save(out_dir)
            (out_dir / "dist_timing.json").write_text(strictjson.dumps(timing(program, rt), indent=1))
        return program, result, time.perf_counter() - t0

    return train


def _kind(program: DistProgram, rank: int) -> str:
    return "verifier" if program.rank_map.is_verifier(rank) else "worker"


def relay_stats(program: DistProgram) -> dict:
    """A verifier rank's messages and the seconds it spent relaying them (per-verifier throughput)."""
    if not program.is_verifier:
        return {}
    return {
        "messages": len(program.log.messages),
        "relay_s": program.channel.relay_s,
        "boundaries": program.rank_map.boundaries(program.rt.rank),
    }


def timing(program: DistProgram, rt: Runtime) -> dict:
    """Where the time went: per-step wall time (the first step is warm-up), each rank's split, and each verifier's
    messages per second of relaying."""
    steady = program.step_s[1:] or program.step_s
    ranks = [
        {
            "rank": 0,
            "role": "verifier",
            "wall_s": sum(program.step_s),
            "wait_s": rt.comm.wait_s,
            "verifier_s": program.relay.verifier_s,
            **relay_stats(program),
        },
        *program.rank_stats,
    ]
    verifiers = [r for r in ranks if r.get("relay_s")]
    return {
        "backend": rt.dp_backend,
        "world": rt.world,
        "verifiers": program.rank_map.num_verifiers,
        "steps": len(program.step_s),
        "s_per_step": sum(steady) / max(1, len(steady)),
        "coordinator_wait_s": rt.comm.wait_s,
        "coordinator_verifier_s": program.relay.verifier_s,
        "verifier_messages_per_s": [r["messages"] / r["relay_s"] for r in verifiers],
        "ranks": ranks,
    }


# -- ranks 1..N-1 --------------------------------------------------------------------------------------
def worker_loop(rt: Runtime, top: Path | None) -> None:
    """Run every job rank 0 announces, until it announces the end."""
    while (job := rt.next_job()) is not None:
        sc = validate(job["scenario"])
        out_dir = Path(job["out"]) if job["out"] else None
        program, log = None, EventLog()
        try:
            program = DistProgram(sc, rt, log)
            rt.ready()
            t0 = time.perf_counter()
            _run_job(program, rt, out_dir, top)
            program.close()
            log.meta["dist"] = {
                "rank": rt.rank,
                "role": _kind(program, rt.rank),
                "wall_s": time.perf_counter() - t0,
                "wait_s": rt.comm.wait_s,
                "verifier_s": program.relay.verifier_s if program.is_verifier else 0.0,
                "recomputed": program.recomputed_messages(),
                **relay_stats(program),
            }
            _send_bytes(rt, 0, log_to_bytes(log))
            rt.comm.flush()
        except BaseException as exc:
            if program is not None:
                _save_partial(log, out_dir, rt.rank, exc, program.step, coordinator=False)
            raise


# -- plumbing ------------------------------------------------------------------------------------------
def _send_bytes(rt: Runtime, dst: int, data: bytes) -> None:
    rt.comm.send(torch.tensor([len(data)], dtype=torch.int64), dst)
    rt.comm.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst)


def _recv_bytes(rt: Runtime, src: int, what: str) -> bytes:
    n = int(rt.comm.recv((1,), torch.int64, src, what))
    return rt.comm.recv((n,), torch.uint8, src, what).numpy().tobytes()


def _save_partial(
    log: EventLog, out_dir: Path | None, rank: int, exc: BaseException, step: int, coordinator: bool = True
) -> None:
    """What was logged so far: this rank's part under OUT/ranks/rank{r}/; rank 0 also OUT/events.* + failure.txt."""
    if out_dir is None:
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher's SIGTERM must not cut the save short
    try:
        part = out_dir / "ranks" / f"rank{rank}"
        part.mkdir(parents=True, exist_ok=True)
        log.save(part)
        if coordinator:
            log.save(out_dir)
            (out_dir / "failure.txt").write_text(
                f"run failed at step {step}: {exc!r}\n\n{''.join(traceback.format_exception(exc))}"
            )
    except Exception as save_exc:  # never mask the original failure
        print(f"[rank {rank}] could not save the partial EventLog: {save_exc!r}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_exit(top: Path | None, rank: int, status: str, message: str = "") -> None:
    """OUT/ranks/rank{r}/exit.json: read by the launcher to name the rank that failed first."""
    if top is None:
        return
    d = top / "ranks" / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "exit.json").write_text(
        strictjson.dumps({"rank": rank, "pid": os.getpid(), "status": status, "message": message})
    )
