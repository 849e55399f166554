"""Sequential evidence per worker: the CUSUM of log e-values, its cap, the peer guard, and the responder's use."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentinel.detectors.base import Verdict
from sentinel.engine.workers import MeshControl, WorkerTable
from sentinel.response import Responder
from sentinel.scenario import ResponseConfig
from sentinel.sequential import KAPPA, PEER_HORIZON, SequentialEvidence, log_evalue
from sentinel.transport.message import Message, Role


def test_log_evalue_is_the_calibrator():
    from scipy.integrate import quad

    p = 1e-4
    assert log_evalue(p) == pytest.approx(math.log(KAPPA * p ** (KAPPA - 1)))
    assert quad(lambda x: math.exp(log_evalue(x)), 0, 1)[0] == pytest.approx(1.0)  # E[e(p)] = 1 for a uniform p


def test_no_single_step_bans_and_two_strong_steps_do():
    ev = SequentialEvidence(1e-8)
    ev.begin_step()
    for _ in range(5):  # five extreme messages in one step add no more than one
        ev.update("w", 1e-30)
    assert ev.level["w", 0] == pytest.approx(ev.threshold / 2) and not ev.exceeds("w", []) and ev.due() == []
    ev.begin_step()
    ev.update("w", 1e-30)  # one message adds at most a third of the threshold
    assert ev.level["w", 0] == pytest.approx(ev.threshold * 5 / 6) and ev.due() == []
    ev.update("w", 1e-30)
    assert ev.due() == [("w", 0)] and ev.exceeds("w", [])
    ev.update("w", 1.0)  # evidence against still lowers it within the step, but the step reached the threshold
    assert ev.level["w", 0] == pytest.approx(ev.threshold + math.log(KAPPA)) and ev.exceeds("w", [])


def test_two_extreme_messages_do_not_ban():
    """Two honest microbatches far out in consecutive steps (the realistic Llama's gradients, p = 1e-19 and 2e-6, a
    false ban before the per-message cap) leave the worker below the threshold; a third one bans."""
    ev = SequentialEvidence(1e-8)
    for p in (1e-19, 2e-6):
        ev.begin_step()
        ev.update("w", p)
    assert ev.due() == [] and ev.level["w", 0] == pytest.approx(ev.threshold * 2 / 3)
    ev.begin_step()
    ev.update("w", 1e-19)
    assert ev.due() == [("w", 0)]


def test_streams_keep_their_own_statistics_at_a_split_threshold():
    """One statistic per (worker, stream): another stream's honest messages do not dilute it, and the threshold
    ln(streams / alpha) keeps a worker's false-ban probability below alpha over its streams."""
    ev = SequentialEvidence(1e-8, streams=2)
    assert ev.threshold == pytest.approx(math.log(2e8))
    for _ in range(2):
        ev.begin_step()
        ev.update("w", 1e-30, stream=1)
        ev.update("w", 1e-30, stream=1)
        for _ in range(4):
            ev.update("w", 1.0, stream=0)
    assert ev.due() == [("w", 1)] and ev.exceeds("w", [], stream=1) and not ev.exceeds("w", [], stream=0)
    assert ev.level["w", 0] == 0.0
    ev.forget("w")
    assert not ev.level and not ev.peak


def test_honest_uniform_pvalues_never_reach_the_threshold():
    """A long honest stream (100,000 messages of one worker) stays below the default threshold with a margin."""
    rng = np.random.default_rng(1)
    ev = SequentialEvidence(ResponseConfig().sequential_alpha)
    top = max(ev.update("w", float(p)) for p in rng.random(100_000))
    assert top < 0.5 * ev.threshold


def test_peers_that_stand_out_too_block_the_ban():
    ev = SequentialEvidence(1e-8)
    for _ in range(2):
        ev.begin_step()
        for w in ("a", "b", "c"):
            ev.update(w, 1e-30)
            ev.update(w, 1e-30)
    assert not ev.exceeds("a", ["b", "c"])  # the whole stage moved: drift, not an attack
    ev.forget("b")
    ev.forget("c")
    assert ev.exceeds("a", ["b", "c"])


def test_the_guard_compares_peers_in_the_same_direction():
    """Peers whose gradients all stand out (a stage-wide drift in that direction) neither block nor excuse a ban on
    activations: each direction's guard reads the peers' statistics of that direction."""
    ev = SequentialEvidence(1e-8, streams=2)
    for _ in range(2):
        ev.begin_step()
        for w in ("a", "b", "c"):
            ev.update(w, 1e-30, stream=1)
            ev.update(w, 1e-30, stream=1)
        ev.update("a", 1e-30, stream=0)
        ev.update("a", 1e-30, stream=0)
    assert not ev.exceeds("a", ["b", "c"], stream=1)  # the gradients moved together: drift
    assert ev.exceeds("a", ["b", "c"], stream=0)  # a's activations stand out alone
    assert sorted(ev.due()) == [("a", 0), ("a", 1), ("b", 1), ("c", 1)]


def _responder(**cfg):
    workers = WorkerTable(4, 3)
    mesh = MeshControl(workers)
    return Responder(ResponseConfig(**cfg), mesh), mesh


def _msg(step, mb, boundary, sender, role=Role.ACTIVATION):
    return Message(step, mb, boundary, role, sender, "x", torch.ones(2, 2))


def _bans(mesh) -> list[str]:
    return [e.worker for e in mesh.drain() if e.kind == "ban"]


