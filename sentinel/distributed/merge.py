"""Every rank writes its part of the EventLog; rank 0 merges them into the log `sim` would have written.

    relay (rank 0)   messages (ids in sim's order), verdicts, bans, evals
    sender ranks     ground truth (the adversary runs there; message ids are provisional)
    last stage       training losses

Merging maps each ground-truth row to the relay's id of the same message -- (step, mb, role, sender)
identifies a boundary message within a run -- keeps DP-sync rows (id -1) as they are, and orders rows
as sim appends them: pipeline rows by message id within a step, then DP rows by (stage, worker);
losses by (step, mb). Attack names are re-indexed in order of first appearance. Logs travel between
ranks as in-memory `.npz` bytes (numeric arrays plus a JSON string table; loaded with
`allow_pickle=False`).
"""

from __future__ import annotations

import io
import json

import numpy as np

from sentinel.eventlog import EventLog, Table


def log_to_bytes(log: EventLog) -> bytes:
    arrays = {f"{t}.{k}": v for t in EventLog.TABLES for k, v in getattr(log, t).as_arrays().items()}
    strings = json.dumps({"workers": log.workers, "attacks": log.attacks, "meta": getattr(log, "meta", {})})
    arrays["strings"] = np.frombuffer(strings.encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def log_from_bytes(data: bytes) -> EventLog:
    log = EventLog()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        for t in EventLog.TABLES:
            cols = {k.split(".", 1)[1]: z[k] for k in z.files if k.split(".", 1)[0] == t}
            if cols:
                setattr(log, t, Table.from_arrays(cols))
        strings = json.loads(z["strings"].tobytes().decode("utf-8"))
    for w in strings["workers"]:
        log.worker_index(w)
    log.attacks = list(strings["attacks"])
    if hasattr(log, "meta"):
        log.meta = dict(strings.get("meta", {}))
    log._next_msg = int(log.messages["id"].max()) + 1 if len(log.messages) else 0
    return log


def _gt_rows(log: EventLog, msg_index: dict, base: EventLog) -> list[dict]:
    """Ground-truth rows of one part, with worker names resolved and message ids mapped to the relay's."""
    g = log.ground_truth
    rows = []
    for i in range(len(g)):
        worker = log.workers[int(g["worker"][i])]
        step, mb, role = int(g["step"][i]), int(g["mb"][i]), int(g["role"][i])
        msg = int(g["msg"][i])
        if role in (0, 1) and log is not base:
            msg = msg_index.get((step, mb, role, base.worker_index(worker)), -1)
        rows.append({"msg": msg, "step": step, "mb": mb, "role": role, "worker": worker,
                     "attack": log.attacks[int(g["attack"][i])], "norm_ratio": float(g["norm_ratio"][i])})
    return rows


def _order(row: dict, base: EventLog) -> tuple:
    if row["role"] in (0, 1):
        return (row["step"], 0, row["msg"], 0)
    widx = base.worker_index(row["worker"])
    return (row["step"], 1, int(row["worker"].split("r")[0][1:]), widx)


def merge(relay: EventLog, parts: list[EventLog]) -> EventLog:
    """The relay's log completed with the parts' ground truth and losses (in place; returns it)."""
    m = relay.messages
    msg_index = {(int(s), int(b), int(r), int(w)): int(i)
                 for i, s, b, r, w in zip(m["id"], m["step"], m["mb"], m["role"], m["sender"])}
    rows = _gt_rows(relay, msg_index, relay)
    loss_rows = [(int(s), int(b), float(v)) for s, b, v in zip(relay.losses["step"], relay.losses["mb"],
                                                                 relay.losses["loss"])]
    for part in parts:
        rows += _gt_rows(part, msg_index, relay)
        loss_rows += [(int(s), int(b), float(v)) for s, b, v in zip(part.losses["step"], part.losses["mb"],
                                                                     part.losses["loss"])]
    rows.sort(key=lambda r: _order(r, relay))
    relay.ground_truth = Table({k: v.dtype for k, v in relay.ground_truth.as_arrays().items()})
    relay.attacks = []
    for r in rows:
        relay.ground_truth.append(msg=r["msg"], step=r["step"], mb=r["mb"], role=r["role"],
                                  worker=relay.worker_index(r["worker"]), attack=relay.attack_index(r["attack"]),
                                  norm_ratio=r["norm_ratio"])
    relay.losses = Table({k: v.dtype for k, v in relay.losses.as_arrays().items()})
    for step, mb, loss in sorted(loss_rows, key=lambda r: (r[0], r[1])):
        relay.log_loss(step, mb, loss)
    return relay
