"""Detection metrics from an EventLog: the scorer is the only code that reads ground truth.

Message categories (each checked message is exactly one):
- `tampered`: the adversary acted on it (ground truth);
- `contaminated`: honest sender, but it carries upstream corruption of the same step and microbatch
  (activations downstream of a tampered activation; every gradient of that microbatch, since the
  backward pass runs through the corrupted forward; gradients upstream of a tampered gradient).
  Flagging one is neither a true nor a false positive; it is reported on its own;
- `clean`: everything else. A flag on a clean message is a false positive.
"""

from __future__ import annotations

import numpy as np

from sentinel.eventlog import EventLog
from sentinel.transport.message import Role

ROLE_NAMES = {int(r): r.label for r in Role}


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def _f1(p: float | None, r: float | None) -> float | None:
    if p is None or r is None:
        return None
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def confusion(tampered: np.ndarray, flagged: np.ndarray) -> dict:
    """Counts and rates for boolean arrays of the same length (positive = tampered)."""
    tp = int((flagged & tampered).sum())
    fp = int((flagged & ~tampered).sum())
    fn = int((~flagged & tampered).sum())
    tn = int((~flagged & ~tampered).sum())
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    return {
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": precision,
        "recall": recall,
        "f1": _f1(precision, recall),
        "fpr": _ratio(fp, fp + tn),
    }


def message_labels(log: EventLog) -> dict[str, np.ndarray]:
    """Per logged message (in `log.messages` order): tampered, attack id, contaminated."""
    m = log.messages
    n = len(m)
    pos = {int(i): j for j, i in enumerate(m["id"])}
    tampered = np.zeros(n, dtype=bool)
    attack = np.full(n, -1, dtype=np.int32)
    for msg_id, a in zip(log.ground_truth["msg"], log.ground_truth["attack"]):
        j = pos.get(int(msg_id))
        if j is not None:
            tampered[j], attack[j] = True, a
    contaminated = np.zeros(n, dtype=bool)
    if tampered.any():
        key = m["step"].astype(np.int64) * 1_000_003 + m["mb"]
        for j in np.flatnonzero(tampered):
            same = key == key[j]
            if m["role"][j] == Role.ACTIVATION:
                down = same & (
                    ((m["role"] == Role.ACTIVATION) & (m["boundary"] > m["boundary"][j])) | (m["role"] == Role.GRADIENT)
                )
            else:
                down = same & (m["role"] == Role.GRADIENT) & (m["boundary"] < m["boundary"][j])
            contaminated |= down
        contaminated &= ~tampered
    return {"tampered": tampered, "attack": attack, "contaminated": contaminated}


def checked_messages(log: EventLog) -> dict[str, np.ndarray]:
    """Labels restricted to messages that received a verdict, aligned with the verdicts table."""
    labels = message_labels(log)
    pos = {int(i): j for j, i in enumerate(log.messages["id"])}
    rows = np.array([pos[int(i)] for i in log.verdicts["msg"]], dtype=np.int64)
    out = {k: v[rows] for k, v in labels.items()}
    for k in ("step", "boundary", "role", "sender"):
        out[k] = log.messages[k][rows]
    out["flagged"] = log.verdicts["flagged"].astype(bool)
    return out


def message_metrics(log: EventLog) -> dict:
    """Overall confusion (contaminated messages excluded) plus per-attack, per-role and per-boundary views."""
    c = checked_messages(log)
    keep = ~c["contaminated"]
    out = confusion(c["tampered"][keep], c["flagged"][keep])
    out["checked"] = int(len(c["flagged"]))
    out["contaminated"] = {
        "messages": int(c["contaminated"].sum()),
        "flagged": int((c["contaminated"] & c["flagged"]).sum()),
    }
    out["per_attack"] = {}
    for a, name in enumerate(log.attacks):
        sel = c["attack"] == a
        out["per_attack"][name] = {
            "messages": int(sel.sum()),
            "detected": int((sel & c["flagged"]).sum()),
            "recall": _ratio((sel & c["flagged"]).sum(), sel.sum()),
        }
    out["per_role"] = {
        ROLE_NAMES[r]: confusion(c["tampered"][keep & (c["role"] == r)], c["flagged"][keep & (c["role"] == r)])
        for r in np.unique(c["role"])
    }
    out["per_boundary"] = {
        int(b): confusion(c["tampered"][keep & (c["boundary"] == b)], c["flagged"][keep & (c["boundary"] == b)])
        for b in np.unique(c["boundary"])
    }
    return out


