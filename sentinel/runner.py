"""`run(scenario, out_dir)`: one run plus its requested twins, and everything written to disk.

Result folder:
    scenario.yaml   the scenario as run (after --set overrides)
    summary.json    headline numbers (keys: README "summary.json")
    events.csv      one row per boundary message (joined with ground truth and verdicts)
    events.npz/json the full EventLog (reloadable: `sentinel report DIR`)
    loss.png        loss curves
    report.md       a short human-readable report
If a run fails or is interrupted, what was logged so far is saved and `failure.txt` says why.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from attacks import build_adversary
from attacks.validation import white_box_attacks
from sentinel import scenario as scenario_mod
from sentinel.config import build
from sentinel.data import prepare as prepare_data
from sentinel.detectors.verifier import PublishedState, build_defence
from sentinel.engine import checkpoint
from sentinel.engine.clock import network_report
from sentinel.engine.hooks import StepHook
from sentinel.engine.sim import SimEngine
from sentinel.engine.step import StepProgram, StepState
from sentinel.errors import ConfigError, RunError
from sentinel.eventlog import EventLog
from sentinel.parallel import TaskPool, thread_count
from sentinel.progress import Progress, training_progress
from sentinel.scenario import DetectorSpec, Scenario
from sentinel.scoring.metrics import impact_metrics
from sentinel.scoring.report import finish
from sentinel.scoring.summary import build_summary, confirmation_metrics, threshold_rule


def build_engine(scenario: Scenario, log: EventLog | None = None) -> SimEngine:
    """The engine with this scenario's adversary, verifiers and response policy installed."""
    engine = SimEngine(scenario, log)
    adversary = build_adversary(scenario, engine)
    engine.set_adversary(adversary)
    verifiers, responder = build_defence(scenario, engine.mesh, engine.recompute, engine.relay.inflight)
    engine.install_defence(verifiers, responder)
    if verifiers and adversary is not None and white_box_attacks(scenario):  # read-only, for white-box attacks
        published = PublishedState(scenario)
        adversary.attach_detector_view(published.view())
        engine.hooks.insert(0, Publish(published, verifiers))
    return engine


class Publish(StepHook):
    """sim's verifiers publish their detectors' state to white-box attackers at the start of every step."""

    def __init__(self, published: PublishedState, verifiers: dict):
        self.published, self.verifiers = published, verifiers

    def before_pipeline(self, engine: StepProgram, st: StepState) -> None:
        self.published.load(PublishedState.publish({b: v.detector for b, v in self.verifiers.items()}))


def malicious_workers(engine: StepProgram) -> list[str]:
    return sorted(engine.adversary.malicious) if engine.adversary is not None else []


def twin_scenario(scenario: Scenario, kind: str) -> Scenario:
    """`clean`: no attack, the scenario's detector and response (its false positives, false bans and ARL0
    are the honest cost of the defence). `undefended`: the attack, no detector."""

    if kind == "clean":
        adv = dataclasses.replace(scenario.adversary, attacks=())
        return dataclasses.replace(scenario, adversary=adv, name=f"{scenario.name}:clean")
    return dataclasses.replace(scenario, detector=build(DetectorSpec, "none"), name=f"{scenario.name}:undefended")


def _planned_steps(scenario: Scenario) -> int:
    """Training steps `run` will do: the run, its twins and (open loop) the confirmation."""
    confirm = scenario.detector.mode == "open_loop" and scenario.scoring.confirm
    return scenario.training.steps * (1 + len(scenario.scoring.twins) + int(confirm))


def train(
    scenario: Scenario,
    out_dir: Path | None,
    progress: bool | None = None,
    label: str = "run",
    *,
    checkpoint_every: int = 0,
    resume: Path | None = None,
    top: Path | None = None,
) -> tuple:
    """Train one scenario; save its EventLog (also on failure). Returns (engine, result, wall_s).

    `checkpoint_every` N: a checkpoint every N steps and after the last under OUT_DIR/checkpoints/; `resume`: the
    run folder (or checkpoint) of an earlier run of the same scenario, resumed from its newest complete checkpoint
    (this job's own: `top` is the run's folder, so a twin finds its twin's checkpoints)."""
    log = EventLog()
    engine = build_engine(scenario, log)
    if checkpoint_every:
        checkpoint.check(engine)
    ckpt = checkpoint.resume_point(resume, out_dir, top if top is not None else out_dir)
    if ckpt is not None:
        checkpoint.load(engine, ckpt)
    bar = training_progress(scenario.training.steps, label, progress)
    t0 = time.perf_counter()

    def save(program) -> None:
        if out_dir is not None and checkpoint.due(program.step, checkpoint_every, scenario.training.steps):
            checkpoint.mark_complete(checkpoint.save(program, out_dir / "checkpoints"), program.step)

    try:
        result = engine.run(on_step=bar, on_checkpoint=save)
    except BaseException as exc:
        bar.close()
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            log.canonicalize().save(out_dir)
            (out_dir / "failure.txt").write_text(
                f"run failed at step {engine.step}: {exc!r}\n\n{traceback.format_exc()}"
            )
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RunError(
            f"run {scenario.name!r} failed at step {engine.step}: {exc.__class__.__name__}: {exc}"
            + (f" (partial EventLog and traceback saved in {out_dir})" if out_dir else "")
        ) from exc
    bar.close()
    log.canonicalize()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        log.save(out_dir)
    return engine, result, time.perf_counter() - t0


