"""SENTINEL on hand-made streams: learns during warm-up, flags corrupted payloads, never learns from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentinel.detectors.calibration import combine
from sentinel.detectors.stagewise import Sentinel
from sentinel.transport.message import Message, Role

SHAPE = (4, 8, 16)


def honest(step: int, mb: int, role: Role = Role.GRADIENT) -> torch.Tensor:
    """Skewed, zero-mean-ish 'gradients' or offset 'activations', i.i.d. per (step, mb)."""
    g = torch.Generator().manual_seed(1000 * step + mb)
    e = torch.empty(SHAPE).exponential_(generator=g) - 1.0  # right-skewed, mean 0
    x = 0.01 * (e + 0.3 * torch.randn(SHAPE, generator=g))
    if role == Role.ACTIVATION:
        x = x * 100 + torch.linspace(-1, 1, SHAPE[-1])
    return x


def msg(step, mb, payload, role=Role.GRADIENT, sender="s1r0", boundary=0) -> Message:
    return Message(step, mb, boundary, role, sender, "s0r0", payload)


def feed(det, steps, role=Role.GRADIENT, mbs=4, senders=("s1r0", "s1r1", "s1r2")):
    flags = 0
    for s in range(steps):
        for m in range(mbs):
            flags += det.observe(msg(s, m, honest(s, m, role), role, senders[m % len(senders)])).flagged
    return flags


def small(**kw) -> Sentinel:
    return Sentinel(Sentinel.Config(warmup_steps=5, window=64, **kw), seed=0)


def test_warmup_only_learns():
    det = small()
    for s in range(5):
        assert not det.observe(msg(s, 0, honest(s, 0) * 100)).flagged  # even an absurd message
    assert det._streams[(0, 1)].baseline.n == 5


@pytest.mark.parametrize("role", [Role.GRADIENT, Role.ACTIVATION])
def test_honest_stream_is_rarely_flagged(role):
    det = small()
    assert feed(det, 60, role) <= 3  # of 220 judged messages


@pytest.mark.parametrize(
    "attack",
    [
        lambda x: -x,
        lambda x: torch.zeros_like(x),
        lambda x: x * 3,
        lambda x: x + 5 * x.std(),
        lambda x: torch.randn(x.shape, generator=torch.Generator().manual_seed(0)) * x.std(),
    ],
    ids=["sign_flip", "zeros", "scale3", "bias", "noise"],
)
@pytest.mark.parametrize("role", [Role.GRADIENT, Role.ACTIVATION])
def test_corrupted_payloads_are_flagged(attack, role):
    det = small()
    feed(det, 30, role)
    hits = sum(det.observe(msg(30 + i, 0, attack(honest(30 + i, 0, role)), role)).flagged for i in range(10))
    assert hits >= 9


def test_gradient_sign_flip_is_seen_by_skewness_only():
    """The paper's miss: mean-pooled distances cannot see -g when g's feature means are ~0."""
    paper = small(distances=("l1", "l2_normalized", "sign_flip_ratio"))
    ours = small(distances=("skewness",))
    for det in (paper, ours):
        feed(det, 30)
    flip = [honest(30 + i, 0) for i in range(10)]
    assert sum(paper.observe(msg(30 + i, 0, -x)).flagged for i, x in enumerate(flip)) <= 2
    assert sum(ours.observe(msg(30 + i, 0, -x)).flagged for i, x in enumerate(flip)) == 10


def test_flagged_messages_never_update_state():
    det = small()
    feed(det, 20)
    st = det._streams[(0, 1)]
    win = st.fences.pooled
    before = (st.baseline.n, st.baseline._m.copy(), win.pushed)
    top = win._sorted[:, win.count - 1].copy()  # each window's largest value
    assert det.observe(msg(20, 0, honest(20, 0) * 50)).flagged
    assert st.baseline.n == before[0] and np.array_equal(st.baseline._m, before[1])  # the baseline never learns it
    # the windows learn it once, capped at their largest value: how far out it was stays unknown to them
    assert win.pushed == before[2] + 1
    assert (win._sorted[:, : win.count].max(1) <= top).all()
    assert det.observe(msg(20, 1, honest(20, 1) * 50)).flagged
    assert win.pushed == before[2] + 1  # the same sender within FLAG_MEMORY steps: no


def test_scores_are_pure_and_match_observe():
    det = small()
    feed(det, 20)
    x = honest(20, 1) * 2
    before = det.public_state()
    s1 = det.scores(0, Role.GRADIENT, x, "s1r0")
    s2 = det.scores(0, Role.GRADIENT, x, "s1r0")
    assert s1 == s2 and det.public_state() == before
    pooled = det.scores(0, Role.GRADIENT, x)  # the stream's pooled windows, s1r0's own values included
    same = {k: v for k, v in s1.items() if k != "evidence"}
    assert {k: v for k, v in pooled.items() if k != "evidence"} == same and pooled["evidence"] != s1["evidence"]
    v = det.observe(msg(20, 1, x))
    assert {k: v.scores[k] for k in s1} == pytest.approx(s1)


def test_public_state_and_thresholds():
    det = small()
    feed(det, 20)
    state = det.public_state()
    assert set(state["streams"]) == {"gradient/0"}
    thr = det.thresholds(0, Role.GRADIENT)
    st = det._streams[(0, int(Role.GRADIENT))]
    assert set(thr) == set(st.names) | {"evidence"} and thr["evidence"] == det.config.level
    legacy = small(combine="any")
    feed(legacy, 20)
    thr = legacy.thresholds(0, Role.GRADIENT)
    assert set(thr) == set(legacy._streams[(0, 1)].names) | {"exceedance"} and thr["exceedance"] == legacy.config.k
    assert det.thresholds(3, Role.ACTIVATION) == {}


def test_stage_wide_shift_is_learned_not_flagged():
    """Honest majority: when most senders of a stage jump together, it is drift, not an attack."""
    det = small()
    feed(det, 20)
    shifted = 0
    for s in range(20, 30):
        for m in range(4):
            shifted += det.observe(msg(s, m, honest(s, m) * 4, sender=f"s1r{m % 3}")).flagged
    assert shifted <= 5  # each sender's first shifted messages, until more than half of the honest ones are seen
    off = small(consensus_horizon=0)
    feed(off, 20)
    stuck = sum(
        off.observe(msg(s, m, honest(s, m) * 4, sender=f"s1r{m % 3}")).flagged for s in range(20, 30) for m in range(4)
    )
    assert stuck == 40  # without it, flagged messages never teach the baseline: stuck forever


@pytest.mark.parametrize("feeders", ["several", "one", "one_left"])
def test_a_shift_that_all_descends_from_one_upstream_sender_is_not_drift(feeders):
    """The consensus reads a stage jumping together as drift, unless every anomalous message received its input from
    the same upstream worker (`SenderInputs.origin`): an upstream attacker that evades its own boundary can break the
    relation of every replica it feeds (fence evasion on activations, seed 0: an honest receiver was banned). Where
    the feeding stage has a single live replica left, one feeder is the topology and drift is still drift."""
    from sentinel.detectors.base import DetectorEnv
    from sentinel.transport.relay import SenderInputs

    def inputs(m: Message) -> SenderInputs:  # the backward's forward input came from these stage-0 workers
        up = f"s0r{m.mb_idx % 3}" if feeders == "several" else "s0r0"
        return SenderInputs((m.step, m.mb_idx, m.boundary, int(m.role)), None, None, (up, None))

    def live(stage: int) -> list[str]:
        return ["s0r0"] if stage == 0 and feeders == "one_left" else [f"s{stage}r{i}" for i in range(3)]

    env = DetectorEnv(sender_inputs=inputs, live_replicas=live)
    det = Sentinel(Sentinel.Config(warmup_steps=5, window=64), seed=0, env=env)
    feed(det, 20)
    flagged = sum(
        det.observe(msg(s, m, honest(s, m) * 4, sender=f"s1r{m % 3}")).flagged for s in range(20, 30) for m in range(4)
    )
    assert flagged == 40 if feeders == "one" else flagged <= 5  # one feeder of several: never learned as drift


def test_single_outlier_sender_is_still_flagged_during_consensus():
    det = small()
    feed(det, 20)
    for m in range(3):  # two honest senders recently normal
        det.observe(msg(20, m, honest(20, m), sender=f"s1r{m % 2}"))
    assert det.observe(msg(20, 3, -honest(20, 3) * 10, sender="s1r2")).flagged


@pytest.mark.parametrize("combine", ["any", "vote", "weighted"])
def test_combine_rules_read_statistic_against_k(combine):
    from sentinel.detectors.distances import DISTANCES

    det = small(combine=combine, distances=DISTANCES)
    e = np.array([5.0, -1.0, 0.5, 2.0, -0.2, 0.0])
    stat = det.statistic(e)
    assert stat == {"any": 5.0, "vote": 2.0, "weighted": 7.5}[combine]


def test_seeded_determinism():
    a, b = small(), small()
    for s in range(25):
        for m in range(3):
            x = honest(s, m) * (1 if s < 22 else -1)
            assert a.observe(msg(s, m, x)) == b.observe(msg(s, m, x))


def test_scores_do_not_move_the_token_sampler():
    """On payloads larger than max_tokens, scores() must not change the verdicts observe() gives later."""
    a, b = small(max_tokens=8), small(max_tokens=8)
    feed(a, 12)
    feed(b, 12)
    for i in range(5):
        a.scores(0, Role.GRADIENT, honest(50 + i, 0))  # only `a` is probed
    for s in range(12, 16):
        for m in range(3):
            x = honest(s, m) * (1 if s < 14 else -1)
            assert a.observe(msg(s, m, x)) == b.observe(msg(s, m, x))


def test_token_offsets_depend_on_the_message_alone():
    """A keyed hash of the message's identity: the same in any order, different across messages and seeds."""
    det, other = small(), Sentinel(Sentinel.Config(), seed=1)
    msgs = [msg(s, m, honest(s, m)) for s in range(20) for m in range(3)]
    forward = [det._offset(x) for x in msgs]
    assert forward == [det._offset(x) for x in msgs[::-1]][::-1]  # order does not matter
    assert len(set(forward)) == len(msgs) and all(0 <= o < 1 << 30 for o in forward)
    assert forward != [other._offset(x) for x in msgs]  # the key comes from the seed