def test_the_responder_bans_on_strong_pvalues_in_two_steps_not_one():
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-12, relation_pvalue=1e-12)
    r.end_step(0, [(_msg(0, 0, 1, "s1r0"), strong), (_msg(0, 1, 1, "s1r0"), strong)])
    assert _bans(mesh) == []
    r.end_step(1, [(_msg(1, 0, 1, "s1r0"), strong), (_msg(1, 1, 1, "s1r0"), strong)])
    assert _bans(mesh) == ["s1r0"] and r.banned == {"s1r0": 1}


def test_a_gradient_attackers_honest_activations_do_not_dilute_its_gradient_evidence():
    """Per direction: a worker whose gradients are anomalous is banned in two steps however many honest activations
    (p = 1, -1.6 nats each) it sends in between."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=1.0)
    for s in range(2):
        recs = [(_msg(s, m, 0, "s1r0", Role.GRADIENT), strong) for m in range(2)]
        recs += [(_msg(s, m, 1, "s1r0"), calm) for m in range(8)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"]


def test_the_guard_weighs_the_whole_step_whoever_sent_first():
    """A stage-wide jump reaches the replica whose messages come first before its peers': the guard waits for the
    step's last message, so it blocks the ban in either order, and the stage's statistics settle at the guard level."""
    ev = SequentialEvidence(1e-8)
    for order in (["a", "b", "c"], ["c", "b", "a"]):
        ev = SequentialEvidence(1e-8)
        for _ in range(2):
            ev.begin_step()
            for w in order:
                ev.update(w, 1e-30)
                ev.update(w, 1e-30)
        due = ev.due()
        assert sorted(due) == [("a", 0), ("b", 0), ("c", 0)]
        assert not any(ev.exceeds(w, [x for x in order if x != w]) for w, _ in due)
        ev.settle(order)  # what the drift gathered beyond the guard level is not evidence
        assert all(ev.level[w, 0] == pytest.approx(ev.threshold / 2) for w in order)


def test_evidence_a_whole_stage_shares_counts_for_nobody():
    """The responder takes the stage's common level out (`weigh_step`). A stage whose replicas all send p ~ 0.05 (honest
    drift faster than the windows: -0.15 nats a message instead of a uniform p's -2.05) with an extreme message now
    and then on each (the realistic Llama's middle-stage gradients over steps 55-100) gathers nothing; a replica far
    beyond its peers still does."""
    r, mesh = _responder()
    replicas = ["s1r0", "s1r1", "s1r2"]
    drift, strong = Verdict({}, False, pvalue=0.05), Verdict({}, False, pvalue=1e-30)
    top = 0.0
    for s in range(30):
        recs = [(_msg(s, 3 * i + m, 1, w), drift) for i, w in enumerate(replicas) for m in range(3)]
        r.end_step(s, recs + [(_msg(s, 9, 1, replicas[s % 3]), strong)])
        top = max(top, *r.evidence.level.values())
    assert _bans(mesh) == [] and top < r.evidence.threshold / 4  # one extreme message's worth, never more
    for s in range(30, 30 + PEER_HORIZON + 3):  # an attacker among them: every message extreme
        recs = [(_msg(s, 3 * i + m, 1, w), drift) for i, w in enumerate(replicas[1:]) for m in range(3)]
        r.end_step(s, recs + [(_msg(s, 6 + m, 1, "s1r0"), strong) for m in range(3)])
    # its messages are no more extreme than its peers' lately: they count little until those leave the horizon
    assert _bans(mesh) == ["s1r0"] and r.banned["s1r0"] <= 30 + PEER_HORIZON


@pytest.mark.parametrize(
    "peers_p, banned_after",
    [(0.5, 2), (None, 4), (0.05, None)],
    ids=["quiet stage: h/2 a message", "peers silent (level unknown): h/3", "drifting stage: h/3 less the level"],
)
def test_the_message_cap_is_strict_only_while_the_stage_drifts(peers_p, banned_after):
    """One extreme message a step (a sparse attacker): in a quiet stage (its peers' p-values uniform or better, common
    level <= 0) each counts up to h / 2, so two ban; where the stage drifts (the realistic Llama's honest episodes of
    extreme microbatches) or too few replicas sent to tell, each counts up to h / 3, so two never ban (three reach h
    up to rounding)."""
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-30)
    for s in range(4):
        recs = [(_msg(s, 0, 1, "s1r0"), strong)]
        if peers_p is not None:
            recs += [(_msg(s, 1 + i, 1, w), Verdict({}, False, pvalue=peers_p)) for i, w in enumerate(["s1r1", "s1r2"])]
        r.end_step(s, recs)
    assert r.banned.get("s1r0") == (None if banned_after is None else banned_after - 1)
    assert _bans(mesh) == ([] if banned_after is None else ["s1r0"])


def test_a_stage_is_not_drifting_on_one_ordinary_pvalue():
    """The first judged step holds one message per replica: an honest p = 0.33 (0.12 nats above a uniform p's mean,
    an eighth of one message's standard deviation) made the paper table's stage 1 "drift" (seed 4, random signs on
    gradients), the strict cap held the attacker for a step, and its disturbance then raised its peers' statistics
    over the guard: banned 13 steps in instead of 1. The majority has to stand out beyond one standard error of its
    own messages: the stage is quiet, and two extreme messages ban at once."""
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-16)
    r.end_step(0, [(_msg(0, 0, 1, "s1r1"), Verdict({}, False, pvalue=1.0)),
                   (_msg(0, 1, 1, "s1r0"), Verdict({}, False, pvalue=0.33)),
                   (_msg(0, 2, 1, "s1r2"), strong)])  # fmt: skip
    r.end_step(1, [(_msg(1, 0, 1, "s1r2"), strong), (_msg(1, 1, 1, "s1r2"), strong)])
    assert _bans(mesh) == ["s1r2"] and r.banned["s1r2"] == 1


def test_one_peers_moderate_pvalues_do_not_make_a_small_stage_drift():
    """Quiet is judged on the median of the stage's recent messages. A sparse attacker (one extreme message and one
    honest one a step) whose peer sends p = 1e-3 every other step (its mean over five steps +2.3 nats above a uniform
    p's, which made the stage "drift" by the mean and left the attacker unbanned) is banned in four steps (over the
    first step's four messages both the mean and the median are high: the strict cap)."""
    r, mesh = _responder()
    strong, calm, moderate = (Verdict({}, False, pvalue=p) for p in (1e-30, 1.0, 1e-3))
    for s in range(6):
        recs = [(_msg(s, 0, 1, "s1r0"), strong), (_msg(s, 1, 1, "s1r0"), calm)]
        recs += [(_msg(s, 2, 1, "s1r1"), moderate if s % 2 == 0 else calm), (_msg(s, 3, 1, "s1r2"), calm)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"] and r.banned["s1r0"] == 3


def test_a_worker_does_not_make_its_own_stage_look_drifting():
    """Quiet by the median is judged on the worker's peers' messages, not its own: a dense attacker (two extreme
    messages a step) beside one peer whose messages sit at p = 0.03 (its mean keeps the stage from looking quiet by the
    mean) and one at p = 1 (three a step) raised the pooled median over a uniform p's, and the attacker's messages
    counted under the strict cap less the common level (~4 nats each: banned in three steps). Its peers' median is a
    uniform p's: the quiet cap, banned in two (set 7: 5 x 3 mesh, random routing, about one message per replica per
    step; issue-18 note, stop 54)."""
    r, mesh = _responder()
    strong, mild, calm = (Verdict({}, False, pvalue=p) for p in (1e-30, 0.03, 1.0))
    for s in range(3):
        recs = [(_msg(s, 0, 1, "s1r0"), strong), (_msg(s, 1, 1, "s1r0"), strong), (_msg(s, 2, 1, "s1r1"), mild)]
        recs += [(_msg(s, 3 + m, 1, "s1r2"), calm) for m in range(3)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"] and r.banned["s1r0"] == 1


def test_a_stage_whose_replicas_mostly_sent_a_far_out_message_drifts():
    """Honest tails can drift without moving a stage's mean or median: on held-out text (Python source, 12 layers,
    a 6 x 4 mesh, step ~100) every replica of a stage sent a message at p ~ 5e-5 to 4e-9 within six steps, and
    one of them two in consecutive steps, which banned it while the stage counted as quiet (h / 2 a message). When a
    strict majority of the stage's replicas sent a message at p <= TAIL_P over the horizon, the stage drifts (h / 3 a
    message less its level): the two messages do not ban. An attacker whose peers send nothing that far out is still
    banned in two steps."""
    strong, calm, far = (Verdict({}, False, pvalue=p) for p in (1e-9, 1.0, 1e-5))
    replicas = ["s1r0", "s1r1", "s1r2", "s1r3"]

    def run(plan: dict) -> Responder:
        r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
        for s in range(4):
            r.end_step(s, [(_msg(s, i, 1, w), plan.get((s, w), calm)) for i, w in enumerate(replicas)])
        return r

    twice = {(2, "s1r0"): strong, (3, "s1r0"): strong}
    r = run({(0, "s1r1"): far, (1, "s1r2"): far, **twice})  # s1r3 stays calm: three of four sent far out
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold
    r = run(twice)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 3


def _peers_far_run(far_peers: tuple[str, ...], steps: int = 4) -> Responder:
    """A 4-replica stage over `steps` steps: the peers `far_peers` each send a far-out message (p = 1e-9) in steps 0 and
    1 (two: one is not yet a rate), every other peer message is calm; s1r0 sends one far-out message in each of steps 2
    and 3, two calm ones in the others."""
    far, calm = Verdict({}, False, pvalue=1e-9), Verdict({}, False, pvalue=0.5)
    replicas = ["s1r0", "s1r1", "s1r2", "s1r3"]
    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
    for s in range(steps):
        recs = [
            (_msg(s, 2 * i + m, 1, w), far if s < 2 and m == 0 and w in far_peers else calm)
            for i, w in enumerate(replicas[1:], 1)
            for m in range(2)
        ]
        own = [far] if s in (2, 3) else [calm, calm]
        r.end_step(s, recs + [(_msg(s, 8 + m, 1, "s1r0"), v) for m, v in enumerate(own)])
    return r


def test_a_message_no_more_extreme_than_its_peers_send_lately_counts_little():
    """Held-out text (C headers, byte-level, 12 layers, a 6 x 4 mesh, step ~50 of 80): a stage's gradients began to send
    messages at p ~ 1e-7 to 1e-14 on three of four replicas over ten steps, never on a majority within five, and the
    one that sent four of them, with few messages between to drain, was banned while the stage counted as quiet. A
    message counts as if its p-value were no lower than the rate at which its peers sent messages as far out over the
    last PEER_HORIZON steps (less as the worker sends them more often than they do): after two far-out messages of
    each of two peers, two of its own in consecutive steps do not ban. Without the peers', they do (the quiet cap,
    h / 2 each)."""
    r = _peers_far_run(("s1r1", "s1r2"))
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold / 4
    r = _peers_far_run(())
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 3


def test_far_out_messages_of_one_step_are_not_a_rate():
    """A peer's far-out messages count as a rate once they fall in PEER_EVENTS (two) different steps: a single step's
    burst is one event. On held-out C-header bytes (the built-in model, 8 x 96, a 4 x 3 mesh, seed 463) an honest
    replica sent two messages at p ~ 1e-8 in step 20, at the onset of a drift in one statistic, and floored a later
    activation attacker's messages at p ~ 1e-7 to 1e-15 to p ~ 1e-1 to 4e-3 for ten steps. Here two peers of a
    4-replica stage send two far-out messages each in step 0 (or one in each of steps 0 and 1), and s1r0 one in each
    of steps 6 and 7, after the stage's drifting tail left the horizon: the burst of one step does not discount them."""
    far, calm = Verdict({}, False, pvalue=1e-9), Verdict({}, False, pvalue=0.5)

    def run(peer_steps: tuple[int, ...]) -> Responder:
        r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
        for s in range(9):
            recs = []
            for i, w in enumerate(["s1r1", "s1r2", "s1r3"], 1):
                ps = [far if w != "s1r3" and (s, m) in peer_steps else calm for m in range(2)]
                recs += [(_msg(s, 2 * i + m, 1, w), v) for m, v in enumerate(ps)]
            own = [far] if s in (6, 7) else [calm, calm]
            r.end_step(s, recs + [(_msg(s, 8 + m, 1, "s1r0"), v) for m, v in enumerate(own)])
        return r

    r = run(((0, 0), (0, 1)))
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 7
    r = run(((0, 0), (1, 0)))
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold / 2


def test_one_bursty_peer_of_three_is_not_the_stages_rate():
    """The rate that discounts a message is what at least half of the worker's peers show (the m-th largest share, m =
    ceil(peers / 2)): one peer of three with a burst of far-out messages does not shield the others. With m = 1 on
    held-out HTML bytes (5 x 80 on a 5 x 4 mesh, seed 141) one honest replica's burst around step 20 floored an
    attacker's gradient messages at p ~ 1e-24 to ~1e-2 for 17 steps, under five different gradient attacks. Here the
    bursty peer's own statistic still stands at a quarter of the threshold or above when s1r0 reaches it at step 3, so
    the ban waits a step for the consensus (`rising`), which sees no stage-wide shift."""
    r = _peers_far_run(("s1r1",), steps=5)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 4


def test_colluding_attackers_cannot_vouch_for_each_other():
    """Two attackers in a 5-replica stage (a strict honest majority): each one's rate of far-out messages is what the
    other's peers measure, so the rate that discounts a message is the m-th largest of its peers' (m = ceil(peers / 2)
    = 2 here), at most an honest peer's: both are banned in two steps."""
    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 5)))
    strong, calm = Verdict({}, False, pvalue=1e-30), Verdict({}, False, pvalue=0.5)
    for s in range(2):
        recs = [(_msg(s, 2 * i + m, 1, w), strong) for i, w in enumerate(["s1r0", "s1r1"]) for m in range(2)]
        recs += [(_msg(s, 4 + i, 1, w), calm) for i, w in enumerate(["s1r2", "s1r3", "s1r4"])]
        r.end_step(s, recs)
    assert sorted(_bans(r.mesh)) == ["s1r0", "s1r1"] and set(r.banned.values()) == {1}


def test_a_peer_lifted_by_one_extreme_message_does_not_block_a_ban():
    """In a quiet stage one message counts up to h / 2: a peer with a single extreme message reaches h / 2 and no
    more, which is not "standing out too" (on held-out text such a peer blocked the ban of a sparse gradient attacker
    and settled its statistic to h / 2; it took 40 steps instead of 17)."""
    ev = SequentialEvidence(1e-8)
    for step in range(2):
        ev.begin_step()
        ev.update("a", 1e-30, cap=ev.quiet_message_cap)
        ev.update("a", 1e-30, cap=ev.quiet_message_cap)
        if step == 1:
            ev.update("b", 1e-30, cap=ev.quiet_message_cap)
    assert ev.peak["b", 0] == 0.5 * ev.threshold
    assert ev.exceeds("a", ["b", "c"])
    ev.begin_step()
    ev.update("b", 1e-3)  # more evidence in another step: b stands out too
    assert not ev.exceeds("a", ["b", "c"])


def test_a_malicious_minority_cannot_raise_the_common_level():
    """The common level is what a strict majority of the stage reaches: one replica's own evidence (an attacker's)
    does not discount it, so it is banned in two steps whatever its peers' quiet messages."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(2):
        recs = [(_msg(s, 0, 1, "s1r1"), calm), (_msg(s, 1, 1, "s1r2"), calm)]
        r.end_step(s, recs + [(_msg(s, 2 + m, 1, "s1r0"), strong) for m in range(2)])
    assert _bans(mesh) == ["s1r0"]


def test_a_worker_standing_out_alone_is_banned_after_its_peers_rejoin_the_crowd():
    """The common level is per stage: an attacker in another stage keeps its evidence."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(2):
        recs = [(_msg(s, i, 1, w), strong) for i, w in enumerate(["s1r0", "s1r1", "s1r2"])]
        recs += [(_msg(s, 3 + m, 2, "s2r0"), strong) for m in range(2)]
        recs += [(_msg(s, 5, 2, "s2r1"), calm), (_msg(s, 6, 2, "s2r2"), calm)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s2r0"]


def test_no_evidence_from_a_stream_in_a_stage_wide_shift():
    """A step in which the detector recognised a stage-wide shift in a stream (SHIFT marker) adds nothing to its
    senders' statistics: their anomaly is the stage's drift."""
    from sentinel.detectors.base import Marker

    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-12)
    shift = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=0.2)
    for s in range(3):
        r.end_step(s, [(_msg(s, 0, 1, "s1r0"), strong), (_msg(s, 1, 1, "s1r1"), shift)])
    assert r.evidence.level.get(("s1r0", 0), 0.0) == 0.0 and _bans(mesh) == []


