"""Cross-field rules of the `adversary` section (run by sentinel/scenario.py after every key is typed).

Each rule returns located problems `(yaml path, message)`; sentinel/scenario.py joins them into one
ConfigError. Per attack: the role must be one the attack class declares (`ROLES`), its workers must
be malicious, its schedule must let it act, and the class's own `check` runs (e.g. target_corruption
needs `protect` without `last`).
"""

from __future__ import annotations

from attacks.assignment import assign_malicious, assignment_problems
from attacks.schedule import schedule_problems
from sentinel.registry import ATTACKS

ROLE_SETS = {"activation": {"activation"}, "gradient": {"gradient"}, "both": {"activation", "gradient"},
             "dp_gradient": {"dp_gradient"}}


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
        out.append((f"{path}.role", f"attack {spec.name!r} does not support role {spec.role!r}; it supports "
                    f"{', '.join(sorted(cls.ROLES))}"))
    if spec.role == "dp_gradient" and spec.placement == "post_codec":
        out.append((f"{path}.placement", "the DP sync has no codec: role dp_gradient needs placement: pre_codec"))
    if spec.role == "dp_gradient" and sc.dp.sync != "allreduce":
        out.append((f"{path}.role", f"dp.sync is {sc.dp.sync}: replicas exchange no gradient to tamper with; "
                    "set dp.sync: allreduce"))
    mal = set(malicious)
    for j, wid in enumerate(spec.workers):
        if wid not in mal:
            how = "under this seed's random placement" if sc.adversary.placement == "random" else "in adversary.workers"
            out.append((f"{path}.workers[{j}]", f"{wid!r} is not a malicious worker {how} (malicious: "
                        f"{', '.join(malicious) or 'none'}); use placement: explicit to choose them"))
    out += [(f"{path}.{key}", msg) for key, msg in schedule_problems(spec, sc.training.steps)]
    if not out:
        out += cls.check(i, spec, sc, malicious)
    return out


def white_box_attacks(sc) -> list[str]:
    """YAML paths of the attacks that read the detector's public state (their class overrides `attach_view`)."""
    from attacks.base import Attack
    from attacks.gating import Wrapper

    def white_box(name: str, config) -> bool:
        cls = ATTACKS.get(name)
        if issubclass(cls, Wrapper):
            return white_box(config.attack, None)
        return cls.attach_view is not Attack.attach_view

    return [f"adversary.attacks[{i}].name" for i, spec in enumerate(sc.adversary.attacks)
            if white_box(spec.name, spec.config)]