@pytest.mark.parametrize("substitutes", [True, False])
def test_whole_payload_baseline_is_kept_only_when_a_substitute_may_be_asked(substitutes):
    from sentinel.detectors.base import DetectorEnv

    det = Sentinel(Sentinel.Config(warmup_steps=5, window=64), seed=0, env=DetectorEnv(substitutes=substitutes))
    feed(det, 3)
    assert (det.substitute(msg(3, 0, honest(3, 0))) is not None) == substitutes


def test_gradient_streams_skip_what_gradient_skip_names():
    """By default gradients are judged without l2_normalized (its honest tail on text: 10-20x spikes); activations
    keep every statistic, and `gradient_skip: []` judges gradients on all of them."""
    det, every = small(), small(gradient_skip=())
    for d in (det, every):
        feed(d, 6)
        feed(d, 6, Role.ACTIVATION)
    assert "l2_normalized" not in det._streams[(0, int(Role.GRADIENT))].names
    assert "l2_normalized" in det._streams[(0, int(Role.ACTIVATION))].names
    assert "l2_normalized" in every._streams[(0, int(Role.GRADIENT))].names
    assert "l2_normalized" not in det.observe(msg(6, 0, honest(6, 0))).scores
    problems = dict(Sentinel.check_config(Sentinel.Config(distances=("l2_normalized",))))
    assert "gradient_skip" in problems


