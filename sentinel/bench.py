"""`sentinel bench`: performance as ratios measured side by side in one invocation.

Absolute times on a shared machine are noise; a ratio of two configurations timed alternately in
the same process is a figure. Each benchmark returns a dict merged into the printed JSON.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sentinel import scenario as scenario_mod
from sentinel.data import Dataset
from sentinel.distributed.launch import launch
from sentinel.distributed.runtime import Options
from sentinel.engine.optim import lr_at, make_optimizer
from sentinel.engine.sim import SimEngine
from sentinel.model import build_stages, describe, dims, loss_fn
from sentinel.parallel import cpu_count
from sentinel.progress import Progress
from sentinel.runner import build_engine
from sentinel.sweep import run_sweep

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
        self.model = build_stages(sc.model, dims(sc).vocab, 1, sc.seed)[0]
        self.forward = self.model  # token ids (B, T) -> logits (B, T, V)
        self.opt = make_optimizer(self.model.parameters(), sc.training)
        self.step = 0

    def train_step(self) -> float:
        batch = self.data.train_batch(self.step)  # M, B, T+1
        losses = []
        for mb in batch:
            loss = loss_fn(self.forward(mb[:, :-1]), mb[:, 1:])
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
    return time_steps_cpu(trainer, steps)[0]


def time_steps_cpu(trainer, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step over `steps` steps after one untimed warm-up step. CPU time is the
    process's user + sys over all its threads: other processes on a loaded machine slow the wall clock,
    not the CPU seconds this work needs (unless it spins), so the two ratios side by side say how far
    the load distorted a wall-clock ratio."""
    trainer.train_step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.train_step()
    return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


THREADS = 1  # intra-op threads every timed configuration runs with (`sentinel bench --threads`)
PROGRESS = None  # the progress `run_all` shows (one unit per timed configuration)


def _tick(note: str) -> None:
    if PROGRESS is not None:
        PROGRESS.update(1, note)


