"""`sentinel sweep`: a scenario's `sweep.grid` (cartesian) x `sweep.seeds`, resumable, on local processes or
Ray; and `sentinel run --seeds N`, the same machinery for one point.

Modules: `plan` (points, seeds, folders, labels, the reference point), `execute` (tasks, the local
process pool), `ray_executor` (Ray tasks), `summary` (tables with 95% intervals over seeds), `plots`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from sentinel import scenario as scenario_mod
from sentinel.errors import ConfigError, RunError
from sentinel.parallel import check_jobs, cpu_count, thread_count
from sentinel.progress import Progress
from sentinel.sweep.execute import Plan, make_plan, planned_steps, run_local
from sentinel.sweep.plan import grid_points, label, labels_for, reference_values, row_labels, slug
from sentinel.sweep.plots import plot_sweep
from sentinel.sweep.ray_executor import run_ray
from sentinel.sweep.summary import load_runs, markdown, summarise, write_csvs

__all__ = ["grid_points", "label", "labels_for", "row_labels", "slug", "run_sweep", "run_seeds", "tabulate"]


def run_sweep(
    path: str | Path,
    out_dir: Path,
    overrides: list[str] = (),
    jobs: int | None = None,
    threads: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
) -> list[dict]:
    """Run every unfinished (point, seed) of the scenario's grid; tabulate the finished ones.

    Returns one record per finished run (labels, seed, HEADLINE values). Raises RunError (exit 1) after
    tabulating when runs failed, naming them.
    """

    base = scenario_mod.load(path, list(overrides))
    points = grid_points(base)
    plan = make_plan(path, list(overrides), Path(out_dir), points)
    return _execute(plan, Path(out_dir), jobs, threads, executor, address, progress, f"sweep {base.name}")


def run_seeds(
    path: str | Path,
    out_dir: Path,
    overrides: list[str] = (),
    jobs: int | None = None,
    threads: int | None = None,
    progress: bool = True,
) -> list[dict]:
    """`sentinel run --seeds N`: the scenario (and its twins) per seed in OUT/seed-<s>/, plus the seed summary."""
    plan = make_plan(path, list(overrides), Path(out_dir), None)
    return _execute(plan, Path(out_dir), jobs, threads, "local", None, progress, plan.base.name)


def _execute(
    plan: Plan,
    out_dir: Path,
    jobs: int | None,
    threads: int | None,
    executor: str,
    address: str | None,
    progress: bool,
    title: str,
) -> list[dict]:

    check_jobs(jobs)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = plan.todo
    done = len(plan.tasks) - len(todo)
    if done:
        print(f"[{title}] {done}/{len(plan.tasks)} runs already finished; resuming", file=sys.stderr)
    failures: list = []
    if todo:
        jobs = jobs or max(1, min(len(todo), cpu_count()))  # small models: processes beat threads
        n_threads, why = thread_count(jobs, threads)
        bar = Progress(planned_steps(todo), title, enabled=progress)
        print(
            f"[{title}] {len(todo)} runs ({len(plan.points)} points x {len(plan.seeds)} seeds"
            + (f", {done} finished" if done else "")
            + f"); {executor}"
            + (f", {jobs} processes x {n_threads} threads ({why})" if executor == "local" else ""),
            file=sys.stderr,
        )
        try:
            if executor == "ray":
                failures = run_ray(todo, address, n_threads, bar)
            else:
                failures = run_local(todo, jobs, n_threads, bar)
        finally:
            bar.close()
    runs = tabulate(plan, out_dir)
    if failures:
        lines = [f"{Path(t.out).relative_to(out_dir)}: {type(e).__name__}: {e}" for t, e in failures]
        raise RunError(
            f"{len(failures)} of {len(plan.tasks)} runs failed (finished runs are kept; rerun the same "
            "command to retry the others; each failed folder has failure.txt):\n  " + "\n  ".join(lines)
        )
    return runs


def tabulate(plan: Plan, out_dir: Path) -> list[dict]:
    """sweep.csv, sweep_summary.csv, sweep_groups.csv, sweep.md, plots and report.md from the finished runs."""
    keys = list(plan.points[0]) if plan.points and plan.points[0] is not None else []
    runs = load_runs(plan.tasks, plan.labels)
    reference = None
    if plan.base.sweep.reference and plan.points[0] is not None:
        ref = reference_values(plan.base)
        index = {_key(p): i for i, p in enumerate(plan.points)}
        reference = [index[_key({**p, **ref})] for p in plan.points]
    points = summarise(runs, len(plan.points), plan.seeds, reference)
    notes = dict(plan.base.sweep.notes)
    write_csvs(out_dir, keys, runs, points, notes)
    (out_dir / "sweep.md").write_text(markdown(keys, points, runs, plan.seeds, notes, reference is not None))
    figures = plot_sweep(out_dir, points, keys, len(plan.seeds))
    write_report(out_dir, plan, figures)
    return [{**r["labels"], "seed": r["seed"], **r["values"]} for r in runs]


def _key(point: dict[str, Any]) -> str:
    import json

    return json.dumps(point, sort_keys=True)


def write_report(out_dir: Path, plan: Plan, figures: list[str]) -> None:
    """report.md of the sweep: what ran (the base scenario), the tables, the figures."""
    base = plan.base
    grid = (
        f"{len(plan.points)} grid points over {', '.join(base.sweep.grid)}"
        if plan.points[0] is not None
        else "one scenario"
    )
    lines = [
        f"# {'Sweep' if plan.points[0] is not None else 'Seeds'} report: {base.name}",
        "",
        f"{grid}, {len(plan.seeds)} seeds. One result folder per run"
        + (" in `points/<point>/seed-<s>/`" if plan.points[0] is not None else " in `seed-<s>/`")
        + " (each with its own report.md); twins shared by identical runs in `twins/`.",
        "",
        (out_dir / "sweep.md").read_text().rstrip(),
        "",
        *[f"![{Path(f).stem}]({f})" for f in figures],
        "",
        "## Base scenario (as run, after overrides)",
        "",
        "```yaml",
        yaml.safe_dump(base.to_dict(), sort_keys=False).rstrip(),
        "```",
    ]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")


def check_executor(executor: str, address: str | None) -> None:
    if address is not None and executor != "ray":
        raise ConfigError("--address: only used with --executor ray")