def test_activation_streams_skip_what_activation_skip_names():
    """By default activations are judged without retain, retain_high and carry (gradients only); what `activation_skip`
    names is left out of the activation streams alone, and a list that leaves activations nothing is a located config
    error."""
    assert Sentinel.Config().activation_skip == ("retain", "retain_high", "carry")
    assert {"retain", "retain_high", "carry"} <= set(Sentinel.Config().distances)
    det = small(activation_skip=("l1",))
    feed(det, 6)
    feed(det, 6, Role.ACTIVATION)
    assert "l1" not in det._streams[(0, int(Role.ACTIVATION))].names
    assert "l1" in det._streams[(0, int(Role.GRADIENT))].names
    problems = dict(Sentinel.check_config(Sentinel.Config(distances=("retain",), gradient_skip=())))
    assert "activation_skip" in problems


def test_accepted_outliers_share_the_senders_flag_budget():
    """An accepted message with a statistic at p < CAP_P teaches it (capped) once per sender every FLAG_MEMORY steps,
    the budget flagged messages use: a sender accepted just under the level every step cannot fatten a tail."""
    from sentinel.detectors.calibration import CAP_P
    from sentinel.detectors.stagewise import FLAG_MEMORY

    det = small()
    feed(det, 20)
    st = det._streams[(0, int(Role.GRADIENT))]
    quiet, far = np.full(len(st.names), 0.5), np.full(len(st.names), 0.5)
    far[0] = CAP_P / 10
    assert det._take_outlier_budget(st, msg(20, 0, None), quiet) and "s1r0" not in st.outlier_at
    assert det._take_outlier_budget(st, msg(20, 0, None), far) and st.outlier_at["s1r0"] == 20
    assert not det._take_outlier_budget(st, msg(20 + FLAG_MEMORY - 1, 0, None), far)
    assert det._take_outlier_budget(st, msg(20 + FLAG_MEMORY - 1, 0, None, sender="s1r1"), far)  # per sender
    assert det._take_outlier_budget(st, msg(20 + FLAG_MEMORY, 0, None), far)