def test_a_drift_in_one_statistic_settles_its_accepted_senders_not_a_flagged_one():
    """A step in which the detector recognised a drift in one statistic in a stream (a verdict marked DRIFT) settles,
    and adds nothing to, the statistics of the senders that sent only accepted messages in it: the wave's first
    replica, far out before its peers followed, is not banned. A sender flagged in that stream in that step stands
    beyond the drift and keeps its evidence; unmarked, the step brings the first replica to the threshold."""
    from sentinel.detectors.base import Marker

    def run(marked: bool) -> Responder:
        r, _ = _responder()
        for s in range(3):
            lead = Verdict({}, s < 2, pvalue=1e-5)  # flagged twice, then accepted as its peers follow
            marks = frozenset({Marker.DRIFT}) if marked and s == 2 else frozenset()
            peer = Verdict({}, False, marks, pvalue=0.05 if s == 2 else 0.5)  # the peers follow at step 2
            other = Verdict({}, s == 2, pvalue=1e-5 if s == 2 else 0.5)  # flagged in the drift's step
            r.end_step(
                s, [(_msg(s, 0, 1, "s1r0"), lead), (_msg(s, 1, 1, "s1r1"), peer), (_msg(s, 2, 1, "s1r2"), other)]
            )
            if s == 1:
                r.before = r.evidence.level["s1r0", 0]
                assert r.before > r.evidence.threshold / 2
        return r

    r = run(marked=False)
    assert r.evidence.level["s1r0", 0] >= r.evidence.threshold > r.before  # at the threshold (its ban waits a step)
    r = run(marked=True)
    assert "s1r0" not in r.banned and r.evidence.level["s1r0", 0] == r.evidence.threshold / 2
    assert ("s1r0", 1, 0) in r._explained and ("s1r2", 1, 0) not in r._explained  # flagged: its evidence counts


