"""Response policies: drop / substitute / accept, strikes within a window, bans, replacements, rejoins."""

from __future__ import annotations

import pytest
import torch

from sentinel.detectors.base import Verdict
from sentinel.engine.workers import WorkerTable
from sentinel.eventlog import EventLog
from sentinel.response import Responder
from sentinel.scenario import ResponseConfig
from sentinel.transport.message import Message, Role

FLAG, OK = Verdict({}, True), Verdict({}, False)


class FakeEngine:
    def __init__(self, stages=3, replicas=3):
        self.workers = WorkerTable(stages, replicas)
        self.log = EventLog()
        self.added: list[tuple[int, str | None]] = []

    def add_replica(self, stage_idx, rejoin_of=None):
        idx = self.workers.add_replacement(stage_idx)
        self.added.append((stage_idx, rejoin_of))
        return self.workers.ids[idx]


class FakeVerifier:
    def substitute(self, msg):
        return torch.full_like(msg.payload, 7.0) if msg.role == Role.GRADIENT else None


def msg(step, sender="s1r0", role=Role.GRADIENT):
    return Message(step, 0, 0, role, sender, "s0r0", torch.ones(2, 2))


def responder(mode="closed_loop", **cfg):
    eng = FakeEngine(stages=4)
    return Responder(ResponseConfig(**cfg), eng, FakeVerifier(), mode=mode), eng


def test_drop_substitute_accept():
    r, _ = responder(on_flag="drop", ban_after=99)
    assert r.deliver(msg(0), FLAG) is None
    assert torch.equal(r.deliver(msg(0), OK), torch.ones(2, 2))
    r, _ = responder(on_flag="substitute", ban_after=99)
    assert float(r.deliver(msg(0), FLAG)[0, 0]) == 7.0  # a flagged gradient gets the baseline
    assert r.deliver(msg(0, role=Role.ACTIVATION), FLAG) is None  # an activation falls back to drop
    r, _ = responder(on_flag="accept", ban_after=99)
    assert torch.equal(r.deliver(msg(0), FLAG), torch.ones(2, 2))


def test_ban_after_n_strikes_and_logging():
    r, eng = responder(ban_after=3)
    for step in range(3):
        r.deliver(msg(step), FLAG)
    assert not eng.workers.live[eng.workers.index("s1r0")]
    assert list(eng.log.bans["step"]) == [2] and eng.log.workers[eng.log.bans["worker"][0]] == "s1r0"
    assert r.deliver(msg(3), OK) is None  # a banned worker's later messages are dropped


def test_strike_window_forgets_old_strikes():
    r, eng = responder(ban_after=2, strike_window=5, ban_pvalue=1.0)
    r.deliver(msg(0), FLAG)
    r.deliver(msg(5), FLAG)  # the strike of step 0 is 5 steps old: out of the window
    assert eng.workers.live[eng.workers.index("s1r0")]
    r.deliver(msg(6), FLAG)
    assert not eng.workers.live[eng.workers.index("s1r0")]


def test_replacement_and_rejoin():
    r, eng = responder(ban_after=1, replace_banned=True, rejoin_after=4, ban_pvalue=1.0)
    r.deliver(msg(10), FLAG)
    assert eng.added == [(1, None)]
    assert eng.log.workers[eng.log.bans["replaced_by"][0]] == "s1r3"
    r.deliver(msg(13, sender="s1r1"), OK)
    assert len(eng.added) == 1
    r.deliver(msg(14, sender="s1r1"), OK)  # 4 steps after the ban its operator rejoins under a new id
    assert eng.added[-1] == (1, "s1r0")


def test_last_replica_of_a_stage_is_never_banned_without_replacement():
    r, eng = responder(ban_after=1, ban_pvalue=1.0)
    r.deliver(msg(0, "s1r0"), FLAG)
    r.deliver(msg(0, "s1r1"), FLAG)
    r.deliver(msg(0, "s1r2"), FLAG)
    assert eng.workers.live_in_stage(1) == [eng.workers.index("s1r2")]
    assert len(eng.log.bans) == 2


def route(r, step, mb, senders, flag_last=False):
    """Deliver a microbatch's messages along a route; optionally flag the last one."""
    for i, w in enumerate(senders):
        last = i == len(senders) - 1
        r.deliver(Message(step, mb, i, Role.ACTIVATION, w, "x", torch.ones(2, 2)), FLAG if (flag_last and last) else OK)


def test_route_attribution_bans_the_upstream_attacker_not_the_contaminated_downstream():
    """s2r1 corrupts invisibly; every microbatch through it is flagged one hop later, at whichever s3 replica."""
    r, eng = responder()
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        for mb in range(4):
            s2 = f"s2r{int(torch.randint(3, (1,), generator=gen))}"
            s3 = f"s3r{int(torch.randint(3, (1,), generator=gen))}"
            route(r, step, mb, [f"s0r{mb % 3}", f"s1r{mb % 3}", s2, s3], flag_last=s2 == "s2r1")
    banned = [eng.log.workers[w] for w in eng.log.bans["worker"]]
    assert banned == ["s2r1"]