def test_the_recent_window_is_off_at_zero_and_needs_a_tail_to_fit():
    assert "recent" in dict(Sentinel.check_config(Sentinel.Config(recent=8)))
    assert "recent" not in dict(Sentinel.check_config(Sentinel.Config(recent=0)))
    det = small(recent=0)
    feed(det, 6)
    assert det._streams[(0, int(Role.GRADIENT))].fences.pooled.recent == 0


@pytest.mark.parametrize("replicas, lagging", [(3, False), (2, False), (3, True)])
def test_a_sender_is_judged_against_its_peers_windows_from_three_exchangeable_replicas(replicas, lagging):
    """A sender whose every message is moderately out teaches the pooled windows its own values (a third of them), and
    stops looking out; judged against its peers' windows it keeps being flagged. With two live replicas a sender's
    peers' windows would be one peer's traffic, and an async straggler differs from its peers honestly (its cohort,
    `DetectorEnv.cohort`, holds it alone): the pooled windows judge."""
    from sentinel.detectors.base import DetectorEnv

    senders = ("s1r0", "s1r1", "s1r2")
    live = list(senders[:replicas])
    env = DetectorEnv(live_replicas=lambda s: live, cohort=(lambda w: w == "s1r2") if lagging else None)
    det = Sentinel(Sentinel.Config(warmup_steps=5, window=64), seed=0, env=env)
    feed(det, 20, senders=senders)
    flags = 0
    for s in range(20, 60):
        for m in (0, 1):  # its peers keep sending (and teaching) as before
            det.observe(msg(s, m, honest(s, m), sender=senders[m]))
        flags += det.observe(msg(s, 2, honest(s, 2) * 1.6, sender="s1r2")).flagged
    assert (flags >= 30) if replicas == 3 and not lagging else (flags <= 10)


