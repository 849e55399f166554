"""Result folders: write and rebuild summary.json, report.md and plots from saved EventLogs.

`sentinel report DIR...` calls `rebuild` on saved results (no retraining) and, for several
folders, prints one combined table.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from sentinel import strictjson
from sentinel.eventlog import EventLog
from sentinel.scoring import folders, plots
from sentinel.scoring.metrics import STEP_COLUMNS, impact_metrics, step_rows
from sentinel.scoring.summary import build_summary, confirmation_metrics
from sentinel.scoring.tables import (
    HEADLINE,
    fmt,
    group_cells,
    group_rows,
    group_tables,
    headline,
    md_table,
    reasons,
    why_undefined,
)

TWINS = ("clean", "undefended")


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(strictjson.dumps(data, indent=2))  # NaN / Inf -> null
    os.replace(tmp, path)


def twin_logs(out_dir: Path) -> dict[str, EventLog]:
    return {k: EventLog.load(out_dir / f"twin_{k}") for k in TWINS if (out_dir / f"twin_{k}" / "events.npz").is_file()}


def finish(out_dir: Path, log: EventLog, summary: dict) -> dict:
    """Write events.csv, plots, report.md and, last and atomically, summary.json."""
    out_dir = Path(out_dir)
    log.write_events_csv(out_dir / "events.csv")
    write_metrics_csv(out_dir / "metrics.csv", log)
    roc = summary["detection"].get("roc") or {}
    curves = roc.pop("curves", {})
    if curves:
        write_json_atomic(out_dir / "roc_curves.json", curves)
    twins = twin_logs(out_dir)
    plots.loss_curves(
        log, out_dir / "loss.png", f"{summary['scenario']}: loss", summary["training"]["optimum_loss"], twins=twins
    )
    rule = roc.get("rule") or {}
    extra = plots.detection_plots(log, out_dir, {rule["statistic"]: rule["configured"]} if rule else None)
    extra += plots.roc_plots(roc, curves, out_dir)
    as_run = out_dir / "scenario.yaml"
    (out_dir / "report.md").write_text(report_md(summary, extra, as_run.read_text() if as_run.is_file() else None))
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


def write_metrics_csv(path: Path, log: EventLog) -> None:
    """metrics.csv: one row per optimizer step (columns: `metrics.STEP_COLUMNS`), for pandas."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS)
        w.writeheader()
        w.writerows(step_rows(log))


def rebuild(out_dir: Path) -> dict:
    """Recompute summary.json, report.md and plots of a saved run folder (validated first: folders.py)."""

    run = folders.load(Path(out_dir))  # ConfigError naming the folder and every problem; no plug-in imported
    out_dir, sc, log, old, twins = run.path, run.scenario, run.log, run.old_summary, run.twins
    meta = log.meta
    tokens_per_step = sc.pipeline.microbatches * sc.data.batch_size * sc.model.seq_len
    impact = impact_metrics(log, twins, meta.get("optimum_loss"), tokens_per_step) if twins else None
    cost = old.get("cost") if isinstance(old.get("cost"), dict) else {}
    summary = build_summary(
        log,
        scenario=sc,
        backend=meta.get("backend", "sim"),
        malicious=meta.get("malicious", []),
        result={
            "initial_val_loss": float(log.evals["val_loss"][0]),
            "final_val_loss": float(log.evals["val_loss"][-1]),
        },
        bytes_sent=int(log.messages["bytes"].sum()),
        wall_s=_number(cost.get("wall_s")),
        detector_s=_number(cost.get("detector_s")),
        optimum_loss=meta.get("optimum_loss"),
        impact=impact,
        sim_time_s=(old.get("transport") or {}).get("sim_time_s") if isinstance(old.get("transport"), dict) else None,
        clean=twins.get("clean"),
        rule=run.rule,
    )
    summary["transport"].update(meta.get("transport", {}) if isinstance(meta.get("transport"), dict) else {})
    summary["cost"]["recomputed_messages"] = int(_number(cost.get("recomputed_messages")))
    rule = (summary["detection"].get("roc") or {}).get("rule")
    if rule and run.confirm is not None:
        c, used = run.confirm
        summary["detection"]["roc"]["confirmation"] = confirmation_metrics(
            c, c.meta.get("malicious", []), rule["recommended"], rule["threshold_key"], used
        )
    return finish(out_dir, log, summary)


