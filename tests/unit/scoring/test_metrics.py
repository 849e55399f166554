"""Scorer metrics on hand-built EventLogs with known answers."""

from __future__ import annotations

import torch

from sentinel.detectors import Verdict
from sentinel.eventlog import EventLog
from sentinel.scoring.metrics import arl0, confusion, message_labels, message_metrics, worker_metrics
from sentinel.transport import Message, Role

A, G = Role.ACTIVATION, Role.GRADIENT


def _log(rows):
    """rows: (step, mb, boundary, role, sender, tampered_by or None, flagged or None)."""
    log = EventLog()
    for step, mb, b, role, sender, attack, flagged in rows:
        m = Message(step, mb, b, role, sender, "x", torch.zeros(1), msg_id=len(log.messages))
        log.log_message(m)
        if attack:
            log.log_tamper(m, attack, 1.0)
        if flagged is not None:
            log.log_verdict(m.msg_id, Verdict({"s": 1.0}, flagged))
    return log


def test_confusion_known_values():
    t = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool).numpy()
    f = torch.tensor([1, 0, 1, 0, 0], dtype=torch.bool).numpy()
    c = confusion(t, f)
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (1, 1, 1, 2)
    assert c["precision"] == 0.5 and c["recall"] == 0.5 and c["f1"] == 0.5 and c["fpr"] == 1 / 3


def test_no_attacks_no_flags_gives_null_ratios_not_errors():
    log = _log([(0, 0, 0, A, "s0r0", None, False), (0, 0, 0, G, "s1r0", None, False)])
    m = message_metrics(log)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (0, 0, 0, 2)
    assert m["precision"] is None and m["recall"] is None and m["f1"] is None and m["fpr"] == 0.0
    w = worker_metrics(log, [])
    assert w["banned"] == [] and w["false_bans"] == 0 and w["median_steps_to_ban"] is None


def test_everything_flagged():
    log = _log([(0, 0, 0, A, "s0r0", "bias", True), (0, 1, 0, A, "s0r1", None, True)])
    m = message_metrics(log)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 1, 0, 0) and m["fpr"] == 1.0 and m["recall"] == 1.0


def test_contaminated_downstream_is_its_own_category():
    rows = [
        (3, 0, 1, A, "s1r0", "scaling", True),  # tampered at boundary 1
        (3, 0, 2, A, "s2r0", None, True),  # downstream activation: contaminated, flagged
        (3, 0, 2, G, "s3r0", None, False),  # its gradients: contaminated
        (3, 0, 0, G, "s1r0", None, False),
        (3, 0, 0, A, "s0r0", None, False),  # upstream activation: clean
        (3, 1, 2, A, "s2r1", None, False),  # other microbatch: clean
    ]
    log = _log(rows)
    labels = message_labels(log)
    assert list(labels["contaminated"]) == [False, True, True, True, False, False]
    m = message_metrics(log)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 0, 0, 2)
    assert m["contaminated"] == {"messages": 3, "flagged": 1}
    assert m["per_attack"]["scaling"]["recall"] == 1.0


def test_gradient_tamper_contaminates_only_upstream_gradients():
    log = _log(
        [(0, 0, 2, G, "s3r0", "sign", False), (0, 0, 1, G, "s2r0", None, True), (0, 0, 2, A, "s2r0", None, False)]
    )
    assert list(message_labels(log)["contaminated"]) == [False, True, False]
    m = message_metrics(log)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (0, 0, 1, 1)


def test_worker_metrics_steps_to_ban_and_false_bans():
    log = _log([(2, 0, 1, A, "s1r0", "bias", True), (5, 0, 1, A, "s1r1", "bias", False)])
    log.log_ban(4, "s1r0")
    log.log_ban(6, "s2r0")  # honest
    w = worker_metrics(log, ["s1r0", "s1r1"])
    assert w["banned"] == ["s1r0", "s2r0"] and w["false_bans"] == 1 and w["false_banned"] == ["s2r0"]
    assert w["precision"] == 0.5 and w["recall"] == 0.5 and w["median_steps_to_ban"] == 2.0
    assert w["attacks_never_banned"] == ["bias"]


def test_malicious_worker_that_never_attacked_is_not_counted_as_missed():
    log = _log([(0, 0, 1, A, "s1r0", "bias", True)])
    log.log_ban(0, "s1r0")
    w = worker_metrics(log, ["s1r0", "s2r0"])
    assert w["recall"] == 1.0 and w["attacking"] == ["s1r0"]


