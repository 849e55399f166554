"""What a sweep runs: grid points x seeds, where each run's folder lives, how rows are labelled, and the
reference point each row is compared with.

Layout of a sweep folder:

    DIR/points/<slug>/seed-<s>/   one result folder per grid point and seed (finished once summary.json,
                                  written last and atomically, exists: a rerun skips it)
    DIR/twins/                    twins shared by runs whose twin is identical (same scenario and seed)

`sentinel run --seeds N --out DIR` is a sweep of one point: DIR/seed-<s>/ and DIR/twins/.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from sentinel.grid import (  # noqa: F401  (the sweep package's names for them)
    MAX_SEEDS,
    SEED_LIMIT,
    check_reference,
    check_seeds,
    check_sweep,
    grid_points,
    label,
    labels_for,
    reference_values,
    seeds_of,
)


# -- labels ------------------------------------------------------------------------------------------------
def row_labels(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """{grid key: label} per point, every key's labels distinct for distinct values."""
    if not points:
        return []
    per_key = {}
    for key in points[0]:
        distinct = []
        for p in points:
            if all(json.dumps(p[key], sort_keys=True) != json.dumps(d, sort_keys=True) for d in distinct):
                distinct.append(p[key])
        names = labels_for(distinct)
        per_key[key] = {json.dumps(d, sort_keys=True): n for d, n in zip(distinct, names)}
    return [{k: per_key[k][json.dumps(p[k], sort_keys=True)] for k in p} for p in points]


SLUG_MAX = 180  # characters of a point's folder name


def slug(point: dict[str, Any]) -> str:
    """A folder name for a grid point (stable across runs: resume finds it again). A name longer than SLUG_MAX is cut
    and ends with a hash of the whole point: two points that differ only past the cut (a grid over whole `data` or
    `pipeline` sections) would otherwise share a folder, and the second would resume the first one's runs."""
    text = "__".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in point.items())
    name = re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text)
    if len(name) > SLUG_MAX:
        name = f"{name[: SLUG_MAX - 13]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return name or "default"


def overrides(point: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in point.items()]


# -- runs --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunTask:
    """One run of a sweep: the validated scenario as plain data (seed set), and where its folder goes."""

    scenario: dict[str, Any]
    out: str
    point: int  # index into the sweep's points
    seed: int
    twin_cache: str | None
    label: str  # for progress lines: the row label and seed

    @property
    def finished(self) -> bool:
        return (Path(self.out) / "summary.json").is_file()


def point_dir(out_dir: Path, point: dict[str, Any] | None) -> Path:
    """A sweep point's folder (`None`: `sentinel run --seeds`, whose seeds sit in the folder itself)."""
    return out_dir if point is None else out_dir / "points" / slug(point)


def run_dir(out_dir: Path, point: dict[str, Any] | None, seed: int) -> Path:
    return point_dir(out_dir, point) / f"seed-{seed}"
