"""summary.json: the headline numbers of a run, computed from its EventLog.

The keys listed in the README ("summary.json") are a contract; more may be added. Metrics that
are undefined (0/0, e.g. precision with no flags) are written as null.
"""

from __future__ import annotations

from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import message_metrics, worker_metrics


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
) -> dict:
    final = result["final_val_loss"]
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
        "detection": {"messages": message_metrics(log), "workers": worker_metrics(log, malicious)},
        "impact": impact or {"clean_val_loss": None, "undefended_val_loss": None, "defended_val_loss": None},
        "transport": {"bytes_sent": int(bytes_sent), "messages": int(len(log.messages)), "sim_time_s": sim_time_s},
        "cost": {"wall_s": wall_s, "detector_s": detector_s},
    }