def test_a_recognised_shift_settles_its_stream_and_the_stage_drifts_after_it():
    """Once the detector recognises a stage-wide shift in a stream, what its senders gathered lately was the drift's
    onset (settled to half the threshold), and for DRIFT_HORIZON steps the stage drifts: a message adds at most the
    strict cap. On held-out HTML bytes (12 layers, 6 x 4, seed 161) random routing gave one replica most of a drifting
    stage's messages, the shift was recognised at step 90, and one more far-out message banned the replica at 91."""
    from sentinel.detectors.base import Marker

    def run(shift: bool) -> Responder:
        r, _ = _responder()
        calm = Verdict({}, False, pvalue=0.5)
        marked = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=0.5)
        for s, p in enumerate([1e-6, 1e-3, None, 1e-6]):
            recs = [(_msg(s, 0, 1, "s1r0"), Verdict({}, False, pvalue=p))] if p is not None else []
            peer = marked if shift and s == 2 else calm
            recs += [(_msg(s, 1, 1, "s1r1"), peer), (_msg(s, 2, 1, "s1r2"), calm)]
            r.end_step(s, recs)
            if s == 2:
                level = r.evidence.level["s1r0", 0]
                assert level <= r.evidence.threshold / 2 if shift else level > r.evidence.threshold / 2
        return r

    assert run(shift=False).banned == {"s1r0": 3}  # a quiet stage: one more far-out message bans
    r = run(shift=True)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold * (1 / 2 + 1 / 3)


