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
import sys
import time
import traceback
from pathlib import Path

import yaml

from attacks import build_adversary
from attacks.validation import white_box_attacks
from sentinel.detectors import build_defence
from sentinel.detectors.verifier import PublishedState
from sentinel.engine import checkpoint
from sentinel.engine.clock import network_report
from sentinel.engine.hooks import StepHook
from sentinel.engine.sim import SimEngine
from sentinel.engine.step import StepProgram, StepState
from sentinel.errors import RunError
from sentinel.eventlog import EventLog
from sentinel.scenario import Scenario
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
    from sentinel.config import build
    from sentinel.scenario import DetectorSpec

    if kind == "clean":
        adv = dataclasses.replace(scenario.adversary, attacks=())
        return dataclasses.replace(scenario, adversary=adv, name=f"{scenario.name}:clean")
    return dataclasses.replace(scenario, detector=build(DetectorSpec, "none"), name=f"{scenario.name}:undefended")


class _Progress:
    """tqdm bar on a terminal; otherwise a line on stderr every ~10% of the run."""

    def __init__(self, total: int, label: str, enabled: bool | None):
        self.total, self.label = total, label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="step", leave=False, file=sys.stderr)
        self.every = max(1, total // 10)
        self.last_val: float | None = None

    def __call__(self, step: int, loss: float, val: float | None) -> None:
        if val is not None:
            self.last_val = val
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", val=f"{self.last_val:.3f}" if self.last_val else "-")
        elif self.enabled and (step % self.every == 0 or step == self.total):
            val_txt = f" val {self.last_val:.4f}" if self.last_val is not None else ""
            print(f"[{self.label}] step {step}/{self.total} loss {loss:.4f}{val_txt}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(scenario: Scenario, out_dir: Path | None, progress: bool | None = None, label: str = "run", *,
          checkpoint_every: int = 0, resume: Path | None = None, top: Path | None = None) -> tuple:
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
    bar = _Progress(scenario.training.steps, label, progress)
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


def run_twin(sc: Scenario, out_dir: Path, trainer, progress, label: str, cache: Path | None) -> EventLog:
    """Train a twin, or reuse an identical one from `cache` (a sweep over attacks shares one clean twin).

    Identical means the same scenario apart from its name; the cache entry is keyed by a hash of it and
    written by one process at a time (an exclusive lock), so parallel sweep points never train it twice.
    """
    if cache is None:
        engine, _, _ = trainer(sc, out_dir, progress, label=label)
        return engine.log
    plain = {k: v for k, v in sc.to_dict().items() if k not in ("name", "description", "sweep")}
    key = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]
    entry = Path(cache) / f"{label}-{key}"
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


def run(scenario: Scenario, out_dir: Path, progress: bool | None = None, backend: str = "sim", trainer=None,
        twin_cache: Path | None = None, checkpoint_every: int = 0, resume: Path | None = None) -> dict:
    """Run the scenario (and its twins) and write the result folder. Returns the summary.

    `trainer` replaces `train` (same signature and contract); the dist backend passes its own (with its own
    checkpoint options). `twin_cache`: a folder where identical twins are shared between runs (sweeps).
    `checkpoint_every`, `resume`: checkpoints of every job (run, twins, confirmation) and resuming from them.
    """
    out_dir = Path(out_dir)
    trainer = trainer or functools.partial(train, checkpoint_every=checkpoint_every, resume=resume, top=out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scenario.yaml").write_text(yaml.safe_dump(scenario.to_dict(), sort_keys=False))
    t0 = time.perf_counter()
    twins = {}
    for kind in scenario.scoring.twins:
        twins[kind] = run_twin(twin_scenario(scenario, kind), out_dir / f"twin_{kind}", trainer, progress, kind,
                               twin_cache)
    engine, result, _ = trainer(scenario, out_dir, progress, label=scenario.name)
    sc, p = scenario, scenario.pipeline
    tokens_per_step = p.microbatches * sc.data.batch_size * sc.model.seq_len
    impact = impact_metrics(engine.log, twins, engine.data.optimum_loss, tokens_per_step) if twins else None
    log = engine.log
    log.meta.update(malicious=malicious_workers(engine), optimum_loss=engine.data.optimum_loss, backend=backend,
                    threshold_rule=threshold_rule(scenario))  # `sentinel report` re-scores without plug-in code
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
    if confirm is not None:  # open loop: confirm the recommended threshold in closed loop
        c_engine, _, _ = trainer(confirm, out_dir / "confirm", progress, label="confirm")
        c_engine.log.meta.update(malicious=malicious_workers(c_engine), backend=backend)
        c_engine.log.save(out_dir / "confirm")
        (out_dir / "confirm" / "scenario.yaml").write_text(yaml.safe_dump(confirm.to_dict(), sort_keys=False))
        rule = summary["detection"]["roc"]["rule"]
        summary["detection"]["roc"]["confirmation"] = confirmation_metrics(
            c_engine.log, malicious_workers(c_engine), rule["recommended"], rule["threshold_key"],
            rule["recommended"]["threshold"])
    return finish(out_dir, log, summary)


def confirm_scenario(scenario: Scenario, summary: dict) -> Scenario | None:
    """The closed-loop run at the open-loop run's recommended threshold (None when there is none to run)."""
    from sentinel import scenario as scenario_mod
    from sentinel.errors import ConfigError

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
