"""Response policies: drop / substitute / accept, strikes within a window, bans, replacements, rejoins."""

from __future__ import annotations

import pytest
import torch

from sentinel.detectors.base import Marker, Verdict
from sentinel.engine.workers import MeshControl, MeshEvent, WorkerTable
from sentinel.response import Responder
from sentinel.scenario import ResponseConfig
from sentinel.transport.message import Message, Role

FLAG, OK = Verdict({}, True), Verdict({}, False)


class Mesh:
    """A worker table behind the response policy's MeshControl; bans and additions are read from its events."""

    def __init__(self, stages=3, replicas=3):
        self.workers = WorkerTable(stages, replicas)
        self.control = MeshControl(self.workers)
        self.bans: list[tuple[int, str, str | None]] = []  # (step, worker, replaced_by)
        self.added: list[tuple[int, str | None]] = []  # (stage, rejoin_of)
        self.by: dict[str, str | None] = {}  # banned worker -> the test that banned it

    def collect(self) -> None:
        for ev in self.control.drain():
            if ev.kind == "ban":
                self.bans.append((ev.step, ev.worker, ev.replaced_by))
                self.by[ev.worker] = ev.by
            else:
                self.added.append((ev.stage, ev.rejoin_of))

    def live(self, wid: str) -> bool:
        return self.workers.live[self.workers.index(wid)]


def substitute(msg):
    return torch.full_like(msg.payload, 7.0) if msg.role == Role.GRADIENT else None


def msg(step, sender="s1r0", role=Role.GRADIENT, mb=0, boundary=0):
    return Message(step, mb, boundary, role, sender, "s0r0", torch.ones(2, 2))


def responder(mode="closed_loop", **cfg):
    mesh = Mesh(stages=4)
    return Responder(ResponseConfig(**cfg), mesh.control, mode=mode), mesh


def step(r, mesh, number, records):
    """One step: each message delivered at its verifier, then the step's verdicts weighed; returns the deliveries."""
    out = [r.deliver(m, v, substitute) for m, v in records]
    r.end_step(number, records)
    mesh.collect()
    return out


def test_drop_substitute_accept():
    r, _ = responder(on_flag="drop", ban_after=99)
    assert r.deliver(msg(0), FLAG, substitute) is None
    assert torch.equal(r.deliver(msg(0), OK, substitute), torch.ones(2, 2))
    r, _ = responder(on_flag="substitute", ban_after=99)
    assert float(r.deliver(msg(0), FLAG, substitute)[0, 0]) == 7.0  # a flagged gradient gets the baseline
    assert r.deliver(msg(0, role=Role.ACTIVATION), FLAG, substitute) is None  # an activation falls back to drop
    r, _ = responder(on_flag="accept", ban_after=99)
    assert torch.equal(r.deliver(msg(0), FLAG, substitute), torch.ones(2, 2))


def test_drop_suspect_delivers_a_senders_first_flag_and_drops_the_next():
    r, mesh = responder(on_flag="drop_suspect", ban_after=99, strike_window=5)
    first = step(r, mesh, 0, [(msg(0), FLAG), (msg(0, sender="s1r1", mb=1), OK)])
    assert all(torch.equal(x, torch.ones(2, 2)) for x in first)  # nobody was suspect: the flag is delivered
    assert r.suspects == {"s1r0"}
    assert step(r, mesh, 1, [(msg(1), FLAG)]) == [None]  # flagged again within the window: dropped
    assert torch.equal(r.deliver(msg(1, sender="s1r1"), FLAG, substitute), torch.ones(2, 2))  # a peer's first
    for n in range(2, 6):
        step(r, mesh, n, [(msg(n), OK)])
    assert r.suspects == {"s1r0"}  # at the end of step 5 its flag of step 1 is 4 steps old: in the window
    step(r, mesh, 6, [(msg(6), OK)])
    assert r.suspects == set()  # 5 steps old: out
    assert torch.equal(r.deliver(msg(7), FLAG, substitute), torch.ones(2, 2))
    certain = Verdict({}, True, frozenset({Marker.INTEGRITY}))  # NaN, Inf, a replay: never delivered
    assert r.deliver(msg(7, sender="s1r2"), certain, substitute) is None


