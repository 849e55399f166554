"""`sentinel sweep`: run a scenario's `sweep.grid` (cartesian), resumable and in parallel.

Layout:
    DIR/points/<slug>/...   one result folder per grid point (a finished point has summary.json,
                            written last and atomically, so a crash or Ctrl-C never leaves a point
                            that looks finished; finished points are skipped on the next run)
    DIR/twins/              twin runs shared by points whose twin is identical (e.g. one clean twin
                            for a sweep over attacks)
    DIR/sweep.csv, DIR/sweep.md, DIR/sweep_<metric>.png   the combined table and plots
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from sentinel import scenario as scenario_mod
from sentinel.errors import ConfigError

HEADLINE = [
    ("final_val_loss", ("training", "final_val_loss")),
    ("msg_f1", ("detection", "messages", "f1")),
    ("msg_fpr", ("detection", "messages", "fpr")),
    ("worker_f1", ("detection", "workers", "f1")),
    ("false_bans", ("detection", "workers", "false_bans")),
    ("steps_to_ban", ("detection", "workers", "median_steps_to_ban")),
    ("clean_val_loss", ("impact", "clean_val_loss")),
    ("undefended_val_loss", ("impact", "undefended_val_loss")),
    ("recovered", ("impact", "recovered_fraction")),
    ("clean_fpr", ("detection", "clean_twin", "fpr")),
    ("clean_false_bans", ("detection", "clean_twin", "false_bans")),
    ("bytes_sent", ("transport", "bytes_sent")),
    ("sim_tokens_per_s", ("transport", "sim_tokens_per_s")),
]


def grid_points(sc: scenario_mod.Scenario) -> list[dict[str, Any]]:
    """Cartesian product of `sweep.grid` as a list of {key: value} overrides (validated later)."""
    grid = sc.sweep.grid
    if not grid:
        raise ConfigError("sweep.grid: empty; add e.g. `sweep: {grid: {detector.k: [1.5, 3, 5]}}`")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.grid.{key}: expected a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def slug(point: dict[str, Any]) -> str:
    text = "__".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in point.items())
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text)[:180] or "default"


def _overrides(point: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in point.items()]


def label(value: Any) -> str:
    """A grid value as a row label: an attack list reads `name/role` (joined by +), scalars as themselves."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return "+".join(f"{v['name']}/{v['role']}" if "role" in v else str(v["name"]) for v in value)
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    return value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)


def _run_point(path: str, base_overrides: list[str], point: dict[str, Any], out: str, threads: int) -> str:
    import torch

    from sentinel import runner

    torch.set_num_threads(threads)
    sc = scenario_mod.load(path, base_overrides + _overrides(point))
    runner.run(sc, Path(out), progress=False, twin_cache=Path(out).parent.parent / "twins")
    return out


def run_sweep(path: str | Path, out_dir: Path, overrides: list[str] = (), jobs: int | None = None) -> list[dict]:
    """Run every unfinished grid point; return one row per point (finished ones only)."""
    base = scenario_mod.load(path, list(overrides))
    points = grid_points(base)
    for p in points:  # validate every point before anything runs
        try:
            scenario_mod.load(path, list(overrides) + _overrides(p))
        except ConfigError as exc:
            raise ConfigError([f"sweep point {p}: {msg}" for msg in exc.problems]) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [
        (p, out_dir / "points" / slug(p))
        for p in points
        if not (out_dir / "points" / slug(p) / "summary.json").is_file()
    ]
    done = len(points) - len(todo)
    if done:
        print(f"[sweep] {done}/{len(points)} points already finished; resuming", file=sys.stderr)
    jobs = jobs or max(1, min(len(todo), os.cpu_count() or 1))  # small models: processes beat threads
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if jobs == 1:
        for i, (p, d) in enumerate(todo, 1):
            _run_point(str(path), list(overrides), p, str(d), threads)
            print(f"[sweep] {done + i}/{len(points)} done: {slug(p)}", file=sys.stderr)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_run_point, str(path), list(overrides), p, str(d), threads) for p, d in todo]
            for i, fut in enumerate(as_completed(futures), 1):
                print(f"[sweep] {done + i}/{len(points)} done: {Path(fut.result()).name}", file=sys.stderr)
    rows = collect(out_dir, points, dict(base.sweep.reference))
    write_tables(out_dir, rows, list(points[0]) + (["reference"] if base.sweep.reference else []))
    write_report(out_dir, base, list(overrides), len(points))
    return rows


