"""Baseline detectors: scalar change detectors, and trusted recomputation on a real tiny engine."""

from __future__ import annotations

import pytest
import torch

from sentinel.detectors.scalar import Cusum, NormZScore, PageHinkley, scalar_feature
from sentinel.transport.message import Message, Role


def stream(det, values, sender="s1r0", start=0):
    out = []
    for i, v in enumerate(values):
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(2, 4, 8, generator=g) * 0.05 + 1.0) * v
        out.append(det.observe(Message(start + i, 0, 0, Role.ACTIVATION, sender, "s1r0", x)))
    return out


@pytest.mark.parametrize("cls", [NormZScore, Cusum, PageHinkley])
def test_scalar_detectors_learn_then_flag_a_jump(cls):
    det = cls(cls.Config(warmup_steps=0, min_history=8), seed=0)
    quiet = stream(det, [1.0] * 40)
    assert sum(v.flagged for v in quiet) <= 1
    loud = stream(det, [3.0] * 5, start=40)
    assert any(v.flagged for v in loud)


def test_cusum_accumulates_small_shifts_per_sender():
    det = Cusum(Cusum.Config(warmup_steps=0, min_history=8, threshold=4.0, drift=0.5), seed=0)
    stream(det, [1.0] * 40)
    z_small = NormZScore(NormZScore.Config(warmup_steps=0, min_history=8, threshold=4.0), seed=0)
    stream(z_small, [1.0] * 40)
    shift = [1.01] * 12  # ~1.6 sigma: a shift too small for a one-message z test, in a cumulative sum it adds up
    assert any(v.flagged for v in stream(det, shift, start=40))
    assert not any(v.flagged for v in stream(z_small, shift, start=40))


def test_scalar_scores_are_pure():
    det = NormZScore(NormZScore.Config(warmup_steps=0, min_history=4), seed=0)
    stream(det, [1.0] * 10)
    x = torch.full((2, 4, 8), 2.0)
    before = det.public_state()
    assert det.scores(0, Role.ACTIVATION, x) == det.scores(0, Role.ACTIVATION, x)
    assert det.public_state() == before


def test_scalar_features():
    x = torch.tensor([[3.0, -4.0]])
    assert scalar_feature(x, "rms") == pytest.approx((12.5) ** 0.5)
    assert scalar_feature(x, "mean") == pytest.approx(-0.5)
    assert scalar_feature(x, "max_abs") == pytest.approx(4.0)


@pytest.mark.parametrize("name", ["duplication", "spot_check", "cross_replica"])
def test_recomputation_detectors_on_a_tiny_run(tiny_scenario, name):
    """Honest traffic matches its recomputation exactly; a tampered tensor does not."""
    from sentinel.runner import build_engine

    extra = ["detector.p=1.0"] if name != "duplication" else []
    sc = tiny_scenario(
        "pipeline.replicas=3",
        f"detector.name={name}",
        *extra,
        "training.steps=4",
        "adversary.fraction=0.34",
        "adversary.attacks=[{name: scaling, role: both, start: 2, alpha: 1.01}]",
    )
    engine = build_engine(sc)
    engine.run()
    log, v = engine.log, engine.log.verdicts
    tampered = set(log.ground_truth["msg"].tolist())
    flagged = {int(m) for m, f in zip(v["msg"], v["flagged"]) if f}
    checked = {int(m) for m, e in zip(v["msg"], v["score_recompute_error"]) if e == e}
    assert tampered and tampered & checked <= flagged  # a 1% scaling is caught wherever it is checked
    assert not (flagged - tampered)  # and nothing honest is
    if name == "duplication":
        assert tampered <= checked


def test_duplication_substitutes_the_honest_tensor(tiny_scenario):
    from sentinel.runner import build_engine

    sc = tiny_scenario(
        "pipeline.replicas=3",
        "detector.name=duplication",
        "response.on_flag=substitute",
        "training.steps=3",
        "adversary.fraction=0.34",
        "adversary.attacks=[{name: scaling, role: activation, start: 1, alpha: 3.0}]",
    )
    engine = build_engine(sc)
    pairs = []
    responder = engine.responder
    inner = responder.deliver

    def deliver(msg, verdict, substitute):
        live = msg.sender not in responder.banned
        out = inner(msg, verdict, substitute)
        if verdict.flagged and live:
            pairs.append((msg.payload.clone(), out))
        return out

    responder.deliver = deliver
    engine.run()
    assert pairs
    for sent, delivered in pairs:  # the receiver gets the recomputation: a third of what was sent
        torch.testing.assert_close(delivered * 3.0, sent, rtol=1e-4, atol=1e-6)
