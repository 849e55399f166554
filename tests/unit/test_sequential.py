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
    """Two steps reach the threshold (no single step does); the ban waits one more for the wave a first replica may
    lead (module docstring of `sentinel.sequential`, "defer"), and with no peer rising it is banned then, even in a
    step where it sends nothing."""
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-12, relation_pvalue=1e-12)
    r.end_step(0, [(_msg(0, 0, 1, "s1r0"), strong), (_msg(0, 1, 1, "s1r0"), strong)])
    assert _bans(mesh) == []
    r.end_step(1, [(_msg(1, 0, 1, "s1r0"), strong), (_msg(1, 1, 1, "s1r0"), strong)])
    assert _bans(mesh) == [] and r.evidence.reached("s1r0")
    r.end_step(2, [])
    assert _bans(mesh) == ["s1r0"] and r.banned == {"s1r0": 2}


def test_a_gradient_attackers_honest_activations_do_not_dilute_its_gradient_evidence():
    """Per direction: a worker whose gradients are anomalous reaches the threshold in two steps (banned a step later)
    however many honest activations (p = 1, -1.6 nats each) it sends in between."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=1.0)
    for s in range(3):
        recs = [(_msg(s, m, 0, "s1r0", Role.GRADIENT), strong) for m in range(2)]
        recs += [(_msg(s, m, 1, "s1r0"), calm) for m in range(8)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"] and r.banned == {"s1r0": 2}


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
    level <= 0) each counts up to h / 2, so two reach the threshold (banned a step later, `banned_after` messages);
    where the stage drifts (the realistic Llama's honest episodes of extreme microbatches) or too few replicas sent to
    tell, each counts up to h / 3, so two never ban (three reach h up to rounding; less the level, five do not)."""
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-30)
    for s in range(5):
        recs = [(_msg(s, 0, 1, "s1r0"), strong)]
        if peers_p is not None:
            recs += [(_msg(s, 1 + i, 1, w), Verdict({}, False, pvalue=peers_p)) for i, w in enumerate(["s1r1", "s1r2"])]
        r.end_step(s, recs)
    assert r.banned.get("s1r0") == banned_after
    assert _bans(mesh) == ([] if banned_after is None else ["s1r0"])


def test_a_stage_is_not_drifting_on_one_ordinary_pvalue():
    """The first judged step holds one message per replica: an honest p = 0.33 (0.12 nats above a uniform p's mean,
    an eighth of one message's standard deviation) made the paper table's stage 1 "drift" (seed 4, random signs on
    gradients), the strict cap held the attacker for a step, and its disturbance then raised its peers' statistics
    over the guard: banned 13 steps in instead of 1. The majority has to stand out beyond one standard error of its
    own messages: the stage is quiet, and two extreme messages reach the threshold at once (banned a step later)."""
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-16)
    r.end_step(0, [(_msg(0, 0, 1, "s1r1"), Verdict({}, False, pvalue=1.0)),
                   (_msg(0, 1, 1, "s1r0"), Verdict({}, False, pvalue=0.33)),
                   (_msg(0, 2, 1, "s1r2"), strong)])  # fmt: skip
    r.end_step(1, [(_msg(1, 0, 1, "s1r2"), strong), (_msg(1, 1, 1, "s1r2"), strong)])
    r.end_step(2, [])
    assert _bans(mesh) == ["s1r2"] and r.banned["s1r2"] == 2


