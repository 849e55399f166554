"""Everything `run`, `sweep` and `validate` check before any work starts, written once for all three.

`sentinel validate SCENARIO [flags of run]` runs exactly the checks `sentinel run` runs with the same
flags, without creating anything: the scenario (bounded YAML, schema, cross-checks), the flags, the dist
backend's limits and resume folder, the output folder, the memory budget (sentinel/budget.py), and every
point of the file's `sweep.grid` as `sentinel sweep` expands it (a file with a broken grid is a broken
file: `run` refuses it too, so validate, run and sweep accept the same files; sweep also needs a grid).
Any problem is a `ConfigError` (exit 2) with its location; nothing has been written or started.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
from pathlib import Path

from attacks.assignment import malicious_per_stage, open_stages
from proofs.honest_majority import prob_stage_compromised
from sentinel import budget, sweep
from sentinel import scenario as scenario_mod
from sentinel.distributed.mapping import check_world, default_nproc
from sentinel.distributed.runtime import check_supported
from sentinel.engine.checkpoint import latest
from sentinel.errors import ConfigError

PSEUDO_FS = ("/proc", "/sys", "/dev")  # kernel interfaces, never result folders
MAX_GRID_POINTS = 10_000  # a sweep of more points is a typo in the grid, not an experiment
MAX_NPROC = 4096
MAX_TIMEOUT_S = 7 * 86400.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """A command's inputs that decide whether it may start (argparse fields of the same names)."""

    scenario: str
    command: str = "run"  # run | sweep | validate
    set: tuple[str, ...] = ()
    out: str | None = None
    backend: str = "sim"
    nproc: int | None = None
    verifiers: int | None = None
    timeout: float = 60.0
    checkpoint_every: int = 0
    resume: str | None = None
    device: str | None = None
    force: bool = False
    max_memory: float | None = None

    @classmethod
    def from_args(cls, args, command: str) -> Request:
        names = {f.name for f in dataclasses.fields(cls)} - {"command"}
        values = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
        values["set"] = tuple(values.get("set", ()))
        return cls(command=command, **values)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What passed: the scenario, where results go, the estimate, and the sweep's points."""

    scenario: scenario_mod.Scenario
    out: Path
    estimate: budget.Estimate
    points: list[dict] = dataclasses.field(default_factory=list)


def check(req: Request) -> Plan:
    """Every check of the request's command; ConfigError (exit 2) with every problem found, else the plan."""
    sc = scenario_mod.load(req.scenario, list(req.set))
    _check_flags(req)
    nproc = None
    if req.backend == "dist":
        nproc = _check_dist(req, sc)
    elif req.resume is not None:
        check_resume(req.resume, 1)  # sim writes one part (rank0.pt)
    out = (
        check_out_dir(req.out, "--out")
        if req.out is not None
        else default_out(sc.name if req.command != "sweep" else Path(req.scenario).stem + "-sweep")
    )
    limit, source = budget.budget_from(req.max_memory)
    est = budget.estimate(sc, req.backend, nproc)
    if not req.force:
        try:
            budget.check(sc, est, limit, source)
        except ConfigError as exc:
            raise ConfigError([f"{req.scenario}: {p}" for p in exc.problems]) from None
    points = []
    if req.command == "sweep" or sc.sweep.grid:  # the whole file is checked: run refuses a broken grid too
        points = check_sweep(req, None if req.force else limit, source)
    return Plan(sc, out, est, points)


def _check_flags(req: Request) -> None:
    if req.backend != "dist":
        used = [f for f in ("nproc", "verifiers", "device") if getattr(req, f) is not None]
        if used:
            raise ConfigError(f"--{used[0].replace('_', '-')}: only used with --backend dist")
    if not (math.isfinite(req.timeout) and 0 < req.timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"--timeout {req.timeout}: seconds a message may take, 0 < timeout <= {MAX_TIMEOUT_S:g}")
    if not 0 <= req.checkpoint_every <= scenario_mod.MAX_STEPS:
        raise ConfigError(
            f"--checkpoint-every {req.checkpoint_every}: steps between checkpoints, "
            f"0 (never) to {scenario_mod.MAX_STEPS:,}"
        )
    if req.nproc is not None and not 1 <= req.nproc <= MAX_NPROC:
        raise ConfigError(f"--nproc {req.nproc}: processes, 1 to {MAX_NPROC}")