def twin_key(sc: Scenario, label: str) -> str:
    """The twin cache entry of a twin scenario: its label and a hash of the scenario apart from its name."""
    plain = {k: v for k, v in sc.to_dict().items() if k not in ("name", "description", "sweep")}
    return f"{label}-{hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]}"


def run_twin(sc: Scenario, out_dir: Path, trainer, progress, label: str, cache: Path | None) -> EventLog:
    """Train a twin, or reuse an identical one from `cache` (a sweep over attacks shares one clean twin).

    Identical means the same scenario apart from its name; the cache entry is keyed by a hash of it and
    written by one process at a time (an exclusive lock), so parallel sweep points never train it twice.
    """
    if cache is None:
        engine, _, _ = trainer(sc, out_dir, progress, label=label)
        return engine.log
    entry = Path(cache) / twin_key(sc, label)
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process exits, even on a crash
        if not (entry / "done").is_file():
            shutil.rmtree(entry, ignore_errors=True)
            trainer(sc, entry, progress, label=label)
            (entry / "done").write_text("")
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(entry, out_dir, ignore=shutil.ignore_patterns("done"))
    return EventLog.load(out_dir)


def _twin_task(task: tuple, sink) -> str:
    """Pool task: one twin (scenario as a dict, folder, label, cache) trained or reused; returns its folder."""

    data, out_dir, label, cache = task
    run_twin(scenario_mod.validate(data), Path(out_dir), train, sink, label, Path(cache) if cache else None)
    return out_dir


def run_twins(
    scenario: Scenario, out_dir: Path, trainer, progress, cache: Path | None, jobs: int, main: Callable[[], Any]
) -> tuple[dict[str, EventLog], Any]:
    """The twins of `scenario` and `main()` (the run itself); with `jobs > 1` the twins train in
    `jobs - 1` processes of the shared pool while `main()` trains here (the plain `train` only: a custom
    trainer, checkpoints or a resume keep the twins in this process). Returns (twin logs, main's result)."""

    kinds = list(scenario.scoring.twins)
    if jobs <= 1 or not kinds:
        twins = {
            k: run_twin(twin_scenario(scenario, k), out_dir / f"twin_{k}", trainer, progress, k, cache) for k in kinds
        }
        return twins, main()
    tasks = [
        (twin_scenario(scenario, k).to_dict(), str(out_dir / f"twin_{k}"), k, str(cache) if cache else None)
        for k in kinds
    ]
    failures = []
    with TaskPool(_twin_task, tasks, jobs - 1, progress, thread_count(jobs)[0], inline=False) as pool:
        result = main()
        for task, _, error in pool.results():
            if error is not None:
                failures.append(f"twin {task[2]}: {error}")
    if failures:
        raise RunError("; ".join(failures))
    return {k: EventLog.load(out_dir / f"twin_{k}") for k in kinds}, result