def test_one_peers_moderate_pvalues_do_not_make_a_small_stage_drift():
    """Quiet is judged on the median of the stage's recent messages. A sparse attacker (one extreme message and one
    honest one a step) whose peer sends p = 1e-3 every other step (its mean over five steps +2.3 nats above a uniform
    p's, which made the stage "drift" by the mean and left the attacker unbanned) reaches the threshold in four steps
    (over the first step's four messages both the mean and the median are high: the strict cap), banned in five."""
    r, mesh = _responder()
    strong, calm, moderate = (Verdict({}, False, pvalue=p) for p in (1e-30, 1.0, 1e-3))
    for s in range(6):
        recs = [(_msg(s, 0, 1, "s1r0"), strong), (_msg(s, 1, 1, "s1r0"), calm)]
        recs += [(_msg(s, 2, 1, "s1r1"), moderate if s % 2 == 0 else calm), (_msg(s, 3, 1, "s1r2"), calm)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"] and r.banned["s1r0"] == 4


def test_a_worker_does_not_make_its_own_stage_look_drifting():
    """Quiet by the median is judged on the worker's peers' messages, not its own: a dense attacker (two extreme
    messages a step) beside one peer whose messages sit at p = 0.03 (its mean keeps the stage from looking quiet by the
    mean) and one at p = 1 (three a step) raised the pooled median over a uniform p's, and the attacker's messages
    counted under the strict cap less the common level (~4 nats each: at the threshold in three steps). Its peers'
    median is a uniform p's: the quiet cap, at the threshold in two and banned a step later (set 7: 5 x 3 mesh, random
    routing, about one message per replica per step; issue-18 note, stop 54)."""
    r, mesh = _responder()
    strong, mild, calm = (Verdict({}, False, pvalue=p) for p in (1e-30, 0.03, 1.0))
    for s in range(3):
        recs = [(_msg(s, 0, 1, "s1r0"), strong), (_msg(s, 1, 1, "s1r0"), strong), (_msg(s, 2, 1, "s1r1"), mild)]
        recs += [(_msg(s, 3 + m, 1, "s1r2"), calm) for m in range(3)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s1r0"] and r.banned["s1r0"] == 2


def test_a_stage_whose_replicas_mostly_sent_a_far_out_message_drifts():
    """Honest tails can drift without moving a stage's mean or median: on held-out text (Python source, 12 layers,
    a 6 x 4 mesh, step ~100) every replica of a stage sent a message at p ~ 5e-5 to 4e-9 within six steps, and
    one of them two in consecutive steps, which banned it while the stage counted as quiet (h / 2 a message). When a
    strict majority of the stage's replicas sent a message at p <= TAIL_P over the horizon, the stage drifts (h / 3 a
    message less its level): the two messages do not ban. An attacker whose peers send nothing that far out still
    reaches the threshold in two steps (banned a step later)."""
    strong, calm, far = (Verdict({}, False, pvalue=p) for p in (1e-9, 1.0, 1e-5))
    replicas = ["s1r0", "s1r1", "s1r2", "s1r3"]

    def run(plan: dict, steps: int) -> Responder:
        r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 4)))
        for s in range(steps):
            r.end_step(s, [(_msg(s, i, 1, w), plan.get((s, w), calm)) for i, w in enumerate(replicas)])
        return r

    twice = {(2, "s1r0"): strong, (3, "s1r0"): strong}
    r = run({(0, "s1r1"): far, (1, "s1r2"): far, **twice}, 4)  # s1r3 stays calm: three of four sent far out
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold
    r = run(twice, 5)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 4


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
    each of two peers, two of its own in consecutive steps do not ban. Without the peers', they reach the threshold
    (the quiet cap, h / 2 each) and ban a step later."""
    r = _peers_far_run(("s1r1", "s1r2"))
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold / 4
    r = _peers_far_run((), steps=5)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 4


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
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 8  # at the threshold at step 7, banned a step later
    r = run(((0, 0), (1, 0)))
    assert _bans(r.mesh) == [] and r.evidence.level["s1r0", 0] < r.evidence.threshold / 2


def test_one_bursty_peer_of_three_is_not_the_stages_rate():
    """The rate that discounts a message is what at least half of the worker's peers show (the m-th largest share, m =
    ceil(peers / 2)): one peer of three with a burst of far-out messages does not shield the others. With m = 1 on
    held-out HTML bytes (5 x 80 on a 5 x 4 mesh, seed 141) one honest replica's burst around step 20 floored an
    attacker's gradient messages at p ~ 1e-24 to ~1e-2 for 17 steps, under five different gradient attacks. Here the
    bursty peer's own statistic still stands at a quarter of the threshold or above when s1r0 reaches it at step 3; the
    ban waits a step for the consensus, which sees no stage-wide shift, and one risen peer of three is short of its
    quorum."""
    r = _peers_far_run(("s1r1",), steps=5)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] == 4


def test_colluding_attackers_cannot_vouch_for_each_other():
    """Two attackers in a 5-replica stage (a strict honest majority): each one's rate of far-out messages is what the
    other's peers measure, so the rate that discounts a message is the m-th largest of its peers' (m = ceil(peers / 2)
    = 2 here), at most an honest peer's: both reach the threshold in two steps and are banned a step later."""
    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, 5)))
    strong, calm = Verdict({}, False, pvalue=1e-30), Verdict({}, False, pvalue=0.5)
    for s in range(3):
        recs = [(_msg(s, 2 * i + m, 1, w), strong) for i, w in enumerate(["s1r0", "s1r1"]) for m in range(2)]
        recs += [(_msg(s, 4 + i, 1, w), calm) for i, w in enumerate(["s1r2", "s1r3", "s1r4"])]
        r.end_step(s, recs)
    assert sorted(_bans(r.mesh)) == ["s1r0", "s1r1"] and set(r.banned.values()) == {2}


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
    does not discount it, so it reaches the threshold in two steps whatever its peers' quiet messages."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(3):
        recs = [(_msg(s, 0, 1, "s1r1"), calm), (_msg(s, 1, 1, "s1r2"), calm)]
        r.end_step(s, recs + [(_msg(s, 2 + m, 1, "s1r0"), strong) for m in range(2)])
    assert _bans(mesh) == ["s1r0"] and r.banned == {"s1r0": 2}


