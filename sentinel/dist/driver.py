"""The training loop of one job on every rank, the merge of the EventLog parts, and failure handling.

Rank 0 runs `relay_trainer(rt)` as the runner's `trainer` (same contract as `runner.train`: returns
(engine, result, wall_s), saves the partial EventLog and `failure.txt` and raises RunError on
failure). Ranks 1..N-1 run `worker_loop(rt)`. Both walk the same sequence, which is `SimEngine.run`'s:

    evaluate (step 0) -> [train_step -> evaluate when due -> checkpoint when due] x steps -> send/merge logs
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path

import torch

from sentinel import strictjson
from sentinel.dist import checkpoint
from sentinel.dist.merge import log_from_bytes, log_to_bytes, merge
from sentinel.dist.relay import RelayRank
from sentinel.dist.runtime import Runtime, check_supported
from sentinel.dist.worker import WorkerRank
from sentinel.errors import RunError
from sentinel.eventlog import EventLog
from sentinel.scenario import Scenario, validate


def _ckpt_due(mesh, rt: Runtime) -> bool:
    every = rt.options.checkpoint_every
    return bool(every) and (mesh.step % every == 0 or mesh.step == mesh.sc.training.steps)


def _resume_from(rt: Runtime, out_dir: Path | None, top: Path | None) -> Path | None:
    """The checkpoint a job resumes from: for the main run, RESUME itself (a run folder, its checkpoints
    folder or one step folder); for a twin, RESUME/twin_<kind>/checkpoints (none: the twin starts afresh)."""
    if rt.options.resume is None:
        return None
    root = Path(rt.options.resume)
    if out_dir is not None and top is not None and Path(out_dir) != Path(top):
        try:
            return checkpoint.latest(root / Path(out_dir).relative_to(top) / "checkpoints")
        except ValueError:
            return None
    found = checkpoint.latest(root) or checkpoint.latest(root / "checkpoints")
    if found is None:
        raise RunError(f"--resume {root}: no complete checkpoint there (a step-NNNNNN folder holding COMPLETE)")
    return found


# -- rank 0 --------------------------------------------------------------------------------------------
def relay_trainer(rt: Runtime, top: Path | None):
    """A `runner.train`-compatible function that runs each job on the whole process group."""
    from sentinel.runner import _Progress

    def train(scenario: Scenario, out_dir: Path | None, progress: bool | None = None, label: str = "run"):
        check_supported(scenario)
        out_dir = Path(out_dir) if out_dir is not None else None
        rt.announce({"scenario": scenario.to_dict(), "out": str(out_dir) if out_dir else None, "label": label})
        log = EventLog()
        relay, bar, t0 = None, _Progress(scenario.training.steps, label, progress), time.perf_counter()
        try:
            relay = RelayRank(scenario, rt, log)
            rt.ready()
            result = _drive_relay(relay, rt, bar, _resume_from(rt, out_dir, top), out_dir)
            parts = [log_from_bytes(_recv_bytes(rt, r, "its EventLog part")) for r in range(1, rt.world)]
            merge(log, parts)
            relay.rank_stats = [p.meta.get("dist", {}) for p in parts]
        except BaseException as exc:
            bar.close()
            _save_partial(log, out_dir, rt.rank, exc, relay.step if relay else 0)
            if not isinstance(exc, Exception):  # Ctrl-C, or SIGTERM from the launcher: not this run's fault
                raise
            raise RunError(f"run {scenario.name!r} failed at step {relay.step if relay else 0}: {exc}"
                           + (f" (partial EventLog and traceback saved in {out_dir})" if out_dir else "")) from exc
        bar.close()
        rt.in_job = False
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            log.save(out_dir)
            (out_dir / "dist_timing.json").write_text(strictjson.dumps(timing(relay, rt), indent=1))
        return relay, result, time.perf_counter() - t0

    return train


def _drive_relay(relay: RelayRank, rt: Runtime, bar, ckpt: Path | None, out_dir: Path | None) -> dict:
    t = relay.sc.training
    plugins = {"verifier": relay.transport.verifier, "responder": relay.transport.responder}
    if ckpt is not None:
        state = checkpoint.load(relay, ckpt, plugins)
        relay.transport.bytes_sent, relay.transport.verifier_s = state["bytes_sent"], state["verifier_s"]
    else:
        relay.log.log_eval(0, relay.evaluate())
    t0, val = time.perf_counter(), None
    while relay.step < t.steps:
        loss = relay.train_step()
        val = None
        if relay.eval_due(relay.step):
            val = relay.evaluate()
            relay.log.log_eval(relay.step, val)
        bar(relay.step, loss, val)
        if _ckpt_due(relay, rt) and out_dir is not None:
            checkpoint.save(relay, out_dir / "checkpoints", plugins,
                            {"bytes_sent": relay.transport.bytes_sent, "verifier_s": relay.transport.verifier_s})
    evals = relay.log.evals["val_loss"]
    return {"initial_val_loss": float(evals[0]), "final_val_loss": float(val if val is not None else evals[-1]),
            "train_wall_s": time.perf_counter() - t0}


def timing(relay: RelayRank, rt: Runtime) -> dict:
    """Where the time went: per-step wall time (the first step is warm-up) and each rank's split."""
    steady = relay.step_s[1:] or relay.step_s
    return {"backend": rt.backend, "world": rt.world, "steps": len(relay.step_s),
            "s_per_step": sum(steady) / max(1, len(steady)), "relay_wait_s": rt.comm.wait_s,
            "relay_verifier_s": relay.transport.verifier_s, "ranks": getattr(relay, "rank_stats", [])}