def _number(v) -> float:
    """A saved figure, or 0.0 when a tampered summary holds something else."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0


def _f(v, fmt=".4f") -> str:
    return "n/a" if v is None else format(v, fmt)


def report_md(summary: dict, figures: list[str] = (), scenario_yaml: str | None = None) -> str:
    t, w, d = summary["training"], summary["workers"], summary["detection"]
    m, wk, imp = d["messages"], d["workers"], summary["impact"]
    why = {k: "n/a" for k in headline(summary)} | reasons(summary)
    lines = [
        f"# Run report: {summary['scenario']}",
        "",
        f"- backend `{summary['backend']}`, seed {summary['seed']}, {w['total']} workers "
        f"({w['stages']} stages x {w['replicas']} replicas); malicious: {', '.join(w['malicious']) or 'none'}",
        f"- validation loss {_f(t['initial_val_loss'])} -> {_f(t['final_val_loss'])} after {t['steps']} steps"
        + (f" (optimum {_f(t['optimum_loss'])}, excess {_f(t['excess_loss'])})" if t.get("optimum_loss") else ""),
        f"- bytes on the wire: {summary['transport']['bytes_sent']:,}; wall time {summary['cost']['wall_s']:.1f} s "
        f"(detector {summary['cost']['detector_s']:.2f} s"
        + (
            f", {summary['cost']['recomputed_messages']:,} messages recomputed"
            if summary["cost"].get("recomputed_messages")
            else ""
        )
        + ")",
        *(
            [
                f"- simulated clock ({summary['transport'].get('network_preset')} network): "
                f"{summary['transport']['sim_time_s']:.1f} s, {_f(summary['transport'].get('sim_tokens_per_s'), ',.0f')} "
                "tokens/s"
            ]
            if summary["transport"].get("sim_time_s")
            else []
        ),
        "",
        "## Detection",
        "",
        "| level | precision | recall | F1 | FPR | details |",
        "|---|---|---|---|---|---|",
        f"| messages | {fmt(m['precision'], '.3f', why_undefined('precision', m))} | "
        f"{fmt(m['recall'], '.3f', why_undefined('recall', m))} | {fmt(m['f1'], '.3f', why_undefined('f1', m))} | "
        f"{fmt(m['fpr'], '.4f', why_undefined('fpr', m))} | TP {m['tp']}, FP {m['fp']}, FN {m['fn']}, TN {m['tn']}; "
        f"contaminated downstream {m.get('contaminated', {}).get('messages', 0)} "
        f"(flagged {m.get('contaminated', {}).get('flagged', 0)}) |",
        f"| workers | {fmt(wk['precision'], '.3f', why['worker_precision'])} | "
        f"{fmt(wk['recall'], '.3f', why['worker_recall'])} | {fmt(wk['f1'], '.3f', why['worker_f1'])} | | "
        f"banned {', '.join(wk['banned']) or 'none'}; false bans {wk['false_bans']}; median steps to ban "
        f"{fmt(wk['median_steps_to_ban'], '.1f', why['steps_to_ban'])}, max "
        f"{fmt(wk.get('max_steps_to_ban'), 'd', why['steps_to_ban'])} |",
        "",
        *group_tables(summary),
    ]
    clean = d.get("clean_twin")
    if clean:
        lines += [
            f"Clean twin (same run, no attack, same defence): message FPR {_f(clean['fpr'], '.4f')} "
            f"({clean['fp']} of {clean['checked']} checked), false bans {clean['false_bans']}, ARL0 "
            + (
                f"{clean['arl0']:.1f} steps between false alarms"
                if clean.get("arl0")
                else f"> {clean['steps']} steps (no false alarm)"
            )
            + ".",
            "",
        ]
    lines += roc_md(d.get("roc") or {})
    lines += impact_md(imp)
    lines += ["## Figures", "", "![loss curves](loss.png)", ""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    if scenario_yaml:
        lines += ["", "## Scenario (as run, after overrides)", "", "```yaml", scenario_yaml.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def impact_md(imp: dict) -> list[str]:
    """Final validation losses of the run and its twins, and the damage as differences from the clean twin."""
    losses = {
        k: imp[f"{k}_val_loss"] for k in ("defended", "clean", "undefended") if imp.get(f"{k}_val_loss") is not None
    }
    if not losses:
        return []
    lines = [
        "## Convergence impact (twin runs, same seed and data order)",
        "",
        *md_table(
            ["run", "final validation loss", "minus clean twin"],
            [
                [
                    k,
                    fmt(v, ".4f"),
                    fmt(None if "clean" not in losses else v - losses["clean"], "+.4f", "n/a: no clean twin"),
                ]
                for k, v in losses.items()
            ],
        ),
        "",
    ]
    if imp.get("recovered_fraction") is not None:
        lines += [
            f"The defence recovers {imp['recovered_fraction']:.1%} of the attack's damage "
            "((undefended - defended) / (undefended - clean)). One seed, no interval: a ratio of two "
            "loss differences can swing widely between seeds; `--seeds N` gives the paired "
            "differences with 95% intervals, and a recovered fraction only where the damage is "
            "measurable.",
            "",
        ]
    return lines


def roc_md(roc: dict) -> list[str]:
    if not roc.get("statistics"):
        return []
    lines = [
        f"## Thresholds (ROC from this {roc['mode']} run)",
        "",
        "| statistic | AUROC | AUROC within streams | average precision | tampered | clean |",
        "|---|---|---|---|---|---|",
    ]
    rows = dict(roc["statistics"])
    if roc.get("rule"):
        rows = {f"**rule: {roc['rule']['statistic']} > {roc['rule']['threshold_key']}**": roc["rule"], **rows}
    lines += [
        f"| {k} | {_f(v['auroc'], '.3f')} | {_f(v.get('auroc_within_streams'), '.3f')} "
        f"| {_f(v['average_precision'], '.3f')} | {v['positives']} | {v['negatives']} |"
        for k, v in rows.items()
    ]
    paused = roc.get("paused") or {}
    if any(paused.values()):
        lines.append(
            f"\nMessages paused downstream of a flag in their microbatch (never judged) are left out: "
            f"{paused['tampered']} tampered, {paused['clean']} clean (message metrics count the tampered "
            "ones as missed)."
        )
    lines.append("")
    rule = roc.get("rule")
    if rule:
        rec = rule["recommended"]
        if rec["threshold"] is not None:
            lines.append(
                f"Recommended `{rule['threshold_key']}` = {rec['threshold']:.4g} for target FPR {rec['target_fpr']:g}: "
                f"FPR {_f(rec['fpr'], '.4f')} on the {'clean twin' if rec.get('negatives_from') == 'clean_twin' else 'clean messages of this run'}, "
                f"TPR {_f(rec['tpr'], '.3f')} in this run (configured: {rule['configured']:g})."
                + (f" {rec['note']}." if rec.get("note") else "")
            )
        else:
            lines.append(f"No threshold meets target FPR {rec['target_fpr']:g}: {rec['note']}.")
        conf = roc.get("confirmation")
        if conf:
            lines += [
                "",
                f"Closed-loop confirmation at {conf['threshold_key']} = {conf['threshold']:.4g}: FPR "
                f"{_f(conf['fpr'], '.4f')} (target {conf['target_fpr']:g}, open loop {_f(conf['open_loop_fpr'], '.4f')}), "
                f"message F1 {_f(conf['f1'], '.3f')}, worker F1 {_f(conf['worker_f1'], '.3f')}, false bans "
                f"{conf['false_bans']}. Open and closed loop differ: bans and dropped microbatches change the "
                "trajectory, and with it the statistics.",
            ]
        lines.append("")
    return lines


COMBINED = [
    "final_val_loss",
    "msg_precision",
    "msg_recall",
    "msg_f1",
    "msg_fpr",
    "worker_f1",
    "false_bans",
    "steps_to_ban",
    "max_steps_to_ban",
    "clean_fpr",
    "damage_defended",
    "damage_undefended",
]


def combined_rows(dirs: list[Path]) -> list[dict]:
    """One row per result folder: its folder, scenario, seed and every HEADLINE metric (None where undefined)."""
    rows = []
    for d in dirs:
        s = json.loads((Path(d) / "summary.json").read_text())
        rows.append(
            {
                "run": str(d),
                "scenario": s.get("scenario"),
                "seed": s.get("seed"),
                **headline(s),
                "_why": reasons(s),
                "_groups": group_rows(s),
            }
        )
    return rows


def combined_table(dirs: list[Path]) -> str:
    """The markdown table of several result folders (undefined values say why)."""
    rows = combined_rows(dirs)
    labels = {m.name: m for m in HEADLINE}
    body = [[r["run"], *(fmt(r[c], labels[c].fmt, r["_why"].get(c, "n/a")) for c in COMBINED)] for r in rows]
    lines = md_table(["run", *(labels[c].label for c in COMBINED)], body)
    attacks = [(r["run"], g) for r in rows for g in r["_groups"] if g["group"] == "attack"]
    if attacks:
        lines += [
            "",
            *md_table(
                [
                    "run",
                    "attack",
                    "precision",
                    "recall",
                    "F1",
                    "FPR",
                    "median steps to ban",
                    "max steps to ban",
                    "attackers banned",
                ],
                [[run, *group_cells(g)] for run, g in attacks],
            ),
        ]
    return "\n".join(lines) + "\n"


def write_combined_csv(dirs: list[Path], path: Path) -> None:
    """`sentinel report DIR... --csv FILE`: one row per folder, every HEADLINE metric (empty where undefined)."""
    import csv

    rows = combined_rows(dirs)
    cols = ["run", "scenario", "seed", *(m.name for m in HEADLINE)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    groups = [{"run": r["run"], "seed": r["seed"], **g} for r in rows for g in r["_groups"]]
    if groups:  # per attack / role / boundary, beside it: FILE_groups.csv
        with open(path.with_name(f"{path.stem}_groups{path.suffix or '.csv'}"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(groups[0]))
            w.writeheader()
            w.writerows(groups)
