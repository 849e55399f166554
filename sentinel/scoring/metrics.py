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
    """Overall confusion (contaminated messages excluded) plus per-attack, per-role and per-boundary views.

    A per-attack row scores that attack's tampered messages against every clean message (other attacks'
    messages left out): its FPR is the run's clean FPR, its precision counts every false positive.
    """
    c = checked_messages(log)
    keep = ~c["contaminated"]
    out = confusion(c["tampered"][keep], c["flagged"][keep])
    out["checked"] = int(len(c["flagged"]))
    out["contaminated"] = {
        "messages": int(c["contaminated"].sum()),
        "flagged": int((c["contaminated"] & c["flagged"]).sum()),
    }
    clean = keep & ~c["tampered"]
    out["per_attack"] = {}
    for a, name in enumerate(log.attacks):
        sel = c["attack"] == a
        row = confusion(c["tampered"][sel | clean], c["flagged"][sel | clean])
        out["per_attack"][name] = {"messages": int(sel.sum()), "detected": int((sel & c["flagged"]).sum()), **row}
    out["per_role"] = {
        ROLE_NAMES[r]: confusion(c["tampered"][keep & (c["role"] == r)], c["flagged"][keep & (c["role"] == r)])
        for r in np.unique(c["role"])
    }
    out["per_boundary"] = {
        int(b): confusion(c["tampered"][keep & (c["boundary"] == b)], c["flagged"][keep & (c["boundary"] == b)])
        for b in np.unique(c["boundary"])
    }
    return out


def ban_delays(log: EventLog, rows: np.ndarray | None = None) -> dict[str, tuple[int, int | None]]:
    """Per attacking worker: (step of its first tampered message, step of its first ban or None).

    `rows`: a boolean mask over the ground-truth rows (one attack, role or boundary); default all.
    """
    gt = log.ground_truth
    sel = np.ones(len(gt), dtype=bool) if rows is None else rows
    bans = {}
    for w, step in zip(log.bans["worker"], log.bans["step"]):
        bans.setdefault(int(w), int(step))
    out = {}
    for w in np.unique(gt["worker"][sel]):
        first = int(gt["step"][sel & (gt["worker"] == w)].min())
        out[log.workers[int(w)]] = (first, bans.get(int(w)))
    return out


def ban_summary(delays: dict[str, tuple[int, int | None]]) -> dict:
    """Steps from a worker's first tampered message to its ban, over the attacking workers in `delays`."""
    steps = [ban - first for first, ban in delays.values() if ban is not None]
    return {
        "attacking_workers": len(delays),
        "banned_workers": len(steps),
        "median_steps_to_ban": float(np.median(steps)) if steps else None,
        "max_steps_to_ban": int(max(steps)) if steps else None,
        "never_banned": sorted(w for w, (_, ban) in delays.items() if ban is None),
    }


def group_bans(log: EventLog) -> dict[str, dict]:
    """`ban_summary` per attack, per role and per boundary of the tampered messages."""
    gt = log.ground_truth
    boundary_of = dict(zip(log.messages["id"].tolist(), log.messages["boundary"].tolist()))
    gt_boundary = np.array([boundary_of.get(int(m), -1) for m in gt["msg"]], dtype=np.int64)
    return {
        "per_attack": {name: ban_summary(ban_delays(log, gt["attack"] == a)) for a, name in enumerate(log.attacks)},
        "per_role": {ROLE_NAMES[int(r)]: ban_summary(ban_delays(log, gt["role"] == r)) for r in np.unique(gt["role"])},
        "per_boundary": {
            int(b): ban_summary(ban_delays(log, gt_boundary == b)) for b in np.unique(gt_boundary) if b >= 0
        },
    }