def _check_dist(req: Request, sc) -> int:
    """The dist backend's limits, checked before torchrun starts a single process."""

    try:
        check_supported(sc)
    except ConfigError as exc:
        raise ConfigError([f"{req.scenario}: {p}" for p in exc.problems]) from None
    nproc = req.nproc or default_nproc(sc, req.verifiers)
    check_world(sc.pipeline.stages, sc.pipeline.replicas, nproc, req.verifiers)
    if req.resume is not None:
        check_resume(req.resume, nproc)
    return nproc


def check_resume(resume: str, nproc: int | None = None) -> Path:
    """`--resume DIR`: a run folder, its checkpoints folder or a step folder holding a complete checkpoint."""

    root = Path(resume)
    try:
        if not root.is_dir():
            raise ConfigError(
                f"--resume {resume}: "
                + ("not a folder" if root.exists() else "no such folder")
                + "; give a previous run's result folder (it holds checkpoints/)"
            )
        found = latest(root) or latest(root / "checkpoints")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume {resume}: cannot read it ({exc})") from None
    if found is None:
        raise ConfigError(
            f"--resume {resume}: no complete checkpoint there (a step-NNNNNN folder holding "
            "COMPLETE); run with --checkpoint-every N to write checkpoints"
        )
    ranks = len(list(found.glob("rank*.pt")))
    if nproc is not None and ranks and ranks != nproc:
        raise ConfigError(
            f"--resume {resume}: {found.name} was written by {ranks} processes; resume it with "
            f"--nproc {ranks} (this run would have {nproc})"
        )
    return found


def check_sweep(req: Request, limit: int | None, source: str) -> list[dict]:
    """The sweep's grid as `sentinel sweep` expands it, every point validated and within the budget."""

    base = scenario_mod.load(req.scenario, list(req.set))
    grid = base.sweep.grid
    sizes = [len(v) if isinstance(v, list) else 1 for v in grid.values()]
    if math.prod(sizes) > MAX_GRID_POINTS:
        raise ConfigError(
            f"sweep.grid: {' x '.join(map(str, sizes))} = {math.prod(sizes):,} points; at most "
            f"{MAX_GRID_POINTS:,}: shorten a list"
        )
    points = sweep.grid_points(base)
    for p in points:
        overrides = list(req.set) + sweep.plan.overrides(p)
        try:
            sc = scenario_mod.load(req.scenario, overrides)
            try:
                budget.check(sc, budget.estimate(sc, req.backend), limit, source)
            except ConfigError as exc:
                raise ConfigError([f"{req.scenario}: {msg}" for msg in exc.problems]) from None
        except ConfigError as exc:
            raise ConfigError([f"sweep point {p}: {msg}" for msg in exc.problems]) from None
    return points