def test_drop_suspect_drops_the_first_flag_of_a_sender_with_sequential_evidence():
    r, mesh = responder(on_flag="drop_suspect", ban_after=99)
    risen = Verdict({}, False, pvalue=1e-4)  # unflagged, but evidence: about a quarter of the threshold
    step(r, mesh, 0, [(msg(0), risen)])
    level = r.evidence.level[("s1r0", int(Role.GRADIENT))]
    assert level >= 0.25 * r.evidence.threshold and r.suspects == {"s1r0"}
    assert r.deliver(msg(1), FLAG, substitute) is None


def test_drop_suspect_in_the_engine_delivers_the_first_flagged_activation_only(tmp_path):
    """The policy through the engine: the last stage computes on the attacker's first flagged activation (a gradient
    comes back for its microbatch) and on none of its later ones."""
    from tests.distributed.helpers import DROP_SUSPECT, delivered_flags, sim_reference, write_scenario

    log = sim_reference(write_scenario(tmp_path, DROP_SUSPECT), [], tmp_path / "sim")
    delivered = delivered_flags(log)
    assert len(delivered) >= 3 and delivered[0] and not any(delivered[1:])


def test_ban_after_n_strikes_takes_effect_from_the_next_step():
    r, mesh = responder(ban_after=3)
    for n in range(3):
        step(r, mesh, n, [(msg(n), FLAG)])
    assert not mesh.live("s1r0")
    assert mesh.bans == [(2, "s1r0", None)]
    assert mesh.by == {"s1r0": "hard"}  # the peer test on flagged messages decided it
    assert r.deliver(msg(3), OK, substitute) is None  # a banned worker's later messages are dropped


def test_a_ban_is_decided_at_the_end_of_its_step():
    r, mesh = responder(ban_after=1, ban_pvalue=1.0)
    assert r.deliver(msg(0), FLAG, substitute) is None
    assert torch.equal(r.deliver(msg(0, mb=1), OK, substitute), torch.ones(2, 2))  # same step: not banned yet
    assert mesh.live("s1r0")
    r.end_step(0, [(msg(0), FLAG), (msg(0, mb=1), OK)])
    assert not mesh.live("s1r0")


def test_strike_window_forgets_old_strikes():
    r, mesh = responder(ban_after=2, strike_window=5, ban_pvalue=1.0)
    step(r, mesh, 0, [(msg(0), FLAG)])
    step(r, mesh, 5, [(msg(5), FLAG)])  # the strike of step 0 is 5 steps old: out of the window
    assert mesh.live("s1r0")
    step(r, mesh, 6, [(msg(6), FLAG)])
    assert not mesh.live("s1r0")


def test_replacement_and_rejoin():
    r, mesh = responder(ban_after=1, replace_banned=True, rejoin_after=4, ban_pvalue=1.0)
    step(r, mesh, 10, [(msg(10), FLAG)])
    assert mesh.added == [(1, None)]
    assert mesh.bans == [(10, "s1r0", "s1r3")]
    step(r, mesh, 12, [(msg(12, sender="s1r1"), OK)])
    assert len(mesh.added) == 1
    step(r, mesh, 13, [(msg(13, sender="s1r1"), OK)])  # due at step 14: its operator rejoins under a new id
    assert mesh.added[-1] == (1, "s1r0")


def test_last_replica_of_a_stage_is_never_banned_without_replacement():
    r, mesh = responder(ban_after=1, ban_pvalue=1.0)
    step(r, mesh, 0, [(msg(0, "s1r0", mb=0), FLAG), (msg(0, "s1r1", mb=1), FLAG), (msg(0, "s1r2", mb=2), FLAG)])
    assert mesh.workers.live_in_stage(1) == [mesh.workers.index("s1r2")]
    assert len(mesh.bans) == 2