def test_a_message_is_flagged_only_when_the_pooled_windows_find_it_far_out_too():
    """Two tail probabilities per message: against the sender's peers' windows (the leave-one-out p: `Verdict.pvalue`,
    what the sequential test, the learning rule and the drift tests read) and against the pooled windows. The flag
    takes the larger of the two, and the logged evidence is the flag's (flagged <=> evidence > level). A sender that
    taught the pooled windows its own high values during the warm-up stays far out against its peers (sequential
    evidence) while its messages are not flagged."""
    from sentinel.detectors.base import DetectorEnv

    senders = ("s1r0", "s1r1", "s1r2")
    env = DetectorEnv(live_replicas=lambda s: list(senders))
    det = Sentinel(Sentinel.Config(warmup_steps=20, window=64), seed=0, env=env)
    quiet_but_out = 0
    for s in range(40):
        for m in range(3):
            x = honest(s, m) * (2.0 if m == 2 else 1.0)  # s1r2 from the start: the pooled windows learn it
            v = det.observe(msg(s, m, x, sender=senders[m]))
            if s < 20:
                continue
            e = v.scores["evidence"]
            assert v.flagged == (e > det.config.level)
            if m == 2:
                assert v.pvalue is not None and e <= -math.log10(v.pvalue) + 1e-9
                quiet_but_out += not v.flagged and -math.log10(v.pvalue) > det.config.level
    assert quiet_but_out >= 15  # of its 20 judged messages
    st = det._streams[(0, int(Role.GRADIENT))]
    payload = honest(40, 2) * 2.0
    values = det._values(st, det._signature(payload, 0)[0], payload, None)
    t, e, p, _, e_flag = det._judge(st, values, "s1r2", loo=True)
    pooled = combine(st.fences.pvalues(t, "s1r2", loo=False))  # against a window a third of which is its own
    assert e > det.config.level >= e_flag
    assert e == pytest.approx(-math.log10(p)) and e_flag == pytest.approx(-math.log10(max(p, pooled)))
    assert det._judge(st, values, "s1r2", loo=False)[4] == det._judge(st, values, "s1r2", loo=False)[1]


def test_a_sender_is_judged_against_the_pooled_windows_while_a_peer_drifts():
    """In a drift the whole stage shares, a sender's own values say where the stream is going as much as its peers'
    do: while any peer of its cohort sends messages that average more evidence than uniform p-values would (by
    PEER_DRIFT_Z standard errors, over `consensus_horizon` steps), the sender is judged against the pooled windows
    (the clean twin of `compression/attacks_async.yaml`, seed 4: 1.22% of honest messages flagged otherwise). Quiet
    peers, and peers whose drift is older than the horizon, leave it its peers' windows."""
    from sentinel.detectors.base import DetectorEnv
    from sentinel.detectors.streams import Stream

    senders = ("s1r0", "s1r1", "s1r2")
    det = Sentinel(Sentinel.Config(warmup_steps=5, window=64), seed=0, env=DetectorEnv(live_replicas=lambda s: senders))
    feed(det, 20, senders=senders)
    st = det._streams[(0, int(Role.GRADIENT))]
    assert det._loo(st, 0, Role.GRADIENT, "s1r2", 20) and det._loo(st, 0, Role.GRADIENT, "s1r0", 20)
    for s in range(20, 23):  # s1r0 drifts: two messages a step, both out
        for m in (0, 1):
            det.observe(msg(s, m, honest(s, m) * 1.6, sender="s1r0"))
    assert not det._loo(st, 0, Role.GRADIENT, "s1r2", 23) and not det._loo(st, 0, Role.GRADIENT, "s1r1", 23)
    assert det._loo(st, 0, Role.GRADIENT, "s1r0", 23)  # its own drift is not its peers'
    assert det._loo(st, 0, Role.GRADIENT, "s1r2", 22 + det.config.consensus_horizon)  # out of the horizon
    quiet = Stream(det.config, 0.9, keep_full=False)  # a peer with uniform p-values: elevated on ~1% of steps
    draws, hits = np.random.default_rng(0).exponential(1 / np.log(10), (500, 2)), 0
    for step, pair in enumerate(draws):
        for e in pair:
            quiet.note("w", step, float(e), 5)
        hits += quiet.elevated("w", step, 5, 3.0)
    assert hits <= 10  # of 500 steps


