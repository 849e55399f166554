"""summary.json: the headline numbers of a run, computed from its EventLog.

The keys listed in the README ("summary.json") are a contract; more may be added. Metrics that
are undefined (0/0, e.g. precision with no flags) are written as null.
"""

from __future__ import annotations

from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import arl0, message_metrics, worker_metrics
from sentinel.scoring.roc import roc_report


def threshold_rule(scenario) -> dict | None:
    """The scenario detector's threshold rule (`Detector.threshold_rule`), or None if it declares none."""
    from sentinel.registry import DETECTORS

    cls = DETECTORS.get(scenario.detector.name)
    fn = getattr(cls, "threshold_rule", None)
    return fn(scenario.detector.config) if fn is not None and scenario.detector.config is not None else None


def clean_twin_metrics(clean: EventLog | None, steps: int) -> dict | None:
    """The detector on the clean twin (same run, no attack): message FPR, false bans and ARL0."""
    if clean is None or not len(clean.verdicts):
        return None
    m = message_metrics(clean)
    return {
        "fpr": m["fpr"], "fp": m["fp"], "checked": m["checked"],
        "false_bans": len(clean.bans), "banned": [clean.workers[i] for i in clean.bans["worker"]],
        **arl0(clean, steps),
    }


def confirmation_metrics(log: EventLog, malicious: list[str], recommended: dict, key: str, threshold: float) -> dict:
    """The closed-loop run at `threshold` (the recommendation it was run at): its FPR beside the target."""
    m, w = message_metrics(log), worker_metrics(log, malicious)
    return {
        "threshold_key": key, "threshold": threshold, "target_fpr": recommended.get("target_fpr"),
        "open_loop_fpr": recommended.get("fpr"), "fpr": m["fpr"], "precision": m["precision"],
        "recall": m["recall"], "f1": m["f1"], "worker_f1": w["f1"], "false_bans": w["false_bans"],
        "note": "closed loop differs from open loop: bans and dropped microbatches change the trajectory",
    }


def build_summary(
    log: EventLog,
    *,
    scenario,
    backend: str,
    malicious: list[str],
    result: dict,
    bytes_sent: int,
    wall_s: float,
    detector_s: float,
    optimum_loss: float | None,
    impact: dict | None = None,
    sim_time_s: float | None = None,
    clean: EventLog | None = None,
    rule: dict | None | str = "from_scenario",
) -> dict:
    """`rule`: the detector's threshold rule; by default asked of the scenario's detector plug-in (a saved
    folder passes the rule it saved, so re-scoring needs no plug-in code)."""
    final = result["final_val_loss"]
    rule = threshold_rule(scenario) if rule == "from_scenario" else rule
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "backend": backend,
        "workers": {
            "total": scenario.num_workers,
            "malicious": sorted(malicious),
            "stages": scenario.pipeline.stages,
            "replicas": scenario.pipeline.replicas,
        },
        "training": {
            "initial_val_loss": result["initial_val_loss"],
            "final_val_loss": final,
            "steps": scenario.training.steps,
            "optimum_loss": optimum_loss,
            "excess_loss": None if optimum_loss is None else final - optimum_loss,
        },
        "detection": {
            "messages": message_metrics(log),
            "workers": worker_metrics(log, malicious),
            # per-statistic AUROC and the rule's recommended threshold; `curves` is moved to roc_curves.json
            "roc": roc_report(log, rule, scenario.scoring.target_fpr, scenario.detector.mode, clean),
            "clean_twin": clean_twin_metrics(clean, scenario.training.steps),
        },
        "impact": impact or {"clean_val_loss": None, "undefended_val_loss": None, "defended_val_loss": None},
        "transport": {"bytes_sent": int(bytes_sent), "messages": int(len(log.messages)), "sim_time_s": sim_time_s},
        "cost": {"wall_s": wall_s, "detector_s": detector_s, "detector_share": detector_s / wall_s if wall_s else None},
    }
