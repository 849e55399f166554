"""`sentinel thresholds DIR...`: one detector threshold for several attacks and seeds.

"Which k keeps the clean FPR at or below 1% while every attack keeps recall >= 0.9?" The input is any mix
of open-loop result folders, sweeps and `run --seeds` folders (each searched for result folders). From
every open-loop run it takes the detector's logged decision statistic (`Detector.threshold_rule`:
SENTINEL flags <=> `exceedance > k`; sentinel/scoring/roc.py turns it into a decision score per message)
so one run scores every k >= k_learn, where its open-loop verdicts are exact:

- clean FPR(k): flagged share of the honest messages of each run's clean twin (same seed, no attack,
  same defence: the traffic a deployed detector sees when nobody attacks); a run without a clean twin
  contributes its own clean messages instead, and the output says so. Per seed the clean sets are
  pooled (identical twins shared by a sweep count once); the mean over seeds comes with its 95%
  Student-t interval;
- recall(k) per attack: flagged share of that attack's tampered messages (contaminated and paused
  messages left out, as in the ROC), mean over seeds;
- the chosen k: the smallest k >= k_learn whose clean FPR (mean, or with `--fpr-bound upper` its
  interval's upper end) meets the target. Recall only falls as k grows, so if the worst attack's recall
  at that k is below `--min-recall`, no k meets both, and the output says which attacks fall short.

Closed-loop runs are skipped (their verdicts are exact only at the k they ran: bans and drops change the
trajectory), with the reason.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sentinel import scenario as scenario_mod
from sentinel import strictjson
from sentinel.errors import ConfigError
from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import checked_messages
from sentinel.scoring.roc import _paused, rule_scores
from sentinel.scoring.stats import METHOD, mean_ci
from sentinel.scoring.summary import threshold_rule
from sentinel.scoring.tables import md_table

SKIP = {"confirm", "twins"}  # a run's closed-loop confirmation; a sweep's twin cache


def find_runs(dirs: list[Path]) -> list[Path]:
    """Result folders (summary.json + events.npz + scenario.yaml) in or under each DIR, twins excluded."""
    found: list[Path] = []
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"{d}: not a folder; give result folders, sweeps or `run --seeds` folders")
        here = (
            [d]
            if _is_run(d)
            else sorted(
                p.parent
                for p in d.rglob("summary.json")
                if _is_run(p.parent)
                and not any(part in SKIP or part.startswith(("twin_", ".")) for part in p.parent.relative_to(d).parts)
            )
        )
        if not here:
            raise ConfigError(f"{d}: no result folder (summary.json, events.npz, scenario.yaml) in or under it")
        found += [p for p in here if p not in found]
    return found


def _is_run(d: Path) -> bool:
    return all((d / f).is_file() for f in ("summary.json", "events.npz", "scenario.yaml"))


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    """{dotted.key: JSON value} of a scenario (list items by index: adversary.attacks.0.b)."""
    if isinstance(d, (dict, list)) and d:
        out: dict[str, str] = {}
        for k, v in d.items() if isinstance(d, dict) else enumerate(d):
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(d, sort_keys=True)}


def load_run(d: Path) -> dict:
    """One open-loop run's decision scores: per attack the tampered messages', and the honest negatives."""

    try:
        sc = scenario_mod.validate(yaml.safe_load((d / "scenario.yaml").read_text()))
    except ConfigError as exc:
        raise ConfigError([f"{d}/scenario.yaml: {p}" for p in exc.problems]) from None
    rule = threshold_rule(sc)
    base = {"dir": d, "seed": sc.seed, "scenario": sc}
    if rule is None:
        return {**base, "skip": f"detector {sc.detector.name!r} declares no threshold rule"}
    if sc.detector.mode != "open_loop":
        return {**base, "skip": "closed loop: its verdicts are exact only at the threshold it ran"}
    if rule.get("exact_from") is None:
        return {**base, "skip": f"{sc.detector.name}'s open-loop verdicts are exact only at its configured threshold"}
    log = EventLog.load(d)
    c, v = checked_messages(log), log.verdicts.as_arrays()
    s = rule_scores(c, v, rule)
    keep = ~c["contaminated"] & ~_paused(v)
    pos = {}
    for a, name in enumerate(log.attacks):
        sel = keep & c["tampered"] & (c["attack"] == a)
        roles = sorted({int(r) for r in c["role"][sel]})
        label = f"{name}/{'+'.join(['activation', 'gradient', 'dp_gradient'][r] for r in roles)}" if roles else name
        pos[label] = s[sel]
    twin = d / "twin_clean"
    if (twin / "events.npz").is_file():
        tl = EventLog.load(twin)
        tc, tv = checked_messages(tl), tl.verdicts.as_arrays()
        neg = rule_scores(tc, tv, rule)[~tc["tampered"] & ~tc["contaminated"] & ~_paused(tv)]
        neg_key, source = hashlib.sha256((twin / "events.npz").read_bytes()).hexdigest(), "clean twin"
    else:
        neg, neg_key, source = s[keep & ~c["tampered"]], f"own:{d}", "own clean messages"
    return {
        **base,
        "rule": rule,
        "pos": pos,
        "neg": neg,
        "neg_key": neg_key,
        "source": source,
        "setting": _flat({k: v for k, v in sc.to_dict().items() if k not in ("name", "description", "seed", "sweep")}),
    }


def _labels(runs: list[dict]) -> None:
    """Attack labels keep the settings that tell two runs with the same attack apart (e.g. two codecs)."""
    by_label: dict[str, list[dict]] = collections.defaultdict(list)
    for r in runs:
        for lab in r["pos"]:
            by_label[lab].append(r)
    for r in runs:
        renamed = {}
        for lab, scores in r["pos"].items():
            peers = by_label[lab]
            keys = sorted({k for p in peers for k in p["setting"]})
            varying = [k for k in keys if len({p["setting"].get(k) for p in peers}) > 1]
            extra = ", ".join(f"{k}={json.loads(r['setting'][k]) if k in r['setting'] else None}" for k in varying)
            renamed[f"{lab} ({extra})" if extra else lab] = scores
        r["pos"] = renamed


def _rates(scores: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Share of `scores` strictly above each k (flag <=> score > k)."""
    srt = np.sort(scores)
    return (len(srt) - np.searchsorted(srt, ks, side="right")) / len(srt) if len(srt) else np.full(len(ks), np.nan)


