"""`sentinel thresholds`: the choice across attacks and seeds on hand-built scores with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from sentinel.scoring.thresholds import _choose, _table, evaluate

RULE = {"key": "k", "statistic": "e", "value": 4.0, "exact_from": 1.0}


def _run(seed, neg, pos, neg_key=None):
    return {
        "seed": seed,
        "neg": np.array(neg, float),
        "pos": {k: np.array(v, float) for k, v in pos.items()},
        "neg_key": neg_key or f"own{seed}{len(neg)}",
        "rule": RULE,
    }


def _decide(runs, target, min_recall, bound="mean"):
    neg = np.concatenate([r["neg"] for r in runs])
    ks = np.unique(np.concatenate([[1.0], neg[np.isfinite(neg) & (neg >= 1.0)]]))
    table = _table(evaluate(runs, ks), ks)
    return ks, table, _choose(table, ks, target, min_recall, bound)


def test_the_smallest_k_whose_mean_clean_fpr_meets_the_target_and_its_recalls():
    # seed 0: clean scores 1..10 (FPR(k) = share above k); seed 1: 1..10 shifted by 0.5
    runs = [
        _run(0, range(1, 11), {"a": [11, 12, 5], "b": [3, 20]}),
        _run(1, np.arange(1, 11) + 0.5, {"a": [11, 12, 13], "b": [2, 20]}),
    ]
    ks, table, choice = _decide(runs, target=0.2, min_recall=0.5)
    # at k = 8.5: seed 0 has 9, 10 above (0.2), seed 1 has 9.5, 10.5 above (0.2) -> mean 0.2 <= 0.2;
    # at k = 8 (the candidate below): seed 0 0.2, seed 1 0.3 -> mean 0.25 > 0.2
    assert choice["chosen_k"] == 8.5 and choice["fpr_mean"] == pytest.approx(0.2)
    assert choice["recall"] == {"a": pytest.approx((2 / 3 + 1) / 2), "b": pytest.approx(0.5)}
    assert choice["worst_attack"] == "b" and "meets both" in choice["status"]
    assert table["fpr"][list(ks).index(8.0)].mean == pytest.approx(0.25)


def test_no_k_meets_both_names_the_attacks_that_fall_short_and_upper_bound_is_stricter():
    runs = [_run(0, range(1, 11), {"a": [20], "b": [3]}), _run(1, range(1, 11), {"a": [20], "b": [4]})]
    _, _, choice = _decide(runs, target=0.2, min_recall=0.9)
    assert choice["chosen_k"] == 8.0 and choice["below_min_recall"] == ["b"] and "no k meets both" in choice["status"]
    noisy = [_run(0, range(1, 11), {"a": [20]}), _run(1, np.arange(1, 11) * 0.5, {"a": [20]})]
    mean_k = _decide(noisy, 0.2, 0.5)[2]["chosen_k"]
    upper_k = _decide(noisy, 0.2, 0.5, bound="upper")[2]["chosen_k"]
    assert upper_k > mean_k


def test_shared_clean_twins_count_once_per_seed_and_unmeetable_targets_say_why():
    twin = list(range(1, 11))
    runs = [_run(0, twin, {"a": [20]}, neg_key="t0"), _run(0, twin, {"b": [20]}, neg_key="t0")]
    ev = evaluate(runs, np.array([8.0]))
    assert ev["fpr"][0][0] == pytest.approx(0.2)  # not 4 of 20: the shared twin counts once
    _, _, choice = _decide([_run(0, [np.inf] * 5 + [1.0], {"a": [20]})], target=0.1, min_recall=0.5)
    assert choice["chosen_k"] is None and "whatever the threshold" in choice["status"]