def test_a_recognised_shift_ends_its_stages_peers_tail():
    """The far-out messages a stage sent before the detector recognised its shift were the drift's onset: the windows
    have learned the new regime since, so they are not the rate the stage's traffic shows now. On held-out C-header
    bytes (the built-in model, 6 x 48, a 6 x 3 mesh, seed 902) one honest replica's activations sent two messages at p ~
    3e-5 in steps 12-13, the stage's shift was recognised at step 17, and from step 20 an attacker's messages at p ~
    1e-7 to 1e-13 (every one flagged) were floored to p ~ 1e-2 by that rate, and banned 14 steps in by the peer test
    instead of 2. Here a peer sends far-out messages in steps 0 and 1, the shift is recognised at step 2, and s1r0
    sends two far-out messages a step from step 9: banned at step 10, as in a stage without the peer's past; without
    the shift the peer's tail floors them."""
    from sentinel.detectors.base import Marker

    def run(shift: bool) -> Responder:
        r, _ = _responder()
        far, calm = Verdict({}, False, pvalue=1e-9), Verdict({}, False, pvalue=0.5)
        tail = Verdict({}, False, pvalue=1e-5)  # the peer's: beyond TAIL_P, two of them short of a ban
        marked = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=1e-3)
        for s in range(12):
            peer = tail if s < 2 else marked if shift and s == 2 else calm
            recs = [(_msg(s, 0, 1, "s1r1"), peer), (_msg(s, 1, 1, "s1r2"), calm)]
            recs += [(_msg(s, 2 + m, 1, "s1r0"), far if s >= 9 else calm) for m in range(2)]
            r.end_step(s, recs)
        return r

    assert run(shift=True).banned == {"s1r0": 10}
    r = run(shift=False)
    assert "s1r0" not in r.banned and r.evidence.level["s1r0", 0] < r.evidence.threshold


def test_contaminated_messages_count_only_their_relation_evidence():
    """Downstream of an anomalous message of the same microbatch, only the relation p-value counts."""
    r, mesh = _responder()
    up = Verdict({}, False, pvalue=5e-3, relation_pvalue=None)  # anomalous, not flagged
    down = Verdict({}, False, pvalue=1e-12, relation_pvalue=0.5)  # pooled statistics dragged along
    for s in range(3):
        r.end_step(s, [(_msg(s, 0, 0, "s0r0"), up), (_msg(s, 0, 1, "s1r1"), down)])
    assert r.evidence.level.get(("s1r1", 0), 0.0) == 0.0
    assert "s1r1" not in [e.worker for e in mesh.drain() if e.kind == "ban"]