def test_isolated_honest_flags_do_not_ban():
    r, eng = responder()
    for step in range(30):
        for mb in range(3):
            route(r, step, mb, [f"s0r{mb}", f"s1r{mb}"], flag_last=(step % 9 == 0 and mb == 1))
    assert len(eng.log.bans) == 0


def test_sender_attribution_blames_only_the_sender():
    r, eng = responder(attribution="sender", ban_pvalue=1.0, ban_after=2)
    for step in range(2):
        route(r, step, 0, ["s0r0", "s1r0", "s2r0"], flag_last=True)
    assert [eng.log.workers[w] for w in eng.log.bans["worker"]] == ["s2r0"]


def test_open_loop_never_acts():
    r, eng = responder(mode="open_loop", ban_after=1)
    for step in range(5):
        assert torch.equal(r.deliver(msg(step), FLAG), torch.ones(2, 2))
    assert all(eng.workers.live) and len(eng.log.bans) == 0


@pytest.mark.parametrize("key,value", [("strike_window", 0), ("rejoin_after", -1), ("ban_after", 0)])
def test_bad_response_config_is_a_located_error(tiny_scenario, key, value):
    from sentinel.errors import ConfigError

    with pytest.raises(ConfigError, match=f"response.{key}"):
        tiny_scenario(f"response.{key}={value}")


def test_engine_replacement_copies_weights_and_optimizer_state(tiny_scenario):
    from sentinel.engine.sim import SimEngine

    eng = SimEngine(tiny_scenario("pipeline.replicas=2", "training.steps=2"))
    eng.train_step()
    wid = eng.add_replica(1)
    assert wid == "s1r2" and eng.workers.live_in_stage(1)[-1] == len(eng.replicas) - 1
    src, new = eng.replicas[eng.workers.index("s1r0")], eng.replicas[-1]
    for a, b in zip(src.params, new.params):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    s_state, n_state = src.optimizer.state_dict()["state"], new.optimizer.state_dict()["state"]
    assert s_state.keys() == n_state.keys() and torch.equal(s_state[0]["exp_avg"], n_state[0]["exp_avg"])
    eng.train_step()  # the newcomer is routed and stays in sync under synchronous DP
    for a, b in zip(eng.replicas[eng.workers.index("s1r0")].params, eng.replicas[-1].params):
        torch.testing.assert_close(a, b)


def test_pairwise_pvalues_are_mann_whitney_tests():
    """All statistics at once: each p-value is scipy's one-sided asymptotic Mann-Whitney U test (no ties here)."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    from sentinel.response import pairwise_pvalues

    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(3), [20, 15, 25])
    values = rng.normal(size=(60, 4)) + 1.5 * (owner == 2)[:, None]
    p = pairwise_pvalues(values, owner, 3)
    assert p.shape == (4, 3, 3)
    for s in range(4):
        for i in range(3):
            for j in range(3):
                if i != j:
                    ref = mannwhitneyu(values[owner == i, s], values[owner == j, s], alternative="greater",
                                       method="asymptotic").pvalue
                    assert p[s, i, j] == pytest.approx(ref, rel=1e-9)
    assert (p[:, 2, 0] < 0.05).all()  # the shifted group stands out


def test_pairwise_pvalues_split_ties_as_scipy_does():
    """Heavily tied statistics (a sign-flip ratio that is 0 most of the time): midranks and the tie-corrected
    variance, exactly scipy's; ties broken by the order the groups are listed in framed an honest sender."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    from sentinel.response import pairwise_pvalues

    rng = np.random.default_rng(1)
    owner = np.repeat(np.arange(3), [30, 25, 40])
    values = np.stack([rng.choice([0.0, 0.0, 0.0, 1 / 64, 2 / 64], size=95), rng.integers(0, 3, size=95) * 1.0,
                       np.zeros(95), rng.normal(size=95)], axis=1)
    values[5, 3] = np.nan  # counts as the largest
    p = pairwise_pvalues(values, owner, 3)
    for s in range(4):
        for i in range(3):
            for j in range(3):
                if i != j:
                    a, b = np.nan_to_num(values[owner == i, s], nan=np.inf), np.nan_to_num(values[owner == j, s], nan=np.inf)
                    ref = mannwhitneyu(a, b, alternative="greater", method="asymptotic").pvalue
                    ref = 1.0 if np.isnan(ref) else ref  # all values equal: no evidence
                    assert p[s, i, j] == pytest.approx(ref, rel=1e-9, abs=1e-12), (s, i, j)
    same = pairwise_pvalues(np.zeros((60, 1)), np.repeat(np.arange(3), 20), 3)
    off = ~np.eye(3, dtype=bool)
    assert (same[0][off] == 1.0).all()  # identical values: no group exceeds another


def test_peer_pvalue_is_the_hypergeometric_tail():
    from scipy.stats import binom, hypergeom

    from sentinel.response import peer_pvalue

    assert peer_pvalue(3, 10, 1, 20, 0.01) == float(hypergeom.sf(2, 30, 4, 10))
    assert peer_pvalue(3, 10, 1, 20, 0.01) == peer_pvalue(3, 10, 1, 20, 0.01)  # cached: the same value
    assert peer_pvalue(2, 10, 0, 0, 0.05) == float(binom.sf(1, 10, 0.05))  # no peers: against the base rate
