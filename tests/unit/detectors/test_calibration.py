"""Tail probabilities: sorted windows, the compiled p-values against numpy, and calibration on honest streams."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sentinel.detectors.calibration import MAX_SHAPE, Q0, TailCalibrator, combine


def reference_p(window: np.ndarray, x: float, floor: float) -> float:
    """The generalised Pareto tail above the Q0 quantile, fitted by the method of moments (numpy, from scratch)."""
    u = np.quantile(window, Q0)
    if x <= u:
        return (1 + (window >= x).sum()) / (len(window) + 1)
    ex = window[window > u] - u
    m = ex.mean() if len(ex) else 0.0
    xi = float(np.clip(0.5 * (1 - m * m / ex.var(ddof=1)), 0, MAX_SHAPE)) if len(ex) > 2 and ex.var() > 0 else 0.0
    beta = max(m * (1 - xi), floor)
    if xi == 0:
        return (1 - Q0) * np.exp(-(x - u) / beta)
    return (1 - Q0) * (1 + xi * (x - u) / beta) ** (-1 / xi)


def test_sorted_windows_follow_the_ring_and_pvalues_match_numpy():
    rng = np.random.default_rng(0)
    cal = TailCalibrator(("a", "b", "c"), 40, (False, True, False), resolution=[0.0, 0.0, 0.25])
    for _ in range(150):
        v = np.array([rng.normal(), np.exp(rng.normal()), rng.integers(0, 4) / 4])
        t = cal.transform(v)
        if cal.count >= 8:
            got = cal.pvalues(t)
            for j in range(3):
                w = cal._ring[: cal.count, j]
                assert got[j] == pytest.approx(reference_p(w, t[j], cal.floor[j]), rel=1e-9)
        cal.push(v, t)
        np.testing.assert_array_equal(cal._sorted[:, : cal.count], np.sort(cal._ring[: cal.count], axis=0).T)
    assert np.isnan(cal.pvalues(np.array([np.nan, 0.0, 0.0]))[0])


@pytest.mark.parametrize("recent", [0, 50])
@pytest.mark.parametrize("law", ["normal", "lognormal", "student3", "exponential"])
def test_honest_tail_probabilities_are_calibrated(law, recent):
    """On stationary honest streams of any of these shapes, P(p < a) stays within a small factor of a (with or
    without the recent values' tail: the larger of two p-values is conservative, and not by much)."""
    rng = np.random.default_rng(1)
    draw = {
        "normal": lambda n: rng.normal(size=n),
        "lognormal": lambda n: np.exp(rng.normal(size=n)),
        "student3": lambda n: rng.standard_t(3, size=n),
        "exponential": lambda n: rng.exponential(size=n),
    }[law]
    log = law == "lognormal"
    hits, total = np.zeros(2), 0
    for _ in range(40):
        cal = TailCalibrator(("s",), 100, (log,), recent=recent)
        for x in draw(100):
            cal.push(np.array([x]))
        p = np.array([cal.pvalues(cal.transform(np.array([x])))[0] for x in draw(2000)])
        hits += [(p < 1e-2).sum(), (p < 1e-3).sum()]
        total += len(p)
    rate = hits / total
    assert 0.3e-2 < rate[0] < 2.5e-2 and rate[1] < 5e-3, rate  # a Gaussian z on student3 gives ~10x at 1e-3


@pytest.mark.parametrize("recent", [0, 30])
def test_levels_invert_the_pvalues(recent):
    rng = np.random.default_rng(2)
    cal = TailCalibrator(("a", "b"), 100, (False, True), recent=recent)
    for i in range(130):  # the last 30 drifted (wider): with `recent`, their tail sets the level
        s = 1.0 if i < 100 else 3.0
        cal.push(np.array([s * rng.normal(), np.exp(s * rng.normal())]))
    lv = cal.level(1e-4)
    np.testing.assert_allclose(cal.pvalues(cal.transform(lv)), 1e-4, rtol=1e-9)


def drifted(recent: int, seed: int = 3) -> TailCalibrator:
    """A window of 200 whose latest 40 values are 3x as spread (honest traffic in a training phase)."""
    rng = np.random.default_rng(seed)
    cal = TailCalibrator(("a", "b"), 200, (False, True), recent=recent)
    for i in range(240):
        scale = 0.1 if i < 200 else 0.3
        cal.push(np.array([scale * rng.normal(), np.exp(scale * rng.normal())]))
    return cal


def test_recent_values_judge_a_stream_that_drifted():
    """A value in the window's tail gets the larger of its tail p-values under the window and under its 60 latest
    values (numpy reference); a value in the window's body keeps the window's rank."""
    cal, plain = drifted(60), drifted(0)
    for x in (0.0, 0.3, 0.8, 1.3):
        t = np.array([x, x])
        got, old = cal.pvalues(t), plain.pvalues(t)
        for j in range(2):
            ring = np.roll(cal._ring[:, j], -cal._pos)  # arrival order, oldest first
            whole = reference_p(ring, t[j], cal.floor[j])
            assert old[j] == pytest.approx(whole, rel=1e-9)
            expect = max(whole, reference_p(ring[-60:], t[j], cal.floor[j])) if whole < 1 - Q0 else whole
            assert got[j] == pytest.approx(expect, rel=1e-9)
    # against the 200 values 1.0 is beyond the flag level's share; where the stream is now, 4x more likely
    far = np.array([1.0, 1.0])
    assert plain.pvalues(far)[0] < 1e-3 < cal.pvalues(far)[0]
    t, p_all, _ = cal.judge(np.array([1.0, np.e]), np.zeros(2, dtype=bool))  # the compiled one-call path agrees
    np.testing.assert_allclose(t, far)
    assert p_all == pytest.approx(min(1.0, 2 * cal.pvalues(far).min()), rel=1e-9)


def test_recent_values_change_nothing_until_the_window_holds_more_of_them():
    cal, plain = drifted(60), drifted(0)
    small, small_plain = TailCalibrator(("a",), 200, (False,), recent=60), TailCalibrator(("a",), 200, (False,))
    rng = np.random.default_rng(4)
    for x in rng.normal(size=60):
        small.push(np.array([x]))
        small_plain.push(np.array([x]))
    assert small.pvalues(np.array([5.0]))[0] == small_plain.pvalues(np.array([5.0]))[0]
    assert (cal.pvalues(np.array([-1.0, 0.0])) == plain.pvalues(np.array([-1.0, 0.0]))).all()  # the body


def test_bonferroni_combination():
    assert combine(np.array([0.01, 0.5, np.nan])) == pytest.approx(0.02)
    assert combine(np.array([np.nan])) == 1.0 and combine(np.array([0.9, 0.8])) == 1.0


def test_an_accepted_value_far_out_on_its_own_is_learned_capped():
    """push_judged: a statistic at p < CAP_P is learned at the window's largest value; the others as they are. So an
    attacker whose messages stay just under the combined level cannot stretch a window's tail message by message."""
    from sentinel.detectors.calibration import CAP_P

    rng = np.random.default_rng(1)
    cal = TailCalibrator(("a", "b"), 100, (False, False))
    for _ in range(100):
        cal.push(np.array([rng.normal(), rng.normal()]))
    top = cal._sorted[:, cal.count - 1].copy()
    t = np.array([top[0] + 50.0, top[1] + 0.01])
    _, p_all, _ = cal.judge(t, np.zeros(2, dtype=bool))
    assert cal.last_p[0] < CAP_P <= cal.last_p[1]
    plain = copy.deepcopy(cal)
    plain.push(t, t)
    cal.push_judged(t, cal.last_p)
    assert cal._sorted[0, cal.count - 1] == top[0]  # capped: the tail did not learn how far out it was
    assert cal._sorted[1, cal.count - 1] == top[1] + 0.01  # learned as it is
    # the same far value again is still far out; learned as it is, the first had made it ordinary
    again = np.array([top[0] + 50.0, 0.0])
    assert cal.pvalues(again)[0] < 1e-9 and plain.pvalues(again)[0] > 1e-4


def test_an_outlier_over_the_senders_budget_is_not_learned_at_all():
    """push_judged(capped=False): the statistic's window keeps the value that would have left it (an attacker accepted
    on every message cannot pile values at the window's top); the message's other statistics are learned."""
    rng = np.random.default_rng(2)
    cal = TailCalibrator(("a", "b"), 50, (False, False))
    for _ in range(60):
        cal.push(np.array([rng.normal(), rng.normal()]))
    before = cal._sorted[0, : cal.count].copy()
    t = np.array([before[-1] + 50.0, 0.25])
    cal.judge(t, np.zeros(2, dtype=bool))
    cal.push_judged(t, cal.last_p, capped=False)
    assert np.array_equal(cal._sorted[0, : cal.count], before)  # the same values: nothing learned, nothing left
    assert 0.25 in cal._sorted[1, : cal.count]


def test_each_sender_is_judged_against_its_peers_values():
    """An accepted sender's values teach the pooled windows and its peers' windows, never its own: a sender sending
    moderately high values keeps being far out against its peers, while the pooled window learns it."""
    from sentinel.detectors.calibration import SenderWindows

    rng = np.random.default_rng(6)
    win = SenderWindows(("a",), 200, (False,), recent=60)
    for i in range(300):
        sender = ("h1", "h2", "x")[i % 3]
        v = np.array([rng.normal() + (4.0 if sender == "x" else 0.0)])
        win.push(v, sender=sender)
    t = np.array([4.0])
    assert win.pvalues(t, "x", loo=True)[0] < 1e-3  # against h1's and h2's values
    assert win.pvalues(t, "x", loo=False)[0] > 0.05  # the pooled window: a third of it is x's
    assert win.pvalues(t, "h1", loo=True)[0] > 0.05  # h1's reference holds x's values
    for s in ("h1", "h2"):
        assert win.reference(s, True) is win.others[s]
    assert win.reference("new", True) is win.pooled and "new" not in win.others  # judging creates nothing
    win.push(np.array([0.0]), sender="new")  # first seen: a copy of the pooled windows, then its peers' values only
    assert win.others["new"].pushed == win.pooled.pushed - 1