def test_arl0():
    log = _log([(s, 0, 0, A, "s0r0", None, s in (3, 7)) for s in range(10)])
    assert arl0(log, 10)["arl0"] == 5.0
    quiet = _log([(s, 0, 0, A, "s0r0", None, False) for s in range(10)])
    r = arl0(quiet, 10)
    assert r["arl0"] is None and "no false alarm in 10 steps" in r["note"]


def test_per_attack_rows_score_each_attack_against_the_clean_messages_with_its_own_steps_to_ban():
    from sentinel.scoring.metrics import group_bans

    log = _log(
        [
            (2, 0, 1, A, "s1r0", "bias", True),
            (3, 0, 1, A, "s1r0", "bias", True),
            (4, 1, 1, G, "s2r1", "sign", False),
            (6, 1, 1, G, "s2r1", "sign", True),
            (2, 2, 0, A, "s0r0", None, True),
            (3, 2, 0, A, "s0r0", None, False),
            (4, 3, 0, A, "s0r1", None, False),
        ]
    )
    log.log_ban(3, "s1r0")
    m = message_metrics(log)
    bias, sign = m["per_attack"]["bias"], m["per_attack"]["sign"]
    assert (bias["tp"], bias["fp"], bias["fn"], bias["tn"]) == (2, 1, 0, 2)  # against the 3 clean messages
    assert (sign["tp"], sign["fp"], sign["fn"], sign["tn"]) == (1, 1, 1, 2)
    assert sign["recall"] == 0.5 and bias["fpr"] == sign["fpr"] == 1 / 3
    g = group_bans(log)
    assert g["per_attack"]["bias"]["median_steps_to_ban"] == 1.0 and g["per_attack"]["bias"]["never_banned"] == []
    assert g["per_attack"]["sign"]["median_steps_to_ban"] is None and g["per_attack"]["sign"]["never_banned"] == [
        "s2r1"
    ]
    assert set(g["per_role"]) == {"activation", "gradient"} and g["per_boundary"][1]["attacking_workers"] == 2


def test_per_worker_rows_and_metrics_csv_rows():
    from sentinel.scoring.metrics import per_worker, step_rows

    log = _log(
        [
            (0, 0, 1, A, "s1r0", None, False),
            (1, 0, 1, A, "s1r0", "bias", True),
            (1, 1, 1, A, "s1r1", None, True),
            (2, 0, 1, A, "s1r1", None, False),
        ]
    )
    log.log_ban(1, "s1r0", by="hard")
    for step, loss in ((0, 3.0), (0, 2.0), (1, 1.5), (2, 1.0)):
        log.log_loss(step, 0, loss)
    log.log_eval(0, 4.0)
    log.log_eval(2, 2.5)  # evaluated at the end of step index 1
    rows = {r["worker"]: r for r in per_worker(log, ["s1r0"])}
    assert rows["s1r0"] == {
        "worker": "s1r0",
        "malicious": True,
        "attacks": ["bias"],
        "sent": 2,
        "tampered": 1,
        "first_tampered": 1,
        "flags": 1,
        "first_flag": 1,
        "ban_step": 1,
        "ban_by": "hard",
    }
    assert rows["s1r1"]["malicious"] is False and rows["s1r1"]["first_flag"] == 1 and rows["s1r1"]["ban_step"] is None
    assert rows["s1r1"]["ban_by"] is None
    steps = step_rows(log)
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert steps[0]["train_loss"] == 2.5 and steps[0]["val_loss"] is None and steps[1]["val_loss"] == 2.5
    assert (steps[1]["messages"], steps[1]["flags"], steps[1]["tampered_flagged"], steps[1]["clean_flagged"]) == (
        2,
        2,
        1,
        1,
    )
    assert steps[1]["bans"] == 1 and steps[1]["banned"] == "s1r0" and steps[2]["bans"] == 0


def test_a_worker_banned_for_an_injected_fault_is_a_true_ban():
    """dist `--fault`: the fault's sender is not in the adversary's malicious list, but it sent the bad
    message (ground truth `fault_shape`) and was banned for it: a true ban, and its fault was banned."""
    log = _log([(0, 0, 0, A, "s0r0", "fault_shape", True), (0, 1, 0, A, "s0r1", None, False)])
    log.log_ban(0, "s0r0")
    w = worker_metrics(log, malicious=[])
    assert w["false_bans"] == 0 and w["banned"] == ["s0r0"]
    assert w["precision"] == 1.0 and w["recall"] == 1.0 and w["attacks_never_banned"] == []
