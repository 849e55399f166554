"""Who is malicious: seeded per-stage assignment, explicit lists, protected stages, honest majority.

`placement: random` puts `n = round(fraction * R)` malicious replicas (half rounds up) in every stage
that `protect` does not keep honest (`first` = stage 0, `last` = stage S-1), choosing the replicas
with a numpy Generator seeded by the scenario seed. `placement: explicit` takes `workers` as given.
Honest majority per stage means `2 * malicious < R`; breaking it is a validation error unless
`allow_dishonest_majority: true` (the rule of SENTINEL's threat model, Lemma 1 in proofs/).
"""

from __future__ import annotations

import math
import re

import numpy as np

_ID = re.compile(r"s(\d+)r(\d+)")
_ASSIGN_SALT = 0xAD5


def parse_worker(wid: str) -> tuple[int, int] | None:
    """`"s2r1"` -> (2, 1); None when the id is malformed."""
    m = _ID.fullmatch(wid)
    return (int(m.group(1)), int(m.group(2))) if m else None


def malicious_per_stage(fraction: float, num_replicas: int) -> int:
    """round(fraction * R), halves rounded up (0.5 of 3 replicas -> 2)."""
    return int(math.floor(fraction * num_replicas + 0.5 + 1e-9))


def open_stages(num_stages: int, protect: tuple[str, ...]) -> list[int]:
    """Stages that may hold malicious workers."""
    closed = set()
    if "first" in protect:
        closed.add(0)
    if "last" in protect:
        closed.add(num_stages - 1)
    return [s for s in range(num_stages) if s not in closed]


def assign_malicious(adv, num_stages: int, num_replicas: int, seed: int) -> list[str]:
    """The malicious worker ids (sorted), from the `adversary` section of a scenario."""
    if adv.placement == "explicit":
        return sorted(set(adv.workers))
    n = malicious_per_stage(adv.fraction, num_replicas)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, _ASSIGN_SALT])
    out = []
    for s in open_stages(num_stages, adv.protect):
        for r in sorted(rng.choice(num_replicas, size=n, replace=False).tolist()):
            out.append(f"s{s}r{r}")
    return sorted(out)


def assignment_problems(sc) -> list[tuple[str, str]]:
    """Cross-field rules of the `adversary` section about who is malicious."""
    adv, S, R = sc.adversary, sc.pipeline.stages, sc.pipeline.replicas
    out: list[tuple[str, str]] = []
    if adv.placement == "explicit":
        if adv.fraction > 0:
            out.append(("adversary.fraction", "only used with placement: random; remove it or set placement: random"))
        out += _explicit_problems(adv, S, R)
    elif adv.workers:
        out.append(("adversary.workers", "only used with placement: explicit; set adversary.placement: explicit"))
    if out:
        return out
    if adv.placement == "random" and adv.fraction > 0:
        n = malicious_per_stage(adv.fraction, R)
        if not open_stages(S, adv.protect):
            out.append(
                (
                    "adversary.protect",
                    f"protects every stage of a {S}-stage pipeline: no worker can be "
                    "malicious; remove 'first' or 'last' or add stages",
                )
            )
        elif 2 * n >= R and n > 0 and not adv.allow_dishonest_majority:
            out.append(
                (
                    "adversary.fraction",
                    f"{adv.fraction} of {R} replicas rounds to {n} malicious per stage: "
                    f"no honest majority (needs 2 * malicious < {R}); lower the fraction, raise "
                    "pipeline.replicas, or set adversary.allow_dishonest_majority: true to study exactly that",
                )
            )
    malicious = assign_malicious(adv, S, R, sc.seed)
    if adv.attacks and not malicious and not out:
        where = "adversary.fraction" if adv.placement == "random" else "adversary.workers"
        out.append(
            (
                where,
                f"the scenario configures attacks but no worker is malicious (fraction {adv.fraction} of "
                f"{R} replicas rounds to 0 per stage); raise adversary.fraction or list adversary.workers",
            )
        )
    return out


def _explicit_problems(adv, S: int, R: int) -> list[tuple[str, str]]:
    out = []
    if not adv.workers:
        return [("adversary.workers", "placement: explicit needs a list of worker ids, e.g. [s1r0, s2r1]")]
    per_stage: dict[int, int] = {}
    closed = set(range(S)) - set(open_stages(S, adv.protect))
    for i, wid in enumerate(adv.workers):
        path = f"adversary.workers[{i}]"
        sr = parse_worker(wid)
        if sr is None:
            out.append((path, f"{wid!r} is not a worker id; ids read s<stage>r<replica>, e.g. s1r0"))
        elif sr[0] >= S or sr[1] >= R:
            out.append((path, f"{wid!r} does not exist: the mesh has stages 0..{S - 1} and replicas 0..{R - 1}"))
        elif wid in adv.workers[:i]:
            out.append((path, f"{wid!r} is listed twice"))
        elif sr[0] in closed:
            which = "first" if sr[0] == 0 else "last"
            out.append(
                (
                    path,
                    f"{wid!r} is in the {which} stage, which adversary.protect keeps honest; "
                    f"remove '{which}' from adversary.protect to allow it",
                )
            )
        else:
            per_stage[sr[0]] = per_stage.get(sr[0], 0) + 1
    if not adv.allow_dishonest_majority:
        for s, n in sorted(per_stage.items()):
            if 2 * n >= R:
                out.append(
                    (
                        "adversary.workers",
                        f"stage {s} has {n} malicious of {R} replicas: no honest majority "
                        "(needs 2 * malicious < replicas); set adversary.allow_dishonest_majority: true "
                        "to study exactly that",
                    )
                )
    return out
