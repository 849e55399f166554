"""EventLog: the append-only record of a run, in columnar buffers.

Tables (each a set of growable numpy columns; no Python object per number):
- `messages`: one row per boundary message (id, step, mb, boundary, role, sender, receiver, bytes)
- `ground_truth`: one row per tampered message (written by the adversary layer; detectors never read it)
- `verdicts`: one row per checked message (flagged + one float column per detector statistic)
- `losses`: per step and microbatch training loss; `evals`: validation loss per evaluation
- `bans`: worker bans and replacements, and the test that decided each ban (`by`: an index into `BAN_RULES`, -1
  where none is recorded: a ban from outside the responder's tests, or a folder written before the column existed)

Worker ids and attack names are stored as small integers into string tables. The log saves to
`events.npz` (+ `events.json` for the string tables) and reloads with `allow_pickle=False`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from sentinel import strictjson

# the responder's tests, in the order `bans.by` indexes them (sentinel/response.py's module docstring)
BAN_RULES = ("sequential", "hard", "soft", "certain", "route", "scores")


class Table:
    """Columns of a fixed dtype that grow by doubling; `append` writes one row."""

    def __init__(self, schema: dict[str, Any], capacity: int = 1024):
        self._dtypes = {k: np.dtype(v) for k, v in schema.items()}
        self._cols = {k: np.zeros(capacity, dtype=d) for k, d in self._dtypes.items()}
        self._fill: dict[str, Any] = {}
        self.n = 0

    @property
    def names(self) -> list[str]:
        return list(self._cols)

    def add_column(self, name: str, dtype: Any, fill: Any) -> None:
        if name in self._cols:
            return
        col = np.full(len(next(iter(self._cols.values()))), fill, dtype=dtype)
        self._cols[name], self._dtypes[name], self._fill[name] = col, np.dtype(dtype), fill

    def append(self, **row: Any) -> int:
        if self.n == len(next(iter(self._cols.values()))):
            for k, c in self._cols.items():
                grown = np.full(2 * len(c), self._fill.get(k, 0), dtype=c.dtype)
                grown[: self.n] = c[: self.n]
                self._cols[k] = grown
        i = self.n
        for k, v in row.items():
            self._cols[k][i] = v
        self.n += 1
        return i

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    def __len__(self) -> int:
        return self.n

    def as_arrays(self) -> dict[str, np.ndarray]:
        return {k: c[: self.n] for k, c in self._cols.items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Table:
        capacity = max(1, max((len(v) for v in arrays.values()), default=1))
        t = cls({k: v.dtype for k, v in arrays.items()}, capacity=capacity)
        # a float column not written by a row (a statistic the detector did not report for it) reads NaN, as it
        # does in a table that grew from the start (`add_column`); without this a reloaded log (a resumed run)
        # would fill such cells with 0
        t._fill = {k: np.nan for k, v in arrays.items() if v.dtype.kind == "f"}
        for k, v in arrays.items():
            t._cols[k][: len(v)] = v
            t.n = len(v)
        return t


class EventLog:
    """The run's single source of truth for the scorer."""

    TABLES = ("messages", "ground_truth", "verdicts", "losses", "evals", "bans")

    def __init__(self) -> None:
        self.messages = Table(
            {
                "id": np.int64,
                "step": np.int32,
                "mb": np.int32,
                "boundary": np.int16,
                "role": np.int8,
                "sender": np.int32,
                "receiver": np.int32,
                "bytes": np.int64,
            }
        )
        self.ground_truth = Table(
            {
                "msg": np.int64,
                "step": np.int32,
                "mb": np.int32,
                "role": np.int8,
                "worker": np.int32,
                "attack": np.int16,
                "norm_ratio": np.float32,
            }
        )
        self.verdicts = Table({"msg": np.int64, "flagged": np.bool_, "acted": np.bool_})
        self.losses = Table({"step": np.int32, "mb": np.int32, "loss": np.float64})
        self.evals = Table({"step": np.int32, "val_loss": np.float64})
        self.bans = Table({"step": np.int32, "worker": np.int32, "replaced_by": np.int32, "by": np.int8})
        self.workers: list[str] = []
        self._worker_ix: dict[str, int] = {}
        self.attacks: list[str] = []
        self.meta: dict[str, Any] = {}  # run facts the scorer needs later (malicious set, optimum, steps)

    # -- string tables -------------------------------------------------------------------------
    def worker_index(self, name: str) -> int:
        ix = self._worker_ix.get(name)
        if ix is None:
            ix = self._worker_ix[name] = len(self.workers)
            self.workers.append(name)
        return ix

    def attack_index(self, name: str) -> int:
        if name not in self.attacks:
            self.attacks.append(name)
        return self.attacks.index(name)

    # -- writers -------------------------------------------------------------------------------
    def log_message(self, msg) -> None:
        self.messages.append(
            id=msg.msg_id,
            step=msg.step,
            mb=msg.mb_idx,
            boundary=msg.boundary,
            role=int(msg.role),
            sender=self.worker_index(msg.sender),
            receiver=self.worker_index(msg.receiver),
            bytes=msg.wire_bytes,
        )

    def log_tamper(self, msg, attack: str, norm_ratio: float) -> None:
        """Ground truth: written by the adversary layer only."""
        self.ground_truth.append(
            msg=msg.msg_id,
            step=msg.step,
            mb=msg.mb_idx,
            role=int(msg.role),
            worker=self.worker_index(msg.sender),
            attack=self.attack_index(attack),
            norm_ratio=norm_ratio,
        )

    def log_verdict(self, msg_id: int, verdict, acted: bool = True) -> None:
        """One verdict: its statistics and, as `score_<marker> = 1`, its typed markers (the on-disk format)."""
        scores = dict(verdict.scores)
        scores.update((m.value, 1.0) for m in verdict.markers)
        for name in scores:
            self.verdicts.add_column(f"score_{name}", np.float32, np.nan)
        self.verdicts.append(
            msg=msg_id, flagged=bool(verdict.flagged), acted=acted, **{f"score_{k}": v for k, v in scores.items()}
        )

    def log_loss(self, step: int, mb: int, loss: float) -> None:
        self.losses.append(step=step, mb=mb, loss=loss)

    def log_eval(self, step: int, val_loss: float) -> None:
        self.evals.append(step=step, val_loss=val_loss)

    def log_ban(self, step: int, worker: str, replaced_by: str | None = None, by: str | None = None) -> None:
        rep = self.worker_index(replaced_by) if replaced_by else -1
        rule = BAN_RULES.index(by) if by is not None else -1
        self.bans.append(step=step, worker=self.worker_index(worker), replaced_by=rep, by=rule)

    def ban_rules(self) -> list[str | None]:
        """Per row of `bans`, the test that decided the ban (None where none is recorded; both loaders, `load` and
        `scoring.folders.load_log`, give a folder written before the column existed a column of -1)."""
        return [BAN_RULES[i] if 0 <= i < len(BAN_RULES) else None for i in self.bans["by"].tolist()]

    # -- persistence ---------------------------------------------------------------------------
    def save(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        arrays = {f"{t}.{k}": v for t in self.TABLES for k, v in getattr(self, t).as_arrays().items()}
        np.savez_compressed(out_dir / "events.npz", **arrays)
        (out_dir / "events.json").write_text(
            strictjson.dumps({"workers": self.workers, "attacks": self.attacks, "meta": self.meta}, indent=1)
        )

    @classmethod
    def load(cls, out_dir: Path) -> EventLog:
        out_dir = Path(out_dir)
        log = cls()
        with np.load(out_dir / "events.npz", allow_pickle=False) as z:
            for t in cls.TABLES:
                cols = {k.split(".", 1)[1]: z[k] for k in z.files if k.split(".", 1)[0] == t}
                if cols:
                    setattr(log, t, Table.from_arrays(cols))
        log.bans.add_column("by", np.int8, -1)  # a folder written before bans recorded their test (a resumed run
        # appends to it)
        names = json.loads((out_dir / "events.json").read_text())
        for w in names["workers"]:
            log.worker_index(w)
        log.attacks = list(names["attacks"])
        log.meta = dict(names.get("meta", {}))
        return log

    # -- one canonical order -------------------------------------------------------------------
    def canonicalize(self) -> EventLog:
        """Rows in an order that does not depend on who logged them when (in place; returns self).

        Messages and verdicts by message id (canonical ids: by step, microbatch, hop along the path); ground
        truth by step, then pipeline messages by id, then DP-sync rows by (stage, worker); losses by (step, mb);
        attack names re-indexed by first appearance. A sim run and a distributed run of the same scenario (whose
        processes each log their part) then give identical logs.
        """
        self.messages = _sorted(self.messages, np.lexsort((self.messages["id"],)))
        self.verdicts = _sorted(self.verdicts, np.lexsort((self.verdicts["msg"],)), columns_sorted=True)
        g = self.ground_truth
        dp = g["msg"] < 0
        stage = np.array([int(self.workers[w].split("r")[0][1:]) for w in g["worker"]], dtype=np.int64)
        order = np.lexsort((g["worker"], np.where(dp, stage, 0), np.where(dp, 0, g["msg"]), dp, g["step"]))
        self.ground_truth = _sorted(g, order)
        names, first = [], {}
        for a in self.ground_truth["attack"].tolist():
            if a not in first:
                first[a] = len(names)
                names.append(self.attacks[a])
        if len(self.ground_truth):
            self.ground_truth._cols["attack"][: len(self.ground_truth)] = [
                first[a] for a in self.ground_truth["attack"].tolist()
            ]
        self.attacks = names
        self.losses = _sorted(self.losses, np.lexsort((self.losses["mb"], self.losses["step"])))
        self.evals = _sorted(self.evals, np.lexsort((self.evals["step"],)))
        return self

    def write_events_csv(self, path: Path) -> None:
        """One row per message, joined with ground truth and verdicts (for humans and pandas)."""
        m = self.messages.as_arrays()
        n = len(self.messages)
        gt_attack = np.full(n, "", dtype=object)
        gt_ratio = np.full(n, np.nan)
        pos = {int(i): j for j, i in enumerate(m["id"])}
        for row in range(len(self.ground_truth)):
            j = pos.get(int(self.ground_truth["msg"][row]))
            if j is not None:
                gt_attack[j] = self.attacks[self.ground_truth["attack"][row]]
                gt_ratio[j] = self.ground_truth["norm_ratio"][row]
        v = self.verdicts.as_arrays()
        score_cols = [k for k in v if k.startswith("score_")]
        flagged = np.full(n, "", dtype=object)
        scores = {k: np.full(n, np.nan) for k in score_cols}
        for row in range(len(self.verdicts)):
            j = pos.get(int(v["msg"][row]))
            if j is not None:
                flagged[j] = int(v["flagged"][row])
                for k in score_cols:
                    scores[k][j] = v[k][row]
        roles = {0: "activation", 1: "gradient", 2: "dp_gradient"}
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "msg",
                    "step",
                    "mb",
                    "boundary",
                    "role",
                    "sender",
                    "receiver",
                    "bytes",
                    "tampered_by",
                    "norm_ratio",
                    "flagged",
                    *score_cols,
                ]
            )
            for j in range(n):
                w.writerow(
                    [
                        m["id"][j],
                        m["step"][j],
                        m["mb"][j],
                        m["boundary"][j],
                        roles[int(m["role"][j])],
                        self.workers[m["sender"][j]],
                        self.workers[m["receiver"][j]],
                        m["bytes"][j],
                        gt_attack[j],
                        "" if np.isnan(gt_ratio[j]) else f"{gt_ratio[j]:.6g}",
                        flagged[j],
                        *["" if np.isnan(scores[k][j]) else f"{scores[k][j]:.6g}" for k in score_cols],
                    ]
                )


def _sorted(table: Table, order: np.ndarray, columns_sorted: bool = False) -> Table:
    """`table` with its rows in `order` (stable; the column schema kept; `columns_sorted`: the columns added on the
    way, such as a detector's statistics, in name order after the fixed ones, whichever row brought them first)."""
    arrays = table.as_arrays()
    if columns_sorted:
        fixed = [k for k in arrays if not k.startswith("score_")]
        arrays = {k: arrays[k] for k in fixed + sorted(set(arrays) - set(fixed))}
    out = (
        Table.from_arrays({k: v[order] for k, v in arrays.items()})
        if len(order)
        else Table({k: v.dtype for k, v in arrays.items()})
    )
    out._fill = {**out._fill, **table._fill}
    return out