def write_report(out_dir: Path, base: scenario_mod.Scenario, overrides: list[str], points: int) -> None:
    """report.md of the sweep: what ran (the base scenario after overrides), the table, the figures."""
    import yaml

    figures = sorted(p.name for p in out_dir.glob("sweep_*.png"))
    lines = [
        f"# Sweep report: {base.name}",
        "",
        f"{points} grid points over {', '.join(base.sweep.grid)}"
        + (f"; overrides: {' '.join(overrides)}" if overrides else "") + ". One result folder per point in "
        "`points/` (each with its own report.md); twins shared by identical points in `twins/`.",
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


def _get(d: dict, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def collect(out_dir: Path, points: list[dict[str, Any]], reference: dict[str, str] | None = None) -> list[dict]:
    """One row per finished point: its grid values as labels, the headline metrics, the reference text."""
    rows = []
    # short labels (an attack list as name/role, a plugin by its name) unless they would merge distinct values
    short = {k: len({json.dumps(label(p[k])) for p in points}) == len({json.dumps(p[k], sort_keys=True) for p in points})
             for k in (points[0] if points else {})}
    for p in points:
        f = out_dir / "points" / slug(p) / "summary.json"
        if f.is_file():
            s = json.loads(f.read_text())
            labels = {k: label(v) if short[k] or isinstance(v, (int, float, str, bool)) else
                      json.dumps(v, separators=(",", ":")) for k, v in p.items()}
            row = {**labels, **{name: _get(s, path) for name, path in HEADLINE}}
            if reference:
                key = " ".join(str(v) for v in labels.values())
                row["reference"] = reference.get(key, "")
            rows.append(row)
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def write_tables(out_dir: Path, rows: list[dict], keys: list[str]) -> None:
    cols = keys + [name for name, _ in HEADLINE]
    with open(out_dir / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows([{c: r.get(c) for c in cols} for r in rows])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    (out_dir / "sweep.md").write_text("\n".join(lines) + "\n")
    plot_sweep(out_dir, rows, keys)


def plot_sweep(out_dir: Path, rows: list[dict], keys: list[str]) -> None:
    """One figure per headline metric against the first numeric grid key (one line per other combo)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if k != "reference"]
    if not rows:
        return
    numeric = [k for k in keys if all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for r in rows)]
    if not numeric:
        plot_categorical(out_dir, rows, keys)
        return
    x_key = numeric[0]
    others = [k for k in keys if k != x_key]
    for metric in ("msg_f1", "msg_fpr", "worker_f1", "final_val_loss"):
        if all(r[metric] is None for r in rows):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(", ".join(f"{k}={r[k]}" for k in others) or metric, []).append(r)
        for name, rs in groups.items():
            rs = sorted((r for r in rs if r[metric] is not None), key=lambda r: r[x_key])
            ax.plot([r[x_key] for r in rs], [r[metric] for r in rs], "o-", label=name)
        ax.set_xlabel(x_key)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {x_key}")
        ax.grid(alpha=0.3)
        if len(groups) > 1:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"sweep_{metric}.png", dpi=110)
        plt.close(fig)


def plot_categorical(out_dir: Path, rows: list[dict], keys: list[str]) -> None:
    """A grid without a numeric key (e.g. one row per attack): grouped bars of detection and of loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [" ".join(str(r[k]) for k in keys) for r in rows]
    x = np.arange(len(rows))
    panels = (
        ("sweep_detection.png", "detection", "F1 / rate", (("worker_f1", "worker F1"), ("msg_f1", "message F1"),
                                                          ("clean_fpr", "clean-twin message FPR"))),
        ("sweep_loss.png", "final validation loss", "cross-entropy (nats / token)",
         (("clean_val_loss", "clean twin"), ("final_val_loss", "defended"), ("undefended_val_loss", "undefended"))),
    )
    for fname, title, ylabel, series in panels:
        series = [(m, lab) for m, lab in series if any(r.get(m) is not None for r in rows)]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.2))
        width = 0.8 / len(series)
        low = np.inf
        for i, (metric, lab) in enumerate(series):
            vals = [np.nan if r.get(metric) is None else r[metric] for r in rows]
            low = min(low, np.nanmin(vals))
            ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=lab)
        if fname == "sweep_loss.png" and np.isfinite(low):
            ax.set_ylim(bottom=0.9 * low)  # losses differ by tenths: start the axis near them
        ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} per {', '.join(keys)}")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