def route(step_idx, mb, senders, flag_last=False):
    """A microbatch's messages along a route; optionally the last one flagged."""
    return [
        (
            Message(step_idx, mb, i, Role.ACTIVATION, w, "x", torch.ones(2, 2)),
            FLAG if (flag_last and i == len(senders) - 1) else OK,
        )
        for i, w in enumerate(senders)
    ]


def test_route_attribution_bans_the_upstream_attacker_not_the_contaminated_downstream():
    """s2r1 corrupts invisibly; every microbatch through it is flagged one hop later, at whichever s3 replica."""
    r, mesh = responder()
    gen = torch.Generator().manual_seed(0)
    for n in range(12):
        records = []
        for mb in range(4):
            s2 = f"s2r{int(torch.randint(3, (1,), generator=gen))}"
            s3 = f"s3r{int(torch.randint(3, (1,), generator=gen))}"
            records += route(n, mb, [f"s0r{mb % 3}", f"s1r{mb % 3}", s2, s3], flag_last=s2 == "s2r1")
        step(r, mesh, n, records)
    assert [w for _, w, _ in mesh.bans] == ["s2r1"]
    assert mesh.by == {"s2r1": "route"}


def test_isolated_honest_flags_do_not_ban():
    r, mesh = responder()
    for n in range(30):
        records = [
            rec for mb in range(3) for rec in route(n, mb, [f"s0r{mb}", f"s1r{mb}"], flag_last=(n % 9 == 0 and mb == 1))
        ]
        step(r, mesh, n, records)
    assert not mesh.bans


def test_sender_attribution_blames_only_the_sender():
    r, mesh = responder(attribution="sender", ban_pvalue=1.0, ban_after=2)
    for n in range(2):
        step(r, mesh, n, route(n, 0, ["s0r0", "s1r0", "s2r0"], flag_last=True))
    assert [w for _, w, _ in mesh.bans] == ["s2r0"]


def test_a_ban_by_the_sequential_test_records_it():
    """Messages at p = 1e-12 from one replica while its peers send ordinary ones: the CUSUM bans it, and says so."""
    r, mesh = responder(ban_after=99)
    for n in range(4):
        records = [
            (msg(n, sender=w, mb=i), Verdict({}, False, pvalue=1e-12 if w == "s1r0" else 0.5))
            for i, w in enumerate(("s1r0", "s1r1", "s1r2", "s1r0"))
        ]
        step(r, mesh, n, records)
    assert mesh.by == {"s1r0": "sequential"}


def test_open_loop_never_acts():
    r, mesh = responder(mode="open_loop", ban_after=1)
    for n in range(5):
        assert torch.equal(step(r, mesh, n, [(msg(n), FLAG)])[0], torch.ones(2, 2))
    assert all(mesh.workers.live) and not mesh.bans


def test_the_response_policy_cannot_reach_ground_truth(tiny_scenario):
    """By construction: nothing reachable from the responder (or the verifier) is an EventLog or an adversary."""
    import gc
    import types

    from attacks.layer import AdversaryLayer
    from sentinel.eventlog import EventLog
    from sentinel.runner import build_engine

    sc = tiny_scenario(
        "pipeline.replicas=3",
        "detector.name=sentinel",
        "adversary.placement=explicit",
        "adversary.workers=[s1r0]",
        "adversary.attacks=[{name: scaling, role: both}]",
    )
    engine = build_engine(sc)
    assert isinstance(engine.adversary, AdversaryLayer)
    for root in (engine.responder, *engine.verifiers.values()):
        seen, todo = set(), [root]
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, (type, types.ModuleType, torch.Tensor)):
                continue
            seen.add(id(obj))
            assert not isinstance(obj, (EventLog, AdversaryLayer)), (
                f"{type(root).__name__} reaches {type(obj).__name__}"
            )
            if isinstance(obj, types.FunctionType):  # what a function holds, not the module it was defined in
                todo.extend([c.cell_contents for c in obj.__closure__ or ()] + list(obj.__defaults__ or ()))
            elif isinstance(obj, types.MethodType):
                todo.extend([obj.__self__, obj.__func__])
            else:
                todo.extend(gc.get_referents(obj))
        assert len(seen) > 5  # the walk did visit the object graph