def worker_metrics(log: EventLog, malicious: list[str]) -> dict:
    """Bans against the true malicious set; steps from a worker's first tampered message to its ban."""
    banned = [log.workers[i] for i in log.bans["worker"]]
    # a worker that sent tampered messages is an attacker, whatever the adversary layer was told: this
    # counts the senders of injected faults (dist `--fault`, ground truth `fault_<kind>`) as true bans
    mal = set(malicious) | {log.workers[i] for i in np.unique(log.ground_truth["worker"])}
    true_bans = [w for w in banned if w in mal]
    false_bans = [w for w in banned if w not in mal]
    # recall over malicious workers that actually attacked (a worker that never tampered cannot be caught)
    active = {log.workers[i] for i in np.unique(log.ground_truth["worker"])} & mal if len(log.ground_truth) else set()
    targets = active or mal
    precision = _ratio(len(true_bans), len(banned))
    recall = _ratio(len(set(true_bans) & targets), len(targets))
    delays = []
    for w, step in zip(log.bans["worker"], log.bans["step"]):
        first = log.ground_truth["step"][log.ground_truth["worker"] == w]
        if len(first):
            delays.append(int(step) - int(first.min()))
    never = sorted(
        {
            log.attacks[a]
            for a, w in zip(log.ground_truth["attack"], log.ground_truth["worker"])
            if log.workers[w] not in set(true_bans)
        }
    )
    return {
        "precision": precision,
        "recall": recall,
        "f1": _f1(precision, recall),
        "banned": banned,
        "false_bans": len(false_bans),
        "false_banned": false_bans,
        "attacking": sorted(active),
        "median_steps_to_ban": float(np.median(delays)) if delays else None,
        "max_steps_to_ban": int(max(delays)) if delays else None,
        "attacks_never_banned": never,
    }


def arl0(log: EventLog, steps: int) -> dict:
    """Average run length between false alarms on a run with no attack: steps / alarm steps."""
    flagged_steps = np.unique(
        log.messages["step"][np.isin(log.messages["id"], log.verdicts["msg"][log.verdicts["flagged"]])]
    )
    n = len(flagged_steps)
    return {
        "alarm_steps": int(n),
        "steps": int(steps),
        "arl0": steps / n if n else None,
        "note": None if n else f"no false alarm in {steps} steps (ARL0 > {steps})",
    }


def impact_metrics(defended: EventLog, twins: dict[str, EventLog], optimum: float | None, tokens_per_step: int) -> dict:
    """Convergence impact from the twin runs (same seed and data order).

    - `<run>_val_loss`: final validation loss; `<run>_excess`: over the data's optimum (synthetic source);
    - `recovered_fraction` = (undefended - defended) / (undefended - clean): the share of the attack's
      damage the defence recovers (null when the attack did no damage);
    - `tokens_to_target.<run>`: training tokens until the validation loss first reaches the target
      `clean_final + 0.1 * (initial - clean_final)` (null: never reached).
    """
    runs = {"defended": defended, **twins}
    out: dict = {f"{k}_val_loss": float(v.evals["val_loss"][-1]) for k, v in runs.items()}
    for k in ("clean", "undefended", "defended"):
        out.setdefault(f"{k}_val_loss", None)
    if optimum is not None:
        out.update(
            {f"{k}_excess": v - optimum for k, v in list(out.items()) if k.endswith("_val_loss") and v is not None}
        )
    clean, undef, dfd = out["clean_val_loss"], out["undefended_val_loss"], out["defended_val_loss"]
    out["recovered_fraction"] = (
        (undef - dfd) / (undef - clean) if None not in (clean, undef) and undef > clean else None
    )
    if "clean" in twins:
        c = twins["clean"].evals
        target = c["val_loss"][-1] + 0.1 * (c["val_loss"][0] - c["val_loss"][-1])
        out["target_val_loss"] = float(target)
        out["tokens_to_target"] = {}
        for k, v in runs.items():
            hit = np.flatnonzero(v.evals["val_loss"] <= target)
            out["tokens_to_target"][k] = int(v.evals["step"][hit[0]]) * tokens_per_step if len(hit) else None
    return out
