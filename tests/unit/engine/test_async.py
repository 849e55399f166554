"""Bounded-staleness pipeline: stale weights in the pipeline phase, current weights updated, look-ahead."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sentinel.engine.asynchrony import Asynchrony, lagging
from sentinel.engine.clock import NetworkClock
from sentinel.engine.sim import SimEngine
from tests.conftest import tiny

SGD = (
    "training.optimizer=sgd",
    "training.momentum=0",
    "training.lr_schedule=constant",
    "training.warmup_steps=0",
    "training.lr=0.05",
)


def flat(eng: SimEngine) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in eng.parameters().values()])


def test_no_asynchrony_installs_no_weight_hook():
    eng = SimEngine(tiny())
    assert [type(h) for h in eng.hooks] == [NetworkClock]


def test_staleness_modes():
    sc = tiny("transport.async.max_staleness=2")
    a = Asynchrony(sc.transport.async_, sc)
    assert [a.staleness(0, f"s{s}r0", s) for s in range(4)] == [2, 2, 1, 0]  # per_stage: min(max, S-1-s)
    fixed = Asynchrony(tiny("transport.async.max_staleness=3", "transport.async.staleness=fixed").transport.async_, sc)
    assert {fixed.staleness(t, "s3r0", 3) for t in range(5)} == {3}
    rnd = Asynchrony(tiny("transport.async.max_staleness=3", "transport.async.staleness=random").transport.async_, sc)
    draws = [rnd.staleness(t, "s1r0", 1) for t in range(200)]
    assert set(draws) == {0, 1, 2, 3} and draws == [rnd.staleness(t, "s1r0", 1) for t in range(200)]


def test_stale_step_computes_with_old_weights_and_updates_current_ones():
    """tau = 1 everywhere: step 1 runs at theta_0 and applies g(theta_0; batch 1) to theta_1 (plain SGD)."""
    asy = SimEngine(tiny("transport.async.max_staleness=1", "transport.async.staleness=fixed", *SGD))
    ref = SimEngine(tiny(*SGD))  # stays at theta_0, then runs batch 1
    theta0 = flat(asy)
    l0 = asy.train_step()  # step 0: no older weights exist yet, tau is capped to 0
    theta1 = flat(asy)
    assert all(v == 0 for v in asy.hooks[0].applied.values())
    l1 = asy.train_step()
    ref.step = 1
    l_ref = ref.train_step()  # theta_0 on batch 1
    assert l1 == l_ref and l0 != l1
    torch.testing.assert_close(flat(asy) - theta1, flat(ref) - theta0, rtol=1e-5, atol=1e-7)
    assert set(asy.hooks[0].applied.values()) == {1}


def test_async_run_still_learns_and_is_deterministic():
    over = (
        "transport.async.max_staleness=2",
        "transport.async.staleness=random",
        "training.steps=16",
        "transport.network.jitter_ms=20",
    )
    runs = []
    for _ in range(2):
        eng = SimEngine(tiny(*over))
        before = eng.evaluate()
        runs.append([eng.train_step() for _ in range(16)])
        assert eng.evaluate() < before - 0.1
    assert runs[0] == runs[1]


def _fake_engine(param: torch.nn.Parameter):
    rep = SimpleNamespace(wid="s0r0", stage_idx=0, params=[param])
    return SimpleNamespace(replicas={0: rep}, workers=SimpleNamespace(live=[True], ids=["s0r0"]))


def test_lookahead_extrapolates_a_constant_velocity_exactly():
    """theta_t = t * d: the bias-corrected update EMA is d, so theta_{t-tau} + tau * d = theta_t."""
    sc = tiny(
        "transport.async.max_staleness=3",
        "transport.async.staleness=fixed",
        "transport.async.lookahead=true",
        "pipeline.stages=1",
    )
    a = Asynchrony(sc.transport.async_, sc)
    d = torch.tensor([0.5, -1.0, 2.0])
    p = torch.nn.Parameter(torch.zeros(3))
    eng = _fake_engine(p)
    a.attach(eng)
    for t in range(1, 6):
        with torch.no_grad():
            p.copy_(t * d)
        a.after_update(eng, SimpleNamespace(step=t - 1))
    a.before_pipeline(eng, SimpleNamespace(step=5))
    torch.testing.assert_close(p.detach(), 5 * d)  # look-ahead from theta_2 by 3 steps lands on theta_5
    a.before_update(eng, None)
    torch.testing.assert_close(p.detach(), 5 * d)  # current weights restored for the update


def test_stale_weights_without_lookahead():
    sc = tiny("transport.async.max_staleness=3", "transport.async.staleness=fixed", "pipeline.stages=1")
    a = Asynchrony(sc.transport.async_, sc)
    p = torch.nn.Parameter(torch.zeros(2))
    eng = _fake_engine(p)
    a.attach(eng)
    for t in range(1, 6):
        with torch.no_grad():
            p.fill_(float(t))
        a.after_update(eng, SimpleNamespace(step=t - 1))
    a.before_pipeline(eng, SimpleNamespace(step=5))
    assert p.detach().tolist() == [2.0, 2.0]  # theta_{5-3}
    a.before_update(eng, None)
    assert p.detach().tolist() == [5.0, 5.0]


def test_stragglers_run_max_staleness_behind():
    sc = tiny("transport.async.max_staleness=4", "transport.network.stragglers=0.5", "pipeline.replicas=2")
    eng = SimEngine(sc)
    asy = next(h for h in eng.hooks if isinstance(h, Asynchrony))
    assert len(asy.stragglers) == 4
    for w in asy.stragglers:
        assert asy.staleness(7, w, 3) == 4


def test_lagging_workers_are_the_stragglers_staler_than_their_stage():
    """The response policy's cohorts (`MeshControl.cohort`): a straggler lags its peers only where its staleness
    differs from theirs; a synchronous pipeline, `fixed` staleness and a per-stage staleness that already reaches
    `max_staleness` make no cohorts."""
    lag = ("transport.network.stragglers=0.5", "pipeline.replicas=2")
    eng = SimEngine(tiny("transport.async.max_staleness=2", *lag))  # per_stage: stages 0-1 already run 2 behind
    asy = next(h for h in eng.hooks if isinstance(h, Asynchrony))
    stage = {w: eng.workers.stage[eng.workers.index(w)] for w in asy.stragglers}
    assert {w for w in asy.stragglers if stage[w] >= 2} == eng.mesh.lagging != set()
    assert all(eng.mesh.cohort(w) == (w in eng.mesh.lagging) for w in eng.workers.ids)
    for w in asy.stragglers:  # a lagging straggler's staleness is not its stage's; a non-lagging one's is
        peer = asy.staleness(7, f"s{stage[w]}r9", stage[w])
        assert (asy.staleness(7, w, stage[w]) != peer) == (w in eng.mesh.lagging)
    rand = tiny("transport.async.max_staleness=2", "transport.async.staleness=random", *lag)
    assert lagging(rand, eng.workers) == asy.stragglers
    for quiet in (("transport.async.max_staleness=2", "transport.async.staleness=fixed"), ()):
        assert lagging(tiny(*quiet, *lag), eng.workers) == frozenset()
    sparse = SimEngine(tiny("dp.sync=sparse_avg", "pipeline.replicas=2"))  # diverging weights: every replica alone
    assert [sparse.mesh.cohort(w) for w in sparse.workers.ids] == sparse.workers.ids


class _AddReplicaOnce:
    """A verifier that adds a replica to stage 1 in step 2 (as a ban + replacement would: the engine builds it after
    the pipeline, while the stale weights are still swapped in)."""

    def __init__(self):
        self.engine, self.added = None, None

    def observe(self, msg):
        from sentinel.detectors import Verdict

        if msg.step == 2 and self.added is None:
            self.added = self.engine.mesh.rejoin(1, "s1r0", 2)
        return Verdict({}, False)


def test_replica_added_mid_step_gets_current_not_stale_weights():
    check = _AddReplicaOnce()
    eng = SimEngine(
        tiny("transport.async.max_staleness=1", "transport.async.staleness=fixed", "pipeline.replicas=2"),
        verifier=check,
    )
    check.engine = eng
    for _ in range(3):
        eng.train_step()
    reps = [eng.replicas[i] for i in eng.workers.live_in_stage(1)]
    assert check.added in {r.wid for r in reps} and len(reps) == 3
    for r in reps[1:]:
        assert all(torch.equal(a, b) for a, b in zip(reps[0].params, r.params))
