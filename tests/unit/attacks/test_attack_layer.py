"""The adversary layer: who is malicious, where attacks act (pre/post codec, DP, targets), ground truth."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from attacks import Attack, register_attack
from attacks.assignment import assign_malicious
from attacks.layer import AdversaryLayer
from attacks.testing import drive
from sentinel import runner, scenario
from sentinel.detectors.base import Verdict
from sentinel.engine.workers import WorkerTable
from sentinel.errors import RunError
from sentinel.eventlog import EventLog
from sentinel.registry import ATTACKS
from sentinel.transport import Message, Role, Wire

MESH = {
    "seed": 0,
    "model": {"layers": 4, "dim": 16, "heads": 2, "seq_len": 8},
    "data": {"source": "synthetic", "vocab": 16, "batch_size": 2, "val_batches": 1},
    "pipeline": {"stages": 4, "replicas": 3, "microbatches": 2},
    "training": {"steps": 3, "warmup_steps": 1, "eval_every": 3},
}


def sc_with(adversary: dict, **sections) -> scenario.Scenario:
    data = copy.deepcopy(MESH)
    data.update(sections)
    data["adversary"] = adversary
    return scenario.validate(data)


def layer_for(sc):
    workers, log = WorkerTable(sc.pipeline.stages, sc.pipeline.replicas), EventLog()
    return AdversaryLayer(sc, workers, log), workers, log


def test_assignment_is_seeded_per_stage_and_respects_protect():
    adv = sc_with({"fraction": 0.34, "attacks": [{"name": "bias"}]}).adversary
    a = assign_malicious(adv, 6, 3, seed=1)
    assert a == assign_malicious(adv, 6, 3, seed=1)
    assert len(a) == 4 and {w[:2] for w in a} == {"s1", "s2", "s3", "s4"}  # one per middle stage
    assert any(assign_malicious(adv, 6, 3, seed=s) != a for s in range(2, 8))
    free = sc_with({"fraction": 0.34, "protect": [], "attacks": [{"name": "bias"}]}).adversary
    assert {w[:2] for w in assign_malicious(free, 6, 3, seed=1)} == {f"s{i}" for i in range(6)}


def test_layer_exposes_sorted_malicious_and_replacements_are_honest():
    sc = sc_with({"placement": "explicit", "workers": ["s2r1", "s1r0"], "attacks": [{"name": "scaling"}]})
    layer, workers, log = layer_for(sc)
    assert layer.malicious == ["s1r0", "s2r1"]
    new = workers.ids[workers.add_replacement(1)]
    msg = Message(0, 0, 1, Role.ACTIVATION, new, "s2r0", torch.ones(2, 2))
    assert layer.pre_codec(msg).payload is msg.payload and len(log.ground_truth) == 0


def test_first_matching_attack_wins_and_every_one_is_logged_once():
    sc = sc_with(
        {
            "placement": "explicit",
            "workers": ["s1r0"],
            "attacks": [{"name": "bias", "b": 1.0, "every": 2}, {"name": "scaling", "alpha": 3.0}],
        }
    )
    layer, _, log = layer_for(sc)
    for step in range(4):
        msg = Message(step, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.ones(3), msg_id=step)
        out = layer.pre_codec(msg).payload
        assert torch.equal(out, torch.full((3,), 2.0 if step % 2 == 0 else 3.0))
    assert [log.attacks[i] for i in log.ground_truth["attack"]] == ["bias", "scaling", "bias", "scaling"]


def test_prob_draw_is_seeded_by_message_identity():
    sc = sc_with({"placement": "explicit", "workers": ["s1r0"], "attacks": [{"name": "scaling", "prob": 0.3}]})
    acted = []
    for _ in range(2):
        layer, _, log = layer_for(sc)
        for step in range(300):
            msg = Message(step, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.ones(2), msg_id=step)
            layer.pre_codec(msg)
        acted.append(log.ground_truth["msg"].tolist())
    assert acted[0] == acted[1] and 60 < len(acted[0]) < 120


def test_post_codec_tampers_with_the_identity_codecs_wire_tensor():
    sc = sc_with(
        {
            "placement": "explicit",
            "workers": ["s1r0"],
            "attacks": [{"name": "scaling", "alpha": -2.0, "placement": "post_codec"}],
        },
        seed=0,
    )
    layer, workers, log = layer_for(sc)
    records = drive(layer, sc, workers, log, steps=2)
    hit = [r for r in records if r.sender == "s1r0" and r.role == Role.ACTIVATION]
    assert hit and all(torch.equal(r.delivered, -2.0 * r.honest) for r in hit)
    assert np.allclose(log.ground_truth["norm_ratio"], 3.0)


def test_post_codec_on_an_unregistered_codec_touches_only_float_wire_tensors():
    sc = sc_with(
        {
            "placement": "explicit",
            "workers": ["s1r0"],
            "attacks": [{"name": "constant", "value": 0.0, "placement": "post_codec"}],
        }
    )
    layer, _, log = layer_for(sc)
    layer.codec_names[Role.ACTIVATION] = "some_sparse_codec"
    msg = Message(0, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.ones(4))
    wire = Wire({"values": torch.ones(2), "indices": torch.tensor([0, 3])}, {"k": 2})
    out = layer.post_codec(msg, wire, None)
    assert torch.equal(out.tensors["values"], torch.zeros(2))
    assert torch.equal(out.tensors["indices"], wire.tensors["indices"])
    assert out.meta == {"k": 2} and len(log.ground_truth) == 1


def test_wrong_shape_from_a_plugin_is_a_located_run_error(monkeypatch):
    monkeypatch.setattr(ATTACKS, "_entries", dict(ATTACKS._entries))

    @register_attack("shrinks")
    class Shrinks(Attack):
        """Returns a smaller tensor (broken on purpose)."""

        def apply(self, x, ctx):
            return x[:1]

    sc = sc_with({"placement": "explicit", "workers": ["s1r0"], "attacks": [{"name": "shrinks"}]})
    layer, _, _ = layer_for(sc)
    with pytest.raises(RunError, match=r"shrinks.*adversary.attacks\[0\].*keep shape and dtype"):
        layer.pre_codec(Message(0, 0, 1, Role.ACTIVATION, "s1r0", "s2r0", torch.ones(3, 2)))


def tiny_engine(adversary: dict, **sections):
    sc = sc_with(adversary, **sections)
    engine = runner.build_engine(sc)
    return engine


def test_dp_gradient_attack_is_logged_with_no_message_id():
    engine = tiny_engine(
        {
            "placement": "explicit",
            "workers": ["s1r0"],
            "attacks": [{"name": "scaling", "role": "dp_gradient", "alpha": -5.0}],
        },
        pipeline={"stages": 4, "replicas": 3, "microbatches": 3, "routing": "fixed"},
    )
    engine.run()
    gt = engine.log.ground_truth
    assert len(gt) == 3  # one DP contribution per step
    assert set(gt["msg"].tolist()) == {-1} and set(gt["role"].tolist()) == {int(Role.DP_GRADIENT)}
    assert np.allclose(gt["norm_ratio"], 6.0)


def test_target_corruption_logs_the_last_stages_gradients():
    engine = tiny_engine(
        {
            "placement": "explicit",
            "workers": ["s3r0"],
            "protect": ["first"],
            "attacks": [{"name": "target_corruption", "role": "gradient", "start": 1}],
        },
        pipeline={"stages": 4, "replicas": 3, "microbatches": 4, "routing": "fixed"},
    )
    engine.run()
    gt, m = engine.log.ground_truth, engine.log.messages
    expected = [
        int(i)
        for i, s, r, snd in zip(m["id"], m["step"], m["role"], m["sender"])
        if s >= 1 and r == int(Role.GRADIENT) and engine.log.workers[snd] == "s3r0"
    ]
    assert sorted(gt["msg"].tolist()) == expected and len(expected) == 4  # mb 0 and 3 on r0, steps 1 and 2
    assert np.isnan(gt["norm_ratio"]).all()


class Recorder:
    """A verifier that accepts everything and keeps every payload it sees."""

    def __init__(self):
        self.seen = {}

    def observe(self, msg):
        self.seen[(msg.step, msg.mb_idx, msg.boundary, int(msg.role))] = msg.payload.clone()
        return Verdict({}, False)


def _recorded(adversary):
    mesh = {"pipeline": {"stages": 4, "replicas": 1, "microbatches": 2}, "training": {"steps": 1, "warmup_steps": 0}}
    engine = tiny_engine(adversary, **mesh) if adversary else runner.build_engine(scenario.validate({**MESH, **mesh}))
    rec = Recorder()
    engine.install_defence(rec, None)
    engine.train_step()
    return rec.seen


def test_undo_pair_hides_the_perturbation_from_the_next_boundary():
    pair = {"placement": "explicit", "workers": ["s1r0", "s2r0"], "allow_dishonest_majority": True}
    clean = _recorded(None)
    undone = _recorded({**pair, "attacks": [{"name": "undo_pair", "role": "activation", "undo": 1.0}]})
    kept = _recorded({**pair, "attacks": [{"name": "undo_pair", "role": "activation", "undo": 0.0}]})

    def rel(seen, boundary):
        key = (0, 0, boundary, int(Role.ACTIVATION))
        return float((seen[key] - clean[key]).norm() / clean[key].norm())

    assert rel(undone, 0) == 0.0 and rel(undone, 1) == pytest.approx(1.0, rel=1e-4)  # the pair's link
    assert rel(kept, 2) > 0.8  # without the undo the perturbation travels on
    assert rel(undone, 2) < 0.3 * rel(kept, 2)  # with it, the next verifier sees nearly honest traffic


def test_same_direction_colluders_share_one_direction():
    sc = sc_with(
        {"fraction": 0.4, "attacks": [{"name": "same_direction", "strength": 0.5}]},
        pipeline={"stages": 4, "replicas": 5, "microbatches": 2},
    )
    layer, _, _ = layer_for(sc)
    deltas = []
    for wid in [w for w in layer.malicious if w.startswith("s1")]:
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(len(deltas)))
        msg = Message(0, 0, 1, Role.ACTIVATION, wid, "s2r0", x.clone())
        deltas.append((layer.pre_codec(msg).payload - x) / x.norm())
    assert len(deltas) == 2 and torch.allclose(deltas[0], deltas[1], atol=1e-6)


def test_runner_hands_white_box_attacks_the_published_detector_state():
    """The view reads a copy of the verifiers' detectors taken at the start of each step, never the live ones."""
    from sentinel.detectors.verifier import DetectorView

    engine = tiny_engine({"fraction": 0.34, "attacks": [{"name": "fence_evasion"}]}, detector={"name": "sentinel"})
    view = engine.adversary.entries[0].attack.view
    assert isinstance(view, DetectorView) and engine.adversary.view is view
    live = {b: v.detector for b, v in engine.verifiers.items()}
    assert all(view._detectors[b] is not live[b] for b in live)  # copies
    for _ in range(3):
        engine.train_step()
    b = 1
    assert view._detectors[b]._streams.keys() <= live[b]._streams.keys()
    assert len(view._detectors[b]._streams) > 0  # refreshed every step from the verifiers


def test_norm_ratio_is_zero_safe():
    from attacks.layer import norm_ratio

    assert norm_ratio([torch.zeros(3)], [torch.zeros(3)]) == 0.0
    assert math.isinf(norm_ratio([torch.ones(3)], [torch.zeros(3)]))
