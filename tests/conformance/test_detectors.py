"""Every registered detector passes the same checks (a new plugin gets them for free).

Determinism under a seed, verdict shape, pure `scores`, JSON-serialisable public state, a config that
round-trips through the scenario schema, and verdicts that depend on payloads and public metadata
only (never on ground truth, which a detector cannot even reach).
"""

from __future__ import annotations

import json

import pytest
import torch

from sentinel.config import build, to_plain
from sentinel.detectors.base import Detector, DetectorEnv, Verdict
from sentinel.registry import DETECTORS, one_line
from sentinel.scenario import DetectorSpec
from sentinel.transport.message import Message, Role

SHAPE = (2, 8, 16)


def _available(name: str) -> bool:
    """river's drift detectors need the optional dependency (`pip install -e ".[river]"`)."""
    from sentinel.detectors.drift import river_missing

    return not name.startswith("river_") or river_missing() is None


NAMES = [
    pytest.param(n, marks=pytest.mark.skipif(not _available(n), reason="river not installed"))
    for n in DETECTORS.names()
]


def make(name: str, seed: int = 0) -> Detector:
    cls = DETECTORS.get(name)
    cfg = cls.Config()
    if hasattr(cfg, "warmup_steps"):
        cfg = type(cfg)(**{**to_plain(cfg), "warmup_steps": 1, "min_history": 8})
    env = DetectorEnv(
        num_stages=3,
        payload_shape=SHAPE,
        recompute=lambda msg, worker=None: msg.payload * 0.5,
        live_replicas=lambda s: [f"s{s}r0", f"s{s}r1"],
    )
    return cls(cfg, seed=seed, env=env)


def traffic(n: int = 60):
    gen = torch.Generator().manual_seed(7)
    for i in range(n):
        x = torch.randn(SHAPE, generator=gen) * (5.0 if i >= n - 5 else 1.0)  # a jump at the end
        yield Message(i // 2, i % 2, i % 3 == 2, Role(i % 2), f"s{1 + i % 2}r{i % 2}", "s0r0", x, msg_id=i)


def test_registry_is_documented():
    for name in DETECTORS.names():
        cls = DETECTORS.get(name)
        assert one_line(cls), f"{name}: the docstring's first line is its description"
        assert issubclass(cls, Detector)


@pytest.mark.parametrize("name", NAMES)
def test_verdicts_are_well_formed_and_deterministic(name):
    a, b = make(name), make(name)
    for msg in traffic():
        va = a.observe(msg)
        vb = b.observe(
            Message(
                msg.step,
                msg.mb_idx,
                msg.boundary,
                msg.role,
                msg.sender,
                msg.receiver,
                msg.payload.clone(),
                msg_id=msg.msg_id,
            )
        )
        assert isinstance(va, Verdict) and isinstance(va.flagged, bool)
        assert all(isinstance(k, str) and isinstance(v, float) for k, v in va.scores.items())
        assert va == vb


@pytest.mark.parametrize("name", NAMES)
def test_scores_are_pure_and_state_is_public(name):
    det = make(name)
    for msg in traffic(40):
        det.observe(msg)
    state = json.dumps(det.public_state(), sort_keys=True, default=str)
    probe = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3))
    s1 = det.scores(0, Role.ACTIVATION, probe)
    assert det.scores(0, Role.ACTIVATION, probe) == s1
    assert json.dumps(det.public_state(), sort_keys=True, default=str) == state


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trips_through_the_schema(name):
    spec = build(DetectorSpec, {"name": name})
    again = build(DetectorSpec, to_plain(spec))
    assert again == spec


@pytest.mark.parametrize("name", NAMES)
def test_verdicts_do_not_depend_on_anything_but_the_message(name):
    """The same payload and public metadata give the same verdict, whatever msg_id or `meta` carry."""
    a, b = make(name), make(name)
    for msg in traffic():
        twin = Message(
            msg.step,
            msg.mb_idx,
            msg.boundary,
            msg.role,
            msg.sender,
            msg.receiver,
            msg.payload.clone(),
            msg_id=msg.msg_id + 10_000,
            meta={"tampered": True},
        )
        assert a.observe(msg) == b.observe(twin)
