"""Running a sweep's unfinished runs: the tasks, the progress they add up to, and the local executor.

Every (point, seed) run is a `RunTask` holding its validated scenario as plain data, so any executor
(this process pool, or Ray tasks on other hosts: sentinel/sweep/ray_executor.py) runs it the same way
with `execute_run`. A run that fails does not stop the others: its folder keeps the partial EventLog
and `failure.txt`, the finished runs are tabulated, and the sweep then exits 1 naming the failures
(rerun the same command to retry them; finished runs are kept).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sentinel import runner
from sentinel import scenario as scenario_mod
from sentinel.errors import ConfigError
from sentinel.parallel import pool_map
from sentinel.progress import JobProgress
from sentinel.runner import twin_key, twin_scenario
from sentinel.sweep.plan import RunTask, overrides, row_labels, run_dir, seeds_of


@dataclasses.dataclass
class Plan:
    """A sweep's base scenario, points (None: `run --seeds`), seeds, labels and every run."""

    base: Any
    points: list[dict[str, Any]] | list[None]
    seeds: list[int]
    labels: list[dict[str, Any]]
    tasks: list[RunTask]

    @property
    def todo(self) -> list[RunTask]:
        return [t for t in self.tasks if not t.finished]


def make_plan(path: str | Path, base_overrides: list[str], out_dir: Path, points: list | None) -> Plan:
    """Validate every (point, seed) scenario before anything runs; `points=None` for `sentinel run --seeds`."""
    base = scenario_mod.load(path, base_overrides)
    pts = points if points is not None else [None]
    seeds = seeds_of(base)
    labels = row_labels(points) if points is not None else [{}]
    tasks, problems = [], []
    for i, p in enumerate(pts):
        for s in seeds:
            extra = (overrides(p) if p else []) + [f"seed={s}", "sweep.seeds=null"]
            try:
                sc = scenario_mod.load(path, list(base_overrides) + extra)
            except ConfigError as exc:
                where = f"sweep point {p}, seed {s}" if p else f"seed {s}"
                problems += [f"{where}: {msg}" for msg in exc.problems]
                continue
            name = " ".join(str(v) for v in labels[i].values()) or sc.name
            tasks.append(
                RunTask(sc.to_dict(), str(run_dir(out_dir, p, s)), i, s, str(out_dir / "twins"), f"{name} seed {s}")
            )
    if problems:
        raise ConfigError(problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else []))
    return Plan(base, pts, seeds, labels, tasks)


def planned_steps(todo: list[RunTask]) -> int:
    """Training steps the unfinished runs will do: each run and its confirmation, and every twin once
    (twins identical across runs are trained once and shared; finished ones are not trained again)."""

    total, twins = 0, set()
    for t in todo:
        sc = scenario_mod.validate(t.scenario)
        confirm = sc.detector.mode == "open_loop" and sc.scoring.confirm
        total += sc.training.steps * (1 + int(confirm))
        for kind in sc.scoring.twins:
            key = twin_key(twin_scenario(sc, kind), kind)
            if key not in twins and not (Path(t.twin_cache or "") / key / "done").is_file():
                twins.add(key)
                total += sc.training.steps
    return total


class _Labelled:
    """A progress sink whose notes say which run they come from."""

    def __init__(self, sink: Any, prefix: str):
        self.sink, self.prefix = sink, prefix

    def update(self, n: int = 1, note: str | None = None) -> None:
        self.sink.update(n, None if note is None else f"{self.prefix}: {note}")

    def add_total(self, n: int) -> None:
        self.sink.add_total(n)

    def job(self, label: str, steps: int):

        return JobProgress(self, label if label in ("clean", "undefended", "confirm") else "run", steps)


def execute_run(task: RunTask, sink: Any) -> str:
    """Run one (point, seed) into its folder (twins from the sweep's shared cache); returns the folder."""

    sc = scenario_mod.validate(task.scenario)
    runner.run(
        sc,
        Path(task.out),
        progress=_Labelled(sink, task.label),
        twin_cache=Path(task.twin_cache) if task.twin_cache else None,
    )
    return task.out


def run_local(todo: list[RunTask], jobs: int, threads: int, progress: Any) -> list[tuple[RunTask, BaseException]]:
    """Every task in `jobs` processes (inline for 1); returns the failures (task, error)."""

    failures = []
    for task, _, error in pool_map(execute_run, todo, jobs, progress, threads):
        if error is not None:
            failures.append((task, error))
    return failures