def test_sequential_test_can_be_turned_off():
    r, mesh = _responder(sequential_alpha=None)
    strong = Verdict({}, False, pvalue=1e-12)
    r.end_step(0, [(_msg(0, m, 1, "s1r0"), strong) for m in range(4)])
    assert r.evidence is None and not mesh.drain()


def _stage_run(own: dict[int, list[float]], steps: int) -> Responder:
    """A 4-replica stage over `steps` steps: s1r1 and s1r2 each send a far-out message twice in the first 25 steps
    (p ~ 1e-6 to 1e-8: an honest stream with a heavy tail), every other message calm; s1r0 sends `own[step]`."""
    far_peers = {3: ("s1r1", 1e-6), 9: ("s1r2", 1e-8), 17: ("s1r1", 1e-7), 22: ("s1r2", 1e-6)}
    calm = Verdict({}, False, pvalue=0.5)
    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
    for s in range(steps):
        recs = []
        for i, w in enumerate(["s1r1", "s1r2", "s1r3"]):
            p = far_peers[s][1] if s in far_peers and far_peers[s][0] == w else 0.5
            recs.append((_msg(s, i, 1, w), Verdict({}, False, pvalue=p) if p < 0.5 else calm))
        for m, p in enumerate(own.get(s, [0.5])):
            recs.append((_msg(s, 3 + m, 1, "s1r0"), Verdict({}, False, pvalue=p)))
        r.end_step(s, recs)
    return r


def test_a_burst_no_further_out_than_the_calibrated_tail_of_its_peers_does_not_ban():
    """Held-out text, 12 layers, 6 x 4 meshes, after the windows followed their streams' drift (`recent`): a replica's
    stream sent three to five messages at p ~ 1e-4 to 1e-42 within a few steps while its peers sent such messages
    every 10-30 steps. Beyond TAIL_P a p-value says far out, not how far: compared at TAIL_P, against the peers' rate
    over PEER_HORIZON steps, the burst counts little. Far-out messages without any from the peers still ban."""
    burst = {26: [1e-14], 27: [1e-42, 0.5], 28: [1e-9]}
    r = _stage_run(burst, 30)
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold / 2
    alone = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
    for s in range(30):
        recs = [(_msg(s, i, 1, w), Verdict({}, False, pvalue=0.5)) for i, w in enumerate(["s1r1", "s1r2", "s1r3"])]
        recs += [(_msg(s, 3 + m, 1, "s1r0"), Verdict({}, False, pvalue=p)) for m, p in enumerate(burst.get(s, [0.5]))]
        alone.end_step(s, recs)
    assert _bans(alone.mesh) == ["s1r0"]


def test_an_attacker_with_an_honest_past_is_judged_by_its_current_rate():
    """The worker's own share of far-out messages is taken over OWN_HORIZON steps: 25 honest steps do not dilute an
    attacker whose every message is now far out, where its honest peers send such messages now and then. The cost of
    the peers' rate: 6 steps here (two messages a step; one step where the peers' tail is light, as from step 0)."""
    attack = {s: [1e-20, 1e-20] for s in range(25, 40)}
    r = _stage_run(attack, 40)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] <= 25 + 6
    r = _stage_run({s: [1e-20, 1e-20] for s in range(0, 15)}, 15)
    assert r.banned["s1r0"] <= 1


def _wave(shift_next: bool, peer_p: float = 1e-5, peer_step: int = 1) -> Responder:
    """s1r0's activations reach the threshold at step 1 (three messages at p = 1e-3 a step, a quiet stage) while, in
    step `peer_step`, its peer s1r1 sends one message at `peer_p`; at step 2 the detector recognises a stage-wide shift
    in the stream (`shift_next`), or s1r0 goes on as before."""
    from sentinel.detectors.base import Marker

    r, _ = _responder()
    moderate, calm = Verdict({}, False, pvalue=1e-3), Verdict({}, False, pvalue=0.5)
    shift = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=1e-3)
    for s in range(3):
        mine = shift if s == 2 and shift_next else moderate
        recs = [(_msg(s, m, 1, "s1r0"), mine) for m in range(3)]
        recs += [(_msg(s, 3 + m, 1, "s1r1"), calm) for m in range(3)]  # quiet peers (the stage's level stays put)
        recs += [(_msg(s, 6, 1, "s1r1"), Verdict({}, False, pvalue=peer_p) if s == peer_step else calm)]
        recs += [(_msg(s, 7 + m, 1, "s1r2"), calm) for m in range(4)]
        r.end_step(s, recs)
    return r


def test_a_ban_waits_one_step_while_a_peer_rises_and_the_consensus_decides():
    """An honest drift reaches a stage's replicas one after another: on held-out text (Python source, 12 layers, a
    6 x 4 mesh, seed 21) one replica's gradients reached the threshold over steps 94-97 while a peer stood at 0.32 of
    it, and the detector recognised the stage-wide shift at step 98, a step after the ban. A worker that reaches the
    threshold while a peer stands above DEFER_SHARE of it (of 3 replicas, one peer leaves the stage one replica short
    of the consensus's quorum) waits one step: if the detector then recognises a shift in its stream, what it gathered
    was the drift (settled, as a blocked ban); if not, it is banned a step late."""
    r = _wave(shift_next=True)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2
    r = _wave(shift_next=False)
    assert r.banned == {"s1r0": 2}
    r = _wave(shift_next=False, peer_p=0.5)  # no peer rises: banned when it reaches the threshold
    assert r.banned == {"s1r0": 1}


