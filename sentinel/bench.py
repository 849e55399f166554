"""`sentinel bench`: performance as ratios measured side by side in one invocation.

Absolute times on a shared machine are noise; a ratio of two configurations timed alternately in
the same process is a figure. Each benchmark returns a dict merged into the printed JSON.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sentinel import scenario as scenario_mod
from sentinel.data import Dataset
from sentinel.engine.optim import lr_at, make_optimizer
from sentinel.engine.sim import SimEngine
from sentinel.model import build_stages, loss_fn

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios" / "bench"
BENCHMARKS: list[Callable[[bool], dict]] = []


def benchmark(fn: Callable[[bool], dict]) -> Callable[[bool], dict]:
    BENCHMARKS.append(fn)
    return fn


def load_bench(name: str, *overrides: str) -> scenario_mod.Scenario:
    return scenario_mod.load(SCENARIOS / f"{name}.yaml", list(overrides))


class PlainLoop:
    """The reference: one unsplit model, one optimizer, the same microbatches, no messages."""

    def __init__(self, sc: scenario_mod.Scenario):
        self.sc, self.data = sc, Dataset(sc)
        self.model = build_stages(sc.model, sc.model.vocab or self.data.vocab, 1, sc.seed)[0]
        self.opt = make_optimizer(self.model.parameters(), sc.training)
        self.step = 0

    def train_step(self) -> float:
        batch = self.data.train_batch(self.step)  # M, B, T+1
        losses = []
        for mb in batch:
            loss = loss_fn(self.model(mb[:, :-1]), mb[:, 1:])
            loss.backward()
            losses.append(loss.item())
        for p in self.model.parameters():
            p.grad.div_(len(batch))
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, self.sc.training)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return sum(losses) / len(losses)


def time_steps(trainer, steps: int) -> float:
    """Seconds per step over `steps` steps (after one untimed warm-up step)."""
    trainer.train_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    return (time.perf_counter() - t0) / steps


def alternate(factories: dict[str, Callable[[], object]], reps: int, steps: int,
              after: Callable[[str, object, float], None] | None = None) -> dict[str, float]:
    """Median seconds per step of each trainer, timed in alternation to share the machine's noise.

    `after(name, trainer, seconds_per_step)`, if given, sees each trainer once it has been timed."""
    times: dict[str, list[float]] = {k: [] for k in factories}
    for _ in range(reps):
        for name, make in factories.items():
            trainer = make()
            times[name].append(time_steps(trainer, steps))
            if after is not None:
                after(name, trainer, times[name][-1])
    return {k: statistics.median(v) for k, v in times.items()}


@benchmark
def engine_overhead(quick: bool) -> dict:
    sc = load_bench("engine")
    t = alternate(
        {"plain": lambda: PlainLoop(sc), "engine": lambda: SimEngine(sc)},
        reps=2 if quick else 5,
        steps=3 if quick else 8,
    )
    return {
        "engine_overhead": t["engine"] / t["plain"],
        "engine_overhead_detail": {
            "plain_s_per_step": t["plain"],
            "sim_s_per_step": t["engine"],
            "stages": sc.pipeline.stages,
            "replicas": sc.pipeline.replicas,
        },
    }


@benchmark
def scale_cost_ratio(quick: bool) -> dict:
    small = load_bench("scale", "pipeline.replicas=1")
    big = load_bench("scale", "pipeline.replicas=11")
    t = alternate(
        {"16": lambda: SimEngine(small), "176": lambda: SimEngine(big)}, reps=1 if quick else 3, steps=2 if quick else 4
    )
    return {
        "scale_cost_ratio": t["176"] / t["16"],
        "scale_detail": {
            "workers_16_s_per_step": t["16"],
            "workers_176_s_per_step": t["176"],
            "microbatches_per_step": small.pipeline.microbatches,
        },
    }


@benchmark
def detector_overhead(quick: bool) -> dict:
    """Wall time per step with SENTINEL (closed loop, default config) over no detector; duplication beside it.

    Same engine scenario, same data; the detector runs at every boundary message. No attack, and
    `on_flag: accept`: verdicts, strikes and peer tests all run as usual, but a false positive does not
    drop its microbatch (which would remove training work and make the detector look cheaper than free),
    so the runs do the same training work and the ratio is the verifier's and responder's cost. The
    figure is the median over repetitions of the ratio of the two runs timed one after the other
    (paired, which cancels the machine's slow drifts); the detail gives the ratio of the medians too,
    the seconds per step spent inside the verifier (`Transport.verifier_s`: an overhead well above
    that share means the verifier slows the training itself, e.g. threads fighting over the cores), and
    the 1-minute load average before and after: other processes inflate every figure, and the ratios
    with them.

    Duplication's expected cost: a trusted recomputation of every message is one stage forward per
    activation and one stage forward plus an input-gradient backward per gradient, i.e. about 9 of the
    12 forward-equivalents a 4-stage step costs (F + 2F backward per stage): ~1.75x.
    """
    from sentinel.runner import build_engine

    accept = "response.on_flag=accept"
    configs = {
        "none": load_bench("engine"),
        "sentinel": load_bench("engine", "detector.name=sentinel", "detector.warmup_steps=1", accept),
        "duplication": load_bench("engine", "detector.name=duplication", accept),
    }
    reps, steps = (2, 3) if quick else (7, 8)
    times: dict[str, list[float]] = {k: [] for k in configs}
    verifier_s: dict[str, list[float]] = {k: [] for k in configs}

    def record(name: str, engine, s_per_step: float) -> None:
        times[name].append(s_per_step)
        verifier_s[name].append(engine.verifier_s / (steps + 1))  # the warm-up step and the timed ones

    def paired(name: str) -> float:
        return statistics.median(a / b for a, b in zip(times[name], times["none"]))

    load_before = os.getloadavg()[0]
    t = alternate({k: (lambda sc=sc: build_engine(sc)) for k, sc in configs.items()}, reps=reps, steps=steps,
                  after=record)
    return {
        "detector_overhead": paired("sentinel"),
        "duplication_overhead": paired("duplication"),
        "detector_detail": {
            **{k + "_s_per_step": v for k, v in t.items()},
            "ratio_of_medians": {k: t[k] / t["none"] for k in ("sentinel", "duplication")},
            **{k + "_verifier_s_per_step": statistics.median(verifier_s[k]) for k in ("sentinel", "duplication")},
            "load_avg_1min": [load_before, os.getloadavg()[0]],
        },
    }


@benchmark
def dist_vs_sim(quick: bool) -> dict:
    """Seconds per step of `dist` on 4 processes (a verifier + 3 stage ranks) over `sim`, same scenario (engine.yaml, S=3).

    dist's figure is the relay's steady-state step time (first step excluded, evaluation excluded); sim's is
    `time_steps` in this process. The detail splits dist's step: time the relay spends blocked waiting
    for messages, and the worker ranks' compute vs waiting, per step.
    """
    import json
    import tempfile

    from sentinel.distributed.launch import launch
    from sentinel.distributed.runtime import Options

    steps = 4 if quick else 12
    overrides = ["pipeline.stages=3", f"training.steps={steps}", f"training.eval_every={steps}"]
    sc = load_bench("engine", *overrides)
    sim_s = alternate({"sim": lambda: SimEngine(sc)}, reps=1 if quick else 2, steps=steps - 1)["sim"]
    with tempfile.TemporaryDirectory() as tmp:
        launch(str(SCENARIOS / "engine.yaml"), Path(tmp), overrides, nproc=4, options=Options(timeout_s=300),
               quiet=True, timeout_s=900, output=Path(tmp) / "dist.log")
        timing = json.loads((Path(tmp) / "dist_timing.json").read_text())
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    workers = [r for r in timing["ranks"] if r.get("role") == "worker"]
    return {
        "dist_vs_sim": timing["s_per_step"] / sim_s,
        "dist_vs_sim_detail": {
            "sim_s_per_step": sim_s,
            "dist_s_per_step": timing["s_per_step"],
            "processes": timing["world"],
            "verifiers": timing["verifiers"],
            "backend": timing["backend"],
            "coordinator_wait_s_per_step": timing["coordinator_wait_s"] / steps,
            "worker_busy_s_per_step": sum(r["wall_s"] - r["wait_s"] for r in workers) / steps,
            "worker_wait_s_per_step": sum(r["wait_s"] for r in workers) / steps,
            "messages_per_step": summary["transport"]["messages"] / steps,
            "wire_bytes_per_step": summary["transport"]["bytes_sent"] / steps,
        },
    }


def _dist_timing(name: str, overrides: list[str], nproc: int, verifiers: int | None = None) -> dict:
    """dist_timing.json of a distributed run of a bench scenario (one intra-op thread per process)."""
    import json
    import tempfile

    from sentinel.distributed.launch import launch
    from sentinel.distributed.runtime import Options

    with tempfile.TemporaryDirectory() as tmp:
        launch(str(SCENARIOS / f"{name}.yaml"), Path(tmp), overrides, nproc=nproc,
               options=Options(timeout_s=300, verifiers=verifiers), quiet=True, timeout_s=1800,
               output=Path(tmp) / "dist.log")
        return json.loads((Path(tmp) / "dist_timing.json").read_text())


def _sim_s_per_step(name: str, overrides: list[str], steps: int) -> float:
    """sim's seconds per step of the same scenario on one intra-op thread (as each distributed process has)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return alternate({"sim": lambda: SimEngine(load_bench(name, *overrides))}, reps=1, steps=steps)["sim"]
    finally:
        torch.set_num_threads(threads)


@benchmark
def dist_scale(quick: bool) -> dict:
    """The distributed backend at the paper's mesh size: seconds per step at 176 workers (16 x 11) over 16 workers
    (16 x 1), same 22 microbatches, each on 31 processes (a verifier per boundary, one rank per stage); and the
    same 176-worker run over sim on one thread (`dist_vs_sim_176`; goal <= 1.5 on 2 cores, where the ranks'
    compute overlaps). The detail has each verifier's messages per second of relaying."""
    steps = 3 if quick else 6
    common = [f"training.steps={steps}", f"training.eval_every={steps}"]
    t16 = _dist_timing("scale", [*common, "pipeline.replicas=1"], nproc=31)
    t176 = _dist_timing("scale", [*common, "pipeline.replicas=11"], nproc=31)
    sim176 = _sim_s_per_step("scale", [*common, "pipeline.replicas=11"], steps=steps - 1)
    return {
        "dist_scale": t176["s_per_step"] / t16["s_per_step"],
        "dist_vs_sim_176": t176["s_per_step"] / sim176,
        "dist_scale_detail": {
            "dist_16_s_per_step": t16["s_per_step"], "dist_176_s_per_step": t176["s_per_step"],
            "sim_176_s_per_step": sim176, "processes": t176["world"], "verifiers": t176["verifiers"],
            "verifier_messages_per_s_16": t16["verifier_messages_per_s"],
            "verifier_messages_per_s_176": t176["verifier_messages_per_s"],
        },
    }


@benchmark
def dist_detector_overhead(quick: bool) -> dict:
    """SENTINEL on the distributed backend (verifiers in their own processes): seconds per step with the detector
    over without (closed loop, `on_flag: accept` so both train the same), engine.yaml with S=3 on 5 processes
    (2 verifiers + 3 stage ranks). Goal <= 1.02: the detector's work is off the workers' critical path."""
    steps = 4 if quick else 12
    common = ["pipeline.stages=3", f"training.steps={steps}", f"training.eval_every={steps}"]
    off = _dist_timing("engine", common, nproc=5)
    on = _dist_timing("engine", [*common, "detector.name=sentinel", "detector.warmup_steps=1",
                                 "response.on_flag=accept"], nproc=5)
    return {"dist_detector_overhead": on["s_per_step"] / off["s_per_step"],
            "dist_detector_detail": {"off_s_per_step": off["s_per_step"], "on_s_per_step": on["s_per_step"],
                                     "verifier_s": sum(r.get("verifier_s", 0.0) for r in on["ranks"]) / steps}}


def run_all(quick: bool = False) -> dict:
    out: dict = {"quick": quick, "torch_threads": torch.get_num_threads()}
    for fn in BENCHMARKS:
        out.update(fn(quick))
    return out