def test_a_worker_standing_out_alone_is_banned_after_its_peers_rejoin_the_crowd():
    """The common level is per stage: an attacker in another stage keeps its evidence."""
    r, mesh = _responder()
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(3):
        recs = [(_msg(s, i, 1, w), strong) for i, w in enumerate(["s1r0", "s1r1", "s1r2"])]
        recs += [(_msg(s, 3 + m, 2, "s2r0"), strong) for m in range(2)]
        recs += [(_msg(s, 5, 2, "s2r1"), calm), (_msg(s, 6, 2, "s2r2"), calm)]
        r.end_step(s, recs)
    assert _bans(mesh) == ["s2r0"] and r.banned == {"s2r0": 2}


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
        for s, p in enumerate([1e-6, 1e-3, None, 1e-6, None]):
            recs = [(_msg(s, 0, 1, "s1r0"), Verdict({}, False, pvalue=p))] if p is not None else []
            peer = marked if shift and s == 2 else calm
            recs += [(_msg(s, 1, 1, "s1r1"), peer), (_msg(s, 2, 1, "s1r2"), calm)]
            r.end_step(s, recs)
            if s == 2:
                level = r.evidence.level["s1r0", 0]
                assert level <= r.evidence.threshold / 2 if shift else level > r.evidence.threshold / 2
        return r

    assert run(shift=False).banned == {"s1r0": 4}  # a quiet stage: one more far-out message bans (a step later)
    r = run(shift=True)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold * (1 / 2 + 1 / 3)


