"""Every rank writes its part of the EventLog; rank 0 merges them into the log `sim` would have written.

    verifier ranks   messages and verdicts of their boundaries
    worker ranks     ground truth (the adversary runs there) and, on the last stage, training losses
    rank 0           also evaluations and bans (every rank applies the bans; rank 0's record is kept)

Message ids are canonical (`sentinel.transport.message.message_id`), so every part names a message the same
way; merging is concatenating the tables (worker and attack names re-indexed through their strings) and
putting the rows in the canonical order (`EventLog.canonicalize`), which sim's log is put in too. Logs travel
between ranks as in-memory `.npz` bytes (numeric arrays plus a JSON string table; loaded with
`allow_pickle=False`).
"""

from __future__ import annotations

import io
import json

import numpy as np

from sentinel.eventlog import EventLog, Table

OWN = {
    "messages": "verifier",
    "verdicts": "verifier",
    "ground_truth": "worker",
    "losses": "worker",
    "evals": "coordinator",
    "bans": "coordinator",
}  # which kind of part holds each table


def log_to_bytes(log: EventLog) -> bytes:
    arrays = {f"{t}.{k}": v for t in EventLog.TABLES for k, v in getattr(log, t).as_arrays().items()}
    strings = json.dumps({"workers": log.workers, "attacks": log.attacks, "meta": log.meta})
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
    log.meta = dict(strings.get("meta", {}))
    return log


def _append(dst: EventLog, src: EventLog, table: str) -> None:
    """The rows of `src.table` appended to `dst.table`, worker and attack indices translated by name."""
    t = getattr(src, table)
    arrays = t.as_arrays()
    cols = {"sender", "receiver", "worker", "replaced_by"} & set(arrays)
    for i in range(len(t)):
        row = {k: v[i] for k, v in arrays.items()}
        for c in cols:
            if row[c] >= 0:
                row[c] = dst.worker_index(src.workers[int(row[c])])
        if "attack" in row:
            row["attack"] = dst.attack_index(src.attacks[int(row["attack"])])
        for k in arrays:
            if k.startswith("score_"):
                getattr(dst, table).add_column(k, np.float32, np.nan)
        getattr(dst, table).append(**row)


def merge(base: EventLog, parts: list[tuple[str, EventLog]]) -> EventLog:
    """Rank 0's log (`base`, the coordinator's part) completed with every part's rows (in place; returns it).

    `parts` are (kind, log) with kind "verifier" or "worker"; `base` itself is rank 0's part (a verifier)."""
    own = {t: getattr(base, t) for t in ("evals", "bans")}
    merged = EventLog()
    for wid in base.workers:
        merged.worker_index(wid)
    for kind, part in [("verifier", base), *parts]:
        for w in part.workers:
            merged.worker_index(w)
        for table, holder in OWN.items():
            if holder == kind:
                _append(merged, part, table)
    for table, t in own.items():
        tmp = EventLog()
        tmp.workers = base.workers
        setattr(tmp, table, t)
        _append(merged, tmp, table)
    for name in EventLog.TABLES:
        setattr(base, name, getattr(merged, name))
    base.attacks = merged.attacks
    for w in merged.workers:
        base.worker_index(w)
    return base.canonicalize()