def run(
    scenario: Scenario,
    out_dir: Path,
    progress=None,
    backend: str = "sim",
    trainer=None,
    twin_cache: Path | None = None,
    checkpoint_every: int = 0,
    resume: Path | None = None,
    jobs: int = 1,
) -> dict:
    """Run the scenario (and its twins) and write the result folder. Returns the summary.

    `trainer` replaces `train` (same signature and contract); the dist backend passes its own (with its own
    checkpoint options). `twin_cache`: a folder where identical twins are shared between runs (sweeps).
    `checkpoint_every`, `resume`: checkpoints of every job (run, twins, confirmation) and resuming from them.
    `progress`: a shared progress the run's steps count in (sweeps), or a flag: False silent, None/True
    one progress over the run, its twins and its confirmation (bar on a terminal, lines otherwise).
    `jobs`: processes for the twins and the run together (`sentinel run --jobs`; sim without checkpoints).
    """
    out_dir = Path(out_dir)
    if trainer is not None or checkpoint_every or resume is not None:
        jobs = 1  # the twins' processes run the plain `train`
    trainer = trainer or functools.partial(train, checkpoint_every=checkpoint_every, resume=resume, top=out_dir)
    own = not hasattr(progress, "job")
    bar = Progress(_planned_steps(scenario), scenario.name, enabled=progress is not False) if own else progress
    try:
        return _run(scenario, out_dir, bar, backend, trainer, twin_cache, jobs)
    finally:
        if own:
            bar.close()


def _run(
    scenario: Scenario, out_dir: Path, progress, backend: str, trainer, twin_cache: Path | None, jobs: int
) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scenario.yaml").write_text(yaml.safe_dump(scenario.to_dict(), sort_keys=False))
    prepare_data(scenario, out_dir)  # a BPE tokenizer trained once, kept in the result folder for twins and reruns
    t0 = time.perf_counter()
    twins, (engine, result, _) = run_twins(
        scenario,
        out_dir,
        trainer,
        progress,
        twin_cache,
        jobs,
        lambda: trainer(scenario, out_dir, progress, label=scenario.name),
    )
    sc, p = scenario, scenario.pipeline
    tokens_per_step = p.microbatches * sc.data.batch_size * sc.model.seq_len
    impact = impact_metrics(engine.log, twins, engine.data.optimum_loss, tokens_per_step) if twins else None
    log = engine.log
    log.meta.update(
        malicious=malicious_workers(engine),
        optimum_loss=engine.data.optimum_loss,
        backend=backend,
        threshold_rule=threshold_rule(scenario),
    )  # `sentinel report` re-scores without plug-in code
    net = network_report(engine)  # {} when transport.network.enabled is false
    log.meta["transport"] = net
    summary = build_summary(
        log,
        scenario=scenario,
        backend=backend,
        malicious=malicious_workers(engine),
        result=result,
        bytes_sent=engine.bytes_sent,
        wall_s=time.perf_counter() - t0,
        detector_s=engine.verifier_s,
        optimum_loss=engine.data.optimum_loss,
        impact=impact,
        sim_time_s=net.get("sim_time_s"),
        clean=twins.get("clean"),
    )
    summary["transport"].update(net)  # simulated clock: sim_tokens_per_s, dp_bytes_sent, ... (network.py)
    summary["cost"]["recomputed_messages"] = engine.recomputed_messages()  # duplication-style detectors
    log.save(out_dir)
    confirm = confirm_scenario(scenario, summary)
    if confirm is None and scenario.detector.mode == "open_loop" and scenario.scoring.confirm:
        progress.update(scenario.training.steps, "no confirmation run")  # planned, not needed
    if confirm is not None:  # open loop: confirm the recommended threshold in closed loop
        c_engine, _, _ = trainer(confirm, out_dir / "confirm", progress, label="confirm")
        c_engine.log.meta.update(malicious=malicious_workers(c_engine), backend=backend)
        c_engine.log.save(out_dir / "confirm")
        (out_dir / "confirm" / "scenario.yaml").write_text(yaml.safe_dump(confirm.to_dict(), sort_keys=False))
        rule = summary["detection"]["roc"]["rule"]
        summary["detection"]["roc"]["confirmation"] = confirmation_metrics(
            c_engine.log,
            malicious_workers(c_engine),
            rule["recommended"],
            rule["threshold_key"],
            rule["recommended"]["threshold"],
        )
    return finish(out_dir, log, summary)


def confirm_scenario(scenario: Scenario, summary: dict) -> Scenario | None:
    """The closed-loop run at the open-loop run's recommended threshold (None when there is none to run)."""

    rule = (summary["detection"].get("roc") or {}).get("rule")
    if scenario.detector.mode != "open_loop" or not scenario.scoring.confirm or not rule:
        return None
    k = rule["recommended"]["threshold"]
    if k is None:
        return None
    d = scenario.to_dict()
    d["name"] = f"{scenario.name}:confirm"
    d["detector"].update({rule["threshold_key"]: k, "mode": "closed_loop"})
    d.setdefault("scoring", {})["twins"] = []
    try:
        return scenario_mod.validate(d)
    except ConfigError as exc:
        rule["recommended"]["note"] = f"no confirmation run: {exc}"
        return None
