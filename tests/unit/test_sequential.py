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
from sentinel.sequential import KAPPA, SequentialEvidence, log_evalue
from sentinel.transport.message import Message, Role


def test_log_evalue_is_the_calibrator():
    from scipy.integrate import quad

    p = 1e-4
    assert log_evalue(p) == pytest.approx(math.log(KAPPA * p ** (KAPPA - 1)))
    assert quad(lambda x: math.exp(log_evalue(x)), 0, 1)[0] == pytest.approx(1.0)  # E[e(p)] = 1 for a uniform p


def test_no_single_message_bans_and_two_strong_ones_do():
    ev = SequentialEvidence(1e-8)
    ev.update("w", 1e-30)
    assert ev.level["w"] == pytest.approx(ev.threshold / 2) and not ev.exceeds("w", [])
    ev.update("w", 1e-30)
    assert ev.exceeds("w", [])


def test_honest_uniform_pvalues_never_reach_the_threshold():
    """A long honest stream (100,000 messages of one worker) stays below the default threshold with a margin."""
    rng = np.random.default_rng(1)
    ev = SequentialEvidence(ResponseConfig().sequential_alpha)
    top = max(ev.update("w", float(p)) for p in rng.random(100_000))
    assert top < 0.75 * ev.threshold


def test_peers_that_stand_out_too_block_the_ban():
    ev = SequentialEvidence(1e-8)
    for w in ("a", "b", "c"):
        ev.update(w, 1e-30)
        ev.update(w, 1e-30)
    assert not ev.exceeds("a", ["b", "c"])  # the whole stage moved: drift, not an attack
    ev.forget("b")
    ev.forget("c")
    assert ev.exceeds("a", ["b", "c"])


def _responder(**cfg):
    workers = WorkerTable(4, 3)
    mesh = MeshControl(workers)
    return Responder(ResponseConfig(**cfg), mesh), mesh


def _msg(step, mb, boundary, sender, role=Role.ACTIVATION):
    return Message(step, mb, boundary, role, sender, "x", torch.ones(2, 2))


def test_the_responder_bans_on_two_strong_pvalues_within_a_step():
    r, mesh = _responder()
    strong = Verdict({}, False, pvalue=1e-12, relation_pvalue=1e-12)
    r.end_step(0, [(_msg(0, 0, 1, "s1r0"), strong), (_msg(0, 1, 1, "s1r0"), strong)])
    assert [e.worker for e in mesh.drain() if e.kind == "ban"] == ["s1r0"]


def test_contaminated_messages_count_only_their_relation_evidence():
    """Downstream of an anomalous message of the same microbatch, only the relation p-value counts."""
    r, mesh = _responder()
    up = Verdict({}, False, pvalue=5e-3, relation_pvalue=None)  # anomalous, not flagged
    down = Verdict({}, False, pvalue=1e-12, relation_pvalue=0.5)  # pooled statistics dragged along
    for s in range(3):
        r.end_step(s, [(_msg(s, 0, 0, "s0r0"), up), (_msg(s, 0, 1, "s1r1"), down)])
    assert r.evidence.level.get("s1r1", 0.0) == 0.0
    assert "s1r1" not in [e.worker for e in mesh.drain() if e.kind == "ban"]


def test_sequential_test_can_be_turned_off():
    r, mesh = _responder(sequential_alpha=None)
    strong = Verdict({}, False, pvalue=1e-12)
    r.end_step(0, [(_msg(0, m, 1, "s1r0"), strong) for m in range(4)])
    assert r.evidence is None and not mesh.drain()
