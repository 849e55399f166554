"""A sweep's tables: one row per (point, seed), one row per point with means and 95% intervals over seeds,
impact as paired differences, deltas to the reference point, per-attack / role / boundary / worker rows.

Files (in the sweep folder):
    sweep.csv           one row per grid point and seed: the HEADLINE metrics of sentinel/scoring/tables.py
    sweep_summary.csv   one row per grid point: n_seeds, and per metric M: M_mean, M_ci_low, M_ci_high, M_n
                        (seeds where M is defined); recovered_fraction; delta_M_* to the reference
    sweep_groups.csv    one row per point, seed and attack / role / boundary (precision ... steps to ban)
    sweep.md            the tables a person reads (mean [95% interval]; n/a with the reason)
"""

from __future__ import annotations

import collections
import csv
import json
from pathlib import Path
from typing import Any

from sentinel.scoring.stats import METHOD, Estimate, mean_ci, paired_ci
from sentinel.scoring.tables import BY_NAME, HEADLINE, fmt, group_rows, headline, md_table, reasons, worker_table

# what sweep.md shows per point (sweep_summary.csv has every HEADLINE metric)
MAIN = [
    "worker_f1",
    "msg_precision",
    "msg_recall",
    "msg_f1",
    "msg_fpr",
    "steps_to_ban",
    "max_steps_to_ban",
    "false_bans",
    "clean_fpr",
    "final_val_loss",
    "damage_defended",
    "damage_undefended",
]
DELTAS = ["worker_f1", "msg_f1", "msg_fpr", "steps_to_ban", "clean_fpr", "final_val_loss"]
GROUP_FIELDS = ["precision", "recall", "f1", "fpr", "median_steps_to_ban", "max_steps_to_ban"]


def load_runs(tasks: list, labels: list[dict]) -> list[dict]:
    """One record per finished run: its labels, seed, summary's HEADLINE metrics, reasons and group rows."""
    runs = []
    for t in tasks:
        f = Path(t.out) / "summary.json"
        if not f.is_file():
            continue
        s = json.loads(f.read_text())
        runs.append(
            {
                "point": t.point,
                "seed": t.seed,
                "labels": labels[t.point],
                "values": headline(s),
                "why": reasons(s),
                "groups": group_rows(s),
                "workers": _get_workers(s),
                "dir": t.out,
            }
        )
    return runs


def _get_workers(s: dict) -> list[dict]:
    return ((s.get("detection") or {}).get("workers") or {}).get("per_worker") or []


# -- aggregation over seeds ------------------------------------------------------------------------------------
def _common_reason(whys: list[str]) -> str:
    return collections.Counter(whys).most_common(1)[0][0] if whys else "n/a"


def summarise(runs: list[dict], n_points: int, seeds: list[int], reference: list[int | None] | None) -> list[dict]:
    """One record per point with runs: {metric: Estimate}, reasons, recovered fraction, deltas to the reference."""
    by_point: dict[int, dict[int, dict]] = collections.defaultdict(dict)
    for r in runs:
        by_point[r["point"]][r["seed"]] = r
    out = []
    for i in range(n_points):
        seeded = by_point.get(i)
        if not seeded:
            continue
        ran = [s for s in seeds if s in seeded]
        est = {m.name: mean_ci([seeded[s]["values"][m.name] for s in ran], m.bounds) for m in HEADLINE}
        why = {
            m.name: _common_reason([r["why"][m.name] for r in seeded.values() if m.name in r["why"]]) for m in HEADLINE
        }
        rec = {
            "point": i,
            "labels": next(iter(seeded.values()))["labels"],
            "n_seeds": len(seeded),
            "est": est,
            "why": why,
            **recovered(est),
        }
        ref = reference[i] if reference else None
        if ref is not None and by_point.get(ref):
            other = by_point[ref]
            rec["reference"] = ref
            both = [s for s in ran if s in other]  # paired by seed
            rec["delta"] = {
                m: paired_ci([seeded[s]["values"][m] for s in both], [other[s]["values"][m] for s in both])
                for m in DELTAS
            }
        out.append(rec)
    return out


def recovered(est: dict[str, Estimate]) -> dict[str, Any]:
    """The share of the attack's damage the defence recovers, only where the damage is measurable.

    From the paired differences over seeds: damage = undefended - clean, residual = defended - clean;
    recovered = 1 - mean(residual) / mean(damage), reported only when the damage's 95% interval lies
    above 0 (else "no measurable damage": a ratio of two noise-level differences means nothing).
    """
    du, dd = est["damage_undefended"], est["damage_defended"]
    if du.mean is None or dd.mean is None:
        return {"recovered_fraction": None, "recovered_note": "n/a: needs the clean and undefended twins"}
    if du.n < 2:
        return {"recovered_fraction": None, "recovered_note": "n/a: one seed, no interval for the damage"}
    if not (du.low is not None and du.low > 0):
        return {"recovered_fraction": None, "recovered_note": "no measurable damage (its 95% interval includes 0)"}
    return {"recovered_fraction": 1.0 - dd.mean / du.mean, "recovered_note": ""}