def test_a_recognised_shift_ends_its_stages_peers_tail():
    """The far-out messages a stage sent before the detector recognised its shift were the drift's onset: the windows
    have learned the new regime since, so they are not the rate the stage's traffic shows now. On held-out C-header
    bytes (the built-in model, 6 x 48, a 6 x 3 mesh, seed 902) one honest replica's activations sent two messages at p ~
    3e-5 in steps 12-13, the stage's shift was recognised at step 17, and from step 20 an attacker's messages at p ~
    1e-7 to 1e-13 (every one flagged) were floored to p ~ 1e-2 by that rate, and banned 14 steps in by the peer test
    instead of 2. Here a peer sends far-out messages in steps 0 and 1, the shift is recognised at step 2, and s1r0
    sends two far-out messages a step from step 9: at the threshold at step 10 (banned at 11), as in a stage without the
    peer's past; without the shift the peer's tail floors them."""
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

    assert run(shift=True).banned == {"s1r0": 11}
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
    the peers' rate: 5 steps here (two messages a step; one step to the threshold where the peers' tail is light, as
    from step 0; each ban a step after the threshold)."""
    attack = {s: [1e-20, 1e-20] for s in range(25, 40)}
    r = _stage_run(attack, 40)
    assert _bans(r.mesh) == ["s1r0"] and r.banned["s1r0"] <= 25 + 7
    r = _stage_run({s: [1e-20, 1e-20] for s in range(0, 15)}, 15)
    assert r.banned["s1r0"] <= 2


def _wave(
    risers: dict[int, list[tuple[str, float]]], shift_at: int | None = None, replicas: int = 4, start: int = 0
) -> Responder:
    """s1r0's activations reach the threshold at step `start` + 1 (three messages at p = 1e-3 in each of steps `start`
    and `start` + 1, a quiet stage), then it sends nothing; in each step of `risers` those peers send one more message
    at the p given; at step `shift_at` the detector recognises a stage-wide shift in the stream (a peer's message
    marked SHIFT). Runs to the shift's step, or four steps past the threshold."""
    from sentinel.detectors.base import Marker

    r = Responder(ResponseConfig(), MeshControl(WorkerTable(4, replicas)))
    moderate, calm = Verdict({}, False, pvalue=1e-3), Verdict({}, False, pvalue=0.5)
    shift = Verdict({}, False, frozenset({Marker.SHIFT}), pvalue=0.5)
    peers = [f"s1r{i}" for i in range(1, replicas)]
    for s in range((start + 5) if shift_at is None else shift_at + 1):
        recs = [(_msg(s, m, 1, "s1r0"), moderate) for m in range(3)] if start <= s <= start + 1 else []
        recs += [(_msg(s, 3 + 2 * i + m, 1, w), calm) for i, w in enumerate(peers) for m in range(2)]  # the level stays
        recs += [(_msg(s, 29, 1, peers[-1]), shift)] if s == shift_at else []
        recs += [(_msg(s, 30 + i, 1, w), Verdict({}, False, pvalue=p)) for i, (w, p) in enumerate(risers.get(s, []))]
        r.end_step(s, recs)
    return r


def test_every_ban_waits_a_step_for_the_consensus():
    """Honest drift reaches a stage's replicas one after another, and its first replica can reach the threshold before
    any peer has moved: on held-out man pages (the built-in model, 12 x 64, a 6 x 4 mesh, seed 943) s1r2's gradients
    at p ~ 4e-3, 8e-8 and 6e-6 in steps 57-59 of a quiet stage banned it at step 60, and its three peers followed over
    steps 61-64 (issue-18 note, stop 56); on held-out Python source (12 layers, a 6 x 4 mesh, seed 21) a replica was
    banned at step 97, a step before the detector recognised the stage's shift. So a worker that reaches the threshold
    waits one step: if the detector then recognises a shift in its stream, what it gathered was the drift's onset
    (settled, as a blocked ban); if not, and no peer rose, it is banned a step late."""
    for risers in ({}, {1: [("s1r1", 1e-5)]}):  # no peer had risen, or one had
        r = _wave(risers, shift_at=2, replicas=3)
        assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2
        assert _wave(risers, replicas=3).banned == {"s1r0": 2}