def evaluate(runs: list[dict], ks: np.ndarray) -> dict:
    """Per k: clean FPR per seed (pooled over distinct negative sets) and recall per attack per seed."""
    seeds = sorted({r["seed"] for r in runs})
    negs: dict[int, dict[str, np.ndarray]] = collections.defaultdict(dict)
    for r in runs:
        negs[r["seed"]][r["neg_key"]] = r["neg"]
    fpr_seed = {}
    for s in seeds:
        pooled = np.concatenate(list(negs[s].values()))
        fpr_seed[s] = _rates(pooled, ks) if len(pooled) else np.full(len(ks), np.nan)
    recall: dict[str, dict[int, np.ndarray]] = collections.defaultdict(dict)
    for r in runs:
        for lab, scores in r["pos"].items():
            if len(scores):
                recall[lab][r["seed"]] = _rates(scores, ks)
    return {"seeds": seeds, "fpr": fpr_seed, "recall": dict(recall)}


def recommend_across(
    dirs: list[Path], target_fpr: float, min_recall: float, bound: str = "mean", out: Path | None = None
) -> dict:
    """The table k -> clean FPR (95% CI over seeds), recall per attack, worst case; the chosen k; files."""
    if not 0 < target_fpr < 1:
        raise ConfigError(f"--target-fpr: {target_fpr}; must be between 0 and 1 (e.g. --target-fpr 0.01)")
    if not 0 <= min_recall <= 1:
        raise ConfigError(f"--min-recall: {min_recall}; must be between 0 and 1 (e.g. --min-recall 0.9)")
    loaded = [load_run(d) for d in find_runs(dirs)]
    runs = [r for r in loaded if "skip" not in r]
    skipped = [r for r in loaded if "skip" in r]
    if not runs:
        raise ConfigError(
            [f"{r['dir']}: skipped: {r['skip']}" for r in skipped]
            + ["no open-loop run to score: run with --set detector.mode=open_loop"]
        )
    rules = {(r["rule"]["statistic"], r["rule"]["key"]) for r in runs}
    if len(rules) > 1:
        raise ConfigError(f"the runs use different threshold rules {sorted(rules)}; give runs of one detector")
    _labels(runs)
    k_min = max(float(r["rule"]["exact_from"]) for r in runs)
    all_neg = np.concatenate([r["neg"] for r in runs])
    finite = np.unique(all_neg[np.isfinite(all_neg) & (all_neg >= k_min)])
    ks = np.unique(np.concatenate([[k_min], finite]))
    ev = evaluate(runs, ks)
    table = _table(ev, ks)
    choice = _choose(table, ks, target_fpr, min_recall, bound)
    result = {
        "rule": runs[0]["rule"],
        "k_min": k_min,
        "target_fpr": target_fpr,
        "min_recall": min_recall,
        "bound": bound,
        "runs": len(runs),
        "seeds": ev["seeds"],
        "attacks": sorted(ev["recall"]),
        "negatives_from": sorted({r["source"] for r in runs}),
        **choice,
        "skipped": [f"{r['dir']}: {r['skip']}" for r in skipped],
    }
    out = out or dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "thresholds.csv", table, ks, result["attacks"])
    _plot(out / "thresholds.png", table, ks, result)
    result["markdown"] = _markdown(table, ks, result, out)
    (out / "thresholds.md").write_text(result["markdown"])
    (out / "thresholds.json").write_text(
        strictjson.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=2)  # NaN / Inf -> null
    )
    return result