@pytest.mark.parametrize("replicas", [4, 5])
def test_colluders_alone_cannot_make_a_stage_shift(replicas):
    """The consensus counts the most malicious replicas an honest majority allows, f = (R - 1) // 2, as anomalous
    already: it recognises a shift only when more than half of the honest ones are anomalous too. So f colluders
    and fewer than that many honest replicas anomalous together are no shift, whatever their evidence; one honest
    replica more is (`Stream.stage_shift`)."""
    from sentinel.detectors.streams import Stream

    st = Stream(Sentinel.Config(), beta=0.9, keep_full=False)
    live = [f"s1r{i}" for i in range(replicas)]
    f = (replicas - 1) // 2
    honest_needed = (replicas - f) // 2 + 1
    level, step, horizon = 1.5, 10, 5
    anomalous = live[:f] + live[f : f + honest_needed - 1]  # the colluders and one honest replica short
    for i, w in enumerate(live):  # each fed by another upstream worker (no single origin to rule it out)
        st.recent[w] = (step, 9.0 if w in anomalous else 0.1)
        st.remember(step, st.recent[w][1], (f"s0r{i}", None), horizon)
    assert not st.stage_shift(step, 9.0, level, live, horizon)
    st.recent[live[f + honest_needed - 1]] = (step, 9.0)  # one more honest replica anomalous: a shift
    assert st.stage_shift(step, 9.0, level, live, horizon)


def test_a_one_statistic_drift_needs_the_quorum_in_that_statistic_and_not_its_outlier():
    """`Stream.statistic_drift`: a stage drifts in one statistic when the latest messages of a quorum of its replicas
    (`shift_quorum`) are beyond the level in that same statistic, and the message that shows it is no more anomalous
    there than the (R - f)-th smallest: the wave's leader alone, or replicas beyond the level in different statistics,
    or anomalous messages all fed by one upstream worker, are not drift."""
    from sentinel.detectors.streams import Stream

    live, step, horizon, level = ["s2r0", "s2r1", "s2r2"], 22, 5, 2.0

    def stream(rows, origins=None):
        st = Stream(Sentinel.Config(), beta=0.9, keep_full=False)
        for i, (w, ev) in enumerate(zip(live, rows)):
            st.remember_each(w, step, np.array(ev, dtype=float), origins[i] if origins else (f"s1r{i}", None), horizon)
        return st

    # statistic 1 (say `match`): the leader at 8, its peers at 2.2 and 3.0; statistic 0 quiet
    st = stream([[0.1, 8.0], [0.3, 2.2], [0.2, 3.0]])
    assert st.statistic_drift(step, "s2r2", level, live, horizon)  # a peer of the wave: the stage drifts
    assert st.statistic_drift(step, "s2r1", level, live, horizon)
    assert not st.statistic_drift(step, "s2r0", level, live, horizon)  # the outlier cannot show it
    # one peer short of the quorum in that statistic (beyond the level in another one instead): no drift
    st = stream([[0.1, 8.0], [0.3, 1.5], [2.5, 3.0]])
    assert not any(st.statistic_drift(step, w, level, live, horizon) for w in live)
    # every anomalous message fed by one upstream worker: that worker's corruption, not drift
    st = stream([[0.1, 8.0], [0.3, 2.2], [0.2, 3.0]], origins=[("s1r0", None)] * 3)
    assert not st.statistic_drift(step, "s2r2", level, live, horizon)
    # out of the horizon, a replica's latest message no longer counts
    st = stream([[0.1, 8.0], [0.3, 2.2], [0.2, 3.0]])
    assert not st.statistic_drift(step + horizon, "s2r2", level, live, horizon)