def test_a_ban_that_waited_stands_though_the_statistic_fell_back():
    """The wait is for the stage's consensus, not for more evidence from the worker: a sparse attacker (a third of its
    microbatches tampered) whose honest messages in the step it waits drain its statistic back under the threshold is
    banned all the same. Judged on its statistic again, held-out byte-level text's sparse gradient attackers (seeds
    0-2) took 12.5-12.7 steps instead of 7.8-8.0, one of them 25 instead of 13 (issue-18 note, stop 57). Its peers
    can still clear it: standing out too, they block the ban."""

    def run(peers_p: float) -> Responder:
        r, _ = _responder()
        strong, calm, peer = (Verdict({}, False, pvalue=p) for p in (1e-12, 1.0, peers_p))
        for s in range(3):
            mine = [strong, strong] + [calm] * 3 * (s == 1) if s < 2 else [calm]  # at the threshold in step 1, then
            recs = [(_msg(s, m, 1, "s1r0"), v) for m, v in enumerate(mine)]  # drained under it within the step
            recs += [(_msg(s, 5 + i, 1, w), peer if s == 2 else calm) for i, w in enumerate(["s1r1", "s1r2"])]
            r.end_step(s, recs)
            if s == 1:
                assert r.evidence.level["s1r0", 0] < r.evidence.threshold and r.banned == {}
        return r

    assert run(peers_p=0.5).banned == {"s1r0": 2}
    r = run(peers_p=1e-30)  # both peers far out in the step it waits (half the threshold each: they stand out too)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2


def test_a_wave_that_reaches_the_consensus_quorum_settles_the_ban():
    """The peers that rose while the worker waited count with those that had risen when it reached the threshold: once
    the worker and they make the consensus's quorum (`streams.shift_quorum`, 3 of 4 replicas) the wave is the stage's,
    settled without waiting for the detector to recognise it. A peer rises by a message the detector would flag at its
    default level (p < FLAGGED_P): the wave's first replica sets the peers' tail that floors the next one's messages,
    so its statistic need not move (byte-level text, one layer a stage, seed 0: a peer at 6e-4 in the step of a false
    ban, a step before the stage-wide shift). An ordinary honest message (2.7e-3, which held a token-copying attacker
    for a step when p < 0.01 counted) is no rise."""
    for risers in ({2: [("s1r1", 6e-4), ("s1r2", 6e-4)]}, {1: [("s1r1", 6e-4)], 2: [("s1r2", 6e-4)]}):
        r = _wave(risers)
        assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2
    assert _wave({2: [("s1r1", 2.7e-3), ("s1r2", 2.7e-3)]}).banned == {"s1r0": 2}
    assert _wave({2: [("s1r1", 6e-4)]}).banned == {"s1r0": 3}  # one of two: it waits on (below), then no one new


def test_a_peer_that_sent_a_flagged_message_in_the_step_before_rises_too():
    """A replica of a 3-replica stage sends about one message a step, and often none in the step its peer reaches the
    threshold: on held-out Markdown (GPT-2, a 4 x 3 mesh, seed 851) s2r2 sent a message at p ~ 1e-6 in step 17, none in
    step 18, when s2r0 reached the threshold and was banned, a step before the detector recognised the stage's shift. A
    message the detector would flag in the step before counts as in the step; two steps before, it does not. Here s1r0
    reaches the threshold at step 2, s1r1 sent a flagged message at step 1 (or 0) and s1r2 sends one at step 3."""
    assert _wave({1: [("s1r1", 6e-4)], 3: [("s1r2", 6e-4)]}, start=1).banned == {}  # the quorum, with s1r1
    assert _wave({0: [("s1r1", 6e-4)], 3: [("s1r2", 6e-4)]}, start=1).banned == {"s1r0": 4}  # s1r2 alone: waits on