# -- ranks 1..N-1 --------------------------------------------------------------------------------------
def worker_loop(rt: Runtime, top: Path | None) -> None:
    """Run every job rank 0 announces, until it announces the end."""
    while (job := rt.next_job()) is not None:
        sc = validate(job["scenario"])
        out_dir = Path(job["out"]) if job["out"] else None
        worker = None
        try:
            worker = WorkerRank(sc, rt)
            rt.ready()
            _drive_worker(worker, rt, _resume_from(rt, out_dir, top), out_dir)
            worker.log.meta["dist"] = {"rank": rt.rank, "compute_s": worker.compute_s, "wait_s": rt.comm.wait_s}
            _send_bytes(rt, 0, log_to_bytes(worker.log))
            rt.comm.flush()
        except BaseException as exc:
            if worker is not None:
                _save_partial(worker.log, out_dir, rt.rank, exc, worker.step, relay=False)
            raise


def _drive_worker(w: WorkerRank, rt: Runtime, ckpt: Path | None, out_dir: Path | None) -> None:
    plugins = {"adversary": w.adversary}
    if ckpt is not None:
        w.restore(checkpoint.load(w, ckpt, plugins))
    else:
        w.send_reference()
    while w.step < w.sc.training.steps:
        w.train_step()
        if w.eval_due(w.step):
            w.send_reference()
        if _ckpt_due(w, rt) and out_dir is not None:
            checkpoint.save(w, out_dir / "checkpoints", plugins, {"next_id": w._next_id})


# -- plumbing ------------------------------------------------------------------------------------------
def _send_bytes(rt: Runtime, dst: int, data: bytes) -> None:
    rt.comm.send(torch.tensor([len(data)], dtype=torch.int64), dst)
    rt.comm.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst)


def _recv_bytes(rt: Runtime, src: int, what: str) -> bytes:
    n = int(rt.comm.recv((1,), torch.int64, src, what))
    return rt.comm.recv((n,), torch.uint8, src, what).cpu().numpy().tobytes()


def _save_partial(log: EventLog, out_dir: Path | None, rank: int, exc: BaseException, step: int,
                  relay: bool = True) -> None:
    """What was logged so far: this rank's part under OUT/ranks/rank{r}/; rank 0 also OUT/events.* + failure.txt."""
    if out_dir is None:
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher's SIGTERM must not cut the save short
    try:
        part = out_dir / "ranks" / f"rank{rank}"
        part.mkdir(parents=True, exist_ok=True)
        log.save(part)
        if relay:
            log.save(out_dir)
            (out_dir / "failure.txt").write_text(
                f"run failed at step {step}: {exc!r}\n\n{''.join(traceback.format_exception(exc))}")
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
    (d / "exit.json").write_text(strictjson.dumps({"rank": rank, "pid": os.getpid(), "status": status, "message": message}))
