"""ROC / PR / threshold recommendation on hand-built values and EventLogs with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.detectors import Verdict
from sentinel.eventlog import EventLog
from sentinel.scoring.roc import auroc, average_precision, curves, recommend, roc_report
from sentinel.transport import Message, Role

A = Role.ACTIVATION
RULE = {"key": "k", "statistic": "e", "value": 4.0, "warmup_steps": 2, "exact_from": 2.5}


def test_auroc_known_values_and_ties():
    assert auroc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert auroc(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 0.0
    assert auroc(np.array([1.0]), np.array([1.0])) == 0.5  # a tie counts one half
    assert auroc(np.array([2.0, 0.0]), np.array([1.0, 1.0])) == 0.5
    assert auroc(np.array([np.inf]), np.array([-np.inf, 5.0])) == 1.0
    assert auroc(np.array([]), np.array([1.0])) is None


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=30), st.lists(st.floats(-5, 5), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_auroc_is_the_pairwise_win_rate_and_the_area_under_the_curve(pos, neg):
    pos, neg = np.array(pos), np.array(neg)
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auroc(pos, neg) == pytest.approx(brute)
    c = curves(pos, neg)
    fpr, tpr = np.concatenate([[0], c["fpr"]]), np.concatenate([[0], c["tpr"]])
    assert fpr[-1] == 1.0 and tpr[-1] == 1.0 and (np.diff(fpr) >= 0).all() and (np.diff(tpr) >= 0).all()
    assert np.trapezoid(tpr, fpr) == pytest.approx(brute)  # ties give the diagonal segment, area 1/2


def test_average_precision_known_value():
    # ranking: pos 3, neg 2, pos 1 -> precision 1 at recall 1/2, 2/3 at recall 1
    assert average_precision(np.array([3.0, 1.0]), np.array([2.0])) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)


def test_recommend_is_the_smallest_threshold_meeting_the_target():
    neg = np.arange(100, dtype=float)  # 0..99
    pos = np.array([50.0, 98.5, 120.0])
    r = recommend(pos, neg, 0.05)  # at most 5 negatives strictly above: k = 94
    assert r["threshold"] == 94.0 and r["fpr"] == 0.05 and r["tpr"] == pytest.approx(2 / 3)
    assert recommend(pos, neg, 0.05, lowest=96.0)["threshold"] == 96.0  # clamped where the curve is inexact
    r = recommend(pos, np.array([np.inf, np.inf, 1.0]), 0.01)  # clean messages flagged whatever k is
    assert r["threshold"] is None and "whatever" in r["note"]
    assert recommend(pos, np.array([]), 0.01)["threshold"] is None


def _log(rows):
    """rows: (step, sender, tampered, scores, flagged)."""
    log = EventLog()
    for i, (step, sender, tampered, scores, flagged) in enumerate(rows):
        m = Message(step, i, 0, A, sender, "x", torch.zeros(1), msg_id=len(log.messages))
        log.log_message(m)
        if tampered:
            log.log_tamper(m, "bias", 1.0)
        log.log_verdict(m.msg_id, Verdict(scores, flagged))
    return log


def test_rule_scores_reproduce_the_run_and_handle_markers():
    rows = [
        (0, "a", False, {"e": 9.0}, False),  # warm-up: never judged
        (5, "a", False, {"e": 1.0}, False),
        (5, "a", False, {"e": 3.0}, False),
        (5, "b", True, {"e": 7.0}, True),
        (6, "b", True, {"integrity": 1.0}, True),  # no statistic: flagged whatever k
        (6, "a", False, {"paused": 1.0}, False),  # paused: never judged
        (6, "a", False, {"e": 6.0, "shift": 1.0}, False),  # honest-majority drift: accepted
        (7, "b", True, {"e": 2.0}, False),  # a miss
    ]
    roc = roc_report(_log(rows), RULE, target_fpr=0.2, mode="open_loop")
    rule = roc["rule"]
    assert (rule["positives"], rule["negatives"]) == (3, 4) and roc["paused"] == {"tampered": 0, "clean": 1}
    # tampered scores (7, inf, 2) vs clean (-inf, 1, 3, -inf): 2 of 3 beat all, 2 beats 3 of 4
    assert rule["auroc"] == pytest.approx((4 + 4 + 3) / 12)
    assert rule["recommended"]["threshold"] == 3.0  # m = floor(0.2 * 4) = 0 clean messages may lie above
    assert rule["recommended"]["fpr"] == 0.0 and rule["recommended"]["tpr"] == pytest.approx(2 / 3)
    low = roc_report(_log(rows), RULE, target_fpr=0.5, mode="open_loop")["rule"]["recommended"]
    assert low["threshold"] == 2.5 and "clamped" in low["note"]  # the 3rd largest clean score, 1, is below k_learn
    assert set(roc["statistics"]) == {"e"}  # markers are not statistics
    assert roc["statistics"]["e"]["positives"] == 2 and roc["statistics"]["e"]["negatives"] == 4


def test_auroc_within_streams_compares_messages_of_the_same_stream_only():
    """A stream whose clean messages sit low on a statistic makes it look separating when streams are pooled:
    `auroc_within_streams` pairs a tampered message with the clean messages of its own boundary and direction."""
    log = EventLog()
    rows = [(0, False, 1.0), (0, False, 2.0), (0, True, 1.5), (0, True, 2.0), (1, False, -5.0), (1, False, -6.0)]
    for i, (boundary, tampered, e) in enumerate(rows):
        m = Message(5, i, boundary, A, f"s{boundary}r0", "x", torch.zeros(1), msg_id=i)
        log.log_message(m)
        if tampered:
            log.log_tamper(m, "bias", 1.0)
        log.log_verdict(i, Verdict({"e": e}, False))
    e = roc_report(log, None, 0.01, "open_loop")["statistics"]["e"]
    assert e["auroc"] == pytest.approx(6.5 / 8)  # 1.5 beats 1, -5, -6; 2 beats 1, -5, -6 and ties 2
    assert e["auroc_within_streams"] == pytest.approx(2.5 / 4)  # boundary 0 only: boundary 1 has no tampered one
    rule = roc_report(log, {**RULE, "statistic": "e", "warmup_steps": 0}, 0.01, "open_loop")["rule"]
    assert rule["auroc_within_streams"] == pytest.approx(2.5 / 4) and rule["auroc"] == pytest.approx(6.5 / 8)


def test_empty_logs_give_nothing_and_one_class_gives_no_auroc():
    assert roc_report(EventLog(), RULE, 0.01, "open_loop") == {}
    log = _log([(5, "a", False, {"e": 1.0}, False)])
    roc = roc_report(log, RULE, 0.01, "closed_loop")
    assert roc["statistics"]["e"]["auroc"] is None and roc["rule"]["recommended"]["threshold"] == 2.5


def test_contaminated_downstream_messages_are_neither_positive_nor_negative():
    log = EventLog()
    for b, sender, tampered, e in ((0, "s0r0", True, 8.0), (1, "s1r0", False, 9.0), (0, "s0r1", False, 1.0)):
        m = Message(5, 0 if sender != "s0r1" else 1, b, A, sender, "x", torch.zeros(1), msg_id=len(log.messages))
        log.log_message(m)
        if tampered:
            log.log_tamper(m, "bias", 1.0)
        log.log_verdict(m.msg_id, Verdict({"e": e}, e > 4))
    roc = roc_report(log, RULE, 0.01, "open_loop")
    assert (roc["rule"]["positives"], roc["rule"]["negatives"]) == (1, 1)  # the boundary-1 message is out
    assert roc["rule"]["auroc"] == 1.0


def test_with_a_clean_twin_the_threshold_is_set_on_its_honest_traffic():
    attacked = _log(
        [
            (5, "a", False, {"e": 50.0}, True),
            (5, "b", True, {"e": 60.0}, True),
            (6, "a", False, {"e": 1.0}, False),
            (6, "b", True, {"e": 8.0}, True),
        ]
    )
    clean = _log([(5, "a", False, {"e": v}, v > 4) for v in (1.0, 2.0, 3.0, 3.5)])
    rule = roc_report(attacked, RULE, 0.2, "open_loop", clean)["rule"]
    rec = rule["recommended"]
    assert rec["negatives_from"] == "clean_twin" and rec["threshold"] == 3.5 and rec["fpr"] == 0.0  # 1 of 4 > 0.2
    assert rec["tpr"] == 1.0 and rec["fpr_this_run"] == 0.5 and rule["auroc_vs_clean_twin"] == 1.0


# -- scikit-learn against the hand-written code it replaced (kept here as the reference) ---------------------
def _hand_auroc(pos, neg):
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def _hand_curves(pos, neg):
    values = np.unique(np.concatenate([pos, neg]))[::-1]
    tp = len(pos) - np.searchsorted(np.sort(pos), values, side="left")
    fp = len(neg) - np.searchsorted(np.sort(neg), values, side="left")
    precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), np.nan)
    return {"thresholds": values, "fpr": fp / len(neg), "tpr": tp / len(pos), "precision": precision}


def _hand_ap(pos, neg):
    c = _hand_curves(pos, neg)
    return float(np.nansum(np.diff(np.concatenate([[0.0], c["tpr"]])) * c["precision"]))


# few distinct values (many ties) and the +-inf the decision scores use
_scores = st.lists(
    st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 1.0, 2.0, np.inf]) | st.floats(-3, 3), min_size=1, max_size=25
)


@given(_scores, _scores)
@settings(max_examples=150, deadline=None)
def test_scikit_learn_curves_equal_the_hand_written_ones_ties_and_infinities_included(pos, neg):
    pos, neg = np.array(pos), np.array(neg)
    assert auroc(pos, neg) == pytest.approx(_hand_auroc(pos, neg), abs=1e-12)
    assert average_precision(pos, neg) == pytest.approx(_hand_ap(pos, neg), abs=1e-12)
    got, want = curves(pos, neg), _hand_curves(pos, neg)
    for key in ("thresholds", "fpr", "tpr", "precision"):
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-12)