def alternate(
    factories: dict[str, Callable[[], object]],
    reps: int,
    steps: int,
    after: Callable[[str, object, float], None] | None = None,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Median seconds per step of each trainer, timed in alternation to share the machine's noise.

    Every configuration runs with `THREADS` intra-op threads (pinned before each timing, so no
    configuration inherits another's setting). `after(name, trainer, seconds_per_step)`, if given, sees
    each trainer once it has been timed; `cpu`, if given, receives every repetition's CPU seconds per step."""
    times: dict[str, list[float]] = {k: [] for k in factories}
    for rep in range(reps):
        for name, make in factories.items():
            torch.set_num_threads(THREADS)
            trainer = make()
            wall, cpu_s = time_steps_cpu(trainer, steps)
            times[name].append(wall)
            if cpu is not None:
                cpu.setdefault(name, []).append(cpu_s)
            if after is not None:
                after(name, trainer, times[name][-1])
            _tick(f"{name} {rep + 1}/{reps}")
    return {k: statistics.median(v) for k, v in times.items()}


def _cpu_ratio(cpu: dict[str, list[float]], a: str, b: str) -> float:
    """Median over repetitions of the paired CPU-time ratio a / b."""
    return statistics.median(x / y for x, y in zip(cpu[a], cpu[b]))


@benchmark
def engine_overhead(quick: bool) -> dict:
    sc = load_bench("engine")
    cpu: dict[str, list[float]] = {}
    t = alternate(
        {"plain": lambda: PlainLoop(sc), "engine": lambda: SimEngine(sc)},
        reps=2 if quick else 5,
        steps=3 if quick else 8,
        cpu=cpu,
    )
    return {
        "engine_overhead": t["engine"] / t["plain"],
        "engine_overhead_cpu": _cpu_ratio(cpu, "engine", "plain"),
        "engine_overhead_detail": {
            "plain_s_per_step": t["plain"],
            "sim_s_per_step": t["engine"],
            "stages": sc.pipeline.stages,
            "replicas": sc.pipeline.replicas,
        },
    }


@benchmark
def hf_engine_overhead(quick: bool) -> dict:
    """`engine_overhead` on a transformers Llama (scenarios/bench/hf_engine.yaml): the sim engine (S=4, R=1)
    over a plain loop that calls the unsplit transformers model's own forward on the same microbatches."""
    from sentinel.model import hf_config

    if not hf_config.available():
        return {"hf_engine_overhead": None, "hf_engine_overhead_detail": f"needs the [hf] extra: {hf_config.INSTALL}"}
    from sentinel.model.hf import build_model

    sc = load_bench("hf_engine")

    def plain() -> PlainLoop:
        loop = PlainLoop(sc)
        model = build_model(sc.model, dims(sc).vocab, sc.seed)  # the same weights as the stages
        loop.model, loop.forward = model, lambda x: model(input_ids=x).logits  # B, T -> B, T, V
        loop.opt = make_optimizer(model.parameters(), sc.training)
        return loop

    t = alternate({"plain": plain, "engine": lambda: SimEngine(sc)}, reps=2 if quick else 5, steps=3 if quick else 8)
    return {
        "hf_engine_overhead": t["engine"] / t["plain"],
        "hf_engine_overhead_detail": {
            "plain_s_per_step": t["plain"],
            "sim_s_per_step": t["engine"],
            "model": describe(sc)["family"],
            "params": describe(sc)["params_total"],
            "stages": sc.pipeline.stages,
            "replicas": sc.pipeline.replicas,
        },
    }


@benchmark
def scale_cost_ratio(quick: bool) -> dict:
    small = load_bench("scale", "pipeline.replicas=1")
    big = load_bench("scale", "pipeline.replicas=11")
    cpu: dict[str, list[float]] = {}
    t = alternate(
        {"16": lambda: SimEngine(small), "176": lambda: SimEngine(big)},
        reps=1 if quick else 3,
        steps=2 if quick else 4,
        cpu=cpu,
    )
    return {
        "scale_cost_ratio": t["176"] / t["16"],
        "scale_cost_ratio_cpu": _cpu_ratio(cpu, "176", "16"),
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
    cpu: dict[str, list[float]] = {}
    t = alternate(
        {k: (lambda sc=sc: build_engine(sc)) for k, sc in configs.items()},
        reps=reps,
        steps=steps,
        after=record,
        cpu=cpu,
    )
    return {
        "detector_overhead": paired("sentinel"),
        "detector_overhead_cpu": _cpu_ratio(cpu, "sentinel", "none"),
        "duplication_overhead": paired("duplication"),
        "duplication_overhead_cpu": _cpu_ratio(cpu, "duplication", "none"),
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

    steps = 4 if quick else 12
    overrides = ["pipeline.stages=3", f"training.steps={steps}", f"training.eval_every={steps}"]
    sc = load_bench("engine", *overrides)
    sim_s = alternate({"sim": lambda: SimEngine(sc)}, reps=1 if quick else 2, steps=steps - 1)["sim"]
    with tempfile.TemporaryDirectory() as tmp:
        launch(
            str(SCENARIOS / "engine.yaml"),
            Path(tmp),
            overrides,
            nproc=4,
            options=Options(timeout_s=300),
            quiet=True,
            timeout_s=900,
            output=Path(tmp) / "dist.log",
        )
        _tick("dist run")
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

    with tempfile.TemporaryDirectory() as tmp:
        launch(
            str(SCENARIOS / f"{name}.yaml"),
            Path(tmp),
            overrides,
            nproc=nproc,
            options=Options(timeout_s=300, verifiers=verifiers),
            quiet=True,
            timeout_s=1800,
            output=Path(tmp) / "dist.log",
        )
        timing = json.loads((Path(tmp) / "dist_timing.json").read_text())
    _tick(f"dist {name} on {nproc} processes")
    return timing


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
            "dist_16_s_per_step": t16["s_per_step"],
            "dist_176_s_per_step": t176["s_per_step"],
            "sim_176_s_per_step": sim176,
            "processes": t176["world"],
            "verifiers": t176["verifiers"],
            "verifier_messages_per_s_16": t16["verifier_messages_per_s"],
            "verifier_messages_per_s_176": t176["verifier_messages_per_s"],
        },
    }


@benchmark
def sweep_parallel_speedup(quick: bool) -> dict:
    """Wall time of `sentinel sweep --jobs 1` over `--jobs 2` on the same small grid (scenarios/bench/sweep.yaml).

    Each configuration runs the whole grid from an empty folder with `THREADS` intra-op threads per run
    (pinned, `--threads`), so the ratio is what the second process buys; goal >= 1.8 on 2 cores. (The
    default thread policy gives a `--jobs 1` run all the cores; on a loaded machine two threads per tiny
    run were several times slower than one, which would inflate this ratio.) Wall-clock only: the CPU
    time of the pool's processes is not visible from here.
    """
    import tempfile

    overrides = ["training.steps=12", "training.eval_every=12"] if quick else []
    wall = {}
    for jobs in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run_sweep(SCENARIOS / "sweep.yaml", Path(tmp), overrides, jobs=jobs, threads=THREADS, progress=False)
            wall[jobs] = time.perf_counter() - t0
        torch.set_num_threads(THREADS)
        _tick(f"sweep --jobs {jobs}")
    return {
        "sweep_parallel_speedup": wall[1] / wall[2],
        "sweep_parallel_detail": {
            "jobs1_s": wall[1],
            "jobs2_s": wall[2],
            "cores": cpu_count(),
            "threads_per_run": THREADS,
            "points": len(load_bench("sweep").sweep.grid["detector.k"]),
        },
    }


@benchmark
def dist_detector_overhead(quick: bool) -> dict:
    """SENTINEL on the distributed backend (verifiers in their own processes): seconds per step with the detector
    over without (closed loop, `on_flag: accept` so both train the same), engine.yaml with S=3 on 5 processes
    (2 verifiers + 3 stage ranks). Goal <= 1.02: the detector's work is off the workers' critical path. One untimed
    run with the detector first, so neither timed run compiles kernels."""
    steps = 4 if quick else 12
    common = ["pipeline.stages=3", f"training.steps={steps}", f"training.eval_every={steps}"]
    detector = [*common, "detector.name=sentinel", "detector.warmup_steps=1", "response.on_flag=accept"]
    # untimed: the first run after a change of the verifier's kernels compiles them (numba's cache, per source file)
    # in each verifier process, for the argument types the distributed backend passes; that run's verifiers spent
    # 0.92 s a step and read 1.86 (issue-18 note, stop 40)
    _dist_timing("engine", detector, nproc=5)
    off = _dist_timing("engine", common, nproc=5)
    on = _dist_timing("engine", detector, nproc=5)
    return {
        "dist_detector_overhead": on["s_per_step"] / off["s_per_step"],
        "dist_detector_detail": {
            "off_s_per_step": off["s_per_step"],
            "on_s_per_step": on["s_per_step"],
            "verifier_s": sum(r.get("verifier_s", 0.0) for r in on["ranks"]) / steps,
        },
    }


UNITS = {  # timed configurations per benchmark (quick, full): the progress bar's units
    "engine_overhead": (4, 10),
    "scale_cost_ratio": (2, 6),
    "detector_overhead": (6, 21),
    "dist_vs_sim": (2, 3),
    "sweep_parallel_speedup": (2, 2),
    "dist_scale": (3, 3),
    "dist_detector_overhead": (3, 3),
}


def run_all(quick: bool = False, threads: int = 1) -> dict:
    """Every benchmark, with the 1-minute load average before and after each; a figure taken while the load
    exceeded the core count is flagged (`flags`): it measures the other processes as much as this code."""
    global PROGRESS, THREADS

    THREADS = threads
    cores = cpu_count()
    out: dict = {"quick": quick, "torch_threads": threads, "cores": cores, "load_avg_1min": {}, "flags": {}}
    PROGRESS = Progress(
        sum(UNITS.get(fn.__name__, (1, 1))[0 if quick else 1] for fn in BENCHMARKS), "bench", unit="timings"
    )
    try:
        for fn in BENCHMARKS:
            before = os.getloadavg()[0]
            print(f"[bench] {fn.__name__}: load average {before:.2f} on {cores} cores", file=sys.stderr, flush=True)
            figures = fn(quick)
            after = os.getloadavg()[0]
            print(f"[bench] {fn.__name__}: done; load average {after:.2f}", file=sys.stderr, flush=True)
            out["load_avg_1min"][fn.__name__] = [round(before, 2), round(after, 2)]
            if max(before, after) > cores:
                for key, value in figures.items():
                    if isinstance(value, (int, float)):
                        out["flags"][key] = (
                            f"taken at a load average of {max(before, after):.1f} > {cores} cores: "
                            "other processes shared the cores; rerun on an idle machine"
                        )
            out.update(figures)
    finally:
        PROGRESS.close()
        PROGRESS = None
    return out