def test_a_peer_that_sends_a_flagged_message_as_the_worker_reaches_the_threshold_rises_too():
    """A wave's first replica sets the peers' tail that floors the next replica's messages, so that peer's statistic
    need not move: a message the detector would flag (p < FLAGGED_P) in the step is enough for the ban to wait for the
    consensus (byte-level text, one layer a stage, seed 0: a peer at 6e-4 in the step of a false ban, a step before
    the stage-wide shift). An ordinary honest message (2.7e-3, which held a token-copying attacker for a step when
    p < 0.01 counted) does not delay the ban."""
    assert _wave(shift_next=True, peer_p=6e-4).banned == {}
    assert _wave(shift_next=False, peer_p=6e-4).banned == {"s1r0": 2}
    assert _wave(shift_next=False, peer_p=2.7e-3).banned == {"s1r0": 1}


def test_a_peer_that_sent_a_flagged_message_in_the_step_before_rises_too():
    """A replica of a 3-replica stage sends about one message a step, and often none in the step its peer reaches the
    threshold: on held-out Markdown (GPT-2, a 4 x 3 mesh, seed 851) s2r2 sent a message at p ~ 1e-6 in step 17, none in
    step 18, when s2r0 reached the threshold and was banned, a step before the detector recognised the stage's shift. A
    message the detector would flag in the step before counts as in the step; two steps before, it does not."""
    assert _wave(shift_next=True, peer_p=6e-4, peer_step=0).banned == {}
    assert _wave(shift_next=False, peer_p=6e-4, peer_step=0).banned == {"s1r0": 2}

    def two_steps_before() -> Responder:  # the same, a step later: s1r0 reaches the threshold at step 2
        from sentinel.detectors.base import Marker

        r, _ = _responder()
        moderate, calm = Verdict({}, False, pvalue=1e-3), Verdict({}, False, pvalue=0.5)
        for s in range(4):
            mine = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=1e-3) if s == 3 else moderate
            recs = [(_msg(s, m, 1, "s1r0"), mine if s > 0 else calm) for m in range(3)]
            recs += [(_msg(s, 3 + m, 1, "s1r1"), calm) for m in range(3)]
            recs += [(_msg(s, 6, 1, "s1r1"), Verdict({}, False, pvalue=6e-4) if s == 0 else calm)]
            recs += [(_msg(s, 7 + m, 1, "s1r2"), calm) for m in range(4)]
            r.end_step(s, recs)
        return r

    assert two_steps_before().banned == {"s1r0": 2}


def test_a_drifts_participants_stay_their_stages_traffic():
    """The senders whose evidence a recognised drift in one statistic explains (a verdict marked DRIFT) settle, but
    their messages stay in the stage's record: its common level and quiet tests see the drift. Left out, the stage
    looked quiet on the peers' earlier calm messages, and the replica beyond the drift gained half the threshold a
    message: on held-out Markdown (GPT-2, a 4 x 3 mesh, seed 852) an honest replica at p ~ 3e-8 to 2e-5 over steps
    19-21 while its peers' messages were explained, banned at step 21."""
    from sentinel.sequential import SequentialEvidence

    def lead_after(observed: bool) -> float:
        ev = SequentialEvidence(1e-8)
        live = {1: ["s1r0", "s1r1", "s1r2"]}
        calm = [(w, 1, 0, 0.5) for w in live[1] for _ in range(2)]
        for _ in range(2):
            ev.begin_step()
            ev.weigh_step(calm, live)
        peers = [(w, 1, 0, 2e-3) for w in ("s1r1", "s1r2") for _ in range(2)]  # the drift, accepted and marked
        explained = [("s1r1", 0), ("s1r2", 0)]
        for lead in ([("s1r0", 1, 0, 0.5)], [("s1r0", 1, 0, 1e-7)]):  # two drift steps, the lead far out in the 2nd
            ev.begin_step()
            ev.weigh_step(lead, live, explained=explained, observed=peers if observed else ())
        return ev.level["s1r0", 0] / ev.threshold

    assert lead_after(observed=False) == 0.5  # a quiet stage: the cap of one quiet message
    assert lead_after(observed=True) < 1 / 3  # a drifting stage: the strict cap, less the common level

    from sentinel.detectors.base import Marker

    r, _ = _responder()
    calm, lead = Verdict({}, False, pvalue=0.5), Verdict({}, True, pvalue=1e-7)  # flagged: beyond the drift
    drift = Verdict({}, False, frozenset({Marker.DRIFT}), pvalue=2e-3)
    for s in range(5):
        recs = [(_msg(s, 0, 1, "s1r0"), lead if s >= 2 else calm)]
        recs += [(_msg(s, 1 + m, 1, w), drift if s >= 2 else calm) for m, w in enumerate(["s1r1", "s1r2"] * 2)]
        r.end_step(s, recs)
    assert r.banned == {} and ("s1r1", 1, 0) in r._explained


def _long_wave(risers: dict[int, str], shift_at: int) -> Responder:
    """A 4-replica stage: s1r0 reaches the threshold at step 1 (three messages at p = 1e-3 a step); in each step of
    `risers` that peer sends a message the detector would flag (p = 6e-4); at step `shift_at` the detector recognises
    a stage-wide shift in the stream."""
    from sentinel.detectors.base import Marker

    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
    moderate, calm = Verdict({}, False, pvalue=1e-3), Verdict({}, False, pvalue=0.5)
    shift = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=1e-3)
    for s in range(shift_at + 1):
        recs = [(_msg(s, m, 1, "s1r0"), shift if s == shift_at else moderate) for m in range(3)]
        for i, w in enumerate(["s1r1", "s1r2", "s1r3"]):
            recs += [(_msg(s, 3 + 3 * i + m, 1, w), calm) for m in range(2)]
            if risers.get(s) == w:
                recs.append((_msg(s, 12, 1, w), Verdict({}, False, pvalue=6e-4)))
        r.end_step(s, recs)
    return r


