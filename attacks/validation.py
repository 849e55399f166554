"""Cross-field rules of the `adversary` section (run by sentinel/scenario.py after every key is typed).

Each rule returns located problems `(yaml path, message)`; sentinel/scenario.py joins them into one
ConfigError. Per attack: the role must be one the attack class declares (`ROLES`), its workers must
be malicious, its schedule must let it act, and the class's own `check` runs (e.g. target_corruption
needs `protect` without `last`).
"""

from __future__ import annotations

from attacks.assignment import assign_malicious, assignment_problems
from attacks.base import Attack
from attacks.gating import Wrapper
from attacks.schedule import schedule_problems
from sentinel.registry import AGGREGATORS, ATTACKS
from sentinel.scenario import cross_check

ROLE_SETS = {
    "activation": {"activation"},
    "gradient": {"gradient"},
    "both": {"activation", "gradient"},
    "dp_gradient": {"dp_gradient"},
}


@cross_check
def check_adversary(sc) -> list[tuple[str, str]]:
    """Every cross-field problem of `sc.adversary` (empty when the section is consistent)."""
    out = assignment_problems(sc)
    if out:
        return out
    malicious = assign_malicious(sc.adversary, sc.pipeline.stages, sc.pipeline.replicas, sc.seed)
    for i, spec in enumerate(sc.adversary.attacks):
        out += attack_problems(i, spec, sc, malicious)
    return out


def attack_problems(i: int, spec, sc, malicious: list[str]) -> list[tuple[str, str]]:
    path = f"adversary.attacks[{i}]"
    cls = ATTACKS.get(spec.name)
    out: list[tuple[str, str]] = []
    if not ROLE_SETS[spec.role] <= set(cls.ROLES):
        out.append(
            (
                f"{path}.role",
                f"attack {spec.name!r} does not support role {spec.role!r}; it supports {', '.join(sorted(cls.ROLES))}",
            )
        )
    if spec.role == "dp_gradient" and spec.placement == "post_codec":
        out.append((f"{path}.placement", "the DP sync has no codec: role dp_gradient needs placement: pre_codec"))
    if spec.role == "dp_gradient" and sc.dp.sync != "allreduce":
        out.append(
            (
                f"{path}.role",
                f"dp.sync is {sc.dp.sync}: replicas exchange no gradient to tamper with; set dp.sync: allreduce",
            )
        )
    mal = set(malicious)
    for j, wid in enumerate(spec.workers):
        if wid not in mal:
            how = "under this seed's random placement" if sc.adversary.placement == "random" else "in adversary.workers"
            out.append(
                (
                    f"{path}.workers[{j}]",
                    f"{wid!r} is not a malicious worker {how} (malicious: "
                    f"{', '.join(malicious) or 'none'}); use placement: explicit to choose them",
                )
            )
    out += [(f"{path}.{key}", msg) for key, msg in schedule_problems(spec, sc.training.steps)]
    if not out:
        out += cls.check(i, spec, sc, malicious)
    return out


def white_box_attacks(sc) -> list[str]:
    """YAML paths of the attacks that read the detector's public state (their class overrides `attach_view`)."""

    def white_box(name: str, config) -> bool:
        cls = ATTACKS.get(name)
        if issubclass(cls, Wrapper):
            return white_box(config.attack, None)
        return cls.attach_view is not Attack.attach_view

    return [
        f"adversary.attacks[{i}].name"
        for i, spec in enumerate(sc.adversary.attacks)
        if white_box(spec.name, spec.config)
    ]


@cross_check
def dp_aggregator_domain(sc) -> list[tuple[str, str]]:
    """A robust DP aggregator must tolerate the malicious replicas of a stage when they attack the DP sync."""
    if not any(a.role == "dp_gradient" for a in sc.adversary.attacks):
        return []
    try:
        malicious = assign_malicious(sc.adversary, sc.pipeline.stages, sc.pipeline.replicas, sc.seed)
    except Exception:  # malformed adversary sections are reported by check_adversary
        return []
    per_stage: dict[str, int] = {}
    for wid in malicious:
        stage = wid.split("r")[0]
        per_stage[stage] = per_stage.get(stage, 0) + 1
    f = max(per_stage.values(), default=0)
    agg = sc.dp.aggregator
    msg = AGGREGATORS.get(agg.name).check_domain(agg.config, sc.pipeline.replicas, f) if f else None
    if msg:
        return [
            (
                "dp.aggregator.name",
                f"{msg}; the adversary holds {f} of {sc.pipeline.replicas} replicas of a "
                "stage and attacks the DP sync: choose another aggregator, raise pipeline.replicas or lower "
                "adversary.fraction",
            )
        ]
    return []