def test_a_ban_waits_on_while_the_wave_reaches_another_replica():
    """Honest drift can take several steps to reach a stage's replicas: on held-out Perl bytes (GPT-2, 8 x 128, a 4 x 4
    mesh, seed 363) stage 2's activations sent flagged messages on s2r1 and s2r2 in step 13, on s2r1 in steps 14-15
    (which reached the threshold), on s2r0 in step 16 and on s2r2 and s2r3 in step 17, when the detector recognised
    the shift: s2r1 had been banned at step 16, after one step's wait. A ban that waited waits on while the wave
    reaches a peer that had not risen yet (each wait needs another one: at most as many waits as peers), until the
    detector recognises the shift or the wave reaches the quorum (4 of 5 replicas here); a peer that rises again, or
    none, ends the wait."""
    r = _wave({1: [("s1r1", 6e-4)], 2: [("s1r2", 6e-4)]}, shift_at=3, replicas=5)
    assert r.banned == {} and r.evidence.level["s1r0", 0] <= r.evidence.threshold / 2
    assert _wave({1: [("s1r1", 6e-4)]}, shift_at=3, replicas=5).banned == {"s1r0": 2}  # nobody new rose at step 2
    assert _wave({1: [("s1r1", 6e-4)], 2: [("s1r1", 6e-4)]}, shift_at=3, replicas=5).banned == {"s1r0": 2}  # the same
    assert _wave({1: [("s1r1", 6e-4)], 2: [("s1r2", 6e-4)]}, replicas=5).banned == {"s1r0": 3}  # no shift, no quorum
    waves = _wave({1: [("s1r1", 6e-4)], 2: [("s1r2", 6e-4)], 3: [("s1r3", 6e-4)]}, replicas=5)
    assert waves.banned == {}  # the wave reached the quorum at step 3


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


def test_colluders_cannot_hold_a_ban():
    """A ban that waited is settled without a recognised shift only when the worker and the peers that rose make the
    consensus's quorum (`streams.shift_quorum`: f + floor((R - f) / 2) + 1 of R replicas, f = floor((R - 1) / 2)).
    Under an honest majority an attacker has at most f - 1 colluders, always fewer than that: in a 5-replica stage
    (quorum 4) a colluder standing between DEFER_SHARE of the threshold and the threshold holds nothing beyond the
    step every ban waits (on a 16 x 11 mesh, 30% malicious, a rule without the quorum let co-attackers hold each other's
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

    assert run(collude=False).banned == {"s1r0": 2}
    assert run(collude=True).banned["s1r0"] == 2  # (the colluder's own evidence bans it later)


def _after_a_ban(**cfg) -> Responder:
    """A 3-replica stage: s1r0 sends strong p-values in steps 0-1 (at the threshold at step 1, banned at step 2), then
    s1r1 from step 3 on while s1r2 stays calm."""
    r, mesh = _responder(**cfg)
    strong, calm = Verdict({}, False, pvalue=1e-12), Verdict({}, False, pvalue=0.5)
    for s in range(9):
        bad = "s1r0" if s < 2 else "s1r1" if s >= 3 else None
        recs = [(_msg(s, m, 1, bad), strong) for m in range(2)] if bad else []
        recs += [(_msg(s, 2, 1, "s1r2"), calm)]
        r.end_step(s, recs)
    return r


def test_a_stage_that_banned_its_honest_majoritys_share_needs_more_evidence_for_the_next_ban():
    """Under an honest majority a stage of R replicas holds at most max(1, floor((R - 1) / 2)) malicious ones, plus any
    worker added to it since. Once that many of it are banned, banning another means an earlier ban was false, so its
    statistic needs twice the threshold. On held-out reStructuredText (BPE, 10 x 80, a 5 x 3 mesh, seed 571) the honest
    s1r0 was banned at step 35, after its stage's attacker: its gradients at p ~ 5e-3 to 5e-10 over steps 31-35 while
    the one replica left beside it had risen only to p ~ 1e-3, too few replicas for the drift rules."""
    r = _after_a_ban()
    assert r.banned == {"s1r0": 2, "s1r1": 7}  # two steps to the threshold, two more to twice it, one step's wait
    assert r.evidence.level["s1r2", 0] == 0.0
    sybil = _after_a_ban(rejoin_after=1)  # s1r0's operator rejoined under a new id: the stage may hold one more
    assert sybil.banned == {"s1r0": 2, "s1r1": 5}