def cell(e: Estimate, spec: str, why: str) -> str:
    """`mean [low, high]` (95% interval; clipped to the metric's range); one seed: the value; none: the reason."""
    if e.mean is None:
        return why
    text = format(e.mean, spec)
    if e.n > 1 and e.low is not None:
        bare = spec.lstrip("+")
        text += f" [{format(e.low, bare)}, {format(e.high, bare)}]"
    return text + (f" ({e.missing} n/a)" if e.missing else "")


# -- files -------------------------------------------------------------------------------------------------------
def _label_cols(keys: list[str], labels: dict) -> dict:
    return {k: labels.get(k) for k in keys}


def write_csvs(out_dir: Path, keys: list[str], runs: list[dict], points: list[dict], notes: dict[str, str]) -> None:
    names = [m.name for m in HEADLINE]
    with open(out_dir / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*keys, "seed", *names, "run"])
        w.writeheader()
        for r in sorted(runs, key=lambda r: (r["point"], r["seed"])):
            w.writerow(
                {
                    **_label_cols(keys, r["labels"]),
                    "seed": r["seed"],
                    **r["values"],
                    "run": str(Path(r["dir"]).relative_to(out_dir)),
                }
            )
    summarised = [m for m in names if m != "recovered"]  # a mean of per-seed ratios: see recovered_fraction
    cols = [
        *keys,
        "n_seeds",
        *(f"{m}_{x}" for m in summarised for x in ("mean", "ci_low", "ci_high", "n")),
        "recovered_fraction",
        "recovered_note",
        "reference",
        *(f"delta_{m}_{x}" for m in DELTAS for x in ("mean", "ci_low", "ci_high", "n")),
        "notes",
    ]
    with open(out_dir / "sweep_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for p in points:
            row = {
                **_label_cols(keys, p["labels"]),
                "n_seeds": p["n_seeds"],
                "recovered_fraction": p["recovered_fraction"],
                "recovered_note": p["recovered_note"],
                "notes": notes.get(row_key(p["labels"]), ""),
            }
            for m, e in p["est"].items():
                if m not in summarised:
                    continue
                row.update({f"{m}_mean": e.mean, f"{m}_ci_low": e.low, f"{m}_ci_high": e.high, f"{m}_n": e.n})
            if "delta" in p:
                row["reference"] = row_key(points_by_index(points)[p["reference"]]["labels"])
                for m, e in p["delta"].items():
                    row.update(
                        {
                            f"delta_{m}_mean": e.mean,
                            f"delta_{m}_ci_low": e.low,
                            f"delta_{m}_ci_high": e.high,
                            f"delta_{m}_n": e.n,
                        }
                    )
            w.writerow(row)
    with open(out_dir / "sweep_groups.csv", "w", newline="") as f:
        fields = [
            "group",
            "name",
            *GROUP_FIELDS,
            "tampered",
            "banned_workers",
            "attacking_workers",
            "tp",
            "fp",
            "fn",
            "tn",
        ]
        w = csv.DictWriter(f, fieldnames=[*keys, "seed", *fields])
        w.writeheader()
        for r in sorted(runs, key=lambda r: (r["point"], r["seed"])):
            for g in r["groups"]:
                w.writerow({**_label_cols(keys, r["labels"]), "seed": r["seed"], **g})


def row_key(labels: dict) -> str:
    """A row's label as one string (`notes` are keyed by it): the grid labels joined by spaces."""
    return " ".join(str(v) for v in labels.values()) or "all"


def points_by_index(points: list[dict]) -> dict[int, dict]:
    return {p["point"]: p for p in points}


def markdown(
    keys: list[str], points: list[dict], runs: list[dict], seeds: list[int], notes: dict[str, str], has_reference: bool
) -> str:
    """sweep.md: the main table (one row per point), per attack / role / boundary, per worker, method."""
    lines = [
        (f"{len(points)} grid points" if keys else "One scenario")
        + f" x {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({_seed_text(seeds)}). Cells: {METHOD}, shown as "
        "`mean [low, high]`; `(k n/a)`: seeds where the value is undefined, left out of the mean.",
        "",
    ]
    header = [*(keys or ["run"]), "seeds", *(BY_NAME[m].label for m in MAIN), "recovered"]
    if has_reference:
        header += [f"Δ {BY_NAME[m].label} vs reference" for m in DELTAS[:3]] + ["reference"]
    if notes:
        header.append("notes")
    by_index = points_by_index(points)
    body = []
    for p in points:
        row = [*(str(p["labels"][k]) for k in keys)] if keys else ["all seeds"]
        row.append(str(p["n_seeds"]))
        row += [cell(p["est"][m], BY_NAME[m].fmt, p["why"][m]) for m in MAIN]
        row.append(fmt(p["recovered_fraction"], ".1%", p["recovered_note"]))
        if has_reference:
            if "delta" not in p:
                row += ["n/a: reference did not run"] * 3 + [""]
            elif p["reference"] == p["point"]:
                row += ["(reference)"] * 3 + ["this row"]
            else:
                row += [
                    cell(p["delta"][m], "+" + BY_NAME[m].fmt.lstrip("+"), "n/a: undefined in this row or the reference")
                    for m in DELTAS[:3]
                ]
                row.append(row_key(by_index[p["reference"]]["labels"]))
        if notes:
            row.append(notes.get(row_key(p["labels"]), ""))
        body.append(row)
    lines += md_table(header, body) + [""]
    lines += [
        "Impact: `defended - clean` and `undefended - clean` are final validation losses minus the clean twin's, "
        "paired by seed (same data order and initialisation); `recovered` = 1 - mean(defended - clean) / "
        "mean(undefended - clean), shown only where the undefended damage's 95% interval lies above 0.",
        "",
    ]
    lines += group_markdown(keys, runs, seeds)
    lines += worker_markdown(keys, runs)
    return "\n".join(lines) + "\n"


def _seed_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}..{seeds[-1]}"
    return "seed" + ("s " if len(seeds) > 1 else " ") + ", ".join(map(str, seeds))