def _table(ev: dict, ks: np.ndarray) -> dict:
    """Per k index: FPR estimate over seeds, mean recall per attack, the worst attack."""
    seeds = ev["seeds"]
    fpr = [
        mean_ci([None if np.isnan(ev["fpr"][s][i]) else float(ev["fpr"][s][i]) for s in seeds], (0.0, 1.0))
        for i in range(len(ks))
    ]
    recall = {lab: np.mean(np.stack(list(by_seed.values())), axis=0) for lab, by_seed in ev["recall"].items()}
    recall_ci = {
        lab: [mean_ci([float(v[i]) for v in by_seed.values()], (0.0, 1.0)) for i in range(len(ks))]
        for lab, by_seed in ev["recall"].items()
    }
    worst = np.min(np.stack(list(recall.values())), axis=0) if recall else np.full(len(ks), np.nan)
    worst_lab = [min(recall, key=lambda lab: recall[lab][i]) if recall else None for i in range(len(ks))]
    return {"fpr": fpr, "recall": recall, "recall_ci": recall_ci, "worst": worst, "worst_attack": worst_lab}


def _choose(table: dict, ks: np.ndarray, target: float, min_recall: float, bound: str) -> dict:
    def fpr_of(e):
        if bound == "upper" and e.high is not None:
            return e.high
        return e.mean

    ok = [i for i, e in enumerate(table["fpr"]) if fpr_of(e) is not None and fpr_of(e) <= target]
    if not ok:
        return {
            "chosen_k": None,
            "status": f"no k meets the clean FPR target {target:g}: honest messages are "
            "flagged whatever the threshold (integrity / replay flags) above that rate",
        }
    i = ok[0]
    worst = float(table["worst"][i])
    below = sorted(lab for lab, r in table["recall"].items() if r[i] < min_recall)
    e = table["fpr"][i]
    out = {
        "chosen_k": float(ks[i]),
        "chosen_index": i,
        "fpr_mean": e.mean,
        "fpr_ci": [e.low, e.high],
        "worst_recall": worst,
        "worst_attack": table["worst_attack"][i],
        "recall": {lab: float(r[i]) for lab, r in table["recall"].items()},
    }
    if below:
        out["status"] = (
            f"no k meets both: the smallest k meeting the FPR target leaves {len(below)} attack(s) "
            f"below recall {min_recall:g} ({', '.join(below)}); a larger k only lowers recall"
        )
        out["below_min_recall"] = below
    else:
        out["status"] = f"k = {ks[i]:.4g} meets both: clean FPR {e.mean:.4f} <= {target:g}, worst recall {worst:.3f}"
    if bound == "upper" and e.high is None:
        out["status"] += " (one seed: no interval, the mean was used)"
    return out


def _show_rows(ks: np.ndarray, result: dict) -> list[int]:
    """Indices of the k values shown in the markdown table: a log-spaced dozen, k_min, the chosen k, the configured k."""
    if len(ks) <= 14:
        return list(range(len(ks)))
    want = list(np.geomspace(max(ks[0], 1e-9), ks[-1], 12)) + [ks[0], result["rule"]["value"]]
    idx = {int(min(np.searchsorted(ks, w), len(ks) - 1)) for w in want}
    if result.get("chosen_index") is not None:
        idx.add(result["chosen_index"])
    return sorted(idx)