def test_a_ban_waits_on_while_the_wave_reaches_another_replica():
    """Honest drift can take several steps to reach a stage's replicas: on held-out Perl bytes (GPT-2, 8 x 128, a 4 x 4
    mesh, seed 363) stage 2's activations sent flagged messages on s2r1 and s2r2 in step 13, on s2r1 in steps 14-15
    (which reached the threshold), on s2r0 in step 16 and on s2r2 and s2r3 in step 17, when the detector recognised
    the shift: s2r1 had been banned at step 16, after one step's wait. A ban that waited waits on while the wave
    reaches a peer that had not risen yet (each wait needs another one: at most as many waits as peers); a peer that
    rises again, or none, ends the wait."""
    r = _long_wave({1: "s1r1", 2: "s1r2"}, shift_at=3)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2
    assert _long_wave({1: "s1r1"}, shift_at=3).banned == {"s1r0": 2}  # nobody new rose at step 2
    assert _long_wave({1: "s1r1", 2: "s1r1"}, shift_at=3).banned == {"s1r0": 2}  # the same peer again
    waves = _long_wave({1: "s1r1", 2: "s1r2", 3: "s1r3"}, shift_at=5)  # every peer rose and no shift came
    assert waves.banned == {"s1r0": 4}


def test_colluders_cannot_hold_a_ban():
    """The wait for the consensus needs the worker and its rising peers one replica short of the consensus's quorum
    (`streams.shift_quorum`: f + floor((R - f) / 2) + 1 of R replicas, f = floor((R - 1) / 2)). Under an honest
    majority an attacker has at most f - 1 colluders, always fewer than that: in a 5-replica stage (quorum 4) a
    colluder standing between DEFER_SHARE of the threshold and the threshold holds nothing, and the attacker is banned
    when it reaches it (on a 16 x 11 mesh, 30% malicious, a rule without the quorum let co-attackers hold each other's
    bans: median steps to ban 2.08 -> 2.58 over six runs)."""

    def run(collude: bool) -> Responder:
        r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 5)))
        strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
        lift = Verdict({}, False, pvalue=1e-4 if collude else 0.5)  # +5.75 nats a message, less the drain
        for s in range(6):
            recs = [(_msg(s, m, 1, "s1r0"), strong) for m in range(2)]
            recs += [(_msg(s, 2 + m, 1, "s1r1"), lift if m == 0 else calm) for m in range(2)]
            recs += [(_msg(s, 4 + m, 1, w), calm) for m, w in enumerate(["s1r2", "s1r3", "s1r4"])]
            r.end_step(s, recs)
        return r

    assert run(collude=False).banned == {"s1r0": 1}
    assert run(collude=True).banned["s1r0"] == 1  # (the colluder's own evidence bans it at step 4)


@pytest.mark.parametrize("replicas, needed", [(3, 1), (4, 1), (5, 2), (11, 7)])
def test_a_ban_waits_only_while_the_stage_is_one_replica_short_of_a_shift(replicas, needed):
    """`rising`: how many peers must stand between DEFER_SHARE of the threshold and the threshold (one at the threshold
    is judged itself) for the worker's ban to wait a step: the quorum less the worker and one replica still to come."""
    from sentinel.detectors.streams import shift_quorum

    ev = SequentialEvidence(1e-8)
    peers = [f"p{i}" for i in range(replicas - 1)]
    quorum = shift_quorum(replicas)
    for w in peers:
        ev.level[w, 0] = 0.3 * ev.threshold
    ev.level[peers[0], 0] = ev.threshold  # at the threshold: not counted
    ups = peers[1 : 1 + needed]
    rest = [w for w in peers[1:] if w not in ups]
    for w in rest:
        ev.level[w, 0] = 0.1 * ev.threshold
    assert ev.rising(peers, 0, quorum)
    ev.level[ups[-1], 0] = 0.1 * ev.threshold
    assert not ev.rising(peers, 0, quorum)


def _after_a_ban(**cfg) -> Responder:
    """A 3-replica stage: s1r0 sends strong p-values in steps 0-1 (banned at step 1), then s1r1 from step 2 on while
    s1r2 stays calm."""
    r, mesh = _responder(**cfg)
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(8):
        bad = "s1r0" if s < 2 else "s1r1"
        recs = [(_msg(s, m, 1, bad), strong) for m in range(2)] + [(_msg(s, 2, 1, "s1r2"), calm)]
        r.end_step(s, recs)
    return r


def test_a_stage_that_banned_its_honest_majoritys_share_needs_more_evidence_for_the_next_ban():
    """Under an honest majority a stage of R replicas holds at most max(1, floor((R - 1) / 2)) malicious ones, plus any
    worker added to it since. Once that many of it are banned, banning another means an earlier ban was false, so its
    statistic needs twice the threshold. On held-out reStructuredText (BPE, 10 x 80, a 5 x 3 mesh, seed 571) the honest
    s1r0 was banned at step 35, after its stage's attacker: its gradients at p ~ 5e-3 to 5e-10 over steps 31-35 while
    the one replica left beside it had risen only to p ~ 1e-3, too few replicas for the drift rules."""
    r = _after_a_ban()
    assert r.banned == {"s1r0": 1, "s1r1": 5}  # two steps to the threshold, two more to twice it
    assert r.evidence.level["s1r2", 0] == 0.0
    sybil = _after_a_ban(rejoin_after=1)  # s1r0's operator rejoined under a new id: the stage may hold one more
    assert sybil.banned == {"s1r0": 1, "s1r1": 3}