@pytest.mark.parametrize("key,value", [("strike_window", 0), ("rejoin_after", -1), ("ban_after", 0)])
def test_bad_response_config_is_a_located_error(tiny_scenario, key, value):
    from sentinel.errors import ConfigError

    with pytest.raises(ConfigError, match=f"response.{key}"):
        tiny_scenario(f"response.{key}={value}")


def test_engine_replacement_copies_weights_and_optimizer_state(tiny_scenario):
    from sentinel.engine.sim import SimEngine

    eng = SimEngine(tiny_scenario("pipeline.replicas=2", "training.steps=3"))
    eng.train_step()
    added = eng.apply_events([MeshEvent("add", 1, "s1r2", 1)])  # a replacement, as the response policy decides
    eng._add_replica("s1r2", 1, None)  # built after the step's update (train_step does this)
    new_idx = eng.workers.index("s1r2")
    assert [ev.worker for ev in added] == ["s1r2"] and eng.workers.live_in_stage(1)[-1] == new_idx
    src, new = eng.replicas[eng.workers.index("s1r0")], eng.replicas[new_idx]
    for a, b in zip(src.params, new.params):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    s_state, n_state = src.optimizer.state_dict()["state"], new.optimizer.state_dict()["state"]
    assert s_state.keys() == n_state.keys() and torch.equal(s_state[0]["exp_avg"], n_state[0]["exp_avg"])
    eng.train_step()  # the newcomer is routed and stays in sync under synchronous DP
    for a, b in zip(eng.replicas[eng.workers.index("s1r0")].params, new.params):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "lagging,exchangeable,banned",
    [
        (frozenset(), True, ["s1r2"]),
        (frozenset({"s1r2"}), True, []),
        (frozenset({"s1r1", "s1r2"}), True, ["s1r2"]),
        (frozenset(), False, []),
    ],
)
def test_score_tests_compare_a_sender_within_its_cohort(lagging, exchangeable, banned):
    """A replica whose statistics are persistently larger than its peers' is banned by the score test, within its
    cohort (`MeshControl.cohort`): an async straggler alone in its stage is not tested, next to another straggler it
    is; replicas whose weights diverge (sparse averaging) are each alone."""
    import numpy as np

    mesh = Mesh(stages=3, replicas=3)
    mesh.control = MeshControl(mesh.workers, lagging, exchangeable)
    r = Responder(ResponseConfig(ban_after=99), mesh.control)
    rng = np.random.default_rng(0)
    for t in range(30):
        records = [
            (msg(t, sender=w, mb=i), Verdict({"l1": float(rng.normal() + 3.0 * (w == "s1r2"))}, False))
            for i, w in enumerate(("s1r0", "s1r1", "s1r2"))
        ]
        step(r, mesh, t, records)
    assert [w for _, w, _ in mesh.bans] == banned
    assert set(mesh.by.values()) <= {"scores"}


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
                    ref = mannwhitneyu(
                        values[owner == i, s], values[owner == j, s], alternative="greater", method="asymptotic"
                    ).pvalue
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
    values = np.stack(
        [
            rng.choice([0.0, 0.0, 0.0, 1 / 64, 2 / 64], size=95),
            rng.integers(0, 3, size=95) * 1.0,
            np.zeros(95),
            rng.normal(size=95),
        ],
        axis=1,
    )
    values[5, 3] = np.nan  # counts as the largest
    p = pairwise_pvalues(values, owner, 3)
    for s in range(4):
        for i in range(3):
            for j in range(3):
                if i != j:
                    a, b = (
                        np.nan_to_num(values[owner == i, s], nan=np.inf),
                        np.nan_to_num(values[owner == j, s], nan=np.inf),
                    )
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