def safe_name(name: str) -> str:
    """A scenario name as one folder name: [A-Za-z0-9._-] only, no leading dot or dash, at most 100 chars."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:100].rstrip(".-") or "unnamed"


def default_out(name: str, root: str | Path = "runs") -> Path:
    """runs/NAME-TIMESTAMP (NAME sanitised: a scenario's name never leaves runs/), checked like --out."""
    root = Path(root)
    check_out_dir(str(root), "the default result folder (runs/)")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{safe_name(name)}-{stamp}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def check_out_dir(path: str, flag: str = "--out") -> Path:
    """A folder results may be written to: not a file, not under /proc, /sys or /dev, creatable, writable.

    Nothing is created here; `run` creates the folder once every check has passed.
    """
    if not path or "\x00" in path:
        raise ConfigError(f"{flag} {path!r}: give a folder name" + (" (it holds a NUL byte)" if path else ""))
    real = Path(os.path.realpath(path))  # follows the symbolic links that exist already
    for fs in PSEUDO_FS:
        if real == Path(fs) or Path(fs) in real.parents:
            raise ConfigError(
                f"{flag} {path}: lies under {fs}, a kernel interface, not a place for results; give a folder on a disk"
            )
    if any(len(os.fsencode(part)) > 255 for part in real.parts) or len(os.fsencode(str(real))) > 4000:
        raise ConfigError(f"{flag} {path[:80]}...: a name longer than the filesystem allows (255 bytes a part)")
    try:
        existing = next(p for p in (real, *real.parents) if p.exists())
        if existing == real and not real.is_dir():
            raise ConfigError(
                f"{flag} {path}: an existing file, not a folder; give a folder (it is created if missing)"
            )
        if not existing.is_dir():
            raise ConfigError(f"{flag} {path}: {existing} is a file, so no folder can be made under it")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: {existing} is not writable; give a folder you can write to")
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot use it ({exc.strerror or exc})") from None
    return Path(path)


def check_out_file(path: str, flag: str = "--out") -> Path:
    """A file a command may write: not a folder, its folder exists and is writable, not under /proc etc."""
    if not path or "\x00" in path:
        raise ConfigError(f"{flag} {path!r}: give a file name" + (" (it holds a NUL byte)" if path else ""))
    target = Path(path)
    if path.endswith(os.sep) or (target.exists() and target.is_dir()):
        raise ConfigError(f"{flag} {path}: a folder; give a file name")
    folder = str(target.parent) if str(target.parent) else "."
    check_out_dir(folder, flag)
    if not Path(os.path.realpath(folder)).is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist; create it first")
    return target


def warnings_for(sc: scenario_mod.Scenario) -> list[str]:
    """Non-fatal notes about a valid scenario (printed by `sentinel validate` and `sentinel run`).

    Lemma 1 (proofs/honest_majority.md): SENTINEL assumes an honest majority in every stage. This
    testbed's `placement: random` places the same number of malicious replicas in each open stage, so
    the assumption holds by construction; a real deployment that assigns workers to stages uniformly at
    random does not get that guarantee. We report the probability it would be broken for the same
    number of malicious workers, and warn when it is above 1%.

    SENTINEL also assumes that the replicas of a stage are exchangeable: they hold the same weights and see
    i.i.d. microbatches, so one pooled baseline per stream and the peer tests compare like with like. The response
    policy's peer score test keeps to cohorts of exchangeable replicas (`MeshControl.cohort`): async stragglers are
    compared with stragglers only, and replicas that do not all-reduce every step (`dp.sync: sparse_avg` or `none`:
    their weights diverge) with nobody. We warn about the latter: without that test, slow attacks that cross no
    fence go unbanned, and the pooled baselines still mix diverging replicas. Measured (issue-18 note, stop 37):
    `slow_drift` and `warmup_poisoning` under sparse averaging were banned on none of 6 seeds, and held-out
    byte-level CSV text (8 x 64, 100 steps, seed 31) banned 2 honest replicas in five meshes and schedules (26 with
    the score test on: 3-7 in each), synchronous DP none.
    """
    out = []
    adv, p = sc.adversary, sc.pipeline
    if sc.detector.name == "sentinel" and sc.detector.mode == "closed_loop":
        if sc.dp.sync != "allreduce" and p.replicas > 1:
            out.append(
                f"dp.sync: {sc.dp.sync}: the replicas of a stage hold diverging weights, so SENTINEL's peer score test "
                "is off (it would single out honest replicas) and slow attacks that cross no fence go unbanned "
                "(slow_drift, warmup_poisoning), while its pooled baselines still mix the replicas (2 honest bans "
                "in five 100-step runs on held-out text; see README, 'Compressed and asynchronous traffic'); "
                "detector.mode: open_loop measures the flags without acting on them"
            )
    if adv.attacks and adv.placement == "random" and adv.fraction > 0:
        stages = open_stages(p.stages, adv.protect)
        f = malicious_per_stage(adv.fraction, p.replicas) * len(stages)
        protect_ends = len(stages) == p.stages - 2 and p.stages > 2
        try:
            prob = prob_stage_compromised(
                p.stages, p.replicas, f, exact=p.stages * p.replicas <= 4096, protect_ends=protect_ends
            )
        except ValueError:
            return out
        if prob > 0.01:
            out.append(
                f"adversary.fraction: {f} malicious workers assigned uniformly at random over the mesh (not per stage, "
                f"as here) would break some stage's honest majority with probability {prob:.3f} (Lemma 1, "
                "proofs/honest_majority.md); results here assume the per-stage placement"
            )
    return out