@pytest.mark.parametrize("replicas", [4, 5])
def test_colluders_alone_cannot_make_a_one_statistic_drift(replicas):
    """As `stage_shift`'s consensus: f colluders beyond the level in a statistic and one honest replica fewer than
    more than half of the honest ones make no drift in it; one honest replica more does."""
    from sentinel.detectors.streams import Stream

    st = Stream(Sentinel.Config(), beta=0.9, keep_full=False)
    live = [f"s1r{i}" for i in range(replicas)]
    f = (replicas - 1) // 2
    honest_needed = (replicas - f) // 2 + 1
    level, step, horizon = 2.0, 10, 5
    anomalous = live[:f] + live[f : f + honest_needed - 1]
    for i, w in enumerate(live):
        st.remember_each(w, step, np.array([0.1, 3.0 if w in anomalous else 0.1]), (f"s0r{i}", None), horizon)
    assert not any(st.statistic_drift(step, w, level, live, horizon) for w in live)
    st.remember_each(live[f + honest_needed - 1], step, np.array([0.1, 3.0]), ("s0r9", None), horizon)
    assert st.statistic_drift(step, live[f + honest_needed - 1], level, live, horizon)


def test_a_sparse_payload_is_a_replay_only_when_every_entry_repeats():
    """Top-k traffic whose kept entries all sit in one feature (a massive activation): two honest messages can have
    equal pooled means (the signature's head, the replay key of a dense payload) while their entries differ. Not a
    replay; an exact repeat still is."""
    from sentinel.detectors.base import Marker

    shape = (2, 8, 64)  # 64 features: the key's 64 entries are the pooled mean alone
    det = small()
    for s in range(6):
        for mb in range(4):
            det.observe(msg(s, mb, torch.randn(shape, generator=torch.Generator().manual_seed(10 * s + mb))))

    def sink(values):
        x = torch.zeros(shape)
        x.view(-1, shape[-1])[:2, 3] = torch.tensor(values)
        return x

    a, b = sink([1.0, 3.0]), sink([2.0, 2.0])  # other values, the same pooled mean
    assert not torch.equal(a, b) and torch.equal(a.mean((0, 1)), b.mean((0, 1)))
    assert Marker.REPLAY not in det.observe(msg(7, 0, a)).markers
    assert Marker.REPLAY not in det.observe(msg(7, 1, b, sender="s1r1")).markers
    assert det.observe(msg(8, 0, a.clone())).markers == {Marker.REPLAY}


@pytest.mark.parametrize("shape", [(4, 64, 32), (4, 64, 64)])
def test_a_dense_replay_is_caught_whichever_tokens_the_moments_sample(shape):
    """Messages longer than `max_tokens` are sampled from a per-message offset; with width under 64 or a clipped
    token, the signature's head depended on it, and a replay of such a message was caught on 1 of 4 messages."""
    from sentinel.detectors.base import Marker

    det = Sentinel(Sentinel.Config(warmup_steps=2, window=64, max_tokens=128), seed=0)

    def payload(s, mb):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(100 * s + mb))
        x.view(-1, shape[-1])[::37] *= 50  # a few long tokens: clipping is active
        return x

    for s in range(6):
        for mb in range(4):
            det.observe(msg(s, mb, payload(s, mb)))
    replayed = [det.observe(msg(8, mb, payload(5, mb))).markers for mb in range(4)]
    assert all(m == {Marker.REPLAY} for m in replayed)
