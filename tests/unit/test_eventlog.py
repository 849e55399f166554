from __future__ import annotations

import csv

import numpy as np
import torch

from sentinel.detectors import Verdict
from sentinel.eventlog import EventLog, Table
from sentinel.transport import Message, Role


def test_table_grows_and_adds_columns_lazily():
    t = Table({"a": np.int32}, capacity=2)
    for i in range(5):
        t.append(a=i)
    t.add_column("b", np.float32, np.nan)
    t.append(a=5, b=1.5)
    assert list(t["a"]) == [0, 1, 2, 3, 4, 5]
    assert np.isnan(t["b"][:5]).all() and t["b"][5] == 1.5


def _msg(log, step, role=Role.ACTIVATION):
    m = Message(step, 0, 1, role, "s1r0", "s2r1", torch.ones(2, 3), wire_bytes=24, msg_id=len(log.messages))
    log.log_message(m)
    return m


def test_save_load_round_trip_and_csv(tmp_path):
    log = EventLog()
    a = _msg(log, 0)
    b = _msg(log, 1, Role.GRADIENT)
    log.log_tamper(b, "scaling", 2.0)
    log.log_verdict(a.msg_id, Verdict({"l1": 0.5}, False))
    log.log_verdict(b.msg_id, Verdict({"l1": 3.0}, True))
    log.log_loss(0, 0, 1.25)
    log.log_eval(0, 2.5)
    log.log_ban(1, "s1r0", by="sequential")
    log.log_ban(2, "s1r1")
    log.save(tmp_path)
    back = EventLog.load(tmp_path)
    for t in EventLog.TABLES:
        for k, v in getattr(log, t).as_arrays().items():
            np.testing.assert_array_equal(getattr(back, t)[k], v)
    assert back.workers == log.workers and back.attacks == ["scaling"]
    assert back.ban_rules() == ["sequential", None]  # a ban from outside the responder's tests records none
    log.write_events_csv(tmp_path / "events.csv")
    rows = list(csv.DictReader(open(tmp_path / "events.csv")))
    assert [r["tampered_by"] for r in rows] == ["", "scaling"]
    assert [r["flagged"] for r in rows] == ["0", "1"] and rows[1]["score_l1"] == "3"
    assert rows[1]["role"] == "gradient" and rows[0]["sender"] == "s1r0"


def test_a_folder_written_before_bans_recorded_their_test_still_loads(tmp_path):
    log = EventLog()
    _msg(log, 0)
    log.log_eval(0, 2.5)
    log.log_ban(1, "s1r0", by="hard")
    log.save(tmp_path)
    with np.load(tmp_path / "events.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "bans.by"}
    np.savez_compressed(tmp_path / "events.npz", **arrays)
    back = EventLog.load(tmp_path)
    assert back.ban_rules() == [None] and list(back.bans["worker"]) == [0]
    back.log_ban(3, "s1r0", by="scores")  # a resumed run appends to it
    assert back.ban_rules() == [None, "scores"]
    from sentinel.config import _Problems
    from sentinel.scoring.folders import load_log

    problems = _Problems()
    checked = load_log(tmp_path, problems)  # `sentinel report` on such a folder: validated, then scored
    assert not problems.items and checked.ban_rules() == [None]
    checked.log_ban(4, "s1r0", by="hard")
    assert checked.ban_rules() == [None, "hard"]


def test_a_replay_key_reads_any_float_dtype():
    import torch

    from sentinel.detectors.replay import Fingerprint, digest

    x = torch.zeros(2, 8, dtype=torch.bfloat16)  # numpy has no bfloat16; a sender chooses its payload's dtype
    x[0, 3] = 1.5
    assert digest(x) == digest(x.clone()) != digest(x.float())
    y = torch.randn(2, 8).to(torch.bfloat16)
    assert Fingerprint(0)(y) == Fingerprint(0)(y.clone())