def group_markdown(keys: list[str], runs: list[dict], seeds: list[int]) -> list[str]:
    """Per attack (when a point has several), per role and per boundary (when several), mean ± CI over seeds."""
    table: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
    labels: dict[int, dict] = {}
    for r in runs:
        labels[r["point"]] = r["labels"]
        for g in r["groups"]:
            table[(r["point"], g["group"], g["name"])][r["seed"]] = g
    lines: list[str] = []
    specs = {
        "precision": ".3f",
        "recall": ".3f",
        "f1": ".3f",
        "fpr": ".4f",
        "median_steps_to_ban": ".3g",
        "max_steps_to_ban": ".3g",
    }
    for kind in ("attack", "role", "boundary"):
        per_point = collections.Counter(p for (p, k, _) in table if k == kind)
        if not per_point or max(per_point.values()) < 2:
            continue  # one attack (role, boundary) per point: the main table already is that row
        body = []
        for (p, k, name), by_seed in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][2])):
            if k != kind:
                continue
            cells = []
            for field, spec in specs.items():
                e = mean_ci(
                    [by_seed[s][field] for s in seeds if s in by_seed],
                    (0.0, 1.0) if spec != ".3g" else (0.0, float("inf")),
                )
                cells.append(cell(e, spec, _group_reason(field, by_seed)))
            banned = sum(g["banned_workers"] for g in by_seed.values())
            attacking = sum(g["attacking_workers"] for g in by_seed.values())
            body.append([row_key(labels[p]) if keys else "all", name, *cells, f"{banned} of {attacking}"])
        title = {"attack": "Per attack", "role": "Per role", "boundary": "Per boundary"}[kind]
        header = [
            "point",
            kind,
            "precision",
            "recall",
            "F1",
            "FPR",
            "median steps to ban",
            "max steps to ban",
            "attackers banned (all seeds)",
        ]
        lines += [
            f"<details><summary>{title} (mean [95% CI] over seeds)</summary>",
            "",
            *md_table(header, body),
            "",
            "</details>",
            "",
        ]
    return lines


def _group_reason(field: str, by_seed: dict[int, dict]) -> str:
    if field in ("median_steps_to_ban", "max_steps_to_ban"):
        attacking = any(g["attacking_workers"] for g in by_seed.values())
        return "n/a: none banned" if attacking else "n/a: no worker attacked"
    if field == "precision":
        return "n/a: nothing flagged"
    if field in ("recall", "f1"):
        return (
            "n/a: no tampered message" if not any(g["tampered"] for g in by_seed.values()) else "n/a: nothing flagged"
        )
    return "n/a: no clean message"


def worker_markdown(keys: list[str], runs: list[dict]) -> list[str]:
    """Per worker (malicious, flagged or banned ones), per point and seed, in collapsed sections."""
    lines: list[str] = []
    for r in sorted(runs, key=lambda r: (r["point"], r["seed"])):
        if not r["workers"]:
            continue
        table = worker_table(r["workers"])
        title = f"Workers: {row_key(r['labels']) if keys else 'run'}, seed {r['seed']}"
        lines += [f"<details><summary>{title}</summary>", "", *table[2:], "</details>", ""]
    return lines