def per_worker(log: EventLog, malicious: list[str]) -> list[dict]:
    """One row per worker that sent a message: malicious or not, its attacks, messages, flags, first flag, ban."""
    m, v, gt = log.messages, log.verdicts, log.ground_truth
    sender_of = dict(zip(m["id"].tolist(), m["sender"].tolist()))
    flagged_sender = np.array([sender_of.get(int(i), -1) for i in v["msg"][v["flagged"]]], dtype=np.int64)
    flag_step = log.messages["step"][np.isin(m["id"], v["msg"][v["flagged"]])]
    flag_who = m["sender"][np.isin(m["id"], v["msg"][v["flagged"]])]
    bans, ban_by = {}, {}
    for w, step, by in zip(log.bans["worker"], log.bans["step"], log.ban_rules()):
        if int(w) not in bans:
            bans[int(w)], ban_by[int(w)] = int(step), by
    mal = set(malicious)
    rows = []
    for w in np.unique(m["sender"]):
        w = int(w)
        tampered = gt["worker"] == w
        flags = flag_step[flag_who == w]
        rows.append(
            {
                "worker": log.workers[w],
                "malicious": log.workers[w] in mal,
                "attacks": sorted({log.attacks[a] for a in gt["attack"][tampered]}),
                "sent": int((m["sender"] == w).sum()),
                "tampered": int(tampered.sum()),
                "first_tampered": int(gt["step"][tampered].min()) if tampered.any() else None,
                "flags": int((flagged_sender == w).sum()),
                "first_flag": int(flags.min()) if len(flags) else None,
                "ban_step": bans.get(w),
                "ban_by": ban_by.get(w),
            }
        )
    return rows


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
        **group_bans(log),
        "per_worker": per_worker(log, malicious),
    }


STEP_COLUMNS = (
    "step",
    "train_loss",
    "val_loss",
    "messages",
    "checked",
    "flags",
    "tampered",
    "tampered_flagged",
    "clean_flagged",
    "bans",
    "banned",
)


def step_rows(log: EventLog) -> list[dict]:
    """metrics.csv: one row per optimizer step (`step` is the 0-based index used by events.csv and bans).

    `train_loss` is the mean over the step's microbatches, `val_loss` the validation loss at the end of
    the step (empty when it was not evaluated; the initial one is `training.initial_val_loss`),
    `flags` the verdicts that flagged, split by ground truth into `tampered_flagged` and `clean_flagged`
    (contaminated-downstream messages are in neither), `banned` the workers banned at that step.
    """
    n_steps = int(max([0, *(log.losses["step"] + 1), *(log.messages["step"] + 1), *log.evals["step"]]))
    c = checked_messages(log) if len(log.verdicts) else None
    tampered_step = np.bincount(log.ground_truth["step"], minlength=n_steps) if len(log.ground_truth) else None
    val = {int(s) - 1: float(v) for s, v in zip(log.evals["step"], log.evals["val_loss"]) if s > 0}
    rows = []
    for step in range(n_steps):
        losses = log.losses["loss"][log.losses["step"] == step]
        row = {
            "step": step,
            "train_loss": float(losses.mean()) if len(losses) else None,
            "val_loss": val.get(step),
            "messages": int((log.messages["step"] == step).sum()),
        }
        if c is not None:
            at = c["step"] == step
            row.update(
                checked=int(at.sum()),
                flags=int((at & c["flagged"]).sum()),
                tampered_flagged=int((at & c["flagged"] & c["tampered"]).sum()),
                clean_flagged=int((at & c["flagged"] & ~c["tampered"] & ~c["contaminated"]).sum()),
            )
        else:
            row.update(checked=0, flags=0, tampered_flagged=0, clean_flagged=0)
        row["tampered"] = int(tampered_step[step]) if tampered_step is not None and step < len(tampered_step) else 0
        banned = [log.workers[int(w)] for w, s in zip(log.bans["worker"], log.bans["step"]) if s == step]
        row.update(bans=len(banned), banned=";".join(banned))
        rows.append(row)
    return rows


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
