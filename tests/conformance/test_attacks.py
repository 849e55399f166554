"""Every registered attack through the same checks (a new attack gets the whole suite for free):
seeded determinism, shape/dtype preserved, input never modified, config round-trip, no-op identity
(bit-identical training), and ground truth recorded for every tampered message and for no other.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attacks.layer import AdversaryLayer
from attacks.schedule import Schedule
from attacks.testing import drive
from sentinel import scenario
from sentinel.config import describe_plugin, to_plain
from sentinel.engine.workers import WorkerTable
from sentinel.eventlog import EventLog
from sentinel.registry import ATTACKS
from sentinel.runner import build_engine
from sentinel.transport import Role

NAMES = ATTACKS.names()
STEPS = 7
# Parameters that make an attack act within a short stream (defaults are sized for real runs).
STREAM_PARAMS = {"delay": {"d": 2}}
ROLE_OF = {
    "activation": {Role.ACTIVATION},
    "gradient": {Role.GRADIENT},
    "both": {Role.ACTIVATION, Role.GRADIENT},
    "dp_gradient": {Role.DP_GRADIENT},
}

MESH = {
    "name": "conformance",
    "seed": 3,
    "model": {"layers": 3, "dim": 16, "heads": 2, "seq_len": 8},
    "data": {"source": "synthetic", "vocab": 16, "batch_size": 2, "val_batches": 1},
    "pipeline": {"stages": 3, "replicas": 3, "microbatches": 2, "routing": "fixed"},  # mb 0 via r0 everywhere
    "training": {"steps": STEPS, "lr": 3.0e-3, "warmup_steps": 1, "eval_every": STEPS},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread is faster and immune to CPU contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _role(name: str) -> str:
    roles = ATTACKS.get(name).ROLES
    if {"activation", "gradient"} <= roles:
        return "both"
    return "gradient" if "gradient" in roles else sorted(roles)[0]


def _specs(name: str, **extra) -> list[dict]:
    """One spec on the pipeline roles, plus one on the DP axis when the attack supports it."""
    start = 0 if name == "warmup_poisoning" else 1
    base = {"name": name, "start": start, **STREAM_PARAMS.get(name, {}), **extra}
    specs = [{**base, "role": _role(name)}]
    if "dp_gradient" in ATTACKS.get(name).ROLES:
        specs.append({**base, "role": "dp_gradient"})
    return specs


def _scenario(name: str | None, seed: int = 3, **extra) -> scenario.Scenario:
    data = copy.deepcopy(MESH)
    data["seed"] = seed
    if name is not None:
        data["adversary"] = {
            "placement": "explicit",
            "workers": ["s0r0", "s1r0", "s2r0"],
            "protect": [],
            "attacks": _specs(name, **extra),
        }
    return scenario.validate(data)


def _stream(sc: scenario.Scenario):
    workers, log = WorkerTable(sc.pipeline.stages, sc.pipeline.replicas), EventLog()
    layer = AdversaryLayer(sc, workers, log)
    return layer, log, drive(layer, sc, workers, log, STEPS)


def _logged(log: EventLog) -> set[tuple]:
    gt = log.ground_truth
    return {
        (int(m), int(s), int(r), log.workers[w]) for m, s, r, w in zip(gt["msg"], gt["step"], gt["role"], gt["worker"])
    }


def _key(rec) -> tuple:
    return (rec.msg_id, rec.step, int(rec.role), rec.sender)


@pytest.mark.parametrize("name", NAMES)
def test_seeded_determinism(name):
    sc = _scenario(name, every=3, duty=2, prob=0.8)
    _, log_a, a = _stream(sc)
    _, log_b, b = _stream(sc)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.delivered, y.delivered), (name, x.step, x.mb_idx, x.role)
    assert _logged(log_a) == _logged(log_b)
    np.testing.assert_array_equal(log_a.ground_truth["norm_ratio"], log_b.ground_truth["norm_ratio"])


@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_preserved_and_input_untouched(name):
    _, _, records = _stream(_scenario(name))
    for rec in records:
        assert rec.delivered.shape == rec.honest.shape and rec.delivered.dtype == rec.honest.dtype, name
        assert rec.input_intact, f"{name} modified the sender's tensor in place"


@pytest.mark.parametrize("name", NAMES)
def test_ground_truth_for_every_tampered_message_and_no_other(name):
    sc = _scenario(name, every=3, duty=2, prob=0.8)
    layer, log, records = _stream(sc)
    tampered = {_key(r) for r in records if r.changed}
    assert tampered, f"{name} never acted in {STEPS} steps: the check would be vacuous"
    assert _logged(log) == tampered
    assert len(log.ground_truth) == len(tampered)  # one row per message
    specs = sc.adversary.attacks
    by_key = {_key(r): r for r in records}
    sched = Schedule.from_spec(specs[0])
    for row, key in enumerate(
        zip(
            log.ground_truth["msg"],
            log.ground_truth["step"],
            log.ground_truth["role"],
            (log.workers[w] for w in log.ground_truth["worker"]),
        )
    ):
        rec = by_key[tuple(int(k) if i < 3 else k for i, k in enumerate(key))]
        assert rec.sender in layer.malicious and sched.active(rec.step)
        assert any(rec.role in ROLE_OF[s.role] for s in specs)
        ratio = float(log.ground_truth["norm_ratio"][row])
        if not rec.targets_corrupted:
            expect = float((rec.delivered.double() - rec.honest.double()).norm() / rec.honest.double().norm())
            assert ratio == pytest.approx(expect, rel=1e-4)
        else:
            assert np.isnan(ratio)


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip(name):
    sc = _scenario(name)
    again = scenario.validate(to_plain(sc))
    assert again == sc
    spec = sc.adversary.attacks[0]
    rebuilt = ATTACKS.get(name)(spec.config)
    assert to_plain(rebuilt.config) == spec.params()
    info = describe_plugin(ATTACKS, name)
    assert info["doc"] and {p["name"] for p in info["params"]} == set(spec.params())


@pytest.fixture(scope="module")
def clean_run():
    engine = build_engine(_scenario(None))
    engine.run()
    return engine


def _assert_bit_identical(engine, clean):
    np.testing.assert_array_equal(engine.log.losses["loss"], clean.log.losses["loss"])
    np.testing.assert_array_equal(engine.log.evals["val_loss"], clean.log.evals["val_loss"])
    got, ref = engine.parameters(), clean.parameters()
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.parametrize("name", NAMES)
def test_noop_is_bit_identical_to_no_attack(name, clean_run):
    engine = build_engine(_scenario(name, prob=0.0))
    engine.run()
    _assert_bit_identical(engine, clean_run)
    assert len(engine.log.ground_truth) == 0
    noop = ATTACKS.get(name).NOOP
    if noop is not None:  # acts on every message (logged) but changes nothing
        engine = build_engine(_scenario(name, **noop))
        engine.run()
        _assert_bit_identical(engine, clean_run)
