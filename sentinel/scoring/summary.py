"""summary.json: the headline numbers of a run, computed from its EventLog.

The keys listed in the README ("summary.json") are a contract; more may be added. Metrics that
are undefined (0/0, e.g. precision with no flags) are written as null.
"""

from __future__ import annotations

import numpy as np

from sentinel.eventlog import EventLog


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def _f1(p: float | None, r: float | None) -> float | None:
    if p is None or r is None or p + r == 0:
        return None if p is None or r is None else 0.0
    return 2 * p * r / (p + r)


def message_metrics(log: EventLog) -> dict:
    """Confusion counts over checked messages: positive = tampered (ground truth), predicted = flagged."""
    v = log.verdicts
    checked = v["msg"]
    tampered = np.isin(checked, log.ground_truth["msg"])
    flagged = v["flagged"].astype(bool)
    tp = int((flagged & tampered).sum())
    fp = int((flagged & ~tampered).sum())
    fn = int((~flagged & tampered).sum())
    tn = int((~flagged & ~tampered).sum())
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "checked": int(len(checked)),
            "precision": precision, "recall": recall, "f1": _f1(precision, recall), "fpr": _ratio(fp, fp + tn)}


def worker_metrics(log: EventLog, malicious: list[str]) -> dict:
    """Bans against the true malicious set; steps from a worker's first tampered message to its ban."""
    banned = [log.workers[i] for i in log.bans["worker"]]
    mal = set(malicious)
    true_bans = [w for w in banned if w in mal]
    false_bans = [w for w in banned if w not in mal]
    precision, recall = _ratio(len(true_bans), len(banned)), _ratio(len(true_bans), len(mal))
    delays = []
    for w, step in zip(log.bans["worker"], log.bans["step"]):
        first = log.ground_truth["step"][log.ground_truth["worker"] == w]
        if len(first):
            delays.append(int(step) - int(first.min()))
    return {"precision": precision, "recall": recall, "f1": _f1(precision, recall), "banned": banned,
            "false_bans": len(false_bans), "false_banned": false_bans,
            "median_steps_to_ban": float(np.median(delays)) if delays else None}


def build_summary(log: EventLog, *, scenario, backend: str, malicious: list[str], result: dict,
                  bytes_sent: int, wall_s: float, detector_s: float, optimum_loss: float | None,
                  impact: dict | None = None, sim_time_s: float | None = None) -> dict:
    final = result["final_val_loss"]
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "backend": backend,
        "workers": {"total": scenario.num_workers, "malicious": sorted(malicious),
                    "stages": scenario.pipeline.stages, "replicas": scenario.pipeline.replicas},
        "training": {"initial_val_loss": result["initial_val_loss"], "final_val_loss": final,
                     "steps": scenario.training.steps, "optimum_loss": optimum_loss,
                     "excess_loss": None if optimum_loss is None else final - optimum_loss},
        "detection": {"messages": message_metrics(log), "workers": worker_metrics(log, malicious)},
        "impact": impact or {"clean_val_loss": None, "undefended_val_loss": None, "defended_val_loss": None},
        "transport": {"bytes_sent": int(bytes_sent), "messages": int(len(log.messages)), "sim_time_s": sim_time_s},
        "cost": {"wall_s": wall_s, "detector_s": detector_s},
    }
