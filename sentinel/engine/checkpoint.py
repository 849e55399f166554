"""Checkpoints of a run, on either backend, and resuming from one exactly.

Every `checkpoint_every` steps (and after the last step) each process writes, under
`RESULT_DIR/checkpoints/step-NNNNNN/`:

    rank{r}.pt       torch.save of plain data: the step, the worker table (and where workers live), per hosted
                     replica its module and optimizer state dicts, and the exact state of every stateful part
                     (`sentinel.state.capture`): verifiers and their detectors, the response policy, the
                     adversary layer and its attacks, codecs (error feedback), step hooks (asynchrony queues,
                     sparse averaging, the network clock), the relay's counters
    rank{r}_log/     this process's part of the EventLog so far (events.npz + events.json)

then rank 0 writes `COMPLETE` (after a barrier on the distributed backend): only complete checkpoints are
resumed. Loading uses `torch.load(..., weights_only=True)`: no pickle of arbitrary objects. A resumed run
equals the uninterrupted one bit for bit on CPU (tests kill a run and compare). A run whose plug-ins cannot be
captured refuses `--checkpoint-every` at its start, naming the plug-in (`check`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from sentinel.engine.step import Replica, StepProgram
from sentinel.errors import ConfigError, RunError
from sentinel.eventlog import EventLog
from sentinel.state import StateError, capture, restore


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` (a checkpoints folder or one step folder)."""
    root = Path(root)
    if (root / "COMPLETE").is_file():
        return root
    done = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file()) if root.is_dir() else []
    return done[-1] if done else None


def stateful(program: StepProgram) -> dict:
    """The parts of a program whose state a checkpoint holds (beyond replicas, the worker table and the log)."""
    return {
        "adversary": program.adversary,
        "relay": program.relay,
        "hooks": program.hooks,
        "codecs": list({id(c): c for c in program.codecs.values()}.values()),
        "dp_compressor": program.dp_compressor,
    }


def check(program: StepProgram) -> None:
    """ConfigError naming the plug-in whose state cannot be checkpointed (before the run starts)."""
    try:
        capture(stateful(program), exclude=(Replica, StepProgram))
    except StateError as exc:
        raise ConfigError(f"--checkpoint-every: {exc} (a checkpoint could not resume this run exactly)") from None


def _table(program: StepProgram) -> dict:
    w = program.workers
    out = {"ids": list(w.ids), "stage": list(w.stage), "live": list(w.live), "next": list(w._next_replica)}
    if program.rank_map is not None:
        out["host"] = dict(program.rank_map.host)
    return out


def save(program: StepProgram, root: Path, rank: int = 0) -> Path:
    """Write this process's state at the current step under `root`; returns the step folder."""
    d = step_dir(root, program.step)
    (d / f"rank{rank}_log").mkdir(parents=True, exist_ok=True)
    program.log.save(d / f"rank{rank}_log")
    replicas = {
        r.wid: {"module": r.module.state_dict(), "optimizer": r.optimizer.state_dict()}
        for r in program.replicas.values()
    }
    state = {
        "step": program.step,
        "world": program.world,
        "workers": _table(program),
        "replicas": replicas,
        "plugins": capture(stateful(program), exclude=(Replica, StepProgram)),
    }
    torch.save(state, d / f"rank{rank}.pt")
    return d


def mark_complete(d: Path, step: int) -> None:
    (Path(d) / "COMPLETE").write_text(f"step {step}\n")


def load(program: StepProgram, ckpt: Path, rank: int = 0) -> None:
    """Restore this process's state from a complete checkpoint folder (built from the same scenario)."""
    path = Path(ckpt) / f"rank{rank}.pt"
    if not path.is_file():
        raise RunError(f"--resume {ckpt}: no {path.name} there (was it written by another number of processes?)")
    state = torch.load(path, weights_only=True, map_location="cpu")
    world = program.world
    if state["world"] != world:
        raise RunError(
            f"checkpoint {ckpt} was written by {state['world']} processes; resume it with "
            f"--nproc {state['world']} (this run has {world})"
        )
    w, t = program.workers, state["workers"]
    w.ids[:], w.stage[:], w.live[:] = t["ids"], t["stage"], t["live"]
    w._next_replica = list(t["next"])
    if "host" in t:
        program.rank_map.host = dict(t["host"])
    program.replicas.clear()
    for wid, rs in state["replicas"].items():
        idx = w.index(wid)
        rep = Replica(wid, w.stage[idx], copy.deepcopy(program.templates[w.stage[idx]]).to(program.device), program.sc)
        rep.module.load_state_dict(rs["module"])
        rep.optimizer.load_state_dict(rs["optimizer"])
        program.replicas[idx] = rep
    restore(stateful(program), state["plugins"])
    loaded = EventLog.load(Path(ckpt) / f"rank{rank}_log")
    for name in EventLog.TABLES:
        setattr(program.log, name, getattr(loaded, name))
    for wid in loaded.workers:
        program.log.worker_index(wid)
    program.log.attacks = list(loaded.attacks)
    program.log.meta.update(loaded.meta)
    program.step = int(state["step"])


def resume_point(resume: str | Path | None, out_dir: Path | None, top: Path | None) -> Path | None:
    """The checkpoint a job resumes from: for the main run, RESUME itself (a run folder, its checkpoints folder or
    one step folder); for a twin or the confirmation, RESUME/<its sub-folder>/checkpoints (none: it starts afresh)."""
    if resume is None:
        return None
    root = Path(resume)
    if out_dir is not None and top is not None and Path(out_dir) != Path(top):
        try:
            return latest(root / Path(out_dir).relative_to(top) / "checkpoints")
        except ValueError:
            return None
    found = latest(root) or latest(root / "checkpoints")
    if found is None:
        raise ConfigError(
            f"--resume {root}: no complete checkpoint there (a step-NNNNNN folder holding COMPLETE, "
            "written by a run with --checkpoint-every)"
        )
    return found


def due(step: int, every: int, steps: int) -> bool:
    """Checkpoint after this step? Every `every` steps and after the last one (`every` 0: never)."""
    return bool(every) and (step % every == 0 or step == steps)
