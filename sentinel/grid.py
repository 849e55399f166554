"""The `sweep` section of a scenario: its grid points, seeds and reference, and how a grid value is named.

Pure functions of the scenario (no training, no files): `sentinel.scenario` checks the section with them
(`check_sweep`), `sentinel.sweep` plans and labels runs with them.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from sentinel.errors import ConfigError

SEED_LIMIT = 2**63  # torch.Generator and numpy take seeds below 2**63
MAX_SEEDS = 10_000


def grid_points(sc) -> list[dict[str, Any]]:
    """Cartesian product of `sweep.grid` as a list of {key: value} overrides (validated later)."""
    grid = sc.sweep.grid
    if not grid:
        raise ConfigError("sweep.grid: empty; add e.g. `sweep: {grid: {detector.k: [1.5, 3, 5]}}`")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.grid.{key}: expected a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def seeds_of(sc) -> list[int]:
    """The seeds every point runs for: `sweep.seeds` (N: seed..seed+N-1, or a list), else the scenario's seed."""
    seeds = sc.sweep.seeds
    if seeds is None:
        return [sc.seed]
    if isinstance(seeds, int):
        return list(range(sc.seed, sc.seed + seeds))
    return list(seeds)


def check_seeds(sc) -> list[tuple[str, str]]:
    """Located problems with `sweep.seeds` (a scenario cross-check)."""
    seeds = sc.sweep.seeds
    if seeds is None:
        return []
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_SEEDS:
            return [("sweep.seeds", f"{seeds} seeds; must be between 1 and {MAX_SEEDS} (e.g. seeds: 5)")]
        if sc.seed + seeds > SEED_LIMIT:
            return [
                (
                    "sweep.seeds",
                    f"{seeds} seeds from seed {sc.seed} reach {sc.seed + seeds - 1}; seeds must stay "
                    "below 2**63: lower `seed` or the number of seeds",
                )
            ]
        return []
    if not seeds:
        return [("sweep.seeds", "an empty list; give a number of seeds (seeds: 5) or a list (seeds: [0, 1, 2])")]
    out = [
        (f"sweep.seeds[{i}]", f"{s}; a seed must be between 0 and 2**63 - 1")
        for i, s in enumerate(seeds)
        if not 0 <= s < SEED_LIMIT
    ]
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        out.append(("sweep.seeds", f"seeds {dup} listed twice; every seed runs once"))
    if len(seeds) > MAX_SEEDS:
        out.append(("sweep.seeds", f"{len(seeds)} seeds; at most {MAX_SEEDS}"))
    return out


def _matches(value: Any, want: Any) -> bool:
    """A grid value named by a reference value: equal, or equal to its row label or plugin name."""
    if value == want:
        return True
    if isinstance(want, str):
        if label(value) == want:
            return True
        return isinstance(value, dict) and value.get("name") == want
    return False


def reference_values(sc) -> dict[str, Any]:
    """`sweep.reference` resolved to grid values: {grid key: the one grid value it names}. ConfigError if not."""
    problems = check_reference(sc)
    if problems:
        raise ConfigError([f"{k}: {m}" for k, m in problems])
    grid = sc.sweep.grid
    return {k: next(v for v in grid[k] if _matches(v, want)) for k, want in sc.sweep.reference.items()}


def check_reference(sc) -> list[tuple[str, str]]:
    """Located problems with `sweep.reference` (a scenario cross-check): it must name a grid point."""
    ref, grid = sc.sweep.reference, sc.sweep.grid
    if not ref:
        return []
    if not grid:
        return [("sweep.reference", "names a grid point, but sweep.grid is empty")]
    out = []
    for key, want in ref.items():
        where = f"sweep.reference.{key}"
        if key not in grid:
            out.append((where, f"not a grid key; the grid varies {', '.join(grid)}: name one of those"))
            continue
        values = grid[key] if isinstance(grid[key], list) else []
        hits = [v for v in values if _matches(v, want)]
        shown = ", ".join(str(x) for x in labels_for(values)) if values else "none"
        if not hits:
            out.append(
                (where, f"{json.dumps(want)} is not one of the grid's values for {key} ({shown}); name one of them")
            )
        elif len(hits) > 1:
            out.append(
                (where, f"{json.dumps(want)} names {len(hits)} grid values of {key} ({shown}); give the full value")
            )
    return out


def check_sweep(sc) -> list[tuple[str, str]]:
    """Every located problem of the sweep section (seeds in range, a reference that names a grid point)."""
    return check_seeds(sc) + check_reference(sc)


def label(value: Any) -> Any:
    """A grid value as a short row label: an attack list reads `name/role` (joined by +), a plugin its name."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return "+".join(f"{v['name']}/{v['role']}" if "role" in v else str(v["name"]) for v in value)
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    if isinstance(value, list) and not value:
        return "none"  # e.g. `adversary.attacks: []`, the no-attack point
    return value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)


def _params(value: Any) -> dict[str, Any]:
    """The parameters a short label leaves out (a plugin's keys other than its name; an attack's settings)."""
    if isinstance(value, dict) and "name" in value:
        return {k: v for k, v in value.items() if k != "name"}
    if isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value):
        many = len(value) > 1
        return {
            (f"{a['name']}.{k}" if many else k): v for a in value for k, v in a.items() if k not in ("name", "role")
        }
    return {}


def labels_for(values: list[Any]) -> list[Any]:
    """Row labels of one grid key's values: short, plus the parameters that vary among values that share a
    short label (`random_mask(keep=0.05)` beside `random_mask(keep=0.1)`); JSON where that still merges two."""
    short = [label(v) for v in values]
    out: list[Any] = []
    for v, s in zip(values, short):
        peers = [p for p, ps in zip(values, short) if ps == s]
        keys = sorted({k for p in peers for k in _params(p)})
        varying = [k for k in keys if len({json.dumps(_params(p).get(k), sort_keys=True) for p in peers}) > 1]
        params = _params(v)
        out.append(f"{s}({', '.join(f'{k}={json.dumps(params.get(k))}' for k in varying)})" if varying else s)
    if len({json.dumps(o) for o in out}) < len({json.dumps(v, sort_keys=True) for v in values}):
        return [
            json.dumps(v, separators=(",", ":")) if not isinstance(v, (int, float, str, bool)) else v for v in values
        ]
    return out