def _markdown(table: dict, ks: np.ndarray, result: dict, out: Path) -> str:
    rule, key = result["rule"], result["rule"]["key"]
    where = " and ".join(result["negatives_from"])
    lines = [
        f"# Threshold across attacks: {rule['statistic']} > {key}",
        "",
        f"{result['runs']} open-loop runs, seeds {', '.join(map(str, result['seeds']))}, "
        f"{len(result['attacks'])} attacks. Clean FPR on the {where}; {METHOD}. Exact for {key} >= "
        f"{result['k_min']:g} (k_learn).",
        "",
    ]
    body = []
    for i in _show_rows(ks, result):
        e = table["fpr"][i]
        fpr = (
            f"{e.mean:.4f}" + (f" [{e.low:.4f}, {e.high:.4f}]" if e.low is not None else "")
            if e.mean is not None
            else "n/a: no clean message"
        )
        mark = " **(chosen)**" if result.get("chosen_index") == i else ""
        body.append(
            [
                f"{ks[i]:.4g}{mark}",
                fpr,
                f"{table['worst'][i]:.3f} ({table['worst_attack'][i]})",
                "yes" if e.mean is not None and e.mean <= result["target_fpr"] else "no",
                "yes" if table["worst"][i] >= result["min_recall"] else "no",
            ]
        )
    lines += md_table(
        [
            key,
            "clean FPR (95% CI)",
            "worst-case recall (attack)",
            f"FPR <= {result['target_fpr']:g}",
            f"recall >= {result['min_recall']:g}",
        ],
        body,
    ) + [""]
    lines += [f"**{result['status']}**", ""]
    if result.get("chosen_k") is not None:
        i = result["chosen_index"]
        rows = [[lab, f"{r[i]:.3f}" + _ci(table["recall_ci"][lab][i])] for lab, r in sorted(table["recall"].items())]
        lines += [
            f"Recall per attack at {key} = {result['chosen_k']:.4g} (mean over seeds, 95% CI):",
            "",
            *md_table(["attack", "recall"], rows),
            "",
        ]
    if result["skipped"]:
        lines += ["Skipped:", "", *[f"- {s}" for s in result["skipped"]], ""]
    lines += [
        f"Every k in {out / 'thresholds.csv'}; recall against clean FPR per attack in {out / 'thresholds.png'}.",
        "",
    ]
    return "\n".join(lines)


def _ci(e) -> str:
    return f" [{e.low:.3f}, {e.high:.3f}]" if e.low is not None else ""


def _write_csv(path: Path, table: dict, ks: np.ndarray, attacks: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "k",
                "fpr_mean",
                "fpr_ci_low",
                "fpr_ci_high",
                "fpr_n",
                "worst_recall",
                "worst_attack",
                *(f"recall[{a}]" for a in attacks),
            ]
        )
        for i, k in enumerate(ks):
            e = table["fpr"][i]
            w.writerow(
                [
                    float(k),
                    e.mean,
                    e.low,
                    e.high,
                    e.n,
                    float(table["worst"][i]),
                    table["worst_attack"][i],
                    *(float(table["recall"][a][i]) for a in attacks),
                ]
            )


def _plot(path: Path, table: dict, ks: np.ndarray, result: dict) -> None:
    """Recall against clean FPR, one curve per attack (each point a k); the chosen k, target and minimum marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fpr = np.array([np.nan if e.mean is None else e.mean for e in table["fpr"]])
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    for j, (lab, r) in enumerate(sorted(table["recall"].items())):
        style = "--" if "/gradient" in lab else "-"  # one colour per attack, dashed for gradient roles
        ax.step(fpr[::-1], r[::-1], where="post", lw=1.2, ls=style, color=plt.cm.tab20(j % 20), label=lab)
    if result.get("chosen_k") is not None:
        i = result["chosen_index"]
        ax.axvline(fpr[i], color="k", lw=1.0, label=f"chosen {result['rule']['key']} = {result['chosen_k']:.3g}")
    ax.axvline(result["target_fpr"], color="r", ls=":", lw=0.9, label=f"target FPR {result['target_fpr']:g}")
    ax.axhline(result["min_recall"], color="grey", ls="--", lw=0.8, label=f"min recall {result['min_recall']:g}")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(left=0.0)
    where = " and ".join(result["negatives_from"])
    ax.set_xlabel(f"clean FPR (mean over seeds) on the {where}; log scale", fontsize=8)
    ax.set_ylabel("recall of the attack's tampered messages")
    ax.set_title(
        f"{result['rule']['statistic']} > {result['rule']['key']}: recall vs clean FPR, every "
        f"{result['rule']['key']} >= {result['k_min']:g}",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the axes: curves stay visible
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
